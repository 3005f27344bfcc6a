"""KerasHub Qwen (Qwen2; `QwenBackbone`, `QwenCausalLM`): Llama's blocks with biases on q, k and v, the head tied by
default, and a sliding window on every layer when `use_sliding_window_attention` says so.

The table is the layout file `kerashub_qwen.toml` beside this module; the rest is Llama's (`kerashub_llama`).
"""

from __future__ import annotations

from pathlib import Path

from . import kerashub_llama
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

table, config_from_kerashub, export_problems, config_to_kerashub, settle_from_weights = kerashub_llama.functions(SPEC)
task_config = kerashub_llama.task_config
