"""The Transformer as Keras 3 layers, class for class the same as `reference_numpy.model` and `torch_impl.model`.

Weights enter and leave only through the canonical form: `Transformer.from_reference(config, weights)` and
`model.to_reference()`, via its table `weight_table(config)` over the Keras variable paths.

Differences from torch_impl that Keras asks for: a layer's `call()` returns its sublayer outputs as a dict next to
its result (Keras rebuilds nested arguments, so a record dict passed in would not be filled in place), and the
attention mask argument is called `attention_mask` (Keras gives an argument named `mask` a meaning of its own).
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Mapping

import numpy as np
from .startup import tf  # noqa: I001 (before keras: its import loads TensorFlow)
import keras  # noqa: E402
from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice

import reference_numpy as rn
from reference_numpy import TransformerConfig
from reference_numpy.schema import tied_output_embedding, token_embedding

from .attention import causal_mask
from .layers import (ACTIVATIONS, AttentionCache, ConfigSerializable, DecoderLayer,  # noqa: F401 (the API)
                     EncoderLayer, FeedForward, KVCache, MultiHeadAttention, Record, check_features, norm_layer,
                     relative_position_bias)

# Canonical modules whose Keras layer is named differently; every other module carries its canonical name, with
# `/` for `.` and a list's items as `layers_{i}` (a mixture's experts: `experts_{e}`). Keras Dense kernels are
# already (in, out): every transform is the identity.
_LAYERS = {"src_embed": "src_embed/token", "tgt_embed": "tgt_embed/token", "src_pos": "src_embed/position",
           "tgt_pos": "tgt_embed/position", "src_type": "src_embed/segment", "src_embed_norm": "src_embed/norm",
           "tgt_embed_norm": "tgt_embed/norm", "pooler": "pooler/dense", "src_embed_proj": "src_embed/proj"}
_LAYER_ITEM = re.compile(r"\.(layers|experts)\.(\d+)\.")


def weight_table(config: TransformerConfig) -> list[tuple[str, str, str]]:
    """canonical name -> Keras variable path below the model, in the mapping language (`reference_numpy.mapping`),
    for every parameter of `config`: the only place the two naming schemes meet."""
    table = []
    for name in rn.parameter_shapes(config):
        module, leaf = name.rsplit(".", 1)
        if name in ("src_embed.bias", "tgt_embed.bias"):
            path = name.replace(".", "/")  # the Embedding layer's own variable
        else:
            module = _LAYERS.get(module) or _LAYER_ITEM.sub(r"/\1_\2/", module).replace(".", "/")
            path = f"{module}/{'embeddings' if leaf == 'embedding' else leaf}"
        table.append((name, path, "identity"))
    return table


DTYPES = ("float32", "float64")
LOW_PRECISION = ("bfloat16", "float16", "mixed_bfloat16", "mixed_float16")  # dtype policies for `verify --dtype`


class Embedding(ConfigSerializable, keras.layers.Layer):
    """One side's (`src` or `tgt`) input embedding: token embedding (plus its bias if `embed_bias`: what one-hot ids
    through a `Linear(vocab, d_model)` compute), times sqrt(d_model) if `scale_embedding`,
    plus segment embeddings (source side, `type_vocab_size`), plus sinusoidal or learned positions, then a LayerNorm
    if `embed_norm`, then (ALBERT's `embedding_size`) a projection to d_model, then (`embed_zero_padding`) zeros
    where `mask` `(B, T)` (default: the ids' padding) is False, then dropout (torch_impl applies the
    same dropout just after its Embedding). Positions start at `offset`; learned ones read row `offset +
    position_offset` onwards (under `positions_skip_pad`, the rows `rn.ops.skip_pad_positions` picks from the ids).
    Under `share_embeddings` the target side has no token table of its own: the caller passes the source's."""

    _CONFIG_ARGS = ("side",)

    def __init__(self, config: TransformerConfig, side: str, **kwargs):
        super().__init__(**kwargs)
        self.config, self.side = config, side
        own_table = token_embedding(config, side) == f"{side}_embed.embedding"
        vocab_size = config.src_vocab_size if side == "src" else config.tgt_vocab_size
        e = config.embed_width  # d_model, or ALBERT's embedding_size
        self.token = (keras.layers.Embedding(vocab_size, e, dtype=self.dtype_policy, name="token")
                      if own_table else None)
        self.segment = (keras.layers.Embedding(config.type_vocab_size, e, dtype=self.dtype_policy,
                                               name="segment") if side == "src" and config.type_vocab_size else None)
        self.position = self.sinusoid = None  # neither under rotary positions, which turn q and k in attention
        if config.positional == "learned":
            self.position = keras.layers.Embedding(config.position_rows, e, dtype=self.dtype_policy,
                                                   name="position")
        elif config.positional == "sinusoidal":
            # A constant, not a weight: computed once in float64 by the reference, then cast to the compute dtype.
            self.sinusoid = rn.ops.position_sinusoids(config).astype(self.compute_dtype)  # (max_len, D)
        self.norm = (norm_layer(config, "norm", self.dtype_policy) if config.embed_norm else None)
        self.proj = (keras.layers.Dense(config.d_model, use_bias=config.bias, dtype=self.dtype_policy, name="proj")
                     if config.embedding_size is not None else None)  # ALBERT: E -> d_model
        self.dropout = keras.layers.Dropout(config.dropout, dtype=self.dtype_policy, name="dropout")
        self.bias = None  # `embed_bias`: made in build()

    def build(self, ids_shape):
        if ids_shape is None or len(ids_shape) != 2:
            raise ValueError(f"{self.name}: ids must have shape (batch, length), received shape "
                             f"{None if ids_shape is None else tuple(ids_shape)}")
        # The bias is this layer's own variable, created before its sublayers' (its .weights.h5 path: vars/0).
        self.bias = (self.add_weight(shape=(self.config.d_model,), initializer="zeros", name="bias")
                     if self.config.embed_bias else None)  # (D,)
        for layer in (self.token, self.segment, self.position):
            if layer is not None:
                layer.build(ids_shape)
        if self.norm is not None:
            self.norm.build((*ids_shape, self.config.embed_width))
        if self.proj is not None:
            self.proj.build((*ids_shape, self.config.embed_width))

    def call(self, ids, offset=0, type_ids=None, token_table=None, training: bool = False, real=None):
        """`(B, T)` int ids -> `(B, T, D)`; positions start at `offset`. `token_table` `(V, D)`: the shared table
        when this side has none of its own. `real` `(B, T)`: the ids' padding mask, which `embed_zero_padding`
        multiplies by (named so that Keras does not take it for a mask of its own)."""
        x = self.token(ids) if token_table is None else tf.gather(token_table, ids)  # (B, T, D)
        if self.bias is not None:
            x = x + self.bias
        if self.config.scale_embedding:
            x = x * math.sqrt(self.config.d_model)
        if self.config.embedding_multiplier != 1.0:  # Granite
            x = x * tf.constant(self.config.embedding_multiplier, x.dtype)
        if self.segment is not None:  # BERT's order: (token + segment) + position
            x = x + self.segment(tf.zeros_like(ids) if type_ids is None else type_ids)
        # tf.slice with the size given: XLA compiles it for a tensor offset as a static-shape dynamic slice (a
        # `table[offset:offset + t]` slice there comes out of dynamic, padded size)
        size = (tf.shape(ids)[1], self.config.embed_width)
        if self.config.positions_skip_pad:  # RoBERTa, M2M100: rows counted over non-pads
            real = tf.cast(tf.not_equal(ids, tf.cast(self.config.pad_id, ids.dtype)), tf.int32)
            rows = (tf.cumsum(real, axis=1) + tf.cast(offset, tf.int32)) * real + (self.config.position_offset - 1)
            table = self.sinusoid if self.sinusoid is not None else self.position.embeddings
            x = x + tf.gather(tf.convert_to_tensor(table), rows)
        elif self.sinusoid is not None:
            x = x + tf.slice(tf.convert_to_tensor(self.sinusoid), (offset, 0), size)
        elif self.position is not None:
            start = offset + self.config.position_offset
            x = x + tf.slice(tf.convert_to_tensor(self.position.embeddings), (start, 0), size)
        if self.norm is not None:
            x = self.norm(x)
        if self.proj is not None:
            x = self.proj(x)
        if self.config.embed_zero_padding:
            x = x * tf.cast(padding_mask(ids, self.config.pad_id) if real is None else real, x.dtype)[..., None]
        return self.dropout(x, training=training)


def _relative_bias_table(config: TransformerConfig, dtype) -> keras.layers.Embedding | None:
    """T5's relative position bias table of a stack, `(relative_bias_buckets, num_heads)`; None without one."""
    if not config.relative_bias_buckets:
        return None
    return keras.layers.Embedding(config.relative_bias_buckets, config.num_heads, dtype=dtype, name="relative_bias")


class Encoder(ConfigSerializable, keras.layers.Layer):
    """`num_encoder_layers` EncoderLayers (under `shared_layers`, one applied that many times; and a final LayerNorm
    if `final_norm`). `call(x, attention_mask)` -> `(x, record)` with canonical names (`encoder.layers.0.self_attn`,
    ...)."""

    _CONFIG_ARGS = ("impl",)

    def __init__(self, config: TransformerConfig, impl: str = "explicit", name: str = "encoder", **kwargs):
        super().__init__(name=name, **kwargs)
        self.config, self.impl = config, impl
        self.layers = [EncoderLayer(config, impl, i, dtype=self.dtype_policy, name=f"layers_{i}")
                       for i in range(config.encoder_weight_layers)]
        self.final_norm = (norm_layer(config, "final_norm", self.dtype_policy) if config.final_norm else None)
        relative = config.relative_terms is not None  # DeBERTa: the relative positions' table all layers read
        self.rel_embed = (keras.layers.Embedding(2 * config.relative_span, config.d_model, dtype=self.dtype_policy,
                                                 name="rel_embed") if relative else None)
        self.rel_embed_norm = (norm_layer(config, "rel_embed_norm", self.dtype_policy)
                               if relative and config.relative_embed_norm else None)
        self.relative_bias = _relative_bias_table(config, self.dtype_policy)  # T5: one table, read by every layer

    def build(self, x_shape):
        check_features(self.name, "x", x_shape, self.config.d_model)
        for layer in self.layers:
            layer.build(x_shape)
        if self.final_norm is not None:
            self.final_norm.build(x_shape)
        if self.rel_embed is not None:
            self.rel_embed.build((None,))
        if self.rel_embed_norm is not None:
            self.rel_embed_norm.build((None, self.config.d_model))
        if self.relative_bias is not None:
            self.relative_bias.build((None, None))

    def relative_table(self):
        """The relative positions' table `(2 span, D)`, normed where `relative_embed_norm` says; None without."""
        if self.rel_embed is None:
            return None
        table = tf.convert_to_tensor(self.rel_embed.embeddings)
        return table if self.rel_embed_norm is None else self.rel_embed_norm(table)

    def call(self, x, masks=None, attention_weights: bool = False, training: bool = False):
        """`masks`: the self-attention mask of each layer kind the layers use (`encoder_attention_masks`)."""
        record: Record = {}
        relative = self.relative_table()
        t = tf.shape(x)[1]
        bias = None if self.relative_bias is None else relative_position_bias(
            self.relative_bias.embeddings, self.config, True, t, t)
        for i in range(self.config.num_encoder_layers):
            layer = self.layers[min(i, len(self.layers) - 1)]  # shared_layers: the one layer, every time
            x, sublayers = layer(x, masks[layer.kind], attention_weights=attention_weights, training=training,
                                 relative=relative, position_bias=bias)
            record.update({f"{self.name}.layers.{i}.{k}": v for k, v in sublayers.items()})
            record[f"{self.name}.layers.{i}"] = x
        if self.final_norm is not None:
            x = self.final_norm(x)
            record[f"{self.name}.final_norm"] = x
        return x, record


class Decoder(ConfigSerializable, keras.layers.Layer):
    """`num_decoder_layers` DecoderLayers (and a final LayerNorm if `final_norm`). `call(x, memory, self_masks,
    cross_mask)` -> `(x, record)` with canonical names (`decoder.layers.0.self_attn`, ...); `self_masks`: the
    self-attention mask of each layer kind (`sliding`, `full`) the layers use."""

    _CONFIG_ARGS = ("impl",)

    def __init__(self, config: TransformerConfig, impl: str = "explicit", name: str = "decoder", **kwargs):
        super().__init__(name=name, **kwargs)
        self.config, self.impl = config, impl
        self.layers = [DecoderLayer(config, impl, i, dtype=self.dtype_policy, name=f"layers_{i}")
                       for i in range(config.num_decoder_layers)]
        self.final_norm = (norm_layer(config, "final_norm", self.dtype_policy) if config.final_norm else None)
        self.relative_bias = _relative_bias_table(config, self.dtype_policy)  # T5: one table, read by every layer

    def build(self, x_shape, memory_shape=None):
        check_features(self.name, "x", x_shape, self.config.d_model)
        for layer in self.layers:
            layer.build(x_shape, memory_shape)
        if self.final_norm is not None:
            self.final_norm.build(x_shape)
        if self.relative_bias is not None:
            self.relative_bias.build((None, None))

    def call(self, x, memory, self_masks=None, cross_mask=None, attention_weights: bool = False,
             training: bool = False, cache: KVCache | None = None, key_len=None, first=None):
        """`key_len`: the self-attention keys' length (default: the queries'; with a cache, the cached positions
        too); `first`: the first query's position (default `key_len - Tq`; a fixed-size cache's write position)."""
        record: Record = {}
        t = tf.shape(x)[1]
        bias = None if self.relative_bias is None else relative_position_bias(
            self.relative_bias.embeddings, self.config, False, t, t if key_len is None else key_len, first)
        for i, layer in enumerate(self.layers):
            x, sublayers = layer(x, memory, self_masks[layer.kind], cross_mask, attention_weights=attention_weights,
                                 training=training, cache=None if cache is None else cache.layers[i],
                                 position_bias=bias)
            record.update({f"{self.name}.layers.{i}.{k}": v for k, v in sublayers.items()})
            record[f"{self.name}.layers.{i}"] = x
        if self.final_norm is not None:
            x = self.final_norm(x)
            record[f"{self.name}.final_norm"] = x
        return x, record


class Pooler(ConfigSerializable, keras.layers.Layer):
    """(BERT) tanh(dense(first position's final hidden state)): `(B, S, D)` -> `(B, D)`."""

    def __init__(self, config: TransformerConfig, name: str = "pooler", **kwargs):
        super().__init__(name=name, **kwargs)
        self.config = config
        self.dense = keras.layers.Dense(config.d_model, use_bias=config.bias, dtype=self.dtype_policy, name="dense")

    def build(self, x_shape):
        check_features(self.name, "x", x_shape, self.config.d_model)
        self.dense.build((x_shape[0], x_shape[-1]))

    def call(self, x):
        return tf.math.tanh(self.dense(x[:, 0]))


class HeadTransform(ConfigSerializable, keras.layers.Layer):
    """The head transform before the output projection: dense -> activation -> LayerNorm (BERT's masked-LM head), or
    dense -> LayerNorm -> activation (`head_order="dense-norm-activation"`)."""

    def __init__(self, config: TransformerConfig, name: str = "head", **kwargs):
        super().__init__(name=name, **kwargs)
        self.config = config
        self.dense = keras.layers.Dense(config.embed_width, use_bias=config.bias, dtype=self.dtype_policy,
                                        name="dense")  # ALBERT: back to the embedding width
        self.activation = ACTIVATIONS[config.head_activation or config.activation]
        eps = config.layer_norm_eps if config.head_layer_norm_eps is None else config.head_layer_norm_eps
        self.norm = norm_layer(config, "norm", self.dtype_policy, eps)

    def build(self, x_shape):
        check_features(self.name, "x", x_shape, self.config.d_model)
        self.dense.build(x_shape)
        self.norm.build((*x_shape[:-1], self.config.embed_width))

    def call(self, x):
        x = self.dense(x)
        if self.config.head_order == "dense-norm-activation":
            return self.activation(self.norm(x))
        return self.norm(self.activation(x))


class Classifier(ConfigSerializable, keras.layers.Layer):
    """A task head (`config.classifier`): final hidden states -> scores per sequence (from the pooler's output,
    position 0 or the last non-pad position) or per position; an optional dense layer and activation first."""

    def __init__(self, config: TransformerConfig, name: str = "classifier", **kwargs):
        super().__init__(name=name, **kwargs)
        self.config = config
        self.dense = (keras.layers.Dense(config.d_model, dtype=self.dtype_policy, name="dense")
                      if config.classifier_dense else None)
        dense = config.classifier_dense
        self.activation = tf.math.tanh if dense == "tanh" else ACTIVATIONS.get(dense)

    def build(self, x_shape):
        c = self.config
        check_features(self.name, "x", x_shape, c.d_model)
        if self.dense is not None:
            self.dense.build((None, c.d_model))
        self.kernel = self.add_weight(shape=(c.d_model, c.num_labels), initializer="glorot_uniform", name="kernel")
        self.bias = (self.add_weight(shape=(c.num_labels,), initializer="zeros", name="bias")
                     if c.classifier_bias else None)

    def call(self, x, mask=None, pooled=None):
        c = self.config
        if c.pooled_classifier:
            if c.classifier_input == "pooler":
                x = pooled
            elif c.classifier_input == "first":
                x = x[:, 0]
            else:  # "last", "eos": the last position of `mask`
                x = tf.gather(x, last_positions(mask), axis=1, batch_dims=1)
        record: Record = {}
        if self.dense is not None:
            x = record["classifier.dense"] = self.activation(self.dense(x))
        scores = tf.tensordot(x, self.kernel, 1)  # (..., D) -> (..., num_labels)
        return (scores if self.bias is None else scores + self.bias), record


class OutputProjection(ConfigSerializable, keras.layers.Layer):
    """Final states -> logits (soft-capped under `final_logit_softcap`); with `tie_embeddings` the kernel is the
    embedding table."""

    def __init__(self, config: TransformerConfig, name: str = "output", **kwargs):
        super().__init__(name=name, **kwargs)
        self.config = config
        self.kernel_initializer = keras.initializers.get("glorot_uniform")  # as Dense's, so from_reference can skip it
        self.bias_initializer = keras.initializers.get("zeros")

    def build(self, x_shape):
        c = self.config
        check_features(self.name, "x", x_shape, c.embed_width)
        self.kernel = None if c.tie_embeddings else self.add_weight(
            shape=(c.embed_width, c.tgt_vocab_size), initializer=self.kernel_initializer, name="kernel")  # (D, V)
        self.bias = (self.add_weight(shape=(c.tgt_vocab_size,), initializer=self.bias_initializer, name="bias")
                     if c.has_output_bias else None)

    def call(self, x, tied_embedding=None):
        """`(B, T, D)` -> `(B, T, V)`; `tied_embedding` `(V, D)` is the kernel, transposed, when tied."""
        # One (B*T, D) matmul, not a batched one against a broadcast table: the gradient of a broadcast table is a
        # (B, V, D) batched product summed over B, which under XLA costs more than the rest of the backward pass.
        rows = tf.reshape(x, (-1, self.config.embed_width))  # (B, T, D) -> (B*T, D); ALBERT: D = embedding_size
        if self.kernel is None:
            logits = tf.matmul(rows, tied_embedding, transpose_b=True)  # (B*T, V)
        else:
            logits = tf.matmul(rows, self.kernel)  # (B*T, V)
        if self.bias is not None:
            logits = logits + self.bias
        if self.config.logit_divisor != 1.0:  # Granite's logits_scaling
            logits = logits / tf.constant(self.config.logit_divisor, logits.dtype)
        if self.config.final_logit_softcap is not None:
            cap = tf.constant(self.config.final_logit_softcap, logits.dtype)
            logits = tf.math.tanh(logits / cap) * cap
        return tf.reshape(logits, tf.concat([tf.shape(x)[:-1], tf.shape(logits)[-1:]], axis=0))  # (B, T, V)


class Transformer(ConfigSerializable, keras.Model):
    """Embeddings -> encoder and/or decoder -> logits; the Keras twin of `reference_numpy.Transformer`.

    Args:
        config: the hyperparameters.
        dtype: parameter and compute dtype, `float32` (default) or `float64`; every sublayer, softmax and LayerNorm
            included, computes in it.
        attention_impl: `explicit` or `keras`, see `tf_impl.attention`.

    Call it with `(src_ids, tgt_ids)` of shape `(B, S)`, `(B, T)` (integer arrays or tensors); masks come from
    `pad_id` (all True when it is None) unless `src_mask` / `tgt_mask` (bool, `(B, len)`, True = real token) are
    given. An encoder-only model (`num_decoder_layers=0`) takes source ids alone, a decoder-only model
    (`num_encoder_layers=0`) its one sequence as the first argument (mask: `src_mask`). `src_type_ids` are segment
    ids (`type_vocab_size`). A bare backbone (`output_projection=False`) returns its final hidden states. Dropout is
    active only with `training=True`.

    Input checks: eagerly, ids and masks are checked on the host by the reference's own checks (rank, integer
    dtype, ids inside the vocabulary, length <= max_len, batch sizes, mask dtype and shape), with the same error
    texts as the other backends. Inside `tf.function` the values are unknown at trace time, so only what the
    static shapes and dtypes tell is checked (rank, dtype, static lengths and batch sizes). An out-of-vocabulary id
    there is not caught by us: TensorFlow's gather raises on ids >= vocab_size on CPU, Keras's `take` wraps
    negative ids, and under XLA gathers clamp.
    """

    def __init__(self, config: TransformerConfig, dtype="float32", attention_impl: str = "explicit",
                 name: str = "transformer", **kwargs):
        dtype = getattr(dtype, "name", dtype)
        if dtype not in LOW_PRECISION:  # a policy name such as mixed_bfloat16 is no dtype
            dtype = keras.backend.standardize_dtype(dtype)
        if dtype not in DTYPES + LOW_PRECISION:
            raise ValueError(f"dtype must be one of {DTYPES + LOW_PRECISION}, received {dtype!r}")
        super().__init__(dtype=dtype, name=name, **kwargs)
        self.config, self.attention_impl = config, attention_impl
        policy = self.dtype_policy
        self.src_embed = self.encoder = self.tgt_embed = self.decoder = None
        if config.has_encoder:
            self.src_embed = Embedding(config, "src", dtype=policy, name="src_embed")
            self.encoder = Encoder(config, attention_impl, dtype=policy)
        if config.has_decoder:
            self.tgt_embed = Embedding(config, "tgt", dtype=policy, name="tgt_embed")
            self.decoder = Decoder(config, attention_impl, dtype=policy)
        self.pooler = Pooler(config, dtype=policy) if config.pooler else None
        self.head = HeadTransform(config, dtype=policy) if config.head_transform else None
        # Not `self.output`: keras.Model owns that attribute (the functional output).
        self.output_projection = OutputProjection(config, dtype=policy) if config.output_projection else None
        self.classifier = Classifier(config, dtype=policy) if config.classifier else None
        self.next_sentence = (keras.layers.Dense(2, dtype=policy, name="next_sentence") if config.next_sentence
                              else None)
        self.choice_head = keras.layers.Dense(1, dtype=policy, name="choice_head") if config.choice_head else None
        # Ids arrive as arrays or tensors and are checked by `_inputs`; Keras must neither cast float "ids" to the
        # compute dtype (the error would then name the wrong dtype) nor reject a NumPy array passed positionally.
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True

    def build(self, input_shape=None):
        """Create every weight; they depend on the config alone, whatever the input shapes."""
        c = self.config
        states = (None, None, c.d_model)
        if c.has_encoder:
            self.src_embed.build((None, None))
            self.encoder.build(states)
        if c.has_decoder:
            self.tgt_embed.build((None, None))
            self.decoder.build(states, states if c.has_encoder else None)
        for layer in (self.pooler, self.head, self.classifier):
            if layer is not None:
                layer.build(states)
        for dense in (self.next_sentence, self.choice_head):
            if dense is not None:
                dense.build((None, c.d_model))
        if self.output_projection is not None:  # after the head: ALBERT's logits come from the embedding width
            self.output_projection.build((None, None, c.embed_width))

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable, "dtype": self.compute_dtype,
                "config": self.config.to_dict(), "attention_impl": self.attention_impl}

    # --- weights through the canonical form ---

    @classmethod
    def from_reference(cls, config: TransformerConfig, weights: Mapping[str, np.ndarray], dtype=None,
                       attention_impl: str = "explicit") -> "Transformer":
        """Build from canonical weights; the model takes their dtype unless `dtype` says otherwise."""
        state = rn.to_framework_state(config, weights, weight_table(config))
        if dtype is None:
            dtype = rn.weights_dtype(weights).name
        model = cls(config, dtype=dtype, attention_impl=attention_impl)
        with _zero_initializers(model):
            model.build()
        variables = model._variables()
        missing, unused = sorted(set(variables) - set(state)), sorted(set(state) - set(variables))
        if missing or unused:  # a weight_table that disagrees with the layer names
            raise ValueError(f"weight_table does not match the Keras variables: model variables without a weight "
                             f"{missing}, weights without a model variable {unused}")
        for name, value in state.items():
            variable = variables[name]
            if tuple(variable.shape) != value.shape:
                raise ValueError(f"{name} has shape {value.shape}, the Keras variable {tuple(variable.shape)}")
            variable.assign(np.asarray(value, dtype=variable.dtype))
        return model

    def to_reference(self) -> dict[str, np.ndarray]:
        """Canonical weights, bit-identical to those the model was built from."""
        if not self.built:
            self.build()
        state = {name: np.asarray(variable.numpy()) for name, variable in self._variables().items()}
        return rn.from_framework_state(self.config, state, weight_table(self.config))

    def _variables(self) -> dict[str, keras.Variable]:
        """Every weight under its Keras path below the model (`encoder/layers_0/self_attn/q/kernel`)."""
        prefix = f"{self.path}/"
        variables = {}
        for variable in self.weights:
            if not variable.path.startswith(prefix) or variable.path[len(prefix):] in variables:
                raise ValueError(f"unexpected or duplicate Keras variable path {variable.path!r}")
            variables[variable.path[len(prefix):]] = variable
        return variables

    # --- forward ---

    def encode(self, src_ids, src_mask=None, *, src_type_ids=None, training: bool = False) -> tf.Tensor:
        """Source ids `(B, S)` -> memory `(B, S, D)`."""
        return self._encode(src_ids, src_mask, src_type_ids, False, training)[0]

    def decode(self, tgt_ids, memory, src_mask, tgt_mask=None, *, training: bool = False,
               cache: KVCache | None = None, last_only: bool = False) -> tf.Tensor:
        """Target ids `(B, T)`, memory `(B, S, D)` and the source mask `(B, S)` -> logits `(B, T, tgt_vocab_size)`
        (a decoder-only model: memory and src_mask are None).

        With a `cache` (from `new_cache()`), `tgt_ids` (and `tgt_mask`) are only the positions after those already
        decoded into it; their keys and values are added to it, and the logits equal those of a full
        recomputation. `last_only`: the logits of the last position alone, `(B, 1, tgt_vocab_size)` (what a
        generation step reads; a prompt's other positions skip the output projection).
        """
        return self._decode(tgt_ids, memory, src_mask, tgt_mask, False, training, cache, last_only)[0]

    def new_cache(self, batch_size: int | None = None, length: int | None = None) -> KVCache:
        """An empty key/value cache for incremental decoding with `decode(..., cache=...)`: growing (no arguments),
        or fixed-size for `batch_size` sequences of at most `length` positions (static shapes, for XLA)."""
        c = self.config
        if not c.has_decoder:
            raise ValueError("an encoder-only model (num_decoder_layers=0) has no decoder to cache")
        if (batch_size is None) != (length is None):
            raise ValueError(f"a fixed-size cache needs both batch_size and length, received batch_size="
                             f"{batch_size}, length={length}")
        if length is None:
            return KVCache(c.num_decoder_layers, cross_attention=c.has_encoder)
        if length > c.max_len:
            raise ValueError(f"a cache of length {length} exceeds max_len={c.max_len}")
        return KVCache.fixed(c.num_decoder_layers, c.has_encoder, batch_size, length, c.kv_heads, c.head_dim,
                             self.compute_dtype)

    def call(self, src_ids, tgt_ids=None, *, src_mask=None, tgt_mask=None, src_type_ids=None,
             training: bool = False) -> tf.Tensor:
        """Logits `(B, T, tgt_vocab_size)` (encoder-only: `(B, S, ...)`; bare backbone: hidden states)."""
        return self._forward(src_ids, tgt_ids, src_mask, tgt_mask, src_type_ids, False, training)[0]

    def trace(self, src_ids, tgt_ids=None, *, src_mask=None, tgt_mask=None, src_type_ids=None,
              attention_weights: bool = False) -> dict[str, tf.Tensor]:
        """Every sublayer output under its canonical name, in execution order, ending with `logits` (a bare
        backbone: `last_hidden_state`; `pooler`, if any, comes after the encoder), in inference mode."""
        if not self.built:
            self.build()
        return self._forward(src_ids, tgt_ids, src_mask, tgt_mask, src_type_ids, attention_weights, False)[1]

    def _encode(self, src_ids, src_mask, src_type_ids, attention_weights, training):
        rn.check_stack(self.config, "encode")
        src_ids, src_mask = self._inputs("src", src_ids, src_mask, self.config.src_vocab_size)
        type_ids = self._type_ids(src_type_ids, src_ids)
        x = self.src_embed(src_ids, type_ids=type_ids, training=training, real=src_mask)  # not `mask`: Keras's own
        record: Record = {"encoder.embed": x}
        masks = encoder_attention_masks(self.config, src_mask)
        memory, layers = self.encoder(x, masks, attention_weights=attention_weights, training=training)
        return memory, {**record, **layers}

    def _decode(self, tgt_ids, memory, src_mask, tgt_mask, attention_weights, training, cache=None,
                last_only=False, classifier_mask=None):
        rn.check_stack(self.config, "decode")
        tgt_ids, tgt_mask = self._inputs("tgt", tgt_ids, tgt_mask, self.config.tgt_vocab_size)
        t = tf.shape(tgt_ids)[1]
        offset, key_mask, first = 0, tgt_mask, None
        if cache is not None:
            offset = cache.length
            new = tgt_ids.shape[1]
            if isinstance(offset, int) and new is not None and offset + new > self.config.max_len:
                raise ValueError(f"decoding {new} more position(s) after {offset} cached ones exceeds max_len="
                                 f"{self.config.max_len}")
            if cache.index is not None:  # fixed-size: the new positions' mask written at the offset
                size = cache.key_mask.shape[1]
                if not tf.is_symbolic_tensor(offset) and new is not None and int(offset) + new > size:
                    # checked eagerly only: past the end, dynamic_update_slice would clamp and overwrite silently
                    raise ValueError(f"decoding {new} more position(s) after {int(offset)} cached ones exceeds the "
                                     f"fixed-size cache's length {size}")
                key_mask = dynamic_update_slice(cache.key_mask, tgt_mask, [0, offset])  # (B, T_max)
                for self_cache, _ in cache.layers:
                    self_cache.index = offset
                first = offset  # the new positions' queries start at the offset, not at the buffer's end
            elif cache.key_mask is not None:
                key_mask = tf.concat([cache.key_mask, tgt_mask], axis=1)  # (B, T_cached + T)
        shared = self.src_embed.token.embeddings if self.config.share_embeddings else None
        x = self.tgt_embed(tgt_ids, offset=offset, token_table=shared, training=training)
        record: Record = {"decoder.embed": x}
        cross_mask = None if memory is None else attention_mask(tf.convert_to_tensor(src_mask), t)
        self_masks = {kind: attention_mask(key_mask, t, causal=True, first=first, window=self.config.kind_window(kind))
                      for kind in self.config.decoder_kinds}
        x, layers = self.decoder(x, memory, self_masks, cross_mask, attention_weights=attention_weights,
                                 training=training, cache=cache, key_len=tf.shape(key_mask)[1], first=first)
        if cache is not None:
            cache.key_mask = key_mask
            if cache.index is not None:
                cache.index = offset + t
        logits, head = self._output(x[:, -1:] if last_only else x,
                                    key_mask if classifier_mask is None else classifier_mask)
        return logits, {**record, **layers, **head}

    def _forward(self, src_ids, tgt_ids, src_mask, tgt_mask, src_type_ids, attention_weights, training):
        c = self.config
        rn.check_family(c, tgt_ids, tgt_mask, src_type_ids)
        if c.is_decoder_only:  # the one sequence arrives as src_ids / src_mask
            return self._decode(src_ids, None, None, src_mask, attention_weights, training)
        src_ids, src_mask = self._inputs("src", src_ids, src_mask, c.src_vocab_size)
        if tgt_ids is not None:
            tgt_ids, tgt_mask = self._inputs("tgt", tgt_ids, tgt_mask, c.tgt_vocab_size)
            b_src, b_tgt = src_ids.shape[0], tgt_ids.shape[0]
            if b_src is not None and b_tgt is not None and b_src != b_tgt:
                raise ValueError(f"src_ids and tgt_ids have different batch sizes: {b_src} and {b_tgt}")
        memory, record = self._encode(src_ids, src_mask, src_type_ids, attention_weights, training)
        if self.pooler is not None:
            record["pooler"] = self.pooler(memory)
            if self.next_sentence is not None:
                record["next_sentence"] = self.next_sentence(record["pooler"])
        if c.is_encoder_only:
            logits, head = self._output(memory, src_mask, record.get("pooler"))
            return logits, {**record, **head}
        reads = None
        if c.classifier_input == "eos":  # checked as the reference checks it when eager; in a graph, computed only
            reads = (tf.convert_to_tensor(rn.eos_mask(c, np.asarray(src_ids), int(np.shape(tgt_ids)[1])))
                     if tf.executing_eagerly() else tf.equal(src_ids, c.eos_id))
        logits, decoder_record = self._decode(tgt_ids, memory, src_mask, tgt_mask, attention_weights, training,
                                              classifier_mask=reads)
        return logits, {**record, **decoder_record}

    def _output(self, x, mask, pooled=None):
        """Final hidden states -> `(logits, record)` through the head transform and output projection, or a
        classifier's scores (`logits` too); a bare backbone returns the hidden states (`last_hidden_state`)."""
        if self.classifier is not None:
            head = {}
            if self.head is not None:  # ModernBERT's task heads: the head transform, then the classifier
                x = head["head"] = self.head(x)
            logits, record = self.classifier(x, mask, pooled)
            record["logits"] = logits
            return logits, {**head, **record}
        record: Record = {}
        if self.choice_head is not None and x.shape[1] == mask.shape[1]:
            record["choice"] = self.choice_head(tf.gather(x, last_positions(mask), axis=1, batch_dims=1))
        if self.head is not None:
            x = record["head"] = self.head(x)
        if self.output_projection is None:
            record["last_hidden_state"] = x
            return x, record
        tied = None
        if self.config.tie_embeddings:
            side = tied_output_embedding(self.config).split("_", 1)[0]  # "src" or "tgt"
            tied = getattr(self, f"{side}_embed").token.embeddings
        logits = record["logits"] = self.output_projection(x, tied)
        return logits, record

    def _inputs(self, side: str, ids, mask, vocab_size: int) -> tuple[tf.Tensor, tf.Tensor]:
        """Validate ids (and an explicit mask): on the host with the reference's checks when eager, from static
        shapes and dtypes inside `tf.function`. Returns tensors."""
        name, max_len = f"{side}_ids", self.config.max_len
        if tf.is_symbolic_tensor(ids):
            _check_static_ids(name, ids, max_len)
        else:
            ids = rn.check_token_ids(name, _host(ids), vocab_size, max_len)
        ids = tf.convert_to_tensor(ids)
        if mask is None:
            return ids, padding_mask(ids, self.config.pad_id)
        if tf.is_symbolic_tensor(mask) or tf.is_symbolic_tensor(ids):
            mask = tf.convert_to_tensor(mask)
            _check_static_mask(f"{side}_mask", mask, ids.shape)
        else:
            mask = rn.check_padding_mask(f"{side}_mask", _host(mask), tuple(ids.shape))
        return ids, tf.convert_to_tensor(mask)

    def _type_ids(self, type_ids, ids: tf.Tensor) -> tf.Tensor | None:
        """Segment ids, checked like `_inputs` checks ids (eagerly on the host, else from the static shape)."""
        if type_ids is None:
            return None
        if tf.is_symbolic_tensor(type_ids) or tf.is_symbolic_tensor(ids):
            type_ids = tf.convert_to_tensor(type_ids)
            _check_static_ids("src_type_ids", type_ids, self.config.max_len)
        else:
            type_ids = rn.check_type_ids(_host(type_ids), tuple(ids.shape), self.config.type_vocab_size,
                                         self.config.max_len)
        return tf.convert_to_tensor(type_ids)


