"""Hugging Face GPT-2 (`GPT2LMHeadModel`, `GPT2Model`): a decoder-only, pre-LN model with learned positions.

GPT-2's `Conv1D` stores weights `(in, out)`, the canonical kernel layout, so every projection maps as it is;
`c_attn` holds q | k | v concatenated along its output axis. `GPT2LMHeadModel`'s `lm_head.weight` is tied to
`wte.weight` (`save_pretrained` leaves it out; a file that has it must repeat `wte` exactly).
"""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from .family import HFFamily
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, optional_integer, prefix_rule,
                 refuse, token_id)
from .hf_tasks import Head, decoder_heads, linear

NAME = "hf-gpt2"
MODEL_TYPE = "gpt2"
ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")
BASE_PREFIX = "transformer."  # where GPT2LMHeadModel keeps its GPT2Model
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "n_embd",
               "num_heads": "n_head", "num_decoder_layers": "n_layer", "d_ff": "n_inner", "max_len": "n_positions"}


BACKBONE = [
    # canonical                                        GPT2Model                          transform
    ("tgt_embed.embedding",                            "wte.weight",                      "identity"),
    ("tgt_pos.embedding",                              "wpe.weight",                      "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",      "h.{i}.attn.c_attn.weight",        "fused_qkv"),
    ("decoder.layers.{i}.self_attn.{qkv}.bias",        "h.{i}.attn.c_attn.bias",          "fused_qkv"),
    ("decoder.layers.{i}.self_attn.o.kernel",          "h.{i}.attn.c_proj.weight",        "identity"),
    ("decoder.layers.{i}.self_attn.o.bias",            "h.{i}.attn.c_proj.bias",          "identity"),
    ("decoder.layers.{i}.norm1.gamma",                 "h.{i}.ln_1.weight",               "identity"),
    ("decoder.layers.{i}.norm1.beta",                  "h.{i}.ln_1.bias",                 "identity"),
    ("decoder.layers.{i}.ffn.linear1.kernel",          "h.{i}.mlp.c_fc.weight",           "identity"),
    ("decoder.layers.{i}.ffn.linear1.bias",            "h.{i}.mlp.c_fc.bias",             "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",          "h.{i}.mlp.c_proj.weight",         "identity"),
    ("decoder.layers.{i}.ffn.linear2.bias",            "h.{i}.mlp.c_proj.bias",           "identity"),
    ("decoder.layers.{i}.norm3.gamma",                 "h.{i}.ln_2.weight",               "identity"),
    ("decoder.layers.{i}.norm3.beta",                  "h.{i}.ln_2.bias",                 "identity"),
    ("decoder.final_norm.gamma",                       "ln_f.weight",                     "identity"),
    ("decoder.final_norm.beta",                        "ln_f.bias",                       "identity"),
    ("-",                                              "h.{i}.attn.bias",                 "causal_mask"),
    ("-",                                              "h.{i}.attn.masked_bias",          "mask_fill"),  # (old files)
]
HEAD = [
    ("output.kernel",                                  "lm_head.weight",                  "transpose"),
    ("tgt_embed.embedding",                            "lm_head.weight",                  "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose GPT2Model sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from GPT-2's `config.json` (and the saved key names)."""
    has_head = any(k.startswith(BASE_PREFIX) or k == "lm_head.weight" for k in keys)
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, has_head)
    refuse(hf, {"add_cross_attention": False, "scale_attn_by_inverse_layer_idx": False,
                 "scale_attn_weights": True, "reorder_and_upcast_attn": False})
    notes: list[str] = []
    vocab, d = integer(hf, "vocab_size"), integer(hf, "n_embd")
    pad = token_id(hf, "pad_token_id", vocab)
    # GPT-2 has no pad token: its forward derives no mask from the ids (padding arrives as attention_mask), so every
    # id, 0 and EOS included, is a real token. A pad_token_id in config.json is the tokenizer's filler, not a mask.
    if pad is not None:
        notes.append(f"config.json pad_token_id={pad!r} is not used: GPT-2 derives no padding mask "
                     "from ids, so pad_id=None (every id is a real token; --set pad_id=N to mask id N)")
    lm = arch == "GPT2LMHeadModel"
    tied = boolean(hf, "tie_word_embeddings", True) if lm else False
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=integer(hf, "n_head"),
        num_encoder_layers=0, num_decoder_layers=integer(hf, "n_layer"), d_ff=optional_integer(hf, "n_inner") or 4 * d,
        max_len=integer(hf, "n_positions"), dropout=number(hf, "resid_pdrop", 0.1),
        activation=activation(hf, "activation_function", "gelu_new"), norm_first=True, final_norm=True,
        layer_norm_eps=number(hf, "layer_norm_epsilon", 1e-5), positional="learned", scale_embedding=False,
        bias=True, tie_embeddings=tied, pad_id=None, output_bias=False, output_projection=lm)
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no GPT-2 equivalent (empty if it has one)."""
    wanted = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "positional": "learned",
              "position_offset": 0, "scale_embedding": False, "bias": True, "embed_norm": False,
              "head_transform": False, "type_vocab_size": 0, "pooler": False}
    problems = [f"{k}={getattr(config, k)!r} (GPT-2 needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.output_projection and config.has_output_bias:
        problems.append("output_bias=True (GPT-2's lm_head has no bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = "GPT2LMHeadModel" if config.output_projection else "GPT2Model"
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.tgt_vocab_size,
          "n_embd": config.d_model, "n_head": config.num_heads, "n_layer": config.num_decoder_layers,
          "n_inner": None if config.d_ff == 4 * config.d_model else config.d_ff, "n_positions": config.max_len,
          "activation_function": TO_HF_ACTIVATION[config.activation], "layer_norm_epsilon": config.layer_norm_eps,
          "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.dropout,
          "tie_word_embeddings": config.tie_embeddings if config.output_projection else True,
          "pad_token_id": config.pad_id, "bos_token_id": None, "eos_token_id": None}
    return hf, arch


# Where the GPT2Model sits: under `transformer.` in a GPT2LMHeadModel, at the top in a bare GPT2Model; when reading,
# wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm="GPT2LMHeadModel")


# The task classes (`hf_tasks`): the last non-pad position scored by `score`; per position by `classifier`.
TASK_HEADS = decoder_heads("GPT2", token_score="classifier") + (
    # the LM model plus one multiple-choice score per row read at its last real position (transformers' default
    # mc_token_ids is the last position; a tokenizer's classification token ends the real ones)
    Head("GPT2DoubleHeadsModel", "GPT2LMHeadModel", {"choice_head": True},
         linear("choice_head", "multiple_choice_head.summary"),
         hf_keys={"summary_type": ("cls_index", "cls_index"), "summary_use_proj": (True, True),
                  "summary_proj_to_labels": (True, True), "summary_activation": (None, None)}),)


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    # the source oracle (`verify`): transformers' class with an output projection and without one, and the modules
    # whose outputs are canonical sublayers, under the base model
    transformers_classes=("GPT2LMHeadModel", "GPT2Model"),
    hooks={"decoder.layers.{i}.self_attn": "h.{i}.attn", "decoder.layers.{i}.ffn": "h.{i}.mlp",
           "decoder.layers.{i}": "h.{i}", "decoder.final_norm": "ln_f"},
    head_hook=None, task_heads=TASK_HEADS,
    expresses=("choice_head",),  # `layouts.FAMILY_ONLY` settings it has (through GPT2DoubleHeadsModel)
    approximations=(), float64_fix=None)
