"""The attention benchmark (`transformer-parity bench`): cases and grids, FLOP counting, rows, and the run.

Method, per problem (case):
1. inputs are drawn once (float64, rounded to the case dtype) and the float64 NumPy reference is computed on exactly
   those values;
2. each implementation is built, then its **first call** is timed on its own (tracing, XLA compilation, kernel
   selection, lazy initialisation all land here);
3. one warm-up call doubles as the **memory** measurement and provides the output checked against the reference
   (**max abs error**, so a fast wrong kernel shows);
4. the steady state of all the problem's implementations is timed in interleaved rounds of >= 1 ms blocks (the
   device synchronised around each block, every framework's thread count set explicitly), so a noisy neighbour
   slows them alike and their ratios hold; each row reports the median and inter-quartile range over its blocks;
5. for PyTorch, one more call under `torch.profiler` names the aten kernel that actually ran.
An out-of-memory error becomes an `oom` row; an implementation that cannot run a case becomes an `unsupported` row
(or `not installed`), listed under the table rather than in it.

FLOP convention (the FlashAttention papers'): the attention core counts its two matmuls, `4 * B * H * Nq * Nk * D`
forward, halved for a causal mask; a padding mask changes nothing (dense kernels compute the padded scores too);
backward counts 2.5x the forward, so `fwd+bwd` is 3.5x. A block adds its four projections,
`4 * B * (Nq + Nk) * D_model^2` forward, and 2x that for their backward (input and weight gradients). Softmax,
scaling and masking are not counted. GFLOP/s = counted FLOPs / median time.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import itertools
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import attention_reference as ref
from . import harness, machine, timing

DTYPES = ("float32", "float64", "float16", "bfloat16")
MASKS = ("none", "causal", "padded", "padded+causal")
MODES = ("fwd", "fwd+bwd")
SCOPES = ("kernel", "block")
DEVICES = ("cpu", "cuda")
STATUSES = ("ok", "oom", "error", "unsupported", "not installed")

FLOP_CONVENTION = ("attention core 4*B*H*Nq*Nk*D forward (two matmuls), x0.5 causal, padding not subtracted; "
                   "backward 2.5x forward (fwd+bwd = 3.5x); block adds projections 4*B*(Nq+Nk)*Dm^2 forward, "
                   "2x that backward; softmax/scale/mask not counted")


@dataclass(frozen=True)
class Case:
    """One point of the grid: an attention problem on a device, in a dtype, forward or forward+backward."""

    batch: int = 4
    heads: int = 8
    q_len: int = 1024
    k_len: int = 1024
    head_dim: int = 64
    dtype: str = "float32"
    mask: str = "none"  # none | causal | padded | padded+causal
    mode: str = "fwd"  # fwd | fwd+bwd
    scope: str = "kernel"  # kernel: q, k, v already projected; block: the multi-head block with its projections
    device: str = "cpu"

    def __post_init__(self):
        for name in ("batch", "heads", "q_len", "k_len", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, received {value!r}")
        for name, choices in (("dtype", DTYPES), ("mask", MASKS), ("mode", MODES), ("scope", SCOPES),
                              ("device", DEVICES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, received {getattr(self, name)!r}")

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim

    @property
    def causal(self) -> bool:
        return self.mask in ("causal", "padded+causal")

    @property
    def shape(self) -> str:
        seq = str(self.q_len) if self.q_len == self.k_len else f"{self.q_len}x{self.k_len}"
        return f"B{self.batch} H{self.heads} N{seq} D{self.head_dim}"

    @property
    def flops(self) -> float:
        """Counted FLOPs of one call (see the module docstring)."""
        core = 4.0 * self.batch * self.heads * self.q_len * self.k_len * self.head_dim
        if self.causal:
            core /= 2
        proj = 4.0 * self.batch * (self.q_len + self.k_len) * self.d_model ** 2 if self.scope == "block" else 0.0
        if self.mode == "fwd+bwd":
            return 3.5 * core + 3.0 * proj
        return core + proj

    def group(self) -> tuple:
        """Everything but the dtype and device: rows in one group compute the same problem."""
        return (self.scope, self.mode, self.mask, self.batch, self.heads, self.q_len, self.k_len, self.head_dim)

# --- grids ----------------------------------------------------------------------------------------------------------

def grid_cases(**axes) -> list[dict]:
    """The cartesian product of the given axes (lists) as Case keyword dicts; `seq` sets q_len = k_len."""
    keys = list(axes)
    out = []
    for values in itertools.product(*(axes[k] for k in keys)):
        kw = dict(zip(keys, values))
        if "seq" in kw:
            kw["q_len"] = kw["k_len"] = kw.pop("seq")
        out.append(kw)
    return out


# The implementations the default grid times everywhere. Eager TensorFlow, tf_impl's keras path and the blockwise
# path under XLA are timed on the headline shape (B4 H8 N1024 D64) only (`--impl` selects any of them anywhere).
DEFAULT_IMPLS = ["numpy", "torch_impl.*", "torch.sdpa.*", "torch.nn.MHA", "tf_impl.explicit.function",
                 "tf_impl.explicit.xla", "tf_impl.blockwise.function", "keras.*.function", "keras.*.xla"]

# A preset is a list of (case keyword dicts, implementation patterns or None for every implementation).
PRESETS: dict[str, list[tuple[list[dict], list[str] | None]]] = {
    # About two minutes on a 2-core CPU. The sequence sweep feeds the plot; the headline shape (B4 H8 N1024 D64)
    # carries the masks and the eager rows; backward and the full block are measured at N512.
    "default": [
        (grid_cases(seq=[128, 256, 512, 1024]), DEFAULT_IMPLS),
        (grid_cases(seq=[1024]), ["tf_impl.*.eager", "tf_impl.keras.function", "tf_impl.blockwise.xla",
                                  "keras.dpa.eager"]),
        (grid_cases(seq=[1024], mask=["causal", "padded"]), DEFAULT_IMPLS),
        (grid_cases(seq=[512], mode=["fwd+bwd"]), DEFAULT_IMPLS),
        (grid_cases(seq=[512], scope=["block"], mode=["fwd", "fwd+bwd"]), DEFAULT_IMPLS),
    ],
    # Seconds: every implementation once on a tiny problem.
    "smoke": [
        (grid_cases(batch=[1], heads=[2], seq=[16], head_dim=[8], mask=["padded"]), None),
        (grid_cases(batch=[1], heads=[2], seq=[16], head_dim=[8], scope=["block"], mode=["fwd+bwd"]), None),
    ],
    # A GPU sweep: PyTorch's kernels in three dtypes on CUDA, the NumPy float32 baseline on the CPU where affordable.
    "gpu": [
        (grid_cases(heads=[16], seq=[512, 1024, 2048, 4096, 8192], dtype=["bfloat16", "float16", "float32"]),
         ["torch*"]),
        (grid_cases(heads=[16], seq=[512, 1024, 2048], device=["cpu"]), ["numpy"]),
        (grid_cases(heads=[16], seq=[1024]), ["tf_impl.*.function", "keras.dpa.function"]),  # TensorFlow, if installed
        (grid_cases(heads=[16], seq=[1024, 4096], dtype=["bfloat16"], mask=["causal", "padded"]), ["torch*"]),
        (grid_cases(heads=[16], seq=[1024, 4096], dtype=["bfloat16"], mode=["fwd+bwd"]), ["torch*"]),
        (grid_cases(heads=[16], seq=[1024], dtype=["bfloat16", "float32"], scope=["block"], mode=["fwd", "fwd+bwd"]),
         ["torch*"]),
        (grid_cases(heads=[16], seq=[1024], scope=["block"], mode=["fwd", "fwd+bwd"], device=["cpu"]), ["numpy"]),
    ],
}


def preset_cases(name: str, devices: Iterable[str]) -> list[tuple[Case, list[str] | None]]:
    """A preset's cases on the given devices (a case that names its own device keeps it)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    out = []
    for kwargs_list, patterns in PRESETS[name]:
        for kwargs in kwargs_list:
            for device in ([kwargs["device"]] if "device" in kwargs else devices):
                out.append((Case(**{**kwargs, "device": device}), patterns))
    return out

