"""Blockwise scaled dot-product attention for TensorFlow on the CPU: the function of the explicit path, computed one
block of (batch elements, queries) at a time so that the full `(B, H, Tq, Tk)` score tensor is never built.

Why (measured by `python -m benchmarks.tf_cpu_study`; docs/tf-cpu-study.md): the explicit path writes the
whole score matrix (128 MiB at batch 4, 8 heads, 1024 x 1024 in float32) and walks it again for the scale, the
mask, the softmax and the second matmul, every pass from DRAM, where PyTorch's fused CPU kernel never materialises
it. Here each block's scores stay within a few MiB (`_BLOCK_BYTES`), in cache and in memory the allocator reuses,
and the blocks are independent ops that TensorFlow's inter-op pool runs side by side. Also:
- each block's two matmuls are compiled by XLA on their own (XLA's CPU dot runs these batched GEMMs faster than
  TensorFlow's oneDNN BatchMatMul), the softmax stays in TensorFlow ops (faster than XLA's CPU fusions of them);
- the scale (1/sqrt(d) by default) is folded into q (Tq*d multiplies instead of Tq*Tk);
- under a causal mask a query block reads only the keys it can see: about half the matmul work, as fused kernels do;
- the softmax is normalised after the second matmul (Tq*d divisions instead of Tq*Tk);
- the backward pass is FlashAttention's: each block keeps only its row max and sum and recomputes its scores, so
  autodiff does not keep (and re-read) every block's weights, the whole score tensor over again.

Mask semantics are the project's: bool, broadcastable to `(B, H, Tq, Tk)`, True = may attend; a query row with no
key it may attend to gets an all-zero output. float16/bfloat16 inputs take their scores and softmax in float32.
Without static sequence lengths (a `tf.function` traced with `None` lengths) the whole sequence is one block. XLA
compiles each distinct block shape once (a causal mask gives every query block its own key length).
"""

from __future__ import annotations

import math

from .startup import tf  # noqa: I001 (before keras: its import loads TensorFlow)

BLOCK_QUERIES = 128  # queries per block, at most
_BLOCK_BYTES = 4 * 2 ** 20  # a block's (b, H, n, Tk) scores: a few MiB stay in the last-level cache


