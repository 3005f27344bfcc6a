"""KerasHub Qwen3 (`Qwen3Backbone`, `Qwen3CausalLM`): Llama's blocks with an RMSNorm on each head of q and k, its own
`head_dim`, the head tied by default, and `sliding_window_size` applied on every layer (32768 by default).

keras-hub 0.32's `Qwen3DecoderLayer` builds its `Qwen3Attention` without the model's epsilon, so the q/k norms always
normalize at that layer's default, 1e-5, while every other norm uses `layer_norm_epsilon`: a preset whose
`layer_norm_epsilon` is not 1e-5 reads as `qk_norm_eps=1e-5`. Real Qwen3 checkpoints use 1e-6 everywhere, so their
export is an approximation (`qk_norm_eps`, `layouts.approximations`).

The table is the layout file `kerashub_qwen3.toml` beside this module; the rest is Llama's (`kerashub_llama`).
"""

from __future__ import annotations

from pathlib import Path

from . import kerashub_llama
from .approximations import Approximation
from .family import KerasHubFamily
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
QK_NORM_EPS = 1e-5  # Qwen3Attention's default, which Qwen3DecoderLayer never overrides
EXPRESSES = ("qk_norm_eps",)  # `layouts.FAMILY_ONLY` settings this family has
SPEC = FamilySpec(NAME, BACKBONE, TASKS[0], "keras_hub.src.models.qwen3", LAYOUT, tie_default=True, qk_norm=True,
                  qk_norm_eps=QK_NORM_EPS, head_dim=True, window="sliding_window_size")
APPROXIMATIONS = (
    Approximation("qk_norm_eps", f"KerasHub's Qwen3Attention normalizes q and k at epsilon {QK_NORM_EPS:g} whatever "
                                 "layer_norm_epsilon says",
                  lambda c: {"qk_norm_eps": QK_NORM_EPS} if c.qk_norm and (c.qk_norm_eps or c.layer_norm_eps) !=
                  QK_NORM_EPS else {},
                  lambda c: f"the source at {c.qk_norm_eps or c.layer_norm_eps:g}", "its q/k norms",
                  ("self_attn",)),
)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    **kerashub_llama.functions(SPEC),  # table, config_from_kerashub, ...: Llama's, with SPEC
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, to_canonical_state=None, from_canonical_state=None, classifier=None, predicts_mask_positions=(),
    expresses=EXPRESSES, approximations=APPROXIMATIONS)
