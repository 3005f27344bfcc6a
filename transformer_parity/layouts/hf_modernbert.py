"""Hugging Face ModernBERT (`ModernBertForMaskedLM`, `ModernBertModel`): a pre-norm encoder with rotary positions and
no position table.

The token embedding, then `embeddings.norm` (canonical `embed_norm`); each layer `x + attn(attn_norm(x))`, `x +
mlp(mlp_norm(x))`, except that the first layer's `attn_norm` is the identity (`first_attn_norm=False`); a
`final_norm`. Every LayerNorm has a weight and a bias only where `norm_bias` says (its default: none). Attention
reads q, k and v from one fused `Wqkv` (`(3 * hidden, hidden)`, q first), biases where `attention_bias` says; the MLP
is gated: `Wi` gives the activation's input and the gate in one matrix, chunked in that order (canonical `gate` and
`linear1`), `Wo` maps back, biases where `mlp_bias` says. Layers alternate: every `global_attn_every_n_layers`-th
(or as `layer_types` says) attends every key at the full rotary base, the others (`sliding_attention`) the keys
within `local_attention // 2` positions both ways at their own base (canonical `layer_kinds`, a window of
`local_attention // 2 + 1`, `local_rope_theta`). The masked-LM head is `head` (dense with a bias where
`classifier_bias` says, `classifier_activation`, norm) and `decoder`, tied to the token embedding where
`tie_word_embeddings` says, with a bias where `decoder_bias` says.

transformers' unpadded (flash-attention) path is not taken on CPU: the padded model with its attention mask is the
source; every padded position is masked as a key and computed as a query, as here. Its rotary tables and rotation are
float32 even in a float64 model: verify's float64 run takes them in float64 (`exact_rotary_and_rotation`).

The task classes put the head transform (`head`) before their `classifier` (canonical `head_transform` beside
`classifier`): token and span scores at every position; sequence scores at position 0 (`classifier_pooling="cls"`,
the head being position-wise, taking it before or after the pooling is the same). A masked mean
(`classifier_pooling="mean"`) is refused, as is the multiple-choice class (it reads each row's first real position,
`attention_mask.argmax`), and a head activation other than the encoder's GELU (the bare model it is read as holds
none).
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_cohere, hf_gemma3_text
from .family import Float64Fix, HFFamily
from .hf_tasks import Head, linear
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, prefix_rule, refuse,
                 token_id)

NAME = "hf-modernbert"
MODEL_TYPE = "modernbert"
ARCHITECTURES = ("ModernBertForMaskedLM", "ModernBertModel")
BASE_PREFIX = "model."  # where ModernBertForMaskedLM keeps its ModernBertModel
THETA = {"full_attention": 160000.0, "sliding_attention": 10000.0}  # ModernBertConfig's defaults
OLD_THETA_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}  # transformers 4
KINDS = {"full_attention": "full", "sliding_attention": "sliding"}
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_size",
               "num_heads": "num_attention_heads", "num_encoder_layers": "num_hidden_layers",
               "d_ff": "intermediate_size", "max_len": "max_position_embeddings", "layer_norm_eps": "norm_eps",
               "activation": "hidden_activation", "head_activation": "classifier_activation",
               "layer_kinds": "layer_types", "sliding_window": "local_attention",
               "rope_theta": "rope_parameters.full_attention.rope_theta",
               "local_rope_theta": "rope_parameters.sliding_attention.rope_theta"}

_L = "layers.{i}."
BACKBONE = [
    # canonical                                   ModernBertModel                        transform
    ("src_embed.embedding",                       "embeddings.tok_embeddings.weight",    "identity"),
    ("src_embed_norm.gamma",                      "embeddings.norm.weight",              "identity"),
    ("src_embed_norm.beta",                       "embeddings.norm.bias",                "identity"),
    ("encoder.layers.{i}.norm1.gamma",            _L + "attn_norm.weight",               "identity"),  # not layer 0
    ("encoder.layers.{i}.norm1.beta",             _L + "attn_norm.bias",                 "identity"),
    ("encoder.layers.{i}.self_attn.{qkv}.kernel", _L + "attn.Wqkv.weight",               "fused_qkv_t"),
    ("encoder.layers.{i}.self_attn.{qkv}.bias",   _L + "attn.Wqkv.bias",                 "fused_qkv"),
    ("encoder.layers.{i}.self_attn.o.kernel",     _L + "attn.Wo.weight",                 "transpose"),
    ("encoder.layers.{i}.self_attn.o.bias",       _L + "attn.Wo.bias",                   "identity"),
    ("encoder.layers.{i}.norm2.gamma",            _L + "mlp_norm.weight",                "identity"),
    ("encoder.layers.{i}.norm2.beta",             _L + "mlp_norm.bias",                  "identity"),
    ("encoder.layers.{i}.ffn.{gate_up}.kernel",   _L + "mlp.Wi.weight",                  "fused_qkv_t"),
    ("encoder.layers.{i}.ffn.{gate_up}.bias",     _L + "mlp.Wi.bias",                    "fused_qkv"),
    ("encoder.layers.{i}.ffn.linear2.kernel",     _L + "mlp.Wo.weight",                  "transpose"),
    ("encoder.layers.{i}.ffn.linear2.bias",       _L + "mlp.Wo.bias",                    "identity"),
    ("encoder.final_norm.gamma",                  "final_norm.weight",                   "identity"),
    ("encoder.final_norm.beta",                   "final_norm.bias",                     "identity"),
]
HEAD = [
    ("head.dense.kernel",                         "head.dense.weight",                   "transpose"),
    ("head.dense.bias",                           "head.dense.bias",                     "identity"),
    ("head.norm.gamma",                           "head.norm.weight",                    "identity"),
    ("head.norm.beta",                            "head.norm.bias",                      "identity"),
    ("output.kernel",                             "decoder.weight",                      "transpose"),
    ("src_embed.embedding",                       "decoder.weight",                      "tied"),
    ("output.bias",                               "decoder.bias",                        "identity"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose ModernBertModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def layer_kinds(hf: Mapping[str, Any], depth: int) -> tuple[str, ...]:
    """Each layer's kind from `layer_types`, or (transformers 4's config.json) from `global_attn_every_n_layers`:
    layer i is full where i is a multiple of it."""
    types = hf.get("layer_types")
    if types is None:
        every = integer(hf, "global_attn_every_n_layers", 3)
        if every < 1:
            raise ValueError(f"config.json global_attn_every_n_layers={every} is not supported (only a positive "
                             "integer)")
        return tuple("sliding" if i % every else "full" for i in range(depth))
    if not isinstance(types, list) or len(types) != depth or not set(types) <= set(KINDS):
        raise ValueError(f"config.json layer_types={types!r} is not supported (full_attention or sliding_attention "
                         f"for each of the {depth} layers)")
    return tuple(KINDS[t] for t in types)


def rope_theta(hf: Mapping[str, Any], layer_type: str) -> float:
    """The rotary base of one layer type: `rope_parameters[layer_type]` (the default rope only), or transformers 4's
    `global_rope_theta` / `local_rope_theta`."""
    refuse(hf, {"partial_rotary_factor": 1.0, "rope_scaling": None})
    params = (hf.get("rope_parameters") or {}).get(layer_type)
    if params is None:
        return number(hf, OLD_THETA_KEYS[layer_type], THETA[layer_type])
    if not isinstance(params, Mapping):
        raise ValueError(f"config.json rope_parameters.{layer_type} must be an object, received {params!r}")
    unknown = sorted(set(params) - {"rope_type", "rope_theta"})
    if params.get("rope_type", "default") != "default" or unknown:
        raise ValueError(f"config.json rope_parameters.{layer_type}={dict(params)!r} is not supported (the default "
                         "rope: rope_type 'default' and rope_theta only)")
    return number(params, "rope_theta", THETA[layer_type], where=f"config.json rope_parameters.{layer_type}")


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from ModernBERT's `config.json`."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, any(k.startswith((BASE_PREFIX, "head.", "decoder."))
                                                           for k in keys))
    refuse(hf, {"head_dim": None})
    mlm = arch == ARCHITECTURES[0]
    vocab, depth = integer(hf, "vocab_size"), integer(hf, "num_hidden_layers")
    kinds = layer_kinds(hf, depth)
    full, sliding = rope_theta(hf, "full_attention"), rope_theta(hf, "sliding_attention")
    window = integer(hf, "local_attention", 128) // 2 + 1 if "sliding" in kinds else None
    both = "sliding" in kinds and "full" in kinds
    hidden = activation(hf, "hidden_activation", "gelu")
    head = activation(hf, "classifier_activation", "gelu")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(hf, "hidden_size"),
        num_heads=integer(hf, "num_attention_heads"), num_encoder_layers=depth, num_decoder_layers=0,
        d_ff=integer(hf, "intermediate_size"), max_len=integer(hf, "max_position_embeddings", 8192),
        dropout=number(hf, "attention_dropout", 0.0), activation=hidden, norm_first=True, final_norm=True,
        layer_norm_eps=number(hf, "norm_eps", 1e-5), norm_bias=boolean(hf, "norm_bias", False), positional="rope",
        rope_theta=full if "full" in kinds else sliding, local_rope_theta=sliding if both else None,
        sliding_window=window, layer_kinds=kinds if both else None, first_attn_norm=False, scale_embedding=False,
        embed_norm=True, ffn_gated=True, bias=boolean(hf, "classifier_bias", False),  # the head's dense
        attention_bias=boolean(hf, "attention_bias", False), ffn_bias=boolean(hf, "mlp_bias", False),
        tie_embeddings=mlm and boolean(hf, "tie_word_embeddings", True),
        output_bias=mlm and boolean(hf, "decoder_bias", True), output_projection=mlm, head_transform=mlm,
        head_activation=head if mlm and head != hidden else None,
        pad_id=token_id(hf, "pad_token_id", vocab, default=None))
    return config, arch, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no ModernBERT equivalent (empty if it has one)."""
    wanted = {"num_decoder_layers": 0, "norm_first": True, "final_norm": True, "norm": "layer",
              "norm_affine": True, "positional": "rope", "rope_scaling": None, "rotary_fraction": 1.0,
              "scale_embedding": False, "embed_norm": True, "type_vocab_size": 0, "pooler": False,
              "ffn_gated": True, "first_attn_norm": False, "num_kv_heads": None, "head_size": None, "qk_norm": False,
              "head_layer_norm_eps": None, "head_order": "dense-activation-norm", "embedding_size": None,
              "causal_encoder": False}
    problems = [f"{k}={getattr(config, k)!r} ({MODEL_TYPE} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.has_qkv_bias != config.has_o_bias:
        problems.append(f"q/k/v biases {'on' if config.has_qkv_bias else 'off'} beside the attention output's "
                        f"{'on' if config.has_o_bias else 'off'} ({MODEL_TYPE}'s attention_bias sets both)")
    if config.output_projection and not config.head_transform:
        problems.append(f"an output projection without head_transform (not {MODEL_TYPE}'s masked-LM model)")
    if config.output_projection and config.tgt_vocab_size != config.src_vocab_size:
        problems.append(f"tgt_vocab_size={config.tgt_vocab_size} != src_vocab_size={config.src_vocab_size}")
    if config.sliding_window is not None and config.sliding_window < 1:
        problems.append(f"sliding_window={config.sliding_window}")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    kinds = [config.encoder_layer_kind(i) for i in range(config.num_encoder_layers)]
    types = {kind: layer_type for layer_type, kind in KINDS.items()}
    local = config.local_rope_theta if config.local_rope_theta is not None else config.rope_theta
    head = config.head_activation or config.activation
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.src_vocab_size,
          "hidden_size": config.d_model, "num_attention_heads": config.num_heads,
          "num_hidden_layers": config.num_encoder_layers, "intermediate_size": config.d_ff,
          "max_position_embeddings": config.max_len, "hidden_activation": TO_HF_ACTIVATION[config.activation],
          "norm_eps": config.layer_norm_eps, "norm_bias": config.norm_bias, "attention_bias": config.has_o_bias,
          "attention_dropout": config.dropout, "mlp_bias": config.has_ffn_bias,
          "layer_types": [types[kind] for kind in kinds],
          "local_attention": 2 * (config.sliding_window - 1) if config.sliding_window is not None else 128,
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
                              "sliding_attention": {"rope_type": "default", "rope_theta": local}},
          "classifier_bias": config.bias,
          "classifier_activation": TO_HF_ACTIVATION[head], "decoder_bias": config.has_output_bias,
          "tie_word_embeddings": config.tie_embeddings if config.output_projection else True,
          "pad_token_id": config.pad_id, "bos_token_id": None, "eos_token_id": None, "cls_token_id": None,
          "sep_token_id": None}
    return hf, arch


