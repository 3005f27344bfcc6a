"""The benchmark engine: cases and grids, FLOP counting, timing, the machine's measured peak, memory, rows.

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

import contextlib
import ctypes
import dataclasses
import datetime
import gc
import itertools
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from . import reference as ref

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

def _cases(**axes) -> list[dict]:
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
# path under XLA are timed on the shape only (`--impl` selects any of them anywhere).
DEFAULT_IMPLS = ["numpy", "torch_impl.*", "torch.sdpa.*", "torch.nn.MHA", "tf_impl.explicit.function",
                 "tf_impl.explicit.xla", "tf_impl.blockwise.function", "keras.*.function", "keras.*.xla"]

# A preset is a list of (case keyword dicts, implementation patterns or None for every implementation).
PRESETS: dict[str, list[tuple[list[dict], list[str] | None]]] = {
    # About two minutes on a 2-core CPU. The sequence sweep feeds the plot; the shape (B4 H8 N1024 D64)
    # carries the masks and the eager rows; backward and the full block are measured at N512.
    "default": [
        (_cases(seq=[128, 256, 512, 1024]), DEFAULT_IMPLS),
        (_cases(seq=[1024]), ["tf_impl.*.eager", "tf_impl.keras.function", "tf_impl.blockwise.xla", "keras.dpa.eager"]),
        (_cases(seq=[1024], mask=["causal", "padded"]), DEFAULT_IMPLS),
        (_cases(seq=[512], mode=["fwd+bwd"]), DEFAULT_IMPLS),
        (_cases(seq=[512], scope=["block"], mode=["fwd", "fwd+bwd"]), DEFAULT_IMPLS),
    ],
    # Seconds: every implementation once on a tiny problem.
    "smoke": [
        (_cases(batch=[1], heads=[2], seq=[16], head_dim=[8], mask=["padded"]), None),
        (_cases(batch=[1], heads=[2], seq=[16], head_dim=[8], scope=["block"], mode=["fwd+bwd"]), None),
    ],
    # A GPU sweep: PyTorch's kernels in three dtypes on CUDA, the NumPy float32 baseline on the CPU where affordable.
    "gpu": [
        (_cases(heads=[16], seq=[512, 1024, 2048, 4096, 8192], dtype=["bfloat16", "float16", "float32"]),
         ["torch*"]),
        (_cases(heads=[16], seq=[512, 1024, 2048], device=["cpu"]), ["numpy"]),
        (_cases(heads=[16], seq=[1024]), ["tf_impl.*.function", "keras.dpa.function"]),  # TensorFlow, if installed
        (_cases(heads=[16], seq=[1024, 4096], dtype=["bfloat16"], mask=["causal", "padded"]), ["torch*"]),
        (_cases(heads=[16], seq=[1024, 4096], dtype=["bfloat16"], mode=["fwd+bwd"]), ["torch*"]),
        (_cases(heads=[16], seq=[1024], dtype=["bfloat16", "float32"], scope=["block"], mode=["fwd", "fwd+bwd"]),
         ["torch*"]),
        (_cases(heads=[16], seq=[1024], scope=["block"], mode=["fwd", "fwd+bwd"], device=["cpu"]), ["numpy"]),
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
        return cls(*result_from_json(Row, data, {**META_FIELDS, "memory": "dict"}))


_JSON_KINDS = {"str": "a string", "int": "an integer", "float": "a finite number",
               "list[float]": "a list of finite numbers", "dict": "an object", "dict[float]": "an object of numbers"}
# The meta and peak fields that the tables and plots read (others are shown as they are, or not at all).
META_FIELDS = {"date": "str", "cpu": "str", "cpu_flags": "str", "versions": "dict", "devices": "dict",
               "thread_settings": "dict"}
PEAK_FIELDS = {"device": "str", "dtype": "str", "by": "str", "n": "int", "gflops": "float | None",
               "all": "dict[float]"}


def _json_value_fits(value: Any, annotation: str) -> bool:
    """Whether a JSON value fits a field annotated as a key of _JSON_KINDS, maybe `| None`."""
    if value is None:
        return annotation.endswith("| None")
    kind = annotation.removesuffix(" | None")
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "list[float]":
        return isinstance(value, list) and all(_json_value_fits(x, "float") for x in value)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "dict[float]":
        return isinstance(value, dict) and all(_json_value_fits(x, "float") for x in value.values())
    raise TypeError(f"no JSON check for a field of type {annotation}")


def _check_fields(obj: Any, fields: dict[str, str], where: str) -> dict:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be an object, received {type(obj).__name__}")
    for name, annotation in fields.items():
        if name in obj and not _json_value_fits(obj[name], annotation):
            wanted = _JSON_KINDS[annotation.removesuffix(" | None")]
            raise ValueError(f"{where}: {name} must be {wanted}{' or null' if annotation.endswith('| None') else ''}, "
                             f"received {obj[name]!r:.60}")
    return obj


def result_from_json(row_type: type, data: dict[str, Any], meta_fields: dict[str, str] = META_FIELDS
                     ) -> tuple[dict, list[dict], list]:
    """(meta, peaks, rows) of a result file, every row field checked against its annotation and the meta and peak
    fields the reports read against `meta_fields` and PEAK_FIELDS, so that a corrupt or hand-edited file is refused
    here in one line, not by a TypeError deep in a table or a plot. Unknown keys are ignored (files written by other
    versions)."""
    meta = _check_fields(data["meta"], meta_fields, "meta")
    peaks, rows = data["peaks"], data["rows"]
    for name, value in (("peaks", peaks), ("rows", rows)):
        if not isinstance(value, list):
            raise ValueError(f"{name} must be a list, received {type(value).__name__}")
    peaks = [_check_fields(peak, PEAK_FIELDS, f"peak {index}") for index, peak in enumerate(peaks)]
    fields = {f.name: str(f.type) for f in dataclasses.fields(row_type)}
    return meta, peaks, [row_type(**{k: v for k, v in _check_fields(row, fields, f"row {index}").items()
                                     if k in fields}) for index, row in enumerate(rows)]


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


# --- the machine --------------------------------------------------------------------------------------------------

def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    if device == "cuda":
        import torch
        return torch.cuda.get_device_name()
    return cpu_name()


def available_devices() -> list[str]:
    devices = ["cpu"]
    try:
        import torch
        if torch.cuda.is_available():
            devices.append("cuda")
    except ImportError:
        pass
    return devices


def versions() -> dict[str, str]:
    """Library versions, read from package metadata (importing TensorFlow just for its version would be slow)."""
    from importlib import metadata
    out = {"python": platform.python_version()}
    for dist in ("numpy", "torch", "tensorflow", "tensorflow-cpu", "keras"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def configure_threads(threads: int, frameworks: Iterable[str]) -> dict[str, Any]:
    """Set every framework's thread count explicitly; returns what each ended up with.

    TensorFlow fixes its pools when its runtime starts, so this must run before the first TensorFlow op. Both of its
    pools get `threads` (its own default is the core count for both): the intra-op pool splits one op, the inter-op
    pool runs independent ops at once, which blockwise attention's independent blocks use.
    """
    out: dict[str, Any] = {}
    frameworks = set(frameworks)
    if "torch" in frameworks or _importable("torch"):
        import torch
        torch.set_num_threads(threads)
        out["torch"] = torch.get_num_threads()
    if "tf" in frameworks:
        try:
            from tf_impl.startup import tf
        except ImportError:
            pass
        else:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(threads)
                tf.config.threading.set_inter_op_parallelism_threads(threads)
            except RuntimeError:  # the runtime already started (another test used TensorFlow first)
                pass
            out["tf_intra_op"] = tf.config.threading.get_intra_op_parallelism_threads() or "default"
            out["tf_inter_op"] = tf.config.threading.get_inter_op_parallelism_threads() or "default"
    try:
        import threadpoolctl  # optional: NumPy's BLAS pool
        threadpoolctl.threadpool_limits(threads, user_api="blas")
        out["numpy_blas"] = threads
    except ImportError:
        out["numpy_blas"] = "BLAS default (threadpoolctl not installed)"
    return out


def _importable(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


# --- timing -----------------------------------------------------------------------------------------------------------
# The equivalent of torch.utils.benchmark's blocked_autorange, interleaved: every implementation of a problem is timed
# in blocks of calls (each block at least 1 ms, so the clock and the CUDA synchronisation cost < 0.1%), a share of
# its budget per round, round after round, so that a noisy neighbour slows all of them alike. Threads are set for
# every framework once, by configure_threads (torch.utils.benchmark.Timer would otherwise run torch on one thread).

@dataclass
class Timing:
    median: float  # seconds per call
    iqr: float
    runs: int


def block_size(per_call: float) -> int:
    """Calls per timed block: enough that a block lasts at least 1 ms."""
    return max(1, math.ceil(1e-3 / max(per_call, 1e-9)))


def time_block(fn: Callable[[], Any], number: int, device: str = "cpu", framework: str = "torch") -> float:
    """Seconds per call over `number` calls, the device synchronised before the clock starts and before it stops.

    Python's cyclic garbage collector is off inside a block, as `timeit` keeps it off: what a collection costs depends
    on everything else alive in the process, not on the code timed (with four TensorFlow models, PyTorch and
    transformers loaded, about 500,000 tracked objects, one bench run made 12 full collections of 140 ms on average,
    up to 256 ms), and it fell on whichever block's allocation crossed the threshold. The collections that are due
    run between blocks, untimed."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        _sync(device, framework)
        start = time.perf_counter()
        for _ in range(number):
            fn()
        _sync(device, framework)
        return (time.perf_counter() - start) / number
    finally:
        if collecting:
            gc.enable()


