"""Autoregressive decoding shared by all three backends: greedy and seeded sampling (temperature, top-k).

A backend supplies only `next_logits(ids) -> logits`: the target ids produced so far `(B, t)` in, the scores of
position `t` `(B, V)` out (by full recomputation or from a key/value cache; `generate` does not care). Every choice
is made here, in float64, and every random draw comes from the one `np.random.Generator` passed in, so NumPy,
torch and Keras make the same choices from the same seed unless their logits differ across a decision boundary.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import ops
from .model import Transformer

NextLogits = Callable[[np.ndarray], np.ndarray]


def choose_next(logits: np.ndarray, *, greedy: bool = True, temperature: float = 1.0, top_k: int | None = None,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """Pick one token per row of `(B, V)` logits: the argmax (first on ties), or a draw from
    softmax(logits / temperature) restricted to the `top_k` highest scores, by inverse CDF of one uniform per row.

    Sampling always draws exactly `B` uniforms per call, so the generator advances identically in every backend.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (batch, vocab), received {logits.shape}")
    if greedy:
        return logits.argmax(axis=-1).astype(np.int64)
    check_sampling(temperature, top_k, logits.shape[-1])
    if rng is None:
        raise ValueError("sampling needs a numpy Generator (rng=np.random.default_rng(seed)), received None")
    scores = logits / temperature
    if top_k is not None:
        kth = np.sort(scores, axis=-1)[:, -top_k][:, None]  # (B, 1): ties at the k-th score are all kept
        scores = np.where(scores >= kth, scores, -np.inf)
    probs = ops.softmax(scores)  # (B, V)
    cdf = np.cumsum(probs, axis=-1)  # (B, V)
    u = rng.random(logits.shape[0]) * cdf[:, -1]  # (B,)
    chosen = (cdf <= u[:, None]).sum(axis=-1)
    return np.minimum(chosen, logits.shape[-1] - 1).astype(np.int64)


def check_sampling(temperature: float, top_k: int | None, vocab_size: int | None = None) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0 \
            or not np.isfinite(temperature):
        raise ValueError(f"temperature must be a positive number, received {temperature!r}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer or None, received {top_k!r}")
        if vocab_size is not None and top_k > vocab_size:
            raise ValueError(f"top_k={top_k} is larger than the vocabulary ({vocab_size})")


def generate(next_logits: NextLogits, batch_size: int, *, bos_id: int, eos_id: int, pad_id: int,
             max_new_tokens: int, greedy: bool = True, temperature: float = 1.0, top_k: int | None = None,
             rng: np.random.Generator | None = None) -> np.ndarray:
    """Decode `batch_size` sequences from `BOS`.

    Returns `(B, 1 + max_new_tokens)` int64 ids: `BOS`, the chosen tokens, `EOS`, then `pad_id` after it. Stops
    early (and pads) once every row has produced `EOS`. `next_logits` is called with all ids so far, finished rows
    included (they are fed `pad_id`), so a cached stepper sees one new column per call.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, received {max_new_tokens!r}")
    if not greedy:
        check_sampling(temperature, top_k)
    ids = np.full((batch_size, 1 + max_new_tokens), pad_id, dtype=np.int64)
    ids[:, 0] = bos_id
    finished = np.zeros(batch_size, dtype=bool)
    for t in range(1, 1 + max_new_tokens):
        logits = np.asarray(next_logits(ids[:, :t]))
        if logits.shape[0] != batch_size or logits.ndim != 2:
            raise ValueError(f"next_logits must return (batch={batch_size}, vocab) scores, received {logits.shape}")
        chosen = choose_next(logits, greedy=greedy, temperature=temperature, top_k=top_k, rng=rng)
        ids[:, t] = np.where(finished, pad_id, chosen)
        finished |= chosen == eos_id
        if finished.all():
            break
    return ids


def reference_stepper(model: Transformer, src_ids: np.ndarray, src_mask: np.ndarray | None = None) -> NextLogits:
    """`next_logits` for the NumPy reference: encode once, then recompute the decoder over the whole prefix.

    Decoder inputs count as real tokens everywhere (finished rows are fed padding whose logits nobody reads); the
    cached steppers of the other backends use the same all-True target mask.
    """
    src_ids = np.asarray(src_ids)
    if src_mask is None:
        src_mask = ops.padding_mask(src_ids, model.config.pad_id)
    memory = model.encode(src_ids, src_mask)

    def next_logits(ids: np.ndarray) -> np.ndarray:
        return model.decode(ids, memory, src_mask, tgt_mask=np.ones(ids.shape, dtype=bool))[:, -1]

    return next_logits
