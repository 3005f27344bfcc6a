"""The Keras layers below the model: the attention layer with its key/value caches, the feed-forward, the norms,
rotary positions and the encoder and decoder layers, class for class as in `reference_numpy.model` and
`torch_impl.model`; `tf_impl.model` builds the embeddings, the stacks and the model from them."""

from __future__ import annotations

import math

from .startup import tf  # noqa: I001 (before keras: its import loads TensorFlow)
import keras  # noqa: E402
from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice

import reference_numpy as rn
from reference_numpy import TransformerConfig

from .attention import IMPLS, scaled_dot_product_attention
from .moe import MixtureOfExperts


Record = dict  # canonical sublayer name -> tensor, in execution order


class AttentionCache:
    """The keys and values one attention layer has computed so far, for incremental decoding.

    `static` (encoder-decoder attention): computed from the memory on the first call, reused afterwards.
    Otherwise (causal self-attention) each call adds the keys and values of its new positions: appended (the
    growing form, eager or dynamic shapes), or, in the fixed-size form (`index` set), written into preallocated
    `(B, H, T_max, d_k)` buffers at position `index`, so that shapes stay static under XLA.
    """

    def __init__(self, static: bool):
        self.static = static
        self.k: tf.Tensor | None = None  # (B, H, T_cached, d_k); fixed-size form: (B, H, T_max, d_k)
        self.v: tf.Tensor | None = None  # (B, H, T_cached, d_k); fixed-size form: (B, H, T_max, d_k)
        self.index: tf.Tensor | None = None  # fixed-size form: where this call's keys and values go (scalar int32)


class KVCache:
    """Incremental-decoding state of a decoder: per layer `(self_attn, cross_attn)` caches, plus the key mask of
    the target positions processed so far. Make one per source batch with `Transformer.new_cache()`.

    The fixed-size form (`new_cache(batch_size, length)`, for `tf.function(jit_compile=True)`): the self-attention
    buffers and the key mask cover all `length` positions from the start, False where nothing is written yet, and
    `index` counts the positions written.
    """

    def __init__(self, num_layers: int, cross_attention: bool = True):
        self.layers = [(AttentionCache(static=False), AttentionCache(static=True) if cross_attention else None)
                       for _ in range(num_layers)]
        self.key_mask: tf.Tensor | None = None  # (B, T_done) bool, True = real token; fixed-size: (B, T_max)
        self.index: tf.Tensor | None = None  # fixed-size form only: positions written so far (scalar int32)

    @classmethod
    def fixed(cls, num_layers: int, cross_attention: bool, batch_size: int, length: int, num_heads: int,
              head_dim: int, dtype) -> "KVCache":
        """Zeroed self-attention buffers `(B, H, length, d_k)` (`num_heads`: the key/value heads), an all-False key
        mask and `index` 0."""
        cache = cls(num_layers, cross_attention)
        for self_attn, _ in cache.layers:
            self_attn.k = tf.zeros((batch_size, num_heads, length, head_dim), dtype)  # (B, H, T_max, d_k)
            self_attn.v = tf.zeros((batch_size, num_heads, length, head_dim), dtype)  # (B, H, T_max, d_k)
        cache.key_mask = tf.zeros((batch_size, length), tf.bool)  # (B, T_max)
        cache.index = tf.constant(0, tf.int32)
        return cache

    @property
    def length(self):
        """Target positions already decoded (the position offset of the next call): an int, or a scalar tensor
        inside `tf.function` when the cached length is dynamic (see `tf_impl.decoding.cached_stepper`) and in the
        fixed-size form."""
        if self.index is not None:
            return self.index
        if self.key_mask is None:
            return 0
        static = self.key_mask.shape[1]
        return int(static) if static is not None else tf.shape(self.key_mask)[1]


def check_features(layer: str, arg: str, shape, d_model: int) -> None:
    if shape is None or len(shape) != 3 or (shape[-1] is not None and shape[-1] != d_model):
        raise ValueError(f"{layer}: {arg} must have shape (batch, length, d_model={d_model}), received shape "
                         f"{None if shape is None else tuple(shape)}")


