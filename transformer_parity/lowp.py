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

import contextlib
import os
from typing import Mapping

import numpy as np

import reference_numpy as rn
from reference_numpy.lowp import DTYPES, Precision

from . import faults
from .errors import UsageError
from .tolerances import LOWP_PAIR_RATIO_LIMIT, LOWP_RATIO_LIMIT, REDUCED_EPS

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
    from . import backends

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


# --- planted faults in reduced precision (the tests and benchmarks/verify_calibration.py --dtype) -------------------

def _decoder_only_weight_faults() -> dict[str, tuple]:
    """The weight faults re-aimed at a decoder-only model's layers: `name -> (apply, expected sublayer)`."""
    def swap(config, weights):
        w, b = dict(weights), "decoder.layers.0.self_attn"
        w[f"{b}.q.kernel"], w[f"{b}.k.kernel"] = weights[f"{b}.k.kernel"], weights[f"{b}.q.kernel"]
        return w

    def transpose(name):
        return lambda config, weights: {**weights, name: np.ascontiguousarray(weights[name].T)}

    def nudge(name, index):
        def apply(config, weights):
            value = np.array(weights[name], copy=True)
            value[index] += value.dtype.type(1e-3)
            return {**weights, name: value}
        return apply

    def copy(config, weights):
        return {**weights, **{"decoder.layers.1" + k[len("decoder.layers.0"):]: v for k, v in weights.items()
                              if k.startswith("decoder.layers.0.")}}

    return {"swapped-qk": (swap, "decoder.layers.0.self_attn"),
            "transposed-kernel": (transpose("decoder.layers.1.self_attn.v.kernel"), "decoder.layers.1.self_attn"),
            "transposed-out-kernel": (transpose("decoder.layers.1.self_attn.o.kernel"), "decoder.layers.1.self_attn"),
            "nudged-weight": (nudge("decoder.layers.1.self_attn.v.kernel", (3, 5)), "decoder.layers.1.self_attn"),
            "layer-copied": (copy, "decoder.layers.1.self_attn")}


def fault_cases(config, weights, backend: str):
    """Every planted fault (`faults`) that applies to `config`, re-aimed at a decoder-only model's layers where
    needed: `(name, the port's config, the port's weights, a context manager planting the code fault (a null one
    for the others), the sublayer verify should name first)`."""
    none = contextlib.nullcontext
    if config.is_decoder_only:
        first = "decoder.layers.0.self_attn" if config.norm_first else "decoder.layers.0.ffn"
        cases = [(name, config, apply(config, weights), none(), expected)
                 for name, (apply, expected) in _decoder_only_weight_faults().items()]
        cases.append(("eps-1e-3", config.replace(layer_norm_eps=1e-3), weights, none(), first))
        cases += [(name, config, weights, plant(backend, config), first)
                  for name, (plant, _) in faults.CODE_FAULTS.items() if "sinusoid" not in name]
        return cases
    cases = []
    for name in faults.WEIGHT_FAULTS:
        bad, expected = faults.apply_weight_fault(name, config, weights)
        cases.append((name, config, bad, none(), expected))
    for name in faults.CONFIG_FAULTS:
        wrong, expected = faults.config_fault(name, config)
        cases.append((name, wrong, weights, none(), expected))
    cases += [(name, config, weights, plant(backend, config), expected_of(config))
              for name, (plant, expected_of) in faults.CODE_FAULTS.items()]
    return cases
