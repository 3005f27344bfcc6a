"""The Transformer's math as small pure NumPy functions (Vaswani et al. 2017, section 3).

Every function computes in the dtype of its inputs. Masks are boolean with one meaning everywhere:
**True = this query may attend to this key**.
"""

from __future__ import annotations

import functools
import math

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def linear(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """`x @ kernel + bias` with `kernel` of shape `(in_features, out_features)`."""
    y = x @ kernel
    return y if bias is None else y + bias


def layer_norm(x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None, eps: float) -> np.ndarray:
    """LayerNorm over the last axis with the biased variance, as torch.nn.LayerNorm and Keras compute it; without
    gamma and beta (None: OLMo's, `norm_affine=False`) the normalized x alone; without beta (None: `norm_bias=False`)
    the normalized x times gamma."""
    mean = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mean).mean(axis=-1, keepdims=True)
    normed = (x - mean) / np.sqrt(var + x.dtype.type(eps))
    if gamma is None:
        return normed
    return normed * gamma if beta is None else normed * gamma + beta


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    """RMSNorm over the last axis, x / sqrt(mean(x^2) + eps) * (offset + gamma): Llama's (offset 0) and Gemma's
    (offset 1: it stores w and multiplies by 1 + w). No mean is subtracted and there is no beta."""
    t = x.dtype.type
    mean_square = np.square(x).mean(axis=-1, keepdims=True)
    return x / np.sqrt(mean_square + t(eps)) * (gamma + t(offset)) if offset else \
        x / np.sqrt(mean_square + t(eps)) * gamma


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, x.dtype.type(0))


def gelu(x: np.ndarray) -> np.ndarray:
    """The exact GELU, x * Phi(x) with the erf form (torch's default, Keras's `approximate=False`)."""
    phi = 0.5 * (1.0 + _erf(x.astype(np.float64) / math.sqrt(2.0)).astype(np.float64))
    return (x * phi.astype(x.dtype)).astype(x.dtype)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GPT-2's `gelu_new`, torch's
    `gelu(approximate="tanh")`."""
    t = x.dtype.type
    inner = t(math.sqrt(2.0 / math.pi)) * (x + t(0.044715) * x * x * x)
    return t(0.5) * x * (t(1.0) + np.tanh(inner))


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish), x * sigmoid(x): Marian's activation."""
    with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0 gives sigmoid 0, as it should
        return x / (x.dtype.type(1.0) + np.exp(-x))


def swish(x: np.ndarray, beta: float) -> np.ndarray:
    """x * sigmoid(beta * x): silu with a sigmoid gain (GPT-OSS's experts: 1.702)."""
    with np.errstate(over="ignore"):
        return x / (x.dtype.type(1.0) + np.exp(-x.dtype.type(beta) * x))


def clamped_glu(gate: np.ndarray, up: np.ndarray, act, config) -> np.ndarray:
    """A gated feed-forward's hidden features from its gate and up projections: act(gate) * up, or the clamped GLU
    (`glu_limit`: gate clamped above, up to [-limit, limit]; `glu_alpha`: silu's sigmoid gain; `glu_up_offset`
    added to up), GPT-OSS's `(up + 1) * gate * sigmoid(1.702 gate)`. The clamps pick values, rounding nothing."""
    t = gate.dtype.type
    if config.glu_limit is not None:
        gate = np.minimum(gate, t(config.glu_limit))
        up = np.clip(up, t(-config.glu_limit), t(config.glu_limit))
    if config.glu_up_offset:
        up = up + t(config.glu_up_offset)
    return (act(gate) if config.glu_alpha == 1.0 else swish(gate, config.glu_alpha)) * up


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}