def summarize(block_times: list[float], number: int) -> Timing:
    q25, q50, q75 = np.quantile(block_times, [0.25, 0.5, 0.75])
    return Timing(float(q50), float(q75 - q25), len(block_times) * number)


def time_blocks(fn: Callable[[], Any], min_run_time: float, device: str = "cpu", framework: str = "torch"
                ) -> list[float]:
    """Seconds per call of each block of `fn` timed alone: one warm-up call, then blocks until `min_run_time`, at
    least 3. A `fn` whose warm-up call alone outlasts `min_run_time` is timed by that call."""
    warm_up = time_block(fn, 1, device, framework)
    if warm_up >= min_run_time:
        return [warm_up]
    number, blocks = block_size(warm_up), []
    while len(blocks) < 3 or sum(blocks) * number < min_run_time:
        blocks.append(time_block(fn, number, device, framework))
    return blocks


def rounds_that_fit(budget: float, block: float, wanted: int) -> int:
    """Rounds of at least one block each that `budget` seconds hold, at most `wanted`, at least 1 (a hair of slack:
    1.5 s // 0.3 s is 4.0 in floating point)."""
    return max(1, min(wanted, math.floor(budget / block * (1 + 1e-9)))) if block > 0 else wanted


def metered_call(fn: Callable[[], Any], row, device: str = "cpu", framework: str = "torch") -> tuple[Any, float]:
    """One call of `fn` under the memory meter: (its output, seconds). The peak lands on `row` (`peak_mem_mib`,
    `mem_method`). The clock starts inside the meter, because entering it collects garbage and trims the heap
    (0.1-0.5 s with several models loaded), which had made a 75 ms call look several times longer."""
    meter = memory_meter(device, framework)
    _sync(device, framework)
    with meter if meter is not None else contextlib.nullcontext():
        start = time.perf_counter()
        out = fn()
        _sync(device, framework)
        seconds = time.perf_counter() - start
    if meter is not None:
        row.peak_mem_mib, row.mem_method = meter.peak_mib, meter.method
    return out, seconds


