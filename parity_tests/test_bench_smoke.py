"""The benchmarks run: a tiny problem through the attention benchmark and through pytest-benchmark, every output of
the `bench` command, an out-of-memory row, and the CUDA path (marked gpu). Nothing here asserts anything about
speed."""

import dataclasses
import gc
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from transformer_parity.bench import (attention, attention_impls, attention_reference, attention_report, cli, harness,
                                      machine, model, model_impls, model_report, timing)
from parity_tests.tolerances import atol

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(batch=1, heads=2, q_len=8, k_len=8, head_dim=4)
QUICK = attention.Options(threads=1, min_time=0.005, max_time=0.01, min_runs=2, profile_kernels=False, peak_n=128,
                          peak_time=0.01)
SMOKE_IMPLS = ["numpy", "torch_impl.fused", "torch_impl.explicit", "torch.sdpa.math", "torch.nn.MHA",
               "tf_impl.blockwise.function", "keras.MHA.function"]


def _run(cases, names, options=QUICK):
    plan = [(case, [i for i in attention_impls.select(names) if case.scope in i.scopes]) for case in cases]
    return attention.run(plan, options)


def test_attention_bench_runs_every_framework_and_checks_against_the_reference():
    cases = [attention.Case(**TINY, mask="padded"),
             attention.Case(**TINY, mask="causal", mode="fwd+bwd", scope="block")]
    result = _run(cases, SMOKE_IMPLS)
    by_status = {}
    for row in result.rows:
        by_status.setdefault(row.status, []).append(row.impl)
    assert "error" not in by_status, [(r.impl, r.note) for r in result.rows if r.status == "error"]
    ok = [r for r in result.rows if r.status == "ok"]
    assert {r.framework for r in ok} >= {"numpy", "torch"}
    for row in ok:
        assert row.runs >= 1 and row.median_ms > 0 and row.gflops > 0
        assert row.max_abs_err < atol("float32"), (row.impl, row.scope, row.max_abs_err)
        assert row.first_call_ms is not None
    assert any(r.speedup for r in ok if r.framework != "numpy")  # NumPy rows are the baseline
    assert result.peaks and result.peaks[0]["gflops"] > 0
    assert {"versions", "cpu", "threads", "flop_convention", "date"} <= set(result.meta)


def test_flop_convention():
    case = attention.Case(batch=2, heads=3, q_len=5, k_len=7, head_dim=4)
    core = 4 * 2 * 3 * 5 * 7 * 4
    assert case.flops == core
    assert attention.Case(**{**TINY, "mask": "causal"}).flops == 4 * 1 * 2 * 8 * 8 * 4 / 2
    assert attention.Case(batch=2, heads=3, q_len=5, k_len=7, head_dim=4, mode="fwd+bwd").flops == 3.5 * core
    proj = 4 * 2 * (5 + 7) * 12 ** 2
    assert attention.Case(batch=2, heads=3, q_len=5, k_len=7, head_dim=4, scope="block").flops == core + proj


def test_peak_is_each_frameworks_fastest_block_and_probes_xla(monkeypatch):
    """The peak is a capability: noise only slows a GEMM down, so each framework counts its fastest block (a median
    probe taken at a noisy moment once put rows at 115% of it), and TensorFlow is probed compiled by XLA too."""
    blocks = {"numpy": [0.5, 0.4, 0.2, 0.3, 0.25], "torch": [0.8, 0.1, 0.6, 0.7]}  # warm-up first
    calls = {name: iter(times) for name, times in blocks.items()}
    monkeypatch.setattr(machine, "_gemm", lambda framework, *_: [(framework, framework)])
    monkeypatch.setattr(timing, "time_block", lambda fn, number, *_: next(calls[fn]))
    peak = machine.measure_peak("cpu", "float32", ["numpy", "torch"], threads=1, n=1000, min_run_time=0.9)
    assert peak["all"] == {"numpy": round(2e9 / 0.2 / 1e9, 2), "torch": round(2e9 / 0.1 / 1e9, 2)}
    assert peak["gflops"] == pytest.approx(20.0) and peak["by"] == "torch"
    crawl = iter([5.0])  # a warm-up call longer than the probe's time is the whole probe
    monkeypatch.setattr(timing, "time_block", lambda *_: next(crawl))
    assert machine.measure_peak("cpu", "bfloat16", ["torch"], 1, n=1000, min_run_time=0.9)["all"] == {"torch": 0.4}
    monkeypatch.undo()
    if importlib.util.find_spec("tensorflow") is not None:
        real = machine.measure_peak("cpu", "float32", ["tf"], threads=1, n=64, min_run_time=0.01)
        assert set(real["all"]) == {"tf", "tf.xla"} and round(real["gflops"], 2) == max(real["all"].values()) > 0