def soft_cap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap): `x` squashed smoothly into (-cap, cap) (Gemma 2's attention-logit and final-logit
    soft-capping)."""
    t = x.dtype.type
    return t(cap) * np.tanh(x / t(cap))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def sinusoidal_positions(length: int, d_model: int, layout: str = "interleaved", frequencies: str = "paper"
                         ) -> np.ndarray:
    """The fixed position table of section 3.5, float64, shape `(length, d_model)`.

    `interleaved` (the paper): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same angle).
    `concatenated` (tensor2tensor, Marian, TensorFlow's tutorial): [sin(angles) | cos(angles)].
    `frequencies="inclusive"` (fairseq, M2M100): angles p / 10000^(i / (d/2 - 1)), the last exactly p / 10000.
    A fresh array each call; the table itself is computed once per shape (probing builds many models alike).
    """
    return _sinusoid_table(int(length), int(d_model), layout, frequencies).copy()


@functools.lru_cache(maxsize=8)
def _sinusoid_table(length: int, d_model: int, layout: str, frequencies: str) -> np.ndarray:
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, received {d_model}")
    positions = np.arange(length, dtype=np.float64)[:, None]  # (L, 1)
    if frequencies == "inclusive":
        inv_freq = np.exp(np.arange(d_model // 2, dtype=np.float64) * -(math.log(10000.0) / (d_model // 2 - 1)))
    else:
        inv_freq = 10000.0 ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # (D/2,)
    angles = positions * inv_freq  # (L, D/2)
    if layout == "interleaved":
        table = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(length, d_model)  # (L, D/2, 2) -> (L, D)
    elif layout == "concatenated":
        table = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)  # (L, D)
    else:
        raise ValueError(f"sinusoid_layout must be interleaved or concatenated, received {layout!r}")
    return table


def rope_frequencies(config, length: int, local: bool = False) -> tuple[np.ndarray, float]:
    """`(inv_freq, attention_scaling)` of rotary positions (Su et al. 2021), float64: `inv_freq` `(rotary_dim / 2,)`
    are the rotation speeds of the dim pairs, `attention_scaling` multiplies cos and sin. Each rope type is
    transformers' formula (`modeling_rope_utils`) for a sequence of `length` positions: `linear` divides every
    frequency by `factor`; `dynamic` (NTK) changes nothing up to `max_len`, the only lengths a model takes; `llama3`
    divides the low frequencies by `factor` and blends the middle band; `yarn` blends interpolated and extrapolated
    frequencies over a ramp of dims and scales the attention; `longrope` divides by per-dim `short_factor` (or
    `long_factor` beyond `original_max_position_embeddings`) and scales the attention. `local`: a sliding layer's
    own rotation (`local_rope_theta`, Gemma 3), the default type at that base."""
    dim, base = config.rotary_dim, float(config.local_rope_theta if local else config.rope_theta)
    params = {} if local else dict(config.rope_scaling or {})
    kind = params.get("rope_type", "default")
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)  # (dim/2,)
    inv_freq, scaling = 1.0 / pos_freqs, 1.0
    if kind == "linear":
        inv_freq = inv_freq / params["factor"]
    elif kind == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv_freq = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    elif kind == "yarn":
        inv_freq, scaling = _yarn(params, dim, base, pos_freqs, config.max_len)
    elif kind == "longrope":
        old = params["original_max_position_embeddings"]
        factor = params.get("factor") or config.max_len / old
        scaling = params.get("attention_factor")
        if scaling is None:
            scaling = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
        ext = np.asarray(params["long_factor" if length > old else "short_factor"], dtype=np.float64)
        if ext.shape != inv_freq.shape:
            raise ValueError(f"rope_scaling longrope factors have {ext.size} entries, rotary_dim / 2 = {dim // 2}")
        inv_freq = 1.0 / (ext * pos_freqs)
    return inv_freq, float(scaling)


def _yarn(params: dict, dim: int, base: float, pos_freqs: np.ndarray, max_len: int) -> tuple[np.ndarray, float]:
    old = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_len / old
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    scaling = params.get("attention_factor")
    if scaling is None:
        scaling = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) if mscale and mscale_all_dim \
            else get_mscale(factor)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = 1.0 / (factor * pos_freqs) * (1 - extrapolation) + 1.0 / pos_freqs * extrapolation
    return inv_freq, float(scaling)


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, scaling: float,
               rotary_dim: int, interleaved: bool = False) -> np.ndarray:
    """Rotate `x` `(B, H, T, d_k)` at `positions` `(T,)`: its first `rotary_dim` dims, as two halves (transformers'
    `rotate_half`: dim j pairs with dim j + rotary_dim / 2) or, `interleaved`, as adjacent pairs (GPT-J's
    `rotate_every_two`: dim 2j with dim 2j + 1), pair j at angle `position * inv_freq[j]`; the rest pass through.
    The angles are computed in x's dtype."""
    t = x.dtype.type
    freqs = np.asarray(positions, dtype=x.dtype)[:, None] * inv_freq.astype(x.dtype)[None, :]  # (T, r/2)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        angles = np.repeat(freqs, 2, axis=-1)  # (T, r): each angle on its pair's two dims
        rotated = np.stack([-rot[..., 1::2], rot[..., ::2]], axis=-1).reshape(rot.shape)  # rotate_every_two
    else:
        angles = np.concatenate([freqs, freqs], axis=-1)  # (T, r)
        half = rotary_dim // 2
        rotated = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)  # rotate_half
    cos, sin = np.cos(angles) * t(scaling), np.sin(angles) * t(scaling)
    return np.concatenate([rot * cos + rotated * sin, rest], axis=-1)


