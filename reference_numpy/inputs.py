"""Seeded token-id batches with padding, the inputs every parity check and `verify` run feeds all backends."""

from __future__ import annotations

import numpy as np

from .config import TransformerConfig


def sample_ids(config: TransformerConfig, batch: int, length: int, vocab_size: int, seed: int,
               min_fill: float = 0.5) -> np.ndarray:
    """`(batch, length)` int64 ids, right-padded with `pad_id`: row 0 is full, every other row is padded, keeping
    a random number of real tokens in [max(1, min_fill * length), length - 1] (length 1: unpadded). Real tokens
    never equal `pad_id`. A model with no pad token (`pad_id=None`) gets no padding at all.

    Token id 0 is a real token whenever it is not the pad id, and a port that treats it as padding (masks derived
    from `ids == 0`) is wrong only where 0 occurs: so each row holds a 0 at a seeded one of its real positions.
    """
    pad = config.pad_id
    if batch < 1 or length < 1:
        raise ValueError(f"batch and length must be >= 1, received batch={batch}, length={length}")
    if length > config.max_len:
        raise ValueError(f"length={length} is longer than max_len={config.max_len}")
    if vocab_size < (1 if pad is None else 2):
        raise ValueError(f"a vocabulary of {vocab_size} token(s) leaves no id besides pad_id")
    rng = np.random.default_rng(seed)
    if pad is None:
        ids = rng.integers(0, vocab_size, size=(batch, length))
        lengths = np.full(batch, length)
    else:
        ids = rng.integers(0, vocab_size - 1, size=(batch, length))
        ids = np.where(ids >= pad, ids + 1, ids)  # skip pad_id
        shortest = min(max(1, int(np.ceil(min_fill * length))), max(1, length - 1))
        lengths = rng.integers(shortest, max(shortest, length - 1) + 1, size=batch)
        lengths[0] = length
        ids[np.arange(length)[None, :] >= lengths[:, None]] = pad
    if pad != 0:  # its own stream: the ids above stay what they were before id 0 was planted
        zero_at = np.random.default_rng([seed, 0x1D0]).integers(0, lengths)  # (batch,), a real position per row
        ids[np.arange(batch), zero_at] = 0
    return ids.astype(np.int64)


def sample_batch(config: TransformerConfig, batch: int = 2, src_len: int = 37, tgt_len: int = 29, seed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """`(src_ids, tgt_ids)` with padding in both; `tgt_ids` is None for a one-sequence model. A decoder-only
    model's one sequence (ids from the target vocabulary) comes first, `src_len` long, as the model takes it.

    A classifier that reads the source's last `eos_id` (classifier_input="eos", BART's) gets what it needs: each
    source row ends its real tokens with `eos_id` and holds it nowhere else (transformers requires the same count in
    every row), and the target is as long as the source, whatever `tgt_len` says."""
    if config.is_decoder_only:
        return sample_ids(config, batch, src_len, config.tgt_vocab_size, seed), None
    src = sample_ids(config, batch, src_len, config.src_vocab_size, seed)
    if not config.is_encoder_decoder:
        return src, None
    if config.classifier_input == "eos":
        other = next(i for i in range(config.src_vocab_size) if i not in (config.eos_id, config.pad_id))
        src = np.where(src == config.eos_id, other, src)
        real = src != config.pad_id if config.pad_id is not None else np.ones_like(src, bool)
        src[np.arange(batch), np.argmax(np.arange(src_len) * real, axis=-1)] = config.eos_id
        tgt_len = src_len
    return src, sample_ids(config, batch, tgt_len, config.tgt_vocab_size, seed + 1)


def sample_type_ids(config: TransformerConfig, src_ids: np.ndarray, seed: int) -> np.ndarray | None:
    """Seeded segment ids for `src_ids` (None without `type_vocab_size`): each row is segment 0 up to a random
    split, then increasing segments (BERT's sentence A | sentence B), as `(batch, length)` int64."""
    if not config.type_vocab_size:
        return None
    b, t = np.shape(src_ids)
    rng = np.random.default_rng([seed, 1759])
    splits = np.sort(rng.integers(0, t + 1, size=(b, config.type_vocab_size - 1)), axis=-1)  # (B, types - 1)
    return (np.arange(t)[None, :, None] >= splits[:, None, :]).sum(axis=-1).astype(np.int64)  # (B, T)
