"""The Transformer as PyTorch modules, class for class the same as `reference_numpy.model` and `tf_impl.model`.

Weights enter and leave only through the canonical form: `Transformer.from_reference(config, weights)` and
`model.to_reference()`, via its table `weight_table(config)`.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import reference_numpy as rn
from reference_numpy import TransformerConfig
from reference_numpy.schema import tied_output_embedding, token_embedding

from .moe import MixtureOfExperts

# Canonical modules whose torch module is named differently; every other module carries its canonical name.
_MODULES = {"src_embed": "src_embed.token", "tgt_embed": "tgt_embed.token", "src_pos": "src_embed.position",
            "tgt_pos": "tgt_embed.position", "src_type": "src_embed.segment", "src_embed_norm": "src_embed.norm",
            "tgt_embed_norm": "tgt_embed.norm", "pooler": "pooler.dense", "src_embed_proj": "src_embed.proj"}
_LEAVES = {"kernel": ("weight", "transpose"),  # (in, out) <-> nn.Linear's (out, in)
           "bias": ("bias", "identity"), "gamma": ("weight", "identity"), "beta": ("bias", "identity"),
           "embedding": ("weight", "identity"), "sinks": ("sinks", "identity")}


def weight_table(config: TransformerConfig) -> list[tuple[str, str, str]]:
    """canonical name -> torch state_dict name, in the mapping language (`reference_numpy.mapping`), for every
    parameter of `config`: the only place the two naming schemes meet."""
    table = []
    for name in rn.parameter_shapes(config):
        module, leaf = name.rsplit(".", 1)
        if name in ("src_embed.bias", "tgt_embed.bias"):
            table.append((name, name, "identity"))  # the Embedding module's own parameter
            continue
        torch_leaf, transform = _LEAVES[leaf]
        table.append((name, f"{_MODULES.get(module, module)}.{torch_leaf}", transform))
    return table


from .layers import (ACTIVATIONS, AttentionCache, FeedForward, KVCache, MultiHeadAttention, Record, norm_layer,
                     relative_position_bias)


class _ResidualLayer(nn.Module):
    """Shared residual wiring of EncoderLayer and DecoderLayer: post-LN `norm(x + drop(f(x)))` (the paper) or
    pre-LN `x + drop(f(norm(x)))`, with `post_norms` `x + drop(post_norm(f(norm(x))))` (Gemma 2/3; the post norm's
    output recorded as `post_name`)."""

    def _sublayer(self, x, norm, fn, name, record, attention_weights, post_norm=None, post_name=None):
        out = fn(norm(x) if self.config.norm_first and norm is not None else x)
        if isinstance(out, tuple):
            out, weights = out
            if record is not None and attention_weights:
                record[f"{name}.weights"] = weights
        if record is not None:
            record[name] = out
        if post_norm is not None:
            out = post_norm(out)
            if record is not None:
                record[post_name] = out
        out = self.dropout(out)
        if self.config.residual_multiplier != 1.0:  # Granite
            out = out * self.config.residual_multiplier
        return x + out if self.config.norm_first else norm(x + out)


class EncoderLayer(_ResidualLayer):
    """`index`: which encoder layer it is, for its kind (`kind`: the mask it takes), its rotary base and, at 0,
    whether its attention has a norm (`first_attn_norm`)."""

    def __init__(self, config: TransformerConfig, name: str, index: int = 0):
        super().__init__()
        self.config, self.name, self.kind = config, name, config.encoder_layer_kind(index)
        eps = config.layer_norm_eps
        self.self_attn = MultiHeadAttention(config, f"{name}.self_attn", rotary=True, relative=True,
                                            local_rope=config.encoder_local_rope(index))
        own_norm = config.pre_norms and (index > 0 or config.first_attn_norm)
        self.norm1 = norm_layer(config, config.d_model, eps) if own_norm else None
        self.post_attn_norm = norm_layer(config, config.d_model, eps) if config.post_norms else None
        self.ffn = FeedForward(config, f"{name}.ffn")
        self.norm2 = norm_layer(config, config.d_model, eps) if config.pre_norms else None
        self.post_ffn_norm = norm_layer(config, config.d_model, eps) if config.post_norms else None
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask, record: Record | None = None, attention_weights: bool = False, name: str | None = None,
                relative: torch.Tensor | None = None, position_bias=None):
        """`name`: the layer this call records as (`shared_layers` runs one layer under every layer's name);
        `relative`: DeBERTa's relative positions' table, normed (`Encoder.relative_table`); `position_bias`: T5's
        relative position bias `(1, H, S, S)`."""
        name = name or self.name
        x = self._sublayer(x, self.norm1, lambda y: self.self_attn(y, y, mask, attention_weights, relative=relative,
                                                                   position_bias=position_bias),
                           f"{name}.self_attn", record, attention_weights, self.post_attn_norm,
                           f"{name}.post_attn_norm")
        x = self._sublayer(x, self.norm2, self.ffn, f"{name}.ffn", record, attention_weights, self.post_ffn_norm,
                           f"{name}.post_ffn_norm")
        if record is not None:
            record[name] = x
        return x


class DecoderLayer(_ResidualLayer):
    """`index`: which decoder layer it is, for its kind (`kind`: the self-attention mask it takes) and its rotary
    positions."""

    def __init__(self, config: TransformerConfig, name: str, index: int = 0):
        super().__init__()
        self.config, self.name, self.kind = config, name, config.layer_kind(index)
        eps = config.layer_norm_eps
        post = config.post_norms
        self.self_attn = MultiHeadAttention(config, f"{name}.self_attn", rotary=config.layer_rotary(index),
                                            local_rope=config.layer_local_rope(index))
        self.norm1 = norm_layer(config, config.d_model, eps) if config.pre_norms else None
        self.post_attn_norm = norm_layer(config, config.d_model, eps) if post else None
        self.cross_attn = self.norm2 = self.post_cross_attn_norm = None
        if config.has_encoder:  # a decoder-only model has no encoder-decoder attention
            self.cross_attn = MultiHeadAttention(config, f"{name}.cross_attn")
            self.norm2 = norm_layer(config, config.d_model, eps) if config.pre_norms else None
            self.post_cross_attn_norm = norm_layer(config, config.d_model, eps) if post else None
        self.ffn = MixtureOfExperts(config, f"{name}.ffn", FeedForward) if config.layer_experts(index) else \
            FeedForward(config, f"{name}.ffn")
        self.norm3 = norm_layer(config, config.d_model, eps) if config.pre_norms and not config.ffn_shares_norm \
            else None
        self.post_ffn_norm = norm_layer(config, config.d_model, eps) if post else None
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, memory, self_mask, cross_mask, record: Record | None = None, attention_weights=False,
                cache: tuple[AttentionCache, AttentionCache] | None = None, position_bias=None):
        self_cache, cross_cache = (None, None) if cache is None else cache
        if self.config.parallel_residual:
            x = self._parallel(x, self_mask, record, attention_weights, self_cache, position_bias)
            if record is not None:
                record[self.name] = x
            return x
        x = self._sublayer(x, self.norm1,
                           lambda y: self.self_attn(y, y, self_mask, attention_weights, self_cache,
                                                     position_bias=position_bias),
                           self.self_attn.name, record, attention_weights, self.post_attn_norm,
                           f"{self.name}.post_attn_norm")
        if self.cross_attn is not None:
            x = self._sublayer(x, self.norm2,
                               lambda y: self.cross_attn(y, memory, cross_mask, attention_weights, cross_cache),
                               self.cross_attn.name, record, attention_weights, self.post_cross_attn_norm,
                               f"{self.name}.post_cross_attn_norm")
        x = self._sublayer(x, self.norm3, lambda y: self.ffn(y, record), self.ffn.name, record, attention_weights,
                           self.post_ffn_norm, f"{self.name}.post_ffn_norm")
        if record is not None:
            record[self.name] = x
        return x

    def _parallel(self, x, self_mask, record: Record | None, attention_weights: bool, cache, position_bias=None):
        """`parallel_residual`: x + attn(norm1(x)) + ffn(norm3(x)), the feed-forward reading norm1(x) under
        `ffn_shares_norm` (one norm, computed once)."""
        y = self.norm1(x)
        attn, weights = self.self_attn(y, y, self_mask, attention_weights, cache, position_bias=position_bias)
        if record is not None:  # before the feed-forward's, which a mixture of experts precedes with its routing
            if attention_weights:
                record[f"{self.self_attn.name}.weights"] = weights
            record[self.self_attn.name] = attn
        ffn = self.ffn(y if self.norm3 is None else self.norm3(x), record)
        if record is not None:
            record[self.ffn.name] = ffn
        return x + self.dropout(attn) + self.dropout(ffn)


class Embedding(nn.Module):
    """One side's (`src` or `tgt`) input embedding: token embedding (plus its bias if `embed_bias`: what one-hot ids
    through a `Linear(vocab, d_model)` compute), times sqrt(d_model) if `scale_embedding`,
    plus segment embeddings (source side, `type_vocab_size`), plus sinusoidal or learned positions, then a LayerNorm
    if `embed_norm`, then (ALBERT's `embedding_size`) a projection to d_model, then (`embed_zero_padding`) zeros
    where `mask` `(B, T)` (default: the ids' padding) is False. Positions start at `offset`; learned
    ones read row `offset + position_offset` onwards (under `positions_skip_pad`, the rows
    `rn.ops.skip_pad_positions` picks from the ids). Under `share_embeddings` the target side has no token table of
    its own: the caller passes the source's."""

    def __init__(self, config: TransformerConfig, side: str):
        super().__init__()
        self.config = config
        own_table = token_embedding(config, side) == f"{side}_embed.embedding"
        vocab_size = config.src_vocab_size if side == "src" else config.tgt_vocab_size
        e = config.embed_width  # d_model, or ALBERT's embedding_size
        self.token = nn.Embedding(vocab_size, e) if own_table else None
        self.bias = nn.Parameter(torch.zeros(e)) if config.embed_bias else None
        self.segment = (nn.Embedding(config.type_vocab_size, e)
                        if side == "src" and config.type_vocab_size else None)
        self.position = None  # neither table under rotary positions, which turn q and k inside attention
        if config.positional == "learned":
            self.position = nn.Embedding(config.position_rows, e)
        sinusoid = self._sinusoid_table() if config.positional == "sinusoidal" else None
        self.register_buffer("sinusoid", sinusoid, persistent=False)  # (max_len, D)
        self.norm = norm_layer(config, e) if config.embed_norm else None
        self.proj = (nn.Linear(e, config.d_model, bias=config.bias)  # ALBERT: E -> d_model
                     if config.embedding_size is not None else None)
        self.dropout = nn.Dropout(config.dropout)

    def _sinusoid_table(self) -> torch.Tensor:
        """The fixed table, computed once in float64 by the reference (cast later with the module's dtype)."""
        c = self.config
        return torch.from_numpy(rn.ops.position_sinusoids(c))

    def reset_buffers(self) -> None:
        if self.sinusoid is not None:
            self.sinusoid.copy_(self._sinusoid_table())

    def forward(self, ids, offset: int = 0, type_ids=None, token_table: torch.Tensor | None = None, mask=None):
        """`(B, T)` int ids -> `(B, T, D)`; positions start at `offset`. `token_table` `(V, D)`: the shared table
        when this side has none of its own."""
        x = self.token(ids) if token_table is None else F.embedding(ids, token_table)  # (B, T, D)
        if self.bias is not None:
            x = x + self.bias
        if self.config.scale_embedding:
            x = x * math.sqrt(self.config.d_model)
        if self.config.embedding_multiplier != 1.0:  # Granite
            x = x * self.config.embedding_multiplier
        if self.segment is not None:  # BERT's order: (token + segment) + position
            x = x + self.segment(torch.zeros_like(ids) if type_ids is None else type_ids)
        t = ids.shape[1]
        if self.config.positions_skip_pad:  # RoBERTa, M2M100: rows counted over non-pads
            real = (ids != self.config.pad_id).long()
            table = self.sinusoid if self.sinusoid is not None else self.position.weight
            x = x + F.embedding((torch.cumsum(real, dim=1) + offset) * real + (self.config.position_offset - 1), table)
        elif self.sinusoid is not None:
            x = x + self.sinusoid[offset:offset + t]
        elif self.position is not None:
            start = offset + self.config.position_offset
            x = x + self.position.weight[start:start + t]
        x = x if self.norm is None else self.norm(x)
        x = x if self.proj is None else self.proj(x)
        if self.config.embed_zero_padding:
            x = x * (padding_mask(ids, self.config.pad_id) if mask is None else mask)[..., None].to(x.dtype)
        return x


class Encoder(nn.Module):
    """`num_encoder_layers` EncoderLayers (under `shared_layers`, one applied that many times), then a final norm if
    `final_norm`."""

    def __init__(self, config: TransformerConfig, name: str = "encoder"):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config, f"{name}.layers.{i}", i)
                                    for i in range(config.encoder_weight_layers))
        self.final_norm = norm_layer(config, config.d_model) if config.final_norm else None
        self.name, self.depth, self.config = name, config.num_encoder_layers, config
        relative = config.relative_terms is not None  # DeBERTa: the relative positions' table all layers read
        self.rel_embed = nn.Embedding(2 * config.relative_span, config.d_model) if relative else None
        self.rel_embed_norm = norm_layer(config, config.d_model) if relative and config.relative_embed_norm else None
        self.relative_bias = nn.Embedding(config.relative_bias_buckets, config.num_heads) \
            if config.relative_bias_buckets else None  # T5: one table, read by every layer

    def relative_table(self) -> torch.Tensor | None:
        """The relative positions' table `(2 span, D)`, normed where `relative_embed_norm` says; None without."""
        if self.rel_embed is None:
            return None
        return self.rel_embed.weight if self.rel_embed_norm is None else self.rel_embed_norm(self.rel_embed.weight)

    def forward(self, x, masks, record: Record | None = None, attention_weights: bool = False):
        """`masks`: the self-attention mask of each layer kind the layers use (`encoder_attention_masks`)."""
        relative = self.relative_table()
        bias = None if self.relative_bias is None else relative_position_bias(
            self.relative_bias.weight, self.config, True, x.shape[1], x.shape[1])
        for i in range(self.depth):
            layer = self.layers[min(i, len(self.layers) - 1)]  # shared_layers: the one layer, every time
            x = layer(x, masks[layer.kind], record, attention_weights, name=f"{self.name}.layers.{i}",
                      relative=relative, position_bias=bias)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if record is not None:
                record[f"{self.name}.final_norm"] = x
        return x


