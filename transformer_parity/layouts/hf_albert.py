"""Hugging Face ALBERT (`AlbertForMaskedLM`, `AlbertModel`): BERT's post-LN encoder with factorized embeddings and
one set of layer weights shared by every layer.

The token, position and segment tables and `embeddings.LayerNorm` are `embedding_size` wide; the encoder's
`embedding_hidden_mapping_in` projects them to `hidden_size` (canonical `embedding_size` and `src_embed_proj`). Every
layer runs `encoder.albert_layer_groups.0.albert_layers.0` (canonical `shared_layers`, weights `encoder.layers.0.*`):
`attention.query` / `key` / `value` / `dense`, `attention.LayerNorm`, `ffn`, `ffn_output`, `full_layer_layer_norm`.
Several layer groups (`num_hidden_groups`) or several layers per group (`inner_group_num`) are refused. The
masked-LM head `predictions` maps back: `dense` (hidden -> embedding_size) -> `hidden_act` -> `LayerNorm`, then a
`decoder` tied to the word embeddings with its own bias (`predictions.bias`). `AlbertModel` has a pooler (`pooler`,
dense + tanh).
"""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from . import hf_bert
from .family import HFFamily
from .hf import TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, prefix_rule, refuse, token_id
from .hf_tasks import Head, encoder_heads, linear

NAME = "hf-albert"
MODEL_TYPE = "albert"
ARCHITECTURES = ("AlbertForMaskedLM", "AlbertModel")
BASE_PREFIX = "albert."  # where AlbertForMaskedLM keeps its AlbertModel
CONFIG_KEYS = {**hf_bert.CONFIG_KEYS, "embedding_size": "embedding_size"}
_LAYER = "encoder.albert_layer_groups.0.albert_layers.0."  # the one layer every layer runs