# --- rows and reports -------------------------------------------------------------------------------------------------

@dataclass
class Row:
    """One measured (or skipped) implementation on one case; every field lands in the JSON and CSV files."""

    impl: str
    framework: str
    status: str  # ok | oom | error | unsupported | not installed | skipped (too big or slow for this machine)
    scope: str
    mode: str
    mask: str
    dtype: str
    device: str
    device_name: str
    batch: int
    heads: int
    q_len: int
    k_len: int
    head_dim: int
    shape: str
    kernel: str = ""
    threads: int | None = None
    median_ms: float | None = None
    iqr_ms: float | None = None
    runs: int | None = None
    gflops: float | None = None  # counted GFLOP per call / median seconds
    gflop: float | None = None  # counted GFLOP per call
    peak_gflops: float | None = None  # the machine's measured GEMM peak for this device and dtype
    pct_peak: float | None = None
    speedup: float | None = None  # baseline median / this median
    baseline: str = ""
    peak_mem_mib: float | None = None
    mem_method: str = ""
    first_call_ms: float | None = None
    max_abs_err: float | None = None
    err_output: str = ""  # which output (out, grad_q, ...) had the largest error
    err_scope: str = ""  # "all", or the slice checked on shapes too big for a full float64 reference
    note: str = ""

    @property
    def case(self) -> Case:
        return Case(self.batch, self.heads, self.q_len, self.k_len, self.head_dim, self.dtype, self.mask, self.mode,
                    self.scope, self.device)


