"""Hugging Face Qwen3-MoE (`Qwen3MoeForCausalLM`, `Qwen3MoeModel`): Qwen3's attention (an RMSNorm on each head of q
and k, a `head_dim` of its own, biases where `attention_bias` says) and norms, with Qwen2-MoE's mixture of experts and
none of its shared expert: a router (`mlp.gate`) over `num_experts` SwiGLU experts of `moe_intermediate_size` in the
layers `decoder_sparse_step` and `mlp_only_layers` give them to (the others: a dense SwiGLU of `intermediate_size`),
the softmax before the top-k, the k chosen renormalized where `norm_topk_prob` says.

transformers 5 writes the number of experts as `num_local_experts`, earlier configs as `num_experts`: either is read
(both must agree), `num_experts` written, which every version reads. A window (`use_sliding_window`) is every
layer's. The experts are read and written one at a time, as `save_pretrained` writes them (`hf_experts`)."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_experts, hf_llama, hf_qwen2_moe
from .family import HFFamily
from .hf_experts import ExpertKeys
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-qwen3-moe"
MODEL_TYPE = "qwen3_moe"
ARCHITECTURES = ("Qwen3MoeForCausalLM", "Qwen3MoeModel")
SPEC = FamilySpec("qwen3_moe", ARCHITECTURES, mlp_bias=None, qk_norm=True, sliding=True, window_switch=True)
EXPERTS = ExpertKeys(experts=("num_experts", "num_local_experts"), width="moe_intermediate_size",
                     renormalize="norm_topk_prob", shared=None, sparse_layers=True)
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "num_experts": "num_experts", "experts_per_token": "num_experts_per_tok",
               "expert_d_ff": "moe_intermediate_size"}
EXPERT_TABLE = [entry for entry in hf_qwen2_moe.EXPERT_TABLE if ".shared" not in entry[0]]  # no shared expert


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Qwen3-MoE's `config.json` (and the saved key names)."""
    config, arch, notes = hf_llama.read_config(hf, keys, SPEC, hf_llama.BASE_PREFIX)
    return hf_experts.read(hf, keys, config, EXPERTS), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    return hf_llama.problems_for(config, SPEC) + hf_experts.problems(config, EXPERTS, MODEL_TYPE)


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    hf, arch = hf_llama.write_config(config, SPEC)
    hf.pop("max_window_layers")  # the window is every layer's here: no such key
    return {**hf, **hf_experts.write(config, EXPERTS)}, arch


TASK_HEADS = decoder_heads("Qwen3Moe", qa_prefix="transformer.")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **{**hf_llama.functions(SPEC, hf_llama.ATTENTION, EXPERT_TABLE),  # table, prefix: Llama's, with these entries
       "config_from_hf": config_from_hf, "export_problems": export_problems, "config_to_hf": config_to_hf},
    config_keys=CONFIG_KEYS, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_qwen2_moe.HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=("num_experts",), approximations=(),
    float64_fix=None)
