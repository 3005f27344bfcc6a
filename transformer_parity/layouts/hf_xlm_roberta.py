"""Hugging Face XLM-RoBERTa (`XLMRobertaForMaskedLM`, `XLMRobertaModel`): RoBERTa's architecture, names and positions
(`hf_roberta`) under its own model type and class names."""

from __future__ import annotations

from . import hf_roberta
from .hf_roberta import Family
from .hf_tasks import causal_lm, encoder_heads

NAME = "hf-xlm-roberta"
MODEL_TYPE = "xlm-roberta"
ARCHITECTURES = ("XLMRobertaForMaskedLM", "XLMRobertaModel")
EXPRESSES = hf_roberta.EXPRESSES
BASE_PREFIX = hf_roberta.BASE_PREFIX
CONFIG_KEYS = hf_roberta.CONFIG_KEYS
TRANSFORMERS_CLASSES = ARCHITECTURES  # the source oracle: with an output projection, without one
HOOKS = hf_roberta.HOOKS
HEAD_HOOK = hf_roberta.HEAD_HOOK
FAMILY = Family(NAME, MODEL_TYPE, ARCHITECTURES)

table = hf_roberta.table
config_from_hf, export_problems, config_to_hf, prefix = hf_roberta.functions(FAMILY)


TASK_HEADS = encoder_heads("XLMRoberta", *hf_roberta.SEQUENCE_HEAD, pooled_base=True,  # RoBERTa's heads
                           choice=hf_roberta.CHOICE_HEAD) + (
    causal_lm("XLMRobertaForCausalLM", "XLMRobertaForMaskedLM"),)
