"""The one tolerance table. Every comparison is `assert_allclose(actual, desired=float64 NumPy, rtol=0, atol=...)`.

float64 -> 1e-10 max abs. float64 rounding (eps 2.2e-16) accumulated over the base model's 12 layers, d_ff-long
    dot products and O(10) activations stays near 1e-13 (measured: about 1e-14 on the base preset); 1e-10 keeps a
    1000x margin yet fails at once if any op silently runs in float32 (errors of 1e-7 and up).
float32 -> 5e-5 max abs. float32 eps is 1.19e-7; the NumPy float32 vs float64 "rounding floor" on the base preset
    (batch 2, lengths 37/29) is about 3e-6 over all sublayers, and torch/TF GEMMs sum in other orders, so the twins
    land at the same few-1e-6 level. 5e-5 is ~15x that floor, while every real porting bug we plant (LayerNorm eps
    1e-3 vs 1e-5, a swapped or transposed kernel, a wrong mask) moves outputs by 1e-3 or more.
"""

ATOL = {"float32": 5e-5, "float64": 1e-10}


def atol(dtype) -> float:
    """Max absolute error allowed for a computation in `dtype` (numpy, torch or tf dtype, or its name)."""
    name = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
    if name not in ATOL:
        raise KeyError(f"no tolerance for dtype {dtype!r}")
    return ATOL[name]


def property_atol(dtype, floor: float) -> float:
    """Tolerance for randomly drawn configs and inputs (the hypothesis tests).

    The fixed ATOL above assumes a well-conditioned model. Random configs reach ill-conditioned corners the fixed
    number cannot cover: e.g. d_model=2, where LayerNorm of two nearly equal features cancels most digits, and NumPy's
    own float32 run is already 4.4e-5 from float64 (hypothesis found it). There the rule is the one `verify` uses,
    derived from the measured float32 rounding floor of the same sublayer on the same inputs: at most
    `RATIO_LIMIT` (10) floors, calibrated in benchmarks/verify_calibration.py. Never below ATOL.
    """
    from transformer_parity.verify import RATIO_LIMIT

    return max(atol(dtype), RATIO_LIMIT * floor)