def padding_mask(ids: np.ndarray, pad_id: int | None) -> np.ndarray:
    """`(B, T)` token ids -> `(B, T)` bool, True where the token is real (not padding). `pad_id=None` (a model
    with no pad token): every token is real."""
    ids = np.asarray(ids)
    if pad_id is None:
        return np.ones(ids.shape, dtype=bool)
    return ids != pad_id


def skip_pad_positions(ids: np.ndarray, pad_id: int, offset: int, start: int = 0) -> np.ndarray:
    """`(B, T)` token ids -> `(B, T)` rows of a position table as RoBERTa and M2M100 (fairseq's `make_positions`)
    read them: the k-th non-pad token of a row (k = 0, 1, ...) reads row `offset + start + k`, whatever padding
    comes before it, and every `pad_id` token reads row `offset - 1` (their `padding_idx`, with `offset =
    padding_idx + 1`); `start`: the positions already decoded before these."""
    real = np.asarray(ids) != pad_id
    return (np.cumsum(real, axis=1) + start) * real + (offset - 1)


def position_sinusoids(config) -> np.ndarray:
    """A model's sinusoid table, float64: `(max_len, d_model)`, or under `positions_skip_pad` `(max_len +
    position_offset, d_model)` with the pad tokens' row `position_offset - 1` zero (M2M100's)."""
    rows = config.max_len + (config.position_offset if config.positions_skip_pad else 0)
    table = sinusoidal_positions(rows, config.d_model, config.sinusoid_layout, config.sinusoid_frequencies)
    if config.positions_skip_pad:
        table[config.position_offset - 1] = 0.0
    return table


def causal_mask(query_len: int, key_len: int, window: int | None = None) -> np.ndarray:
    """`(Tq, Tk)` bool: query i may see key j iff j <= i + (Tk - Tq) (queries are the last Tq positions), and, with
    a sliding `window`, only the `window` latest of those (i - j < window, as transformers' sliding-window mask)."""
    mask = np.tril(np.ones((query_len, key_len), dtype=bool), k=key_len - query_len)
    if window is not None:
        mask &= np.triu(np.ones((query_len, key_len), dtype=bool), k=key_len - query_len - window + 1)
    return mask


def attention_mask(key_mask: np.ndarray, query_len: int, causal: bool = False, window: int | None = None
                   ) -> np.ndarray:
    """Key padding mask `(B, Tk)` -> attention mask `(B, 1, Tq, Tk)` (True = may attend), optionally causal (and
    windowed: i - j < window); not causal, a `window` is both ways, |i - j| < window (ModernBERT's local layers:
    transformers' `abs(q_idx - kv_idx) <= local_attention // 2`)."""
    mask = np.broadcast_to(key_mask[:, None, None, :], (key_mask.shape[0], 1, query_len, key_mask.shape[1]))
    if causal:
        mask = mask & causal_mask(query_len, key_mask.shape[1], window)
    elif window is not None:
        offset = key_mask.shape[1] - query_len  # the queries are the last Tq positions
        distance = np.arange(query_len)[:, None] + offset - np.arange(key_mask.shape[1])[None, :]  # (Tq, Tk)
        mask = mask & (np.abs(distance) < window)
    return mask