def sizing_call(fn: Callable[[], Any], metered: float, limit: float, device: str = "cpu", framework: str = "torch"
                ) -> float:
    """Seconds per call to size a row's blocks and rounds by. The memory-metered warm-up call follows a heap trim
    and pays the page faults of refilling the heap (base-256 and gpt2-256 training steps: up to 1.24x the plain call
    after it), so a call that fits within `limit` (the row's longest timing) is followed by one plain call, and that
    call sizes the row."""
    return time_block(fn, 1, device, framework) if metered <= limit else metered


def _sync(device: str, framework: str) -> None:
    if device != "cuda":
        return
    if framework == "torch":
        import torch
        torch.cuda.synchronize()
    elif framework == "tf":
        from tf_impl.startup import tf
        tf.test.experimental.sync_devices()


# --- the machine's measured peak --------------------------------------------------------------------------------------

def gemm_size(device: str, dtype: str) -> int:
    if device == "cuda":
        return 8192
    # half precision: 1024, where TensorFlow's and XLA's bf16 GEMMs reach their float32 speed on a CPU without native
    # bf16 (at 512 they reach two thirds of it); a framework that crawls there is timed on its one warm-up call
    return 2048 if dtype in ("float32", "float64") else 1024


def peak_frameworks(frameworks: Iterable[str]) -> list[str]:
    """The frameworks a run's peak is probed with: NumPy and PyTorch when importable (configure_threads has set
    their threads), TensorFlow only when the run uses it (its runtime and thread pools start on first use)."""
    used = set(frameworks)
    modules = {"numpy": "numpy", "torch": "torch", "tf": "tensorflow"}
    return [f for f in modules if (f != "tf" or f in used) and _importable(modules[f])]


