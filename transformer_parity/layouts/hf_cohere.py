"""Hugging Face Cohere (`CohereForCausalLM`, `CohereModel`; Command-R): Llama's names with a parallel block: the
attention and the SwiGLU feed-forward (no biases) read one LayerNorm's output side by side and add to the residual at
once (canonical `parallel_residual` with `ffn_shares_norm`: `input_layernorm` is `norm1`, there is no
`post_attention_layernorm`). Every norm is CohereLayerNorm, a LayerNorm with a weight and no bias (`norm_bias=False`)
at `layer_norm_eps`; rotary positions turn adjacent dims together (`repeat_interleave`, `rotary_interleaved`); q/k/v/o
biases where `attention_bias` says; the head is tied to the embedding where `tie_word_embeddings` says (its default).

The logits are `lm_head(x) * logit_scale`: read as `logit_divisor = 1 / logit_scale` (Granite's field: one number
that scales the logits, the reciprocal exact for Cohere's 0.0625 and written back as `1 / logit_divisor`, which
gives config.json's value again wherever `1 / (1 / s) == s`; a float32 division by the reciprocal differs from
transformers' multiplication by at most a rounding of the logits). `use_qk_norm` (per-head LayerNorm weights of
shape (heads, head_dim)) is refused: the reference's q/k norms share one weight over the heads.

transformers computes CohereLayerNorm and the rotation itself in float32 even in a float64 model: verify's float64
run takes them in float64 (`exact_norms_and_rotation`)."""

from __future__ import annotations

import types
from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import Float64Fix, HFFamily
from .hf import number
from .hf_llama import FamilySpec

NAME = "hf-cohere"
MODEL_TYPE = "cohere"
ARCHITECTURES = ("CohereForCausalLM", "CohereModel")
SPEC = FamilySpec(MODEL_TYPE, ARCHITECTURES, tie_default=True, mlp_bias=None, supported={"use_qk_norm": False})
DEFAULT_LOGIT_SCALE = 0.0625  # CohereConfig's logit_scale where config.json gives none
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "layer_norm_eps": "layer_norm_eps", "logit_divisor": "logit_scale"}

_L = "layers.{i}."
NORMS_AND_EMBEDDING = [
    # canonical                                         CohereModel                             transform
    ("tgt_embed.embedding",                             "embed_tokens.weight",                  "identity"),
    ("decoder.layers.{i}.norm1.gamma",                  _L + "input_layernorm.weight",          "identity"),
    ("decoder.final_norm.gamma",                        "norm.weight",                          "identity"),
    ("-",                                               "rotary_emb.inv_freq",                  "rope_inv_freq"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose CohereModel sits under `prefix`."""
    backbone = NORMS_AND_EMBEDDING + hf_llama.ATTENTION + hf_llama.MLP
    return [(c, prefix + e, t) for c, e, t in backbone] + hf_llama.HEAD


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Cohere's `config.json`: Llama's reader, then its norms, parallel block,
    interleaved rotary positions and logit scale."""
    if "rms_norm_eps" in hf:
        raise ValueError(f"config.json rms_norm_eps={hf['rms_norm_eps']!r} is not supported ({MODEL_TYPE}'s norms are "
                         "LayerNorms at layer_norm_eps)")
    config, arch, notes = hf_llama.read_config(hf, keys, SPEC, hf_llama.BASE_PREFIX)
    divisor = 1.0
    if config.output_projection:
        if hf.get("logit_scale", DEFAULT_LOGIT_SCALE) is None:
            raise ValueError("config.json logit_scale=None is not supported (CohereForCausalLM multiplies its "
                             "logits by it)")
        scale = number(hf, "logit_scale", DEFAULT_LOGIT_SCALE)
        if scale <= 0:
            raise ValueError(f"config.json logit_scale={scale!r} is not supported (only a positive number)")
        divisor = 1.0 / scale
    return config.replace(norm="layer", norm_bias=False, layer_norm_eps=number(hf, "layer_norm_eps", 1e-5),
                          parallel_residual=True, ffn_shares_norm=True, rotary_interleaved=True,
                          logit_divisor=divisor), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no Cohere equivalent (empty if it has one): Llama's checks on the blocks Cohere has
    instead."""
    problems = hf_llama.problems_for(config.replace(norm="rms", norm_bias=True), SPEC)
    wanted = {"norm": "layer", "norm_bias": False, "parallel_residual": True, "ffn_shares_norm": True,
              "rotary_interleaved": True}
    problems += [f"{k}={getattr(config, k)!r} ({MODEL_TYPE} needs {v!r})" for k, v in wanted.items()
                 if getattr(config, k) != v]
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf, arch = hf_llama.write_config(config.replace(norm="rms", norm_bias=True), SPEC)
    hf.pop("rms_norm_eps")
    hf.update(layer_norm_eps=config.layer_norm_eps, logit_scale=1.0 / config.logit_divisor, use_qk_norm=False)
    return hf, arch


def rotation_in_model_dtype(model64, attention: str) -> None:
    """Each `attention` module (by class name) of a float64 model rotates q and k in their own dtype: its modeling
    module's `apply_rotary_pos_emb`, which takes them to float32 first, is swapped for this instance's calls only
    and restored after each (the modeling module's own `rotate_half` kept)."""
    import importlib

    def rotate(modeling):
        def apply(q, k, cos, sin, unsqueeze_dim=1):
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            return (q * cos + modeling.rotate_half(q) * sin), (k * cos + modeling.rotate_half(k) * sin)
        return apply

    def swapped(original, modeling):
        def forward(*args, **kwargs):
            saved = modeling.apply_rotary_pos_emb
            modeling.apply_rotary_pos_emb = rotate(modeling)
            try:
                return original(*args, **kwargs)
            finally:
                modeling.apply_rotary_pos_emb = saved
        return forward

    for module in model64.modules():
        if type(module).__name__ == attention:
            module.forward = swapped(module.forward, importlib.import_module(type(module).__module__))


def exact_norms_and_rotation(model64, config: rn.TransformerConfig) -> None:
    """In a float64 Cohere model: CohereLayerNorm in float64 (transformers casts to float32), and each attention's
    rotation in its own dtype (`rotation_in_model_dtype`). The rotary angles are `verify.source_hf.exact_float64`'s,
    adjacent pairs under `rotary_interleaved`."""
    import torch

    def norm(self, x):
        mean = x.mean(-1, keepdim=True)
        variance = (x - mean).pow(2).mean(-1, keepdim=True)
        return self.weight * ((x - mean) * torch.rsqrt(variance + self.variance_epsilon))

    for module in model64.modules():
        if type(module).__name__ == "CohereLayerNorm":
            module.forward = types.MethodType(norm, module)
    rotation_in_model_dtype(model64, "CohereAttention")


TASK_HEADS = ()  # transformers has no Cohere task classes


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=lambda arch, keys=None: hf_llama.prefix_for(arch, keys, SPEC, hf_llama.BASE_PREFIX),
    base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("norm_bias", "parallel_residual", "ffn_shares_norm", "rotary_interleaved", "logit_divisor"),
    approximations=(),
    float64_fix=Float64Fix("Cohere's LayerNorms and rotation, which transformers computes in float32, "
                           "computed in float64", exact_norms_and_rotation))
