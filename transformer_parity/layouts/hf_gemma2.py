"""Hugging Face Gemma 2 (`Gemma2ForCausalLM`, `Gemma2Model`): Gemma's names and blocks (RMSNorms times `1 + w`,
embeddings scaled by sqrt(hidden_size), GeGLU, a tied head), with a norm after each sublayer too (`post_norms`: its
`post_attention_layernorm` is the one after attention, `pre_feedforward_layernorm` the one before the feed-forward),
sliding and full layers by `layer_types` (`layer_kinds`), scores scaled by query_pre_attn_scalar**-0.5
(`attention_scale`) and soft-capped (`attn_logit_softcapping`), and capped logits (`final_logit_softcapping`).

transformers' eager attention, the only one Gemma 2 runs, takes its softmax in float32 even in a float64 model:
verify's float64 run takes it in float64 (`exact_eager_attention`, which Gemma 3 and SmolLM3 use too)."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .hf_tasks import decoder_heads
from .family import Float64Fix, HFFamily
from .hf import activation, number, optional_integer
from .hf_llama import FamilySpec

NAME = "hf-gemma2"
MODEL_TYPE = "gemma2"
ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma2Model")
SPEC = FamilySpec("gemma2", ARCHITECTURES, activation_default="gelu_pytorch_tanh", tie_default=True, mlp_bias=None,
                  norm_weight_offset=1.0, scale_embedding=True)
# Gemma2Config's defaults for the keys a config.json may leave out
DEFAULTS = {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0, "hidden_activation": "gelu_pytorch_tanh"}
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "attention_scale": "query_pre_attn_scalar",
               "attn_logit_softcap": "attn_logit_softcapping", "final_logit_softcap": "final_logit_softcapping",
               "layer_kinds": "layer_types", "sliding_window": "sliding_window"}

_L = "layers.{i}."
# the Gemma 2/3 sandwich: its post_attention_layernorm follows attention, pre_feedforward_layernorm precedes the MLP
SANDWICH = [
    ("decoder.layers.{i}.norm1.gamma",                  _L + "input_layernorm.weight",            "identity"),
    ("decoder.layers.{i}.post_attn_norm.gamma",         _L + "post_attention_layernorm.weight",   "identity"),
    ("decoder.layers.{i}.norm3.gamma",                  _L + "pre_feedforward_layernorm.weight",  "identity"),
    ("decoder.layers.{i}.post_ffn_norm.gamma",          _L + "post_feedforward_layernorm.weight", "identity"),
]
NORMS_AND_EMBEDDING = [entry for entry in hf_llama.NORMS_AND_EMBEDDING if ".norm1." not in entry[0]
                       and ".norm3." not in entry[0]] + SANDWICH
# the modules whose outputs are canonical sublayers (Llama's, and the norms after attention and the feed-forward)
HOOKS = {**hf_llama.HOOKS, "decoder.layers.{i}.post_attn_norm": "layers.{i}.post_attention_layernorm",
         "decoder.layers.{i}.post_ffn_norm": "layers.{i}.post_feedforward_layernorm"}


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """Llama's table with the four norms of each layer."""
    backbone = NORMS_AND_EMBEDDING + hf_llama.ATTENTION + hf_llama.MLP + (hf_llama.QK_NORM if config.qk_norm else [])
    return [(c, prefix + e, t) for c, e, t in backbone] + hf_llama.HEAD


def gemma_activation(hf: Mapping[str, Any]) -> dict[str, Any]:
    """config.json with `hidden_act` saying what the model runs: Gemma 2 and 3 run `hidden_activation` and ignore a
    `hidden_act`, which must then agree or be absent."""
    ours = activation(hf, "hidden_activation", DEFAULTS["hidden_activation"])
    if hf.get("hidden_act") is not None and activation(hf, "hidden_act", "gelu_pytorch_tanh") != ours:
        raise ValueError(f"config.json hidden_act={hf['hidden_act']!r} and hidden_activation="
                         f"{hf.get('hidden_activation')!r} disagree (transformers runs hidden_activation)")
    return {**hf, "hidden_act": hf.get("hidden_activation", DEFAULTS["hidden_activation"]),
            "hidden_activation": None}


def layer_kinds(hf: Mapping[str, Any], layers: int, pattern: int) -> tuple[tuple[str, ...], int | None]:
    """`(kind per layer, sliding_window)` from `layer_types` (absent: every `pattern`-th layer full, the others
    sliding, as transformers fills it in); a sliding layer without a window is refused."""
    types = hf.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers \
            or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"config.json layer_types={types!r} is not supported (full_attention or sliding_attention "
                         f"for each of num_hidden_layers={layers})")
    kinds = tuple("sliding" if t == "sliding_attention" else "full" for t in types)
    window = optional_integer(hf, "sliding_window") if "sliding_window" in hf else DEFAULTS["sliding_window"]
    if "sliding" in kinds and window is None:
        raise ValueError("config.json layer_types names sliding_attention layers but sliding_window is null")
    return kinds, window if "sliding" in kinds else None


def attention_scale(hf: Mapping[str, Any]) -> float:
    scalar = number(hf, "query_pre_attn_scalar", DEFAULTS["query_pre_attn_scalar"])
    if scalar <= 0:
        raise ValueError(f"config.json query_pre_attn_scalar={scalar!r} must be positive")
    return scalar ** -0.5


def soft_cap(hf: Mapping[str, Any], key: str) -> float | None:
    """A soft cap (null: none; absent: Gemma2Config's default)."""
    if key in hf and hf[key] is None:
        return None
    return number(hf, key, DEFAULTS[key])


