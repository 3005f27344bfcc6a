"""KerasHub BERT (`keras_hub.models.BertBackbone`): a post-LN encoder with segment embeddings, an embedding
LayerNorm and a pooler.

The math, read from keras-hub 0.32 (`keras_hub/src/models/bert/bert_backbone.py`,
`layers/modeling/transformer_encoder.py`): token + position + segment embeddings added (no scale), a
`LayerNormalization(epsilon=1e-12)`, `TransformerEncoder` layers (post-LN, `layer_norm_epsilon=1e-12`, the
tanh-approximated GELU — Hugging Face BERT uses the exact one), and a pooler `Dense(tanh)` on position
`cls_token_index` (0). The backbone returns `sequence_output` and `pooled_output`; here a bare backbone
(`output_projection=False`) with `pooler=True`.

`BertMaskedLM` cannot be expressed by one config and is refused: its `MaskedLMHead` uses the exact GELU
(`intermediate_activation="gelu"`) and `LayerNormalization(epsilon=1e-05)`, while the encoder layers use the tanh
GELU and epsilon 1e-12; the config has one activation and one epsilon. The table is `kerashub_bert.toml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

NAME = "kerashub-bert"
BACKBONE = "BertBackbone"
TASKS = ()
REFUSED_TASKS = {"BertMaskedLM": "its MaskedLMHead uses the exact GELU and LayerNorm epsilon 1e-5 while the encoder "
                                 "layers use the tanh GELU and epsilon 1e-12, and one config has one activation and "
                                 "one epsilon; convert the backbone (config.json and model.weights.h5 without "
                                 "task.json) instead",
                 "BertTextClassifier": "its classifier head has no canonical equivalent; convert the backbone "
                                       "(config.json and model.weights.h5 without task.json) instead"}
LAYOUT = Path(__file__).with_name("kerashub_bert.toml")
SERIALIZED = {"BertBackbone": ("keras_hub.src.models.bert.bert_backbone", "bert_backbone")}  # class: (module, name)
FIXED = {"num_decoder_layers": 0, "activation": "gelu_tanh", "layer_norm_eps": 1e-12, "norm_first": False,
         "final_norm": False, "positional": "learned", "position_offset": 0, "scale_embedding": False, "bias": True,
         "embed_norm": True, "head_transform": False, "pooler": True, "output_projection": False,
         "tie_embeddings": False}


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `BertBackbone.get_config()` (config.json)."""
    from .kerashub_preset import integer

    if backbone.get("cls_token_index", 0) != 0:
        raise ValueError(f"config.json cls_token_index={backbone['cls_token_index']!r} is not supported (the pooler "
                         "reads position 0)")
    vocab = integer(backbone, "vocabulary_size")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"),
        num_heads=integer(backbone, "num_heads"), num_encoder_layers=integer(backbone, "num_layers"),
        d_ff=integer(backbone, "intermediate_dim"), max_len=integer(backbone, "max_sequence_length"),
        type_vocab_size=integer(backbone, "num_segments"), dropout=float(backbone.get("dropout", 0.1)), pad_id=0,
        output_bias=False, **FIXED)
    notes = ["KerasHub BERT takes a padding_mask input rather than a pad id; padding masks here use pad_id=0 "
             "(--set pad_id=N to change)"]
    return config, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub BertBackbone (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub BertBackbone has {v!r})" for k, v in FIXED.items()
                if getattr(config, k) != v]
    if config.type_vocab_size < 1:
        problems.append("type_vocab_size=0 (BertBackbone always has segment embeddings)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    backbone = {"vocabulary_size": config.src_vocab_size, "num_layers": config.num_encoder_layers,
                "num_heads": config.num_heads, "hidden_dim": config.d_model, "intermediate_dim": config.d_ff,
                "dropout": config.dropout, "max_sequence_length": config.max_len,
                "num_segments": config.type_vocab_size, "cls_token_index": 0}
    return backbone, None


def task_config(backbone: dict[str, Any], task: str) -> dict[str, Any]:
    return {}