class Decoder(nn.Module):
    """`num_decoder_layers` DecoderLayers (and a final norm if `final_norm`). `self_masks`: the self-attention mask
    of each layer kind (`sliding`, `full`) the layers use; a kind's mask may be None (nothing hidden)."""

    def __init__(self, config: TransformerConfig, name: str = "decoder"):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config, f"{name}.layers.{i}", i)
                                    for i in range(config.num_decoder_layers))
        self.final_norm = norm_layer(config, config.d_model) if config.final_norm else None
        self.name, self.config = name, config
        self.relative_bias = nn.Embedding(config.relative_bias_buckets, config.num_heads) if config.relative_bias_buckets \
            else None  # T5: one table, read by every layer

    def forward(self, x, memory, self_masks, cross_mask, record: Record | None = None, attention_weights=False,
                cache: KVCache | None = None):
        t = x.shape[1]
        done = 0 if cache is None else cache.length  # a decoding step's queries follow the cached positions
        bias = None if self.relative_bias is None else relative_position_bias(
            self.relative_bias.weight, self.config, False, t, done + t)
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, self_masks[layer.kind], cross_mask, record, attention_weights,
                      None if cache is None else cache.layers[i], position_bias=bias)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if record is not None:
                record[f"{self.name}.final_norm"] = x
        return x


