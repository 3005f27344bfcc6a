"""Hugging Face Mistral (`MistralForCausalLM`, `MistralModel`): Llama's names and blocks, with a sliding attention
window on every layer (`sliding_window`) and no attention or MLP biases."""

from __future__ import annotations

from . import hf_llama
from .family import HFFamily
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-mistral"
MODEL_TYPE = "mistral"
ARCHITECTURES = ("MistralForCausalLM", "MistralModel")
SPEC = FamilySpec("mistral", ARCHITECTURES, attention_bias=None, mlp_bias=None, sliding=True)


TASK_HEADS = decoder_heads("Mistral")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **hf_llama.functions(SPEC),  # table, config_from_hf, export_problems, config_to_hf, prefix: Llama's
    config_keys=hf_llama.CONFIG_KEYS, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=(),
    float64_fix=None)