def block_shape(batch: int | None, heads: int | None, key_len: int, itemsize: int = 4) -> tuple[int, int]:
    """(batch elements, queries) per block: up to `BLOCK_QUERIES` queries (never fewer than 16), then as many batch
    elements as keep the block's scores within `_BLOCK_BYTES`. Unknown sizes count as 1."""
    per_query = max(1, (heads or 1) * key_len * itemsize)  # bytes of scores per query and batch element
    queries = int(max(16, min(BLOCK_QUERIES, _BLOCK_BYTES // per_query // 16 * 16)))
    batch_block = max(1, _BLOCK_BYTES // (queries * per_query))
    return (min(batch_block, batch) if batch else 1), queries


# A block's matmuls, each compiled by XLA on its own (one compilation per shape and transpose pattern).
@tf.function(jit_compile=True)
def _matmul(a, b, transpose_a=False, transpose_b=False):
    return tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)


def blockwise_attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor | None = None, *,
                        causal: bool = False, block_size: int | None = None, scale: float | None = None) -> tf.Tensor:
    """softmax(scale q k^T) v, one block of (batch elements, queries) at a time (see the module docstring).

    Args:
        q: `(B, H, Tq, d_k)`; k: `(B, H, Tk, d_k)`; v: `(B, H, Tk, d_v)`.
        mask: bool, broadcastable to `(B, H, Tq, Tk)`, True = may attend.
        causal: also hide key j from query i when j > i + (Tk - Tq).
        block_size: queries per block (default: `block_shape` of the shapes).
        scale: what the scores are multiplied by (`TransformerConfig.attention_scale_factor`); None = 1/sqrt(d_k).

    Returns:
        `(B, H, Tq, d_v)`, in the dtype of `v`.
    """
    if block_size is not None and block_size < 1:
        raise ValueError(f"block_size must be >= 1, received {block_size}")
    q, k, v = (tf.convert_to_tensor(t) for t in (q, k, v))
    compute = tf.float32 if q.dtype in (tf.float16, tf.bfloat16) else q.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    q = q * tf.constant(scale, q.dtype)  # (B, H, Tq, d_k); a float64 scale stays float64
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
    batch = q.shape[0]
    batch_block, size = block_shape(batch, q.shape[1], tk, compute.size)
    size = block_size or size
    batches = [slice(None)] if batch is None else [slice(b, min(b + batch_block, batch))
                                                   for b in range(0, batch, batch_block)]
    per_batch = []
    for rows_b in batches:
        q_b, k_b, v_b = q[rows_b], k[rows_b], v[rows_b]  # (b, H, T, d)
        mask_b = None if mask is None else (mask if mask.shape[0] == 1 else mask[rows_b])
        outputs = []
        for start in range(0, tq, size):
            stop = min(start + size, tq)
            # The keys this block may see under the causal mask: j <= i + (Tk - Tq) for its last query i = stop - 1.
            key_stop = max(0, min(tk, stop + tk - tq)) if causal else tk
            if key_stop == 0:  # every query of the block precedes the first key: it sees nothing, output zero
                outputs.append(tf.zeros_like(q_b[..., start:stop, :1]) * tf.zeros_like(v_b[..., :1, :]))
                continue
            block_mask = None
            if mask_b is not None:
                rows = slice(start, stop) if mask_b.shape[-2] != 1 else slice(None)
                block_mask = mask_b[..., rows, :key_stop]  # (b|1, H|1, n|1, Tk')
            diagonal = None
            if causal and key_stop > start + tk - tq + 1:  # the block straddles the diagonal
                diagonal = tf.range(key_stop)[None, :] <= tf.range(start, stop)[:, None] + (tk - tq)  # (n, Tk')
            outputs.append(_attend(q_b[..., start:stop, :], k_b[..., :key_stop, :], v_b[..., :key_stop, :],
                                   _visible(block_mask, diagonal), compute))
        per_batch.append(outputs[0] if len(outputs) == 1 else tf.concat(outputs, axis=-2))  # (b, H, Tq, d_v)
    return per_batch[0] if len(per_batch) == 1 else tf.concat(per_batch, axis=0)  # (B, H, Tq, d_v)


def _visible(mask, diagonal):
    if mask is None:
        return diagonal
    return mask if diagonal is None else tf.logical_and(mask, diagonal)


def _attend(q, k, v, visible, compute):
    """One block: `(B, H, n, d_k)` queries (already scaled) against `(B, H, Tk, d_k)` keys -> `(B, H, n, d_v)`.

    Its gradient is FlashAttention's: rather than keeping the block's `(n, Tk)` weights for the backward pass
    (every block's together would be the whole score tensor again), it keeps the row max and sum and recomputes
    the scores, one more matmul for four fewer passes over memory.
    """

    def probabilities(q, k):
        scores = tf.cast(_matmul(q, k, transpose_b=True), compute)  # (B, H, n, Tk)
        if visible is not None:
            scores = tf.where(visible, scores, tf.constant(-math.inf, compute))
        return scores

    @tf.custom_gradient
    def block(q, k, v):
        scores = probabilities(q, k)
        row_max = tf.reduce_max(scores, axis=-1, keepdims=True)  # (B, H, n, 1)
        if visible is not None:  # a row that sees no key has max -inf: shift it by 0 instead (exp(-inf) = 0)
            row_max = tf.where(tf.math.is_finite(row_max), row_max, tf.zeros_like(row_max))
        weights = tf.exp(scores - row_max)  # unnormalised softmax, (B, H, n, Tk)
        total = tf.reduce_sum(weights, axis=-1, keepdims=True)  # (B, H, n, 1); 0 for a row that sees no key
        out = tf.cast(_matmul(tf.cast(weights, v.dtype), v), compute)  # (B, H, n, d_v)
        out = tf.math.divide_no_nan(out, total)  # a blind row: 0 / 0 -> 0

        def grad(d_out):
            d_out = tf.cast(d_out, compute)
            probs = tf.math.divide_no_nan(tf.exp(probabilities(q, k) - row_max), total)  # (B, H, n, Tk)
            d_v = _matmul(tf.cast(probs, v.dtype), tf.cast(d_out, v.dtype), transpose_a=True)  # (B, H, Tk, d_v)
            d_probs = tf.cast(_matmul(tf.cast(d_out, v.dtype), v, transpose_b=True), compute)  # (B, H, n, Tk)
            # softmax backward: dS = P * (dP - rowsum(dP * P)), and rowsum(dP * P) = rowsum(dO * O)
            d_scores = probs * (d_probs - tf.reduce_sum(d_out * out, axis=-1, keepdims=True))
            d_scores = tf.cast(d_scores, q.dtype)
            return _matmul(d_scores, k), _matmul(d_scores, q, transpose_a=True), d_v

        return tf.cast(out, v.dtype), grad

    return block(q, k, v)
