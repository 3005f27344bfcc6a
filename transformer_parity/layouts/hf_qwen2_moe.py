"""Hugging Face Qwen2-MoE (`Qwen2MoeForCausalLM`, `Qwen2MoeModel`): Qwen2's attention (biases on q, k and v where
`qkv_bias` says, as it does by default) and norms, with a mixture of experts as the feed-forward of the layers
`decoder_sparse_step` and `mlp_only_layers` give it to (the others: a dense SwiGLU of `intermediate_size`): a router
(`mlp.gate`) over `num_experts` SwiGLU experts of `moe_intermediate_size` (`mlp.experts.{e}.gate_proj`, `up_proj`,
`down_proj`), each token through its `num_experts_per_tok` best, the softmax before the top-k and the k chosen
renormalized where `norm_topk_prob` says; beside them a shared expert of `shared_expert_intermediate_size`
(`mlp.shared_expert`) times sigmoid(`mlp.shared_expert_gate`(x)), which every token runs through.

Its window is `layer_types`' (transformers 5 derives it from `use_sliding_window` and `max_window_layers`: every
other layer below it), one window for every layer or none; this family writes `layer_types` itself. The experts are
read and written one at a time, as `save_pretrained` writes them (`hf_experts`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_experts, hf_llama
from .family import HFFamily
from .hf import boolean
from .hf_experts import ExpertKeys
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-qwen2-moe"
MODEL_TYPE = "qwen2_moe"
ARCHITECTURES = ("Qwen2MoeForCausalLM", "Qwen2MoeModel")
SPEC = FamilySpec("qwen2_moe", ARCHITECTURES, attention_bias=None, qkv_bias=True, mlp_bias=None, sliding=True,
                  window_switch=True)
NO_QKV_BIAS = dataclasses.replace(SPEC, qkv_bias=False)  # `qkv_bias: false`
EXPERTS = ExpertKeys(experts=("num_experts",), width="moe_intermediate_size", renormalize="norm_topk_prob",
                     shared="shared_expert_intermediate_size", sparse_layers=True)
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "num_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
               "expert_d_ff": "moe_intermediate_size", "shared_expert_d_ff": "shared_expert_intermediate_size"}
HOOKS = {**hf_llama.HOOKS, "decoder.layers.{i}.ffn.routing": "layers.{i}.mlp.gate"}

_L = "layers.{i}.mlp."
EXPERT_TABLE = [
    # canonical                                         Qwen2MoeModel                           transform
    ("decoder.layers.{i}.ffn.router.kernel",            _L + "gate.weight",                     "transpose"),
    ("decoder.layers.{i}.ffn.experts.{e}.gate.kernel",  _L + "experts.{e}.gate_proj.weight",    "transpose"),
    ("decoder.layers.{i}.ffn.experts.{e}.linear1.kernel", _L + "experts.{e}.up_proj.weight",    "transpose"),
    ("decoder.layers.{i}.ffn.experts.{e}.linear2.kernel", _L + "experts.{e}.down_proj.weight",  "transpose"),
    ("decoder.layers.{i}.ffn.shared.gate.kernel",       _L + "shared_expert.gate_proj.weight",  "transpose"),
    ("decoder.layers.{i}.ffn.shared.linear1.kernel",    _L + "shared_expert.up_proj.weight",    "transpose"),
    ("decoder.layers.{i}.ffn.shared.linear2.kernel",    _L + "shared_expert.down_proj.weight",  "transpose"),
    ("decoder.layers.{i}.ffn.shared_gate.kernel",       _L + "shared_expert_gate.weight",       "transpose"),
] + hf_llama.MLP  # the dense layers'


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Qwen2-MoE's `config.json` (and the saved key names)."""
    spec = SPEC if boolean(hf, "qkv_bias", True) else NO_QKV_BIAS
    config, arch, notes = hf_llama.read_config(hf, keys, spec, hf_llama.BASE_PREFIX)
    return hf_experts.read(hf, keys, config, EXPERTS), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    return (hf_llama.problems_for(config, SPEC if config.has_qkv_bias else NO_QKV_BIAS)
            + hf_experts.problems(config, EXPERTS, MODEL_TYPE))


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    hf, arch = hf_llama.write_config(config, SPEC)
    kind = "full_attention" if config.sliding_window is None else "sliding_attention"
    return {**hf, **hf_experts.write(config, EXPERTS), "qkv_bias": config.has_qkv_bias,
            "layer_types": [kind] * config.num_decoder_layers}, arch


TASK_HEADS = decoder_heads("Qwen2Moe")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **{**hf_llama.functions(SPEC, hf_llama.ATTENTION, EXPERT_TABLE),  # table, prefix: Llama's, with these entries
       "config_from_hf": config_from_hf, "export_problems": export_problems, "config_to_hf": config_to_hf},
    config_keys=CONFIG_KEYS, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=("num_experts",), approximations=(),
    float64_fix=None)
