"""Hugging Face Phi (`PhiForCausalLM`, `PhiModel`; Phi-1, Phi-1.5, Phi-2): a decoder-only model whose attention and
feed-forward read one LayerNorm's output side by side and add to the residual at once (canonical `parallel_residual`
with `ffn_shares_norm`: `input_layernorm` is `norm1`, and there is no `norm3`).

Biases on every projection: q/k/v (`q_proj`, `k_proj`, `v_proj`, grouped-query where `num_key_value_heads` says),
the attention output `dense`, the feed-forward's `fc1` / `fc2` and the head `lm_head` (tied to the embedding or
not, its bias always its own). Rotary positions turn `partial_rotary_factor` of each head (0.5 where config.json
gives none, PhiConfig's default). `qk_layernorm`: one LayerNorm over each head of q and one of k, shared by all
heads (canonical `qk_norm` at `layer_norm_eps`), before the rotation.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import HFFamily
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, optional_integer, prefix_rule,
                 refuse)
from .hf_tasks import decoder_heads

NAME = "hf-phi"
MODEL_TYPE = "phi"
ARCHITECTURES = ("PhiForCausalLM", "PhiModel")
BASE_PREFIX = "model."  # where PhiForCausalLM keeps its PhiModel
DEFAULT_ROTARY = 0.5  # PhiConfig's partial_rotary_factor when config.json gives none
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "layer_norm_eps": "layer_norm_eps"}
HOOKS = {**hf_llama.HOOKS, "decoder.final_norm": "final_layernorm"}

_L = "layers.{i}."
BACKBONE = [
    # canonical                                         PhiModel                                 transform
    ("tgt_embed.embedding",                             "embed_tokens.weight",                   "identity"),
    ("decoder.layers.{i}.norm1.gamma",                  _L + "input_layernorm.weight",           "identity"),
    ("decoder.layers.{i}.norm1.beta",                   _L + "input_layernorm.bias",             "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",       _L + "self_attn.{qkv}_proj.weight",      "transpose"),
    ("decoder.layers.{i}.self_attn.{qkv}.bias",         _L + "self_attn.{qkv}_proj.bias",        "identity"),
    ("decoder.layers.{i}.self_attn.o.kernel",           _L + "self_attn.dense.weight",           "transpose"),
    ("decoder.layers.{i}.self_attn.o.bias",             _L + "self_attn.dense.bias",             "identity"),
    ("decoder.layers.{i}.ffn.linear1.kernel",           _L + "mlp.fc1.weight",                   "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",             _L + "mlp.fc1.bias",                     "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",           _L + "mlp.fc2.weight",                   "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",             _L + "mlp.fc2.bias",                     "identity"),
    ("decoder.final_norm.gamma",                        "final_layernorm.weight",                "identity"),
    ("decoder.final_norm.beta",                         "final_layernorm.bias",                  "identity"),
    ("-",                                               "rotary_emb.inv_freq",                   "rope_inv_freq"),  # old
    ("-",                                               _L + "self_attn.rotary_emb.inv_freq",    "rope_inv_freq"),  # files
]
QK_NORM = [  # qk_layernorm
    ("decoder.layers.{i}.self_attn.q_norm.gamma",       _L + "self_attn.q_layernorm.weight",     "identity"),
    ("decoder.layers.{i}.self_attn.q_norm.beta",        _L + "self_attn.q_layernorm.bias",       "identity"),
    ("decoder.layers.{i}.self_attn.k_norm.gamma",       _L + "self_attn.k_layernorm.weight",     "identity"),
    ("decoder.layers.{i}.self_attn.k_norm.beta",        _L + "self_attn.k_layernorm.bias",       "identity"),
]
HEAD = [
    ("output.kernel",                                   "lm_head.weight",                        "transpose"),
    ("output.bias",                                     "lm_head.bias",                          "identity"),
    ("tgt_embed.embedding",                             "lm_head.weight",                        "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose PhiModel sits under `prefix`."""
    backbone = BACKBONE + (QK_NORM if config.qk_norm else [])
    return [(c, prefix + e, t) for c, e, t in backbone] + HEAD


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Phi's `config.json` (and the saved key names)."""
    has_head = any(k.startswith(BASE_PREFIX) or k.startswith("lm_head.") for k in keys)
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, has_head)
    refuse(hf, {"is_encoder_decoder": False})
    vocab, d, heads = integer(hf, "vocab_size"), integer(hf, "hidden_size"), integer(hf, "num_attention_heads")
    if heads == 0 or d % heads:
        raise ValueError(f"config.json hidden_size={d} is not divisible by num_attention_heads={heads}")
    head_dim = optional_integer(hf, "head_dim") or d // heads
    if head_dim != d // heads and boolean(hf, "qk_layernorm", False):  # transformers' q/k norms are d / heads wide
        raise ValueError(f"config.json head_dim={head_dim} beside qk_layernorm=true is not supported (transformers' "
                         f"q/k LayerNorms are hidden_size / num_attention_heads = {d // heads} wide)")
    theta, scaling, fraction = hf_llama.rope({**hf, "partial_rotary_factor": hf.get("partial_rotary_factor",
                                                                                     DEFAULT_ROTARY)})
    lm = arch == ARCHITECTURES[0]
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads,
        num_kv_heads=hf_llama._kv_heads(hf, heads), head_size=None if head_dim * heads == d else head_dim,
        num_encoder_layers=0,
        num_decoder_layers=integer(hf, "num_hidden_layers"), d_ff=integer(hf, "intermediate_size"),
        max_len=integer(hf, "max_position_embeddings"), dropout=number(hf, "resid_pdrop", 0.0),
        activation=activation(hf, "hidden_act", "gelu_new"), norm_first=True, final_norm=True, norm="layer",
        layer_norm_eps=number(hf, "layer_norm_eps", 1e-5), positional="rope", rope_theta=theta,
        rope_scaling=scaling, rotary_fraction=fraction, scale_embedding=False, bias=True,
        qk_norm=boolean(hf, "qk_layernorm", False), parallel_residual=True, ffn_shares_norm=True,
        tie_embeddings=boolean(hf, "tie_word_embeddings", False) if lm else False, pad_id=None,
        output_projection=lm)
    return config, arch, hf_llama.pad_note(hf, MODEL_TYPE)


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no Phi equivalent (empty if it has one)."""
    wanted = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "norm": "layer",
              "norm_weight_offset": 0.0, "positional": "rope", "ffn_gated": False, "scale_embedding": False,
              "embed_norm": False, "head_transform": False, "type_vocab_size": 0, "pooler": False,
              "qk_norm_eps": None, "sliding_window": None, "parallel_residual": True, "ffn_shares_norm": True}
    problems = [f"{k}={getattr(config, k)!r} ({MODEL_TYPE} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.qk_norm and config.head_size is not None:
        problems.append(f"head_size={config.head_size} with qk_norm ({MODEL_TYPE}'s q/k norms are d_model / num_heads "
                        "wide)")
    for has, what in ((config.has_qkv_bias, "q/k/v"), (config.has_o_bias, "the attention output"),
                      (config.has_ffn_bias, "the feed-forward")):
        if not has:
            problems.append(f"no bias on {what} ({MODEL_TYPE} always has one)")
    if config.output_projection and not config.has_output_bias:
        problems.append(f"output_bias=False ({MODEL_TYPE}'s lm_head has a bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf, _ = hf_llama.write_config(config, hf_llama.LLAMA)
    for key in ("rms_norm_eps", "attention_bias", "mlp_bias"):
        hf.pop(key, None)
    hf["rope_parameters"]["partial_rotary_factor"] = config.rotary_fraction  # 1.0 too: absent means 0.5 here
    hf.update(model_type=MODEL_TYPE, architectures=[arch], hidden_act=TO_HF_ACTIVATION[config.activation],
              layer_norm_eps=config.layer_norm_eps, qk_layernorm=config.qk_norm, resid_pdrop=config.dropout, embd_pdrop=config.dropout,
              tie_word_embeddings=config.tie_embeddings and config.output_projection)
    return hf, arch


# Where the PhiModel sits: under `model.` in the causal-LM class, at the top in the bare model; when reading,
# wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm=ARCHITECTURES[0])


TASK_HEADS = decoder_heads("Phi", qa=False)  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("parallel_residual", "ffn_shares_norm"),  # `layouts.FAMILY_ONLY` settings it has
    approximations=(), float64_fix=None)
