"""Hugging Face Mixtral (`MixtralForCausalLM`, `MixtralModel`): Mistral's attention, norms and window, with a mixture
of experts as every layer's feed-forward: a router (`block_sparse_moe.gate`, `(experts, hidden)`) over
`num_local_experts` SwiGLU experts of `intermediate_size` (`experts.{e}.w1` gate, `w3` up, `w2` down; no biases), each
token through its `num_experts_per_tok` best, the softmax over every expert before the top-k and the k chosen
renormalized (canonical `router_softmax="before_topk"`, `router_renormalize=True`).

transformers 5 fuses the experts in the model it builds (`mlp.experts.gate_up_proj`) but saves them one expert at a
time under these names (`save_pretrained`'s default), which is what this family reads and writes. The keys that only
train are accepted (`hf_experts`)."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_experts, hf_llama
from .family import HFFamily
from .hf_experts import ExpertKeys
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-mixtral"
MODEL_TYPE = "mixtral"
ARCHITECTURES = ("MixtralForCausalLM", "MixtralModel")
SPEC = FamilySpec("mixtral", ARCHITECTURES, attention_bias=None, mlp_bias=None, sliding=True)
EXPERTS = ExpertKeys(experts=("num_local_experts", "num_experts"), width=None, renormalize=None, shared=None,
                     sparse_layers=False)
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "num_experts": "num_local_experts",
               "experts_per_token": "num_experts_per_tok"}
# transformers 5's modules: the sparse block is `mlp` (saved as `block_sparse_moe`), its router `mlp.gate`
HOOKS = {**hf_llama.HOOKS, "decoder.layers.{i}.ffn.routing": "layers.{i}.mlp.gate"}

_L = "layers.{i}.block_sparse_moe."
EXPERT_TABLE = [
    # canonical                                         MixtralModel                            transform
    ("decoder.layers.{i}.ffn.router.kernel",            _L + "gate.weight",                     "transpose"),
    ("decoder.layers.{i}.ffn.experts.{e}.gate.kernel",  _L + "experts.{e}.w1.weight",           "transpose"),
    ("decoder.layers.{i}.ffn.experts.{e}.linear1.kernel", _L + "experts.{e}.w3.weight",         "transpose"),
    ("decoder.layers.{i}.ffn.experts.{e}.linear2.kernel", _L + "experts.{e}.w2.weight",         "transpose"),
]


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Mixtral's `config.json` (and the saved key names)."""
    config, arch, notes = hf_llama.read_config(hf, keys, SPEC, hf_llama.BASE_PREFIX)
    return hf_experts.read(hf, keys, config, EXPERTS), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    return hf_llama.problems_for(config, SPEC) + hf_experts.problems(config, EXPERTS, MODEL_TYPE)


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    hf, arch = hf_llama.write_config(config, SPEC)
    return {**hf, **hf_experts.write(config, EXPERTS), "router_jitter_noise": 0.0}, arch


TASK_HEADS = decoder_heads("Mixtral")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **{**hf_llama.functions(SPEC, hf_llama.ATTENTION, EXPERT_TABLE),  # table, prefix: Llama's, with these entries
       "config_from_hf": config_from_hf, "export_problems": export_problems, "config_to_hf": config_to_hf},
    config_keys=CONFIG_KEYS, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=("num_experts",), approximations=(),
    float64_fix=None)
