"""KerasHub Llama (`keras_hub.models.LlamaBackbone`, `LlamaCausalLM`; `Llama3Backbone`, `Llama3CausalLM`, the same
model): decoder-only, pre-norm, RMSNorm, rotary positions, grouped-query attention, a SwiGLU feed-forward.

The math, read from keras-hub 0.32 (`keras_hub/src/models/llama/`): `LlamaLayerNorm` is an RMSNorm computed in
float32; `LlamaRotaryEmbedding` rotates the two halves of each head, frequencies `1 / max_wavelength^(2i/d)`, with the
four llama3 arguments smoothed as transformers' llama3 rope. Its `_get_inverse_freq` replaces the base class's and never
applies `rope_position_scaling_factor`: keras_hub computes unscaled positions whatever that key says, so a preset
that sets it is refused and transformers' linear rope has no KerasHub Llama equivalent. Scores times 1/sqrt(head_dim);
`silu(gate(x)) * intermediate(x)`; no biases anywhere. `LlamaCausalLM`'s logits are the reverse embedding (untied) or
the embedding (tied). The model takes any length: it has no position table, so the canonical `max_len` (a bound on
inputs that no weight or frequency here depends on) is `MAX_LEN`. The table is the layout file `kerashub_llama.toml`
beside this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily

NAME = "kerashub-llama"
BACKBONE = "LlamaBackbone"
TASKS = ("LlamaCausalLM", "Llama3CausalLM")
BACKBONES = ("LlamaBackbone", "Llama3Backbone")  # the classes read as this family
LAYOUT = Path(__file__).with_name("kerashub_llama.toml")
SERIALIZED = {"LlamaBackbone": ("keras_hub.src.models.llama.llama_backbone", "llama_backbone"),
              "LlamaCausalLM": ("keras_hub.src.models.llama.llama_causal_lm", "llama_causal_lm"),
              "Llama3Backbone": ("keras_hub.src.models.llama3.llama3_backbone", "llama3_backbone"),
              "Llama3CausalLM": ("keras_hub.src.models.llama3.llama3_causal_lm", "llama3_causal_lm")}
MAX_LEN = 131072
FIXED = {"num_encoder_layers": 0, "norm": "rms", "norm_first": True, "final_norm": True, "positional": "rope",
         "ffn_gated": True, "activation": "silu", "scale_embedding": False, "bias": False, "embed_norm": False,
         "head_transform": False, "type_vocab_size": 0, "pooler": False, "output_bias": False, "pad_id": None,
         "qk_norm": False, "sliding_window": None, "norm_weight_offset": 0.0, "head_size": None,
         "rotary_fraction": 1.0}  # no pad id: padding arrives as the backbone's padding_mask input
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_query_heads", "num_kv_heads": "num_key_value_heads",
               "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim", "layer_norm_eps": "layer_norm_epsilon",
               "rope_theta": "rope_max_wavelength"}  # canonical field -> config.json key, for messages
CAUSAL_LM = {"output_projection": True}
TASK_FIELDS = {"LlamaCausalLM": CAUSAL_LM, "Llama3CausalLM": CAUSAL_LM}
_LLAMA3 = ("rope_frequency_adjustment_factor", "rope_low_freq_factor", "rope_high_freq_factor",
           "rope_pretraining_sequence_length")


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    untied = config.output_projection and not config.tie_embeddings  # the reverse embedding: (hidden, vocabulary)
    return user.load(LAYOUT).table + ([("output.kernel", "layers/reversible_embedding/vars/1", "identity")]
                                      if untied else [])


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `LlamaBackbone.get_config()` (config.json) and the task class (task.json), if any."""
    from .hf import boolean, integer, number

    vocab, heads = integer(backbone, "vocabulary_size"), integer(backbone, "num_query_heads")
    kv = integer(backbone, "num_key_value_heads", heads)
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"), num_heads=heads,
        num_kv_heads=None if kv == heads else kv, num_decoder_layers=integer(backbone, "num_layers"),
        d_ff=integer(backbone, "intermediate_dim"), max_len=MAX_LEN, dropout=number(backbone, "dropout", 0.0),
        layer_norm_eps=number(backbone, "layer_norm_epsilon", 1e-6),
        rope_theta=number(backbone, "rope_max_wavelength", 10000.0), rope_scaling=_rope_scaling(backbone),
        tie_embeddings=boolean(backbone, "tie_word_embeddings", False) and task is not None,
        output_projection=task is not None, **FIXED)
    return config, []