@dataclass
class Report:
    meta: dict[str, Any]
    peaks: list[dict[str, Any]]
    rows: list[Row]

    def to_json_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "peaks": self.peaks, "rows": [dataclasses.asdict(r) for r in self.rows]}

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> "Report":
        if not isinstance(data, dict) or not {"meta", "peaks", "rows"} <= set(data):
            raise ValueError("not a benchmark result: expected a JSON object with meta, peaks and rows")
        return cls(*harness.result_from_json(Row, data, {**harness.META_FIELDS, "memory": "dict"}))

# --- options ----------------------------------------------------------------------------------------------------------

@dataclass
class Options:
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    min_time: float = 0.15  # seconds of steady-state timing per row, at least
    max_time: float = 0.75  # ... and at most (a row still gets one run)
    min_runs: int = 5
    rounds: int = 5  # interleaved timing rounds per problem (a row slower than its budget takes part in fewer)
    seed: int = 0
    ref_limit: int = 1 << 26  # score elements (B*H*Nq*Nk) above which the float64 check uses a slice
    profile_kernels: bool = True
    peak_n: int | None = None  # GEMM size for the peak (default: gemm_size); tests use a small one
    peak_time: float = 1.0  # seconds of timing for each peak GEMM (its fastest block counts)
    row_budget: float = 60.0  # seconds a row may take (first call, warm-up, timing); rows surely slower are skipped
    progress: Callable[[str], None] | None = None

# --- the run ------------------------------------------------------------------------------------------------------

def _blank_row(impl, case: Case, status: str, note: str = "", device_names: dict | None = None) -> Row:
    return Row(impl=impl.name, framework=impl.framework, status=status, scope=case.scope, mode=case.mode,
               mask=case.mask, dtype=case.dtype, device=case.device,
               device_name=(device_names or {}).get(case.device, ""), batch=case.batch, heads=case.heads,
               q_len=case.q_len, k_len=case.k_len, head_dim=case.head_dim, shape=case.shape,
               gflop=case.flops / 1e9, note=note)


