"""The clock of both benchmarks: calls timed in blocks of >= 1 ms with the device synchronised around each block,
summarised by the median and inter-quartile range over blocks, and how many blocks and rounds a row's budget holds."""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


# --- timed blocks -----------------------------------------------------------------------------------------------------
# The equivalent of torch.utils.benchmark's blocked_autorange, interleaved: every implementation of a problem is timed
# in blocks of calls (each block at least 1 ms, so the clock and the CUDA synchronisation cost < 0.1%), a share of
# its budget per round, round after round, so that a noisy neighbour slows all of them alike (harness.timing_rounds).
# Threads are set for every framework once, by machine.configure_threads (torch.utils.benchmark.Timer would otherwise
# run torch on one thread).

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
        sync(device, framework)
        start = time.perf_counter()
        for _ in range(number):
            fn()
        sync(device, framework)
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


def sizing_call(fn: Callable[[], Any], metered: float, limit: float, device: str = "cpu", framework: str = "torch"
                ) -> float:
    """Seconds per call to size a row's blocks and rounds by. The memory-metered warm-up call follows a heap trim
    and pays the page faults of refilling the heap (base-256 and gpt2-256 training steps: up to 1.24x the plain call
    after it), so a call that fits within `limit` (the row's longest timing) is followed by one plain call, and that
    call sizes the row."""
    return time_block(fn, 1, device, framework) if metered <= limit else metered


def sync(device: str, framework: str) -> None:
    if device != "cuda":
        return
    if framework == "torch":
        import torch
        torch.cuda.synchronize()
    elif framework == "tf":
        from tf_impl.startup import tf
        tf.test.experimental.sync_devices()
