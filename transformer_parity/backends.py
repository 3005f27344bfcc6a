"""The backends: one registry of what can run canonical weights, chosen by name.

`numpy` (the reference), `torch` (torch_impl) and `keras` (tf_impl; `tf` and `tensorflow` are accepted as aliases
everywhere a backend is named). Each one builds its model from canonical weights in a dtype, runs it and traces every
sublayer, returning NumPy arrays under the canonical names, so that verify, lowp, generate, plot and the benchmarks
never build a framework model their own way. A framework is imported only when its backend is used.

    >>> backend = get("tf")                      # the Keras backend
    >>> outputs = backend.trace(config, weights, "float32", src_ids, tgt_ids)
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any, Mapping

import numpy as np

import reference_numpy as rn

from .errors import UsageError

NAMES = ("numpy", "torch", "keras")
ALIASES = {"tf": "keras", "tensorflow": "keras", "pytorch": "torch", "reference": "numpy"}
PACKAGES = {"numpy": ("numpy",), "torch": ("torch",), "keras": ("keras", "tensorflow")}


def canonical_name(name: str) -> str:
    """`tf` -> `keras`; an unknown name is a `UsageError` naming the choices."""
    resolved = ALIASES.get(str(name).lower(), str(name).lower())
    if resolved not in NAMES:
        raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)} (tf = keras)")
    return resolved


def installed(name: str) -> bool:
    """Whether the backend's packages are installed (found without importing them)."""
    return all(find_spec(package) is not None for package in PACKAGES[canonical_name(name)])


def available() -> list[str]:
    """The installed framework backends (numpy, always present, is not listed)."""
    return [name for name in NAMES[1:] if installed(name)]


@dataclass(frozen=True)
class Backend:
    """One backend: `build` a model from canonical weights, `trace` every sublayer of it as NumPy arrays."""

    name: str

    def build(self, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], dtype: Any = "float32"):
        """The backend's model on these weights. `dtype`: a NumPy dtype name (float32, float64, bfloat16, float16),
        or for Keras a dtype policy (`mixed_bfloat16`)."""
        if self.name == "numpy":
            return rn.Transformer(config, weights, np.dtype(dtype))
        if self.name == "torch":
            import torch

            import torch_impl

            return torch_impl.Transformer.from_reference(config, weights, dtype=getattr(torch, str(dtype)))
        import tf_impl

        return tf_impl.Transformer.from_reference(config, weights, dtype=dtype)

    def trace(self, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], dtype: Any,
              src: np.ndarray, tgt: np.ndarray | None = None, src_type_ids: np.ndarray | None = None,
              attention_weights: bool = False) -> dict[str, np.ndarray]:
        """Every sublayer output on these inputs, under canonical names, as NumPy arrays."""
        return self.trace_model(self.build(config, weights, dtype), src, tgt, src_type_ids, attention_weights)

    def trace_model(self, model, src: np.ndarray, tgt: np.ndarray | None = None,
                    src_type_ids: np.ndarray | None = None, attention_weights: bool = False
                    ) -> dict[str, np.ndarray]:
        """`trace` of a model this backend built (to run it under a context such as torch.autocast)."""
        kwargs = {"src_type_ids": src_type_ids, "attention_weights": attention_weights}
        if self.name == "numpy":
            return model.trace(src, tgt, **kwargs)
        if self.name == "torch":
            import torch

            with torch.no_grad():
                return {k: v.float().numpy() if v.dtype in (torch.bfloat16, torch.float16) else v.numpy()
                        for k, v in model.trace(src, tgt, **kwargs).items()}
        return {k: np.asarray(v) for k, v in model.trace(src, tgt, **kwargs).items()}

    def run_block(self, config: rn.TransformerConfig, block, weights: Mapping[str, np.ndarray], dtype: str,
                  state: dict) -> dict[str, np.ndarray]:
        """One block of the model (`reference_numpy.blocks`) built from its canonical weights and run on `state`
        (float32 or float64), for a layer-streamed verify: what it records, as NumPy arrays."""
        if self.name == "numpy":
            from reference_numpy import blocks
        elif self.name == "torch":
            from torch_impl import blocks
        else:
            from tf_impl import blocks
        return blocks.run_block(config, block, weights, dtype, state)


def get(name: str) -> Backend:
    """The backend called `name` (`tf` is `keras`)."""
    return Backend(canonical_name(name))