def run(plan: list[tuple[Case, list]], options: Options) -> Report:
    """Run every (case, implementations) pair of `plan`; returns the report with the header, peaks and rows."""
    started = time.perf_counter()
    progress = options.progress or (lambda msg: None)

    def say(message: str) -> None:
        progress(f"[{time.perf_counter() - started:6.1f}s] {message}")

    frameworks = {impl.framework for _, impls in plan for impl in impls}
    thread_info = machine.configure_threads(options.threads, frameworks)
    devices = sorted({case.device for case, _ in plan})
    device_names = {d: machine.device_name(d) for d in devices}
    tf32 = machine.disable_tf32(frameworks)

    peaks: dict[tuple[str, str], dict] = {}
    for device, dtype in sorted({(c.device, c.dtype) for c, impls in plan if impls}):
        say(f"peak: {dtype} GEMM on {device}")
        peaks[(device, dtype)] = machine.measure_peak(device, dtype, machine.peak_frameworks(frameworks),
                                                      options.threads, options.peak_n, options.peak_time)

    rows: list[Row] = []
    try:
        _run_cases(plan, options, peaks, device_names, rows, say)
    finally:
        gc.unfreeze()  # machine.free_memory froze survivors to keep collections cheap; leave the process as it was
    _fill_speedups(rows)

    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "versions": machine.versions(),
        "cpu": machine.cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": options.threads,
        "thread_settings": thread_info,
        "devices": device_names,
        "tf32": tf32,
        "flop_convention": FLOP_CONVENTION,
        "timing": (f"blocks of >= 1 ms (device synchronised), {options.rounds} interleaved rounds over a problem's "
                   f"implementations, >= {options.min_time}s and >= {options.min_runs} runs per row (capped at "
                   f"{options.max_time}s) after a timed first call and one warm-up call; median and IQR over blocks"),
        "wall_s": round(time.perf_counter() - started, 1),
        "memory": {"cpu": machine.RSSPeak.method if machine.RSSPeak.available() else machine.TracemallocPeak.method,
                   "cuda": "torch.cuda.max_memory_allocated above the pre-call allocation"},
        "error": "max |actual - float64 NumPy reference| over the output (and input gradients for fwd+bwd)",
        "baseline": "NumPy reference (reference_numpy) on the CPU, same case, same dtype or else float32",
    }
    return Report(meta, [{k: v for k, v in p.items()} for p in peaks.values()], rows)


def row_estimate(case: Case, peak_gflops: float | None) -> tuple[float, float | None]:
    """`(bytes, seconds)` a case needs at least: its inputs (drawn in float64, then rounded), their gradients for
    fwd+bwd, and one call at the measured GEMM peak (no implementation beats it) — a lower bound on the time."""
    b, h, tq, tk, d = case.batch, case.heads, case.q_len, case.k_len, case.head_dim
    elements = b * h * (2 * tq + 2 * tk) * d if case.scope == "kernel" else 2 * b * (tq + tk) * h * d + 4 * (h * d) ** 2
    nbytes = 8.0 * elements * (2 if case.mode == "fwd+bwd" else 1) * 2
    seconds = case.flops / (peak_gflops * 1e9) if peak_gflops else None
    return nbytes, seconds


def skip_reason(case: Case, options: Options, peaks: dict) -> str | None:
    """Why a case cannot run here (its inputs alone would not fit; three calls would surely exceed the row budget)."""
    nbytes, seconds = row_estimate(case, peaks.get((case.device, case.dtype), {}).get("gflops"))
    available = machine.available_ram()
    if available is not None and nbytes > 0.8 * available:
        return f"its inputs alone need ~{nbytes / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available"
    if seconds is not None and 3 * seconds > options.row_budget:
        return (f"one call needs >= {seconds:.3g} s even at the measured GEMM peak; the row budget is "
                f"{options.row_budget:g} s")
    return None


