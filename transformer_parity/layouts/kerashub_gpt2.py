"""KerasHub GPT-2 (`keras_hub.models.GPT2Backbone`, `GPT2CausalLM`): decoder-only, pre-LN, learned positions.

The math, read from keras-hub 0.32 (`keras_hub/src/models/gpt2/gpt2_backbone.py`, `gpt2_causal_lm.py`,
`layers/modeling/transformer_decoder.py`): token + position embeddings added (no scale), then `TransformerDecoder`
layers without cross-attention (`normalize_first=True`, `layer_norm_epsilon=1e-05`, the tanh-approximated GELU,
a causal mask merged with the padding mask), a final `LayerNormalization(epsilon=1e-05)`. `GPT2CausalLM`'s
logits are `token_embedding(x, reverse=True)`: the tied embedding, no bias, no weights of its own. The table is the
layout file `kerashub_gpt2.toml` beside this module (read by `layouts.user`, the format users write).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily

NAME = "kerashub-gpt2"
BACKBONE = "GPT2Backbone"
TASKS = ("GPT2CausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_gpt2.toml")
SERIALIZED = {"GPT2Backbone": ("keras_hub.src.models.gpt2.gpt2_backbone", "gpt2_backbone"),  # class: (module, name)
              "GPT2CausalLM": ("keras_hub.src.models.gpt2.gpt2_causal_lm", "gpt2_causal_lm")}
FIXED = {"num_encoder_layers": 0, "activation": "gelu_tanh", "layer_norm_eps": 1e-5, "norm_first": True,
         "final_norm": True, "positional": "learned", "position_offset": 0, "scale_embedding": False, "bias": True,
         "embed_norm": False, "head_transform": False, "type_vocab_size": 0, "pooler": False, "output_bias": False,
         "pad_id": None}  # no pad id: padding arrives as GPT2Backbone's padding_mask input, so every id is a token
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "max_len": "max_sequence_length"}  # canonical field -> config.json key, for messages
CAUSAL_LM = {"output_projection": True, "tie_embeddings": True}  # GPT2CausalLM's logits: the tied embedding
TASK_FIELDS = {"GPT2CausalLM": CAUSAL_LM}  # a bare GPT2CausalLM .weights.h5 (its save_weights) is read as this task


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table  # GPT2CausalLM's head is the tied embedding: nothing to add


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `GPT2Backbone.get_config()` (config.json) and the task class (task.json), if any."""
    from .hf import integer, number

    vocab = integer(backbone, "vocabulary_size")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"),
        num_heads=integer(backbone, "num_heads"), num_decoder_layers=integer(backbone, "num_layers"),
        d_ff=integer(backbone, "intermediate_dim"), max_len=integer(backbone, "max_sequence_length"),
        dropout=number(backbone, "dropout", 0.1), tie_embeddings=False, output_projection=False, **FIXED)
    if task is not None:
        config = config.replace(**CAUSAL_LM)
    return config, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub GPT-2 (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub GPT-2 has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id") and getattr(config, k) != v]
    if config.output_projection and not config.tie_embeddings:
        problems.append("tie_embeddings=False (GPT2CausalLM's logits reuse the token embedding)")
    if config.has_output_bias:
        problems.append("output_bias=True (GPT2CausalLM's logits have no bias)")
    return problems


def backbone_config(config: rn.TransformerConfig) -> dict[str, Any]:
    """The `get_config()` keys KerasHub's decoder backbones of GPT-2's lineage share (GPT-2, OPT, GPT-NeoX)."""
    return {"vocabulary_size": config.tgt_vocab_size, "num_layers": config.num_decoder_layers,
            "num_heads": config.num_heads, "hidden_dim": config.d_model, "intermediate_dim": config.d_ff,
            "dropout": config.dropout, "max_sequence_length": config.max_len}


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(GPT2Backbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = backbone_config(config)
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as GPT2Backbone's padding_mask input; every id is a token
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=None, predicts_mask_positions=(), expresses=(), approximations=())
