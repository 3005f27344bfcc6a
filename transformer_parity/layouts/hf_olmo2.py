"""Hugging Face OLMo 2 (`Olmo2ForCausalLM`, `Olmo2Model`): Llama's names and blocks without a norm before the
sublayers (`pre_norms=False`): an RMSNorm on each sublayer's output before the residual add (`post_norms`: its
`post_attention_layernorm` follows attention, `post_feedforward_layernorm` the MLP), and q/k norms over all of the
projected q (num_heads * head_dim wide) and k (num_key_value_heads * head_dim) before the split into heads
(`qk_norm_over="all"`), at `rms_norm_eps`; q/k/v/o biases where `attention_bias` says."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import HFFamily
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-olmo2"
MODEL_TYPE = "olmo2"
ARCHITECTURES = ("Olmo2ForCausalLM", "Olmo2Model")
SPEC = FamilySpec(MODEL_TYPE, ARCHITECTURES, mlp_bias=None, qk_norm=True)
_L = "layers.{i}."
POST_NORMS = [  # its post_attention_layernorm follows attention (Llama's precedes the feed-forward)
    ("decoder.layers.{i}.post_attn_norm.gamma",         _L + "post_attention_layernorm.weight",   "identity"),
    ("decoder.layers.{i}.post_ffn_norm.gamma",          _L + "post_feedforward_layernorm.weight", "identity"),
]
NORMS_AND_EMBEDDING = [entry for entry in hf_llama.NORMS_AND_EMBEDDING if ".norm1." not in entry[0]
                       and ".norm3." not in entry[0]] + POST_NORMS
HOOKS = {**hf_llama.HOOKS, "decoder.layers.{i}.post_attn_norm": "layers.{i}.post_attention_layernorm",
         "decoder.layers.{i}.post_ffn_norm": "layers.{i}.post_feedforward_layernorm"}
ITS_BLOCKS = {"pre_norms": False, "post_norms": True, "qk_norm_over": "all"}


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """Llama's table with the norms after each sublayer and the q/k norms."""
    backbone = NORMS_AND_EMBEDDING + hf_llama.ATTENTION + hf_llama.MLP + hf_llama.QK_NORM
    return [(c, prefix + e, t) for c, e, t in backbone] + hf_llama.HEAD


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from OLMo 2's `config.json`: Llama's reader with its norms."""
    hf = {"rms_norm_eps": 1e-5, **hf}  # Olmo2Config's default, where Llama's is 1e-6
    config, arch, notes = hf_llama.read_config(hf, keys, SPEC, hf_llama.BASE_PREFIX)
    return config.replace(**ITS_BLOCKS), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no OLMo 2 equivalent (empty if it has one)."""
    return hf_llama.problems_for(config, SPEC) + [f"{k}={getattr(config, k)!r} ({MODEL_TYPE} needs {v!r})"
                                                  for k, v in ITS_BLOCKS.items() if getattr(config, k) != v]


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    return hf_llama.write_config(config, SPEC)


TASK_HEADS = decoder_heads("Olmo2")[:1]  # `hf_tasks`: Olmo2ForSequenceClassification, transformers' only one


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf,
    config_keys=hf_llama.CONFIG_KEYS, table=table,
    prefix=lambda arch, keys=None: hf_llama.prefix_for(arch, keys, SPEC, hf_llama.BASE_PREFIX),
    base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=("post_norms", "pre_norms", "qk_norm_over"),
    approximations=(), float64_fix=None)