def _run_cases(plan, options, peaks, device_names, rows, say) -> None:
    for case, impls in plan:
        if not impls:
            continue
        reason = skip_reason(case, options, peaks)
        if reason is not None:
            say(f"{case.shape} {case.scope} {case.mode} {case.mask} {case.dtype} {case.device}: {reason}")
            rows.extend(_blank_row(impl, case, "skipped", reason, device_names) for impl in impls)
            continue
        inputs = ref.make_inputs(case, options.seed)
        desired, err_scope, slicer = _reference(case, inputs, options, say)
        for row in _run_case(case, impls, inputs, desired, err_scope, slicer, options, device_names, say):
            peak = peaks.get((case.device, case.dtype), {}).get("gflops")
            if row.gflops is not None and peak:
                row.peak_gflops, row.pct_peak = peak, 100 * row.gflops / peak
            rows.append(row)
        del inputs, desired
        machine.free_memory()


def _largest_intermediate(case: Case, framework: str) -> float:
    """Bytes of one materialised (B, H, Nq, Nk) score tensor in float64 (what the reference needs several of)."""
    return 8.0 * case.batch * case.heads * case.q_len * case.k_len


def _reference(case: Case, inputs, options: Options, say):
    """The float64 answers, on a slice of the problem when the full one would be too big to check."""
    slicer = ref.Slicer.for_case(case, options.ref_limit)
    say(f"{case.shape} {case.scope} {case.mode} {case.mask} {case.dtype}: float64 reference ({slicer.describe()})")
    need = 4 * _largest_intermediate(case, "numpy") * slicer.fraction_of(case)
    available = machine.available_ram()
    if available is not None and need > 0.8 * available:
        return None, f"skipped: the float64 reference needs ~{need / 2**30:.1f} GiB", slicer
    try:
        return ref.reference(case, slicer.inputs(inputs)), slicer.describe(), slicer
    except MemoryError:
        machine.free_memory()
        return None, "skipped: the float64 reference ran out of memory", slicer


def _run_case(case, impls, inputs, desired, err_scope, slicer, options, device_names, say) -> list[Row]:
    """Every implementation on one problem: build, first call, warm-up (memory, error), then interleaved timing
    rounds, then the kernel names."""
    rows, live = [], []
    for impl in impls:
        say(f"{case.shape} {case.scope} {case.mode} {case.mask} {case.dtype} {case.device}: {impl.name}")
        row, item = _prepare(impl, case, inputs, desired, err_scope, slicer, options, device_names)
        rows.append(row)
        if item is not None:
            live.append(item)
    if live:
        say(f"{case.shape} {case.scope} {case.mode} {case.mask} {case.dtype} {case.device}: timing {len(live)} "
            f"implementations in {max(item.rounds for item in live)} interleaved rounds")
    # Rounds interleave the implementations of one framework (the comparisons that must hold: ours against the
    # built-ins); frameworks take turns, with a pause between them on the CPU, because idle worker threads spin for a
    # while after their last op (OpenBLAS for ~0.1 s) and would slow whichever framework runs next.
    groups: dict[str, list[harness.Live]] = {}
    for item in live:
        groups.setdefault(item.impl.framework, []).append(item)
    for group in groups.values():
        if case.device == "cpu":
            time.sleep(harness.SETTLE_S)
        harness.timing_rounds(group, case, options)
    for item in live:
        if item.runner is None:  # failed during timing: its row says why
            continue
        row = item.row
        try:
            summary = timing.summarize(item.times, item.number)
            row.median_ms, row.iqr_ms, row.runs = 1e3 * summary.median, 1e3 * summary.iqr, summary.runs
            row.gflops = case.flops / summary.median / 1e9
            if options.profile_kernels and item.runner.kernel is not None:
                with item.runner.context():
                    row.kernel = item.runner.kernel()
            elif item.runner.kernel_name:
                row.kernel = item.runner.kernel_name
        except Exception as exc:  # noqa: BLE001
            if row.median_ms is None:
                harness.failed(row, exc)
            else:
                row.note = f"kernel name unavailable: {harness.first_line(exc)}"
    del live
    machine.free_memory()
    return rows


