"""Scaled dot-product attention in TensorFlow: an explicit-softmax path and Keras's fused op, chosen by the caller.

Mask convention (the project's, and `keras.ops.dot_product_attention`'s): bool, **True = may attend**. This module
is the one place where tf_impl meets a framework attention convention.
"""

from __future__ import annotations

import math

from .startup import tf  # noqa: I001 (before keras: its import loads TensorFlow)
import keras  # noqa: E402

from .blockwise_attention import blockwise_attention

IMPLS = ("explicit", "keras", "blockwise")


def causal_mask(query_len, key_len, first=None, window: int | None = None) -> tf.Tensor:
    """`(Tq, Tk)` bool: query i may see key j iff j <= first + i, where `first` is the first query's position
    (default `Tk - Tq`: the queries are the last Tq positions; a fixed-size cache passes where it writes, its
    unfilled tail then hidden), and with a sliding `window` only if first + i - j < window.

    Lengths and `first` may be Python ints or scalar tensors (dynamic shapes inside `tf.function`).
    """
    # Not tf.linalg.band_part: a negative band (Tq > Tk) means "keep everything" there, not "hide everything".
    rows = tf.range(query_len)[:, None] + (key_len - query_len if first is None else first)  # (Tq, 1) positions
    cols = tf.range(key_len)[None, :]  # (1, Tk)
    mask = cols <= rows
    return mask if window is None else tf.logical_and(mask, rows - cols < window)


