"""Blockwise scaled dot-product attention for TensorFlow on the CPU: the function of the explicit path, computed one
block of queries at a time so that the full `(B, H, Tq, Tk)` score tensor is never built.

Why (measured in benchmarks/, see README "Attention benchmarks"): the explicit path writes the whole score matrix
(128 MiB at batch 4, 8 heads, 1024 x 1024 in float32) and walks it again for the scale, the mask, the softmax and
the second matmul, each pass from DRAM; an allocation that large also bypasses the allocator's free lists (glibc
maps anything above 32 MiB afresh, page faults and all). PyTorch's fused CPU kernel never materialises it. Cutting
the queries into blocks keeps one block's scores (at most `_BLOCK_BYTES`) in cache and in reused memory, while each
matmul is still a block of queries against all keys, large enough for oneDNN to run near GEMM speed. Also:
- the 1/sqrt(d) scale is folded into q (Tq*d multiplies instead of Tq*Tk);
- under a causal mask a query block reads only the keys it can see: about half the matmul work, as fused kernels do;
- the softmax is normalised after the second matmul (Tq*d divisions instead of Tq*Tk), and its row max is constant
  to autodiff (`stop_gradient`: softmax does not depend on the shift, so gradients are unchanged and the max's own
  backward pass disappears).

Mask semantics are the project's: bool, broadcastable to `(B, H, Tq, Tk)`, True = may attend; a query row with no
key it may attend to gets an all-zero output. float16/bfloat16 inputs take their scores and softmax in float32.
Without static sequence lengths (a `tf.function` traced with `None` lengths) the whole sequence is one block.
"""

from __future__ import annotations

import math

import tensorflow as tf

BLOCK_QUERIES = 128  # queries per block, at most
_BLOCK_BYTES = 16 * 2 ** 20  # ... and a block's scores stay under this (glibc's mmap threshold tops out at 32 MiB)


# The two matmuls of a block, each compiled by XLA on its own: XLA's CPU dot runs these batched (B*H) GEMMs faster
# than TensorFlow's oneDNN BatchMatMul (measured: see the README), while the elementwise softmax ops stay regular
# TensorFlow ops, which run faster than XLA's CPU fusions of them. One compilation per block shape.
@tf.function(jit_compile=True)
def _scores(q, k):
    return tf.matmul(q, k, transpose_b=True)  # (B, H, n, Tk)


@tf.function(jit_compile=True)
def _mix(weights, v):
    return tf.matmul(weights, v)  # (B, H, n, d_v)


