"""Hugging Face Llama (`LlamaForCausalLM`, `LlamaModel`): a decoder-only, pre-norm model with RMSNorm, rotary
positions, grouped-query attention and a SwiGLU feed-forward.

Every projection is an `nn.Linear` (`(out, in)`, transposed to canonical kernels); q, k, v and o are separate, k and
v narrower than q under grouped-query attention. `input_layernorm` precedes attention (canonical `norm1`) and
`post_attention_layernorm` the feed-forward (`norm3`); `mlp.gate_proj` / `up_proj` / `down_proj` are the canonical
`ffn.gate` / `linear1` / `linear2`. The rotary settings come from `rope_parameters` (transformers 5) or the older
`rope_theta` + `rope_scaling`; a rope type or parameter the reference does not implement is refused.

The Mistral, Qwen2, Qwen3 and Gemma families save the same names (Qwen3 adds `q_norm` / `k_norm`), so their modules
are this one's table and config reader with their own fields (`FamilySpec`); Phi-3 fuses q/k/v and gate/up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping

import reference_numpy as rn

from .family import HFFamily
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, optional_integer,
                 prefix_rule, refuse)
from .hf_tasks import decoder_heads

NAME = "hf-llama"
MODEL_TYPE = "llama"
ARCHITECTURES = ("LlamaForCausalLM", "LlamaModel")
BASE_PREFIX = "model."  # where LlamaForCausalLM keeps its LlamaModel
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_size",
               "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
               "num_decoder_layers": "num_hidden_layers", "d_ff": "intermediate_size",
               "max_len": "max_position_embeddings", "head_size": "head_dim", "layer_norm_eps": "rms_norm_eps"}
# The modules whose outputs are canonical sublayers, under the base model (`verify`'s source oracle).
HOOKS = {"decoder.layers.{i}.self_attn": "layers.{i}.self_attn", "decoder.layers.{i}.ffn": "layers.{i}.mlp",
         "decoder.layers.{i}": "layers.{i}", "decoder.final_norm": "norm"}

_L = "layers.{i}."
ATTENTION = [
    # canonical                                         LlamaModel                              transform
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",       _L + "self_attn.{qkv}_proj.weight",     "transpose"),
    ("decoder.layers.{i}.self_attn.{qkv}.bias",         _L + "self_attn.{qkv}_proj.bias",       "identity"),
    ("decoder.layers.{i}.self_attn.o.kernel",           _L + "self_attn.o_proj.weight",         "transpose"),
    ("decoder.layers.{i}.self_attn.o.bias",             _L + "self_attn.o_proj.bias",           "identity"),
]
QK_NORM = [
    ("decoder.layers.{i}.self_attn.q_norm.gamma",       _L + "self_attn.q_norm.weight",         "identity"),
    ("decoder.layers.{i}.self_attn.k_norm.gamma",       _L + "self_attn.k_norm.weight",         "identity"),
]
MLP = [
    ("decoder.layers.{i}.ffn.gate.kernel",              _L + "mlp.gate_proj.weight",            "transpose"),
    ("decoder.layers.{i}.ffn.gate.bias",                _L + "mlp.gate_proj.bias",              "identity"),
    ("decoder.layers.{i}.ffn.linear1.kernel",           _L + "mlp.up_proj.weight",              "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",             _L + "mlp.up_proj.bias",                "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",           _L + "mlp.down_proj.weight",            "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",             _L + "mlp.down_proj.bias",              "identity"),
]
NORMS_AND_EMBEDDING = [
    ("tgt_embed.embedding",                             "embed_tokens.weight",                  "identity"),
    ("decoder.layers.{i}.norm1.gamma",                  _L + "input_layernorm.weight",          "identity"),
    ("decoder.layers.{i}.norm3.gamma",                  _L + "post_attention_layernorm.weight", "identity"),
    ("decoder.final_norm.gamma",                        "norm.weight",                          "identity"),
    ("-",                                               "rotary_emb.inv_freq",                  "rope_inv_freq"),  # old
    ("-",                                               _L + "self_attn.rotary_emb.inv_freq",   "rope_inv_freq"),  # files
]
# The biases of the same norms, where a family's are LayerNorms (Starcoder2, StableLM)
NORM_BIASES = [
    ("decoder.layers.{i}.norm1.beta",                   _L + "input_layernorm.bias",            "identity"),
    ("decoder.layers.{i}.norm3.beta",                   _L + "post_attention_layernorm.bias",   "identity"),
    ("decoder.final_norm.beta",                         "norm.bias",                            "identity"),
]
HEAD = [
    ("output.kernel",                                   "lm_head.weight",                       "transpose"),
    ("tgt_embed.embedding",                             "lm_head.weight",                       "tied"),
]

# transformers' rope types and the parameters each reads (besides rope_type and rope_theta); the reference implements
# these (reference_numpy.config), and refuses any other.
ROPE_PARAMETERS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"),
    "longrope": ("short_factor", "long_factor", "factor", "original_max_position_embeddings", "attention_factor"),
}

# The rope types for which transformers 5 (`standardize_rope_params`) takes a top-level config.json
# `original_max_position_embeddings` over the rope parameters' own (Phi3Config always has one, 4096 by default).
TOP_LEVEL_ORIGINAL = ("llama3", "yarn", "longrope")


@dataclass(frozen=True)
class FamilySpec:
    """What one Llama-style family's config.json says beyond Llama's: its defaults and its own fields."""

    model_type: str
    architectures: tuple[str, str]
    activation_default: str = "silu"
    tie_default: bool = False
    attention_bias: str | None = "attention_bias"  # the config key for q/k/v/o biases (None: the family has none)
    qkv_bias: bool = False  # biases on q, k and v only, always (Qwen2)
    mlp_bias: str | None = "mlp_bias"
    qk_norm: bool = False  # Qwen3
    sliding: bool = False  # reads sliding_window (Mistral, Qwen2, Phi-3)
    window_switch: bool = False  # the window applies only with use_sliding_window, from layer max_window_layers on
    norm_weight_offset: float = 0.0  # Gemma: x * (1 + w)
    scale_embedding: bool = False  # Gemma: embeddings times sqrt(hidden_size)
    partial_rotary: bool = False  # rotates part of each head (Phi-3's partial_rotary_factor); others rotate it all
    supported: Mapping[str, Any] = field(default_factory=dict)  # other fields, and the only value each may take


LLAMA = FamilySpec("llama", ARCHITECTURES, supported={"pretraining_tp": 1})


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose LlamaModel sits under `prefix`."""
    return build_table(config, prefix, ATTENTION)