def test_a_timed_block_runs_without_the_garbage_collector():
    """A collection's cost belongs to the whole process, not to the block it lands in: off inside, restored after
    (also when the timed call raises), and left off when the caller had it off."""
    seen = []
    assert gc.isenabled()
    timing.time_block(lambda: seen.append(gc.isenabled()), 3, "cpu", "numpy")
    assert seen == [False] * 3 and gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        timing.time_block(lambda: 1 / 0, 1, "cpu", "numpy")
    assert gc.isenabled()
    gc.disable()
    try:
        timing.time_block(lambda: None, 1, "cpu", "numpy")
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("n", range(1, 9))
def test_round_orders_balance_position_and_predecessor(n):
    """Across the orders, every implementation takes every position, and follows every other one, equally often."""
    orders = harness.round_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    for position in range(n):
        assert Counter(order[position] for order in orders) == {k: len(orders) // n for k in range(n)}
    follows = Counter(pair for order in orders for pair in zip(order, order[1:]))
    assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(follows.values())) <= 1


def test_timing_rounds_change_the_order_every_round(monkeypatch):
    """The rounds follow `round_orders`, so no implementation always runs first after the pause between frameworks
    or always after the same neighbour (a fixed order once put a 0.89x row against the same pair's 1.01x); one with
    fewer rounds (slower than its budget) just drops out of the later ones."""
    order = []
    monkeypatch.setattr(timing, "time_block", lambda fn, number, *_: order.append(fn) or 1.0)
    runner = lambda name: harness.Runner(fn=name, to_numpy=dict)  # noqa: E731
    numpy_impl = types.SimpleNamespace(framework="numpy")
    group = [harness.Live(numpy_impl, runner(name), None, number=1, budget=rounds, rounds=rounds)
             for name, rounds in (("a", 4), ("b", 4), ("c", 2))]
    harness.timing_rounds(group, attention.Case(**TINY), dataclasses.replace(QUICK, rounds=4))
    assert order == list("abc" "bca" "ab" "ba")  # orders 012, 120, 201, 210; c has no third or fourth round
    assert [len(item.times) for item in group] == [4, 4, 2]
    assert [item.block_rounds for item in group] == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1]]
    assert group[2].round_medians() == [1.0, 1.0]


def test_timing_rounds_keep_min_runs_when_calls_turn_out_slower(monkeypatch):
    """A row's budget comes from one sizing call; if its calls then run slower (a busier host), the budget alone
    would buy fewer than --min-runs (150 asked, 144 timed in a goal run). Each round times enough blocks for its
    share of min_runs."""
    monkeypatch.setattr(timing, "time_block", lambda fn, number, *_: 1.0)  # every block overruns the round's share
    runner = harness.Runner(fn="a", to_numpy=dict)
    item = harness.Live(types.SimpleNamespace(framework="numpy"), runner, None, number=2, budget=4.0, rounds=4,
                        min_runs=21)
    harness.timing_rounds([item], attention.Case(**TINY), dataclasses.replace(QUICK, rounds=4))
    assert item.block_rounds == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # ceil(21 / (2 x 4)) = 3 blocks a round
    assert len(item.times) * item.number >= 21


def test_reference_slice_matches_full_reference():
    """Huge problems are checked on a slice; the slice of the full answer must be the answer of the slice."""
    case = attention.Case(batch=2, heads=3, q_len=6, k_len=6, head_dim=4, mask="padded+causal")
    inputs = attention_reference.make_inputs(case)
    full = attention_reference.reference(case, inputs)
    slicer = attention_reference.Slicer(batch=1, heads=2, rows=3)
    part = attention_reference.reference(case, slicer.inputs(inputs))
    np.testing.assert_allclose(part["out"], slicer.outputs(full)["out"], rtol=0, atol=1e-12)


