"""Hugging Face MPNet (`MPNetForMaskedLM`, `MPNetModel`): a post-LN BERT-like encoder with RoBERTa's positions and
head, and T5's relative position bias.

Positions are RoBERTa's (`hf_roberta`), counted over non-pad tokens from the pad id + 1, with the pad id fixed at 1
in transformers' `MPNetEmbeddings` (`padding_idx = 1`, whatever `pad_token_id` says: another one is refused); no
segment embeddings. The encoder holds one relative position bias table (`encoder.relative_attention_bias`,
`relative_attention_num_buckets` rows) that every layer adds to its scaled scores, its buckets T5's bidirectional
ones, always computed for 32 buckets up to distance 128 (`compute_position_bias`'s defaults: another count is
refused). The head is RoBERTa's: dense -> GELU (exact) -> `layer_norm`, a decoder tied to the word embeddings with its
own bias. `MPNetModel` has a pooler; its logits are the final hidden states. Its task classes are RoBERTa's.
"""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from . import hf_bert, hf_roberta
from .family import HFFamily
from .hf import TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, prefix_rule, refuse
from .hf_tasks import encoder_heads

NAME = "hf-mpnet"
MODEL_TYPE = "mpnet"
ARCHITECTURES = ("MPNetForMaskedLM", "MPNetModel")
BASE_PREFIX = "mpnet."  # where MPNetForMaskedLM keeps its MPNetModel
CONFIG_KEYS = {**hf_bert.CONFIG_KEYS, "max_len": "max_position_embeddings",
               "relative_bias_buckets": "relative_attention_num_buckets"}
PAD = 1  # MPNetEmbeddings' padding_idx: its positions skip id 1 whatever pad_token_id says
BUCKETS, MAX_DISTANCE = 32, 128  # MPNetEncoder.compute_position_bias's, whatever the config says
HOOKS = {"encoder.layers.{i}.self_attn": "encoder.layer.{i}.attention.attn",
         "encoder.layers.{i}.ffn": "encoder.layer.{i}.output.dense", "encoder.layers.{i}": "encoder.layer.{i}"}

