"""Hugging Face Qwen3 (`Qwen3ForCausalLM`, `Qwen3Model`): Llama's names and blocks, with an RMSNorm on each head of
q and k (`q_norm`, `k_norm`) before the rotation and a `head_dim` of its own."""

from __future__ import annotations

from . import hf_llama
from .hf_llama import FamilySpec

NAME = "hf-qwen3"
MODEL_TYPE = "qwen3"
ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3Model")
BASE_PREFIX = hf_llama.BASE_PREFIX
CONFIG_KEYS = hf_llama.CONFIG_KEYS
TRANSFORMERS_CLASSES = ARCHITECTURES  # the source oracle: with an output projection, without one
HOOKS = hf_llama.HOOKS
SPEC = FamilySpec("qwen3", ARCHITECTURES, mlp_bias=None, qk_norm=True, sliding=True)

table, config_from_hf, export_problems, config_to_hf, prefix = hf_llama.functions(SPEC)