def _gelu(x: tf.Tensor) -> tf.Tensor:
    """The exact GELU, x * Phi(x) in the erf form.

    Not `tf.nn.gelu(approximate=False)` (nor Keras's gelu, which calls it): it casts its Python constant 1/sqrt(2)
    to float32 before the input's dtype, a 5e-9 error in float64, fifty times the float64 tolerance.
    """
    return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


@tf.custom_gradient
def _gelu_tanh(x: tf.Tensor):
    """GELU's tanh approximation (GPT-2's `gelu_new`), written out for the same reason as `_gelu`: Python constants
    here take the input's dtype, so float64 stays float64 throughout.

    The derivative is written out too, from `x` and the tanh: autodiff of the written-out product keeps more
    intermediates, which under XLA costs one more pass over the `(B, T, d_ff)` activations per layer (gpt2-256's
    training step: 12 such fusions instead of 8, 1-2% of the step on CPU).
    """
    c = math.sqrt(2.0 / math.pi)
    t = tf.math.tanh(c * (x + 0.044715 * x * x * x))

    def grad(upstream):  # a sum of two products, as autodiff's: XLA then keeps the bias gradient a fast reduction
        return upstream * (0.5 * (1.0 + t)) + upstream * (0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x))

    return 0.5 * x * (1.0 + t), grad


ACTIVATIONS = {"relu": tf.nn.relu, "gelu": _gelu, "gelu_tanh": _gelu_tanh, "silu": tf.nn.silu}


class ConfigSerializable:
    """`get_config`/`from_config` for a layer built from a `TransformerConfig` plus the constructor arguments named
    in `_CONFIG_ARGS` (stored as attributes of the same names)."""

    _CONFIG_ARGS: tuple[str, ...] = ()

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                **{arg: getattr(self, arg) for arg in self._CONFIG_ARGS}}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(TransformerConfig.from_dict(config.pop("config")), **config)


class RMSNorm(keras.layers.Layer):
    """x / sqrt(mean(x^2) + eps) * (offset + gamma): Llama's RMSNorm (offset 0), Gemma's (offset 1)."""

    def __init__(self, epsilon: float, offset: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.epsilon, self.offset = epsilon, offset

    def build(self, x_shape):
        self.gamma = self.add_weight(shape=(x_shape[-1],), initializer="ones", name="gamma")  # (D,)

    def call(self, x):
        scale = self.gamma + self.offset if self.offset else self.gamma
        return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + self.epsilon) * scale

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon, "offset": self.offset}


def norm_layer(config: TransformerConfig, name: str, dtype, eps: float | None = None) -> keras.layers.Layer:
    """The model's norm: `LayerNormalization` with the config's epsilon (Keras defaults to 1e-3; the reference uses
    the config's, PyTorch's 1e-5 by default; without gamma and beta under `norm_affine=False`, without beta under
    `norm_bias=False`), or `RMSNorm` under `norm="rms"`."""
    eps = config.layer_norm_eps if eps is None else eps
    if config.norm == "rms":
        return RMSNorm(eps, config.norm_weight_offset, dtype=dtype, name=name)
    affine = config.norm_affine
    return keras.layers.LayerNormalization(epsilon=eps, center=affine and config.norm_bias, scale=affine, dtype=dtype,
                                           name=name)


