"""Hugging Face OLMo (`OlmoForCausalLM`, `OlmoModel`): Llama's names and blocks (rotary positions, grouped-query
attention, SwiGLU without biases) with LayerNorms that have no parameters at all (`norm_affine=False`: OLMo's
`F.layer_norm(x, None, None, eps=1e-5)`, the epsilon fixed) and q, k and v clamped to [-clip_qkv, clip_qkv] right
after their projection where config.json says (`clip_qkv`); q/k/v/o biases where `attention_bias` says.

transformers' OlmoLayerNorm computes in float32 even in a float64 model: verify's float64 run takes it in float64
(`exact_layer_norm`)."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import Float64Fix, HFFamily
from .hf import number
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-olmo"
MODEL_TYPE = "olmo"
ARCHITECTURES = ("OlmoForCausalLM", "OlmoModel")
SPEC = FamilySpec(MODEL_TYPE, ARCHITECTURES, mlp_bias=None)
EPS = 1e-5  # OlmoLayerNorm's epsilon, which no config.json key sets
CONFIG_KEYS = {**{k: v for k, v in hf_llama.CONFIG_KEYS.items() if k != "layer_norm_eps"}, "clip_qkv": "clip_qkv"}


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from OLMo's `config.json`: Llama's reader, then its norms and clamp."""
    plain = {k: v for k, v in hf.items() if k != "rms_norm_eps"}  # OLMo has none (its LayerNorms take 1e-5)
    config, arch, notes = hf_llama.read_config(plain, keys, SPEC, hf_llama.BASE_PREFIX)
    clip = hf.get("clip_qkv")
    clip = None if clip is None else number(hf, "clip_qkv", 0.0)
    return config.replace(norm="layer", norm_affine=False, layer_norm_eps=EPS, clip_qkv=clip), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no OLMo equivalent (empty if it has one): Llama's checks on the norms OLMo has instead."""
    problems = hf_llama.problems_for(config.replace(norm="rms", norm_affine=True), SPEC)
    if config.norm != "layer" or config.norm_affine:
        problems.append(f"norm={config.norm!r}, norm_affine={config.norm_affine} ({MODEL_TYPE}'s norms are "
                        "LayerNorms without parameters)")
    if config.layer_norm_eps != EPS:
        problems.append(f"layer_norm_eps={config.layer_norm_eps!r} ({MODEL_TYPE}'s norms take {EPS})")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf, arch = hf_llama.write_config(config.replace(norm="rms", norm_affine=True), SPEC)
    hf.pop("rms_norm_eps")
    hf["clip_qkv"] = config.clip_qkv
    return hf, arch


def exact_layer_norm(model64, config: rn.TransformerConfig) -> None:
    """OlmoLayerNorm in the model's own dtype (transformers casts its input to float32 and back)."""
    import types

    import torch

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, self.normalized_shape, None, None, eps=EPS)

    for module in model64.modules():
        if type(module).__name__ == "OlmoLayerNorm":
            module.forward = types.MethodType(forward, module)


TASK_HEADS = decoder_heads("Olmo")[:1]  # `hf_tasks`: OlmoForSequenceClassification, transformers' only one


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=lambda config, prefix: hf_llama.build_table(config, prefix, hf_llama.ATTENTION),  # no norm weights
    prefix=lambda arch, keys=None: hf_llama.prefix_for(arch, keys, SPEC, hf_llama.BASE_PREFIX),
    base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=("norm_affine", "clip_qkv"),
    approximations=(),
    float64_fix=Float64Fix("OLMo's LayerNorms, which transformers computes in float32, computed in float64",
                           exact_layer_norm))