def log_bucket_positions(relative: np.ndarray, buckets: int, max_positions: int) -> np.ndarray:
    """DeBERTa's log buckets of relative distances (transformers' `make_log_bucket_position`), int64 of
    `relative`'s shape: a distance within `buckets // 2` (mid) each way stays itself, a longer one becomes
    sign * (mid + ceil(log(|d| / mid) / log((max_positions - 1) / mid) * (mid - 1))), computed in float64
    (transformers computes it in float32; the two agree on every distance below 1292 at its 256 buckets and 512
    positions, and at the sizes `parity_tests/test_bert_family.py` checks)."""
    mid = buckets // 2
    relative = np.asarray(relative, dtype=np.int64)
    near = (relative < mid) & (relative > -mid)
    distance = np.where(near, mid - 1, np.abs(relative)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) at mid = 1 lies where the distance stays itself
        log_pos = np.ceil(np.log(distance / mid) / math.log((max_positions - 1) / mid) * (mid - 1)) + mid
        return np.where(distance <= mid, relative, log_pos * np.sign(relative)).astype(np.int64)


def relative_position_index(config, query_len: int, key_len: int) -> np.ndarray:
    """`(Tq, Tk)` int64: the row of the relative positions' table (`encoder.rel_embed`, `2 * relative_span` rows)
    that pairs query i with key j: the distance i - j, log-bucketed under `relative_buckets`, plus the span,
    clipped to the table."""
    relative = np.arange(query_len)[:, None] - np.arange(key_len)[None, :]  # (Tq, Tk)
    if config.relative_buckets:
        relative = log_bucket_positions(relative, config.relative_buckets, config.max_relative_positions)
    span = config.relative_span
    return np.clip(relative + span, 0, 2 * span - 1)


def disentangled_scores(q: np.ndarray, k: np.ndarray, pos_q: np.ndarray | None, pos_k: np.ndarray | None,
                        index: np.ndarray) -> np.ndarray:
    """DeBERTa's position terms of the attention scores, before the scale, `(B, H, Tq, Tk)`: content-to-position
    q_i . pos_k[index[i, j]] (where `pos_k` is given) plus position-to-content k_j . pos_q[index[i, j]] (where
    `pos_q` is). q `(B, H, Tq, d)`, k `(B, H, Tk, d)`; pos_q, pos_k `(1, H, 2 span, d)`: the relative positions'
    table projected; index `(Tq, Tk)` (`relative_position_index`)."""
    tq, tk = index.shape
    scores = np.zeros(q.shape[:2] + index.shape, dtype=q.dtype)
    if pos_k is not None:
        c2p = q @ np.swapaxes(pos_k, -1, -2)  # (B, H, Tq, 2 span)
        scores = scores + c2p[:, :, np.arange(tq)[:, None], index]
    if pos_q is not None:
        p2c = k @ np.swapaxes(pos_q, -1, -2)  # (B, H, Tk, 2 span)
        scores = scores + p2c[:, :, np.arange(tk)[None, :], index]
    return scores