_INITIALIZERS = ("kernel_initializer", "bias_initializer", "embeddings_initializer", "gamma_initializer",
                 "beta_initializer")


@contextlib.contextmanager
def _zero_initializers(model: keras.layers.Layer):
    """Build with zeros instead of random draws when every weight is overwritten right after (what torch_impl's
    meta device saves: about 60M uniform draws on the base preset); the layers' own initializers come back after."""
    saved = [(layer, attr, getattr(layer, attr)) for layer in model._flatten_layers() for attr in _INITIALIZERS
             if hasattr(layer, attr)]
    for layer, attr, _ in saved:
        setattr(layer, attr, keras.initializers.Zeros())
    try:
        yield
    finally:
        for layer, attr, initializer in saved:
            setattr(layer, attr, initializer)


def _host(x) -> np.ndarray:
    return x.numpy() if tf.is_tensor(x) else np.asarray(x)


def _check_static_ids(name: str, ids: tf.Tensor, max_len: int) -> None:
    """What `rn.check_token_ids` checks, as far as a traced tensor's static shape and dtype tell (same texts)."""
    shape = ids.shape
    if shape.rank is not None and shape.rank != 2:
        raise ValueError(f"{name} must have shape (batch, length), received shape {tuple(shape)}")
    if not ids.dtype.is_integer:
        raise TypeError(f"{name} must hold integer token ids, received dtype {ids.dtype.name}")
    if shape.rank == 2 and 0 in tuple(shape):
        raise ValueError(f"{name} must be non-empty, received shape {tuple(shape)}")
    if shape.rank == 2 and shape[1] is not None and shape[1] > max_len:
        raise ValueError(f"{name} has length {shape[1]}, longer than max_len={max_len}")


