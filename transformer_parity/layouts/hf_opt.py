"""Hugging Face OPT (`OPTForCausalLM`, `OPTModel`): a decoder-only model with learned positions read at
`position + 2` (the table has `max_position_embeddings + 2` rows), q/k/v/o and `fc1`/`fc2` with biases where
`enable_bias` says (ReLU by default), LayerNorms before each sublayer and a final one (`do_layer_norm_before`, most
sizes) or after each sublayer's residual and none at the end (`do_layer_norm_before: false`, OPT-350m). The head is
tied to the token table, without a bias.

Refused, each in one line naming the field: `word_embed_proj_dim` other than `hidden_size` (OPT-350m's
`project_in`/`project_out`), `layer_norm_elementwise_affine: false`, and the task classes (`TASK_HEADS`).
transformers numbers positions over the attention mask; here every id is a real token (`pad_id=None`), so the two
agree on unpadded and right-padded inputs."""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from .family import HFFamily
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, optional_integer, prefix_rule,
                 refuse)

NAME = "hf-opt"
MODEL_TYPE = "opt"
ARCHITECTURES = ("OPTForCausalLM", "OPTModel")
BASE_PREFIX = "model."  # where OPTForCausalLM keeps its OPTModel
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding's fixed offset
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default; config.json has no field for it
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_size",
               "num_heads": "num_attention_heads", "num_decoder_layers": "num_hidden_layers", "d_ff": "ffn_dim",
               "max_len": "max_position_embeddings"}
# The modules whose outputs are canonical sublayers, under the base model. Not the feed-forward: OPT flattens the
# batch and time axes around fc1/fc2, so fc2's output is (B * T, d); the layer's output follows it.
HOOKS = {"decoder.layers.{i}.self_attn": "decoder.layers.{i}.self_attn", "decoder.layers.{i}": "decoder.layers.{i}",
         "decoder.final_norm": "decoder.final_layer_norm"}

