"""Hugging Face Qwen2 (`Qwen2ForCausalLM`, `Qwen2Model`): Llama's names and blocks, with biases on q, k and v only
and, where `use_sliding_window` says so, a sliding attention window."""

from __future__ import annotations

from . import hf_llama
from .family import HFFamily
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-qwen2"
MODEL_TYPE = "qwen2"
ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen2Model")
SPEC = FamilySpec("qwen2", ARCHITECTURES, attention_bias=None, qkv_bias=True, mlp_bias=None, sliding=True,
                  window_switch=True)


TASK_HEADS = decoder_heads("Qwen2", qa_prefix="transformer.")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **hf_llama.functions(SPEC),  # table, config_from_hf, export_problems, config_to_hf, prefix: Llama's
    config_keys=hf_llama.CONFIG_KEYS, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=(),
    float64_fix=None)
