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

import os
from typing import Mapping

import numpy as np

import reference_numpy as rn
from reference_numpy.lowp import DTYPES, Precision

from .errors import UsageError

# One rounding of the storage dtype: 8 and 11 significant bits.
EPS = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}

# K for reduced precision, from benchmarks/verify_calibration.py --dtype (results in benchmarks/results/verify-lowp/,
# table in docs/verify.md): correct ports reach 4.3 floors (Keras bfloat16: its Dense rounds the matmul and the
# bias add separately, its explicit attention rounds scores, scaled scores and softmax, its written-out GELU rounds
# five times, and Python constants such as sqrt(d_model) are rounded to bfloat16; the reference rounds where
# torch's fused CPU kernels do); every detectable planted fault is above 15. K = 8 leaves a factor of ~2 on both
# sides. Two backends compared with each other get 2K.
RATIO_LIMIT = 8.0
PAIR_RATIO_LIMIT = 2 * RATIO_LIMIT


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
    if backend == "numpy":
        return reference(config, weights, dtype, autocast).trace(src, tgt, src_type_ids=src_type_ids)
    if backend == "torch":
        import contextlib

        import torch
        import torch_impl

        model_dtype = torch.float32 if autocast else getattr(torch, dtype)
        model = torch_impl.Transformer.from_reference(config, weights, dtype=model_dtype)
        cast = torch.autocast("cpu", dtype=getattr(torch, dtype)) if autocast else contextlib.nullcontext()
        with torch.no_grad(), cast:
            return {k: v.float().numpy() for k, v in model.trace(src, tgt, src_type_ids=src_type_ids).items()}
    if backend == "keras":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tf_impl

        policy = f"mixed_{dtype}" if autocast else dtype
        model = tf_impl.Transformer.from_reference(config, weights, dtype=policy)
        return {k: np.asarray(v).astype(np.float32)
                for k, v in model.trace(src, tgt, src_type_ids=src_type_ids).items()}
    raise UsageError(f"unknown backend {backend!r}; choose one of numpy, torch, keras")