IGNORED_FACTOR = ("keras-hub 0.32's LlamaRotaryEmbedding never applies rope_position_scaling_factor: keras_hub "
                  "computes unscaled positions")


def _rope_scaling(backbone: dict[str, Any]) -> dict[str, Any] | None:
    """transformers' rope parameters for KerasHub's: the four llama3 arguments smooth the frequencies (llama3).
    A `rope_position_scaling_factor` other than 1 is refused: keras_hub does not apply it (`IGNORED_FACTOR`)."""
    from .hf import number

    factor = number(backbone, "rope_position_scaling_factor", 1.0)
    given = [key for key in _LLAMA3 if backbone.get(key) is not None]
    if given and len(given) != len(_LLAMA3):
        raise ValueError(f"config.json sets {given} but not all of {list(_LLAMA3)} (KerasHub needs all four)")
    if factor != 1.0:
        raise ValueError(f"config.json rope_position_scaling_factor={factor} is not supported ({IGNORED_FACTOR})")
    if given:
        return {"rope_type": "llama3", "factor": number(backbone, _LLAMA3[0], 1.0),
                "low_freq_factor": number(backbone, _LLAMA3[1], 1.0),
                "high_freq_factor": number(backbone, _LLAMA3[2], 1.0),
                "original_max_position_embeddings": int(number(backbone, _LLAMA3[3], 1.0))}
    return None


BASE_KEYS = ("name", "trainable", "dtype")  # what every `Backbone.get_config()` holds


def unknown_keys(backbone: dict[str, Any], known, backbone_class: str) -> None:
    """Refuse, in one line, config.json keys the backbone's `get_config()` does not write (a newer keras-hub's
    setting would otherwise be read as absent)."""
    unknown = sorted(set(backbone) - set(known) - set(BASE_KEYS))
    if unknown:
        raise ValueError(f"config.json key(s) {', '.join(unknown)} are not supported (not in keras-hub 0.32's "
                         f"{backbone_class}: what they change is not known here)")


