"""KerasHub Phi-3 (`keras_hub.models.Phi3Backbone`, `Phi3CausalLM`): Llama's blocks (separate q, k, v einsum
kernels, a SwiGLU feed-forward, RMSNorms, no biases) with the head never tied, `hidden_dim / num_query_heads` wide
heads, and rotary scaling "su".

The math, read from keras-hub 0.32 (`keras_hub/src/models/phi3/`): `Phi3LayerNorm` is an RMSNorm in float32;
`Phi3Attention` scores times 1/sqrt(hidden_dim // num_query_heads); `silu(feedforward_gate_dense(x)) *
feedforward_intermediate_dense(x)` into `feedforward_output_dense`; `Phi3CausalLM`'s logits are the reverse
embedding (`tie_weights=False`). Without `rope_scaling_type`, `RotaryEmbedding(max_wavelength=rope_max_wavelength)`
rotates each head's halves. With `rope_scaling_type="su"`, `Phi3SuScaledRotaryEmbedding` is transformers' `longrope`
with `original_max_position_embeddings = pretraining_sequence_length` and `max_position_embeddings =
max_sequence_length` (the canonical `max_len`): both take `inv_freq = 1 / (ext * base^(2i/d))`, `ext` the long
factors once the sequence (start + length) is longer than `pretraining_sequence_length` and the short ones otherwise,
and multiply cos and sin by `sqrt(1 + ln(s) / ln(pretraining_sequence_length))` for `s = max_sequence_length /
pretraining_sequence_length > 1` (else 1); the tests run keras_hub and transformers on both sides of that length.
transformers' `factor` and `attention_factor`, which KerasHub derives instead, are written only when they equal what
it derives; another rope type, a partial rotation, a sliding window or an own `head_dim` is refused. The table is the
layout file `kerashub_phi3.toml` beside this module; the rest is Llama's functions (`kerashub_llama`) with this
family's rope keys.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import reference_numpy as rn

from . import kerashub_llama
from .family import KerasHubFamily
from .kerashub_llama import FamilySpec, unknown_keys

NAME = "kerashub-phi3"
BACKBONE = "Phi3Backbone"
TASKS = ("Phi3CausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_phi3.toml")
SERIALIZED = {"Phi3Backbone": ("keras_hub.src.models.phi3.phi3_backbone", "phi3_backbone"),
              "Phi3CausalLM": ("keras_hub.src.models.phi3.phi3_causal_lm", "phi3_causal_lm")}
CONFIG_KEYS = {**kerashub_llama.CONFIG_KEYS, "max_len": "max_sequence_length"}
FIXED = kerashub_llama.FIXED
TASK_FIELDS = {"Phi3CausalLM": kerashub_llama.CAUSAL_LM}
SPEC = FamilySpec(NAME, BACKBONE, TASKS[0], "keras_hub.src.models.phi3", LAYOUT, can_tie=False)
KEYS = ("vocabulary_size", "num_layers", "hidden_dim", "intermediate_dim", "num_query_heads", "num_key_value_heads",
        "layer_norm_epsilon", "dropout", "max_sequence_length", "pretraining_sequence_length", "rope_max_wavelength",
        "rope_scaling_type", "rope_scaling_short_factor", "rope_scaling_long_factor")
DEFAULT_LENGTH = 4096  # Phi3Backbone's max_sequence_length and pretraining_sequence_length

_LLAMA = kerashub_llama.functions(SPEC)  # Llama's hooks with SPEC; its reading, writing and checks wrapped below
_read, _problems, _write = _LLAMA["config_from_kerashub"], _LLAMA["export_problems"], _LLAMA["config_to_kerashub"]


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `Phi3Backbone.get_config()` (config.json) and the task class (task.json), if any: Llama's
    reading, then `max_len` and the rope scaling from this family's keys."""
    from .hf import integer

    unknown_keys(backbone, KEYS, BACKBONE)
    config, notes = _read(backbone, task)
    max_len = integer(backbone, "max_sequence_length", DEFAULT_LENGTH)
    return config.replace(max_len=max_len, rope_scaling=_rope_scaling(backbone)), notes


def _rope_scaling(backbone: dict[str, Any]) -> dict[str, Any] | None:
    """transformers' `longrope` parameters for `rope_scaling_type="su"` (None without a type; any other refused)."""
    from .hf import integer

    kind = backbone.get("rope_scaling_type")
    if kind is None:
        return None
    if kind != "su":
        raise ValueError(f"config.json rope_scaling_type={kind!r} is not supported (keras-hub's Phi3Backbone has "
                         "null and \"su\")")
    factors = {}
    for key in ("short_factor", "long_factor"):
        value = backbone.get("rope_scaling_" + key)
        if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                  for x in value):
            raise ValueError(f"config.json rope_scaling_{key} must be a list of numbers with rope_scaling_type=\"su\", "
                             f"received {value!r}")
        factors[key] = [float(x) for x in value]
    return {"rope_type": "longrope", **factors,
            "original_max_position_embeddings": integer(backbone, "pretraining_sequence_length", DEFAULT_LENGTH)}


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub Phi3 (empty if it is one): Llama's problems but the rope scaling's, then
    the rope scaling: none, or a `longrope` whose factor and attention factor are the ones KerasHub derives."""
    problems = _problems(config.replace(rope_scaling=None))
    rope = config.rope_scaling or {}
    kind = rope.get("rope_type")
    if kind not in (None, "longrope"):
        return problems + [f"rope_scaling rope_type={kind!r} (KerasHub Phi3 has none and longrope, its \"su\")"]
    if kind == "longrope":
        old = rope["original_max_position_embeddings"]
        factor = config.max_len / old
        scaling = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
        if rope.get("factor") is not None and not math.isclose(rope["factor"], factor, rel_tol=1e-12):
            problems.append(f"rope_scaling factor={rope['factor']!r} (KerasHub Phi3 derives max_len / "
                            f"original_max_position_embeddings = {factor!r})")
        if rope.get("attention_factor") is not None and not math.isclose(rope["attention_factor"], scaling,
                                                                         rel_tol=1e-12):
            problems.append(f"rope_scaling attention_factor={rope['attention_factor']!r} (KerasHub Phi3 derives "
                            f"{scaling!r} from the factor)")
        for key in ("short_factor", "long_factor"):
            if len(rope[key]) != config.head_dim // 2:
                problems.append(f"rope_scaling {key} of {len(rope[key])} entries (KerasHub Phi3 needs head_dim / 2 "
                                f"= {config.head_dim // 2})")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(Phi3Backbone config, task class or None)` for a config `export_problems` accepts: Llama's keys but the
    rope scaling factor, then this family's rope keys (`pretraining_sequence_length`, which only "su" reads, is
    `max_len` without it)."""
    backbone, task = _write(config.replace(rope_scaling=None))
    backbone.pop("rope_scaling_factor")
    rope = config.rope_scaling or {}
    su = rope.get("rope_type") == "longrope"
    backbone.update(max_sequence_length=config.max_len,
                    pretraining_sequence_length=rope["original_max_position_embeddings"] if su else config.max_len,
                    rope_scaling_type="su" if su else None,
                    rope_scaling_short_factor=list(rope["short_factor"]) if su else None,
                    rope_scaling_long_factor=list(rope["long_factor"]) if su else None)
    return backbone, task


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, table=_LLAMA["table"], settle_from_weights=_LLAMA["settle_from_weights"], to_canonical_state=None,
    from_canonical_state=None, classifier=None, predicts_mask_positions=(), expresses=(), approximations=())
