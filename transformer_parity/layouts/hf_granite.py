"""Hugging Face Granite (`GraniteForCausalLM`, `GraniteModel`): Llama's names and blocks with four multipliers: the
token embeddings times `embedding_multiplier`, each sublayer's output times `residual_multiplier` before the
residual add, attention scores times `attention_multiplier` (in place of 1/sqrt(head_dim): `attention_scale`), and
the logits divided by `logits_scaling` (`logit_divisor`); q/k/v/o biases where `attention_bias` says, the MLP's
where `mlp_bias` says."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import HFFamily
from .hf import number
from .hf_llama import FamilySpec

NAME = "hf-granite"
MODEL_TYPE = "granite"
ARCHITECTURES = ("GraniteForCausalLM", "GraniteModel")
SPEC = FamilySpec(MODEL_TYPE, ARCHITECTURES)
# config.json key -> the canonical field it sets (GraniteConfig's default for each is 1.0)
MULTIPLIERS = {"embedding_multiplier": "embedding_multiplier", "residual_multiplier": "residual_multiplier",
               "attention_multiplier": "attention_scale", "logits_scaling": "logit_divisor"}
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, **{field: key for key, field in MULTIPLIERS.items()}}


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Granite's `config.json`: Llama's reader, then the multipliers."""
    config, arch, notes = hf_llama.read_config(hf, keys, SPEC, hf_llama.BASE_PREFIX)
    fields = {field: number(hf, key, 1.0) for key, field in MULTIPLIERS.items()}
    if not config.output_projection:
        fields["logit_divisor"] = 1.0  # GraniteModel computes no logits
    return config.replace(**fields), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no Granite equivalent (empty if it has one)."""
    return hf_llama.problems_for(config, SPEC)


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf, arch = hf_llama.write_config(config, SPEC)
    hf.update(embedding_multiplier=config.embedding_multiplier, residual_multiplier=config.residual_multiplier,
              attention_multiplier=config.attention_scale_factor, logits_scaling=config.logit_divisor)
    return hf, arch


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=lambda config, prefix: hf_llama.build_table(config, prefix, hf_llama.ATTENTION),
    prefix=lambda arch, keys=None: hf_llama.prefix_for(arch, keys, SPEC, hf_llama.BASE_PREFIX),
    base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=(),  # transformers has no Granite task classes
    expresses=("embedding_multiplier", "residual_multiplier", "attention_scale", "logit_divisor"), approximations=(),
    float64_fix=None)
