"""ALiBi (Press et al. 2021, "Train Short, Test Long"): a bias on each attention score that grows linearly with the
key's position, a slope per head, in place of position embeddings (BLOOM, Falcon-RW; `TransformerConfig.alibi`).

Imports NumPy only.
"""

from __future__ import annotations

import math

import numpy as np

from .lowp import round_bfloat16


def slopes(num_heads: int) -> np.ndarray:
    """Each head's slope, float64 `(H,)`: with n the largest power of two <= H, heads 0 .. n-1 take 2^(-8k/n) for
    k = 1 .. n, and the other H - n heads every other slope of 2n heads, 2^(-8k/(2n)) for k = 1, 3, 5, ...
    (transformers' `_get_alibi_slopes`, keras_hub's `AlibiBias`)."""
    n = 2 ** int(math.floor(math.log2(num_heads)))
    out = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    out += [2.0 ** (-8.0 * k / (2 * n)) for k in range(1, 2 * (num_heads - n), 2)]
    return np.asarray(out, dtype=np.float64)


def bias(config, key_len: int) -> np.ndarray:
    """The bias on a self-attention's scaled scores, float64 `(H, 1, Tk)`: slope_h * j for key position j, times
    the scores' scale under `alibi_scaled`. Softmax is shift invariant along a row, so this equals the paper's
    -slope * (i - j), and transformers' count of the real keys before j under left padding: they differ from it by
    a constant per query row. Under `alibi_bfloat16` each slope, each position and their product are rounded to
    bfloat16, as transformers' Falcon computes them (exact for power-of-two slopes below 256 positions), before the
    scale."""
    positions = np.arange(key_len, dtype=np.float64)
    per_head = slopes(config.num_heads)
    if config.alibi_bfloat16:  # bfloat16 slopes times bfloat16 positions (torch promotes the integers so), rounded
        rounded = round_bfloat16(per_head.astype(np.float32))  # (H,), from float32 as transformers' slopes are
        at = round_bfloat16(positions.astype(np.float32))  # (Tk,): 257 -> 256; exact products in float32
        table = round_bfloat16(rounded[:, None] * at[None, :]).astype(np.float64)
    else:
        table = per_head[:, None] * positions[None, :]  # (H, Tk)
    return (table * config.alibi_factor)[:, None, :]  # (H, 1, Tk)
