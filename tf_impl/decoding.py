"""`next_logits` steppers for `reference_numpy.generate`: incremental (key/value cache) or full recomputation."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from reference_numpy.decoding import NextLogits

from .model import Transformer


def _encode(model: Transformer, src_ids, src_mask):
    src_ids = tf.constant(np.asarray(src_ids))
    src_mask = tf.not_equal(src_ids, tf.constant(model.config.pad_id, src_ids.dtype)) if src_mask is None \
        else tf.constant(np.asarray(src_mask))
    return model.encode(src_ids, src_mask), src_mask


def cached_stepper(model: Transformer, src_ids, src_mask=None) -> NextLogits:
    """Encode once; each call feeds only the positions not yet in the key/value cache (one per decoding step)."""
    memory, src_mask = _encode(model, src_ids, src_mask)
    cache = model.new_cache()

    def next_logits(ids: np.ndarray) -> np.ndarray:
        new = np.asarray(ids)[:, cache.length:]  # (B, T_new)
        if new.shape[1] == 0:
            raise ValueError(f"next_logits needs ids longer than the {cache.length} position(s) already cached")
        logits = model.decode(new, memory, src_mask, tgt_mask=np.ones(new.shape, dtype=bool), cache=cache)
        return np.asarray(logits[:, -1])

    return next_logits


def recompute_stepper(model: Transformer, src_ids, src_mask=None) -> NextLogits:
    """Encode once; each call runs the decoder over the whole prefix again (the no-cache baseline)."""
    memory, src_mask = _encode(model, src_ids, src_mask)

    def next_logits(ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        logits = model.decode(ids, memory, src_mask, tgt_mask=np.ones(ids.shape, dtype=bool))
        return np.asarray(logits[:, -1])

    return next_logits