def settle_from_weights(config: rn.TransformerConfig, state) -> tuple[rn.TransformerConfig, list[str]]:
    """keras-hub 0.32's `LlamaBackbone.get_config()` leaves `tie_word_embeddings` out, so config.json cannot say
    whether the head is tied: the weights do. A `LlamaCausalLM` without a reverse embedding (vars/1) is tied."""
    reverse = "layers/reversible_embedding/vars/1" in state
    if config.output_projection and not config.tie_embeddings and not reverse:
        return config.replace(tie_embeddings=True), ["the head is tied to the token embedding: the preset holds no "
                                                     "reverse embedding (layers/reversible_embedding/vars/1)"]
    if not config.output_projection and reverse:  # a backbone saved alone keeps its untied head
        return config.replace(output_projection=True, tie_embeddings=False), [
            "the backbone's own reverse embedding (layers/reversible_embedding/vars/1, untied) read as the output "
            "head: its logits are `token_embedding(hidden, reverse=True)`"]
    return config, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub Llama (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub Llama has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id") and getattr(config, k) != v]
    if config.has_qkv_bias or config.has_o_bias or config.has_ffn_bias:
        problems.append("biases on the attention or feed-forward (KerasHub Llama has none)")
    kind = (config.rope_scaling or {}).get("rope_type")
    if kind == "linear":
        problems.append(f"rope_scaling rope_type='linear' ({IGNORED_FACTOR})")
    elif kind not in (None, "llama3"):
        problems.append(f"rope_scaling rope_type={kind!r} (KerasHub Llama has llama3 only)")
    if config.has_output_bias:
        problems.append("output_bias=True (LlamaCausalLM's logits have no bias)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(LlamaBackbone config, task class or None)` for a config `export_problems` accepts."""
    rope = config.rope_scaling or {}
    backbone = {"vocabulary_size": config.tgt_vocab_size, "num_layers": config.num_decoder_layers,
                "num_query_heads": config.num_heads, "hidden_dim": config.d_model, "intermediate_dim": config.d_ff,
                "num_key_value_heads": config.kv_heads, "rope_max_wavelength": config.rope_theta,
                "rope_position_scaling_factor": 1.0,
                "layer_norm_epsilon": config.layer_norm_eps, "dropout": config.dropout,
                "tie_word_embeddings": config.tie_embeddings}
    if rope.get("rope_type") == "llama3":
        backbone.update(zip(_LLAMA3, (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                                      rope["original_max_position_embeddings"])))
    return backbone, (TASKS[0] if config.output_projection else None)


# --- the Llama-like KerasHub families (Mistral, Qwen, Qwen3): their own layout file and config keys ------------------

@dataclass(frozen=True)
class FamilySpec:
    """What a Llama-like KerasHub family's config.json says beyond Llama's."""

    name: str  # kerashub-mistral
    backbone: str  # MistralBackbone
    task: str  # MistralCausalLM
    module: str  # keras_hub.src.models.mistral (its backbone and causal-LM modules are <module>_backbone, ...)
    layout: Path
    tie_default: bool = False
    can_tie: bool = True  # False: no tie_word_embeddings key, the head is always its own (Mistral)
    qkv_bias: bool = False  # Qwen
    qk_norm: bool = False  # Qwen3
    qk_norm_eps: float | None = None  # the q/k norms' own epsilon, whatever layer_norm_epsilon says (Qwen3: 1e-5)
    head_dim: bool = False  # reads head_dim (Mistral, Qwen3)
    window: str | None = None  # the config key of a window on every layer (Mistral: sliding_window)
    window_flag: str | None = None  # the switch that turns it on (Qwen: use_sliding_window_attention)


def functions(spec: FamilySpec) -> dict[str, Any]:
    """A Llama-like family's config and table hooks, by their `KerasHubFamily` field names (`table`,
    `config_from_kerashub`, `export_problems`, `config_to_kerashub`, `settle_from_weights`)."""
    fixed = {**FIXED, "qk_norm": spec.qk_norm}
    fixed.pop("head_size")
    fixed.pop("sliding_window")
    short = spec.backbone[:-len("Backbone")]

    def table(config):
        from . import user

        untied = config.output_projection and not config.tie_embeddings
        return user.load(spec.layout).table + ([("output.kernel", "layers/reversible_embedding/vars/1", "identity")]
                                               if untied else [])

    def config_from_kerashub(backbone, task):
        from .hf import boolean, integer, number, optional_integer

        vocab, heads = integer(backbone, "vocabulary_size"), integer(backbone, "num_query_heads")
        kv, d = integer(backbone, "num_key_value_heads", heads), integer(backbone, "hidden_dim")
        head_dim = optional_integer(backbone, "head_dim") if spec.head_dim else None
        window = optional_integer(backbone, spec.window) if spec.window else None
        if spec.window_flag and not boolean(backbone, spec.window_flag, False):
            window = None
        factor = number(backbone, "rope_scaling_factor", 1.0)
        config = rn.TransformerConfig(
            src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads,
            num_kv_heads=None if kv == heads else kv,
            head_size=None if head_dim is None or head_dim * heads == d else head_dim,
            num_decoder_layers=integer(backbone, "num_layers"), d_ff=integer(backbone, "intermediate_dim"),
            max_len=MAX_LEN, dropout=number(backbone, "dropout", 0.0),
            layer_norm_eps=number(backbone, "layer_norm_epsilon", 1e-6), qk_norm_eps=spec.qk_norm_eps,
            rope_theta=number(backbone, "rope_max_wavelength", 10000.0),
            rope_scaling=None if factor == 1.0 else {"rope_type": "linear", "factor": factor},
            qkv_bias=True if spec.qkv_bias else None, sliding_window=window,
            tie_embeddings=spec.can_tie and boolean(backbone, "tie_word_embeddings", spec.tie_default)
            and task is not None,
            output_projection=task is not None, **fixed)
        return config, []

    def export_problems(config):
        problems = [f"{k}={getattr(config, k)!r} (KerasHub {short} has {v!r})" for k, v in fixed.items()
                    if k not in ("output_bias", "pad_id") and getattr(config, k) != v]
        if config.has_qkv_bias != spec.qkv_bias or config.has_o_bias or config.has_ffn_bias:
            problems.append(f"biases other than {'on q, k and v' if spec.qkv_bias else 'none'} (KerasHub {short})")
        if (config.rope_scaling or {}).get("rope_type") not in (None, "linear"):
            problems.append(f"rope_scaling={config.rope_scaling!r} (KerasHub {short} scales linearly)")
        if config.head_size is not None and not spec.head_dim:
            problems.append(f"head_size={config.head_size} (KerasHub {short}: hidden_dim / heads)")
        if config.sliding_window is not None and not spec.window:
            problems.append(f"sliding_window={config.sliding_window} (KerasHub {short} has none)")
        if config.has_output_bias:
            problems.append(f"output_bias=True ({spec.task}'s logits have no bias)")
        if config.tie_embeddings and not spec.can_tie:
            problems.append(f"tie_embeddings=True ({spec.task}'s head is never tied)")
        qk_eps = config.qk_norm_eps or config.layer_norm_eps
        if spec.qk_norm_eps is not None and config.qk_norm and qk_eps != spec.qk_norm_eps:
            problems.append(f"q/k norms at epsilon {qk_eps:g} (KerasHub {short}'s attention normalizes q and k at "
                            f"{spec.qk_norm_eps:g}, whatever layer_norm_epsilon says)")
        return problems

    def config_to_kerashub(config):
        rope = config.rope_scaling or {}
        backbone = {"vocabulary_size": config.tgt_vocab_size, "num_layers": config.num_decoder_layers,
                    "num_query_heads": config.num_heads, "hidden_dim": config.d_model,
                    "intermediate_dim": config.d_ff, "num_key_value_heads": config.kv_heads,
                    "rope_max_wavelength": config.rope_theta, "rope_scaling_factor": rope.get("factor", 1.0),
                    "layer_norm_epsilon": config.layer_norm_eps, "dropout": config.dropout}
        if spec.can_tie:
            backbone["tie_word_embeddings"] = config.tie_embeddings
        if spec.head_dim:
            backbone["head_dim"] = config.head_dim
        if spec.window:
            backbone[spec.window] = config.sliding_window if config.sliding_window is not None else (
                None if not spec.window_flag and spec.window == "sliding_window" else MAX_LEN)
        if spec.window_flag:
            backbone[spec.window_flag] = config.sliding_window is not None
        return backbone, (spec.task if config.output_projection else None)

    return {"table": table, "config_from_kerashub": config_from_kerashub, "export_problems": export_problems,
            "config_to_kerashub": config_to_kerashub, "settle_from_weights": settle_from_weights}


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=BACKBONES, tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, table=table, settle_from_weights=settle_from_weights, to_canonical_state=None,
    from_canonical_state=None, classifier=None, predicts_mask_positions=(), expresses=(), approximations=())