def measure_peak(device: str, dtype: str, frameworks: Iterable[str], threads: int, n: int | None = None,
                 min_run_time: float = 1.0) -> dict[str, Any]:
    """The best square-GEMM throughput any installed framework reaches on this device and dtype, measured now.

    A peak is what the machine can do, and a shared machine's noise only ever slows a call down: each framework's
    figure is its **fastest** block (after a warm-up call, blocks until `min_run_time` and at least 3), not the
    median the rows report, so that no row's median beats it by luck. TensorFlow is probed both through
    `tf.function` (oneDNN on a CPU) and compiled by XLA (`tf.xla`), since either may run the model's matmuls.
    A framework whose warm-up call alone outlasts `min_run_time` (a GEMM in a dtype the CPU has no fast path for)
    is reported from that call.
    """
    n = n or gemm_size(device, dtype)
    best: dict[str, Any] = {"device": device, "dtype": dtype, "n": n, "gflops": None, "by": "", "all": {}}
    for framework in frameworks:
        try:
            variants = _gemm(framework, device, dtype, n)
        except (ImportError, _Skip):
            continue
        for label, fn in variants:
            gflops = 2 * n ** 3 / min(time_blocks(fn, min_run_time, device, framework)) / 1e9
            best["all"][label] = round(gflops, 2)
            if best["gflops"] is None or gflops > best["gflops"]:
                best["gflops"], best["by"] = gflops, label
    return best


class _Skip(Exception):
    pass


