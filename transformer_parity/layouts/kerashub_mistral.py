"""KerasHub Mistral (`MistralBackbone`, `MistralCausalLM`): Llama's blocks with a sliding attention window on every
layer (`sliding_window`; none when null) and an optional `head_dim`.

The table is the layout file `kerashub_mistral.toml` beside this module; the rest is Llama's (`kerashub_llama`).
"""

from __future__ import annotations

from pathlib import Path

from . import kerashub_llama
from .family import KerasHubFamily
from .kerashub_llama import FamilySpec

NAME = "kerashub-mistral"
BACKBONE = "MistralBackbone"
TASKS = ("MistralCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_mistral.toml")
SERIALIZED = {"MistralBackbone": ("keras_hub.src.models.mistral.mistral_backbone", "mistral_backbone"),
              "MistralCausalLM": ("keras_hub.src.models.mistral.mistral_causal_lm", "mistral_causal_lm")}
CONFIG_KEYS = kerashub_llama.CONFIG_KEYS
FIXED = kerashub_llama.FIXED
TASK_FIELDS = {"MistralCausalLM": kerashub_llama.CAUSAL_LM}
SPEC = FamilySpec(NAME, BACKBONE, TASKS[0], "keras_hub.src.models.mistral", LAYOUT, head_dim=True,
                  window="sliding_window", can_tie=False)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    **kerashub_llama.functions(SPEC),  # table, config_from_kerashub, ...: Llama's, with SPEC
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, to_canonical_state=None, from_canonical_state=None, classifier=None, predicts_mask_positions=(),
    expresses=(), approximations=())