def build_table(config: rn.TransformerConfig, prefix: str, attention: list, mlp: list = MLP
                ) -> list[tuple[str, str, str]]:
    backbone = NORMS_AND_EMBEDDING + attention + mlp + (QK_NORM if config.qk_norm else [])
    return [(c, prefix + e, t) for c, e, t in backbone] + HEAD


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Llama's `config.json` (and the saved key names)."""
    return read_config(hf, keys, LLAMA, BASE_PREFIX)


def read_config(hf: Mapping[str, Any], keys: Collection[str], spec: FamilySpec, base_prefix: str
                ) -> tuple[rn.TransformerConfig, str, list[str]]:
    has_head = any(k.startswith(base_prefix) or k == "lm_head.weight" for k in keys)
    arch = architecture(hf, spec.model_type, spec.architectures, has_head)
    refuse(hf, {"is_encoder_decoder": False, "use_bidirectional_attention": False, **spec.supported})
    notes: list[str] = []
    vocab, d, heads = integer(hf, "vocab_size"), integer(hf, "hidden_size"), integer(hf, "num_attention_heads")
    head_dim = optional_integer(hf, "head_dim") or (d // heads if heads and d % heads == 0 else None)
    if head_dim is None:
        raise ValueError(f"config.json has no head_dim and hidden_size={d} is not divisible by num_attention_heads="
                         f"{heads}")
    notes += pad_note(hf, spec.model_type)
    lm = arch == spec.architectures[0]
    attention_bias = boolean(hf, spec.attention_bias, False) if spec.attention_bias else False
    theta, scaling, fraction = rope(hf)
    if fraction != 1.0 and not spec.partial_rotary:
        raise ValueError(f"config.json partial_rotary_factor={fraction!r} is not supported for {spec.model_type} "
                         "(it rotates every dim of a head)")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads,
        num_kv_heads=_kv_heads(hf, heads), head_size=None if head_dim * heads == d else head_dim,
        num_encoder_layers=0, num_decoder_layers=integer(hf, "num_hidden_layers"),
        d_ff=integer(hf, "intermediate_size"), max_len=integer(hf, "max_position_embeddings"),
        dropout=number(hf, "attention_dropout", 0.0), activation=_activation(hf, spec.activation_default),
        norm_first=True, final_norm=True, norm="rms", norm_weight_offset=spec.norm_weight_offset,
        layer_norm_eps=number(hf, "rms_norm_eps", 1e-6), positional="rope", rope_theta=theta, rope_scaling=scaling,
        rotary_fraction=fraction, scale_embedding=spec.scale_embedding, bias=False,
        attention_bias=attention_bias or None, qkv_bias=True if spec.qkv_bias else None,  # None: as `bias`, off
        ffn_bias=(boolean(hf, spec.mlp_bias, False) or None) if spec.mlp_bias else None, ffn_gated=True,
        qk_norm=spec.qk_norm, sliding_window=_sliding_window(hf, spec),
        tie_embeddings=boolean(hf, "tie_word_embeddings", spec.tie_default) if lm else False, pad_id=None,
        output_bias=False, output_projection=lm)
    return config, arch, notes


