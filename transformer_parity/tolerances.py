"""Every tolerance of the project in one place: `verify`'s rule (the measured floor and K) and the tests' checks
both read them from here.

**The floor rule** (docs/verify.md, "Outputs: judge, floor, K"). The judge is the float64 NumPy reference. The floor
of an output is how far the same NumPy reference drifts from the judge when it computes in float32 on the same
weights and inputs, `max(max|f32 - f64|, eps32 * max|f64|)`; the second term (one float32 rounding at the output's
largest magnitude) keeps an output that float32 happens to compute exactly (an embedding lookup) from a zero floor.
A port computing in float64 is held to that floor times eps64 / eps32 = 2**-29. A port passes an output when
`max|port - judge| <= K * floor`; two ports compared with each other get 2K (each may sit K floors away, on
opposite sides).

**K** (`RATIO_LIMIT`) comes from measurement, `python benchmarks/verify_calibration.py --seeds 10 --fault-seeds 3`:
correct ports stay below 3.5 floors over hundreds of seeds, configs and shapes in float32 and float64, while the
weakest planted porting fault sits at 67 floors: K = 10 leaves a margin of about 3 on the correct side and 6 on the
faulty one. Reduced precision (bfloat16, float16; `lowp`) has its own K, `LOWP_RATIO_LIMIT`, from the same program
with `--dtype bfloat16|float16`. `parity_tests/test_tolerances.py` pins both to their documented values and to the
recorded calibration.

**The fixed table** (`ATOL`) is for the few comparisons that have no float32 run of the same computation to
measure a floor on (a training step, a decoding loop, an attention kernel on its own): float64 1e-10, and float32
5e-5, which is K = 10 times the base model's measured worst float32 floor (2.5e-6 over all its sublayers, batch 2,
lengths 37/29, docs/contract.md) rounded up. Model outputs are judged by the floor rule instead (`floor_atol`).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)
REDUCED_EPS = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}  # one rounding: 8 and 11 significant bits

RATIO_LIMIT = 10.0  # K, float32 and float64 (calibrated: see the module docstring)
PAIR_RATIO_LIMIT = 2 * RATIO_LIMIT

# K for reduced precision, from `python benchmarks/verify_calibration.py --dtype bfloat16|float16 --seeds 8
# --fault-seeds 2` (benchmarks/results/verify-lowp/, table in docs/verify.md). Correct ports reach 3.9 floors in
# bfloat16 (Keras; torch 1.6) and 2.6 in float16. Keras sits higher because the reference rounds where torch's
# fused CPU kernels do, while TensorFlow's bfloat16 CPU kernels round more often (the matmul, the bias add, the
# softmax, each op of the written-out GELU, and Python constants such as sqrt(d_k)). The weakest planted fault that
# bfloat16 can see at all, query and key kernels of the cross-attention swapped on the 128-wide model, sits at 7.8
# floors (nearly uniform attention at initialization hides it); every other one at 26 or more (float16: 61). K = 5.5
# is the geometric middle of 3.9 and 7.8: a factor of 1.4 on either side, narrower than float32's 3, because 8 bits
# of mantissa leave less room. The faults bfloat16 cannot see at all are listed in `lowp.UNSEEN`.
LOWP_RATIO_LIMIT = 5.5
LOWP_PAIR_RATIO_LIMIT = 2 * LOWP_RATIO_LIMIT

ATOL = {"float32": 5e-5, "float64": 1e-10}  # the fixed table (module docstring): only where no floor can be measured


def max_abs(x: np.ndarray) -> float:
    return float(np.max(np.abs(x))) if x.size else 0.0


def compare(actual, desired) -> tuple[float, float]:
    """`(max abs error, max abs error / max|desired|)`, computed in float64; inf if shapes differ or `actual` has
    a NaN or inf."""
    actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    if actual.shape != desired.shape or not np.all(np.isfinite(actual)):
        return math.inf, math.inf
    err = max_abs(actual - desired)
    scale = max_abs(desired)
    return err, (err / scale if scale > 0 else (0.0 if err == 0 else math.inf))


def floor(floor_run, judge, dtype: str = "float32") -> float:
    """The rounding floor of one output: `floor_run` is the NumPy reference computing in float32 (in `dtype` where
    that is bfloat16 or float16), `judge` the same in float64; `dtype` is the precision of the port being judged."""
    judge = np.asarray(judge, np.float64)
    measured, _ = compare(floor_run, judge)
    value = max(measured, REDUCED_EPS.get(dtype, EPS32) * max_abs(judge))
    if value == 0:  # an all-zero output computed exactly: any error at all is a divergence
        value = float(np.finfo(np.float32).tiny)
    return value * (EPS64 / EPS32 if dtype == "float64" else 1.0)


def floors(judge: Mapping[str, np.ndarray], floor_run: Mapping[str, np.ndarray], dtype: str) -> dict[str, float]:
    """`floor` of every output the judge has, by name."""
    return {name: floor(floor_run[name], desired, dtype) for name, desired in judge.items()}


def floor_atol(floor_value: float, pair: bool = False) -> float:
    """The largest max-abs error the floor rule lets through: K floors (2K between two ports)."""
    return (PAIR_RATIO_LIMIT if pair else RATIO_LIMIT) * floor_value


def atol(dtype) -> float:
    """The fixed table's max absolute error for a computation in `dtype` (numpy, torch or tf dtype, or its name)."""
    name = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
    if name not in ATOL:
        raise KeyError(f"no tolerance for dtype {dtype!r}")
    return ATOL[name]


def property_atol(dtype, floor_value: float) -> float:
    """Randomly drawn configs and inputs, and third-party models (the hypothesis tests, transformers, KerasHub): the
    floor rule, never below the fixed table. Random configs reach ill-conditioned corners (d_model=2, where LayerNorm
    of two nearly equal features cancels most digits and NumPy's own float32 run is already 4.4e-5 from float64) where
    the floor, not the table, says what float32 can do."""
    return max(atol(dtype), floor_atol(floor_value))
