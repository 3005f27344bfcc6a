"""What a verify probe exercised: a PASS is a claim about the paths its inputs ran through. Some of a model's
computation acts only on some inputs: a sliding window only on sequences longer than it, a `dynamic` or `longrope`
rotary scaling only past `original_max_position_embeddings`, padding only where the probe pads, segment embeddings
beyond 0 only where the probe uses them, learned positions only up to the probe's length, the rows of a relative
positions' table (DeBERTa) only for the distances the probe spans. `not_exercised` names
each such path the config declares and the probe left out, so the verdict says so (a note, and the JSON report's
`not_exercised`); `cover_lengths` gives the lengths that exercise every length-dependent one (`verify --cover`).
"""

from __future__ import annotations

import numpy as np

import reference_numpy as rn

LATE_ROPE = ("dynamic", "longrope")  # rope types whose scaling changes only past original_max_position_embeddings


def _threshold(config: rn.TransformerConfig) -> int | None:
    """The length past which a late rope scaling acts, or None."""
    rope = config.rope_scaling or {}
    if rope.get("rope_type") in LATE_ROPE and rope.get("original_max_position_embeddings"):
        return int(rope["original_max_position_embeddings"])
    return None


def not_exercised(config: rn.TransformerConfig, src: np.ndarray, tgt: np.ndarray | None,
                  types: np.ndarray | None) -> list[str]:
    """The input-dependent paths of `config` that the probe `(src, tgt, types)` did not run through, one phrase each
    (empty: it ran through every one this module knows); `tgt` counts only for an encoder-decoder."""
    seqs = [src] if tgt is None or not config.is_encoder_decoder else [src, tgt]
    longest = max(s.shape[1] for s in seqs)
    out = []
    if config.sliding_window is not None and longest <= config.sliding_window:
        out.append(f"the sliding window ({config.sliding_window} positions): the probe's longest sequence has "
                   f"{longest}, so no query had a key outside its window")
    late = _threshold(config)
    if late is not None and longest <= late:
        out.append(f"rope_scaling {config.rope_scaling['rope_type']!r}, which acts past {late} positions: the probe "
                   f"has {longest}")
    if config.pad_id is not None and not any(np.any(s == config.pad_id) for s in seqs):
        out.append(f"padding: no probe row holds the pad id {config.pad_id}")
    if config.type_vocab_size > 1 and (types is None or np.unique(types).size < 2):
        out.append(f"segment ids: the probe uses {'none' if types is None else np.unique(types).tolist()} of "
                   f"{config.type_vocab_size}")
    if config.positional == "learned" and longest < config.max_len:
        out.append(f"learned positions {longest}..{config.max_len - 1}: the probe reads rows 0..{longest - 1} "
                   "(their weights are compared; their outputs are not)")
    if config.relative_terms is not None:
        rows = np.unique(rn.ops.relative_position_index(config, longest, longest))
        if rows.size < 2 * config.relative_span:
            out.append(f"relative positions: the probe's distances up to {longest - 1} read rows {rows.min()}.."
                       f"{rows.max()} of the {2 * config.relative_span}-row table (every row needs a distance of "
                       f"max_relative_positions={config.max_relative_positions})")
    return out


def cover_lengths(config: rn.TransformerConfig, src_len: int, tgt_len: int) -> tuple[int, int]:
    """Lengths (at least the ones given) that run every length-dependent path: one past the sliding window and past
    a late rope scaling's threshold, every row of a learned position table (or of a relative one: a distance of
    `max_relative_positions`), within `max_len`."""
    need = config.max_len if config.positional == "learned" else 0  # every row of the position table
    if config.relative_terms is not None:
        need = max(need, config.max_relative_positions + 1)
    if config.sliding_window is not None:
        need = max(need, config.sliding_window + 1)
    late = _threshold(config)
    if late is not None:
        need = max(need, late + 1)
    need = min(need, config.max_len)
    return max(src_len, need), max(tgt_len, need) if config.is_encoder_decoder else tgt_len
