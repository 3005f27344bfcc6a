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


def generate(next_logits: NextLogits, batch_size: int, *, bos_id: int | None = None, eos_id: int, pad_id: int | None,
             max_new_tokens: int, greedy: bool = True, temperature: float = 1.0, top_k: int | None = None,
             rng: np.random.Generator | None = None, prompt: np.ndarray | None = None) -> np.ndarray:
    """Decode `batch_size` sequences from `BOS` (an encoder-decoder's start token) or from `prompt`.

    `prompt` (`(B, P)` ids, a decoder-only model's usual start) replaces the single `BOS` column; every prompt
    token counts as real (no padding inside a prompt). Returns `(B, P + max_new_tokens)` int64 ids (`P = 1` with
    `bos_id`): the start, the chosen tokens, `EOS`, then `pad_id` after it (`eos_id` again for a model with no pad
    token, `pad_id=None`). Stops early (and pads) once every row has produced `EOS`. `next_logits` is called with
    all ids so far, finished rows included (they are fed that filler), so a cached stepper sees the prompt first
    and then one new column per call. The start token may equal `pad_id` (Marian starts decoding from its pad
    token): steppers treat every decoder input as real.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, received {max_new_tokens!r}")
    if not greedy:
        check_sampling(temperature, top_k)
    if (prompt is None) == (bos_id is None):
        raise ValueError("generate needs exactly one of bos_id and prompt, received "
                         f"{'neither' if prompt is None else 'both'}")
    if prompt is None:
        start = np.full((batch_size, 1), bos_id, dtype=np.int64)
    else:
        start = np.asarray(prompt)
        if start.ndim != 2 or start.shape[0] != batch_size or start.shape[1] == 0 \
                or not np.issubdtype(start.dtype, np.integer):
            raise ValueError(f"prompt must be (batch={batch_size}, length >= 1) integer ids, received "
                             f"{start.dtype} {start.shape}")
    p = start.shape[1]
    fill = eos_id if pad_id is None else pad_id
    ids = np.full((batch_size, p + max_new_tokens), fill, dtype=np.int64)
    ids[:, :p] = start
    finished = np.zeros(batch_size, dtype=bool)
    for t in range(p, p + max_new_tokens):
        logits = np.asarray(next_logits(ids[:, :t]))
        if logits.shape[0] != batch_size or logits.ndim != 2:
            raise ValueError(f"next_logits must return (batch={batch_size}, vocab) scores, received {logits.shape}")
        chosen = choose_next(logits, greedy=greedy, temperature=temperature, top_k=top_k, rng=rng)
        ids[:, t] = np.where(finished, fill, chosen)
        finished |= chosen == eos_id
        if finished.all():
            break
    return ids


def reference_stepper(model: Transformer, src_ids: np.ndarray | None = None, src_mask: np.ndarray | None = None
                      ) -> NextLogits:
    """`next_logits` for the NumPy reference: encode once (no source for a decoder-only model), then recompute the
    decoder over the whole prefix.

    Decoder inputs count as real tokens everywhere (a start token equal to `pad_id`, and finished rows fed padding
    whose logits nobody reads); the cached steppers of the other backends use the same all-True target mask.
    """
    memory = None
    if model.config.is_decoder_only:
        if src_ids is not None or src_mask is not None:
            raise ValueError("a decoder-only model has no source: pass the prompt to generate(), received src_ids")
    else:
        src_ids = np.asarray(src_ids)
        if src_mask is None:
            src_mask = ops.padding_mask(src_ids, model.config.pad_id)
        memory = model.encode(src_ids, src_mask)

    def next_logits(ids: np.ndarray) -> np.ndarray:
        all_real = np.ones(np.shape(ids), dtype=bool)
        return model.decode(ids, memory, src_mask, tgt_mask=all_real, last_only=True)[:, -1]

    return next_logits
