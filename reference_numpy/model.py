"""The reference Transformer: thin classes over `ops`, holding canonical weights and recording sublayer outputs.

Each module knows its canonical name (`encoder.layers.0.self_attn`) and reads its parameters from the one flat
weight dict by that prefix. Passing a dict as `record` collects every sublayer output under its canonical name,
in execution order; `Transformer.trace()` does that for the whole model.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from . import ops
from .config import TransformerConfig
from .schema import tied_output_embedding, validate_weights

Record = dict  # canonical sublayer name -> array, in execution order


class _Module:
    def __init__(self, config: TransformerConfig, weights: Mapping[str, np.ndarray], name: str):
        self.config, self.weights, self.name = config, weights, name

    def param(self, leaf: str) -> np.ndarray | None:
        return self.weights.get(f"{self.name}.{leaf}")


class LayerNorm(_Module):
    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ops.layer_norm(x, self.param("gamma"), self.param("beta"), self.config.layer_norm_eps)


class MultiHeadAttention(_Module):
    """Multi-head attention (section 3.2.2); self-attention when `x_q is x_kv`, else encoder-decoder attention."""

    def __call__(self, x_q: np.ndarray, x_kv: np.ndarray, mask: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        h = self.config.num_heads
        q = ops.split_heads(ops.linear(x_q, self.param("q.kernel"), self.param("q.bias")), h)  # (B, H, Tq, d_k)
        k = ops.split_heads(ops.linear(x_kv, self.param("k.kernel"), self.param("k.bias")), h)  # (B, H, Tk, d_k)
        v = ops.split_heads(ops.linear(x_kv, self.param("v.kernel"), self.param("v.bias")), h)  # (B, H, Tk, d_k)
        out, weights = ops.scaled_dot_product_attention(q, k, v, mask)
        out = ops.merge_heads(out)  # (B, Tq, D)
        return ops.linear(out, self.param("o.kernel"), self.param("o.bias")), weights


class FeedForward(_Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (section 3.3)."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        hidden = ops.ACTIVATIONS[self.config.activation](
            ops.linear(x, self.param("linear1.kernel"), self.param("linear1.bias")))
        return ops.linear(hidden, self.param("linear2.kernel"), self.param("linear2.bias"))


def _sublayer(x: np.ndarray, norm: LayerNorm, fn, config: TransformerConfig, record: Record | None, name: str,
              attention_weights: bool):
    """One residual block: post-LN `norm(x + f(x))` (the paper) or pre-LN `x + f(norm(x))`."""
    out = fn(norm(x) if config.norm_first else x)
    if isinstance(out, tuple):
        out, weights = out
        if record is not None and attention_weights:
            record[f"{name}.weights"] = weights
    if record is not None:
        record[name] = out
    return x + out if config.norm_first else norm(x + out)


class EncoderLayer(_Module):
    def __init__(self, config, weights, name):
        super().__init__(config, weights, name)
        self.self_attn = MultiHeadAttention(config, weights, f"{name}.self_attn")
        self.norm1 = LayerNorm(config, weights, f"{name}.norm1")
        self.ffn = FeedForward(config, weights, f"{name}.ffn")
        self.norm2 = LayerNorm(config, weights, f"{name}.norm2")

    def __call__(self, x, mask, record: Record | None = None, attention_weights: bool = False):
        c = self.config
        x = _sublayer(x, self.norm1, lambda y: self.self_attn(y, y, mask), c, record, self.self_attn.name,
                      attention_weights)
        x = _sublayer(x, self.norm2, self.ffn, c, record, self.ffn.name, attention_weights)
        if record is not None:
            record[self.name] = x
        return x


class DecoderLayer(_Module):
    def __init__(self, config, weights, name):
        super().__init__(config, weights, name)
        self.self_attn = MultiHeadAttention(config, weights, f"{name}.self_attn")
        self.norm1 = LayerNorm(config, weights, f"{name}.norm1")
        self.cross_attn = MultiHeadAttention(config, weights, f"{name}.cross_attn")
        self.norm2 = LayerNorm(config, weights, f"{name}.norm2")
        self.ffn = FeedForward(config, weights, f"{name}.ffn")
        self.norm3 = LayerNorm(config, weights, f"{name}.norm3")

    def __call__(self, x, memory, self_mask, cross_mask, record: Record | None = None, attention_weights=False):
        c = self.config
        x = _sublayer(x, self.norm1, lambda y: self.self_attn(y, y, self_mask), c, record, self.self_attn.name,
                      attention_weights)
        x = _sublayer(x, self.norm2, lambda y: self.cross_attn(y, memory, cross_mask), c, record,
                      self.cross_attn.name, attention_weights)
        x = _sublayer(x, self.norm3, self.ffn, c, record, self.ffn.name, attention_weights)
        if record is not None:
            record[self.name] = x
        return x


class Embedding(_Module):
    """Token embedding, times sqrt(d_model) if `scale_embedding`, plus sinusoidal or learned positions."""

    def __init__(self, config, weights, name, positions_name):
        super().__init__(config, weights, name)
        self.positions_name = positions_name
        if config.positional == "sinusoidal":
            dtype = weights[f"{name}.embedding"].dtype
            self.position_table = ops.sinusoidal_positions(config.max_len, config.d_model,
                                                           config.sinusoid_layout).astype(dtype)
        else:
            self.position_table = weights[f"{positions_name}.embedding"]

    def __call__(self, ids: np.ndarray, offset: int = 0) -> np.ndarray:
        x = self.param("embedding")[ids]  # (B, T, D)
        if self.config.scale_embedding:
            x = x * x.dtype.type(math.sqrt(self.config.d_model))
        return x + self.position_table[offset:offset + ids.shape[1]]


class Encoder(_Module):
    def __init__(self, config, weights, name="encoder"):
        super().__init__(config, weights, name)
        self.layers = [EncoderLayer(config, weights, f"{name}.layers.{i}") for i in range(config.num_encoder_layers)]
        self.final_norm = LayerNorm(config, weights, f"{name}.final_norm") if config.final_norm else None

    def __call__(self, x, mask, record: Record | None = None, attention_weights: bool = False):
        for layer in self.layers:
            x = layer(x, mask, record, attention_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if record is not None:
                record[self.final_norm.name] = x
        return x


class Decoder(_Module):
    def __init__(self, config, weights, name="decoder"):
        super().__init__(config, weights, name)
        self.layers = [DecoderLayer(config, weights, f"{name}.layers.{i}") for i in range(config.num_decoder_layers)]
        self.final_norm = LayerNorm(config, weights, f"{name}.final_norm") if config.final_norm else None

    def __call__(self, x, memory, self_mask, cross_mask, record: Record | None = None, attention_weights=False):
        for layer in self.layers:
            x = layer(x, memory, self_mask, cross_mask, record, attention_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if record is not None:
                record[self.final_norm.name] = x
        return x


class Transformer:
    """The whole model: embeddings -> encoder (-> decoder) -> output projection to logits.

    With `num_decoder_layers=0` it is an encoder-only model whose head classifies every source position into
    `tgt_vocab_size` classes; call it with source ids alone.

    Args:
        config: the hyperparameters.
        weights: canonical weights (see `parameter_shapes`); validated here.
        dtype: compute dtype, float64 (default, the judge) or float32.
    """

    def __init__(self, config: TransformerConfig, weights: Mapping[str, np.ndarray], dtype=np.float64):
        validate_weights(config, weights)
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, received {dtype}")
        self.config, self.dtype = config, dtype
        self.weights = {name: np.asarray(value, dtype=dtype) for name, value in weights.items()}
        self.src_embed = Embedding(config, self.weights, "src_embed", "src_pos")
        self.encoder = Encoder(config, self.weights)
        if config.is_encoder_decoder:
            self.tgt_embed = Embedding(config, self.weights, "tgt_embed", "tgt_pos")
            self.decoder = Decoder(config, self.weights)
        self.output_kernel = (self.weights[tied_output_embedding(config)].T if config.tie_embeddings
                              else self.weights["output.kernel"])

    def encode(self, src_ids, src_mask=None, record: Record | None = None, attention_weights: bool = False):
        """Source ids `(B, S)` -> memory `(B, S, D)`."""
        src_ids, src_mask = self._inputs("src", src_ids, src_mask, self.config.src_vocab_size)
        x = self.src_embed(src_ids)
        if record is not None:
            record["encoder.embed"] = x
        return self.encoder(x, ops.attention_mask(src_mask, src_ids.shape[1]), record, attention_weights)

    def decode(self, tgt_ids, memory, src_mask, tgt_mask=None, record: Record | None = None,
               attention_weights: bool = False):
        """Target ids `(B, T)` and memory `(B, S, D)` -> logits `(B, T, tgt_vocab_size)`."""
        tgt_ids, tgt_mask = self._inputs("tgt", tgt_ids, tgt_mask, self.config.tgt_vocab_size)
        src_mask = np.asarray(src_mask)
        x = self.tgt_embed(tgt_ids)
        if record is not None:
            record["decoder.embed"] = x
        t = tgt_ids.shape[1]
        x = self.decoder(x, memory, ops.attention_mask(tgt_mask, t, causal=True), ops.attention_mask(src_mask, t),
                         record, attention_weights)
        return self._logits(x, record)

    def __call__(self, src_ids, tgt_ids=None, *, src_mask=None, tgt_mask=None) -> np.ndarray:
        """Logits `(B, T, tgt_vocab_size)` (encoder-only: `(B, S, tgt_vocab_size)`)."""
        return self._forward(src_ids, tgt_ids, src_mask, tgt_mask, None, False)

    def trace(self, src_ids, tgt_ids=None, *, src_mask=None, tgt_mask=None, attention_weights: bool = False
              ) -> dict[str, np.ndarray]:
        """Every sublayer output under its canonical name, in execution order, ending with `logits`."""
        record: Record = {}
        self._forward(src_ids, tgt_ids, src_mask, tgt_mask, record, attention_weights)
        return record

    def _forward(self, src_ids, tgt_ids, src_mask, tgt_mask, record, attention_weights):
        c = self.config
        if c.is_encoder_decoder and tgt_ids is None:
            raise ValueError("this encoder-decoder model needs tgt_ids, received None")
        if not c.is_encoder_decoder and (tgt_ids is not None or tgt_mask is not None):
            raise ValueError("this encoder-only model (num_decoder_layers=0) takes source ids alone, "
                             "received tgt_ids or tgt_mask")
        src_ids, src_mask = self._inputs("src", src_ids, src_mask, c.src_vocab_size)
        if tgt_ids is not None:
            tgt_ids, tgt_mask = self._inputs("tgt", tgt_ids, tgt_mask, c.tgt_vocab_size)
            if tgt_ids.shape[0] != src_ids.shape[0]:
                raise ValueError(f"src_ids and tgt_ids have different batch sizes: {src_ids.shape[0]} and "
                                 f"{tgt_ids.shape[0]}")
        memory = self.encode(src_ids, src_mask, record, attention_weights)
        if not c.is_encoder_decoder:
            return self._logits(memory, record)
        return self.decode(tgt_ids, memory, src_mask, tgt_mask, record, attention_weights)

    def _logits(self, x, record):
        logits = ops.linear(x, self.output_kernel, self.weights.get("output.bias"))
        if record is not None:
            record["logits"] = logits
        return logits

    def _inputs(self, side: str, ids, mask, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
        ids = check_token_ids(f"{side}_ids", ids, vocab_size, self.config.max_len)
        if mask is None:
            return ids, ops.padding_mask(ids, self.config.pad_id)
        return ids, check_padding_mask(f"{side}_mask", mask, ids.shape)


def check_token_ids(name: str, ids, vocab_size: int, max_len: int) -> np.ndarray:
    """Validate `(batch, length)` integer token ids; returns them as a NumPy array."""
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, length), received shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name} must hold integer token ids, received dtype {ids.dtype}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty, received shape {ids.shape}")
    if ids.shape[1] > max_len:
        raise ValueError(f"{name} has length {ids.shape[1]}, longer than max_len={max_len}")
    low, high = ids.min(), ids.max()
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} holds token id {bad}, outside the vocabulary [0, {vocab_size})")
    return ids


def check_padding_mask(name: str, mask, shape: tuple[int, ...]) -> np.ndarray:
    """Validate an explicit `(batch, length)` bool mask, True = real token that may be attended to."""
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"{name} must be a bool array (True = real token), received dtype {mask.dtype}")
    if mask.shape != tuple(shape):
        raise ValueError(f"{name} must have the shape of the ids {tuple(shape)}, received {mask.shape}")
    return mask
