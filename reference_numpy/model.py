"""The reference Transformer: thin classes over `ops`, holding canonical weights and recording sublayer outputs.

Each module knows its canonical name (`encoder.layers.0.self_attn`) and reads its parameters from the one flat
weight dict by that prefix. Passing a dict as `record` collects every sublayer output under its canonical name,
in execution order; `Transformer.trace()` does that for the whole model.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from . import alibi, moe, ops
from .config import TransformerConfig
from .schema import tied_output_embedding, token_embedding, validate_weights

Record = dict  # canonical sublayer name -> array, in execution order


class _Module:
    ops = ops  # the math; a `lowp.Precision` in a reduced-precision model (set by `Transformer`)

    def __init__(self, config: TransformerConfig, weights: Mapping[str, np.ndarray], name: str):
        self.config, self.weights, self.name = config, weights, name

    def param(self, leaf: str) -> np.ndarray | None:
        return self.weights.get(f"{self.name}.{leaf}")

    def store(self, x: np.ndarray) -> np.ndarray:
        """An activation between ops as the model holds it: itself, or rounded to a reduced-precision dtype."""
        return x if self.ops is ops else self.ops.store(x)


class LayerNorm(_Module):
    """The model's norm: LayerNorm (gamma, beta), or RMSNorm (gamma alone) under `norm="rms"`, multiplying by
    `norm_weight_offset + gamma`."""

    def __init__(self, config: TransformerConfig, weights: Mapping[str, np.ndarray], name: str,
                 eps: float | None = None):
        super().__init__(config, weights, name)
        self.eps = config.layer_norm_eps if eps is None else eps  # the head's own epsilon, or the model's

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.config.norm == "rms":
            return self.ops.rms_norm(x, self.param("gamma"), self.eps, self.config.norm_weight_offset)
        return self.ops.layer_norm(x, self.param("gamma"), self.param("beta"), self.eps)


class MultiHeadAttention(_Module):
    """Multi-head attention (section 3.2.2); self-attention when `x_q is x_kv`, else encoder-decoder attention.

    Grouped-query attention reads `kv_heads` key/value heads, each serving `num_heads / kv_heads` query heads;
    `qk_norm` normalizes each head of q and k; rotary positions (`positional="rope"`) turn q and k in
    self-attention, the queries being the last `Tq` of `Tk` positions (`local_rope`: at a sliding layer's own base,
    `local_rope_theta`); `attn_logit_softcap` caps the scaled scores. `clip_qkv` clamps the projected q, k and v;
    `qk_norm_over="all"` normalizes all of q's (and k's) features at once, before the split into heads.
    `relative` (an encoder's self-attention under `relative_terms`, DeBERTa): the disentangled position terms join
    the scores, from the shared relative positions' table (normed by `encoder.rel_embed_norm`).
    `position_bias` `(1, H, Tq, Tk)`: T5's relative position bias, added to the scaled scores (`stack_bias`)."""

    def __init__(self, config, weights, name, rotary: bool = False, local_rope: bool = False,
                 relative: bool = False):
        super().__init__(config, weights, name)
        self.rotary = rotary and config.positional == "rope"
        self.local_rope = local_rope
        self.relative = relative and config.relative_terms is not None
        self.rel_norm = LayerNorm(config, weights, "encoder.rel_embed_norm") \
            if self.relative and config.relative_embed_norm else None
        self.q_norm = LayerNorm(config, weights, f"{name}.q_norm", config.qk_norm_eps) if config.qk_norm else None
        self.k_norm = LayerNorm(config, weights, f"{name}.k_norm", config.qk_norm_eps) if config.qk_norm else None

    def __call__(self, x_q: np.ndarray, x_kv: np.ndarray, mask: np.ndarray | None = None,
                 position_bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        c, op = self.config, self.ops
        q, k, v = (op.linear(x, self.param(f"{p}.kernel"), self.param(f"{p}.bias"))
                   for p, x in (("q", x_q), ("k", x_kv), ("v", x_kv)))  # (B, T, H*dk), (B, T, KV*dk) twice
        if c.clip_qkv is not None:
            q, k, v = (np.clip(t, -c.clip_qkv, c.clip_qkv) for t in (q, k, v))
        every = self.q_norm is not None and c.qk_norm_over == "all"
        if every:
            q, k = self.q_norm(q), self.k_norm(k)
        q = op.split_heads(q, c.num_heads)  # (B, H, Tq, dk)
        k, v = op.split_heads(k, c.kv_heads), op.split_heads(v, c.kv_heads)  # (B, KV, Tk, dk)
        if self.q_norm is not None and not every:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            tq, tk = q.shape[2], k.shape[2]
            inv_freq, scaling = ops.rope_frequencies(c, tk, local=self.local_rope)
            q = op.apply_rope(q, np.arange(tk - tq, tk), inv_freq, scaling, c.rotary_dim, c.rotary_interleaved)
            k = op.apply_rope(k, np.arange(tk), inv_freq, scaling, c.rotary_dim, c.rotary_interleaved)
        groups = c.num_heads // c.kv_heads
        k, v = ops.repeat_kv(k, groups), ops.repeat_kv(v, groups)  # (B, H, Tk, d_k)
        bias = position_bias  # T5's relative position bias, or ALiBi's: key position j biased by slope_h * j
        if c.alibi:
            bias = alibi.bias(c, k.shape[2]).astype(q.dtype)  # (H, 1, Tk)
            bias = bias if position_bias is None else bias + position_bias
        out, weights = op.scaled_dot_product_attention(
            q, k, v, mask, scale=c.attention_scale_factor, softcap=c.attn_logit_softcap,
            position_scores=self._position_scores(q, k) if self.relative else None,
            empty_rows="average" if c.padded_queries == "average" else "zero", sinks=self.param("sinks"), bias=bias)
        out = op.merge_heads(out)  # (B, Tq, D)
        return op.linear(out, self.param("o.kernel"), self.param("o.bias")), weights

    def _position_scores(self, q: np.ndarray, k: np.ndarray) -> np.ndarray:
        """DeBERTa's position terms `(B, H, Tq, Tk)`, before the scale: the relative positions' table (normed),
        projected by pos_k for "c2p" and pos_q for "p2c" (k's and q's own projections under
        `relative_shares_qk`)."""
        c, op = self.config, self.ops
        table = self.weights["encoder.rel_embed.embedding"]
        table = (table if self.rel_norm is None else self.rel_norm(table))[None]  # (1, 2 span, D)
        projected = {}
        for term, proj in (("c2p", "k"), ("p2c", "q")):
            if term in c.relative_terms:
                name = proj if c.relative_shares_qk else f"pos_{proj}"
                projected[term] = op.split_heads(op.linear(table, self.param(f"{name}.kernel"),
                                                           self.param(f"{name}.bias")), c.num_heads)  # (1, H, 2s, d)
        index = ops.relative_position_index(c, q.shape[2], k.shape[2])  # (Tq, Tk)
        return op.disentangled_scores(q, k, projected.get("p2c"), projected.get("c2p"), index)


class FeedForward(_Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (section 3.3); gated (`ffn_gated`, SwiGLU / GeGLU):
    (act(x Wg + bg) * (x W1 + b1)) W2 + b2, clamped where `glu_limit` says (`ops.clamped_glu`)."""

    def __call__(self, x: np.ndarray, record: Record | None = None) -> np.ndarray:
        act, op = self.ops.ACTIVATIONS[self.config.activation], self.ops
        if self.config.ffn_gated:
            hidden = self.store(op.clamped_glu(op.linear(x, self.param("gate.kernel"), self.param("gate.bias")),
                                               op.linear(x, self.param("linear1.kernel"), self.param("linear1.bias")),
                                               act, self.config))
        else:
            hidden = act(op.linear(x, self.param("linear1.kernel"), self.param("linear1.bias")))
        return op.linear(hidden, self.param("linear2.kernel"), self.param("linear2.bias"))


class MixtureOfExperts(_Module):
    """A mixture-of-experts feed-forward (`num_experts`; `moe`): the router scores the experts for each token, which
    runs through its `experts_per_token` best (each a `FeedForward` of `expert_d_ff`), their outputs weighted by the
    router, plus a shared expert times sigmoid(x w) where `shared_expert_d_ff` says (Qwen2-MoE). The experts each
    token chose are recorded as `{name}.routing`."""

    def __init__(self, config, weights, name):
        super().__init__(config, weights, name)
        self.experts = [FeedForward(config, weights, f"{name}.experts.{e}") for e in range(config.num_experts)]
        self.shared = FeedForward(config, weights, f"{name}.shared") if config.shared_expert_d_ff else None

    def __call__(self, x: np.ndarray, record: Record | None = None) -> np.ndarray:
        flat = x.reshape(-1, x.shape[-1])  # (B, T, D) -> (N, D)
        scores = self.ops.linear(flat, self.param("router.kernel"), self.param("router.bias"))  # (N, E)
        ids, weights = moe.route(scores, self.config)  # (N, k) each
        out = moe.dispatch(flat, ids, self.store(weights), self.experts)
        if self.shared is not None:
            gate = self.store(moe.sigmoid(self.ops.linear(flat, self.param("shared_gate.kernel"))))  # (N, 1)
            out = self.store(out + self.store(gate * self.shared(flat)))
        if record is not None:
            record[f"{self.name}.routing"] = moe.routing_record(ids, x.shape[:-1], x.dtype)
        return out.reshape(x.shape)


def _sublayer(x: np.ndarray, norm: LayerNorm | None, fn, config: TransformerConfig, record: Record | None, name: str,
              attention_weights: bool, post_norm: LayerNorm | None = None, owner: _Module | None = None):
    """One residual block: post-LN `norm(x + f(x))` (the paper) or pre-LN `x + f(norm(x))`, with `post_norms`
    `x + post_norm(f(norm(x)))` (Gemma 2/3), the post norm's output traced under its own name; without a norm
    before it (`pre_norms=False`, OLMo 2) `x + post_norm(f(x))`; the output times `residual_multiplier` (Granite)
    before the add. `owner`: the module whose `store` rounds the sum where the sublayer has no norm at all
    (ModernBERT's first attention, `first_attn_norm=False`)."""
    out = fn(norm(x) if config.norm_first and norm is not None else x)
    if isinstance(out, tuple):
        out, weights = out
        if record is not None and attention_weights:
            record[f"{name}.weights"] = weights
    if record is not None:
        record[name] = out
    if post_norm is not None:
        out = post_norm(out)
        if record is not None:
            record[post_norm.name] = out
    store = (norm or post_norm or owner).store
    if config.residual_multiplier != 1.0:
        out = _times(post_norm or norm or owner, out, config.residual_multiplier)
    return store(x + out) if config.norm_first else norm(store(x + out))


def _post_norm(config: TransformerConfig, weights, name: str) -> LayerNorm | None:
    """The norm on a sublayer's output under `post_norms` (canonical `{layer}.post_attn_norm`, ...), else None."""
    return LayerNorm(config, weights, name) if config.post_norms else None


def _times(module, x: np.ndarray, factor: float, divide: bool = False) -> np.ndarray:
    """`x * factor` or `x / factor` (Granite's multipliers), rounded once in a reduced-precision model (an
    elementwise op on its dtype)."""
    y = x / x.dtype.type(factor) if divide else x * x.dtype.type(factor)
    return y if module.ops is ops else module.ops.rounded(y)


def _pre_norm(config: TransformerConfig, weights, name: str) -> LayerNorm | None:
    """A sublayer's own norm (`norm1`, ...), or None under `pre_norms=False` (OLMo 2)."""
    return LayerNorm(config, weights, name) if config.pre_norms else None


class EncoderLayer(_Module):
    """Self-attention and feed-forward. `index`: which encoder layer it is, for its kind (`kind`: the mask it takes),
    its rotary base and, at 0, whether its attention has a norm (`first_attn_norm`)."""

    def __init__(self, config, weights, name, index: int = 0):
        super().__init__(config, weights, name)
        self.kind = config.encoder_layer_kind(index)
        self.self_attn = MultiHeadAttention(config, weights, f"{name}.self_attn", rotary=True, relative=True,
                                            local_rope=config.encoder_local_rope(index))
        own_norm = index > 0 or config.first_attn_norm
        self.norm1 = _pre_norm(config, weights, f"{name}.norm1") if own_norm else None
        self.post_attn_norm = _post_norm(config, weights, f"{name}.post_attn_norm")
        self.ffn = FeedForward(config, weights, f"{name}.ffn")
        self.norm2 = _pre_norm(config, weights, f"{name}.norm2")
        self.post_ffn_norm = _post_norm(config, weights, f"{name}.post_ffn_norm")

    def __call__(self, x, mask, record: Record | None = None, attention_weights: bool = False, position_bias=None):
        c = self.config
        x = _sublayer(x, self.norm1, lambda y: self.self_attn(y, y, mask, position_bias), c, record,
                      self.self_attn.name, attention_weights, self.post_attn_norm, self)
        x = _sublayer(x, self.norm2, self.ffn, c, record, self.ffn.name, attention_weights, self.post_ffn_norm)
        if record is not None:
            record[self.name] = x
        return x


class DecoderLayer(_Module):
    """Masked self-attention, encoder-decoder attention (absent in a decoder-only model) and feed-forward, one after
    the other or side by side (`parallel_residual`). `index`: which decoder layer it is, for its kind (`kind`: the
    self-attention mask it takes) and its rotary positions."""

    def __init__(self, config, weights, name, index: int = 0):
        super().__init__(config, weights, name)
        self.kind = config.layer_kind(index)
        self.self_attn = MultiHeadAttention(config, weights, f"{name}.self_attn", rotary=config.layer_rotary(index),
                                            local_rope=config.layer_local_rope(index))
        self.norm1 = _pre_norm(config, weights, f"{name}.norm1")
        self.post_attn_norm = _post_norm(config, weights, f"{name}.post_attn_norm")
        if config.has_encoder:
            self.cross_attn = MultiHeadAttention(config, weights, f"{name}.cross_attn")
            self.norm2 = _pre_norm(config, weights, f"{name}.norm2")
            self.post_cross_attn_norm = _post_norm(config, weights, f"{name}.post_cross_attn_norm")
        else:
            self.cross_attn = self.norm2 = self.post_cross_attn_norm = None
        self.ffn = (MixtureOfExperts if config.layer_experts(index) else FeedForward)(config, weights, f"{name}.ffn")
        self.norm3 = None if config.ffn_shares_norm else _pre_norm(config, weights, f"{name}.norm3")
        self.post_ffn_norm = _post_norm(config, weights, f"{name}.post_ffn_norm")

    def __call__(self, x, memory, self_mask, cross_mask, record: Record | None = None, attention_weights=False,
                 position_bias=None):
        c = self.config
        if c.parallel_residual:
            x = self._parallel(x, self_mask, record, attention_weights, position_bias)
            if record is not None:
                record[self.name] = x
            return x
        x = _sublayer(x, self.norm1, lambda y: self.self_attn(y, y, self_mask, position_bias), c, record,
                      self.self_attn.name, attention_weights, self.post_attn_norm)
        if self.cross_attn is not None:
            x = _sublayer(x, self.norm2, lambda y: self.cross_attn(y, memory, cross_mask), c, record,
                          self.cross_attn.name, attention_weights, self.post_cross_attn_norm)
        x = _sublayer(x, self.norm3, lambda y: self.ffn(y, record), c, record, self.ffn.name, attention_weights,
                      self.post_ffn_norm)
        if record is not None:
            record[self.name] = x
        return x

    def _parallel(self, x, self_mask, record: Record | None, attention_weights: bool, position_bias=None):
        """`parallel_residual`: x + attn(norm1(x)) + ffn(norm3(x)), the feed-forward reading norm1(x) under
        `ffn_shares_norm` (one norm, computed once)."""
        y = self.norm1(x)
        attn, weights = self.self_attn(y, y, self_mask, position_bias)
        if record is not None:  # before the feed-forward's, which a mixture of experts precedes with its routing
            if attention_weights:
                record[f"{self.self_attn.name}.weights"] = weights
            record[self.self_attn.name] = attn
        ffn = self.ffn(y if self.norm3 is None else self.norm3(x), record)
        if record is not None:
            record[self.ffn.name] = ffn
        return self.store(self.store(x + attn) + ffn)


class Embedding(_Module):
    """One side's (`src` or `tgt`) input embedding: token embedding (plus its bias if `embed_bias`: what one-hot ids
    through a `Linear(vocab, d_model)` compute), times sqrt(d_model) if `scale_embedding`,
    plus segment embeddings (source side, `type_vocab_size`), plus sinusoidal or learned positions, then a LayerNorm
    if `embed_norm`, then (ALBERT's `embedding_size`) a projection to d_model, then (`embed_zero_padding`,
    DeBERTa) zeros at the padding positions of `mask`. Positions start at `offset`; learned
    ones read row `offset + position_offset` onwards (under `positions_skip_pad`, the rows `ops.skip_pad_positions`
    picks from the ids); `positional="none"` adds none."""

    def __init__(self, config, weights, side: str):
        super().__init__(config, weights, f"{side}_embed")
        self.token_table = weights[token_embedding(config, side)]
        self.token_bias = weights[f"{side}_embed.bias"] if config.embed_bias else None
        if config.positional == "sinusoidal":
            self.position_table = ops.position_sinusoids(config).astype(self.token_table.dtype)
        elif config.positional in ("rope", "none"):
            self.position_table = None  # rotary positions turn q and k inside attention, or relative scores or ALiBi
        else:
            self.position_table = weights[f"{side}_pos.embedding"][config.position_offset:]
        # positions_skip_pad: rows picked per token from the whole table (`ops.skip_pad_positions`)
        self.whole_table = None
        if config.positions_skip_pad:
            self.whole_table = self.position_table if config.positional == "sinusoidal" else \
                weights[f"{side}_pos.embedding"]
        self.type_table = weights["src_type.embedding"] if side == "src" and config.type_vocab_size else None
        self.norm = LayerNorm(config, weights, f"{side}_embed_norm") if config.embed_norm else None
        self.proj = f"{side}_embed_proj" if config.embedding_size is not None else None  # ALBERT: E -> d_model

    def __call__(self, ids: np.ndarray, offset: int = 0, type_ids: np.ndarray | None = None,
                 mask: np.ndarray | None = None) -> np.ndarray:
        x = self.token_table[ids]  # (B, T, D)
        if self.token_bias is not None:
            x = self.store(x + self.token_bias)
        if self.config.scale_embedding:
            x = self.store(x * x.dtype.type(math.sqrt(self.config.d_model)))
        if self.config.embedding_multiplier != 1.0:
            x = self.store(x * x.dtype.type(self.config.embedding_multiplier))
        if self.type_table is not None:  # BERT's order: (token + segment) + position
            x = self.store(x + self.type_table[np.zeros_like(ids) if type_ids is None else type_ids])
        if self.whole_table is not None:
            rows = ops.skip_pad_positions(ids, self.config.pad_id, self.config.position_offset, offset)
            x = self.store(x + self.store(self.whole_table[rows]))  # a sinusoid table too
        elif self.position_table is not None:
            x = self.store(x + self.store(self.position_table[offset:offset + ids.shape[1]]))  # a sinusoid table too
        x = x if self.norm is None else self.norm(x)
        if self.proj is not None:
            x = self.ops.linear(x, self.weights[f"{self.proj}.kernel"], self.weights.get(f"{self.proj}.bias"))
        if self.config.embed_zero_padding:
            x = x * np.asarray(ops.padding_mask(ids, self.config.pad_id) if mask is None else mask, x.dtype)[..., None]
        return x


def stack_bias(config: TransformerConfig, weights, stack: str, query_len: int, key_len: int) -> np.ndarray | None:
    """T5's relative position bias `(1, H, Tq, Tk)` of a stack (`encoder`: bidirectional buckets, `decoder`:
    causal), from its one table `{stack}.relative_bias.embedding`, shared by every layer; None without
    `relative_bias_buckets`."""
    if not config.relative_bias_buckets:
        return None
    return ops.relative_position_bias(weights[f"{stack}.relative_bias.embedding"], config, stack == "encoder",
                                      query_len, key_len)


class Encoder(_Module):
    def __init__(self, config, weights, name="encoder"):
        super().__init__(config, weights, name)
        self.layers = [EncoderLayer(config, weights, f"{name}.layers.{i}", i) for i in range(config.num_encoder_layers)]
        self.final_norm = LayerNorm(config, weights, f"{name}.final_norm") if config.final_norm else None

    def __call__(self, x, masks, record: Record | None = None, attention_weights: bool = False):
        """`masks`: the self-attention mask of each layer kind the layers use (`encoder_attention_masks`)."""
        bias = stack_bias(self.config, self.weights, self.name, x.shape[1], x.shape[1])
        for layer in self.layers:
            x = layer(x, masks[layer.kind], record, attention_weights, position_bias=bias)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if record is not None:
                record[self.final_norm.name] = x
        return x


class Decoder(_Module):
    """`num_decoder_layers` DecoderLayers (and a final norm if `final_norm`). `self_masks`: the self-attention mask
    of each layer kind the layers use (`self_attention_masks`)."""

    def __init__(self, config, weights, name="decoder"):
        super().__init__(config, weights, name)
        self.layers = [DecoderLayer(config, weights, f"{name}.layers.{i}", i)
                       for i in range(config.num_decoder_layers)]
        self.final_norm = LayerNorm(config, weights, f"{name}.final_norm") if config.final_norm else None

    def __call__(self, x, memory, self_masks, cross_mask, record: Record | None = None, attention_weights=False):
        bias = stack_bias(self.config, self.weights, self.name, x.shape[1], x.shape[1])
        for layer in self.layers:
            x = layer(x, memory, self_masks[layer.kind], cross_mask, record, attention_weights, position_bias=bias)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if record is not None:
                record[self.final_norm.name] = x
        return x


class Pooler(_Module):
    """(BERT) tanh(dense(first position's final hidden state)): `(B, S, D)` -> `(B, D)`."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = np.tanh(self.ops.linear(x[:, 0], self.param("kernel"), self.param("bias")))
        return y if self.ops is ops else self.ops.rounded(y)


class HeadTransform(_Module):
    """The head transform before the output projection: dense -> activation -> LayerNorm (BERT's masked-LM head), or
    dense -> LayerNorm -> activation (`head_order="dense-norm-activation"`)."""

    def __init__(self, config, weights, name="head"):
        super().__init__(config, weights, name)
        self.activation = config.head_activation or config.activation
        self.norm = LayerNorm(config, weights, f"{name}.norm", eps=config.head_layer_norm_eps)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = self.ops.linear(x, self.param("dense.kernel"), self.param("dense.bias"))
        activation = self.ops.ACTIVATIONS[self.activation]
        if self.config.head_order == "dense-norm-activation":
            return activation(self.norm(x))
        return self.norm(activation(x))


class Classifier(_Module):
    """A task head (`config.classifier`): `(B, S, D)` final hidden states -> scores, `(B, num_labels)` for a
    sequence (read from the pooler's output, position 0, or the last non-pad position), `(B, S, num_labels)` per
    position; an optional dense layer and activation first (RoBERTa's tanh, DistilBERT's relu)."""

    def __call__(self, x: np.ndarray, mask: np.ndarray, pooled: np.ndarray | None,
                 record: Record | None = None) -> np.ndarray:
        c = self.config
        if c.pooled_classifier:  # "last" and "eos" read the last position of `mask` (`Transformer.decode`)
            x = pooled if c.classifier_input == "pooler" else x[:, 0] if c.classifier_input == "first" else \
                x[np.arange(x.shape[0]), last_positions(mask)]
        if c.classifier_dense is not None:
            x = self.ops.linear(x, self.param("dense.kernel"), self.param("dense.bias"))
            if c.classifier_dense == "tanh":
                x = np.tanh(x) if self.ops is ops else self.ops.rounded(np.tanh(x))
            else:
                x = self.ops.ACTIVATIONS[c.classifier_dense](x)
            if record is not None:
                record["classifier.dense"] = x
        return self.ops.linear(x, self.param("kernel"), self.weights.get("classifier.bias"))


def eos_mask(config: TransformerConfig, src_ids, tgt_len: int) -> np.ndarray:
    """`(B, S)` bool: where the source holds `eos_id`, the positions whose last a classifier_input="eos" classifier
    reads in the decoder's states (BART's sentence representation). The decoder input must be as long as the source
    (BART's is the source shifted right) and every row must hold `eos_id`; either is refused otherwise."""
    src_ids = np.asarray(src_ids)
    if tgt_len != src_ids.shape[1]:
        raise ValueError(f"classifier_input='eos' reads the decoder at the source's eos position: tgt_ids must be as "
                         f"long as src_ids ({src_ids.shape[1]}), received length {tgt_len}")
    found = src_ids == config.eos_id
    missing = np.flatnonzero(~found.any(axis=1))
    if missing.size:
        raise ValueError(f"classifier_input='eos' reads the last eos_id={config.eos_id} of each source row; rows "
                         f"{missing.tolist()} hold none")
    return found


def self_attention_masks(config: TransformerConfig, key_mask: np.ndarray, query_len: int) -> dict[str, np.ndarray]:
    """The decoder's causal self-attention masks `(B, 1, Tq, Tk)`, one per layer kind its layers use (`sliding`:
    within `sliding_window`; `full`), from the key padding mask `(B, Tk)`; the queries are the last `query_len`
    positions."""
    return {kind: ops.attention_mask(key_mask, query_len, causal=True, window=config.kind_window(kind))
            for kind in config.decoder_kinds}


def encoder_attention_masks(config: TransformerConfig, key_mask: np.ndarray, padded_queries: bool = True
                            ) -> dict[str, np.ndarray]:
    """The encoder's self-attention masks `(B, 1, S, S)`, one per layer kind its layers use (`sliding`: within
    `sliding_window` both ways, or back only under `causal_encoder`; `full`), from the key padding mask `(B, S)`.
    Under `padded_queries="average"` (DeBERTa) a padding query attends no key, which `empty_rows="average"` turns
    into equal weights on every key (`padded_queries=False`: the masks without that rule)."""
    masks = {kind: ops.attention_mask(key_mask, key_mask.shape[1], causal=config.causal_encoder,
                                      window=config.kind_window(kind))
             for kind in config.encoder_kinds}
    if padded_queries and config.padded_queries == "average":
        masks = {kind: mask & key_mask[:, None, :, None] for kind, mask in masks.items()}
    return masks


def rows_seeing_no_key(config: TransformerConfig, src_mask: np.ndarray | None, tgt_mask: np.ndarray | None
                       ) -> dict[str, np.ndarray]:
    """Per stack ("encoder", "decoder"; a decoder-only model's ids are `tgt_mask`'s), the positions `(B, T)` whose
    query may attend to no key in some layer: a padded position whose whole sliding window is padding, or a padded
    position before a causal stack's first real token.

    The contract gives such a query zero weights and a zero attention output; libraries differ there (transformers'
    eager attention spreads it evenly over the masked keys, sdpa gives zeros), and the position's later values with
    it. Only padded positions can be such rows, and no real query reads a padded key, so no real position's values
    depend on them. (Rows `padded_queries="average"` defines are the contract's own: not these.)"""
    stacks = {}
    if src_mask is not None and config.has_encoder:
        masks = encoder_attention_masks(config, src_mask, padded_queries=False).values()
        stacks["encoder"] = np.logical_or.reduce([~m.any(axis=-1)[:, 0] for m in masks])
    if tgt_mask is not None and config.has_decoder:
        masks = self_attention_masks(config, tgt_mask, tgt_mask.shape[1]).values()
        stacks["decoder"] = np.logical_or.reduce([~m.any(axis=-1)[:, 0] for m in masks])
    return stacks


def last_positions(mask: np.ndarray) -> np.ndarray:
    """The last real position of each row, `(B,)`: transformers' `(arange(S) * mask).argmax(-1)` (a row without one
    reads position 0)."""
    return np.argmax(np.arange(mask.shape[1]) * np.asarray(mask, np.int64), axis=-1)


class Transformer:
    """The whole model, in one of three families (see `TransformerConfig`):

    - encoder-decoder: `model(src_ids, tgt_ids)` -> logits `(B, T, tgt_vocab_size)`;
    - encoder-only (`num_decoder_layers=0`): `model(src_ids)` -> `(B, S, tgt_vocab_size)`, a class per position;
    - decoder-only (`num_encoder_layers=0`): `model(ids)` -> `(B, T, tgt_vocab_size)`, causal. The one sequence
      takes the first argument and its keyword (`src_mask`); it is embedded by `tgt_embed` and checked against
      `tgt_vocab_size`.

    Masks default to `ids != pad_id` (all True when `pad_id` is None); pass `src_mask` / `tgt_mask` (bool
    `(B, len)`, True = real token) otherwise.
    With `output_projection=False` (a bare backbone) the model returns its final hidden states `(B, len, D)`,
    traced as `last_hidden_state`. `src_type_ids` (segment ids, `(B, S)`, default all 0) need `type_vocab_size`.

    Args:
        config: the hyperparameters.
        weights: canonical weights (see `parameter_shapes`); validated here.
        dtype: compute dtype, float64 (default, the judge) or float32.
        precision: a `lowp.Precision` (bfloat16 / float16 storage, or autocast) to round as a reduced-precision
            framework model does, on float32 arrays; needs dtype float32.
    """

    def __init__(self, config: TransformerConfig, weights: Mapping[str, np.ndarray], dtype=np.float64, *,
                 precision=None):
        validate_weights(config, weights)
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, received {dtype}")
        if precision is not None and dtype != np.float32:
            raise ValueError(f"a reduced-precision model computes in float32, received dtype {dtype}")
        self.config, self.dtype, self.precision = config, dtype, precision
        self.weights = {name: np.asarray(value, dtype=dtype) for name, value in weights.items()}
        if precision is not None:
            self.weights = {name: precision.weight(value) for name, value in self.weights.items()}
        if config.shared_layers:  # ALBERT: every encoder layer reads layer 0's arrays
            first = "encoder.layers.0."
            self.weights.update({f"encoder.layers.{i}.{name[len(first):]}": value
                                 for i in range(1, config.num_encoder_layers)
                                 for name, value in list(self.weights.items()) if name.startswith(first)})
        if config.has_encoder:
            self.src_embed = Embedding(config, self.weights, "src")
            self.encoder = Encoder(config, self.weights)
        if config.has_decoder:
            self.tgt_embed = Embedding(config, self.weights, "tgt")
            self.decoder = Decoder(config, self.weights)
        self.pooler = Pooler(config, self.weights, "pooler") if config.pooler else None
        self.head = HeadTransform(config, self.weights) if config.head_transform else None
        self.classifier = Classifier(config, self.weights, "classifier") if config.classifier else None
        self.output_kernel = None
        if config.output_projection:
            self.output_kernel = (self.weights[tied_output_embedding(config)].T if config.tie_embeddings
                                  else self.weights["output.kernel"])
        self.ops = ops if precision is None else precision
        for module in _submodules(self):
            module.ops = self.ops

    def encode(self, src_ids, src_mask=None, record: Record | None = None, attention_weights: bool = False, *,
               src_type_ids=None):
        """Source ids `(B, S)` -> memory `(B, S, D)`."""
        check_stack(self.config, "encode")
        src_ids, src_mask = self._inputs("src", src_ids, src_mask, self.config.src_vocab_size)
        type_ids = self._type_ids(src_type_ids, src_ids.shape)
        x = self.src_embed(src_ids, type_ids=type_ids, mask=src_mask)
        if record is not None:
            record["encoder.embed"] = x
        return self.encoder(x, encoder_attention_masks(self.config, src_mask), record, attention_weights)

    def decode(self, tgt_ids, memory, src_mask, tgt_mask=None, record: Record | None = None,
               attention_weights: bool = False, *, last_only: bool = False, classifier_mask=None):
        """Target ids `(B, T)` and memory `(B, S, D)` -> logits `(B, T, tgt_vocab_size)` (a decoder-only model:
        memory and src_mask are None). `classifier_mask`: the positions whose last a sequence classifier reads
        (default: the target's real positions; `eos_mask` for classifier_input="eos").

        `last_only`: the logits of the last position only, `(B, 1, tgt_vocab_size)`: what a decoding step reads.
        With a large vocabulary the output projection is a large share of the work per position (a third of the
        multiply-adds with 8000 tokens, d_model 256 and 4 layers), so the steppers skip it for the other positions.
        """
        check_stack(self.config, "decode")
        tgt_ids, tgt_mask = self._inputs("tgt", tgt_ids, tgt_mask, self.config.tgt_vocab_size)
        x = self.tgt_embed(tgt_ids)
        if record is not None:
            record["decoder.embed"] = x
        t = tgt_ids.shape[1]
        cross_mask = None if memory is None else ops.attention_mask(np.asarray(src_mask), t)
        x = self.decoder(x, memory, self_attention_masks(self.config, tgt_mask, t), cross_mask, record,
                         attention_weights)
        return self._output(x[:, -1:] if last_only else x, record,
                            tgt_mask if classifier_mask is None else classifier_mask)

    def __call__(self, src_ids, tgt_ids=None, *, src_mask=None, tgt_mask=None, src_type_ids=None) -> np.ndarray:
        """Logits `(B, T, tgt_vocab_size)` (encoder-only: `(B, S, ...)`; bare backbone: hidden states)."""
        return self._forward(src_ids, tgt_ids, src_mask, tgt_mask, src_type_ids, None, False)

    def trace(self, src_ids, tgt_ids=None, *, src_mask=None, tgt_mask=None, src_type_ids=None,
              attention_weights: bool = False) -> dict[str, np.ndarray]:
        """Every sublayer output under its canonical name, in execution order, ending with `logits` (a bare
        backbone: `last_hidden_state`; `pooler`, if any, comes after the encoder)."""
        record: Record = {}
        self._forward(src_ids, tgt_ids, src_mask, tgt_mask, src_type_ids, record, attention_weights)
        return record

    def _forward(self, src_ids, tgt_ids, src_mask, tgt_mask, src_type_ids, record, attention_weights):
        c = self.config
        check_family(c, tgt_ids, tgt_mask, src_type_ids)
        if c.is_decoder_only:  # the one sequence arrives as src_ids / src_mask
            return self.decode(src_ids, None, None, src_mask, record, attention_weights)
        src_ids, src_mask = self._inputs("src", src_ids, src_mask, c.src_vocab_size)
        if tgt_ids is not None:
            tgt_ids, tgt_mask = self._inputs("tgt", tgt_ids, tgt_mask, c.tgt_vocab_size)
            if tgt_ids.shape[0] != src_ids.shape[0]:
                raise ValueError(f"src_ids and tgt_ids have different batch sizes: {src_ids.shape[0]} and "
                                 f"{tgt_ids.shape[0]}")
        memory = self.encode(src_ids, src_mask, record, attention_weights, src_type_ids=src_type_ids)
        pooled = None
        if self.pooler is not None:
            pooled = self.pooler(memory)
            if record is not None:
                record["pooler"] = pooled
                if c.next_sentence:
                    record["next_sentence"] = self.ops.linear(pooled, self.weights["next_sentence.kernel"],
                                                              self.weights["next_sentence.bias"])
        if c.is_encoder_only:
            return self._output(memory, record, src_mask, pooled)
        reads = eos_mask(c, src_ids, tgt_ids.shape[1]) if c.classifier_input == "eos" else None
        return self.decode(tgt_ids, memory, src_mask, tgt_mask, record, attention_weights, classifier_mask=reads)

    def _output(self, x, record, mask, pooled=None):
        """Final hidden states -> (head transform ->) logits, or a classifier's scores (`logits` too); a bare
        backbone returns the hidden states."""
        if self.classifier is not None:
            if self.head is not None:  # ModernBERT's task heads: the head transform, then the classifier
                x = self.head(x)
                if record is not None:
                    record["head"] = x
            logits = self.classifier(x, mask, pooled, record)
            if record is not None:
                record["logits"] = logits
            return logits
        if self.config.choice_head and record is not None and x.shape[1] == mask.shape[1]:
            record["choice"] = self.ops.linear(x[np.arange(x.shape[0]), last_positions(mask)],
                                               self.weights["choice_head.kernel"], self.weights["choice_head.bias"])
        if self.head is not None:
            x = self.head(x)
            if record is not None:
                record["head"] = x
        if self.output_kernel is None:
            if record is not None:
                record["last_hidden_state"] = x
            return x
        logits = self.ops.linear(x, self.output_kernel, self.weights.get("output.bias"))
        if self.config.logit_divisor != 1.0:
            logits = _times(self, logits, self.config.logit_divisor, divide=True)
        if self.config.final_logit_softcap is not None:
            logits = self.ops.soft_cap(logits, self.config.final_logit_softcap)
        if record is not None:
            record["logits"] = logits
        return logits

    def _inputs(self, side: str, ids, mask, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
        ids = check_token_ids(f"{side}_ids", ids, vocab_size, self.config.max_len)
        if mask is None:
            return ids, ops.padding_mask(ids, self.config.pad_id)
        return ids, check_padding_mask(f"{side}_mask", mask, ids.shape)

    def _type_ids(self, type_ids, shape) -> np.ndarray | None:
        if type_ids is None:
            return None
        return check_type_ids(type_ids, shape, self.config.type_vocab_size, self.config.max_len)


def _submodules(obj):
    """Every `_Module` below `obj` (attributes and lists of them), depth first."""
    for value in vars(obj).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, _Module):
                yield item
                yield from _submodules(item)


def check_family(config: TransformerConfig, tgt_ids, tgt_mask, src_type_ids) -> None:
    """Reject arguments the model's family does not take (the same texts in every backend)."""
    if config.is_encoder_decoder and tgt_ids is None:
        raise ValueError("this encoder-decoder model needs tgt_ids, received None")
    if not config.is_encoder_decoder and (tgt_ids is not None or tgt_mask is not None):
        if config.is_encoder_only:
            raise ValueError("this encoder-only model (num_decoder_layers=0) takes source ids alone, "
                             "received tgt_ids or tgt_mask")
        raise ValueError("this decoder-only model (num_encoder_layers=0) takes one sequence of ids alone (as the "
                         "first argument, its mask as src_mask), received tgt_ids or tgt_mask")
    if src_type_ids is not None and not config.type_vocab_size:
        raise ValueError("src_type_ids need segment embeddings (type_vocab_size > 0); this model has "
                         "type_vocab_size=0")


def check_stack(config: TransformerConfig, method: str) -> None:
    """`encode()` needs an encoder and `decode()` a decoder (the same text in every backend)."""
    present = config.has_encoder if method == "encode" else config.has_decoder
    if not present:
        raise ValueError(f"{method}() needs {'an encoder' if method == 'encode' else 'a decoder'}; this model has "
                         f"num_encoder_layers={config.num_encoder_layers}, num_decoder_layers="
                         f"{config.num_decoder_layers}")


def check_type_ids(type_ids, shape: tuple[int, ...], type_vocab_size: int, max_len: int) -> np.ndarray:
    """Validate `(batch, length)` segment ids against the source ids' shape and `type_vocab_size`."""
    type_ids = check_token_ids("src_type_ids", type_ids, type_vocab_size, max_len)
    if type_ids.shape != tuple(shape):
        raise ValueError(f"src_type_ids must have the shape of src_ids {tuple(shape)}, received {type_ids.shape}")
    return type_ids


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