BACKBONE = [
    # canonical                                   AlbertModel                                        transform
    ("src_embed.embedding",                       "embeddings.word_embeddings.weight",               "identity"),
    ("src_pos.embedding",                         "embeddings.position_embeddings.weight",           "identity"),
    ("src_type.embedding",                        "embeddings.token_type_embeddings.weight",         "identity"),
    ("src_embed_norm.gamma",                      "embeddings.LayerNorm.weight",                     "identity"),
    ("src_embed_norm.beta",                       "embeddings.LayerNorm.bias",                       "identity"),
    ("src_embed_proj.kernel",                     "encoder.embedding_hidden_mapping_in.weight",      "transpose"),
    ("src_embed_proj.bias",                       "encoder.embedding_hidden_mapping_in.bias",        "identity"),
    ("encoder.layers.0.self_attn.q.kernel",       _LAYER + "attention.query.weight",                 "transpose"),
    ("encoder.layers.0.self_attn.q.bias",         _LAYER + "attention.query.bias",                   "identity"),
    ("encoder.layers.0.self_attn.k.kernel",       _LAYER + "attention.key.weight",                   "transpose"),
    ("encoder.layers.0.self_attn.k.bias",         _LAYER + "attention.key.bias",                     "identity"),
    ("encoder.layers.0.self_attn.v.kernel",       _LAYER + "attention.value.weight",                 "transpose"),
    ("encoder.layers.0.self_attn.v.bias",         _LAYER + "attention.value.bias",                   "identity"),
    ("encoder.layers.0.self_attn.o.kernel",       _LAYER + "attention.dense.weight",                 "transpose"),
    ("encoder.layers.0.self_attn.o.bias",         _LAYER + "attention.dense.bias",                   "identity"),
    ("encoder.layers.0.norm1.gamma",              _LAYER + "attention.LayerNorm.weight",             "identity"),
    ("encoder.layers.0.norm1.beta",               _LAYER + "attention.LayerNorm.bias",               "identity"),
    ("encoder.layers.0.ffn.linear1.kernel",       _LAYER + "ffn.weight",                             "transpose"),
    ("encoder.layers.0.ffn.linear1.bias",         _LAYER + "ffn.bias",                               "identity"),
    ("encoder.layers.0.ffn.linear2.kernel",       _LAYER + "ffn_output.weight",                      "transpose"),
    ("encoder.layers.0.ffn.linear2.bias",         _LAYER + "ffn_output.bias",                        "identity"),
    ("encoder.layers.0.norm2.gamma",              _LAYER + "full_layer_layer_norm.weight",           "identity"),
    ("encoder.layers.0.norm2.beta",               _LAYER + "full_layer_layer_norm.bias",             "identity"),
    ("pooler.kernel",                             "pooler.weight",                                   "transpose"),
    ("pooler.bias",                               "pooler.bias",                                     "identity"),
    ("-",                                         "embeddings.position_ids",                         "position_ids"),
    ("-",                                         "embeddings.token_type_ids",                       "zero_type_ids"),
]
HEAD = [
    ("head.dense.kernel",                         "predictions.dense.weight",                        "transpose"),
    ("head.dense.bias",                           "predictions.dense.bias",                          "identity"),
    ("head.norm.gamma",                           "predictions.LayerNorm.weight",                    "identity"),
    ("head.norm.beta",                            "predictions.LayerNorm.bias",                      "identity"),
    ("output.kernel",                             "predictions.decoder.weight",                      "transpose"),
    ("output.bias",                               "predictions.bias",                                "identity"),
    ("src_embed.embedding",                       "predictions.decoder.weight",                      "tied"),
    ("output.bias",                               "predictions.decoder.bias",                        "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose AlbertModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from ALBERT's `config.json` (and the saved key names: whether a pooler is there
    is not in the config)."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, any(k.startswith(("predictions.", BASE_PREFIX)) for k in keys))
    refuse(hf, {"num_hidden_groups": 1, "inner_group_num": 1, "is_decoder": False, "add_cross_attention": False,
                "position_embedding_type": "absolute"})
    mlm = arch == "AlbertForMaskedLM"
    vocab = integer(hf, "vocab_size")
    layers = integer(hf, "num_hidden_layers")
    if layers < 1:
        raise ValueError("config.json num_hidden_layers=0 is not supported (ALBERT runs its layer at least once)")
    type_vocab = integer(hf, "type_vocab_size", 2)
    if type_vocab < 1:
        raise ValueError(f"config.json type_vocab_size={type_vocab} is not supported (ALBERT always adds a token "
                         "type embedding)")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(hf, "hidden_size"),
        num_heads=integer(hf, "num_attention_heads"), num_encoder_layers=layers, num_decoder_layers=0,
        d_ff=integer(hf, "intermediate_size"), max_len=integer(hf, "max_position_embeddings"),
        dropout=number(hf, "hidden_dropout_prob", 0.0), activation=activation(hf, "hidden_act", "gelu_new"),
        norm_first=False, final_norm=False, layer_norm_eps=number(hf, "layer_norm_eps", 1e-12), positional="learned",
        scale_embedding=False, bias=True, tie_embeddings=mlm and boolean(hf, "tie_word_embeddings", True),
        pad_id=token_id(hf, "pad_token_id", vocab, default=0), output_bias=mlm, output_projection=mlm,
        type_vocab_size=type_vocab, embed_norm=True, head_transform=mlm,
        pooler=not mlm and any(k.endswith("pooler.weight") for k in keys),
        embedding_size=integer(hf, "embedding_size", 128), shared_layers=True)
    notes = [] if mlm else [f"AlbertModel {'with' if config.pooler else 'without'} a pooler (from the saved weights)"]
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no ALBERT equivalent (empty if it has one)."""
    problems = hf_bert.encoder_problems(config, "ALBERT", {"position_offset": 0}, pooled_base=True, segments=True)
    if config.embedding_size is None:
        problems.append("embedding_size=None (ALBERT's embeddings are factorized: give their width)")
    if not config.shared_layers and config.num_encoder_layers > 1:
        problems.append("shared_layers=False (ALBERT's layers share one set of weights)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.src_vocab_size,
          "embedding_size": config.embedding_size, "hidden_size": config.d_model,
          "num_attention_heads": config.num_heads, "num_hidden_layers": config.num_encoder_layers,
          "num_hidden_groups": 1, "inner_group_num": 1, "intermediate_size": config.d_ff,
          "max_position_embeddings": config.max_len, "hidden_act": TO_HF_ACTIVATION[config.activation],
          "layer_norm_eps": config.layer_norm_eps, "hidden_dropout_prob": config.dropout,
          "attention_probs_dropout_prob": config.dropout, "type_vocab_size": config.type_vocab_size,
          "pad_token_id": config.pad_id, "tie_word_embeddings": config.tie_embeddings if config.output_projection
          else True}
    return hf, arch


# Where the AlbertModel sits: under `albert.` in an AlbertForMaskedLM, at the top in a bare AlbertModel; when
# reading, wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm="AlbertForMaskedLM")


# The task classes (`hf_tasks`): sequence scores from the pooler, token and span scores without one; pretraining:
# the masked-LM model plus two sentence-order scores from the pooler (BERT's next-sentence head, as
# `sop_classifier`).
TASK_HEADS = encoder_heads("Albert", {"classifier_input": "pooler", "pooler": True}, linear("classifier", "classifier"),
                           pooled_base=True) + (
    Head("AlbertForPreTraining", "AlbertForMaskedLM",
         {"next_sentence": True, "pooler": True, "output_projection": True},
         linear("next_sentence", "sop_classifier.classifier"), {"pooler": False}),)


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    # the source oracle (`verify`): transformers' class with an output projection and without one, the modules whose
    # outputs are canonical sublayers, under the base model (one module for every layer: its k-th call is layer k),
    # and the head transform's (dense -> activation -> LayerNorm), under the model
    transformers_classes=ARCHITECTURES,
    hooks={"encoder.layers.{i}.self_attn": _LAYER + "attention.dense", "encoder.layers.{i}.ffn": _LAYER + "ffn_output",
           "encoder.layers.{i}": _LAYER[:-1]},
    head_hook="predictions.LayerNorm", task_heads=TASK_HEADS,
    expresses=("embedding_size", "shared_layers"),  # `layouts.FAMILY_ONLY` settings it has
    approximations=(), float64_fix=None)
