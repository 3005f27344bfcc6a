"""Hugging Face CodeGen (`CodeGenForCausalLM`, `CodeGenModel`): GPT-J's model (`hf_gptj`: one LayerNorm read by
attention and feed-forward side by side, rotary positions on adjacent pairs over `rotary_dim`, biases on the
feed-forward and the head only) under GPT-J's config keys, with q, k and v in one `attn.qkv_proj`.

`qkv_proj` keeps the layout of the 4 model-parallel shards CodeGen was trained on: its output features are
`(4, [q, v, k], hidden / 4)`, each shard a quarter of the heads (head h in shard h // (heads / 4)), q, then v, then
k (`fused_qvk_blocks_t`). A head count not divisible by 4 is refused (transformers cannot split it either).
transformers' float64 run keeps GPT-J's float32 sinusoids and scores; verify replaces them (`hf_gptj`'s fix).
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn
from reference_numpy.mapping import BLOCKS

from . import hf_gptj
from .family import HFFamily
from .hf import prefix_rule

NAME = "hf-codegen"
MODEL_TYPE = "codegen"
ARCHITECTURES = ("CodeGenForCausalLM", "CodeGenModel")
BASE_PREFIX = hf_gptj.BASE_PREFIX  # "transformer.", as GPT-J

_L = "h.{i}."
BACKBONE = [entry for entry in hf_gptj.BACKBONE if ".attn.{qkv}_proj." not in entry[1]] + [
    # canonical                                         CodeGenModel                             transform
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",       _L + "attn.qkv_proj.weight",             "fused_qvk_blocks_t"),
    ("-",                                               _L + "attn.causal_mask",                 "causal_mask"),  # old files
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose CodeGenModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + hf_gptj.HEAD


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from CodeGen's `config.json` (GPT-J's keys; `n_ctx` computes nothing)."""
    config, arch, notes = hf_gptj.read_config(hf, keys, MODEL_TYPE, ARCHITECTURES)
    if config.num_heads % BLOCKS:
        raise ValueError(f"config.json n_head={config.num_heads} is not supported: {MODEL_TYPE}'s qkv_proj splits "
                         f"the heads into {BLOCKS} shards")
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no CodeGen equivalent (empty if it has one)."""
    problems = hf_gptj.export_problems(config, MODEL_TYPE)
    if config.num_heads % BLOCKS:
        problems.append(f"num_heads={config.num_heads} ({MODEL_TYPE} splits the heads into {BLOCKS} shards)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf, arch = hf_gptj.config_to_hf(config, MODEL_TYPE, ARCHITECTURES)
    hf["n_ctx"] = config.max_len
    return hf, arch


# Where the CodeGenModel sits: under `transformer.` in the causal-LM class, at the top in the bare model; when
# reading, wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm=ARCHITECTURES[0])


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf,
    config_keys=hf_gptj.CONFIG_KEYS, table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_gptj.HOOKS, head_hook=None, task_heads=(),  # transformers has no CodeGen task class
    expresses=hf_gptj.FAMILY.expresses, approximations=(), float64_fix=hf_gptj.FAMILY.float64_fix)
