"""Hugging Face Gemma (`GemmaForCausalLM`, `GemmaModel`): Llama's names and blocks, with RMSNorms that multiply by
`1 + w` (`norm_weight_offset=1`), embeddings scaled by sqrt(hidden_size), a GeGLU feed-forward (tanh GELU), its own
`head_dim`, and the head tied to the embedding by default."""

from __future__ import annotations

from . import hf_llama
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-gemma"
MODEL_TYPE = "gemma"
ARCHITECTURES = ("GemmaForCausalLM", "GemmaModel")
BASE_PREFIX = hf_llama.BASE_PREFIX
CONFIG_KEYS = hf_llama.CONFIG_KEYS
TRANSFORMERS_CLASSES = ARCHITECTURES  # the source oracle: with an output projection, without one
HOOKS = hf_llama.HOOKS
SPEC = FamilySpec("gemma", ARCHITECTURES, activation_default="gelu_pytorch_tanh", tie_default=True, mlp_bias=None,
                  norm_weight_offset=1.0, scale_embedding=True)

table, config_from_hf, export_problems, config_to_hf, prefix = hf_llama.functions(SPEC)


TASK_HEADS = decoder_heads("Gemma", qa=False)  # `hf_tasks`