class Pooler(nn.Module):
    """(BERT) tanh(dense(first position's final hidden state)): `(B, S, D)` -> `(B, D)`."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model, bias=config.bias)

    def forward(self, x):
        return torch.tanh(self.dense(x[:, 0]))


class HeadTransform(nn.Module):
    """The head transform before the output projection: dense -> activation -> LayerNorm (BERT's masked-LM head), or
    dense -> LayerNorm -> activation (`head_order="dense-norm-activation"`)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.embed_width, bias=config.bias)  # ALBERT: back to E
        self.activation = ACTIVATIONS[config.head_activation or config.activation]
        eps = config.layer_norm_eps if config.head_layer_norm_eps is None else config.head_layer_norm_eps
        self.norm = norm_layer(config, config.embed_width, eps)
        self.norm_first = config.head_order == "dense-norm-activation"

    def forward(self, x):
        x = self.dense(x)
        return self.activation(self.norm(x)) if self.norm_first else self.norm(self.activation(x))


class OutputProjection(nn.Module):
    """Final states -> logits (soft-capped under `final_logit_softcap`); with `tie_embeddings` the kernel is the
    embedding table."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d, v = config.embed_width, config.tgt_vocab_size  # ALBERT: from the embedding width
        self.weight = None if config.tie_embeddings else nn.Parameter(torch.empty(v, d))
        self.bias = nn.Parameter(torch.zeros(v)) if config.has_output_bias else None
        self.final_logit_softcap, self.logit_divisor = config.final_logit_softcap, config.logit_divisor
        if self.weight is not None:
            nn.init.xavier_uniform_(self.weight)

    def forward(self, x, tied_weight=None):
        logits = F.linear(x, self.weight if self.weight is not None else tied_weight, self.bias)
        if self.logit_divisor != 1.0:  # Granite's logits_scaling
            logits = logits / self.logit_divisor
        cap = self.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap


class Classifier(nn.Module):
    """A task head (`config.classifier`): final hidden states -> scores per sequence (from the pooler's output,
    position 0 or the last non-pad position) or per position; an optional dense layer and activation first."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d = config.d_model
        self.config = config
        self.dense = nn.Linear(d, d) if config.classifier_dense else None
        self.activation = torch.tanh if config.classifier_dense == "tanh" else ACTIVATIONS.get(config.classifier_dense)
        self.weight = nn.Parameter(torch.empty(config.num_labels, d))
        self.bias = nn.Parameter(torch.zeros(config.num_labels)) if config.classifier_bias else None
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x, mask, pooled, record: Record | None = None):
        c = self.config
        if c.pooled_classifier:
            if c.classifier_input == "pooler":
                x = pooled
            elif c.classifier_input == "first":
                x = x[:, 0]
            else:  # "last", "eos": the last position of `mask`
                x = x[torch.arange(x.shape[0], device=x.device), last_positions(mask)]
        if self.dense is not None:
            x = self.activation(self.dense(x))
            if record is not None:
                record["classifier.dense"] = x
        return F.linear(x, self.weight, self.bias)


