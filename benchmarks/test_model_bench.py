"""The whole-model benchmark as a pytest-benchmark suite: every implementation of `bench model` on the tiny and
base-256 models (forward, training step, generation with and without the cache), tokens/s and the difference from
the float64 reference in `extra_info`.

    python -m pytest benchmarks/test_model_bench.py --benchmark-only
    python -m pytest benchmarks/test_model_bench.py --benchmark-only -k "tiny and forward"
    BENCH_MODEL_IMPLS='torch*' python -m pytest benchmarks/test_model_bench.py --benchmark-only

Benchmarks report; they assert nothing about speed: each output must pass the float32 rule against the float64
reference ("ok", not flagged), and a timed run must report its tokens/s. `transformer-parity bench model` is the
interleaved, side-by-side measurement the docs quote. Without `--benchmark-only` (a plain `pytest`, CI: pyproject's
testpaths include benchmarks/) the grid is `CI_PROBLEMS`, the tiny model's forward pass in float32 in every implementation
that runs it, two timed rounds each (generation and training are checked by parity_tests/test_bench_smoke.py).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from transformer_parity.bench import machine, model_impls  # noqa: E402
from transformer_parity.bench import model as model_bench  # noqa: E402
from transformer_parity.bench.harness import Unsupported  # noqa: E402

pytest.importorskip("pytest_benchmark")

THREADS = int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1))
IMPLS = model_impls.select(os.environ["BENCH_MODEL_IMPLS"].split(",")) if os.environ.get("BENCH_MODEL_IMPLS") \
    else [i for i in model_impls.REGISTRY.values() if i.name != "torch_impl.compile"]  # compiling: minutes per case
PROBLEMS = {f"{model}-{task}-{dtype}": (model, task, dtype) for model in ("tiny", "base-256")
            for task in model_impls.TASKS for dtype in ("float32", "bfloat16")}
CI_PROBLEMS = {"tiny-forward-float32": PROBLEMS["tiny-forward-float32"]}


@pytest.fixture(scope="session", autouse=True)
def _threads():
    return machine.configure_threads(THREADS, {impl.framework for impl in IMPLS})


_cache: dict = {}


def _problem(model: str, task: str, dtype: str):
    """The problem, its weights, inputs and float64 answer, once per problem."""
    key = (model, task, dtype)
    if key not in _cache:
        from transformer_parity.verify import seeded_weights
        ((problem, _),) = model_bench.plan("default", models=[model], tasks=[task], dtypes=[dtype],
                                           impl_patterns=["*"])[:1]
        weights = seeded_weights(problem.config)
        inputs = model_bench.make_inputs(problem)
        _cache[key] = (problem, weights, inputs, model_bench.reference(problem, weights, inputs))
    return _cache[key]


def pytest_generate_tests(metafunc):
    """The full grid under --benchmark-only; the CI grid in a plain run."""
    if metafunc.function.__name__ == "test_model":
        full = metafunc.config.getoption("benchmark_only", False)
        metafunc.parametrize("name", list(PROBLEMS if full else CI_PROBLEMS))
        metafunc.parametrize("impl", IMPLS, ids=[i.name for i in IMPLS])


def test_model(benchmark, impl, name, request):
    full = request.config.getoption("benchmark_only", False)
    problem, weights, inputs, desired = _problem(*PROBLEMS[name])
    try:
        runner = impl.build(problem, weights, inputs)
    except Unsupported as exc:
        pytest.skip(str(exc))
    benchmark.group = name
    row = model_bench.blank_row(impl, problem, "ok")
    with runner.context():
        model_bench.check_row(row, runner.to_numpy(runner.fn()), desired, problem.dtype)  # first call, outside timing
        benchmark.extra_info.update(impl=impl.name, tokens=problem.tokens, gflop=problem.flops / 1e9,
                                    max_abs_err=row.max_abs_err, check=row.check, threads=THREADS)
        benchmark.pedantic(runner.fn, rounds=int(os.environ.get("BENCH_ROUNDS", 3 if full else 2)), warmup_rounds=1,
                           iterations=1)
    stats = getattr(benchmark, "stats", None)
    if stats is not None and stats.stats.median > 0:
        benchmark.extra_info["tokens_per_s"] = problem.tokens / stats.stats.median
    if problem.dtype == "float32":  # judged by the float32 rule (bfloat16 rows report their difference)
        assert row.check == "ok" and row.max_abs_err is not None and row.max_abs_err <= row.tolerance, row.note
    assert row.check != "FLAGGED", row.note
    if not getattr(benchmark, "disabled", False):  # timed: its rate is reported
        assert benchmark.extra_info["tokens_per_s"] > 0
