"""KerasHub XLM-RoBERTa (`keras_hub.models.XLMRobertaBackbone`, `XLMRobertaMaskedLM`, `XLMRobertaTextClassifier`):
KerasHub's RoBERTa under other class names (`kerashub_roberta`; the backbone subclasses `RobertaBackbone`, the
masked LM and classifier build the same heads), with one difference that matters here: the pad id.

`XLMRobertaTokenizer` (keras_hub/src/models/xlm_roberta/xlm_roberta_tokenizer.py) puts fairseq's four special tokens
`<s>`, `<pad>`, `</s>`, `<unk>` at ids 0-3 ahead of its SentencePiece vocabulary, whatever that vocabulary holds
(XLM-R's own has no `<pad>` piece), so `<pad>` is id 1 in every XLM-R preset: the pad id is that, not looked up in
vocabulary.spm, and a model with another pad id is refused for export (keras_hub would mask id 1, not its pad).
Positions are 0..T-1, as KerasHub's RoBERTa numbers them: an export to transformers' XLM-R is refused, never written
as a model that computes something else.
"""

from __future__ import annotations

from typing import Any

import reference_numpy as rn

from . import kerashub_roberta as roberta
from .approximations import fixed_head_norm_eps
from .family import KerasHubFamily
from .kerashub_classifiers import first_position

NAME = "kerashub-xlm-roberta"
PAD_ID = 1  # `<pad>` in XLMRobertaTokenizer's fixed prefix
BACKBONE = "XLMRobertaBackbone"
TASKS = ("XLMRobertaMaskedLM",)
CLASSIFIER = first_position("XLMRobertaTextClassifier", "tanh")  # `kerashub_classifiers`
_MODELS = "keras_hub.src.models.xlm_roberta."
SERIALIZED = {"XLMRobertaBackbone": (_MODELS + "xlm_roberta_backbone", "xlm_roberta_backbone"),
              "XLMRobertaMaskedLM": (_MODELS + "xlm_roberta_masked_lm", "xlm_roberta_masked_lm")}
TASK_FIELDS = {"XLMRobertaMaskedLM": roberta.MASKED_LM}
APPROXIMATIONS = (fixed_head_norm_eps("XLMRobertaMaskedLM", roberta.HEAD_MATH["head_layer_norm_eps"]),)


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `XLMRobertaBackbone.get_config()` (config.json)."""
    config = roberta.read_config(backbone, task, roberta.FIXED).replace(pad_id=PAD_ID)
    return config, [f"pad_id={PAD_ID}: <pad> in XLMRobertaTokenizer's fixed special tokens",
                    "positions 0..T-1 (KerasHub's XLM-RoBERTa; not transformers' pad-skipping positions)"]


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub XLMRobertaBackbone or XLMRobertaMaskedLM (empty if it is one)."""
    found = roberta.problems(config, roberta.FIXED, "XLMRoberta")
    if config.pad_id != PAD_ID:
        found.append(f"pad_id={config.pad_id!r} (XLMRobertaTokenizer's <pad> is always {PAD_ID})")
    return found


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(XLMRobertaBackbone config, task class or None)` for a config `export_problems` accepts."""
    return roberta.write_config(config), (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=roberta.CONFIG_KEYS, fixed=roberta.FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # the pad id is fixed by the tokenizer (PAD_ID), not looked up
    layout=roberta.LAYOUT, table=roberta.table, settle_from_weights=None, to_canonical_state=None,
    from_canonical_state=None, classifier=CLASSIFIER, predicts_mask_positions=TASKS, expresses=(),
    approximations=APPROXIMATIONS)
