"""Hugging Face DistilBERT (`DistilBertForMaskedLM`, `DistilBertModel`): BERT's post-LN encoder without segment
embeddings or a pooler, under its own names and config keys.

Token + learned position embeddings, then `embeddings.LayerNorm`; each `transformer.layer.{i}` has `attention.q_lin`
/ `k_lin` / `v_lin` / `out_lin`, `sa_layer_norm`, `ffn.lin1` / `lin2` and `output_layer_norm` (`nn.Linear`s,
transposed to canonical kernels). Every LayerNorm has epsilon 1e-12 (fixed in transformers' code, not in config.json).
The masked-LM head is `vocab_transform` -> `activation` -> `vocab_layer_norm`, then `vocab_projector` (tied to the
word embeddings, with its own bias). `sinusoidal_pos_embds=true` (a fixed sinusoid table) is refused: the forward
reads the saved table as a learned one would, but the setting means a table that is not trained and that resizing
recomputes, which a learned canonical table is not, and a sinusoidal one would have to be checked row by row against
transformers' float32 formula; neither is guessed.
"""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from . import hf_bert
from .family import HFFamily
from .hf import TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, prefix_rule, refuse, token_id
from .hf_tasks import encoder_heads, linear

NAME = "hf-distilbert"
MODEL_TYPE = "distilbert"
ARCHITECTURES = ("DistilBertForMaskedLM", "DistilBertModel")
BASE_PREFIX = "distilbert."  # where DistilBertForMaskedLM keeps its DistilBertModel
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "dim",
               "num_heads": "n_heads", "num_encoder_layers": "n_layers", "d_ff": "hidden_dim",
               "max_len": "max_position_embeddings"}
LAYER_NORM_EPS = 1e-12  # every DistilBERT LayerNorm's, in transformers' code