def block_size_for(batch_heads: int | None, key_len: int, itemsize: int = 4) -> int:
    """Queries per block: `BLOCK_QUERIES`, fewer when a block's `(B, H, n, Tk)` scores would pass `_BLOCK_BYTES`."""
    if not batch_heads:
        return BLOCK_QUERIES
    rows = _BLOCK_BYTES // max(1, batch_heads * key_len * itemsize)
    return int(max(16, min(BLOCK_QUERIES, rows // 16 * 16)))


def blockwise_attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor | None = None, *,
                        causal: bool = False, block_size: int | None = None) -> tf.Tensor:
    """softmax(q k^T / sqrt(d_k)) v, one block of queries at a time (see the module docstring).

    Args:
        q: `(B, H, Tq, d_k)`; k: `(B, H, Tk, d_k)`; v: `(B, H, Tk, d_v)`.
        mask: bool, broadcastable to `(B, H, Tq, Tk)`, True = may attend.
        causal: also hide key j from query i when j > i + (Tk - Tq).
        block_size: queries per block (default: `block_size_for` the shapes).

    Returns:
        `(B, H, Tq, d_v)`, in the dtype of `v`.
    """
    if block_size is not None and block_size < 1:
        raise ValueError(f"block_size must be >= 1, received {block_size}")
    q, k, v = (tf.convert_to_tensor(t) for t in (q, k, v))
    compute = tf.float32 if q.dtype in (tf.float16, tf.bfloat16) else q.dtype
    q = q * tf.constant(1.0 / math.sqrt(q.shape[-1]), q.dtype)  # (B, H, Tq, d_k); a float64 scale stays float64
    if mask is not None:
        mask = tf.convert_to_tensor(mask)
        if mask.dtype != tf.bool:
            raise TypeError(f"mask must be a bool tensor (True = may attend), received dtype {mask.dtype.name}")
        while mask.shape.rank < 4:
            mask = mask[None]  # (B|1, H|1, Tq|1, Tk)
    tq, tk = q.shape[-2], k.shape[-2]
    if tq is None or tk is None:  # dynamic lengths: one block, the offsets as tensors
        tq_d, tk_d = tf.shape(q)[-2], tf.shape(k)[-2]
        diagonal = None
        if causal:
            diagonal = tf.range(tk_d)[None, :] <= tf.range(tq_d)[:, None] + (tk_d - tq_d)  # (Tq, Tk)
        return _attend(q, k, v, _visible(mask, diagonal), compute)
    batch_heads = None
    if q.shape[0] is not None and q.shape[1] is not None:
        batch_heads = q.shape[0] * q.shape[1]
    size = block_size or block_size_for(batch_heads, tk, compute.size)
    outputs = []
    for start in range(0, tq, size):
        stop = min(start + size, tq)
        # The keys this block may see under the causal mask: j <= i + (Tk - Tq) for its last query i = stop - 1.
        key_stop = max(0, min(tk, stop + tk - tq)) if causal else tk
        if key_stop == 0:  # every query of the block precedes the first key: it sees nothing, its output is zero
            outputs.append(tf.zeros_like(q[..., start:stop, :1]) * tf.zeros_like(v[..., :1, :]))
            continue
        block_mask = None
        if mask is not None:
            rows = slice(start, stop) if mask.shape[-2] != 1 else slice(None)
            block_mask = mask[..., rows, :key_stop]  # (B|1, H|1, n|1, Tk')
        diagonal = None
        if causal and key_stop > start + tk - tq + 1:  # the block straddles the diagonal
            diagonal = tf.range(key_stop)[None, :] <= tf.range(start, stop)[:, None] + (tk - tq)  # (n, Tk')
        outputs.append(_attend(q[..., start:stop, :], k[..., :key_stop, :], v[..., :key_stop, :],
                               _visible(block_mask, diagonal), compute))
    return outputs[0] if len(outputs) == 1 else tf.concat(outputs, axis=-2)  # (B, H, Tq, d_v)


def _visible(mask, diagonal):
    if mask is None:
        return diagonal
    return mask if diagonal is None else tf.logical_and(mask, diagonal)


def _attend(q, k, v, visible, compute):
    """One block: `(B, H, n, d_k)` queries (already scaled) against `(B, H, Tk, d_k)` keys -> `(B, H, n, d_v)`."""
    scores = tf.cast(_scores(q, k), compute)  # (B, H, n, Tk)
    if visible is not None:
        scores = tf.where(visible, scores, tf.constant(-math.inf, compute))
    row_max = tf.stop_gradient(tf.reduce_max(scores, axis=-1, keepdims=True))  # (B, H, n, 1)
    if visible is not None:  # a row that sees no key has max -inf: shift it by 0 instead (exp(-inf) = 0)
        row_max = tf.where(tf.math.is_finite(row_max), row_max, tf.zeros_like(row_max))
    weights = tf.exp(scores - row_max)  # unnormalised softmax, (B, H, n, Tk)
    total = tf.reduce_sum(weights, axis=-1, keepdims=True)  # (B, H, n, 1)
    out = tf.cast(_mix(tf.cast(weights, v.dtype), v), compute)  # (B, H, n, d_v)
    # A row with no visible key has total 0 and output 0: 0 / 0 -> 0.
    out = out / total if visible is None else tf.math.divide_no_nan(out, total)
    return tf.cast(out, v.dtype)