def pad_note(hf: Mapping[str, Any], model_type: str) -> list[str]:
    """A note that config.json's pad_token_id is not used (these models take padding as attention_mask, never from
    the ids), or none."""
    if hf.get("pad_token_id") is None:
        return []
    return [f"config.json pad_token_id={hf['pad_token_id']!r} is not used: {model_type} derives no padding mask from "
            "ids, so pad_id=None (every id is a real token; --set pad_id=N to mask id N)"]


def _kv_heads(hf: Mapping[str, Any], heads: int) -> int | None:
    kv = optional_integer(hf, "num_key_value_heads")
    return None if kv is None or kv == heads else kv


def _activation(hf: Mapping[str, Any], default: str) -> str:
    """`hidden_act` (Gemma's older configs say `hidden_activation`; the two must agree where both are given)."""
    ours = activation(hf, "hidden_act", default)
    if hf.get("hidden_activation") is not None and activation(hf, "hidden_activation", default) != ours:
        raise ValueError(f"config.json hidden_act={hf.get('hidden_act')!r} and hidden_activation="
                         f"{hf['hidden_activation']!r} disagree")
    return ours


def rope(hf: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None, float]:
    """`(rope_theta, rope_scaling, rotary_fraction)` from `rope_parameters` (transformers 5) or the older
    `rope_theta` / `rope_scaling` / `partial_rotary_factor`; an unknown rope type or parameter is refused."""
    params = dict(hf.get("rope_parameters") or {})
    if not isinstance(hf.get("rope_parameters") or {}, Mapping):
        raise ValueError(f"config.json rope_parameters must be an object, received {hf['rope_parameters']!r}")
    old = hf.get("rope_scaling")
    if old is not None and not isinstance(old, Mapping):
        raise ValueError(f"config.json rope_scaling must be an object or null, received {old!r}")
    for key, value in (old or {}).items():
        params.setdefault(key, value)
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in hf and key not in params:
            params[key] = hf[key]
    theta = number(params, "rope_theta", 10000.0, where="config.json rope_parameters")
    fraction = number(params, "partial_rotary_factor", 1.0, where="config.json rope_parameters")
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    for key in ("rope_theta", "partial_rotary_factor"):
        params.pop(key, None)
    if kind not in ROPE_PARAMETERS:
        raise ValueError(f"config.json rope type {kind!r} is not supported; supported: {', '.join(ROPE_PARAMETERS)}")
    unknown = sorted(set(params) - set(ROPE_PARAMETERS[kind]))
    if unknown:
        raise ValueError(f"config.json rope parameter(s) {unknown} are not supported for rope type {kind!r} "
                         f"(supported: {', '.join(ROPE_PARAMETERS[kind]) or 'none'})")
    if kind == "default":
        return theta, None, fraction
    top = hf.get("original_max_position_embeddings")
    if kind in TOP_LEVEL_ORIGINAL and top is not None and params.get("original_max_position_embeddings", top) != top:
        raise ValueError(f"config.json original_max_position_embeddings={top!r} and the rope parameters' "
                         f"{params['original_max_position_embeddings']!r} disagree (transformers 5 takes the first; "
                         "which one the model was made with is not known)")
    if kind in ("dynamic", *TOP_LEVEL_ORIGINAL) and "original_max_position_embeddings" not in params \
            and top is not None:
        params["original_max_position_embeddings"] = top
    return theta, {"rope_type": kind, **params}, fraction