def relative_position_buckets(relative: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int
                              ) -> np.ndarray:
    """T5's buckets of relative distances (key position - query position), int64 in [0, num_buckets): a
    bidirectional stack gives later keys the upper half of the buckets; within a half (or all of them, causal, where
    later keys count as distance 0) the first half are exact distances, the rest logarithmic up to `max_distance`,
    beyond which all share the last. The logarithm runs in float32 as transformers' (and Mesh TensorFlow's) does, so
    a distance on a bucket's edge lands where theirs does."""
    relative = np.asarray(relative, dtype=np.int64)
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).astype(np.int64) * num_buckets
        distance = np.abs(relative)
    else:
        distance = -np.minimum(relative, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        scaled = (np.log(distance.astype(np.float32) / np.float32(max_exact))
                  / np.float32(math.log(max_distance / max_exact)) * np.float32(num_buckets - max_exact))
    large = max_exact + np.where(distance < max_exact, 0, scaled).astype(np.int64)
    return buckets + np.where(distance < max_exact, distance, np.minimum(large, num_buckets - 1))


def relative_bucket_table(config, bidirectional: bool) -> np.ndarray:
    """`(2 * max_len - 1,)` int64: the bucket of every relative distance a model can meet, distance r at index
    r + max_len - 1 (the twins gather from it, so that a decoding step's positions may be tensors)."""
    relative = np.arange(-(config.max_len - 1), config.max_len)
    return relative_position_buckets(relative, bidirectional, config.relative_bias_buckets,
                                     config.relative_bias_max_distance)


def relative_position_bias(table: np.ndarray, config, bidirectional: bool, query_len: int, key_len: int
                           ) -> np.ndarray:
    """T5's bias `(1, H, Tq, Tk)` from a stack's table `(buckets, H)`: the queries are the last Tq of Tk
    positions (a decoding step's one query sits at Tk - 1)."""
    queries = np.arange(key_len - query_len, key_len)
    relative = np.arange(key_len)[None, :] - queries[:, None]  # (Tq, Tk)
    buckets = relative_position_buckets(relative, bidirectional, config.relative_bias_buckets,
                                        config.relative_bias_max_distance)
    return table[buckets].transpose(2, 0, 1)[None]  # (Tq, Tk, H) -> (1, H, Tq, Tk)


def scaled_dot_product_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
                                 scale: float | None = None, softcap: float | None = None,
                                 position_scores: np.ndarray | None = None, empty_rows: str = "zero",
                                 sinks: np.ndarray | None = None, bias: np.ndarray | None = None
                                 ) -> tuple[np.ndarray, np.ndarray]:
    """softmax(scale q k^T) v, equation (1) with scale = 1/sqrt(d_k); with `softcap`, the scaled scores are
    `soft_cap`ped before the mask and the softmax (Gemma 2); `position_scores` (DeBERTa's
    `disentangled_scores`) are added to q k^T before the scale; `bias` is added to the scaled scores (ALiBi).
    `empty_rows="average"`: a query row with no key it may attend to weighs every key equally (DeBERTa's padding
    queries), not zero. With `sinks` `(H,)`, head h's logit joins each of its queries' softmax as one more column,
    dropped after it (GPT-OSS): the weights sum to less than 1.

    Args:
        q: `(B, H, Tq, d_k)`; k: `(B, H, Tk, d_k)`; v: `(B, H, Tk, d_v)`.
        mask: bool, broadcastable to `(B, H, Tq, Tk)`; True = may attend.
        scale: what the scores are multiplied by (`TransformerConfig.attention_scale_factor`); None = 1/sqrt(d_k).
        softcap: `TransformerConfig.attn_logit_softcap`; None = none.
        sinks: one logit per head `(H,)` (`TransformerConfig.attention_sinks`' `{attn}.sinks`); None = none.
        bias: added to the scaled scores before the cap and the mask, broadcastable to `(B, H, Tq, Tk)`, in q's
            dtype (ALiBi's, `alibi.bias`; T5's relative position bias, `relative_position_bias`); None = none.

    Returns:
        `(out, weights)`: `(B, H, Tq, d_v)` and `(B, H, Tq, Tk)`. A query row with no key it may attend to gets
        all-zero weights and hence an all-zero output (not NaN, not a uniform average over padding).
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ np.swapaxes(k, -1, -2)  # (B, H, Tq, Tk)
    if position_scores is not None:
        scores = scores + position_scores
    scores = scores * q.dtype.type(scale)
    if bias is not None:
        scores = scores + bias
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    if mask is None and sinks is None:
        weights = softmax(scores)
    else:
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        row_max = scores.max(axis=-1, keepdims=True)
        sink = None if sinks is None else np.asarray(sinks, scores.dtype).reshape(-1, 1, 1)  # (H, 1, 1)
        if sink is not None:
            row_max = np.maximum(row_max, sink)
        row_max = np.where(np.isfinite(row_max), row_max, 0)  # fully masked rows: avoid inf - inf
        e = np.exp(scores - row_max)  # exp(-inf) = 0 exactly
        total = e.sum(axis=-1, keepdims=True)
        if sink is not None:
            total = total + np.exp(sink - row_max)  # the sink's column, then dropped
        weights = e / np.where(total > 0, total, 1)
        if empty_rows == "average":
            weights = np.where(total > 0, weights, q.dtype.type(1.0 / k.shape[-2]))
    return weights @ v, weights


def repeat_kv(x: np.ndarray, groups: int) -> np.ndarray:
    """`(B, KV, T, d)` -> `(B, KV * groups, T, d)`: query head h reads key/value head h // groups (grouped-query
    attention, transformers' `repeat_kv`)."""
    return x if groups == 1 else np.repeat(x, groups, axis=1)


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    b, t, d = x.shape
    return x.reshape(b, t, num_heads, d // num_heads).transpose(0, 2, 1, 3)  # (B, T, D) -> (B, H, T, d_k)


def merge_heads(x: np.ndarray) -> np.ndarray:
    b, h, t, dk = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * dk)  # (B, H, T, d_k) -> (B, T, D)
