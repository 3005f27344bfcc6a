"""Hugging Face StableLM (`StableLmForCausalLM`, `StableLmModel`; StableLM 2, StableLM-3B-4E1T): Llama's names and
gated feed-forward (`gate_proj`, `up_proj`, `down_proj`, no biases) with LayerNorms that have a bias
(`layer_norm_eps`), biases on q, k and v only where `use_qkv_bias` says, and rotary positions on part of each head:
`partial_rotary_factor`, 0.25 where config.json gives none (transformers' default for this family).

`use_parallel_residual`: attention and feed-forward both read `input_layernorm`'s output and add to the residual
at once (canonical `parallel_residual` with `ffn_shares_norm`; the layer then has no `post_attention_layernorm`).

Refused in one line naming the field: `qk_layernorm` (a LayerNorm of its own for every head, which the canonical
model's one q/k norm shared by all heads does not compute)."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import HFFamily
from .hf import activation, architecture, boolean, integer, number, optional_integer, refuse
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-stablelm"
MODEL_TYPE = "stablelm"
ARCHITECTURES = ("StableLmForCausalLM", "StableLmModel")
SPEC = FamilySpec(MODEL_TYPE, ARCHITECTURES, attention_bias=None, mlp_bias=None, partial_rotary=True)
DEFAULT_ROTARY = 0.25  # StableLmConfig's partial_rotary_factor when config.json gives none
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "layer_norm_eps": "layer_norm_eps"}

def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose StableLmModel sits under `prefix`."""
    backbone = hf_llama.NORMS_AND_EMBEDDING + hf_llama.NORM_BIASES + hf_llama.ATTENTION + hf_llama.MLP
    return [(c, prefix + e, t) for c, e, t in backbone] + hf_llama.HEAD


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from StableLM's `config.json` (and the saved key names)."""
    has_head = any(k.startswith(hf_llama.BASE_PREFIX) or k == "lm_head.weight" for k in keys)
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, has_head)
    refuse(hf, {"is_encoder_decoder": False, "qk_layernorm": False})
    parallel = boolean(hf, "use_parallel_residual", False)
    vocab, d, heads = integer(hf, "vocab_size"), integer(hf, "hidden_size"), integer(hf, "num_attention_heads")
    if heads == 0 or d % heads:
        raise ValueError(f"config.json hidden_size={d} is not divisible by num_attention_heads={heads}")
    theta, scaling, fraction = hf_llama.rope({**hf, "partial_rotary_factor": hf.get("partial_rotary_factor",
                                                                                     DEFAULT_ROTARY)})
    notes = hf_llama.pad_note(hf, MODEL_TYPE)
    lm = arch == ARCHITECTURES[0]
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads,
        num_kv_heads=hf_llama._kv_heads(hf, heads),
        num_encoder_layers=0, num_decoder_layers=integer(hf, "num_hidden_layers"),
        d_ff=integer(hf, "intermediate_size"), max_len=integer(hf, "max_position_embeddings"),
        dropout=number(hf, "attention_dropout", 0.0), activation=activation(hf, "hidden_act", "silu"),
        norm_first=True, final_norm=True, norm="layer", layer_norm_eps=number(hf, "layer_norm_eps", 1e-5),
        positional="rope", rope_theta=theta, rope_scaling=scaling, rotary_fraction=fraction, scale_embedding=False,
        bias=False, qkv_bias=boolean(hf, "use_qkv_bias", False) or None, ffn_gated=True,
        parallel_residual=parallel, ffn_shares_norm=parallel,
        tie_embeddings=boolean(hf, "tie_word_embeddings", False) if lm else False, pad_id=None, output_bias=False,
        output_projection=lm)
    if optional_integer(hf, "head_dim") not in (None, config.head_dim):
        raise ValueError(f"config.json head_dim={hf['head_dim']!r} is not hidden_size / num_attention_heads "
                         f"({config.head_dim}), which {MODEL_TYPE} computes")
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no StableLM equivalent (empty if it has one)."""
    wanted = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "norm": "layer",
              "norm_weight_offset": 0.0, "positional": "rope", "ffn_gated": True, "scale_embedding": False,
              "embed_norm": False, "head_transform": False, "type_vocab_size": 0, "pooler": False, "qk_norm": False,
              "head_size": None, "sliding_window": None}
    problems = [f"{k}={getattr(config, k)!r} ({MODEL_TYPE} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.parallel_residual != config.ffn_shares_norm:
        problems.append(f"parallel_residual=True with ffn_shares_norm=False ({MODEL_TYPE}'s parallel layers read one "
                        "norm)")
    if config.has_o_bias:
        problems.append(f"a bias on the attention output ({MODEL_TYPE} has none)")
    if config.has_ffn_bias:
        problems.append(f"feed-forward biases ({MODEL_TYPE} has none)")
    if config.output_projection and config.has_output_bias:
        problems.append(f"output_bias=True ({MODEL_TYPE}'s lm_head has no bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf, _ = hf_llama.write_config(config, SPEC)
    for key in ("rms_norm_eps", "head_dim"):
        hf.pop(key)
    hf["rope_parameters"]["partial_rotary_factor"] = config.rotary_fraction  # 1.0 too: absent means 0.25 here
    hf.update(layer_norm_eps=config.layer_norm_eps, use_qkv_bias=config.has_qkv_bias, qk_layernorm=False,
              use_parallel_residual=config.parallel_residual, hidden_dropout=config.dropout, architectures=[arch])
    return hf, arch


def prefix(arch: str, keys: Collection[str] | None = None) -> str:
    return hf_llama.prefix_for(arch, keys, SPEC, hf_llama.BASE_PREFIX)


TASK_HEADS = decoder_heads("StableLm", qa=False)  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("parallel_residual", "ffn_shares_norm"),  # `layouts.FAMILY_ONLY` settings it has (use_parallel_residual)
    approximations=(), float64_fix=None)