def _sliding_window(hf: Mapping[str, Any], spec: FamilySpec) -> int | None:
    """The attention window: Mistral and Phi-3 apply `sliding_window` to every layer; Qwen2 only with
    `use_sliding_window`, from layer `max_window_layers` on. A window on some layers but not others (`layer_types`)
    is refused: the reference has one window for every layer."""
    if not spec.sliding:
        refuse(hf, {"use_sliding_window": False})
        return None
    window = optional_integer(hf, "sliding_window")
    if "use_sliding_window" in hf and not boolean(hf, "use_sliding_window", False):
        window = None
    types = hf.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not set(types) <= {"full_attention", "sliding_attention"}:
            raise ValueError(f"config.json layer_types={types!r} is not supported (full_attention or "
                             "sliding_attention per layer)")
        if len(set(types)) > 1:
            raise ValueError("config.json layer_types mixes full_attention and sliding_attention layers; one window "
                             "for every layer is supported")
        if types and types[0] == "full_attention":
            window = None
    elif window is not None and "max_window_layers" in hf and "use_sliding_window" in hf \
            and integer(hf, "max_window_layers") > 0:
        raise ValueError(f"config.json use_sliding_window with max_window_layers={hf['max_window_layers']} windows "
                         "only some layers; one window for every layer is supported")
    return window


