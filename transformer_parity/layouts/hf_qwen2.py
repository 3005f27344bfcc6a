"""Hugging Face Qwen2 (`Qwen2ForCausalLM`, `Qwen2Model`): Llama's names and blocks, with biases on q, k and v only
and, where `use_sliding_window` says so, a sliding attention window."""

from __future__ import annotations

from . import hf_llama
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-qwen2"
MODEL_TYPE = "qwen2"
ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen2Model")
BASE_PREFIX = hf_llama.BASE_PREFIX
CONFIG_KEYS = hf_llama.CONFIG_KEYS
TRANSFORMERS_CLASSES = ARCHITECTURES  # the source oracle: with an output projection, without one
HOOKS = hf_llama.HOOKS
SPEC = FamilySpec("qwen2", ARCHITECTURES, attention_bias=None, qkv_bias=True, mlp_bias=None, sliding=True)

table, config_from_hf, export_problems, config_to_hf, prefix = hf_llama.functions(SPEC)


TASK_HEADS = decoder_heads("Qwen2", qa_prefix="transformer.")  # `hf_tasks`