def scaled_dot_product_attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor | None = None, *,
                                 causal: bool = False, need_weights: bool = False, impl: str = "explicit",
                                 dropout_p: float = 0.0, training: bool = False, seed=None,
                                 scale: float | None = None, softcap: float | None = None,
                                 position_scores: tf.Tensor | None = None, empty_rows: str = "zero", sinks=None,
                                 bias: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor | None]:
    """softmax(scale q k^T) v (equation 1 with scale = 1/sqrt(d_k)); with `softcap`, the scaled scores are
    cap * tanh(scores / cap) before the mask (Gemma 2); `bias` is added to the scaled scores first (ALiBi); with
    `sinks` `(H,)`, head h's logit joins its queries' softmax as one more column, dropped after it (GPT-OSS).

    Args:
        q: `(B, H, Tq, d_k)`; k: `(B, H, Tk, d_k)`; v: `(B, H, Tk, d_v)`.
        mask: bool, broadcastable to `(B, H, Tq, Tk)`, True = may attend.
        causal: also hide key j from query i when j > i + (Tk - Tq).
        need_weights: return the attention weights too; this takes the explicit path.
        impl: `explicit` (matmul, softmax, matmul in tf ops), `keras` (`keras.ops.dot_product_attention`) or
            `blockwise` (one block of queries at a time, `tf_impl.blockwise_attention`; the fast CPU path).
            The caller picks; nothing is feature-detected. `keras` and `blockwise` return no weights and have no
            dropout, so `need_weights` or active dropout take the explicit path.
        dropout_p: dropout on the attention weights, applied only when `training` is true.
        training: whether dropout is active.
        seed: the calling layer's `keras.random.SeedGenerator` (or an int) for the dropout draw.
        scale: what the scores are multiplied by (`TransformerConfig.attention_scale_factor`); None = 1/sqrt(d_k).
        softcap: `TransformerConfig.attn_logit_softcap`. Neither `keras` nor `blockwise` caps its scores, so a cap
            takes the explicit path.
        position_scores: DeBERTa's position terms `(B, H, Tq, Tk)`, added to q k^T before the scale (explicit path).
        empty_rows: "average": a query row with no key weighs every key equally (DeBERTa's padding queries;
            explicit path), not zero.
        sinks: `TransformerConfig.attention_sinks`' logits, one per head; the explicit path, as a cap.
        bias: added to the scaled scores before the cap and the mask, broadcastable to `(B, H, Tq, Tk)` (ALiBi's;
            T5's relative position bias); the explicit path, as a cap.

    Returns:
        `(out, weights)`: `(B, H, Tq, d_v)` and `(B, H, Tq, Tk)` or None. A query row with no key it may attend
        to gets all-zero weights and an all-zero output, as in the NumPy reference.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, received {impl!r}")
    if softcap is not None or position_scores is not None or empty_rows != "zero" or sinks is not None \
            or bias is not None:
        impl = "explicit"
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if mask is not None:
        mask = tf.convert_to_tensor(mask)
        if mask.dtype != tf.bool:
            raise TypeError(f"mask must be a bool tensor (True = may attend), received dtype {mask.dtype.name}")
    if impl == "blockwise" and not need_weights and not (training and dropout_p > 0):
        # Before the causal mask is materialised: the blockwise path skips the keys a causal block cannot see.
        return blockwise_attention(q, k, v, mask, causal=causal, scale=scale), None
    if causal:
        allowed = causal_mask(tf.shape(q)[-2], tf.shape(k)[-2])
        mask = allowed if mask is None else tf.logical_and(mask, allowed)
    # Rows with no visible key: let them see every key (no NaN from an all -inf softmax, in values or gradients),
    # then zero them.
    has_key = None if mask is None else tf.reduce_any(mask, axis=-1, keepdims=True)  # (..., Tq, 1)
    safe_mask = None if mask is None else tf.logical_or(mask, tf.logical_not(has_key))
    dropout = training and dropout_p > 0
    if impl == "keras" and not need_weights and not dropout:
        out = _keras_attention(q, k, v, safe_mask, scale)
        return (out if has_key is None else tf.where(has_key, out, tf.zeros_like(out))), None
    scores = tf.matmul(q, k, transpose_b=True)  # (B, H, Tq, Tk)
    if position_scores is not None:
        scores = scores + position_scores
    scores = scores * tf.constant(scale, q.dtype)
    if bias is not None:
        scores = scores + tf.cast(bias, scores.dtype)
    if softcap is not None:  # constants in the scores' dtype: float64 stays float64
        cap = tf.constant(softcap, scores.dtype)
        scores = tf.math.tanh(scores / cap) * cap
    if safe_mask is not None:
        scores = tf.where(safe_mask, scores, tf.constant(-math.inf, scores.dtype))
        if empty_rows == "average":  # equal scores on a row with no key: equal weights on every key
            scores = tf.where(has_key, scores, tf.zeros_like(scores))
            has_key = None
    if sinks is None:
        weights = tf.nn.softmax(scores, axis=-1)
    else:  # (B, H, Tq, Tk + 1): the sink's column last, dropped after the softmax
        column = tf.broadcast_to(tf.reshape(tf.cast(sinks, scores.dtype), (1, -1, 1, 1)),
                                 tf.concat([tf.shape(scores)[:-1], [1]], axis=0))
        weights = tf.nn.softmax(tf.concat([scores, column], axis=-1), axis=-1)[..., :-1]
    if has_key is not None and need_weights:
        weights = tf.where(has_key, weights, tf.zeros_like(weights))
    if dropout:
        weights = keras.random.dropout(weights, rate=dropout_p, seed=seed)
    out = tf.matmul(weights, v)  # (B, H, Tq, d_v)
    if has_key is not None:  # on the output, a d_v-wide row, rather than on the Tk-wide weights: 8% less time for
        out = tf.where(has_key, out, tf.zeros_like(out))  # an attention sublayer's forward+backward under XLA
    return out, (weights if need_weights else None)


def _keras_attention(q, k, v, mask, scale: float):
    """`keras.ops.dot_product_attention`, which takes `(B, T, H, d)` rather than `(B, H, T, d)`."""
    # A tensor scale: the TF backend casts a Python float scale through float32, which float64 cannot afford.
    scale = tf.constant(scale, dtype=q.dtype)
    q, k, v = (tf.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # (B, H, T, d) -> (B, T, H, d)
    out = keras.ops.dot_product_attention(q, k, v, mask=mask, scale=scale)  # (B, Tq, H, d_v)
    return tf.transpose(out, (0, 2, 1, 3))  # (B, Tq, H, d_v) -> (B, H, Tq, d_v)
