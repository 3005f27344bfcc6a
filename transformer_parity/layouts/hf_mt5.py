"""Hugging Face mT5 (`MT5ForConditionalGeneration`, `MT5Model`): T5 v1.1's computation under its own names
(`hf_t5`: RMS pre-norms, relative position biases, no biases; by default `gated-gelu`, transformers' `gelu_new`),
whose final states are never rescaled before the head. transformers ties the head to `shared` unless the file holds
an `lm_head.weight` of its own (mT5's released checkpoints do). Decoding starts from `decoder_start_token_id` (0)."""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from . import hf_t5
from .family import HFFamily
from .hf import architecture

NAME = "hf-mt5"
MODEL_TYPE = "mt5"
ARCHITECTURES = ("MT5ForConditionalGeneration", "MT5Model")
FEED_FORWARD = "gated-gelu"  # MT5Config's default feed_forward_proj (T5Config's is relu)


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from mT5's `config.json`: T5's fields, read the same way, never rescaled."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, True)
    t5_view = {"feed_forward_proj": FEED_FORWARD, **hf, "model_type": hf_t5.MODEL_TYPE,
               "architectures": [hf_t5.ARCHITECTURES[ARCHITECTURES.index(arch)]], "scale_decoder_outputs": False}
    config, _, notes = hf_t5.config_from_hf(t5_view, keys)
    return config, arch, [note.replace("T5", "mT5") for note in notes]


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no mT5 equivalent (empty if it has one)."""
    problems = [p.replace("T5", "mT5") for p in hf_t5.export_problems(config.replace(logit_divisor=1.0))]
    if config.logit_divisor != 1.0:
        problems.append(f"logit_divisor={config.logit_divisor!r} (mT5 never rescales its final states)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf, arch = hf_t5.config_to_hf(config)
    arch = ARCHITECTURES[hf_t5.ARCHITECTURES.index(arch)]
    hf.pop("scale_decoder_outputs")
    hf.update(model_type=MODEL_TYPE, architectures=[arch])
    return hf, arch


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf,
    config_keys=hf_t5.CONFIG_KEYS, table=hf_t5.table, prefix=hf_t5.prefix, base_prefix="",
    transformers_classes=ARCHITECTURES, hooks=hf_t5.HOOKS, head_hook=None, task_heads=hf_t5.task_heads("MT5"),
    expresses=("relative_bias_buckets", "relative_bias_max_distance", "positional", "attention_scale"),
    approximations=(),
    float64_fix=hf_t5.FAMILY.float64_fix)
