"""The machine a benchmark runs on: its CPU and devices, library versions, every framework's thread count, TF32 off,
the measured GEMM peak, and memory (the meters that measure one call's peak, what is available, freeing it between
rows)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import platform
import sys
import time
from typing import Any, Callable, Iterable

import numpy as np

from . import timing


# --- the machine ------------------------------------------------------------------------------------------------------

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


def disable_tf32(frameworks) -> str:
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
            gflops = 2 * n ** 3 / min(timing.time_blocks(fn, min_run_time, device, framework)) / 1e9
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

class RSSPeak:
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


class TracemallocPeak:
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


class CudaPeak:
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
        return CudaPeak(framework)
    if RSSPeak.available():
        return RSSPeak()
    return TracemallocPeak() if framework == "numpy" else None


def metered_call(fn: Callable[[], Any], row, device: str = "cpu", framework: str = "torch") -> tuple[Any, float]:
    """One call of `fn` under the memory meter: (its output, seconds). The peak lands on `row` (`peak_mem_mib`,
    `mem_method`). The clock starts inside the meter, because entering it collects garbage and trims the heap
    (0.1-0.5 s with several models loaded), which had made a 75 ms call look several times longer."""
    meter = memory_meter(device, framework)
    timing.sync(device, framework)
    with meter if meter is not None else contextlib.nullcontext():
        start = time.perf_counter()
        out = fn()
        timing.sync(device, framework)
        seconds = time.perf_counter() - start
    if meter is not None:
        row.peak_mem_mib, row.mem_method = meter.peak_mib, meter.method
    return out, seconds


def available_ram() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_memory(framework: str | None = None) -> None:
    """Collect the last row's garbage, then freeze what survives (framework internals, caches): with TensorFlow
    loaded a full collection takes ~0.3 s, a collection over only the objects made since the last freeze ~nothing."""
    gc.collect()
    gc.freeze()
    if "torch" in sys.modules:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
