"""KerasHub DistilBERT (`keras_hub.models.DistilBertBackbone`, `DistilBertMaskedLM`): a post-LN encoder without
segment embeddings or a pooler.

The math, read from keras-hub 0.32 (`keras_hub/src/models/distil_bert/distil_bert_backbone.py`):
`TokenAndPositionEmbedding` (token + position 0..T-1, added), a `LayerNormalization(epsilon=1e-12)`,
`TransformerEncoder` layers (post-LN, `layer_norm_epsilon=1e-12`, Keras's exact "gelu"); the padding mask is an input
and the backbone returns the sequence output only: transformers' `DistilBertModel` (hf-distilbert) computes the same.

`DistilBertMaskedLM` adds `MaskedLMHead`: `Dense(hidden_dim)` with the exact GELU, `LayerNormalization(epsilon=1e-5)`
(not the encoder's 1e-12: `head_layer_norm_eps=1e-5`), the tied token embedding plus its own bias. transformers'
`DistilBertForMaskedLM` normalizes its head at 1e-12, so that task has no hf-distilbert equivalent (refused).
The table is `kerashub_distilbert.toml` (RoBERTa's paths), the head `kerashub_bert.HEAD`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from . import kerashub_roberta as roberta
from .approximations import fixed_head_norm_eps
from .family import KerasHubFamily
from .kerashub_bert import HEAD
from .kerashub_classifiers import first_position

NAME = "kerashub-distilbert"
PAD_TOKEN = "[PAD]"  # the backbone takes a padding mask: the pad id is the vocabulary's (`preset_pad_id`)
BACKBONE = "DistilBertBackbone"
TASKS = ("DistilBertMaskedLM",)
CLASSIFIER = first_position("DistilBertTextClassifier", "relu")  # `kerashub_classifiers`
LAYOUT = Path(__file__).with_name("kerashub_distilbert.toml")
SERIALIZED = {"DistilBertBackbone": ("keras_hub.src.models.distil_bert.distil_bert_backbone", "distil_bert_backbone"),
              "DistilBertMaskedLM": ("keras_hub.src.models.distil_bert.distil_bert_masked_lm",
                                     "distil_bert_masked_lm")}
FIXED = {**roberta.FIXED, "layer_norm_eps": 1e-12}
CONFIG_KEYS = roberta.CONFIG_KEYS
TASK_FIELDS = {"DistilBertMaskedLM": {**roberta.MASKED_LM, **roberta.head_fields(FIXED)}}
APPROXIMATIONS = (fixed_head_norm_eps("DistilBertMaskedLM", roberta.HEAD_MATH["head_layer_norm_eps"]),)


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table + (HEAD if config.output_projection else [])


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `DistilBertBackbone.get_config()` (config.json)."""
    return roberta.read_config(backbone, task, FIXED), []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub DistilBertBackbone or DistilBertMaskedLM (empty if it is one)."""
    return roberta.problems(config, FIXED, "DistilBert")


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(DistilBertBackbone config, task class or None)` for a config `export_problems` accepts."""
    return roberta.write_config(config), (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS, pad_token=PAD_TOKEN,
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=CLASSIFIER, predicts_mask_positions=TASKS,  # its masked LM predicts its mask_positions only
    expresses=(), approximations=APPROXIMATIONS)