def _prepare(impl, case, inputs, desired, err_scope, slicer, options, device_names):
    """Build `impl`, time its first call, measure memory and error on a warm-up call; (row, harness.Live or None)."""
    row = _blank_row(impl, case, "ok", device_names=device_names)
    row.threads = options.threads
    try:
        runner = impl.build(case, inputs)
    except harness.NotInstalled as exc:
        row.status, row.note = "not installed", str(exc)
        return row, None
    except harness.Unsupported as exc:
        row.status, row.note = "unsupported", str(exc)
        return row, None
    except Exception as exc:  # noqa: BLE001 - a broken implementation is a row, not a crashed run
        return harness.failed(row, exc), None
    try:
        with runner.context():
            row.first_call_ms = 1e3 * timing.time_block(runner.fn, 1, case.device, impl.framework)
            out, per_call = machine.metered_call(runner.fn, row, case.device, impl.framework)
            if desired is not None:
                actual = slicer.outputs(runner.to_numpy(out))
                row.max_abs_err, row.err_output = ref.max_abs_error(actual, desired)
                if row.max_abs_err != row.max_abs_err:
                    row.note = f"{row.err_output} has NaN or Inf"
            row.err_scope = err_scope
            del out
            per_call = timing.sizing_call(runner.fn, per_call, options.max_time, case.device, impl.framework)
    except Exception as exc:  # noqa: BLE001
        harness.failed(row, exc)
        del runner
        machine.free_memory()
        return row, None
    number = timing.block_size(per_call)
    budget = min(options.max_time, max(options.min_time, options.min_runs * per_call))
    rounds = timing.rounds_that_fit(budget, per_call * number, options.rounds)
    return row, harness.Live(impl, runner, row, number, budget, rounds)


def _fill_speedups(rows: list[Row]) -> None:
    """speedup = the NumPy reference's median on the same problem (same dtype, else float32) / this row's median."""
    numpy_rows = {(r.case.group(), r.dtype): r for r in rows if r.framework == "numpy" and r.median_ms}
    for row in rows:
        if not row.median_ms:
            continue
        base = numpy_rows.get((row.case.group(), row.dtype)) or numpy_rows.get((row.case.group(), "float32"))
        if base is not None:
            row.speedup = base.median_ms / row.median_ms
            row.baseline = f"numpy {base.dtype}"


def ratios_to_fastest_builtin(rows: list[Row]) -> list[dict[str, Any]]:
    """For every problem and dtype, our fastest torch_impl / tf_impl row against the fastest built-in row of the same
    framework: ratio = our median / built-in median (1.00 = as fast; the goal is <= 1.10)."""
    from .attention_impls import REGISTRY
    ours = {"torch": "torch_impl.", "tf": "tf_impl."}
    out = []
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        if row.median_ms and row.framework in ours:
            groups.setdefault((row.case.group(), row.dtype, row.device, row.framework), []).append(row)
    for (group, dtype, device, framework), members in groups.items():
        mine = [r for r in members if r.impl.startswith(ours[framework])]
        builtin = [r for r in members if not r.impl.startswith(ours[framework]) and REGISTRY[r.impl].builtin]
        if not mine or not builtin:
            continue
        best_mine = min(mine, key=lambda r: r.median_ms)
        best_builtin = min(builtin, key=lambda r: r.median_ms)
        out.append({"framework": framework, "device": device, "dtype": dtype, "scope": members[0].scope,
                    "mode": members[0].mode, "mask": members[0].mask, "shape": members[0].shape,
                    "ours": best_mine.impl, "ours_ms": best_mine.median_ms, "builtin": best_builtin.impl,
                    "builtin_ms": best_builtin.median_ms, "ratio": best_mine.median_ms / best_builtin.median_ms})
    return out


def geomean(values: Iterable[float]) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")