def _check_static_mask(name: str, mask: tf.Tensor, ids_shape: tf.TensorShape) -> None:
    """What `rn.check_padding_mask` checks, as far as static shapes and dtypes tell (same texts)."""
    if mask.dtype != tf.bool:
        raise TypeError(f"{name} must be a bool array (True = real token), received dtype {mask.dtype.name}")
    if not mask.shape.is_compatible_with(ids_shape):
        raise ValueError(f"{name} must have the shape of the ids {tuple(ids_shape)}, received {tuple(mask.shape)}")


def padding_mask(ids: tf.Tensor, pad_id: int | None) -> tf.Tensor:
    """`(B, T)` ids -> `(B, T)` bool, True = real token (every one when the model has no pad token)."""
    if pad_id is None:
        return tf.ones_like(ids, dtype=tf.bool)
    return tf.not_equal(ids, tf.constant(pad_id, ids.dtype))


def last_positions(mask) -> tf.Tensor:
    """The last True position of each row of `mask` `(B, S)`: transformers' `(arange(S) * mask).argmax(-1)`."""
    positions = tf.range(tf.shape(mask)[1], dtype=tf.int32)
    return tf.argmax(positions[None] * tf.cast(mask, tf.int32), axis=-1, output_type=tf.int32)


def attention_mask(key_mask: tf.Tensor, query_len, causal: bool = False, first=None, window: int | None = None
                   ) -> tf.Tensor:
    """Key padding mask `(B, Tk)` (True = real token) -> `(B, 1, Tq, Tk)` attention mask, True = may attend.
    `causal` with `first` and a sliding `window`: see `causal_mask`; not causal, a `window` is both ways
    (|i - j| < window, the queries being the last Tq positions)."""
    shape = tf.shape(key_mask)
    mask = tf.broadcast_to(key_mask[:, None, None, :], (shape[0], 1, query_len, shape[1]))  # (B, 1, Tq, Tk)
    if causal:
        mask = tf.logical_and(mask, causal_mask(query_len, shape[1], first, window))
    elif window is not None:
        distance = tf.range(query_len)[:, None] + (shape[1] - query_len) - tf.range(shape[1])[None, :]  # (Tq, Tk)
        mask = tf.logical_and(mask, tf.abs(distance) < window)
    return mask


def encoder_attention_masks(config: TransformerConfig, key_mask: tf.Tensor) -> dict[str, tf.Tensor]:
    """The encoder's self-attention mask `(B, 1, S, S)` of each layer kind its layers use
    (`reference_numpy.model.encoder_attention_masks`)."""
    masks = {kind: attention_mask(key_mask, tf.shape(key_mask)[1], causal=config.causal_encoder,
                                  window=config.kind_window(kind)) for kind in config.encoder_kinds}
    if config.padded_queries == "average":  # no key for a padding query
        masks = {kind: tf.logical_and(mask, key_mask[:, None, :, None]) for kind, mask in masks.items()}
    return masks
