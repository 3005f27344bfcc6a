"""Hugging Face GPT-NeoX (`GPTNeoXForCausalLM`, `GPTNeoXModel`; Pythia, GPT-NeoX-20B): a decoder-only, pre-norm
model with LayerNorms, rotary positions on part of each head and, by default, attention and feed-forward side by
side on one residual.

`use_parallel_residual` (True unless config.json says otherwise) is the canonical `parallel_residual`, each sublayer
with its own LayerNorm: `input_layernorm` before attention (`norm1`), `post_attention_layernorm` before the
feed-forward (`norm3`), which in the sequential form reads the residual after attention. `attention.query_key_value`
holds q, k and v interleaved per head (transformers views its output as `(heads, 3 * head_size)` and chunks each
head's into q | k | v): `fused_qkv_heads_t`. Biases on every projection (`attention_bias`, default True, switches
those of the attention off); the head `embed_out` (transformers 5 calls the module `lm_head` and renames the key on
load and on save) has none. The rotary share of each head is `rope_parameters.partial_rotary_factor`, or the older
`rotary_pct` (0.25 where neither is given), its base `rope_parameters.rope_theta`, or the older `rotary_emb_base`;
a rope type the reference does not implement is refused.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import HFFamily
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, optional_integer, prefix_rule,
                 refuse)
from .hf_tasks import decoder_heads

NAME = "hf-gpt-neox"
MODEL_TYPE = "gpt_neox"
ARCHITECTURES = ("GPTNeoXForCausalLM", "GPTNeoXModel")
BASE_PREFIX = "gpt_neox."  # where GPTNeoXForCausalLM keeps its GPTNeoXModel
DEFAULT_ROTARY, DEFAULT_THETA = 0.25, 10000.0  # GPTNeoXConfig's rotary_pct and rotary_emb_base
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_size",
               "num_heads": "num_attention_heads", "num_decoder_layers": "num_hidden_layers",
               "d_ff": "intermediate_size", "max_len": "max_position_embeddings", "layer_norm_eps": "layer_norm_eps"}
HOOKS = {"decoder.layers.{i}.self_attn": "layers.{i}.attention", "decoder.layers.{i}.ffn": "layers.{i}.mlp",
         "decoder.layers.{i}": "layers.{i}", "decoder.final_norm": "final_layer_norm"}

_L = "layers.{i}."
BACKBONE = [
    # canonical                                         GPTNeoXModel                             transform
    ("tgt_embed.embedding",                             "embed_in.weight",                       "identity"),
    ("decoder.layers.{i}.norm1.gamma",                  _L + "input_layernorm.weight",           "identity"),
    ("decoder.layers.{i}.norm1.beta",                   _L + "input_layernorm.bias",             "identity"),
    ("decoder.layers.{i}.norm3.gamma",                  _L + "post_attention_layernorm.weight",  "identity"),
    ("decoder.layers.{i}.norm3.beta",                   _L + "post_attention_layernorm.bias",    "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",       _L + "attention.query_key_value.weight", "fused_qkv_heads_t"),
    ("decoder.layers.{i}.self_attn.{qkv}.bias",         _L + "attention.query_key_value.bias",   "fused_qkv_heads"),
    ("decoder.layers.{i}.self_attn.o.kernel",           _L + "attention.dense.weight",           "transpose"),
    ("decoder.layers.{i}.self_attn.o.bias",             _L + "attention.dense.bias",             "identity"),
    ("decoder.layers.{i}.ffn.linear1.kernel",           _L + "mlp.dense_h_to_4h.weight",         "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",             _L + "mlp.dense_h_to_4h.bias",           "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",           _L + "mlp.dense_4h_to_h.weight",         "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",             _L + "mlp.dense_4h_to_h.bias",           "identity"),
    ("decoder.final_norm.gamma",                        "final_layer_norm.weight",               "identity"),
    ("decoder.final_norm.beta",                         "final_layer_norm.bias",                 "identity"),
    ("-",                                               _L + "attention.rotary_emb.inv_freq",    "rope_inv_freq"),  # old
    ("-",                                               "rotary_emb.inv_freq",                   "rope_inv_freq"),  # files
    ("-",                                               _L + "attention.bias",                   "causal_mask"),
    ("-",                                               _L + "attention.masked_bias",            "mask_fill"),
]
HEAD = [
    ("output.kernel",                                   "embed_out.weight",                      "transpose"),
    ("tgt_embed.embedding",                             "embed_out.weight",                      "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose GPTNeoXModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def rope(hf: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None, float]:
    """`(rope_theta, rope_scaling, rotary_fraction)`: `rope_parameters` (or `rope_scaling`) first, then the older
    `rotary_emb_base` and `rotary_pct`, as GPTNeoXConfig reads them."""
    legacy = {"rope_theta": number(hf, "rotary_emb_base", DEFAULT_THETA),
              "partial_rotary_factor": number(hf, "rotary_pct", DEFAULT_ROTARY)}
    return hf_llama.rope({**legacy, **{k: v for k, v in hf.items() if k in ("rope_parameters", "rope_scaling",
                                                                             "original_max_position_embeddings")}})


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from GPT-NeoX's `config.json` (and the saved key names)."""
    has_head = any(k.startswith(BASE_PREFIX) or k == "embed_out.weight" for k in keys)
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, has_head)
    refuse(hf, {"is_encoder_decoder": False, "add_cross_attention": False})
    vocab, d, heads = integer(hf, "vocab_size"), integer(hf, "hidden_size"), integer(hf, "num_attention_heads")
    if heads == 0 or d % heads:
        raise ValueError(f"config.json hidden_size={d} is not divisible by num_attention_heads={heads}")
    for key in ("num_key_value_heads", "head_dim"):  # transformers reads neither: every head d / heads wide, no GQA
        if optional_integer(hf, key) not in (None, heads if key == "num_key_value_heads" else d // heads):
            raise ValueError(f"config.json {key}={hf[key]!r} is not supported for {MODEL_TYPE} (its attention has "
                             f"{heads} heads of hidden_size / num_attention_heads = {d // heads})")
    theta, scaling, fraction = rope(hf)
    lm = arch == ARCHITECTURES[0]
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads, num_encoder_layers=0,
        num_decoder_layers=integer(hf, "num_hidden_layers"), d_ff=integer(hf, "intermediate_size"),
        max_len=integer(hf, "max_position_embeddings"), dropout=number(hf, "hidden_dropout", 0.0),
        activation=activation(hf, "hidden_act", "gelu"), norm_first=True, final_norm=True, norm="layer",
        layer_norm_eps=number(hf, "layer_norm_eps", 1e-5), positional="rope", rope_theta=theta,
        rope_scaling=scaling, rotary_fraction=fraction, scale_embedding=False, bias=True,
        attention_bias=None if boolean(hf, "attention_bias", True) else False,
        parallel_residual=boolean(hf, "use_parallel_residual", True),
        tie_embeddings=boolean(hf, "tie_word_embeddings", False) if lm else False, pad_id=None, output_bias=False,
        output_projection=lm)
    return config, arch, hf_llama.pad_note(hf, MODEL_TYPE)


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no GPT-NeoX equivalent (empty if it has one)."""
    wanted = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "norm": "layer",
              "norm_weight_offset": 0.0, "positional": "rope", "ffn_gated": False, "scale_embedding": False,
              "embed_norm": False, "head_transform": False, "type_vocab_size": 0, "pooler": False, "qk_norm": False,
              "head_size": None, "num_kv_heads": None, "sliding_window": None}
    problems = [f"{k}={getattr(config, k)!r} ({MODEL_TYPE} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if not config.has_ffn_bias:
        problems.append(f"no feed-forward biases ({MODEL_TYPE} always has them)")
    if config.has_qkv_bias != config.has_o_bias:
        problems.append(f"q/k/v biases {'on' if config.has_qkv_bias else 'off'} with the attention output's "
                        f"{'on' if config.has_o_bias else 'off'} ({MODEL_TYPE} has all four or none)")
    if config.output_projection and config.has_output_bias:
        problems.append(f"output_bias=True ({MODEL_TYPE}'s embed_out has no bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf, _ = hf_llama.write_config(config, hf_llama.LLAMA)
    for key in ("rms_norm_eps", "head_dim", "num_key_value_heads", "attention_bias", "mlp_bias", "attention_dropout"):
        hf.pop(key, None)
    hf["model_type"] = MODEL_TYPE
    hf["rope_parameters"]["partial_rotary_factor"] = config.rotary_fraction  # 1.0 too: absent means 0.25 here
    hf.update(architectures=[arch], hidden_act=TO_HF_ACTIVATION[config.activation],
              layer_norm_eps=config.layer_norm_eps, attention_bias=config.has_o_bias,
              use_parallel_residual=config.parallel_residual, hidden_dropout=config.dropout,
              attention_dropout=config.dropout, tie_word_embeddings=config.tie_embeddings and config.output_projection)
    return hf, arch


# Where the GPTNeoXModel sits: under `gpt_neox.` in the causal-LM class, at the top in the bare model; when reading,
# wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm=ARCHITECTURES[0])


TASK_HEADS = decoder_heads("GPTNeoX", token_score="classifier")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("parallel_residual",),  # `layouts.FAMILY_ONLY` settings it has (use_parallel_residual)
    approximations=(), float64_fix=None)