def problems_for(config: rn.TransformerConfig, spec: FamilySpec) -> list[str]:
    """Why `config` has no equivalent in the family `spec` describes (empty if it has one)."""
    name = spec.model_type
    wanted = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "norm": "rms",
              "norm_weight_offset": spec.norm_weight_offset, "positional": "rope", "ffn_gated": True,
              "scale_embedding": spec.scale_embedding, "embed_norm": False, "head_transform": False,
              "type_vocab_size": 0, "pooler": False, "qk_norm": spec.qk_norm}
    problems = [f"{k}={getattr(config, k)!r} ({name} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.output_projection and config.has_output_bias:
        problems.append(f"output_bias=True ({name}'s lm_head has no bias)")
    if config.sliding_window is not None and not spec.sliding:
        problems.append(f"sliding_window={config.sliding_window} ({name} attends to every earlier position)")
    if config.has_o_bias and not spec.attention_bias:
        problems.append(f"a bias on the attention output ({name} has none)")
    if config.has_qkv_bias != (spec.qkv_bias or (spec.attention_bias is not None and config.has_o_bias)):
        problems.append(f"q/k/v biases {'on' if config.has_qkv_bias else 'off'} ({name} has them "
                        f"{'always' if spec.qkv_bias else 'with the output bias'})")
    if config.has_ffn_bias and not spec.mlp_bias:
        problems.append(f"feed-forward biases ({name} has none)")
    if config.rotary_fraction != 1.0 and not spec.partial_rotary:
        problems.append(f"rotary_fraction={config.rotary_fraction} ({name} rotates every dim of a head)")
    return problems


def export_problems(config: rn.TransformerConfig) -> list[str]:
    return problems_for(config, LLAMA)


def write_config(config: rn.TransformerConfig, spec: FamilySpec) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `problems_for(config, spec)` accepts."""
    arch = spec.architectures[0 if config.output_projection else 1]
    rope_parameters = {"rope_type": "default", "rope_theta": config.rope_theta, **(config.rope_scaling or {})}
    if config.rotary_fraction != 1.0:
        rope_parameters["partial_rotary_factor"] = config.rotary_fraction
    hf: dict[str, Any] = {
        "model_type": spec.model_type, "architectures": [arch], "vocab_size": config.tgt_vocab_size,
        "hidden_size": config.d_model, "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads or config.num_heads, "head_dim": config.head_dim,
        "num_hidden_layers": config.num_decoder_layers, "intermediate_size": config.d_ff,
        "max_position_embeddings": config.max_len, "hidden_act": _hf_activation(config.activation),
        "rms_norm_eps": config.layer_norm_eps, "rope_parameters": rope_parameters,
        "attention_dropout": config.dropout,
        "tie_word_embeddings": config.tie_embeddings if config.output_projection else spec.tie_default,
        "pad_token_id": config.pad_id, "bos_token_id": None, "eos_token_id": None}
    if (config.rope_scaling or {}).get("rope_type") in TOP_LEVEL_ORIGINAL:  # the one transformers 5 reads
        hf["original_max_position_embeddings"] = config.rope_scaling["original_max_position_embeddings"]
    if spec.attention_bias:
        hf[spec.attention_bias] = config.has_o_bias
    if spec.mlp_bias:
        hf[spec.mlp_bias] = config.has_ffn_bias
    if spec.sliding:
        hf["sliding_window"] = config.sliding_window
        if spec.window_switch:  # on for every layer, or off
            hf.update(use_sliding_window=config.sliding_window is not None, max_window_layers=0)
    return hf, arch


def _hf_activation(name: str) -> str:
    return "gelu_pytorch_tanh" if name == "gelu_tanh" else TO_HF_ACTIVATION[name]


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    return write_config(config, LLAMA)


def prefix_for(arch: str, keys: Collection[str] | None, spec: FamilySpec, base_prefix: str) -> str:
    """Where the base model sits: under `model.` in the causal-LM class, at the top in the bare model; when
    reading, wherever the saved keys put it."""
    return prefix_rule(base_prefix, lm=spec.architectures[0])(arch, keys)


def prefix(arch: str, keys: Collection[str] | None = None) -> str:
    return prefix_for(arch, keys, LLAMA, BASE_PREFIX)


def functions(spec: FamilySpec, attention: list = ATTENTION, mlp: list = MLP) -> dict[str, Callable]:
    """A Llama-style family's config and table hooks, by their `HFFamily` field names (`table`, `config_from_hf`,
    `export_problems`, `config_to_hf`, `prefix`): this module's, with `spec`'s fields and `attention` / `mlp`
    entries."""
    return {"table": lambda config, prefix: build_table(config, prefix, attention, mlp),
            "config_from_hf": lambda hf, keys: read_config(hf, keys, spec, BASE_PREFIX),
            "export_problems": lambda config: problems_for(config, spec),
            "config_to_hf": lambda config: write_config(config, spec),
            "prefix": lambda arch, keys=None: prefix_for(arch, keys, spec, BASE_PREFIX)}


TASK_HEADS = decoder_heads("Llama", qa_prefix="transformer.")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=(), float64_fix=None)