_LAYER = "encoder.layer.{i}."
BACKBONE = [
    # canonical                                   MPNetModel                                         transform
    ("src_embed.embedding",                       "embeddings.word_embeddings.weight",               "identity"),
    ("src_pos.embedding",                         "embeddings.position_embeddings.weight",           "identity"),
    ("src_embed_norm.gamma",                      "embeddings.LayerNorm.weight",                     "identity"),
    ("src_embed_norm.beta",                       "embeddings.LayerNorm.bias",                       "identity"),
    ("encoder.relative_bias.embedding",           "encoder.relative_attention_bias.weight",          "identity"),
    ("encoder.layers.{i}.self_attn.{qkv}.kernel", _LAYER + "attention.attn.{qkv}.weight",            "transpose"),
    ("encoder.layers.{i}.self_attn.{qkv}.bias",   _LAYER + "attention.attn.{qkv}.bias",              "identity"),
    ("encoder.layers.{i}.self_attn.o.kernel",     _LAYER + "attention.attn.o.weight",                "transpose"),
    ("encoder.layers.{i}.self_attn.o.bias",       _LAYER + "attention.attn.o.bias",                  "identity"),
    ("encoder.layers.{i}.norm1.gamma",            _LAYER + "attention.LayerNorm.weight",             "identity"),
    ("encoder.layers.{i}.norm1.beta",             _LAYER + "attention.LayerNorm.bias",               "identity"),
    ("encoder.layers.{i}.ffn.linear1.kernel",     _LAYER + "intermediate.dense.weight",              "transpose"),
    ("encoder.layers.{i}.ffn.linear1.bias",       _LAYER + "intermediate.dense.bias",                "identity"),
    ("encoder.layers.{i}.ffn.linear2.kernel",     _LAYER + "output.dense.weight",                    "transpose"),
    ("encoder.layers.{i}.ffn.linear2.bias",       _LAYER + "output.dense.bias",                      "identity"),
    ("encoder.layers.{i}.norm2.gamma",            _LAYER + "output.LayerNorm.weight",                "identity"),
    ("encoder.layers.{i}.norm2.beta",             _LAYER + "output.LayerNorm.bias",                  "identity"),
    ("pooler.kernel",                             "pooler.dense.weight",                             "transpose"),
    ("pooler.bias",                               "pooler.dense.bias",                               "identity"),
    ("-",                                         "embeddings.position_ids",                         "position_ids"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose MPNetModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + hf_roberta.HEAD


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from MPNet's `config.json` (and the saved key names: whether a pooler is
    there)."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, any(k.startswith(("lm_head.", BASE_PREFIX)) for k in keys))
    refuse(hf, {"pad_token_id": PAD, "relative_attention_num_buckets": BUCKETS, "is_decoder": False})
    mlm = arch == ARCHITECTURES[0]
    pooler = not mlm and any(k.endswith("pooler.dense.weight") for k in keys)
    notes = [] if mlm else [f"MPNetModel {'with' if pooler else 'without'} a pooler (from the saved weights)"]
    rows = integer(hf, "max_position_embeddings")
    if rows <= PAD + 1:
        raise ValueError(f"config.json max_position_embeddings={rows} leaves no position for a real token (the first "
                         f"reads row {PAD + 1})")
    vocab = integer(hf, "vocab_size")
    act = activation(hf, "hidden_act", "gelu")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(hf, "hidden_size"),
        num_heads=integer(hf, "num_attention_heads"), num_encoder_layers=integer(hf, "num_hidden_layers"),
        num_decoder_layers=0, d_ff=integer(hf, "intermediate_size"), max_len=rows - PAD - 1,
        dropout=number(hf, "hidden_dropout_prob", 0.1), activation=act, norm_first=False, final_norm=False,
        layer_norm_eps=number(hf, "layer_norm_eps", 1e-12), positional="learned", position_offset=PAD + 1,
        positions_skip_pad=True, scale_embedding=False, bias=True, pad_id=PAD,
        tie_embeddings=mlm and boolean(hf, "tie_word_embeddings", True), output_bias=mlm, output_projection=mlm,
        embed_norm=True, head_transform=mlm,
        head_activation=hf_roberta.HEAD_ACTIVATION if mlm and act != hf_roberta.HEAD_ACTIVATION else None,
        pooler=pooler, relative_bias_buckets=BUCKETS, relative_bias_max_distance=MAX_DISTANCE)
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no MPNet equivalent (empty if it has one)."""
    wanted = {"positions_skip_pad": True, "position_offset": PAD + 1, "pad_id": PAD, "relative_bias_buckets": BUCKETS,
              "relative_bias_max_distance": MAX_DISTANCE, "attention_scale": "head"}
    return hf_bert.encoder_problems(config, "MPNet", wanted, pooled_base=config.pooler, segments=False,
                                    head_activation=hf_roberta.HEAD_ACTIVATION)


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.src_vocab_size,
          "hidden_size": config.d_model, "num_attention_heads": config.num_heads,
          "num_hidden_layers": config.num_encoder_layers, "intermediate_size": config.d_ff,
          "max_position_embeddings": config.position_rows, "hidden_act": TO_HF_ACTIVATION[config.activation],
          "layer_norm_eps": config.layer_norm_eps, "hidden_dropout_prob": config.dropout,
          "attention_probs_dropout_prob": config.dropout, "relative_attention_num_buckets": BUCKETS,
          "pad_token_id": PAD, "tie_word_embeddings": config.tie_embeddings if config.output_projection else True}
    return hf, arch


# The task classes (`hf_tasks`): RoBERTa's heads, under MPNet's names
TASK_HEADS = encoder_heads("MPNet", *hf_roberta.SEQUENCE_HEAD, pooled_base=True, choice=hf_roberta.CHOICE_HEAD)


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix_rule(BASE_PREFIX, lm=ARCHITECTURES[0]), base_prefix=BASE_PREFIX,
    # the source oracle (`verify`): its sublayers, and the head transform's output (dense -> GELU -> LayerNorm)
    transformers_classes=ARCHITECTURES, hooks=HOOKS, head_hook=hf_roberta.HEAD_HOOK, task_heads=TASK_HEADS,
    expresses=("positions_skip_pad", "relative_bias_buckets", "relative_bias_max_distance"), approximations=(),
    float64_fix=None)