def _gemm(framework: str, device: str, dtype: str, n: int) -> list[tuple[str, Callable[[], Any]]]:
    """`[(label, fn)]`: the ways `framework` runs an n x n GEMM in `dtype` on `device`."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    if framework == "numpy":
        if device != "cpu" or dtype not in ("float32", "float64"):
            raise _Skip
        a, b = a.astype(dtype), b.astype(dtype)
        return [("numpy", lambda: a @ b)]
    if framework == "torch":
        import torch
        if device == "cuda" and not torch.cuda.is_available():
            raise _Skip
        ta = torch.tensor(a, dtype=getattr(torch, dtype), device=device)
        tb = torch.tensor(b, dtype=getattr(torch, dtype), device=device)
        return [("torch", lambda: ta @ tb)]
    if framework == "tf":
        from tf_impl.startup import tf
        tf_device = "/GPU:0" if device == "cuda" else "/CPU:0"
        if device == "cuda" and not tf.config.list_physical_devices("GPU"):
            raise _Skip
        with tf.device(tf_device):
            ta, tb = tf.cast(tf.constant(a), dtype), tf.cast(tf.constant(b), dtype)
        variants = []
        for label, jit in (("tf", False), ("tf.xla", True)):
            matmul = tf.function(tf.linalg.matmul, jit_compile=jit)
            matmul(ta, tb)  # trace (and compile) outside the clock
            variants.append((label, lambda matmul=matmul: matmul(ta, tb)))
        return variants
    raise _Skip


# --- memory -----------------------------------------------------------------------------------------------------------

class _RSSPeak:
    """Peak resident memory added during a call: reset the kernel's high-water mark (`/proc/self/clear_refs`),
    return freed heap pages to the OS first (`malloc_trim`), then read VmHWM - VmRSS. It sees every allocator in the
    process (NumPy, PyTorch's CPU allocator, TensorFlow/Eigen, oneDNN scratch), which tracemalloc does not; it cannot
    see memory an allocator reuses from its own cache, so it is a lower bound. Linux only."""

    method = "cpu: peak RSS growth (VmHWM reset)"

    def __init__(self):
        self._libc = None
        try:
            self._libc = ctypes.CDLL("libc.so.6")
        except OSError:
            pass

    @staticmethod
    def available() -> bool:
        return os.access("/proc/self/clear_refs", os.W_OK) and os.path.exists("/proc/self/status")

    @staticmethod
    def _status_kib(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise OSError(f"{key} not in /proc/self/status")

    def __enter__(self):
        gc.collect()
        if self._libc is not None:
            self._libc.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        self.start = self._status_kib("VmRSS")
        return self

    def __exit__(self, *exc):
        self.peak_mib = max(0, self._status_kib("VmHWM") - self.start) / 1024
        return False


class _TracemallocPeak:
    """Fallback where /proc is not writable: Python-level allocations only (NumPy reports to tracemalloc; PyTorch
    and TensorFlow do not, so their rows get no figure)."""

    method = "cpu: tracemalloc peak (NumPy only)"

    def __enter__(self):
        import tracemalloc
        tracemalloc.start()
        return self

    def __exit__(self, *exc):
        import tracemalloc
        self.peak_mib = tracemalloc.get_traced_memory()[1] / 2 ** 20
        tracemalloc.stop()
        return False


class _CudaPeak:
    """`torch.cuda.max_memory_allocated` (or TensorFlow's `get_memory_info` peak) above what was allocated before the
    call: the tensors the call itself creates, workspace included."""

    def __init__(self, framework: str):
        self.framework = framework
        self.method = ("cuda: torch.cuda.max_memory_allocated" if framework == "torch"
                       else "cuda: tf.config.experimental.get_memory_info peak")

    def __enter__(self):
        if self.framework == "torch":
            import torch
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            from tf_impl.startup import tf
            tf.config.experimental.reset_memory_stats("GPU:0")
            self.start = tf.config.experimental.get_memory_info("GPU:0")["current"]
        return self

    def __exit__(self, *exc):
        if self.framework == "torch":
            import torch
            torch.cuda.synchronize()
            self.peak_mib = (torch.cuda.max_memory_allocated() - self.start) / 2 ** 20
        else:
            from tf_impl.startup import tf
            tf.test.experimental.sync_devices()
            self.peak_mib = (tf.config.experimental.get_memory_info("GPU:0")["peak"] - self.start) / 2 ** 20
        return False


def memory_meter(device: str, framework: str):
    if device == "cuda":
        return _CudaPeak(framework)
    if _RSSPeak.available():
        return _RSSPeak()
    return _TracemallocPeak() if framework == "numpy" else None


# --- errors that become rows --------------------------------------------------------------------------------------

def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "ResourceExhaustedError"):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                               or "failed to allocate" in text)


def _available_ram() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _largest_intermediate(case: Case, framework: str) -> float:
    """Bytes of one materialised (B, H, Nq, Nk) score tensor in float64 (what the reference needs several of)."""
    return 8.0 * case.batch * case.heads * case.q_len * case.k_len


def _free_memory(framework: str | None = None) -> None:
    """Collect the last row's garbage, then freeze what survives (framework internals, caches): with TensorFlow
    loaded a full collection takes ~0.3 s, a collection over only the objects made since the last freeze ~nothing."""
    gc.collect()
    gc.freeze()
    if "torch" in sys.modules:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# --- the run ------------------------------------------------------------------------------------------------------

def _blank_row(impl, case: Case, status: str, note: str = "", device_names: dict | None = None) -> Row:
    return Row(impl=impl.name, framework=impl.framework, status=status, scope=case.scope, mode=case.mode,
               mask=case.mask, dtype=case.dtype, device=case.device,
               device_name=(device_names or {}).get(case.device, ""), batch=case.batch, heads=case.heads,
               q_len=case.q_len, k_len=case.k_len, head_dim=case.head_dim, shape=case.shape,
               gflop=case.flops / 1e9, note=note)


def run(plan: list[tuple[Case, list]], options: Options) -> Report:
    """Run every (case, implementations) pair of `plan`; returns the report with the header, peaks and rows."""
    from . import implementations as impls_mod

    started = time.perf_counter()
    progress = options.progress or (lambda msg: None)

    def say(message: str) -> None:
        progress(f"[{time.perf_counter() - started:6.1f}s] {message}")

    frameworks = {impl.framework for _, impls in plan for impl in impls}
    thread_info = configure_threads(options.threads, frameworks)
    devices = sorted({case.device for case, _ in plan})
    device_names = {d: device_name(d) for d in devices}
    tf32 = _disable_tf32(frameworks)

    peaks: dict[tuple[str, str], dict] = {}
    for device, dtype in sorted({(c.device, c.dtype) for c, impls in plan if impls}):
        say(f"peak: {dtype} GEMM on {device}")
        peaks[(device, dtype)] = measure_peak(device, dtype, peak_frameworks(frameworks), options.threads,
                                              options.peak_n, options.peak_time)

    rows: list[Row] = []
    try:
        _run_cases(plan, options, peaks, device_names, rows, say, impls_mod)
    finally:
        gc.unfreeze()  # _free_memory froze survivors to keep collections cheap; leave the process as it was
    _fill_speedups(rows)

    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "versions": versions(),
        "cpu": cpu_name(),
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
        "memory": {"cpu": (_RSSPeak.method if _RSSPeak.available() else _TracemallocPeak.method),
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


def _skip_reason(case: Case, options: Options, peaks: dict) -> str | None:
    """Why a case cannot run here (its inputs alone would not fit; three calls would surely exceed the row budget)."""
    nbytes, seconds = row_estimate(case, peaks.get((case.device, case.dtype), {}).get("gflops"))
    available = _available_ram()
    if available is not None and nbytes > 0.8 * available:
        return f"its inputs alone need ~{nbytes / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available"
    if seconds is not None and 3 * seconds > options.row_budget:
        return (f"one call needs >= {seconds:.3g} s even at the measured GEMM peak; the row budget is "
                f"{options.row_budget:g} s")
    return None


def _run_cases(plan, options, peaks, device_names, rows, say, impls_mod) -> None:
    for case, impls in plan:
        if not impls:
            continue
        reason = _skip_reason(case, options, peaks)
        if reason is not None:
            say(f"{case.shape} {case.scope} {case.mode} {case.mask} {case.dtype} {case.device}: {reason}")
            rows.extend(_blank_row(impl, case, "skipped", reason, device_names) for impl in impls)
            continue
        inputs = ref.make_inputs(case, options.seed)
        desired, err_scope, slicer = _reference(case, inputs, options, say)
        for row in _run_case(case, impls, inputs, desired, err_scope, slicer, options, device_names, impls_mod,
                             say):
            peak = peaks.get((case.device, case.dtype), {}).get("gflops")
            if row.gflops is not None and peak:
                row.peak_gflops, row.pct_peak = peak, 100 * row.gflops / peak
            rows.append(row)
        del inputs, desired
        _free_memory()


def _disable_tf32(frameworks) -> str:
    """TF32 off everywhere, so float32 rows are float32 (their error column would otherwise measure TF32)."""
    notes = []
    if "torch" in frameworks or _importable("torch"):
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        notes.append("torch: allow_tf32=False, matmul precision highest")
    if "tf" in frameworks and _importable("tensorflow"):
        from tf_impl.startup import tf
        tf.config.experimental.enable_tensor_float_32_execution(False)
        notes.append("tf: tensor_float_32_execution disabled")
    return "; ".join(notes) or "n/a"


def _reference(case: Case, inputs, options: Options, say):
    """The float64 answers, on a slice of the problem when the full one would be too big to check."""
    slicer = ref.Slicer.for_case(case, options.ref_limit)
    say(f"{case.shape} {case.scope} {case.mode} {case.mask} {case.dtype}: float64 reference ({slicer.describe()})")
    need = 4 * _largest_intermediate(case, "numpy") * slicer.fraction_of(case)
    available = _available_ram()
    if available is not None and need > 0.8 * available:
        return None, f"skipped: the float64 reference needs ~{need / 2**30:.1f} GiB", slicer
    try:
        return ref.reference(case, slicer.inputs(inputs)), slicer.describe(), slicer
    except MemoryError:
        _free_memory()
        return None, "skipped: the float64 reference ran out of memory", slicer


@dataclass
class _Live:
    """An implementation built and checked on the current problem, waiting for its timing rounds."""

    impl: Any
    runner: Any
    row: Row
    number: int  # calls per timed block
    budget: float  # seconds of timing
    rounds: int  # rounds it takes part in
    times: list = field(default_factory=list)  # seconds per call, one entry per block
    block_rounds: list = field(default_factory=list)  # the round each block of `times` ran in
    min_runs: int = 1  # calls it makes over its rounds, at least, however fast its blocks turn out to be

    def round_medians(self) -> list[float]:
        """Seconds per call, the median block of each round it ran (in round order)."""
        by_round: dict[int, list[float]] = {}
        for round_, block in zip(self.block_rounds, self.times):
            by_round.setdefault(round_, []).append(block)
        return [float(np.median(by_round[r])) for r in sorted(by_round)]


def _run_case(case, impls, inputs, desired, err_scope, slicer, options, device_names, impls_mod, say) -> list[Row]:
    """Every implementation on one problem: build, first call, warm-up (memory, error), then interleaved timing
    rounds, then the kernel names."""
    rows, live = [], []
    for impl in impls:
        say(f"{case.shape} {case.scope} {case.mode} {case.mask} {case.dtype} {case.device}: {impl.name}")
        row, item = _prepare(impl, case, inputs, desired, err_scope, slicer, options, device_names, impls_mod)
        rows.append(row)
        if item is not None:
            live.append(item)
    if live:
        say(f"{case.shape} {case.scope} {case.mode} {case.mask} {case.dtype} {case.device}: timing {len(live)} "
            f"implementations in {max(item.rounds for item in live)} interleaved rounds")
    # Rounds interleave the implementations of one framework (the comparisons that must hold: ours against the
    # built-ins); frameworks take turns, with a pause between them on the CPU, because idle worker threads spin for a
    # while after their last op (OpenBLAS for ~0.1 s) and would slow whichever framework runs next.
    groups: dict[str, list[_Live]] = {}
    for item in live:
        groups.setdefault(item.impl.framework, []).append(item)
    for group in groups.values():
        if case.device == "cpu":
            time.sleep(_SETTLE_S)
        _timing_rounds(group, case, options)
    for item in live:
        if item.runner is None:  # failed during timing: its row says why
            continue
        row = item.row
        try:
            timing = summarize(item.times, item.number)
            row.median_ms, row.iqr_ms, row.runs = 1e3 * timing.median, 1e3 * timing.iqr, timing.runs
            row.gflops = case.flops / timing.median / 1e9
            if options.profile_kernels and item.runner.kernel is not None:
                with item.runner.context():
                    row.kernel = item.runner.kernel()
            elif item.runner.kernel_name:
                row.kernel = item.runner.kernel_name
        except Exception as exc:  # noqa: BLE001
            if row.median_ms is None:
                _failed(row, exc)
            else:
                row.note = f"kernel name unavailable: {_first_line(exc)}"
    del live
    _free_memory()
    return rows


_SETTLE_S = 0.25  # seconds between frameworks' timing rounds


def round_orders(n: int) -> list[list[int]]:
    """Orders for timing n implementations round after round (a Williams design): across its rows every
    implementation runs in every position, and right after every other implementation, equally often (n rows for
    even n, each once; for odd n those rows and their mirror images, each twice). A round's cost that depends on its
    position (the first after the pause between frameworks) or on its predecessor (thread pools still spinning,
    caches filled by the previous implementation) thus falls on every implementation alike. A plain rotation
    balances positions only: b would always follow a."""
    first, low, high = [0], 1, n - 1
    while low <= high:
        first.append(low)
        low += 1
        if low <= high:
            first.append(high)
            high -= 1
    rows = [[(k + shift) % n for k in first] for shift in range(n)]
    return rows if n % 2 == 0 or n == 1 else rows + [row[::-1] for row in rows]


def _timing_rounds(group: list, case, options) -> None:
    """Every implementation of the group, `options.rounds` times, in the orders of `round_orders`."""
    orders = round_orders(len(group))
    for round_ in range(options.rounds):
        order = [group[k] for k in orders[round_ % len(orders)]]
        for item in [item for item in order if round_ < item.rounds and item.runner is not None]:
            try:
                with item.runner.context():
                    # the budget's share, and at least one block per round, and enough blocks for min_runs calls
                    # (the budget comes from one sizing call: slower calls later would otherwise mean fewer)
                    spent, share, blocks = 0.0, item.budget / item.rounds, 0
                    while spent < share or blocks < math.ceil(item.min_runs / (item.number * item.rounds)):
                        block = time_block(item.runner.fn, item.number, case.device, item.impl.framework)
                        item.times.append(block)
                        item.block_rounds.append(round_)
                        spent += block * item.number
                        blocks += 1
            except Exception as exc:  # noqa: BLE001 - out of memory, or a failure only repeated calls show
                _failed(item.row, exc)
                item.runner = None
                _free_memory()


def _prepare(impl, case, inputs, desired, err_scope, slicer, options, device_names, impls_mod):
    """Build `impl`, time its first call, measure memory and error on a warm-up call; (row, _Live or None)."""
    row = _blank_row(impl, case, "ok", device_names=device_names)
    row.threads = options.threads
    try:
        runner = impl.build(case, inputs)
    except impls_mod.NotInstalled as exc:
        row.status, row.note = "not installed", str(exc)
        return row, None
    except impls_mod.Unsupported as exc:
        row.status, row.note = "unsupported", str(exc)
        return row, None
    except Exception as exc:  # noqa: BLE001 - a broken implementation is a row, not a crashed run
        return _failed(row, exc), None
    try:
        with runner.context():
            row.first_call_ms = 1e3 * time_block(runner.fn, 1, case.device, impl.framework)
            out, per_call = metered_call(runner.fn, row, case.device, impl.framework)
            if desired is not None:
                actual = slicer.outputs(runner.to_numpy(out))
                row.max_abs_err, row.err_output = ref.max_abs_error(actual, desired)
                if row.max_abs_err != row.max_abs_err:
                    row.note = f"{row.err_output} has NaN or Inf"
            row.err_scope = err_scope
            del out
            per_call = sizing_call(runner.fn, per_call, options.max_time, case.device, impl.framework)
    except Exception as exc:  # noqa: BLE001
        _failed(row, exc)
        del runner
        _free_memory()
        return row, None
    number = block_size(per_call)
    budget = min(options.max_time, max(options.min_time, options.min_runs * per_call))
    return row, _Live(impl, runner, row, number, budget, rounds_that_fit(budget, per_call * number, options.rounds))


def _failed(row: Row, exc: BaseException) -> Row:
    if is_oom(exc):
        row.status, row.note = "oom", f"{type(exc).__name__}: {_first_line(exc)}"
    elif type(exc).__name__ == "Unsupported" or "No available kernel" in str(exc):
        row.status, row.note = "unsupported", _first_line(exc)
    else:
        row.status, row.note = "error", f"{type(exc).__name__}: {_first_line(exc)}"
    row.median_ms = row.iqr_ms = row.gflops = row.runs = None
    _free_memory()
    return row


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


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
    from .implementations import REGISTRY
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