class Transformer(nn.Module):
    """Embeddings -> encoder and/or decoder -> logits; the PyTorch twin of `reference_numpy.Transformer`.

    Args:
        config: the hyperparameters.
        dtype: parameter and compute dtype (default float32).

    Call it with `(src_ids, tgt_ids)` of shape `(B, S)`, `(B, T)` (integer tensors or arrays); masks come from
    `pad_id` (all True when it is None) unless `src_mask` / `tgt_mask` (bool, `(B, len)`, True = real token) are
    given. An encoder-only model (`num_decoder_layers=0`) takes source ids alone, a decoder-only model
    (`num_encoder_layers=0`) its one sequence as the first argument (mask: `src_mask`). `src_type_ids` are segment
    ids (`type_vocab_size`). A bare backbone (`output_projection=False`) returns its final hidden states. Dropout
    follows `train()` / `eval()`.
    """

    def __init__(self, config: TransformerConfig, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        if config.has_encoder:
            self.src_embed = Embedding(config, "src")
            self.encoder = Encoder(config)
        if config.has_decoder:
            self.tgt_embed = Embedding(config, "tgt")
            self.decoder = Decoder(config)
        self.pooler = Pooler(config) if config.pooler else None
        self.head = HeadTransform(config) if config.head_transform else None
        self.output = OutputProjection(config) if config.output_projection else None
        self.classifier = Classifier(config) if config.classifier else None
        self.next_sentence = nn.Linear(config.d_model, 2) if config.next_sentence else None
        self.choice_head = nn.Linear(config.d_model, 1) if config.choice_head else None
        self.to(dtype)

    # --- weights through the canonical form ---

    @classmethod
    def from_reference(cls, config: TransformerConfig, weights: Mapping[str, np.ndarray],
                       dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> "Transformer":
        """Build from canonical weights; the model takes their dtype unless `dtype` says otherwise."""
        state = rn.to_framework_state(config, weights, weight_table(config))
        if dtype is None:
            dtype = getattr(torch, rn.weights_dtype(weights).name)
        with torch.device("meta"):  # no random init of weights that are about to be replaced
            model = cls(config, dtype=dtype)
        model = model.to_empty(device=device)
        # the state arrays are fresh copies (see reference_numpy.schema), so they can become the parameters
        model.load_state_dict({k: torch.from_numpy(v).to(device=device, dtype=dtype) for k, v in state.items()},
                              strict=True, assign=True)
        for module in model.modules():  # the sinusoid tables are buffers, not in the state dict
            if isinstance(module, Embedding):
                module.reset_buffers()
        return model.eval()

    def to_reference(self) -> dict[str, np.ndarray]:
        """Canonical weights, bit-identical to those the model was built from."""
        state = {k: v.detach().cpu().numpy() for k, v in self.state_dict().items()}
        return rn.from_framework_state(self.config, state, weight_table(self.config))

    # --- forward ---

    def encode(self, src_ids, src_mask=None, record: Record | None = None, attention_weights: bool = False, *,
               src_type_ids=None):
        """Source ids `(B, S)` -> memory `(B, S, D)`."""
        rn.check_stack(self.config, "encode")
        src_ids, src_mask = self._inputs("src", src_ids, src_mask, self.config.src_vocab_size)
        type_ids = self._type_ids(src_type_ids, src_ids)
        x = self.src_embed.dropout(self.src_embed(src_ids, type_ids=type_ids, mask=src_mask))
        if record is not None:
            record["encoder.embed"] = x
        return self.encoder(x, encoder_attention_masks(self.config, src_mask), record, attention_weights)

    def decode(self, tgt_ids, memory, src_mask, tgt_mask=None, record: Record | None = None,
               attention_weights: bool = False, cache: KVCache | None = None, *, last_only: bool = False,
               classifier_mask=None):
        """Target ids `(B, T)` and memory `(B, S, D)` -> logits `(B, T, tgt_vocab_size)` (a decoder-only model:
        memory and src_mask are None). `classifier_mask`: the positions whose last a sequence classifier reads
        (default: the target's real positions; `reference_numpy.eos_mask` for classifier_input="eos").

        With a `cache` (from `new_cache()`), `tgt_ids` (and `tgt_mask`) are only the positions after those already
        decoded into it; their keys and values are appended, and the logits equal those of a full recomputation.
        """
        rn.check_stack(self.config, "decode")
        tgt_ids, tgt_mask = self._inputs("tgt", tgt_ids, tgt_mask, self.config.tgt_vocab_size)
        t = tgt_ids.shape[1]
        offset, key_mask = 0, tgt_mask
        if cache is not None:
            offset = cache.length
            if offset + t > self.config.max_len:
                raise ValueError(f"decoding {t} more position(s) after {offset} cached ones exceeds max_len="
                                 f"{self.config.max_len}")
            if cache.key_mask is not None:
                key_mask = torch.cat([cache.key_mask, tgt_mask], dim=1)  # (B, T_cached + T)
        shared = self.src_embed.token.weight if self.config.share_embeddings else None
        x = self.tgt_embed.dropout(self.tgt_embed(tgt_ids, offset, token_table=shared))
        if record is not None:
            record["decoder.embed"] = x
        cross_mask = None
        if memory is not None:
            cross_mask = attention_mask(torch.as_tensor(src_mask, device=memory.device), t)
        self_masks = {}  # per layer kind; None: one new position that may see every key (a step over real tokens)
        all_real = t == 1 and bool(key_mask.all())
        for kind in self.config.decoder_kinds:
            window = self.config.kind_window(kind)
            self_masks[kind] = None if all_real and (window is None or key_mask.shape[1] <= window) else \
                attention_mask(key_mask, t, causal=True, window=window)
        x = self.decoder(x, memory, self_masks, cross_mask, record, attention_weights, cache)
        if cache is not None:
            cache.key_mask = key_mask
        return self._output(x[:, -1:] if last_only else x, record,
                            key_mask if classifier_mask is None else classifier_mask)

    def new_cache(self) -> KVCache:
        """An empty key/value cache for incremental decoding with `decode(..., cache=...)`."""
        if not self.config.has_decoder:
            raise ValueError("an encoder-only model (num_decoder_layers=0) has no decoder to cache")
        return KVCache(self.config.num_decoder_layers, cross_attention=self.config.has_encoder)

    def forward(self, src_ids, tgt_ids=None, *, src_mask=None, tgt_mask=None, src_type_ids=None):
        """Logits `(B, T, tgt_vocab_size)` (encoder-only: `(B, S, ...)`; bare backbone: hidden states)."""
        return self._forward(src_ids, tgt_ids, src_mask, tgt_mask, src_type_ids, None, False)

    def trace(self, src_ids, tgt_ids=None, *, src_mask=None, tgt_mask=None, src_type_ids=None,
              attention_weights: bool = False) -> dict[str, torch.Tensor]:
        """Every sublayer output under its canonical name, in execution order, ending with `logits` (a bare
        backbone: `last_hidden_state`; `pooler`, if any, comes after the encoder)."""
        record: Record = {}
        self._forward(src_ids, tgt_ids, src_mask, tgt_mask, src_type_ids, record, attention_weights)
        return record

    def _forward(self, src_ids, tgt_ids, src_mask, tgt_mask, src_type_ids, record, attention_weights):
        c = self.config
        rn.check_family(c, tgt_ids, tgt_mask, src_type_ids)
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
                if self.next_sentence is not None:
                    record["next_sentence"] = self.next_sentence(pooled)
        if c.is_encoder_only:
            return self._output(memory, record, src_mask, pooled)
        reads = None
        if c.classifier_input == "eos":  # checked as the reference checks it
            reads = torch.as_tensor(rn.eos_mask(c, src_ids.cpu().numpy(), tgt_ids.shape[1]), device=memory.device)
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
        if self.choice_head is not None and record is not None and x.shape[1] == mask.shape[1]:
            record["choice"] = self.choice_head(x[torch.arange(x.shape[0], device=x.device), last_positions(mask)])
        if self.head is not None:
            x = self.head(x)
            if record is not None:
                record["head"] = x
        if self.output is None:
            if record is not None:
                record["last_hidden_state"] = x
            return x
        tied = None
        if self.config.tie_embeddings:
            side = tied_output_embedding(self.config).split("_", 1)[0]  # "src" or "tgt"
            tied = getattr(self, f"{side}_embed").token.weight
        logits = self.output(x, tied)
        if record is not None:
            record["logits"] = logits
        return logits

    def _inputs(self, side: str, ids, mask, vocab_size: int):
        """Validate ids (and an explicit mask) with the reference's checks; returns tensors on the model's device."""
        device = next(self.parameters()).device
        rn.check_token_ids(f"{side}_ids", _host(ids), vocab_size, self.config.max_len)
        ids = torch.as_tensor(ids, device=device)
        if mask is None:
            return ids, padding_mask(ids, self.config.pad_id)
        rn.check_padding_mask(f"{side}_mask", _host(mask), tuple(ids.shape))
        return ids, torch.as_tensor(mask, device=device)

    def _type_ids(self, type_ids, ids):
        if type_ids is None:
            return None
        rn.check_type_ids(_host(type_ids), tuple(ids.shape), self.config.type_vocab_size, self.config.max_len)
        return torch.as_tensor(type_ids, device=ids.device)


def _host(x) -> np.ndarray:
    """A tensor as a NumPy array; bfloat16, which NumPy has no dtype for, widens exactly to float32."""
    if not isinstance(x, torch.Tensor):
        return np.asarray(x)
    x = x.detach().cpu()
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


def padding_mask(ids: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """`(B, T)` ids -> `(B, T)` bool, True = real token (every one when the model has no pad token)."""
    return torch.ones_like(ids, dtype=torch.bool) if pad_id is None else ids != pad_id


def last_positions(mask: torch.Tensor) -> torch.Tensor:
    """The last True position of each row of `mask` `(B, S)`: transformers' `(arange(S) * mask).argmax(-1)`."""
    return (torch.arange(mask.shape[1], device=mask.device) * mask.long()).argmax(-1)


def attention_mask(key_mask: torch.Tensor, query_len: int, causal: bool = False, window: int | None = None
                   ) -> torch.Tensor:
    """Key padding mask `(B, Tk)` (True = real token) -> `(B, 1, Tq, Tk)` attention mask, True = may attend;
    `causal` (the queries are the last Tq positions), within a sliding `window` if given (i - j < window); not
    causal, a `window` is both ways (|i - j| < window)."""
    mask = key_mask[:, None, None, :].expand(-1, 1, query_len, -1)  # (B, 1, Tq, Tk)
    tk = key_mask.shape[1]
    if causal or window is not None:
        ones = torch.ones(query_len, tk, dtype=torch.bool, device=key_mask.device)
    if causal:
        mask = mask & ones.tril(tk - query_len)
    if window is not None:
        mask = mask & ones.triu(tk - query_len - window + 1)
        if not causal:
            mask = mask & ones.tril(tk - query_len + window - 1)
    return mask


def encoder_attention_masks(config: TransformerConfig, key_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The encoder's self-attention mask `(B, 1, S, S)` of each layer kind its layers use
    (`reference_numpy.model.encoder_attention_masks`)."""
    masks = {kind: attention_mask(key_mask, key_mask.shape[1], causal=config.causal_encoder,
                                  window=config.kind_window(kind)) for kind in config.encoder_kinds}
    if config.padded_queries == "average":  # no key for a padding query
        masks = {kind: mask & key_mask[:, None, :, None] for kind, mask in masks.items()}
    return masks
