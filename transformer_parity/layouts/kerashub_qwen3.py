"""KerasHub Qwen3 (`Qwen3Backbone`, `Qwen3CausalLM`): Llama's blocks with an RMSNorm on each head of q and k, its own
`head_dim`, the head tied by default, and `sliding_window_size` applied on every layer (32768 by default).

The table is the layout file `kerashub_qwen3.toml` beside this module; the rest is Llama's (`kerashub_llama`).
"""

from __future__ import annotations

from pathlib import Path

from . import kerashub_llama
from .kerashub_llama import FamilySpec

NAME = "kerashub-qwen3"
BACKBONE = "Qwen3Backbone"
TASKS = ("Qwen3CausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_qwen3.toml")
SERIALIZED = {"Qwen3Backbone": ("keras_hub.src.models.qwen3.qwen3_backbone", "qwen3_backbone"),
              "Qwen3CausalLM": ("keras_hub.src.models.qwen3.qwen3_causal_lm", "qwen3_causal_lm")}
CONFIG_KEYS = kerashub_llama.CONFIG_KEYS
FIXED = kerashub_llama.FIXED
TASK_FIELDS = {"Qwen3CausalLM": kerashub_llama.CAUSAL_LM}
SPEC = FamilySpec(NAME, BACKBONE, TASKS[0], "keras_hub.src.models.qwen3", LAYOUT,
                  tie_default=True, qk_norm=True, head_dim=True, window="sliding_window_size")

table, config_from_kerashub, export_problems, config_to_kerashub, settle_from_weights = kerashub_llama.functions(SPEC)
task_config = kerashub_llama.task_config
