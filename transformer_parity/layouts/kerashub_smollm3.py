"""KerasHub SmolLM3 (`keras_hub.models.SmolLM3Backbone`, `SmolLM3CausalLM`): decoder-only, pre-norm, RMSNorm,
grouped-query attention with optional biases on q, k and v, a SwiGLU feed-forward (optional biases), rotary positions
on the layers `rope_layer_enabled_list` marks and none ("NoPE") on the others, the head tied to the embedding.

The math, read from keras-hub 0.32 (`keras_hub/src/models/smollm3/`): `keras.layers.RMSNormalization` times `scale`;
`SmolLM3RotaryEmbedding` rotates the two halves of each head at `1 / rope_theta^(2i/d)`, its frequencies a variable
of each layer (`rotary_embedding/vars/0`: checked against the config's on reading, written from it); scores times
1/sqrt(hidden_dim / heads); `SmolLM3CausalLM`'s logits are `token_embedding(x, reverse=True)`, tied. keras_hub keeps
`layer_types` but never masks by it: every layer attends to every earlier key, so a preset that names sliding layers
reads as all full, with a note (transformers' SmolLM3 slides there). Refused on reading (one line naming the key):
`partial_rotary_factor` other than 1 (keras_hub multiplies whole heads by rotary tables of the rotated width only,
which does not run), a `rope_layer_enabled_list` that is not one bool per layer, any key keras-hub 0.32 does not
write. The table is the layout file `kerashub_smollm3.toml` beside this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import reference_numpy as rn

from .family import KerasHubFamily
from .kerashub_llama import unknown_keys

NAME = "kerashub-smollm3"
BACKBONE = "SmolLM3Backbone"
TASKS = ("SmolLM3CausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_smollm3.toml")
SERIALIZED = {"SmolLM3Backbone": ("keras_hub.src.models.smollm3.smollm3_backbone", "smol_lm3_backbone"),
              "SmolLM3CausalLM": ("keras_hub.src.models.smollm3.smollm3_causal_lm", "smol_lm3_causal_lm")}
FIXED = {"num_encoder_layers": 0, "norm": "rms", "norm_weight_offset": 0.0, "norm_first": True, "final_norm": True,
         "positional": "rope", "rope_scaling": None, "rotary_fraction": 1.0, "ffn_gated": True, "activation": "silu",
         "scale_embedding": False, "embed_norm": False, "head_transform": False, "type_vocab_size": 0,
         "pooler": False, "output_bias": False, "pad_id": None, "qk_norm": False, "sliding_window": None,
         "head_size": None}  # pad: the padding_mask input
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
               "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim", "layer_norm_eps": "layer_norm_epsilon",
               "rope_theta": "rope_theta", "rope_layers": "rope_layer_enabled_list",
               "max_len": "max_position_embeddings"}
CAUSAL_LM = {"output_projection": True, "tie_embeddings": True}
TASK_FIELDS = {"SmolLM3CausalLM": CAUSAL_LM}
KEYS = ("vocabulary_size", "hidden_dim", "intermediate_dim", "num_layers", "num_attention_heads",
        "num_key_value_heads", "attention_bias", "attention_dropout", "rope_layer_enabled_list", "layer_types",
        "mlp_bias", "layer_norm_epsilon", "max_position_embeddings", "rope_theta",
        "partial_rotary_factor")  # SmolLM3Backbone.get_config()
FREQUENCIES = "layers/smol_lm3_decoder_layer_{i}/self_attn/rotary_embedding/vars/0"


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    """The layout file's entries, without the biases the config does not have; the head is the tied embedding."""
    from . import user

    left_out = (("self_attn.q.bias", "self_attn.k.bias", "self_attn.v.bias") if not config.has_qkv_bias else ()) + \
        ((".ffn.gate.bias", ".ffn.linear1.bias", ".ffn.linear2.bias") if not config.has_ffn_bias else ())
    return [entry for entry in user.load(LAYOUT).table if not entry[0].endswith(left_out)]


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `SmolLM3Backbone.get_config()` (config.json) and the task class (task.json), if any."""
    from .hf import boolean, integer, number

    unknown_keys(backbone, KEYS, BACKBONE)
    depth, heads = integer(backbone, "num_layers"), integer(backbone, "num_attention_heads")
    fraction = number(backbone, "partial_rotary_factor", 1.0)
    if fraction != 1.0:
        raise ValueError(f"config.json partial_rotary_factor={fraction!r} is not supported: keras-hub 0.32's SmolLM3 "
                         "multiplies whole heads by rotary tables of the rotated width only, which does not run")
    flags = backbone.get("rope_layer_enabled_list")
    if not isinstance(flags, list) or len(flags) != depth or not all(isinstance(f, bool) for f in flags):
        raise ValueError(f"config.json rope_layer_enabled_list={flags!r} must be one true/false per layer "
                         f"(num_layers={depth})")
    kinds = backbone.get("layer_types") or []
    notes = [f"layer_types={kinds} names sliding layers, which keras-hub 0.32's SmolLM3 never masks: every layer "
             "read as attending to every earlier key, as keras_hub computes"] if "sliding_attention" in kinds else []
    vocab, kv = integer(backbone, "vocabulary_size"), integer(backbone, "num_key_value_heads", heads)
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"), num_heads=heads,
        num_kv_heads=None if kv == heads else kv, num_decoder_layers=depth,
        d_ff=integer(backbone, "intermediate_dim"), max_len=integer(backbone, "max_position_embeddings"),
        dropout=number(backbone, "attention_dropout", 0.0), layer_norm_eps=number(backbone, "layer_norm_epsilon", 1e-6),
        rope_theta=number(backbone, "rope_theta", 2_000_000.0), rope_layers=tuple(flags), bias=False,
        attention_bias=False, qkv_bias=boolean(backbone, "attention_bias", False),
        ffn_bias=boolean(backbone, "mlp_bias", False), tie_embeddings=task is not None,
        output_projection=task is not None, **FIXED)
    return config, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub SmolLM3Backbone or SmolLM3CausalLM (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub SmolLM3 has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id") and getattr(config, k) != v]
    if config.has_o_bias:
        problems.append("a bias on the attention output (KerasHub SmolLM3's o_proj has none)")
    if config.output_projection and not config.tie_embeddings:
        problems.append("tie_embeddings=False (SmolLM3CausalLM's logits are always the token embedding's)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(SmolLM3Backbone config, task class or None)` for a config `export_problems` accepts."""
    flags = list(config.rope_layers or [True] * config.num_decoder_layers)
    backbone = {"vocabulary_size": config.tgt_vocab_size, "hidden_dim": config.d_model,
                "intermediate_dim": config.d_ff, "num_layers": config.num_decoder_layers,
                "num_attention_heads": config.num_heads, "num_key_value_heads": config.kv_heads,
                "attention_bias": config.has_qkv_bias, "attention_dropout": config.dropout,
                "rope_layer_enabled_list": flags, "layer_types": ["full_attention"] * config.num_decoder_layers,
                "mlp_bias": config.has_ffn_bias, "layer_norm_epsilon": config.layer_norm_eps,
                "max_position_embeddings": config.max_len, "rope_theta": config.rope_theta,
                "partial_rotary_factor": 1.0}
    return backbone, (TASKS[0] if config.output_projection else None)


def from_canonical_state(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
    """Each layer's rotary frequencies, which keras_hub loads as a variable: computed as `rope_init` does, in
    float32."""
    dim = config.head_dim
    frequencies = (1.0 / np.power(np.float32(config.rope_theta), np.arange(0, dim, 2, dtype=np.float32) /
                                  np.float32(dim))).astype(np.float32)  # (head_dim / 2,)
    for i in range(config.num_decoder_layers):
        state[FREQUENCIES.replace("{i}", str(i))] = frequencies.copy()


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None,
    from_canonical_state=from_canonical_state,  # the rotary frequencies keras_hub keeps as a variable
    classifier=None, predicts_mask_positions=(), expresses=("rope_layers",), approximations=())
