"""Hugging Face Phi-3 (`Phi3ForCausalLM`, `Phi3Model`): Llama's blocks with q, k and v fused in one `qkv_proj`
(`(q + k + v, hidden)`, k and v narrower under grouped-query attention) and the gate and up projections in one
`gate_up_proj` (`(2 * intermediate, hidden)`, gate first); rotary scaling `longrope` and a partial rotary fraction
where config.json says so, and a sliding window where it sets one."""

from __future__ import annotations

from . import hf_llama
from .family import HFFamily
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-phi3"
MODEL_TYPE = "phi3"
ARCHITECTURES = ("Phi3ForCausalLM", "Phi3Model")
SPEC = FamilySpec("phi3", ARCHITECTURES, attention_bias=None, mlp_bias=None, sliding=True, partial_rotary=True)

_L = "layers.{i}."
ATTENTION = [
    # canonical                                         Phi3Model                               transform
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",       _L + "self_attn.qkv_proj.weight",       "fused_qkv_t"),
    ("decoder.layers.{i}.self_attn.o.kernel",           _L + "self_attn.o_proj.weight",         "transpose"),
]
MLP = [
    ("decoder.layers.{i}.ffn.{gate_up}.kernel",         _L + "mlp.gate_up_proj.weight",         "fused_qkv_t"),
    ("decoder.layers.{i}.ffn.linear2.kernel",           _L + "mlp.down_proj.weight",            "transpose"),
]


TASK_HEADS = decoder_heads("Phi3", qa=False)  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **hf_llama.functions(SPEC, ATTENTION, MLP),  # table, config_from_hf, ...: Llama's, with SPEC and these entries
    config_keys=hf_llama.CONFIG_KEYS, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=(),
    float64_fix=None)