def rotate(x, start, config: TransformerConfig, local: bool = False):
    """Rotary positions on `x` `(B, H, T, d_k)` at positions `start .. start + T - 1` (`start` an int or a scalar
    tensor), for a sequence of `start + T` positions (its length picks longrope's factors): the first
    `rotary_dim` dims turn as two halves (transformers' `rotate_half`) or as adjacent pairs (`rotary_interleaved`),
    the rest pass through. The angles are computed in float32 at least. `local`: at a sliding layer's own base (`local_rope_theta`)."""
    t = tf.shape(x)[2]
    inv_freq, scaling = rn.ops.rope_frequencies(config, 0, local=local)
    params = {} if local else config.rope_scaling or {}
    dtype = x.dtype if x.dtype in (tf.float32, tf.float64) else tf.float32
    inv = tf.constant(inv_freq, dtype)  # (r/2,)
    if params.get("rope_type") == "longrope":  # the long factors once the sequence passes the original length
        threshold = params["original_max_position_embeddings"]
        long_freq, _ = rn.ops.rope_frequencies(config, threshold + 1)
        inv = tf.where(start + t > threshold, tf.constant(long_freq, dtype), inv)
    positions = tf.cast(tf.range(t) + start, dtype)
    freqs = positions[:, None] * inv[None, :]  # (T, r/2)
    r = config.rotary_dim
    rot, rest = x[..., :r], x[..., r:]
    if config.rotary_interleaved:  # GPT-J's rotate_every_two: dims 2j and 2j + 1 turn together by angle j
        angles = tf.reshape(tf.repeat(freqs[:, :, None], 2, axis=-1), [t, r])  # (T, r/2, 2) -> (T, r)
        pairs = tf.stack([-rot[..., 1::2], rot[..., ::2]], axis=-1)  # (B, H, T, r/2, 2)
        rotated = tf.reshape(pairs, tf.shape(rot))
        rotated.set_shape(rot.shape)  # the reshape keeps no static shape
    else:
        angles = tf.concat([freqs, freqs], axis=-1)  # (T, r)
        rotated = tf.concat([-rot[..., r // 2:], rot[..., :r // 2]], axis=-1)  # rotate_half
    cos = tf.cast(tf.cos(angles) * scaling, x.dtype)
    sin = tf.cast(tf.sin(angles) * scaling, x.dtype)
    return tf.concat([rot * cos + rotated * sin, rest], axis=-1)


def relative_position_bias(table, config: TransformerConfig, bidirectional: bool, query_len, key_len, first=None):
    """T5's relative position bias `(1, H, Tq, Tk)` from a stack's table `(buckets, H)`: the queries sit at `first`
    onwards (default `Tk - Tq`: the last Tq positions; a fixed-size cache passes where it writes). The buckets are
    the reference's (`rn.ops.relative_bucket_table`), gathered by distance, so lengths may be tensors."""
    first = key_len - query_len if first is None else first
    queries = tf.range(query_len) + first  # (Tq,) positions
    relative = tf.range(key_len)[None, :] - queries[:, None]  # (Tq, Tk)
    buckets = tf.gather(tf.constant(rn.ops.relative_bucket_table(config, bidirectional), tf.int32),
                        relative + (config.max_len - 1))
    return tf.transpose(tf.gather(tf.convert_to_tensor(table), buckets), (2, 0, 1))[None]  # (Tq, Tk, H) -> (1, H, ..)


def _summed(a, b):
    """The sum of two optional score biases (ALiBi's, T5's): either one alone, or None."""
    return b if a is None else a if b is None else a + b


class MultiHeadAttention(ConfigSerializable, keras.layers.Layer):
    """Multi-head attention (section 3.2.2): self-attention when `x_q is x_kv`, else encoder-decoder attention.

    Args:
        config: the hyperparameters.
        impl: attention path, `explicit` or `keras` (see `tf_impl.attention`). A plain attribute: set `layer.impl`
            to switch; a `tf.function` keeps the value it was traced with.
        rotary: whether rotary positions turn q and k (`positional="rope"`); `local_rope`: at a sliding layer's own
            base, `local_rope_theta`.
        relative: an encoder's self-attention under `relative_terms` (DeBERTa): the disentangled position terms
            join the scores, from the relative positions' table the caller passes, projected by `pos_k` / `pos_q`
            (by `k` / `q` under `relative_shares_qk`).
    """

    _CONFIG_ARGS = ("impl", "rotary", "local_rope", "relative")

    def __init__(self, config: TransformerConfig, impl: str = "explicit", rotary: bool = False,
                 local_rope: bool = False, relative: bool = False, **kwargs):
        super().__init__(**kwargs)
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, received {impl!r}")
        self.config, self.impl, self.rotary = config, impl, rotary and config.positional == "rope"
        self.local_rope = local_rope
        inner, kv = config.num_heads * config.head_dim, config.kv_heads * config.head_dim
        qkv = dict(use_bias=config.has_qkv_bias, dtype=self.dtype_policy)
        self.q = keras.layers.Dense(inner, **qkv, name="q")
        self.k = keras.layers.Dense(kv, **qkv, name="k")
        self.v = keras.layers.Dense(kv, **qkv, name="v")
        self.o = keras.layers.Dense(config.d_model, use_bias=config.has_o_bias, dtype=self.dtype_policy, name="o")
        self.relative = relative
        own = relative and config.relative_terms is not None and not config.relative_shares_qk
        self.pos_k = keras.layers.Dense(inner, **qkv, name="pos_k") if own and "c2p" in config.relative_terms else None
        self.pos_q = keras.layers.Dense(inner, **qkv, name="pos_q") if own and "p2c" in config.relative_terms else None
        self.all_heads_norm = config.qk_norm and config.qk_norm_over == "all"  # before the split into heads (OLMo 2)
        self.q_norm = norm_layer(config, "q_norm", self.dtype_policy, config.qk_norm_eps) if config.qk_norm else None
        self.k_norm = norm_layer(config, "k_norm", self.dtype_policy, config.qk_norm_eps) if config.qk_norm else None
        self.seed_generator = keras.random.SeedGenerator(name="attention_dropout") if config.dropout > 0 else None
        self.sinks = None  # (H,) under attention_sinks, made in build

    def build(self, x_q_shape, x_kv_shape):
        d = self.config.d_model
        check_features(self.name, "x_q", x_q_shape, d)
        check_features(self.name, "x_kv", x_kv_shape, d)
        self.q.build(x_q_shape)
        self.k.build(x_kv_shape)
        self.v.build(x_kv_shape)
        self.o.build((*x_q_shape[:-1], self.config.num_heads * self.config.head_dim))
        for proj in (self.pos_k, self.pos_q):
            if proj is not None:
                proj.build((None, d))
        c = self.config
        if c.attention_sinks:  # the layer's own variable: `self_attn/vars/0` in a .weights.h5
            self.sinks = self.add_weight(shape=(c.num_heads,), initializer="zeros", name="sinks")
        for norm, heads in ((self.q_norm, c.num_heads), (self.k_norm, c.kv_heads)):
            if norm is not None:
                norm.build((None, None, heads * c.head_dim) if self.all_heads_norm else (None, None, None, c.head_dim))

    def call(self, x_q, x_kv, attention_mask=None, need_weights: bool = False, training: bool = False,
             cache: AttentionCache | None = None, relative=None, position_bias=None):
        """`(B, Tq, D)` queries, `(B, Tk, D)` keys/values, bool mask broadcastable to `(B, H, Tq, Tk)` ->
        `(out, weights)`: `(B, Tq, D)` and `(B, H, Tq, Tk)` (None unless `need_weights`). `cache`: see
        `AttentionCache`; the mask must then cover the cached keys too. `relative`: DeBERTa's relative positions'
        table `(2 span, D)`, normed, or None. `position_bias` `(1, H, Tq, Tk)`: T5's relative position bias
        (`relative_position_bias`), added to the scaled scores."""
        b, tq = tf.shape(x_q)[0], tf.shape(x_q)[1]
        c = self.config
        h, kvh, dk = c.num_heads, c.kv_heads, c.head_dim
        q = tf.transpose(tf.reshape(self._flat(self.q(x_q), self.q_norm), (b, tq, h, dk)), (0, 2, 1, 3))  # (B,H,Tq,dk)
        if self.q_norm is not None and not self.all_heads_norm:
            q = self.q_norm(q)
        fixed = cache is not None and cache.index is not None
        if cache is not None and cache.static and cache.k is not None:
            k, v = cache.k, cache.v  # the memory's keys and values, from the first decoding step
        else:
            k = tf.transpose(tf.reshape(self._flat(self.k(x_kv), self.k_norm), (b, -1, kvh, dk)), (0, 2, 1, 3))
            v = tf.transpose(tf.reshape(self._flat(self.v(x_kv), None), (b, -1, kvh, dk)), (0, 2, 1, 3))
            if self.k_norm is not None and not self.all_heads_norm:  # k, v: (B, KV, Tk, d_k)
                k = self.k_norm(k)
            if self.rotary:  # the new keys' positions: after those cached (stored turned)
                start = cache.index if fixed else (
                    tf.shape(cache.k)[2] if cache is not None and cache.k is not None else 0)
                k = rotate(k, start, c, self.local_rope)
            if cache is not None:
                if cache.index is not None:  # fixed-size: a static-shape write (XLA's dynamic_update_slice)
                    at = [0, 0, cache.index, 0]
                    k = dynamic_update_slice(cache.k, k, at)  # (B, H, T_max, d_k)
                    v = dynamic_update_slice(cache.v, v, at)  # (B, H, T_max, d_k)
                elif not cache.static and cache.k is not None:
                    k = tf.concat([cache.k, k], axis=2)  # (B, H, T_cached + Tk, d_k)
                    v = tf.concat([cache.v, v], axis=2)  # (B, H, T_cached + Tk, d_k)
                cache.k, cache.v = k, v
        if self.rotary:  # the queries: at the cache's write position, else the last Tq of the keys
            q = rotate(q, cache.index if fixed else tf.shape(k)[2] - tq, c, self.local_rope)
        if kvh != h:  # query head i reads key/value head i // groups
            k, v = tf.repeat(k, h // kvh, axis=1), tf.repeat(v, h // kvh, axis=1)  # (B, H, Tk, d_k)
        out, weights = scaled_dot_product_attention(
            q, k, v, attention_mask, need_weights=need_weights, impl=self.impl, dropout_p=c.dropout,
            training=training, seed=self.seed_generator, scale=c.attention_scale_factor, softcap=c.attn_logit_softcap,
            position_scores=None if relative is None else self._position_scores(q, k, relative),
            empty_rows="average" if c.padded_queries == "average" else "zero", sinks=self.sinks,
            bias=_summed(self._alibi(k), position_bias))
        out = tf.reshape(tf.transpose(out, (0, 2, 1, 3)), (b, tq, h * dk))  # (B, H, Tq, d_k) -> (B, Tq, D)
        return self.o(out), (weights if need_weights else None)

    def _position_scores(self, q, k, relative):
        """DeBERTa's position terms `(B, H, Tq, Tk)` before the scale (`reference_numpy.ops.disentangled_scores`):
        q_i . pos_k[index[i, j]] (c2p) plus k_j . pos_q[index[i, j]] (p2c)."""
        c = self.config
        h, dk = c.num_heads, c.head_dim
        b, tq, tk = tf.shape(q)[0], tf.shape(q)[2], tf.shape(k)[2]
        index = relative_position_index(c, tq, tk)  # (Tq, Tk)
        scores = tf.zeros((b, h, tq, tk), dtype=q.dtype)
        if "c2p" in c.relative_terms:
            pos_k = tf.transpose(tf.reshape((self.pos_k or self.k)(relative), (-1, h, dk)), (1, 0, 2))  # (H, 2s, dk)
            c2p = tf.matmul(q, pos_k, transpose_b=True)  # (B, H, Tq, 2 span)
            scores += tf.gather(c2p, tf.broadcast_to(index, (b, h, tq, tk)), axis=3, batch_dims=3)
        if "p2c" in c.relative_terms:
            pos_q = tf.transpose(tf.reshape((self.pos_q or self.q)(relative), (-1, h, dk)), (1, 0, 2))  # (H, 2s, dk)
            p2c = tf.matmul(k, pos_q, transpose_b=True)  # (B, H, Tk, 2 span)
            gathered = tf.gather(p2c, tf.broadcast_to(tf.transpose(index), (b, h, tk, tq)), axis=3, batch_dims=3)
            scores += tf.transpose(gathered, (0, 1, 3, 2))  # (B, H, Tk, Tq) -> (B, H, Tq, Tk)
        return scores

    def _alibi(self, k):
        """ALiBi's bias `(H, 1, Tk)` for the keys `k` `(B, H, Tk, d_k)` (positions 0 .. Tk-1, cached ones first; a
        fixed-size cache's slot is its position), in k's dtype; None without `alibi`. The reference's table over
        `max_len` positions (a constant), cut to the keys: the same numbers as the reference's."""
        c = self.config
        if not c.alibi:
            return None
        table = tf.constant(rn.alibi.bias(c, c.max_len), k.dtype)  # (H, 1, max_len)
        return table[:, :, :tf.shape(k)[2]]  # (H, 1, Tk)

    def _flat(self, x, norm):
        """A projection `(B, T, heads*d_k)` clamped (`clip_qkv`) and, under `qk_norm_over="all"`, normalized."""
        clip = self.config.clip_qkv
        if clip is not None:
            x = tf.clip_by_value(x, tf.constant(-clip, x.dtype), tf.constant(clip, x.dtype))
        return norm(x) if norm is not None and self.all_heads_norm else x


def relative_position_index(config: TransformerConfig, query_len, key_len) -> tf.Tensor:
    """`(Tq, Tk)` int32 rows of DeBERTa's relative positions' table (`reference_numpy.ops.relative_position_index`,
    the log buckets in float64 too), for lengths that may be scalar tensors."""
    relative = tf.range(query_len)[:, None] - tf.range(key_len)[None, :]  # (Tq, Tk)
    if config.relative_buckets:
        mid = config.relative_buckets // 2
        near = tf.logical_and(relative < mid, relative > -mid)
        distance = tf.cast(tf.where(near, mid - 1, tf.abs(relative)), tf.float64)
        log_pos = tf.math.ceil(tf.math.log(distance / mid) / math.log((config.max_relative_positions - 1) / mid)
                               * (mid - 1)) + mid
        log_pos = tf.where(tf.math.is_finite(log_pos), log_pos, tf.zeros_like(log_pos))  # mid = 1: never read
        relative = tf.where(distance <= mid, relative, tf.cast(log_pos, tf.int32) * tf.sign(relative))
    span = config.relative_span
    return tf.clip_by_value(relative + span, 0, 2 * span - 1)


class FeedForward(ConfigSerializable, keras.layers.Layer):
    """FFN(x) = act(x W1 + b1) W2 + b2 (section 3.3); gated (`ffn_gated`): (act(x Wg + bg) * (x W1 + b1)) W2 + b2,
    the clamped GLU where `glu_limit`, `glu_alpha` and `glu_up_offset` say (`reference_numpy.ops.clamped_glu`)."""

    _CONFIG_ARGS = ("width",)

    def __init__(self, config: TransformerConfig, width: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.config, self.width = config, width  # width: inner features (None: d_ff; a mixture's expert: its own)
        dense = dict(use_bias=config.has_ffn_bias, dtype=self.dtype_policy)
        self.gate = keras.layers.Dense(width or config.d_ff, **dense, name="gate") if config.ffn_gated else None
        self.linear1 = keras.layers.Dense(width or config.d_ff, **dense, name="linear1")
        self.linear2 = keras.layers.Dense(config.d_model, **dense, name="linear2")
        self.dropout = keras.layers.Dropout(config.dropout, dtype=self.dtype_policy, name="dropout")
        self.activation = ACTIVATIONS[config.activation]

    def build(self, x_shape):
        check_features(self.name, "x", x_shape, self.config.d_model)
        if self.gate is not None:
            self.gate.build(x_shape)
        self.linear1.build(x_shape)
        self.linear2.build((*x_shape[:-1], self.width or self.config.d_ff))

    def call(self, x, training: bool = False):
        hidden = self.linear1(x)
        hidden = self.activation(hidden) if self.gate is None else self._glu(self.gate(x), hidden)
        return self.linear2(self.dropout(hidden, training=training))

    def _glu(self, gate, up):
        c = self.config  # constants in the features' dtype: float64 stays float64
        if c.glu_limit is not None:
            limit = tf.constant(c.glu_limit, gate.dtype)
            gate, up = tf.minimum(gate, limit), tf.clip_by_value(up, -limit, limit)
        if c.glu_up_offset:
            up = up + tf.constant(c.glu_up_offset, up.dtype)
        if c.glu_alpha == 1.0:
            return self.activation(gate) * up
        return gate * tf.sigmoid(gate * tf.constant(c.glu_alpha, gate.dtype)) * up


class _ResidualLayer(ConfigSerializable, keras.layers.Layer):
    """Shared residual wiring of EncoderLayer and DecoderLayer: post-LN `norm(x + drop(f(x)))` (the paper) or
    pre-LN `x + drop(f(norm(x)))`, with `post_norms` `x + drop(post_norm(f(norm(x))))` (Gemma 2/3; the post norm's
    output recorded under its own name)."""

    _CONFIG_ARGS = ("impl",)

    def _norm(self, name: str) -> keras.layers.Layer:
        return norm_layer(self.config, name, self.dtype_policy)

    def _post_norm(self, name: str) -> keras.layers.Layer | None:
        return self._norm(name) if self.config.post_norms else None

    def _pre_norm(self, name: str) -> keras.layers.Layer | None:
        return self._norm(name) if self.config.pre_norms else None  # none before the sublayers: OLMo 2

    @staticmethod
    def _build_norms(x_shape, norm, post_norm) -> None:
        """A sublayer's norm, then its post norm if it has one (in creation order)."""
        if norm is not None:
            norm.build(x_shape)
        if post_norm is not None:
            post_norm.build(x_shape)

    def _sublayer(self, x, norm, fn, name, record, attention_weights, training, post_norm=None):
        out = fn(norm(x) if self.config.norm_first and norm is not None else x)
        if isinstance(out, tuple):
            out, weights = out
            if attention_weights:
                record[f"{name}.weights"] = weights
        record[name] = out
        if post_norm is not None:
            out = record[post_norm.name] = post_norm(out)
        out = self.dropout(out, training=training)
        if self.config.residual_multiplier != 1.0:  # Granite
            out = out * tf.constant(self.config.residual_multiplier, out.dtype)
        return x + out if self.config.norm_first else norm(x + out)


class EncoderLayer(_ResidualLayer):
    """Self-attention and feed-forward sublayers. `call(x, attention_mask)` -> `(x, record)`, `record` holding
    `self_attn` (and `self_attn.weights`) and `ffn`. `index`: which encoder layer it is, for its kind (`kind`: the
    mask it takes), its rotary base and, at 0, whether its attention has a norm (`first_attn_norm`)."""

    _CONFIG_ARGS = ("impl", "index")

    def __init__(self, config: TransformerConfig, impl: str = "explicit", index: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.config, self.impl, self.index, self.kind = config, impl, index, config.encoder_layer_kind(index)
        self.self_attn = MultiHeadAttention(config, impl, rotary=True, relative=True,
                                            local_rope=config.encoder_local_rope(index), dtype=self.dtype_policy,
                                            name="self_attn")
        self.norm1 = self._pre_norm("norm1") if index > 0 or config.first_attn_norm else None
        self.post_attn_norm = self._post_norm("post_attn_norm")
        self.ffn = FeedForward(config, dtype=self.dtype_policy, name="ffn")
        self.norm2 = self._pre_norm("norm2")
        self.post_ffn_norm = self._post_norm("post_ffn_norm")
        self.dropout = keras.layers.Dropout(config.dropout, dtype=self.dtype_policy, name="dropout")

    def build(self, x_shape):
        check_features(self.name, "x", x_shape, self.config.d_model)
        self.self_attn.build(x_shape, x_shape)
        self._build_norms(x_shape, self.norm1, self.post_attn_norm)
        self.ffn.build(x_shape)
        self._build_norms(x_shape, self.norm2, self.post_ffn_norm)

    def call(self, x, attention_mask=None, attention_weights: bool = False, training: bool = False, relative=None,
             position_bias=None):
        """`relative`: DeBERTa's relative positions' table `(2 span, D)`, normed (`Encoder.relative_table`);
        `position_bias`: T5's relative position bias `(1, H, S, S)`."""
        record: Record = {}
        x = self._sublayer(x, self.norm1, lambda y: self.self_attn(y, y, attention_mask, need_weights=attention_weights,
                                                                   training=training, relative=relative,
                                                                   position_bias=position_bias),
                           "self_attn", record, attention_weights, training, self.post_attn_norm)
        x = self._sublayer(x, self.norm2, lambda y: self.ffn(y, training=training), "ffn", record, attention_weights,
                           training, self.post_ffn_norm)
        return x, record


class DecoderLayer(_ResidualLayer):
    """Masked self-attention, encoder-decoder attention (absent in a decoder-only model) and feed-forward sublayers.
    `call(x, memory, self_mask, cross_mask)` -> `(x, record)`, `record` holding `self_attn`, `cross_attn` (and their
    `.weights`) and `ffn` (and, under `post_norms`, the post norms' outputs). `index`: which decoder layer it is,
    for its kind (`kind`: the self-attention mask it takes) and its rotary positions."""

    _CONFIG_ARGS = ("impl", "index")

    def __init__(self, config: TransformerConfig, impl: str = "explicit", index: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.config, self.impl, self.index, self.kind = config, impl, index, config.layer_kind(index)
        self.self_attn = MultiHeadAttention(config, impl, rotary=config.layer_rotary(index),
                                            local_rope=config.layer_local_rope(index), dtype=self.dtype_policy,
                                            name="self_attn")
        self.norm1 = self._pre_norm("norm1")
        self.post_attn_norm = self._post_norm("post_attn_norm")
        self.cross_attn = self.norm2 = self.post_cross_attn_norm = None
        if config.has_encoder:  # a decoder-only model has no encoder-decoder attention
            self.cross_attn = MultiHeadAttention(config, impl, dtype=self.dtype_policy, name="cross_attn")
            self.norm2 = self._pre_norm("norm2")
            self.post_cross_attn_norm = self._post_norm("post_cross_attn_norm")
        self.ffn = (MixtureOfExperts(config, FeedForward, dtype=self.dtype_policy, name="ffn")
                    if config.layer_experts(index) else FeedForward(config, dtype=self.dtype_policy, name="ffn"))
        self.norm3 = None if config.ffn_shares_norm else self._pre_norm("norm3")
        self.post_ffn_norm = self._post_norm("post_ffn_norm")
        self.dropout = keras.layers.Dropout(config.dropout, dtype=self.dtype_policy, name="dropout")

    def build(self, x_shape, memory_shape=None):
        d = self.config.d_model
        check_features(self.name, "x", x_shape, d)
        self.self_attn.build(x_shape, x_shape)
        self._build_norms(x_shape, self.norm1, self.post_attn_norm)
        if self.cross_attn is not None:
            check_features(self.name, "memory", memory_shape, d)
            self.cross_attn.build(x_shape, memory_shape)
            self._build_norms(x_shape, self.norm2, self.post_cross_attn_norm)
        self.ffn.build(x_shape)
        self._build_norms(x_shape, self.norm3, self.post_ffn_norm)  # norm3 None: the FFN reads norm1 or no norm

    def call(self, x, memory, self_mask=None, cross_mask=None, attention_weights: bool = False,
             training: bool = False, cache: tuple[AttentionCache, AttentionCache] | None = None,
             position_bias=None):
        record: Record = {}
        self_cache, cross_cache = (None, None) if cache is None else cache
        if self.config.parallel_residual:
            return self._parallel(x, self_mask, record, attention_weights, training, self_cache,
                                  position_bias), record
        x = self._sublayer(x, self.norm1, lambda y: self.self_attn(y, y, self_mask, need_weights=attention_weights,
                                                                   training=training, cache=self_cache,
                                                                   position_bias=position_bias),
                           "self_attn", record, attention_weights, training, self.post_attn_norm)
        if self.cross_attn is not None:
            x = self._sublayer(x, self.norm2, lambda y: self.cross_attn(y, memory, cross_mask,
                                                                        need_weights=attention_weights,
                                                                        training=training, cache=cross_cache),
                               "cross_attn", record, attention_weights, training, self.post_cross_attn_norm)
        x = self._sublayer(x, self.norm3, lambda y: self._ffn(y, record, training), "ffn", record, attention_weights,
                           training, self.post_ffn_norm)
        return x, record

    def _parallel(self, x, self_mask, record: Record, attention_weights: bool, training: bool, cache,
                  position_bias=None):
        """`parallel_residual`: x + attn(norm1(x)) + ffn(norm3(x)), the feed-forward reading norm1(x) under
        `ffn_shares_norm` (one norm, computed once)."""
        y = self.norm1(x)
        attn, weights = self.self_attn(y, y, self_mask, need_weights=attention_weights, training=training,
                                       cache=cache, position_bias=position_bias)
        if attention_weights:
            record["self_attn.weights"] = weights
        record["self_attn"] = attn
        ffn = record["ffn"] = self._ffn(y if self.norm3 is None else self.norm3(x), record, training)
        return x + self.dropout(attn, training=training) + self.dropout(ffn, training=training)

    def _ffn(self, y, record: Record, training: bool):
        """The feed-forward; a mixture of experts also gives the experts each token chose (`ffn.routing`)."""
        out = self.ffn(y, training=training)
        if isinstance(out, tuple):
            out, record["ffn.routing"] = out
        return out