_LAYER = "transformer.layer.{i}."
BACKBONE = [
    # canonical                                   DistilBertModel                                    transform
    ("src_embed.embedding",                       "embeddings.word_embeddings.weight",               "identity"),
    ("src_pos.embedding",                         "embeddings.position_embeddings.weight",           "identity"),
    ("src_embed_norm.gamma",                      "embeddings.LayerNorm.weight",                     "identity"),
    ("src_embed_norm.beta",                       "embeddings.LayerNorm.bias",                       "identity"),
    ("encoder.layers.{i}.self_attn.q.kernel",     _LAYER + "attention.q_lin.weight",                 "transpose"),
    ("encoder.layers.{i}.self_attn.q.bias",       _LAYER + "attention.q_lin.bias",                   "identity"),
    ("encoder.layers.{i}.self_attn.k.kernel",     _LAYER + "attention.k_lin.weight",                 "transpose"),
    ("encoder.layers.{i}.self_attn.k.bias",       _LAYER + "attention.k_lin.bias",                   "identity"),
    ("encoder.layers.{i}.self_attn.v.kernel",     _LAYER + "attention.v_lin.weight",                 "transpose"),
    ("encoder.layers.{i}.self_attn.v.bias",       _LAYER + "attention.v_lin.bias",                   "identity"),
    ("encoder.layers.{i}.self_attn.o.kernel",     _LAYER + "attention.out_lin.weight",               "transpose"),
    ("encoder.layers.{i}.self_attn.o.bias",       _LAYER + "attention.out_lin.bias",                 "identity"),
    ("encoder.layers.{i}.norm1.gamma",            _LAYER + "sa_layer_norm.weight",                   "identity"),
    ("encoder.layers.{i}.norm1.beta",             _LAYER + "sa_layer_norm.bias",                     "identity"),
    ("encoder.layers.{i}.ffn.linear1.kernel",     _LAYER + "ffn.lin1.weight",                        "transpose"),
    ("encoder.layers.{i}.ffn.linear1.bias",       _LAYER + "ffn.lin1.bias",                          "identity"),
    ("encoder.layers.{i}.ffn.linear2.kernel",     _LAYER + "ffn.lin2.weight",                        "transpose"),
    ("encoder.layers.{i}.ffn.linear2.bias",       _LAYER + "ffn.lin2.bias",                          "identity"),
    ("encoder.layers.{i}.norm2.gamma",            _LAYER + "output_layer_norm.weight",               "identity"),
    ("encoder.layers.{i}.norm2.beta",             _LAYER + "output_layer_norm.bias",                 "identity"),
    ("-",                                         "embeddings.position_ids",                         "position_ids"),
]
HEAD = [
    ("head.dense.kernel",                         "vocab_transform.weight",                          "transpose"),
    ("head.dense.bias",                           "vocab_transform.bias",                            "identity"),
    ("head.norm.gamma",                           "vocab_layer_norm.weight",                         "identity"),
    ("head.norm.beta",                            "vocab_layer_norm.bias",                           "identity"),
    ("output.kernel",                             "vocab_projector.weight",                          "transpose"),
    ("output.bias",                               "vocab_projector.bias",                            "identity"),
    ("src_embed.embedding",                       "vocab_projector.weight",                          "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose DistilBertModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from DistilBERT's `config.json` (and the saved key names)."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, any(k.startswith(("vocab_", BASE_PREFIX)) for k in keys))
    refuse(hf, {"sinusoidal_pos_embds": False, "is_decoder": False, "add_cross_attention": False})
    mlm = arch == "DistilBertForMaskedLM"
    vocab = integer(hf, "vocab_size")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(hf, "dim"), num_heads=integer(hf, "n_heads"),
        num_encoder_layers=integer(hf, "n_layers"), num_decoder_layers=0, d_ff=integer(hf, "hidden_dim"),
        max_len=integer(hf, "max_position_embeddings"), dropout=number(hf, "dropout", 0.1),
        activation=activation(hf, "activation", "gelu"), norm_first=False, final_norm=False,
        layer_norm_eps=LAYER_NORM_EPS, positional="learned", scale_embedding=False, bias=True,
        tie_embeddings=mlm and boolean(hf, "tie_word_embeddings", True),
        pad_id=token_id(hf, "pad_token_id", vocab, default=0), output_bias=mlm, output_projection=mlm,
        type_vocab_size=0, embed_norm=True, head_transform=mlm, pooler=False)
    return config, arch, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no DistilBERT equivalent (empty if it has one)."""
    return hf_bert.encoder_problems(config, "DistilBERT", {"position_offset": 0, "layer_norm_eps": LAYER_NORM_EPS},
                                    pooled_base=False, segments=False)


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.src_vocab_size,
          "dim": config.d_model, "n_heads": config.num_heads, "n_layers": config.num_encoder_layers,
          "hidden_dim": config.d_ff, "max_position_embeddings": config.max_len,
          "activation": TO_HF_ACTIVATION[config.activation], "dropout": config.dropout,
          "attention_dropout": config.dropout, "sinusoidal_pos_embds": False, "pad_token_id": config.pad_id,
          "tie_word_embeddings": config.tie_embeddings if config.output_projection else True}
    return hf, arch


# Where the DistilBertModel sits: under `distilbert.` in a DistilBertForMaskedLM, at the top in a bare
# DistilBertModel; when reading, wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm="DistilBertForMaskedLM")


# The task classes (`hf_tasks`): the sequence head reads position 0 through `pre_classifier` and ReLU.
TASK_HEADS = encoder_heads("DistilBert", {"classifier_input": "first", "classifier_dense": "relu", "pooler": False},
                           linear("classifier.dense", "pre_classifier") + linear("classifier", "classifier"),
                           pooled_base=False)


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    # the source oracle (`verify`): transformers' class with an output projection and without one, the modules whose
    # outputs are canonical sublayers, under the base model, and the head transform's, under the model
    transformers_classes=ARCHITECTURES,
    hooks={"encoder.layers.{i}.self_attn": "transformer.layer.{i}.attention.out_lin",
           "encoder.layers.{i}.ffn": "transformer.layer.{i}.ffn.lin2", "encoder.layers.{i}": "transformer.layer.{i}"},
    head_hook="vocab_layer_norm", task_heads=TASK_HEADS,
    expresses=(), approximations=(), float64_fix=None)