def exact_rotary_and_rotation(model64, config: rn.TransformerConfig) -> None:
    """In a float64 ModernBERT model: each layer type's rotary tables in float64 (Gemma 3's replacement, the sliding
    layers' at `local_rope_theta`), and each attention's rotation in its own dtype (Cohere's swap of
    `apply_rotary_pos_emb`, which takes q and k to float32 first)."""
    hf_gemma3_text.exact_rotary_by_layer_type(model64, config)
    hf_cohere.rotation_in_model_dtype(model64, "ModernBertAttention")


# `hf_tasks`: the bare model's config.json keys a task class computes its head with, and the values it is read with
_TASK_KEYS = {"classifier_pooling": ("cls", "cls"), "classifier_activation": ("gelu", "gelu"),
              "hidden_activation": ("gelu", "gelu")}
_BASE = ARCHITECTURES[1]
TASK_HEADS = (
    Head("ModernBertForSequenceClassification", _BASE, {"classifier": "sequence", "classifier_input": "first",
                                                          "head_transform": True},
         linear("classifier", "classifier"), {"head_transform": False}, hf_keys=_TASK_KEYS),
    Head("ModernBertForTokenClassification", _BASE, {"classifier": "token", "head_transform": True},
         linear("classifier", "classifier"), {"head_transform": False}, hf_keys=_TASK_KEYS),
    Head("ModernBertForQuestionAnswering", _BASE, {"classifier": "span", "head_transform": True},
         linear("classifier", "classifier"), {"head_transform": False}, hf_keys=_TASK_KEYS))


# Where the ModernBertModel sits: under `model.` in the masked-LM class, at the top in the bare model; when reading,
# wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm=ARCHITECTURES[0])


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks={"encoder.layers.{i}.self_attn": "layers.{i}.attn", "encoder.layers.{i}.ffn": "layers.{i}.mlp",
           "encoder.layers.{i}": "layers.{i}", "encoder.final_norm": "final_norm"},
    head_hook="head", task_heads=TASK_HEADS,
    expresses=("norm_bias", "first_attn_norm", "layer_kinds", "local_rope_theta"),  # `layouts.FAMILY_ONLY` settings
    approximations=(),
    float64_fix=Float64Fix("ModernBERT's rotary tables and rotation, which transformers computes in float32, "
                           "computed in float64", exact_rotary_and_rotation))
