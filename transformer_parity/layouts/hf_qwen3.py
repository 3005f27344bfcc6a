"""Hugging Face Qwen3 (`Qwen3ForCausalLM`, `Qwen3Model`): Llama's names and blocks, with an RMSNorm on each head of
q and k (`q_norm`, `k_norm`) before the rotation and a `head_dim` of its own.

transformers' Qwen3 normalizes q and k at the model's `rms_norm_eps`; a model whose q/k norms have an epsilon of
their own (a KerasHub Qwen3 preset: 1e-5 there, whatever `layer_norm_epsilon` says) is written only as an
approximation (`qk_norm_eps`, `layouts.approximations`)."""

from __future__ import annotations

from . import hf_llama
from .approximations import Approximation
from .family import HFFamily
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-qwen3"
MODEL_TYPE = "qwen3"
ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3Model")
SPEC = FamilySpec("qwen3", ARCHITECTURES, mlp_bias=None, qk_norm=True, sliding=True, window_switch=True)

APPROXIMATIONS = (
    Approximation("qk_norm_eps", "transformers' Qwen3 normalizes q and k at rms_norm_eps",
                  lambda c: {"qk_norm_eps": None} if c.qk_norm and c.qk_norm_eps is not None else {},
                  lambda c: f"the source at {c.qk_norm_eps:g}", "its q/k norms", ("self_attn",)),
)


TASK_HEADS = decoder_heads("Qwen3", qa_prefix="transformer.")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **hf_llama.functions(SPEC),  # table, config_from_hf, export_problems, config_to_hf, prefix: Llama's
    config_keys=hf_llama.CONFIG_KEYS, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=APPROXIMATIONS,
    float64_fix=None)