def read_gemma(hf: Mapping[str, Any], keys: Collection[str], spec: FamilySpec, pattern: int
               ) -> tuple[dict[str, Any], tuple[str, ...], int | None, list[str]]:
    """What Gemma 2 and 3 share: `(canonical fields, layer kinds, window, notes)`; the rest is Llama's reader's."""
    hf = {**gemma_activation(hf), "head_dim": hf.get("head_dim", DEFAULTS["head_dim"])}
    config, _, notes = hf_llama.read_config({k: v for k, v in hf.items() if k not in ("layer_types",
                                                                                      "sliding_window")},
                                            keys, spec, hf_llama.BASE_PREFIX)
    kinds, window = layer_kinds(hf, config.num_decoder_layers, pattern)
    fields = config.to_dict()
    fields.update(post_norms=True, attention_scale=attention_scale(hf),
                  final_logit_softcap=soft_cap(hf, "final_logit_softcapping") if config.output_projection else None)
    return fields, kinds, window, notes


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Gemma 2's `config.json`: layers alternate sliding and full unless
    `layer_types` says otherwise."""
    fields, kinds, window, notes = read_gemma(hf, keys, SPEC, 2)
    fields.update(attn_logit_softcap=soft_cap(hf, "attn_logit_softcapping"), sliding_window=window,
                  layer_kinds=kinds if window is not None else None)
    config = rn.TransformerConfig.from_dict(fields)
    return config, ARCHITECTURES[0 if config.output_projection else 1], notes


def scalar_problem(config: rn.TransformerConfig) -> str | None:
    """Why query_pre_attn_scalar (an integer in transformers) cannot say this config's attention scale, or None."""
    scalar = round(config.attention_scale_factor ** -2)
    if scalar < 1 or scalar ** -0.5 != config.attention_scale_factor:
        return (f"attention_scale={config.attention_scale!r} (query_pre_attn_scalar**-0.5 for an integer "
                "query_pre_attn_scalar)")
    return None


def gemma_problems(config: rn.TransformerConfig, spec: FamilySpec) -> list[str]:
    """What Gemma 2 and 3 share: Llama's checks on the model without its window, then the sandwich and the scale."""
    plain = config.replace(sliding_window=None, layer_kinds=None, local_rope_theta=None, post_norms=False,
                           attn_logit_softcap=None, final_logit_softcap=None, attention_scale="head")
    problems = hf_llama.problems_for(plain, spec)
    if not config.post_norms:
        problems.append(f"post_norms=False ({spec.model_type} normalizes each sublayer's output too)")
    if config.rope_layers is not None:
        problems.append(f"rope_layers={list(config.rope_layers)} ({spec.model_type} rotates in every layer)")
    if scalar_problem(config):
        problems.append(scalar_problem(config))
    return problems


def export_problems(config: rn.TransformerConfig) -> list[str]:
    problems = gemma_problems(config, SPEC)
    if config.local_rope_theta is not None:
        problems.append(f"local_rope_theta={config.local_rope_theta} (gemma2 rotates every layer at one base)")
    return problems


def write_gemma(config: rn.TransformerConfig, spec: FamilySpec) -> tuple[dict[str, Any], str]:
    """Llama's config.json with Gemma's keys: the activation, the scale, the kinds and their window, the final cap."""
    hf, arch = hf_llama.write_config(config, spec)
    kinds = [config.layer_kind(i) for i in range(config.num_decoder_layers)]
    hf.pop("hidden_act")
    hf.update(hidden_activation="gelu_pytorch_tanh" if config.activation == "gelu_tanh" else hf_llama._hf_activation(
        config.activation), query_pre_attn_scalar=round(config.attention_scale_factor ** -2),
        layer_types=[f"{kind}_attention" for kind in kinds], sliding_window=config.sliding_window,
        final_logit_softcapping=config.final_logit_softcap)
    return hf, arch


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    hf, arch = write_gemma(config, SPEC)
    hf["attn_logit_softcapping"] = config.attn_logit_softcap
    return hf, arch


def _eager64(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    """transformers' eager attention (with Gemma's soft cap), its softmax in the scores' dtype, not float32."""
    import torch

    groups = module.num_key_value_groups
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)  # (B, H, T, d)
    scores = torch.matmul(query, key.transpose(2, 3)) * (module.head_dim ** -0.5 if scaling is None else scaling)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights  # (B, T, H, d)


def exact_eager_attention(model64, config: rn.TransformerConfig) -> None:
    """Each attention module of `model64` (only this instance) calls `_eager64` where transformers' eager attention
    would take its softmax in float32: its modeling module's `eager_attention_forward` is swapped in for the
    module's call and restored after it. An sdpa model is float64 as it is and left as it computes."""
    import importlib

    def swapped(original, modeling):
        def forward(*args, **kwargs):
            saved = modeling.eager_attention_forward
            modeling.eager_attention_forward = _eager64
            try:
                return original(*args, **kwargs)
            finally:
                modeling.eager_attention_forward = saved
        return forward

    for module in model64.modules():
        if type(module).__name__.endswith("Attention") and hasattr(module, "num_key_value_groups"):
            modeling = importlib.import_module(type(module).__module__)
            if hasattr(modeling, "eager_attention_forward"):
                module.forward = swapped(module.forward, modeling)  # the bound forward: this instance only


TASK_HEADS = decoder_heads("Gemma2", qa=False)  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf,
    config_keys=CONFIG_KEYS, table=table,
    prefix=lambda arch, keys=None: hf_llama.prefix_for(arch, keys, SPEC, hf_llama.BASE_PREFIX),
    base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("attn_logit_softcap", "final_logit_softcap", "post_norms", "layer_kinds", "attention_scale"),
    approximations=(),
    float64_fix=Float64Fix("eager attention's softmax, which transformers takes in float32, taken in float64",
                           exact_eager_attention))
