"""Hugging Face mBART (`MBartForConditionalGeneration`): BART's names and learned positions (`hf_bart`), computed
pre-norm (each sublayer reads a LayerNorm of its input) with a final `layer_norm` at the end of each stack.

Everything else is BART's: the shared token table, `layernorm_embedding`, positions at `position + 2`,
`final_logits_bias`, GELU, embeddings scaled by sqrt(d_model) where `scale_embedding` says so. Decoding starts from
what the caller passes (mBART's `decoder_start_token_id`, or a language id)."""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from . import hf_bart, hf_marian
from .family import HFFamily
from .hf import architecture, refuse

NAME = "hf-mbart"
MODEL_TYPE = "mbart"
ARCHITECTURES = ("MBartForConditionalGeneration",)
CONFIG_KEYS = hf_marian.CONFIG_KEYS

TABLE = hf_marian.FINAL_NORMS + hf_bart.TABLE
HOOKS = {**hf_marian.HOOKS, **hf_marian.FINAL_NORM_HOOKS}


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    return TABLE


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from mBART's `config.json`: BART's fields, read the same way."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, True)
    refuse(hf, {"add_bias_logits": False, "add_final_layer_norm": True})
    bart_view = {**hf, "model_type": hf_bart.MODEL_TYPE, "architectures": list(hf_bart.ARCHITECTURES)}
    bart_view.pop("add_final_layer_norm", None)
    config, _, notes = hf_bart.config_from_hf(bart_view, keys)
    notes = [n.replace("BART's", "mBART's") for n in notes]
    return config.replace(norm_first=True, final_norm=True), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no mBART equivalent (empty if it has one)."""
    problems = [p.replace("BART", "mBART") for p in hf_bart.export_problems(config.replace(norm_first=False,
                                                                                           final_norm=False))]
    problems += [f"{k}={getattr(config, k)!r} (mBART needs True)" for k in ("norm_first", "final_norm")
                 if not getattr(config, k)]
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf, _ = hf_bart.config_to_hf(config.replace(norm_first=False, final_norm=False))
    hf.update(model_type=MODEL_TYPE, architectures=list(ARCHITECTURES))
    return hf, ARCHITECTURES[0]


def prefix(arch: str, keys: Collection[str] | None = None) -> str:
    return ""  # the table names full keys


TASK_HEADS = hf_bart.task_heads("MBart", ARCHITECTURES[0])  # `hf_tasks`: BART's sequence and span heads


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix="",
    # the source oracle (it always has its output layer), and its sublayers with the final norms
    transformers_classes=(ARCHITECTURES[0], ARCHITECTURES[0]), hooks=HOOKS,
    head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=(), float64_fix=None)
