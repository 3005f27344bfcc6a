"""The attention benchmarks as a pytest-benchmark suite: every implementation on a few problems, grouped by problem,
with TFLOP/s, the kernel that ran and the error against the float64 reference in `extra_info`.

    python -m pytest benchmarks/ --benchmark-only                      # CPU (and CUDA when present)
    python -m pytest benchmarks/ --benchmark-only -k "torch and 1024"  # a subset
    python -m pytest benchmarks/ --benchmark-only --benchmark-json=out.json

Benchmarks report; they assert nothing about speed. They do assert that each implementation's output is within the
float32 tolerance of the float64 reference and that a timed run reports its rate. Without `--benchmark-only` (a
plain `pytest`: pyproject's testpaths include benchmarks/, so CI runs this) the grid is `CI_PROBLEMS`, a small
problem per scope, each implementation timed for two rounds: that the suite runs and checks, not what it measures.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import math  # noqa: E402

import pytest  # noqa: E402

from transformer_parity.bench import (attention, attention_impls, attention_reference, harness,  # noqa: E402
                                      machine, timing)
from transformer_parity.tolerances import atol  # noqa: E402

pytest.importorskip("pytest_benchmark")

THREADS = int(os.environ.get("BENCH_THREADS", os.cpu_count() or 1))
PROBLEMS = {  # id -> case keywords (the device is a separate parameter)
    "kernel-fwd-N256": dict(seq=256),
    "kernel-fwd-N1024": dict(seq=1024),
    "kernel-fwd-N1024-causal": dict(seq=1024, mask="causal"),
    "kernel-fwd-N1024-padded": dict(seq=1024, mask="padded"),
    "kernel-fwdbwd-N512": dict(seq=512, mode="fwd+bwd"),
    "block-fwd-N512": dict(seq=512, scope="block"),
}
CI_PROBLEMS = {  # the grid of a plain `pytest` run (CI): one small problem per scope, padded
    "kernel-fwd-N16-padded": dict(seq=16, mask="padded", batch=1, heads=2, head_dim=8),
    "block-fwd-N16": dict(seq=16, scope="block", batch=1, heads=2, head_dim=8),
}
SKIP_BY_DEFAULT = ("*.eager",)  # eager TensorFlow is measured by `transformer-parity bench`; here it would double
# the suite's time for rows nobody uses in production. BENCH_IMPLS=... (comma-separated globs) overrides.
DEVICES = machine.available_devices()


def _impls():
    if os.environ.get("BENCH_IMPLS"):
        return attention_impls.select(os.environ["BENCH_IMPLS"].split(","))
    import fnmatch
    return [impl for impl in attention_impls.REGISTRY.values()
            if not any(fnmatch.fnmatchcase(impl.name, p) for p in SKIP_BY_DEFAULT)]


@pytest.fixture(scope="session", autouse=True)
def _threads(request):
    """Every framework's thread count, set once before any framework runs (TensorFlow cannot change it later);
    TensorFlow is imported only when a selected test uses it."""
    frameworks = {"numpy", "torch"}
    for item in request.session.items:  # this module's (a whole-suite session holds other tests' "impl" too)
        impl = getattr(item, "callspec", None) and item.callspec.params.get("impl")
        if isinstance(impl, attention_impls.Implementation):
            frameworks.add(impl.framework)
    return machine.configure_threads(THREADS, frameworks)


def _case(problem: str, device: str) -> attention.Case:
    kwargs = dict({**PROBLEMS, **CI_PROBLEMS}[problem])
    seq = kwargs.pop("seq")
    return attention.Case(q_len=seq, k_len=seq, device=device, **kwargs)


_inputs_cache: dict = {}


def _inputs(case):
    """Inputs and the float64 answers, once per problem (several implementations share them)."""
    if case not in _inputs_cache:
        _inputs_cache.clear()  # one problem at a time: the (B, H, N, N) references are large
        inputs = attention_reference.make_inputs(case)
        _inputs_cache[case] = (inputs, attention_reference.reference(case, inputs))
    return _inputs_cache[case]


def run_benchmark(benchmark, impl, case, rounds: int = 5):
    """Build `impl` on `case`, check it against the reference once, then hand its call to pytest-benchmark."""
    inputs, desired = _inputs(case)
    try:
        runner = impl.build(case, inputs)
    except harness.Unsupported as exc:
        pytest.skip(str(exc))
    benchmark.group = f"{case.scope} {case.mode} {case.shape} {case.mask} {case.dtype} {case.device}"
    framework = impl.framework

    def call():
        out = runner.fn()
        timing.sync(case.device, framework)
        return out

    with runner.context():
        out = call()  # first call (tracing, compilation) outside the timing; also the error check
        err, where = attention_reference.max_abs_error(runner.to_numpy(out), desired)
        benchmark.extra_info.update(impl=impl.name, gflop=case.flops / 1e9, max_abs_err=err, err_output=where,
                                    threads=THREADS, device=case.device)
        benchmark.pedantic(call, rounds=int(os.environ.get("BENCH_ROUNDS", rounds)), warmup_rounds=1, iterations=1)
        if runner.kernel is not None:
            benchmark.extra_info["kernel"] = runner.kernel()
        elif runner.kernel_name:
            benchmark.extra_info["kernel"] = runner.kernel_name
    stats = getattr(benchmark, "stats", None)
    if stats is not None and stats.stats.median > 0:
        benchmark.extra_info["tflops"] = case.flops / stats.stats.median / 1e12
    return err


def pairs(problems) -> list:
    return [pytest.param(impl, problem, device, id=f"{impl.name}-{problem}-{device}")
            for impl in _impls() for problem in problems for device in DEVICES
            if problems[problem].get("scope", "kernel") in impl.scopes and not (device == "cuda" and
                                                                               impl.framework == "numpy")]


def pytest_generate_tests(metafunc):
    """The full grid under --benchmark-only; the CI grid in a plain run."""
    if metafunc.function.__name__ == "test_attention":
        full = metafunc.config.getoption("benchmark_only", False)
        metafunc.parametrize("impl,problem,device", pairs(PROBLEMS if full else CI_PROBLEMS))


def test_attention(benchmark, impl, problem, device, request):
    case = _case(problem, device)
    err = run_benchmark(benchmark, impl, case, rounds=5 if request.config.getoption("benchmark_only", False) else 2)
    tolerance = atol(case.dtype) if case.dtype in ("float32", "float64") else math.inf
    assert err <= tolerance, f"{impl.name} is {err:.2e} from the float64 reference on {problem}"
    info = benchmark.extra_info
    assert info["impl"] == impl.name and info["gflop"] > 0
    if not getattr(benchmark, "disabled", False):  # timed: its rate is reported
        assert info["tflops"] > 0 and math.isfinite(info["tflops"])


def test_smoke_tiny(benchmark):
    """The tiniest benchmark (parity_tests/test_bench_smoke.py runs it with --benchmark-json): NumPy on a 1-head,
    8-position problem."""
    case = attention.Case(batch=1, heads=1, q_len=8, k_len=8, head_dim=4, mask="padded")
    err = run_benchmark(benchmark, attention_impls.REGISTRY["numpy"], case)
    assert err < 1e-5  # float32 against float64: a correctness check, not a timing one
