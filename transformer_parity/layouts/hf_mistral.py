"""Hugging Face Mistral (`MistralForCausalLM`, `MistralModel`): Llama's names and blocks, with a sliding attention
window on every layer (`sliding_window`) and no attention or MLP biases."""

from __future__ import annotations

from . import hf_llama
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-mistral"
MODEL_TYPE = "mistral"
ARCHITECTURES = ("MistralForCausalLM", "MistralModel")
BASE_PREFIX = hf_llama.BASE_PREFIX
CONFIG_KEYS = hf_llama.CONFIG_KEYS
TRANSFORMERS_CLASSES = ARCHITECTURES  # the source oracle: with an output projection, without one
HOOKS = hf_llama.HOOKS
SPEC = FamilySpec("mistral", ARCHITECTURES, attention_bias=None, mlp_bias=None, sliding=True)

table, config_from_hf, export_problems, config_to_hf, prefix = hf_llama.functions(SPEC)


TASK_HEADS = decoder_heads("Mistral")  # `hf_tasks`