_L = "decoder.layers.{i}."
BACKBONE = [
    # canonical                                         OPTModel                                    transform
    ("tgt_embed.embedding",                             "decoder.embed_tokens.weight",              "identity"),
    ("tgt_pos.embedding",                               "decoder.embed_positions.weight",           "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",       _L + "self_attn.{qkv}_proj.weight",         "transpose"),
    ("decoder.layers.{i}.self_attn.{qkv}.bias",         _L + "self_attn.{qkv}_proj.bias",           "identity"),
    ("decoder.layers.{i}.self_attn.o.kernel",           _L + "self_attn.out_proj.weight",           "transpose"),
    ("decoder.layers.{i}.self_attn.o.bias",             _L + "self_attn.out_proj.bias",             "identity"),
    ("decoder.layers.{i}.norm1.gamma",                  _L + "self_attn_layer_norm.weight",         "identity"),
    ("decoder.layers.{i}.norm1.beta",                   _L + "self_attn_layer_norm.bias",           "identity"),
    ("decoder.layers.{i}.ffn.linear1.kernel",           _L + "fc1.weight",                          "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",             _L + "fc1.bias",                            "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",           _L + "fc2.weight",                          "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",             _L + "fc2.bias",                            "identity"),
    ("decoder.layers.{i}.norm3.gamma",                  _L + "final_layer_norm.weight",             "identity"),
    ("decoder.layers.{i}.norm3.beta",                   _L + "final_layer_norm.bias",               "identity"),
    ("decoder.final_norm.gamma",                        "decoder.final_layer_norm.weight",          "identity"),
    ("decoder.final_norm.beta",                         "decoder.final_layer_norm.bias",            "identity"),
]
HEAD = [
    ("output.kernel",                                   "lm_head.weight",                           "transpose"),
    ("tgt_embed.embedding",                             "lm_head.weight",                           "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose OPTModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from OPT's `config.json` (and the saved key names)."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, any(k.startswith(BASE_PREFIX) or k == "lm_head.weight"
                                                           for k in keys))
    refuse(hf, {"layer_norm_elementwise_affine": True, "is_encoder_decoder": False})
    d = integer(hf, "hidden_size")
    if optional_integer(hf, "word_embed_proj_dim") not in (None, d):
        raise ValueError(f"config.json word_embed_proj_dim={hf['word_embed_proj_dim']} is not supported (only "
                         f"hidden_size={d}: OPT's project_in / project_out are not implemented here)")
    pre = boolean(hf, "do_layer_norm_before", True)
    final = pre and not boolean(hf, "_remove_final_layer_norm", False)
    vocab = integer(hf, "vocab_size")
    notes = [f"layer_norm_eps={LAYER_NORM_EPS} (OPT's fixed nn.LayerNorm epsilon)"]
    if hf.get("pad_token_id") is not None:
        notes.append(f"config.json pad_token_id={hf['pad_token_id']!r} is not used: OPT takes padding as an attention "
                     "mask, so pad_id=None (every id is a real token; --set pad_id=N to mask id N)")
    lm = arch == ARCHITECTURES[0]
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=integer(hf, "num_attention_heads"),
        num_encoder_layers=0, num_decoder_layers=integer(hf, "num_hidden_layers"), d_ff=integer(hf, "ffn_dim"),
        max_len=integer(hf, "max_position_embeddings"), dropout=number(hf, "dropout", 0.1),
        activation=activation(hf, "activation_function", "relu"), norm_first=pre, final_norm=final,
        layer_norm_eps=LAYER_NORM_EPS, positional="learned", position_offset=POSITION_OFFSET, scale_embedding=False,
        bias=boolean(hf, "enable_bias", True),
        tie_embeddings=boolean(hf, "tie_word_embeddings", True) if lm else False, pad_id=None, output_bias=False,
        output_projection=lm)
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no OPT equivalent (empty if it has one)."""
    wanted = {"num_encoder_layers": 0, "positional": "learned", "position_offset": POSITION_OFFSET,
              "scale_embedding": False, "norm": "layer", "ffn_gated": False, "embed_norm": False,
              "head_transform": False, "type_vocab_size": 0, "pooler": False, "layer_norm_eps": LAYER_NORM_EPS,
              "num_kv_heads": None, "head_size": None, "qk_norm": False}
    problems = [f"{k}={getattr(config, k)!r} (OPT needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.final_norm and not config.norm_first:
        problems.append("final_norm=True with norm_first=False (OPT has a final norm only before-norm)")
    if len({config.has_qkv_bias, config.has_o_bias, config.has_ffn_bias}) > 1:
        problems.append("biases on some linears but not others (OPT's enable_bias sets them all)")
    if config.output_projection and config.has_output_bias:
        problems.append("output_bias=True (OPT's lm_head has no bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.tgt_vocab_size,
          "hidden_size": config.d_model, "word_embed_proj_dim": config.d_model,
          "num_attention_heads": config.num_heads,
          "num_hidden_layers": config.num_decoder_layers, "ffn_dim": config.d_ff,
          "max_position_embeddings": config.max_len, "activation_function": TO_HF_ACTIVATION[config.activation],
          "do_layer_norm_before": config.norm_first, "_remove_final_layer_norm": config.norm_first and not
          config.final_norm, "enable_bias": config.has_ffn_bias, "layer_norm_elementwise_affine": True,
          "dropout": config.dropout, "attention_dropout": 0.0,
          "tie_word_embeddings": config.tie_embeddings if config.output_projection else True,
          "pad_token_id": config.pad_id, "bos_token_id": None, "eos_token_id": None}
    return hf, arch


# Where the OPTModel sits: under `model.` in the task classes, at the top in a bare OPTModel; when reading, wherever
# the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, bare=ARCHITECTURES[1])


# No task classes yet: they take a pad id, and transformers numbers OPT's positions over the attention mask, which
# the canonical decoder does not (it numbers them from the start); OPTForSequenceClassification and
# OPTForQuestionAnswering are refused in one line.
TASK_HEADS: tuple = ()


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=(), float64_fix=None)
