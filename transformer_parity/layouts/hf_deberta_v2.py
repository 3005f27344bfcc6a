"""Hugging Face DeBERTa-v2 and v3 (`DebertaV2ForMaskedLM`, `DebertaV2Model`; model_type `deberta-v2`): a post-LN
encoder with disentangled attention.

Each layer's self-attention adds to the content scores q k^T the position terms `pos_att_type` names (canonical
`relative_terms`): "c2p", each query against the key projection of its relative position to the key, and "p2c", each
key against the query projection of that position, all scaled by 1/sqrt(head_dim * (1 + number of terms))
(canonical `attention_scale` as that number). The relative positions' table `encoder.rel_embeddings` (2 *
`position_buckets` rows, or 2 * `max_relative_positions` without buckets; canonical `encoder.rel_embed`) is shared
by every layer and normed by `encoder.LayerNorm` under `norm_rel_ebd="layer_norm"`; distances beyond
`position_buckets // 2` are log-bucketed up to `max_relative_positions`. Under `share_att_key` the positions are
projected by the layer's own `query_proj` / `key_proj`, else by `pos_query_proj` / `pos_key_proj`. DeBERTa-v3
(`position_biased_input=false`) adds no absolute positions (canonical `positional="none"`). The embeddings, after
their LayerNorm, are multiplied by the attention mask (`embed_zero_padding`), and a padding position's query attends
every position with equal weights (`padded_queries="average"`: transformers' pairwise mask leaves its row all
`finfo.min`). The masked-LM head is the legacy one (`cls.predictions`: dense -> activation -> LayerNorm, a decoder
tied to the word embeddings with its own bias); the task heads read the first position through `pooler.dense` and
`pooler_hidden_act` (the ContextPooler). Refused, each in one line: `legacy=false` (the `lm_predictions` head),
`conv_kernel_size` > 0 (the convolution beside the first layer), `embedding_size` != `hidden_size` (DeBERTa projects
before its norm, ALBERT after), another `attention_head_size` or `pooler_hidden_size`, a `pos_att_type` other than
c2p and p2c, relative attention without a position term, an untied masked-LM decoder.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Collection

import reference_numpy as rn

from .family import Float64Fix, HFFamily
from .hf import TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, prefix_rule, refuse, token_id
from .hf_tasks import encoder_heads, linear

NAME = "hf-deberta-v2"
MODEL_TYPE = "deberta-v2"
ARCHITECTURES = ("DebertaV2ForMaskedLM", "DebertaV2Model")
BASE_PREFIX = "deberta."  # where DebertaV2ForMaskedLM keeps its DebertaV2Model
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_size",
               "num_heads": "num_attention_heads", "num_encoder_layers": "num_hidden_layers",
               "d_ff": "intermediate_size", "max_len": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
               "relative_buckets": "position_buckets", "max_relative_positions": "max_relative_positions",
               "relative_terms": "pos_att_type"}
TERMS = ("c2p", "p2c")  # pos_att_type's terms we compute (transformers computes no others)

_LAYER = "encoder.layer.{i}."
_ATTN = "encoder.layers.{i}.self_attn."
EMBEDDINGS = [
    # canonical                                   DebertaV2Model                                     transform
    ("src_embed.embedding",                       "embeddings.word_embeddings.weight",               "identity"),
    ("src_embed_norm.gamma",                      "embeddings.LayerNorm.weight",                     "identity"),
    ("src_embed_norm.beta",                       "embeddings.LayerNorm.bias",                       "identity"),
]
POSITIONS = [("src_pos.embedding",                "embeddings.position_embeddings.weight",           "identity")]
SEGMENTS = [("src_type.embedding",                "embeddings.token_type_embeddings.weight",         "identity")]
LAYERS = [
    (_ATTN + "q.kernel",                          _LAYER + "attention.self.query_proj.weight",       "transpose"),
    (_ATTN + "q.bias",                            _LAYER + "attention.self.query_proj.bias",         "identity"),
    (_ATTN + "k.kernel",                          _LAYER + "attention.self.key_proj.weight",         "transpose"),
    (_ATTN + "k.bias",                            _LAYER + "attention.self.key_proj.bias",           "identity"),
    (_ATTN + "v.kernel",                          _LAYER + "attention.self.value_proj.weight",       "transpose"),
    (_ATTN + "v.bias",                            _LAYER + "attention.self.value_proj.bias",         "identity"),
    (_ATTN + "o.kernel",                          _LAYER + "attention.output.dense.weight",          "transpose"),
    (_ATTN + "o.bias",                            _LAYER + "attention.output.dense.bias",            "identity"),
    ("encoder.layers.{i}.norm1.gamma",            _LAYER + "attention.output.LayerNorm.weight",      "identity"),
    ("encoder.layers.{i}.norm1.beta",             _LAYER + "attention.output.LayerNorm.bias",        "identity"),
    ("encoder.layers.{i}.ffn.linear1.kernel",     _LAYER + "intermediate.dense.weight",              "transpose"),
    ("encoder.layers.{i}.ffn.linear1.bias",       _LAYER + "intermediate.dense.bias",                "identity"),
    ("encoder.layers.{i}.ffn.linear2.kernel",     _LAYER + "output.dense.weight",                    "transpose"),
    ("encoder.layers.{i}.ffn.linear2.bias",       _LAYER + "output.dense.bias",                      "identity"),
    ("encoder.layers.{i}.norm2.gamma",            _LAYER + "output.LayerNorm.weight",                "identity"),
    ("encoder.layers.{i}.norm2.beta",             _LAYER + "output.LayerNorm.bias",                  "identity"),
]
POSITION_PROJECTIONS = {  # a term's own projection of the relative positions (without share_att_key)
    "c2p": [(_ATTN + "pos_k.kernel",              _LAYER + "attention.self.pos_key_proj.weight",     "transpose"),
            (_ATTN + "pos_k.bias",                _LAYER + "attention.self.pos_key_proj.bias",       "identity")],
    "p2c": [(_ATTN + "pos_q.kernel",              _LAYER + "attention.self.pos_query_proj.weight",   "transpose"),
            (_ATTN + "pos_q.bias",                _LAYER + "attention.self.pos_query_proj.bias",     "identity")],
}
RELATIVE = [("encoder.rel_embed.embedding",       "encoder.rel_embeddings.weight",                   "identity")]
RELATIVE_NORM = [
    ("encoder.rel_embed_norm.gamma",              "encoder.LayerNorm.weight",                        "identity"),
    ("encoder.rel_embed_norm.beta",               "encoder.LayerNorm.bias",                          "identity"),
]
HEAD = [  # the legacy masked-LM head (LegacyDebertaV2OnlyMLMHead)
    ("head.dense.kernel",                         "cls.predictions.transform.dense.weight",          "transpose"),
    ("head.dense.bias",                           "cls.predictions.transform.dense.bias",            "identity"),
    ("head.norm.gamma",                           "cls.predictions.transform.LayerNorm.weight",      "identity"),
    ("head.norm.beta",                            "cls.predictions.transform.LayerNorm.bias",        "identity"),
    ("output.kernel",                             "cls.predictions.decoder.weight",                  "transpose"),
    ("output.bias",                               "cls.predictions.bias",                            "identity"),
    ("src_embed.embedding",                       "cls.predictions.decoder.weight",                  "tied"),
    ("output.bias",                               "cls.predictions.decoder.bias",                    "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose DebertaV2Model sits under `prefix`."""
    backbone = EMBEDDINGS + (POSITIONS if config.positional == "learned" else []) + (
        SEGMENTS if config.type_vocab_size else []) + LAYERS
    if config.relative_terms:
        backbone += RELATIVE + (RELATIVE_NORM if config.relative_embed_norm else [])
        if not config.relative_shares_qk:
            backbone += [entry for term in config.relative_terms for entry in POSITION_PROJECTIONS[term]]
    return [(c, prefix + e, t) for c, e, t in backbone] + HEAD


