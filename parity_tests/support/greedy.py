"""Our twins' next-token steppers for the family tests' greedy generation against transformers' `generate`.

Three per model: PyTorch with its key/value cache and without it (the whole prefix each step), Keras with its cache.
Keras without a cache is its plain forward over the prefix, which each family's float32 test already holds to the
reference on that family's model (`test_float32_outputs_match_the_reference[...-tf_impl]`), and which the variant
tests decode step by step (`test_decoding.py`); it was 40% of these tests' time and is not repeated here."""

from __future__ import annotations

from typing import Callable

import numpy as np


def steppers(config, weights, src: np.ndarray | None = None, mask: np.ndarray | None = None
             ) -> dict[str, Callable]:
    """`{label: next_logits(ids)}`; an encoder-decoder's source `src` (with its `mask`) is encoded once."""
    import tf_impl
    import torch_impl
    from tf_impl import decoding as tf_decoding
    from torch_impl import decoding as torch_decoding

    tm = torch_impl.Transformer.from_reference(config, weights)
    km = tf_impl.Transformer.from_reference(config, weights, dtype="float32")
    args = () if src is None else (src, mask)
    return {"torch cached": torch_decoding.cached_stepper(tm, *args),
            "torch recompute": torch_decoding.recompute_stepper(tm, *args),
            "tf cached": tf_decoding.cached_stepper(km, *args, compiled=False)}
