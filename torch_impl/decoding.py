"""`next_logits` steppers for `reference_numpy.generate`: incremental (key/value cache) or full recomputation.

Encoder-decoder models take the source ids; a decoder-only model takes none (its prompt goes to `generate`).
Decoder inputs always count as real tokens (all-True target mask), so a start token equal to `pad_id` (Marian's)
is attended to like any other.
"""

from __future__ import annotations

import numpy as np
import torch

from reference_numpy.decoding import NextLogits

from .model import Transformer, _host, padding_mask


def _encode(model: Transformer, src_ids, src_mask):
    """`(memory, src_mask, device)`; `(None, None, device)` for a decoder-only model, which must get no source."""
    device = next(model.parameters()).device
    if model.config.is_decoder_only:
        if src_ids is not None or src_mask is not None:
            raise ValueError("a decoder-only model has no source: pass the prompt to generate(), received src_ids")
        return None, None, device
    src_ids = torch.as_tensor(np.asarray(src_ids), device=device)
    src_mask = (padding_mask(src_ids, model.config.pad_id) if src_mask is None
                else torch.as_tensor(src_mask, device=device))
    with torch.no_grad():
        memory = model.encode(src_ids, src_mask)
    return memory, src_mask, device


def cached_stepper(model: Transformer, src_ids=None, src_mask=None) -> NextLogits:
    """Encode once; each call feeds only the positions not yet in the key/value cache (the prompt, then one per
    decoding step)."""
    model.eval()
    memory, src_mask, device = _encode(model, src_ids, src_mask)
    cache = model.new_cache()

    def next_logits(ids: np.ndarray) -> np.ndarray:
        new = np.asarray(ids)[:, cache.length:]  # (B, T_new)
        if new.shape[1] == 0:
            raise ValueError(f"next_logits needs ids longer than the {cache.length} position(s) already cached")
        new = torch.as_tensor(new, device=device)
        with torch.no_grad():
            logits = model.decode(new, memory, src_mask, tgt_mask=torch.ones_like(new, dtype=torch.bool),
                                  cache=cache, last_only=True)
        return _host(logits[:, -1])

    return next_logits


def recompute_stepper(model: Transformer, src_ids=None, src_mask=None) -> NextLogits:
    """Encode once; each call runs the decoder over the whole prefix again (the no-cache baseline)."""
    model.eval()
    memory, src_mask, device = _encode(model, src_ids, src_mask)

    def next_logits(ids: np.ndarray) -> np.ndarray:
        ids = torch.as_tensor(np.asarray(ids), device=device)
        with torch.no_grad():
            logits = model.decode(ids, memory, src_mask, tgt_mask=torch.ones_like(ids, dtype=torch.bool),
                                  last_only=True)
        return _host(logits[:, -1])

    return next_logits
