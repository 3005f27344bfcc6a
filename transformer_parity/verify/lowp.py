"""`verify --dtype bfloat16|float16 [--autocast]`: running the ports in reduced precision and the floor they are
judged by (docs/verify.md, "Reduced precision").

- **bfloat16 / float16**: the PyTorch model cast with `.to(dtype)`, the Keras model under that dtype policy (weights
  and compute in that dtype; both frameworks compute LayerNorm statistics in float32 and round its output).
- **--autocast**: PyTorch's float32 model under `torch.autocast("cpu", dtype)` (matmuls and attention in `dtype`,
  LayerNorm, residual stream and embeddings in float32), Keras under the `mixed_<dtype>` policy (float32 variables,
  every layer computing in `dtype`).

The floor of a sublayer is the reduced-precision NumPy reference's error against the float64 judge
(`reference_numpy.lowp.Precision`: storage rounding at the op boundaries of torch's CPU kernels), or one rounding of
that dtype at the output's largest magnitude, whichever is larger; the limit is `RATIO_LIMIT` below.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

import reference_numpy as rn
from reference_numpy.lowp import DTYPES, Precision

from transformer_parity.errors import UsageError
from transformer_parity.tolerances import LOWP_PAIR_RATIO_LIMIT, LOWP_RATIO_LIMIT, REDUCED_EPS

EPS = REDUCED_EPS  # one rounding of the storage dtype
RATIO_LIMIT = LOWP_RATIO_LIMIT  # K for reduced precision: calibrated, see `tolerances`
PAIR_RATIO_LIMIT = LOWP_PAIR_RATIO_LIMIT


# Planted faults smaller than the rounding of the dtype, measured invisible (error / floor ~1 where they start; the
# calibration table in docs/verify.md): the weights comparison of two checkpoints is what catches them there.
UNSEEN = {
    "bfloat16": {
        "eps-1e-3": "LayerNorm eps 1e-3 for 1e-5 moves normalized values by ~5e-4 relative (unit variance), a "
                    "quarter of bfloat16's half-ulp 2**-9",
        "eps-1e-3-in-code": "the same change, planted in the port's code",
        "nudged-weight": "+1e-3 on a weight of magnitude 0.1-0.3 is one or two bfloat16 ulps of that weight "
                         "(2**-11..2**-10), far below the rounding of every output computed from it",
        "nudged-attention-weight": "the same, on a cross-attention output kernel",
    },
    "float16": {
        "eps-1e-3": "invisible on the 32-wide models (~1 floor); 12-14 floors on the 128-wide one",
        "eps-1e-3-in-code": "the same change, planted in the port's code",
        "nudged-weight": "+1e-3 on one weight of a 32x32 kernel moves each output it feeds by less than the "
                         "float16 rounding of that output: ~1 floor",
        "nudged-attention-weight": "the same, on a cross-attention output kernel",
    },
}


def is_reduced(dtype: str) -> bool:
    return dtype in DTYPES


def check(dtype: str, autocast: bool) -> None:
    if autocast and not is_reduced(dtype):
        raise UsageError(f"--autocast needs --dtype bfloat16 or float16, received --dtype {dtype}")


def label(dtype: str, autocast: bool) -> str:
    """How the report names the precision: `bfloat16`, `bfloat16 autocast`."""
    return f"{dtype} autocast" if autocast else dtype


def reference(config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], dtype: str, autocast: bool
              ) -> rn.Transformer:
    """The NumPy reference rounding as a `dtype` model (or an autocast one) does: the floor run."""
    return rn.Transformer(config, weights, np.float32, precision=Precision(dtype, autocast))


def trace(backend: str, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], dtype: str, autocast: bool,
          src: np.ndarray, tgt: np.ndarray | None, src_type_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every sublayer output of `backend` run in reduced precision, as float32 NumPy arrays (values of `dtype`
    where the framework returns that dtype, float32 where autocast leaves float32)."""
    from transformer_parity import backends

    if backend == "numpy":
        return reference(config, weights, dtype, autocast).trace(src, tgt, src_type_ids=src_type_ids)
    runner = backends.get(backend)
    if runner.name == "torch":
        import contextlib

        import torch

        model = runner.build(config, weights, "float32" if autocast else dtype)
        cast = torch.autocast("cpu", dtype=getattr(torch, dtype)) if autocast else contextlib.nullcontext()
        with cast:
            return runner.trace_model(model, src, tgt, src_type_ids)
    model = runner.build(config, weights, f"mixed_{dtype}" if autocast else dtype)  # a Keras dtype policy
    return {k: v.astype(np.float32) for k, v in runner.trace_model(model, src, tgt, src_type_ids).items()}