def test_out_of_memory_is_a_row():
    def build(case, inputs):
        def fn():
            raise MemoryError("simulated: cannot allocate 64 GiB")
        return harness.Runner(fn=fn, to_numpy=dict)
    oom = attention_impls.Implementation("test.oom", "numpy", "always out of memory", ("kernel",), False, build)
    result = attention.run([(attention.Case(**TINY), [oom])], QUICK)
    (row,) = result.rows
    assert row.status == "oom" and "64 GiB" in row.note and row.median_ms is None
    assert "OOM" in attention_report.render_text(result)


def test_unsupported_and_unknown_implementations():
    result = _run([attention.Case(**TINY)], ["torch.sdpa.efficient"])
    assert [r.status for r in result.rows] == ["unsupported"] or machine.available_devices() != ["cpu"]
    with pytest.raises(ValueError, match="unknown implementation 'no-such-thing'"):
        attention_impls.select(["no-such-thing"])


def test_cli_outputs_compare_and_list(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = {kind: tmp_path / f"run.{kind}" for kind in ("json", "csv", "png")}
    argv = ["--impl", "numpy", "--batch", "1", "--heads", "1", "--seq", "8,16", "--head-dim", "4", "--mask",
            "none,padded", "--threads", "1", "--min-time", "0.005", "--max-time", "0.01", "--quiet",
            "--peak-size", "128", "--json", str(out["json"]), "--csv", str(out["csv"]), "--plot", str(out["png"])]
    assert cli.main(argv) == 0
    data = json.loads(out["json"].read_text())
    assert len(data["rows"]) == 4 and all(r["status"] == "ok" for r in data["rows"])
    assert out["csv"].read_text().splitlines()[0].startswith("impl,framework,status")
    assert len(out["csv"].read_text().splitlines()) == 5
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()

    assert cli.main(argv) == 2  # the files exist and --force was not given
    assert "exists; pass --force" in capsys.readouterr().err

    assert cli.main(["compare", str(out["json"]), str(out["json"])]) == 0
    text = capsys.readouterr().out
    assert "1.000" in text and "geomean B/A over 4 rows: 1.000" in text

    assert cli.main(["plot", str(out["json"]), str(tmp_path / "again.png")]) == 0
    assert cli.main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in attention_impls.REGISTRY)


@pytest.mark.parametrize("argv,message", [
    (["--impl", "nope"], "unknown implementation 'nope'"),
    (["--seq", "0"], "--seq values must be >= 1, received 0"),
    (["--dtype", "float8"], "--dtype takes comma-separated values"),
    (["--preset", "smoke", "--seq", "8"], "use --preset or grid options"),
    (["compare", "missing-a.json", "missing-b.json"], "no such result file: missing-a.json"),
])
def test_cli_bad_input_is_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_main_cli_has_bench():
    from transformer_parity import cli as main

    assert main.main(["bench", "--impl", "nope"]) == 2


def test_main_cli_bench_is_quiet_with_q(capsys):
    """`bench -q` and `bench model -q` take -q as every other command does: no progress lines on stderr."""
    from transformer_parity import cli as main_cli

    argv = ["bench", "-q", "--impl", "numpy", "--batch", "1", "--heads", "1", "--seq", "8", "--head-dim", "4",
            "--threads", "1", "--min-time", "0.005", "--max-time", "0.01", "--peak-size", "64"]
    assert main_cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "bench:" not in captured.err and "numpy" in captured.out
    assert getattr(main_cli.build_parser().parse_args(["bench", "model", "-q"]), "quiet", False) is True


