"""Hugging Face GPT-OSS (`GptOssForCausalLM`, `GptOssModel`): Llama's names and norms, with biases on q, k, v and o
(`attention_bias`), a learned sink logit per query head in every attention (`self_attn.sinks`: canonical
`attention_sinks`), sliding and full layers by `layer_types` (`layer_kinds`; absent: odd layers sliding), yarn
rotary positions by default, and a mixture of experts as every layer's feed-forward.

The mixture, read from transformers 5 (`modeling_gpt_oss.py`): the router `mlp.router` is a linear layer with a bias
(`router_bias`) over `num_local_experts` experts; each token keeps its `num_experts_per_tok` highest scores and takes
the softmax over those k (`router_softmax="after_topk"`). Every expert has biases (`ffn_bias`) and a clamped GLU:
gate = min(x Wg + bg, swiglu_limit), up = clip(x W1 + b1, -swiglu_limit, swiglu_limit), gate * sigmoid(swiglu_alpha
* gate) * (up + 1) (`glu_limit`, `glu_alpha`, `glu_up_offset=1`), into its down projection and bias. `hidden_act`
computes nothing (the experts apply their own GLU). The experts are saved stacked per layer: `gate_up_proj`
`(experts, hidden, 2 * intermediate)` with gate and up interleaved in the last axis (gate at the even features) and
its bias `(experts, 2 * intermediate)`, `down_proj` `(experts, intermediate, hidden)` and its bias (the mapping
language's `expert_bank_interleaved` and `expert_bank`). The keys that only train (`router_aux_loss_coef`,
`output_router_logits`) are accepted and change nothing.

transformers' rotary module returns half-width angles here (its rotation splits each head in halves itself), so
verify's float64 run replaces it by one of that width computing the angles in float64 (`float64_fix`)."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import Float64Fix, HFFamily
from .hf import boolean, integer, number
from .hf_gemma2 import layer_kinds
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-gpt-oss"
MODEL_TYPE = "gpt_oss"
ARCHITECTURES = ("GptOssForCausalLM", "GptOssModel")
SPEC = FamilySpec("gpt_oss", ARCHITECTURES, mlp_bias=None)
# GptOssConfig's defaults for the keys a config.json may leave out
DEFAULTS = {"sliding_window": 128, "swiglu_limit": 7.0, "swiglu_alpha": 1.702, "attention_bias": True,
            "num_local_experts": 128, "num_experts_per_tok": 4, "rope_theta": 150000.0,
            "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                "truncate": False, "original_max_position_embeddings": 4096}}
MAX_EXPERTS = 1 << 16  # the file's stacked experts cannot be counted from its key names: a bound before allocating
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "num_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
               "layer_kinds": "layer_types", "sliding_window": "sliding_window", "glu_limit": "swiglu_limit",
               "glu_alpha": "swiglu_alpha"}
# transformers' modules: the router is `mlp.router`, whose last output is each token's chosen experts
HOOKS = {**hf_llama.HOOKS, "decoder.layers.{i}.ffn.routing": "layers.{i}.mlp.router"}

_L = "layers.{i}."
ATTENTION = hf_llama.ATTENTION + [
    ("decoder.layers.{i}.self_attn.sinks",                  _L + "self_attn.sinks",               "identity"),
]
EXPERT_TABLE = [
    # canonical                                           GptOssModel                         transform
    ("decoder.layers.{i}.ffn.router.kernel",              _L + "mlp.router.weight",           "transpose"),
    ("decoder.layers.{i}.ffn.router.bias",                _L + "mlp.router.bias",             "identity"),
    ("decoder.layers.{i}.ffn.experts.{e}.{gate_up}.kernel", _L + "mlp.experts.gate_up_proj",
     "expert_bank_interleaved"),
    ("decoder.layers.{i}.ffn.experts.{e}.{gate_up}.bias", _L + "mlp.experts.gate_up_proj_bias",
     "expert_bank_interleaved"),
    ("decoder.layers.{i}.ffn.experts.{e}.linear2.kernel", _L + "mlp.experts.down_proj",       "expert_bank"),
    ("decoder.layers.{i}.ffn.experts.{e}.linear2.bias",   _L + "mlp.experts.down_proj_bias",  "expert_bank"),
]


def _with_defaults(hf: Mapping[str, Any]) -> dict[str, Any]:
    """config.json with GptOssConfig's defaults where it leaves a key out (its rotary base is 150000, its rope yarn)."""
    hf = dict(hf)
    if all(key not in hf for key in ("rope_parameters", "rope_scaling", "rope_theta")):
        hf["rope_parameters"] = dict(DEFAULTS["rope_parameters"])
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" not in params and "rope_theta" not in hf:
        hf["rope_parameters"] = {**params, "rope_theta": DEFAULTS["rope_theta"]}
    for key in ("sliding_window", "attention_bias"):
        hf.setdefault(key, DEFAULTS[key])
    return hf


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from GPT-OSS's `config.json` (and the saved key names)."""
    hf = _with_defaults(hf)
    notes = []
    if hf.get("hidden_act", "silu") != "silu":
        notes.append(f"config.json hidden_act={hf['hidden_act']!r} computes nothing: gpt_oss's experts apply their "
                     "own clamped GLU, g * sigmoid(swiglu_alpha * g) * (up + 1)")
    dense = {k: v for k, v in hf.items() if k not in ("layer_types", "sliding_window")}
    config, arch, more = hf_llama.read_config({**dense, "hidden_act": "silu"}, keys, SPEC, hf_llama.BASE_PREFIX)
    if config.num_decoder_layers > len(keys):  # before a parameter list of the config's size exists
        raise ValueError(f"config.json num_hidden_layers={config.num_decoder_layers} cannot match a file of "
                         f"{len(keys)} tensors; refusing before allocating anything")
    kinds, window = layer_kinds(hf, config.num_decoder_layers, 2)
    boolean(hf, "output_router_logits", False)  # the keys that only train: checked, computing nothing
    number(hf, "router_aux_loss_coef", 0.0)
    experts = integer(hf, "num_local_experts", DEFAULTS["num_local_experts"])
    if hf.get("num_experts") is not None and integer(hf, "num_experts") != experts:
        raise ValueError(f"config.json num_local_experts={experts} and num_experts={hf['num_experts']} disagree")
    if not 1 <= experts <= MAX_EXPERTS:
        raise ValueError(f"config.json num_local_experts={experts} must be from 1 to {MAX_EXPERTS}")
    per_token = integer(hf, "num_experts_per_tok", DEFAULTS["num_experts_per_tok"])
    if not 1 <= per_token <= experts:
        raise ValueError(f"config.json num_experts_per_tok={per_token} must be from 1 to the {experts} experts")
    limit, alpha = (number(hf, key, DEFAULTS[key]) for key in ("swiglu_limit", "swiglu_alpha"))
    for key, value in (("swiglu_limit", limit), ("swiglu_alpha", alpha)):
        if value <= 0:
            raise ValueError(f"config.json {key}={value!r} must be positive")
    config = config.replace(
        num_experts=experts, experts_per_token=per_token, router_softmax="after_topk", router_bias=True,
        ffn_bias=True, attention_sinks=True, glu_limit=limit, glu_alpha=alpha, glu_up_offset=1.0,
        sliding_window=window, layer_kinds=kinds if window is not None else None)
    return config, arch, notes + more


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Llama's checks on the model without its window and expert biases, then what GPT-OSS always has."""
    problems = hf_llama.problems_for(config.replace(sliding_window=None, layer_kinds=None, ffn_bias=False), SPEC)
    always = {"num_experts": config.num_experts > 0, "router_softmax": config.router_softmax == "after_topk",
              "router_bias": config.router_bias, "ffn_bias": config.has_ffn_bias,
              "attention_sinks": config.attention_sinks, "glu_limit": config.glu_limit is not None,
              "glu_up_offset": config.glu_up_offset == 1.0, "activation": config.activation == "silu"}
    problems += [f"{field}={getattr(config, field)!r} (gpt_oss's experts have a router with a bias over the k "
                 "chosen, biases, a clamped silu GLU with an up offset of 1, and every attention a sink)"
                 for field, has in always.items() if not has]
    for field, value in (("expert_d_ff", config.expert_d_ff), ("shared_expert_d_ff", config.shared_expert_d_ff),
                         ("expert_layers", config.expert_layers)):
        if value is not None:
            problems.append(f"{field}={value!r} (gpt_oss's experts are every layer's feed-forward, "
                            "intermediate_size wide, and none is shared)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    hf, arch = hf_llama.write_config(config, SPEC)
    kinds = [config.layer_kind(i) for i in range(config.num_decoder_layers)]
    hf.update(num_local_experts=config.num_experts, num_experts_per_tok=config.experts_per_token,
              swiglu_limit=config.glu_limit, swiglu_alpha=config.glu_alpha, output_router_logits=False,
              layer_types=[f"{kind}_attention" for kind in kinds], sliding_window=config.sliding_window)
    return hf, arch


def _half_angles(model64, config: rn.TransformerConfig) -> None:
    """GPT-OSS's rotary module returns cos and sin of the angles alone, `(B, T, rotary_dim / 2)` (its rotation
    splits each head in halves itself), in float32 even in a float64 model: replaced by the same, computed in
    float64 from the reference's frequencies (under a name the generic float64 replacement leaves alone)."""
    import torch

    class HalfAngles(torch.nn.Module):
        def forward(self, x, position_ids):
            inv_freq, scaling = rn.ops.rope_frequencies(config, int(position_ids.max()) + 1)
            freqs = position_ids[..., None].double() * torch.as_tensor(inv_freq)  # (B, T, r/2)
            return (freqs.cos() * scaling).to(x.dtype), (freqs.sin() * scaling).to(x.dtype)

    model64.base_model.rotary_emb = HalfAngles()


TASK_HEADS = decoder_heads("GptOss", qa=False)  # `hf_tasks`: no question-answering class


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **{**hf_llama.functions(SPEC, ATTENTION, EXPERT_TABLE),  # table, prefix: Llama's, with these entries
       "config_from_hf": config_from_hf, "export_problems": export_problems, "config_to_hf": config_to_hf},
    config_keys=CONFIG_KEYS, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("num_experts", "attention_sinks", "router_bias", "glu_limit", "glu_alpha", "glu_up_offset",
               "layer_kinds"),
    approximations=(),
    float64_fix=Float64Fix(says="the half-width rotary angles, which transformers builds in float32, replaced by the "
                                "exact ones", apply=_half_angles))