def _terms(hf: dict[str, Any]) -> tuple[str, ...]:
    """pos_att_type as transformers reads it ("p2c|c2p" or a list), each term checked."""
    value = hf.get("pos_att_type")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [x.strip() for x in value.lower().split("|")]
    if not isinstance(value, list) or not all(isinstance(t, str) and t in TERMS for t in value):
        raise ValueError(f"config.json pos_att_type={hf['pos_att_type']!r} is not supported (only the terms "
                         f"{', '.join(TERMS)}, as a list or joined by '|')")
    return tuple(t for t in TERMS if t in value)


def _rel_norm(hf: dict[str, Any]) -> bool:
    """norm_rel_ebd: "none" or "layer_norm" (transformers splits it by '|')."""
    value = hf.get("norm_rel_ebd", "none")
    parts = {x.strip() for x in value.lower().split("|")} if isinstance(value, str) else None
    if parts is None or not parts <= {"none", "layer_norm"}:
        raise ValueError(f"config.json norm_rel_ebd={value!r} is not supported (only 'none' or 'layer_norm')")
    return "layer_norm" in parts


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from DeBERTa-v2's `config.json`."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, any(k.startswith(("cls.", BASE_PREFIX)) for k in keys))
    refuse(hf, {"legacy": True, "conv_kernel_size": 0})
    mlm = arch == ARCHITECTURES[0]
    if mlm:  # untied, the legacy decoder adds its own bias and never reads cls.predictions.bias
        refuse(hf, {"tie_word_embeddings": True})
    vocab, hidden, heads = integer(hf, "vocab_size"), integer(hf, "hidden_size"), integer(hf, "num_attention_heads")
    for key in ("embedding_size", "pooler_hidden_size"):
        if hf.get(key, hidden) != hidden:
            raise ValueError(f"config.json {key}={hf[key]!r} is not supported (only hidden_size={hidden})")
    if heads and hidden % heads == 0 and hf.get("attention_head_size", hidden // heads) != hidden // heads:
        raise ValueError(f"config.json attention_head_size={hf['attention_head_size']!r} is not supported (only "
                         f"hidden_size / num_attention_heads = {hidden // heads})")
    terms, relative = _terms(hf), boolean(hf, "relative_attention", False)
    if relative and not terms:
        raise ValueError("config.json relative_attention=true with pos_att_type naming no term is not supported (a "
                         "relative positions' table no attention reads)")
    max_len = integer(hf, "max_position_embeddings", 512)
    max_relative = hf.get("max_relative_positions", -1)
    if isinstance(max_relative, bool) or not isinstance(max_relative, int):
        raise ValueError(f"config.json max_relative_positions must be an integer, received {max_relative!r}")
    buckets = hf.get("position_buckets", -1)
    if isinstance(buckets, bool) or not isinstance(buckets, int):
        raise ValueError(f"config.json position_buckets must be an integer, received {buckets!r}")
    head_dim = hidden // heads if heads else 1
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=hidden, num_heads=heads,
        num_encoder_layers=integer(hf, "num_hidden_layers"), num_decoder_layers=0,
        d_ff=integer(hf, "intermediate_size"), max_len=max_len, dropout=number(hf, "hidden_dropout_prob", 0.1),
        activation=activation(hf, "hidden_act", "gelu"), norm_first=False, final_norm=False,
        layer_norm_eps=number(hf, "layer_norm_eps", 1e-7),
        positional="learned" if boolean(hf, "position_biased_input", True) else "none",
        scale_embedding=False, bias=True, tie_embeddings=mlm,
        pad_id=token_id(hf, "pad_token_id", vocab, default=0) or 0, output_bias=mlm, output_projection=mlm,
        type_vocab_size=integer(hf, "type_vocab_size", 0), embed_norm=True, head_transform=mlm, pooler=False,
        attention_scale=1.0 / math.sqrt(head_dim * (1 + len(terms))) if terms else "head",
        relative_terms=terms if relative else None,
        relative_buckets=max(buckets, 0) if relative else 0,
        max_relative_positions=(max_relative if max_relative >= 1 else max_len) if relative else 0,
        relative_embed_norm=relative and _rel_norm(hf),
        relative_shares_qk=relative and boolean(hf, "share_att_key", False),
        embed_zero_padding=True, padded_queries="average")
    return config, arch, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no DeBERTa-v2 equivalent (empty if it has one)."""
    wanted = {"num_decoder_layers": 0, "norm_first": False, "final_norm": False, "scale_embedding": False,
              "bias": True, "embed_norm": True, "embed_zero_padding": True, "padded_queries": "average",
              "position_offset": 0, "embedding_size": None, "pooler": False}
    problems = [f"{k}={getattr(config, k)!r} (DeBERTa-v2 needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.positional not in ("learned", "none"):
        problems.append(f"positional={config.positional!r} (DeBERTa-v2 has learned absolute positions or none)")
    terms = config.relative_terms or ()
    scale = 1.0 / math.sqrt(config.head_dim * (1 + len(terms)))
    if not math.isclose(config.attention_scale_factor, scale, rel_tol=1e-12):
        problems.append(f"attention_scale={config.attention_scale!r} (DeBERTa-v2 scales by 1/sqrt(head_dim * "
                        f"{1 + len(terms)}) = {scale!r} with relative_terms={config.relative_terms!r})")
    if config.output_projection and not (config.head_transform and config.has_output_bias and config.tie_embeddings):
        problems.append("an output projection without head_transform, an output bias or tied embeddings (not "
                        "DeBERTa-v2's masked-LM model)")
    for field, value, encoder in (("head_activation", config.activation, "activation"),
                                  ("head_layer_norm_eps", config.layer_norm_eps, "layer_norm_eps")):
        if config.head_transform and (getattr(config, field) or getattr(config, encoder)) != value:
            problems.append(f"{field}={getattr(config, field)!r} (DeBERTa-v2's head uses the encoder's {encoder})")
    if config.output_projection and config.tgt_vocab_size != config.src_vocab_size:
        problems.append(f"tgt_vocab_size={config.tgt_vocab_size} != src_vocab_size={config.src_vocab_size}")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    relative = config.relative_terms is not None
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.src_vocab_size,
          "hidden_size": config.d_model, "num_attention_heads": config.num_heads,
          "num_hidden_layers": config.num_encoder_layers, "intermediate_size": config.d_ff,
          "max_position_embeddings": config.max_len, "hidden_act": TO_HF_ACTIVATION[config.activation],
          "layer_norm_eps": config.layer_norm_eps, "hidden_dropout_prob": config.dropout,
          "attention_probs_dropout_prob": config.dropout, "type_vocab_size": config.type_vocab_size,
          "pad_token_id": config.pad_id, "position_biased_input": config.positional == "learned",
          "relative_attention": relative, "pos_att_type": list(config.relative_terms or ()),
          "position_buckets": config.relative_buckets if config.relative_buckets else -1,
          "max_relative_positions": config.max_relative_positions if relative else -1,
          "norm_rel_ebd": "layer_norm" if config.relative_embed_norm else "none",
          "share_att_key": config.relative_shares_qk, "legacy": True, "pooler_hidden_act": "gelu",
          "tie_word_embeddings": config.tie_embeddings if config.output_projection else True}
    return hf, arch


# Where the DebertaV2Model sits: under `deberta.` in every class but the bare DebertaV2Model; when reading, wherever
# the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, bare=ARCHITECTURES[1])


def exact_scale(model64, config: rn.TransformerConfig) -> None:
    """transformers takes the scale's square root in float32 (`scaled_size_sqrt`) even in a float64 model: the float64
    run takes it in float64. The module function is replaced; a float32 model computes exactly what it did."""
    import torch
    from transformers.models.deberta_v2 import modeling_deberta_v2

    def scaled_size_sqrt(layer, scale_factor):
        dtype = torch.float64 if layer.dtype == torch.float64 else torch.float32
        return torch.sqrt(torch.tensor(layer.size(-1) * scale_factor, dtype=dtype))

    modeling_deberta_v2.scaled_size_sqrt = scaled_size_sqrt


# The task classes (`hf_tasks`): sequence and multiple-choice scores from the first position through the
# ContextPooler (`pooler.dense`, then pooler_hidden_act: GELU only), then `classifier`; token and span scores from
# every position.
_FIRST = {"classifier_input": "first", "classifier_dense": "gelu", "pooler": False}
_POOLED = (_FIRST, linear("classifier.dense", "pooler.dense") + linear("classifier", "classifier"))
TASK_HEADS = tuple(replace(head, hf_keys={"pooler_hidden_act": ("gelu", "gelu")}) if "classifier.dense.kernel" in
                   {c for c, _, _ in head.weights} else head
                   for head in encoder_heads("DebertaV2", *_POOLED, pooled_base=False))


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    # the source oracle (`verify`): with an output projection, without one; the modules whose outputs are canonical
    # sublayers, under the base model, and the head transform's
    transformers_classes=ARCHITECTURES,
    hooks={"encoder.layers.{i}.self_attn": "encoder.layer.{i}.attention.output.dense",
           "encoder.layers.{i}.ffn": "encoder.layer.{i}.output.dense", "encoder.layers.{i}": "encoder.layer.{i}"},
    head_hook="cls.predictions.transform", task_heads=TASK_HEADS,
    expresses=("relative_terms", "relative_buckets", "max_relative_positions", "relative_embed_norm",
               "relative_shares_qk", "embed_zero_padding", "padded_queries", "attention_scale"),
    approximations=(),
    float64_fix=Float64Fix("the attention scale's square root, which transformers takes in float32, taken in float64",
                           exact_scale))
