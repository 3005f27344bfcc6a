"""Hugging Face Gemma (`GemmaForCausalLM`, `GemmaModel`): Llama's names and blocks, with RMSNorms that multiply by
`1 + w` (`norm_weight_offset=1`), embeddings scaled by sqrt(hidden_size), a GeGLU feed-forward (tanh GELU), its own
`head_dim`, and the head tied to the embedding by default."""

from __future__ import annotations

from . import hf_llama
from .family import HFFamily
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-gemma"
MODEL_TYPE = "gemma"
ARCHITECTURES = ("GemmaForCausalLM", "GemmaModel")
SPEC = FamilySpec("gemma", ARCHITECTURES, activation_default="gelu_pytorch_tanh", tie_default=True, mlp_bias=None,
                  norm_weight_offset=1.0, scale_embedding=True)


TASK_HEADS = decoder_heads("Gemma", qa=False)  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **hf_llama.functions(SPEC),  # table, config_from_hf, export_problems, config_to_hf, prefix: Llama's
    config_keys=hf_llama.CONFIG_KEYS, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=(),
    float64_fix=None)
