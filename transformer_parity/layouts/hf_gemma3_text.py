"""Hugging Face Gemma 3's text model (model_type `gemma3_text`: `Gemma3ForCausalLM`, `Gemma3TextModel`): Gemma 2's
names and blocks (`hf_gemma2`) with an RMSNorm on each head of q and k (`q_norm`, `k_norm`, times `1 + w` too), five
sliding layers to a full one by default, and each kind its own rotary parameters (`rope_parameters` by layer type:
the full layers' at `rope_theta` with any scaling, the sliding layers' by the default rope at `local_rope_theta`).

transformers' Gemma 3 never soft-caps its attention scores (its attention does not pass `attn_logit_softcapping`
on), so a config.json that names a cap is refused: which model it means is not known. The multimodal `gemma3`
directories (`Gemma3ForConditionalGeneration`) are another model type. verify's float64 run computes each layer
type's rotary tables in float64 (`exact_rotary_by_layer_type`) and eager attention's softmax in float64."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_gemma2, hf_llama
from .family import Float64Fix, HFFamily
from .hf import integer
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-gemma3-text"
MODEL_TYPE = "gemma3_text"
ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma3TextModel")
SPEC = FamilySpec("gemma3_text", ARCHITECTURES, activation_default="gelu_pytorch_tanh", tie_default=True,
                  mlp_bias=None, qk_norm=True, norm_weight_offset=1.0, scale_embedding=True)
THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}  # Gemma3TextConfig's default bases
CONFIG_KEYS = {**hf_gemma2.CONFIG_KEYS, "rope_theta": "rope_parameters.full_attention.rope_theta",
               "local_rope_theta": "rope_parameters.sliding_attention.rope_theta"}


def rope_by_layer_type(hf: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(full layers' rope parameters, sliding layers')`, as Gemma3TextConfig fills them in: `rope_parameters` by
    layer type, or the older `rope_theta`, `rope_local_base_freq` and `rope_scaling` (the full layers')."""
    given = hf.get("rope_parameters")
    if given is not None and (not isinstance(given, Mapping) or not set(given) <= set(THETA)
                              or not all(isinstance(v, Mapping) or v is None for v in given.values())):
        raise ValueError(f"config.json rope_parameters={given!r} is not supported (full_attention and "
                         "sliding_attention, each its own parameters)")
    full = dict((given or {}).get("full_attention") or {"rope_type": "default"})
    sliding = dict((given or {}).get("sliding_attention") or {"rope_type": "default"})
    if hf.get("rope_scaling") is not None:
        full.update(hf["rope_scaling"])
    full.setdefault("rope_theta", hf.get("rope_theta", THETA["full_attention"]))
    sliding.setdefault("rope_theta", hf.get("rope_local_base_freq", THETA["sliding_attention"]))
    return full, sliding


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Gemma 3's text `config.json`."""
    if hf.get("attn_logit_softcapping") is not None:
        raise ValueError(f"config.json attn_logit_softcapping={hf['attn_logit_softcapping']!r} is not supported: "
                         "transformers' Gemma 3 never applies it (KerasHub's does), so which model it means is not "
                         "known; set it to null for transformers' model")
    full, sliding = rope_by_layer_type(hf)
    plain = {k: v for k, v in hf.items() if k not in ("rope_scaling", "rope_theta", "rope_local_base_freq",
                                                       "sliding_window_pattern")}
    fields, kinds, window, notes = hf_gemma2.read_gemma(
        {**plain, "rope_parameters": full, "final_logit_softcapping": hf.get("final_logit_softcapping")}, keys, SPEC,
        integer(hf, "sliding_window_pattern", 6))
    local_theta, local_scaling, local_fraction = hf_llama.rope({"rope_parameters": sliding})
    local = None
    if sliding != full:  # the sliding layers rotate otherwise: by the default rope, at their own base
        if local_scaling is not None or local_fraction != 1.0:
            raise ValueError(f"config.json rope_parameters.sliding_attention={sliding!r} is not supported (the "
                             "sliding layers rotate by the default rope type, or by the full layers' parameters)")
        if "full" in kinds:
            local = local_theta
        else:  # every layer slides: the sliding parameters are the model's
            fields.update(rope_theta=local_theta, rope_scaling=None)
    fields.update(sliding_window=window, layer_kinds=kinds if window is not None else None,
                  local_rope_theta=local if window is not None and "full" in kinds else None)
    config = rn.TransformerConfig.from_dict(fields)
    return config, ARCHITECTURES[0 if config.output_projection else 1], notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    problems = hf_gemma2.gemma_problems(config, SPEC)
    if config.attn_logit_softcap is not None:
        problems.append(f"attn_logit_softcap={config.attn_logit_softcap} (transformers' Gemma 3 never caps its "
                        "attention scores)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    hf, arch = hf_gemma2.write_gemma(config, SPEC)
    full = hf["rope_parameters"]
    sliding = full if config.local_rope_theta is None else {"rope_type": "default",
                                                             "rope_theta": config.local_rope_theta}
    hf.update(rope_parameters={"full_attention": full, "sliding_attention": dict(sliding)},
              attn_logit_softcapping=None)
    return hf, arch


def exact_rotary_by_layer_type(model64, config: rn.TransformerConfig) -> None:
    """Gemma 3's rotary tables, one per layer type and float32 in transformers even in a float64 model, computed in
    float64 by the reference's frequencies (`ops.rope_frequencies`, the sliding layers' at `local_rope_theta`): its
    rotary module replaced in this model instance, by one that verify's model-wide fix leaves alone."""
    import torch

    class ExactTablesByLayerType(torch.nn.Module):
        def forward(self, x, position_ids, layer_type):
            local = layer_type == "sliding_attention" and config.local_rope_theta is not None
            inv_freq, scaling = rn.ops.rope_frequencies(config, int(position_ids.max()) + 1, local=local)
            freqs = position_ids[..., None].double() * torch.as_tensor(inv_freq)  # (B, T, r/2)
            angles = torch.cat((freqs, freqs), dim=-1)  # (B, T, r)
            return (angles.cos() * scaling).to(x.dtype), (angles.sin() * scaling).to(x.dtype)

    for module in list(model64.modules()):
        if hasattr(getattr(module, "rotary_emb", None), "layer_types"):
            module.rotary_emb = ExactTablesByLayerType()


def exact_float64(model64, config: rn.TransformerConfig) -> None:
    exact_rotary_by_layer_type(model64, config)
    hf_gemma2.exact_eager_attention(model64, config)


TASK_HEADS = decoder_heads("Gemma3Text", qa=False)[:1]  # `hf_tasks`: its sequence classifier (no token classifier)


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf,
    config_keys=CONFIG_KEYS, table=hf_gemma2.table,
    prefix=lambda arch, keys=None: hf_llama.prefix_for(arch, keys, SPEC, hf_llama.BASE_PREFIX),
    base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_gemma2.HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("final_logit_softcap", "post_norms", "layer_kinds", "local_rope_theta", "attention_scale"),
    approximations=(),
    float64_fix=Float64Fix("each layer type's rotary tables and eager attention's softmax, which transformers "
                           "computes in float32, computed in float64", exact_float64))