def test_the_pytest_benchmark_suite_writes_valid_json_with_its_rate(tmp_path):
    """The attention suite as a benchmarker runs it (--benchmark-only, --benchmark-json) on its tiniest problem: the
    JSON parses, holds the row with its timing statistics, and the row's rate is the work divided by the median time,
    with the error against the reference recorded. (benchmarks/test_*.py themselves run in the suite at CI size.)"""
    pytest.importorskip("pytest_benchmark")
    test = "benchmarks/test_attention_bench.py::test_smoke_tiny"
    result = subprocess.run(
        # one process, as pytest-benchmark needs: without the suite's workers (-n) and outside the worker this runs in
        [sys.executable, "-m", "pytest", test, "--benchmark-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-o", "addopts=",
         f"--benchmark-json={tmp_path / 'bench.json'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}, "BENCH_ROUNDS": "3"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {"machine_info", "commit_info", "benchmarks", "datetime", "version"} <= set(data)
    (row,) = data["benchmarks"]
    stats, info = row["stats"], row["extra_info"]
    assert row["fullname"] == test and stats["rounds"] == 3 and 0 < stats["min"] <= stats["median"] <= stats["max"]
    assert info["tflops"] == pytest.approx(info["gflop"] / 1e3 / stats["median"])
    assert math.isfinite(info["max_abs_err"]) and info["max_abs_err"] < atol("float32")


@pytest.mark.gpu
def test_cuda_path():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cases = [attention.Case(**{**TINY, "head_dim": 64}, dtype=dtype, device="cuda", mask=mask)
             for dtype in ("float16", "bfloat16", "float32") for mask in ("none", "causal")]
    cases.append(attention.Case(**{**TINY, "head_dim": 64}, dtype="float16", device="cuda", mode="fwd+bwd",
                                scope="block"))
    result = _run(cases, ["torch*"])
    assert not [r for r in result.rows if r.status == "error"], [(r.impl, r.note) for r in result.rows]
    ok = [r for r in result.rows if r.status == "ok"]
    assert {"torch_impl.fused", "torch.sdpa.math"} <= {r.impl for r in ok}
    for row in ok:
        assert row.mem_method.startswith("cuda") and row.peak_mem_mib is not None
        assert row.max_abs_err < (1e-2 if row.dtype != "float32" else 1e-4), (row.impl, row.dtype, row.max_abs_err)


# --- the whole-model benchmark (`bench model`) ----------------------------------------------------------------------

MODEL_QUICK = ["model", "--preset", "smoke", "--threads", "1", "--max-time", "0.005", "--min-runs", "1", "--rounds",
               "1", "--peak-size", "64", "--peak-time", "0.001", "--quiet"]


def test_model_bench_writes_checked_rows_ratios_and_compares(tmp_path, capsys):
    """`bench model --preset smoke`: every framework's rows measured and checked against the float64 reference,
    the unsupported pairs listed with the reason, ratios in the JSON, CSV and compare readable."""
    out = {kind: tmp_path / f"model.{kind}" for kind in ("json", "csv")}
    assert cli.main(MODEL_QUICK + ["--json", str(out["json"]), "--csv", str(out["csv"])]) == 0
    data = json.loads(out["json"].read_text())
    assert data["kind"] == "model-bench" and data["meta"]["cpu"] and data["meta"]["load_before"]
    assert ">= 0.005s" in data["meta"]["timing"]  # --max-time alone lowers the default --min-time to it
    rows = {(r["impl"], r["task"], r["dtype"]): r for r in data["rows"]}
    measured = {key for key, r in rows.items() if r["status"] == "ok"}
    assert {("torch_impl.eager", task, dtype) for task in ("forward", "train", "generate", "generate-nocache")
            for dtype in ("float32", "bfloat16")} <= measured
    assert {("torch.nn.Transformer", "forward", "float32"), ("torch.nn.Transformer", "train", "float32"),
            ("torch.nn.Transformer", "generate-nocache", "float32")} <= measured
    assert rows[("torch.nn.Transformer", "generate", "float32")]["status"] == "unsupported"
    assert "no key/value cache" in rows[("torch.nn.Transformer", "generate", "float32")]["note"]
    if importlib.util.find_spec("tensorflow"):
        assert ("tf_impl.eager", "forward", "float32") in measured
    for key in measured:
        r = rows[key]
        assert r["median_ms"] > 0 and r["tokens_per_s"] > 0 and r["gflop"] > 0 and r["first_call_ms"] > 0, key
        if r["dtype"] == "float32":  # the float32 rule, and every row within it
            assert r["check"] == "ok" and r["max_abs_err"] <= r["tolerance"] <= 1e-3, key
        else:
            assert r["check"] == "" and r["max_abs_err"] is not None and r["max_abs_err"] < 0.5, key
    kinds = {r["kind"] for r in data["ratios"]}
    assert {"torch_impl vs nn.Transformer", "bfloat16 vs float32"} <= kinds
    assert {p["dtype"] for p in data["peaks"]} == {"float32", "bfloat16"}
    assert out["csv"].read_text().splitlines()[0].startswith("impl,framework,status,model,task")
    capsys.readouterr()
    assert cli.main(["model", "compare", str(out["json"]), str(out["json"])]) == 0
    assert "1.000" in capsys.readouterr().out
    assert cli.main(["model", "markdown", str(out["json"])]) == 0
    assert "torch_impl vs nn.Transformer" in capsys.readouterr().out
    assert cli.main(["compare", str(out["json"]), str(out["json"])]) == 2  # the attention actions say what it is
    assert "is a whole-model result; use `bench model" in capsys.readouterr().err


def test_model_bench_plot_axis_does_not_magnify_small_differences():
    """Bars 0.2% apart share a linear axis from 0 (an autoscaled log axis had drawn them as 1 to 7); bars spanning
    more than 10x get a log axis over whole decades that holds every bar."""
    scale, (low, high) = model_report.value_axis([13950.0, 13980.0])
    assert scale == "linear" and low == 0 and 13980 < high < 16000
    scale, (low, high) = model_report.value_axis([12.0, 950.0, 0.0])  # 0: a dtype the implementation did not run
    assert scale == "log" and (low, high) == (10.0, 10000.0)


def test_model_bench_flags_a_wrong_port():
    """A row whose output disagrees with the float64 reference is flagged (here: one kernel transposed)."""
    pytest.importorskip("torch")
    right = model_impls.REGISTRY["torch_impl.eager"]

    def wrong_builder(problem, weights, inputs):
        kernel = "encoder.layers.0.ffn.linear1.kernel"
        planted = {**weights, kernel: weights[kernel] * 1.01}
        return right.builder(problem, planted, inputs)

    wrong = model_impls.ModelImpl("planted", "torch", "a wrong port", right.tasks, right.dtypes, wrong_builder)
    pairs = [(problem, [right, wrong]) for problem, _ in model.plan("smoke", tasks=["forward", "train"],
                                                                    dtypes=["float32"],
                                                                    impl_patterns=["torch_impl.eager"])]
    options = model.Options(threads=1, min_time=0.001, max_time=0.005, min_runs=1, rounds=1, peak_n=64,
                            peak_time=0.001)
    rows = model.run(pairs, options).rows
    assert [(r.impl, r.check) for r in rows] == [("torch_impl.eager", "ok"), ("planted", "FLAGGED")] * 2
    assert all("differ from the float64 reference" in r.note for r in rows if r.impl == "planted")


def test_model_bench_ratio_verdict_pairs_rounds():
    """A ratio is `met` / `NOT met` only when the goal lies outside its 95% interval, which comes from the rounds the
    two rows shared (Student's t on the per-round log ratios): drift of the host between rounds cancels, a ratio
    that wanders from round to round is a tie, and fewer than MIN_JUDGED_ROUNDS shared rounds are not judged."""
    from transformer_parity.bench.model import ModelRow
    from transformer_parity.bench.model_report import MIN_JUDGED_ROUNDS, ratios, t95, verdict

    def row(impl, round_ms):
        median = float(np.median(round_ms)) if round_ms else 100.0
        return ModelRow(impl=impl, framework="torch", status="ok", model="m", task="train", dtype="float32", batch=1,
                        src_len=1, tgt_len=1, new_tokens=1, d_model=1, layers="1+1", vocab=1, device_name="cpu",
                        tokens=1, gflop=1.0, median_ms=median, iqr_ms=1.0, runs=50, round_ms=round_ms)

    def judged(ours, per_round_speed):
        theirs = [o * s for o, s in zip(ours, per_round_speed)]
        (r,) = [r for r in ratios([row("torch_impl.eager", ours), row("torch.nn.Transformer", theirs)])
                if r["kind"] == "torch_impl vs nn.Transformer"]
        return r, verdict(r)

    assert MIN_JUDGED_ROUNDS == 5
    # the host drifts by 50% between rounds, ours is 2% faster in each: drift cancels round by round
    drifting = [80.0, 120.0, 100.0, 90.0, 110.0]
    r, said = judged(drifting, [1.02, 1.021, 1.019, 1.02, 1.02])
    logs = np.log([1.02, 1.021, 1.019, 1.02, 1.02])
    assert r["rounds"] == 5
    assert r["noise"] == pytest.approx(math.expm1(2.776 * np.std(logs, ddof=1) / math.sqrt(5)), rel=1e-9)
    assert said == "met"
    assert judged(drifting, [0.98, 0.979, 0.981, 0.98, 0.98])[1] == "NOT met"
    # the ratio itself wanders (0.9-1.1x): 1.0 lies within its interval, whichever side the medians fall
    r, said = judged(drifting, [0.9, 1.1, 0.95, 1.05, 1.02])
    assert said.startswith("tie (+-") and r["noise"] > 0.05
    # four shared rounds (one row dropped out of the fifth), or a result file without rounds: not judged
    assert judged(drifting[:4], [1.1] * 4)[1] == "too few rounds to judge (4; needs 5)"
    (r,) = [r for r in ratios([row("torch_impl.eager", None), row("torch.nn.Transformer", None)])
            if r["kind"] == "torch_impl vs nn.Transformer"]
    assert r["noise"] is None and verdict(r) == "not judged (no per-round times in this result)"
    # Student's t: the table, then the Cornish-Fisher expansion (within 0.2% of the exact quantiles)
    assert t95(4) == 2.776
    for df, exact in ((10, 2.228), (30, 2.042), (120, 1.980), (10_000, 1.960)):
        assert t95(df) == pytest.approx(exact, rel=2e-3)


def test_model_bench_times_calls_outside_the_memory_meter(monkeypatch):
    """How many rounds a row gets comes from one timed call; the memory meter's entry (a full garbage collection and
    a heap trim, 0.1-0.5 s in a process holding several models) once counted in it, and the default grid's 75 ms
    forward rows ran 3 rounds instead of 5. Here a meter that takes 0.3 s to enter must change nothing."""
    class SlowMeter:
        method, peak_mib = "test", 0.0

        def __enter__(self):
            time.sleep(0.3)
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(machine, "memory_meter", lambda *_: SlowMeter())
    pairs = model.plan("smoke", tasks=["forward"], dtypes=["float32"], impl_patterns=["torch_impl.eager"])
    options = model.Options(threads=1, min_time=0.05, max_time=0.1, min_runs=1, rounds=5, peak_n=64,
                            peak_time=0.001)
    (row,) = model.run(pairs, options).rows
    assert row.status == "ok" and len(row.round_ms) == 5 and row.median_ms < 50


def test_model_bench_gives_a_slow_row_its_rounds():
    """A row of calls too slow for min_time to hold a block in each round gets the time for one, up to max_time (a
    0.35 s training step had 4 rounds in the grid, too few for a verdict): here 40 ms calls, min_time 0.15 s (3 of
    them), 5 rounds asked for. max_time (2 s) leaves room for calls 8x slower on a loaded machine: min_time alone
    would still give fewer than 5 rounds, and a 0.3 s cap made the test count the machine's load (2 rounds seen)."""
    pytest.importorskip("torch")
    right = model_impls.REGISTRY["torch_impl.eager"]

    def slow_builder(problem, weights, inputs):
        runner = right.builder(problem, weights, inputs)
        fn = runner.fn
        return dataclasses.replace(runner, fn=lambda: (time.sleep(0.04), fn())[1])

    slow = model_impls.ModelImpl("slow", "torch", "40 ms more per call", right.tasks, right.dtypes, slow_builder)
    pairs = [(problem, [slow]) for problem, _ in model.plan("smoke", tasks=["forward"], dtypes=["float32"],
                                                            impl_patterns=["torch_impl.eager"])]
    options = model.Options(threads=1, min_time=0.15, max_time=2.0, min_runs=1, rounds=5, peak_n=64,
                            peak_time=0.001)
    (row,) = model.run(pairs, options).rows
    assert row.status == "ok" and len(row.round_ms) == 5 and row.median_ms >= 40


def test_rounds_that_fit():
    assert timing.rounds_that_fit(1.5, 0.3, 5) == 5  # 1.5 // 0.3 is 4.0 in floating point
    assert timing.rounds_that_fit(1.49, 0.3, 5) == 4
    assert timing.rounds_that_fit(0.1, 0.3, 5) == 1
    assert timing.rounds_that_fit(100.0, 0.3, 5) == 5
    assert timing.rounds_that_fit(1.0, 0.0, 5) == 5


def test_model_flop_count():
    """The analytic count, by hand for a 1+1-layer model (see transformer_parity/bench/model.py)."""
    from transformer_parity.bench.model import MODELS, model_flops
    from reference_numpy import TransformerConfig

    c = TransformerConfig(**MODELS["micro"]["config"])  # d 16, d_ff 32, V 20
    d, f, v, b, s, t = 16, 32, 20, 2, 6, 5
    enc = b * s * (8 * d * d + 4 * d * f) + 4 * b * s * s * d
    dec = b * t * (12 * d * d + 4 * d * f) + 4 * b * t * (t + s) * d + 4 * b * s * d * d
    assert model_flops(c, b, s, t, 0, "forward") == enc + dec + 2 * b * t * d * v
    assert model_flops(c, b, s, t, 0, "train") == 3 * (enc + dec + 2 * b * t * d * v)
    step1 = b * (12 * d * d + 4 * d * f) + 4 * b * (1 + s) * d + 4 * b * s * d * d + 2 * b * d * v
    step2 = b * (12 * d * d + 4 * d * f) + 4 * b * (2 + s) * d + 2 * b * d * v  # cross k/v cached
    assert model_flops(c, b, s, t, 2, "generate") == enc + step1 + step2
    assert model_flops(c, b, s, t, 2, "generate-nocache") > model_flops(c, b, s, t, 2, "generate")


def test_model_flop_count_with_grouped_heads_a_gated_ffn_and_experts():
    """By hand for mixtral-micro (d 16, 4 heads of 4 over 2 k/v heads, gated d_ff 24, 4 experts, top 2, V 24):
    k and v projections are half as wide, each token runs 2 experts of 3 matrices, and the router is counted."""
    from transformer_parity.bench.model import MODELS, model_flops
    from reference_numpy import TransformerConfig

    c = TransformerConfig(**MODELS["mixtral-micro"]["config"])
    d, f, v, b, t = 16, 24, 24, 2, 5
    per_token = (4 * d * d + 4 * d * 8) + (2 * 2 * 3 * d * f + 2 * d * 4)
    assert model_flops(c, b, 0, t, 0, "forward") == b * t * per_token + 4 * b * t * t * d + 2 * b * t * d * v
    dense = c.replace(num_experts=0, experts_per_token=0, router_renormalize=False)
    assert model_flops(dense, b, 0, t, 0, "forward") == (b * t * (4 * d * d + 4 * d * 8 + 2 * 3 * d * f)
                                                         + 4 * b * t * t * d + 2 * b * t * d * v)


@pytest.mark.parametrize("argv,message", [
    (["model", "--impl", "nope"], "unknown implementation 'nope'"),
    (["model", "--task", "sing"], "--task takes comma-separated values"),
    (["model", "--model", "huge"], "--model takes comma-separated values"),
    (["model", "--batch", "0"], "--batch must be >= 1, received 0"),
    (["model", "--set", "d_model=7"], "d_model=7 is not divisible by num_heads"),
    (["model", "--model", "micro", "--src-len", "99"], "do not fit max_len=16"),
    (["model", "compare", "missing.json", "missing.json"], "no such result file: missing.json"),
    (["model", "--min-time", "3", "--max-time", "1"], "need 0 < --min-time <= --max-time, received 3.0 and 1.0"),
    (["model", "--max-time", "0"], "need 0 < --min-time <= --max-time, received 0.0 and 0.0"),
])
def test_model_bench_bad_input_is_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("result", ["attention-cpu/attention_bench.json", "model-cpu-goals-tf/model_bench.json"])
@pytest.mark.parametrize("corrupt, message", [
    (lambda d: d["rows"][0].update(median_ms="slow"), "row 0: median_ms must be a finite number or null, "
                                                      "received 'slow'"),
    (lambda d: d["rows"][0].update(runs=2.5), "row 0: runs must be an integer or null, received 2.5"),
    (lambda d: d["rows"].__setitem__(0, 7), "row 0 must be an object, received int"),
    (lambda d: d.update(rows={}), "rows must be a list, received dict"),
    (lambda d: d["peaks"][0].update(all=5), "peak 0: all must be an object of numbers, received 5"),
    (lambda d: d.update(meta=[]), "meta must be an object, received list"),
    (lambda d: d["meta"].update(date=5), "meta: date must be a string, received 5"),
])
def test_corrupt_result_files_are_one_line(result, corrupt, message, tmp_path, capsys):
    """A hand-edited or damaged result file is refused as it is read, naming the field and the value received, for
    every report action of both benches; nothing is written."""
    data = json.loads((ROOT / "benchmarks" / "results" / result).read_text())
    corrupt(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    model = ["model"] if result.startswith("model") else []
    for argv in (model + ["markdown", str(path)], model + ["compare", str(path), str(path)],
                 model + ["plot", str(path), str(tmp_path / "out.png")]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not (tmp_path / "out.png").exists()


def test_streaming_bench_times_every_row_beside_the_disk(tmp_path):
    """`benchmarks/bench_streaming.py --size tiny --cold`: a generated bfloat16 Llama directory, each conversion and
    the two copies timed in fresh processes (each input dropped from the page cache first), ratios against both
    copies computed, the directory removed after."""
    spec = importlib.util.spec_from_file_location("bench_streaming", ROOT / "benchmarks" / "bench_streaming.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = tmp_path / "r.json"
    assert bench.main(["--size", "tiny", "--skip-libraries", "--dir", str(tmp_path), "--json", str(report),
                       "--rounds", "2", "--cold"]) == 0
    result = json.loads(report.read_text())
    steps = [r["step"] for r in result["rows"]]
    assert steps[:2] == ["cp -r", "cp -r + sync (written to disk, as convert's atomic output is)"]
    assert {"convert -> canonical .safetensors", "convert -> Keras .weights.h5 (bfloat16)",
            "convert -> KerasHub preset (bfloat16)", "export canonical -> HF directory",
            "convert Keras .weights.h5 -> HF directory", "convert KerasHub preset -> HF directory",
            "verify (layer-streamed: numpy f64 and f32, torch, keras)"} <= set(steps)
    assert result["verify"]["mode"] == "layer-streamed" and result["verify"]["passed"] and result["cold"]
    assert result["parameters"] == sum(math.prod(s) for s in bench.shapes(bench.SIZES["tiny"]).values())
    assert result["checkpoint_bytes"] > 2 * result["parameters"]  # bfloat16 tensors plus the headers
    for r in result["rows"]:
        assert r["seconds"] > 0 and r["peak_rss_bytes"] > 0
        rounds = 1 if r["step"].startswith("verify") else 2  # the disk and the conversions, interleaved twice
        assert len(r["seconds_each"]) == rounds and r["seconds"] == pytest.approx(sorted(r["seconds_each"])[0] if
                                                                                  rounds == 1 else
                                                                                  sum(r["seconds_each"]) / 2, abs=2e-3)
        assert r["time_x_cp"] == pytest.approx(r["seconds"] / max(result["rows"][0]["seconds"], 1e-3), rel=0.01)
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_transpose_bench_times_every_path_this_machine_has(capsys):
    """`benchmarks/bench_transpose.py --rounds 1`: every vector level of the compiled tiles this CPU has and NumPy's
    blocks, each checked against `.T` before it is timed, a GB/s and a ratio to NumPy printed for each."""
    spec = importlib.util.spec_from_file_location("bench_transpose", ROOT / "benchmarks" / "bench_transpose.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--rounds", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("compiled", "numpy"))]
    from transformer_parity.streaming import transpose

    expected = (transpose._tiles.LEVEL + 1 if transpose._tiles is not None else 0) + 1
    assert len(rows) == expected and rows[-1].startswith("numpy blocks")
    assert all(float(row.split()[-2]) > 0 for row in rows) and rows[-1].split()[-1] == "1.00"


@pytest.mark.parametrize("script", ["bench_transpose", "bench_streaming"])
def test_the_io_benches_refuse_zero_rounds_in_one_line(script, capsys):
    spec = importlib.util.spec_from_file_location(script, ROOT / "benchmarks" / f"{script}.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--rounds", "0"])
    assert exit_.value.code == 2
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("shape", ["llama-micro", "gpt2-micro", "mixtral-micro"])
def test_model_bench_library_rows_run_against_transformers_and_keras_hub(shape):
    """The rows of an architecture both libraries hold: our twin, transformers' class (LlamaForCausalLM,
    GPT2LMHeadModel: from the project's HF export) and KerasHub's causal LM (LlamaCausalLM, GPT2CausalLM: from the
    project's preset export) on the same weights, each checked against the reference."""
    pytest.importorskip("transformers")
    pytest.importorskip("keras_hub")
    pairs = model.plan("default", models=[shape], tasks=["forward"], dtypes=["float32"],
                       impl_patterns=["torch_impl.eager", "transformers", "keras_hub.function"])
    options = model.Options(threads=1, min_time=0.001, max_time=0.005, min_runs=1, rounds=1, peak_n=64,
                            peak_time=0.001)
    rows = {r.impl: r for r in model.run(pairs, options).rows}
    assert set(rows) == {"torch_impl.eager", "transformers", "keras_hub.function"}
    for r in rows.values():
        assert r.status == "ok" and r.check == "ok" and r.max_abs_err <= r.tolerance, (r.impl, r.note)
