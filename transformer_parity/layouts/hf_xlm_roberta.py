"""Hugging Face XLM-RoBERTa (`XLMRobertaForMaskedLM`, `XLMRobertaModel`): RoBERTa's architecture, names and positions
(`hf_roberta`) under its own model type and class names."""

from __future__ import annotations

from . import hf_roberta
from .family import HFFamily
from .hf_roberta import Names
from .hf_tasks import causal_lm, encoder_heads

NAME = "hf-xlm-roberta"
MODEL_TYPE = "xlm-roberta"
ARCHITECTURES = ("XLMRobertaForMaskedLM", "XLMRobertaModel")
NAMES = Names(NAME, MODEL_TYPE, ARCHITECTURES)


TASK_HEADS = encoder_heads("XLMRoberta", *hf_roberta.SEQUENCE_HEAD, pooled_base=True,  # RoBERTa's heads
                           choice=hf_roberta.CHOICE_HEAD) + (
    causal_lm("XLMRobertaForCausalLM", "XLMRobertaForMaskedLM"),)


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **hf_roberta.functions(NAMES),  # table, config_from_hf, export_problems, config_to_hf, prefix: RoBERTa's
    config_keys=hf_roberta.CONFIG_KEYS, base_prefix=hf_roberta.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_roberta.FAMILY.hooks, head_hook=hf_roberta.FAMILY.head_hook, task_heads=TASK_HEADS,
    expresses=hf_roberta.FAMILY.expresses, approximations=(), float64_fix=None)
