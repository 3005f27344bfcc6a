"""KerasHub Qwen (Qwen2; `QwenBackbone`, `QwenCausalLM`): Llama's blocks with biases on q, k and v, the head tied by
default, and a sliding window on every layer when `use_sliding_window_attention` says so.

The table is the layout file `kerashub_qwen.toml` beside this module; the rest is Llama's (`kerashub_llama`).
"""

from __future__ import annotations

from pathlib import Path

from . import kerashub_llama
from .family import KerasHubFamily
from .kerashub_llama import FamilySpec

NAME = "kerashub-qwen"
BACKBONE = "QwenBackbone"
TASKS = ("QwenCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_qwen.toml")
SERIALIZED = {"QwenBackbone": ("keras_hub.src.models.qwen.qwen_backbone", "qwen_backbone"),
              "QwenCausalLM": ("keras_hub.src.models.qwen.qwen_causal_lm", "qwen_causal_lm")}
CONFIG_KEYS = kerashub_llama.CONFIG_KEYS
FIXED = kerashub_llama.FIXED
TASK_FIELDS = {"QwenCausalLM": kerashub_llama.CAUSAL_LM}
SPEC = FamilySpec(NAME, BACKBONE, TASKS[0], "keras_hub.src.models.qwen", LAYOUT,
                  tie_default=True, qkv_bias=True,
                  window="sliding_window_size", window_flag="use_sliding_window_attention")


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    **kerashub_llama.functions(SPEC),  # table, config_from_kerashub, ...: Llama's, with SPEC
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, to_canonical_state=None, from_canonical_state=None, classifier=None, predicts_mask_positions=(),
    expresses=(), approximations=())
