"""Hugging Face Pegasus (`PegasusForConditionalGeneration`): Marian's names and fixed sinusoids (`hf_marian`:
`[sin | cos]` tables, a shared token table, `final_logits_bias`), computed pre-norm (each sublayer reads a LayerNorm
of its input) with a final `layer_norm` at the end of each stack; embeddings scaled by sqrt(d_model) where
`scale_embedding` says so. Decoding starts from `decoder_start_token_id` (Pegasus: its pad id, 0), which the caller
passes."""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from . import hf_marian
from .family import Float64Fix, HFFamily
from .hf import architecture, refuse

NAME = "hf-pegasus"
MODEL_TYPE = "pegasus"
ARCHITECTURES = ("PegasusForConditionalGeneration",)
CONFIG_KEYS = hf_marian.CONFIG_KEYS

TABLE = hf_marian.FINAL_NORMS + hf_marian.TABLE
HOOKS = {**hf_marian.HOOKS, **hf_marian.FINAL_NORM_HOOKS}


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    return TABLE


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Pegasus' `config.json`: Marian's fields, read the same way."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, True)
    refuse(hf, {"share_encoder_decoder_embeddings": True})
    marian_view = {**hf, "model_type": hf_marian.MODEL_TYPE, "architectures": list(hf_marian.ARCHITECTURES)}
    config, _, notes = hf_marian.config_from_hf(marian_view, keys)
    notes = [n.replace("Marian's", "Pegasus'") for n in notes]
    return config.replace(norm_first=True, final_norm=True), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no Pegasus equivalent (empty if it has one)."""
    problems = [p.replace("Marian", "Pegasus") for p in hf_marian.export_problems(
        config.replace(norm_first=False, final_norm=False))]
    return problems + [f"{k}={getattr(config, k)!r} (Pegasus needs True)" for k in ("norm_first", "final_norm")
                       if not getattr(config, k)]


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf, _ = hf_marian.config_to_hf(config.replace(norm_first=False, final_norm=False))
    hf.update(model_type=MODEL_TYPE, architectures=list(ARCHITECTURES))
    for key in ("decoder_vocab_size", "share_encoder_decoder_embeddings"):
        hf.pop(key)
    return hf, ARCHITECTURES[0]


def prefix(arch: str, keys: Collection[str] | None = None) -> str:
    return ""  # the table names full keys


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix="",
    # the source oracle (it always has its output layer), and its sublayers with the final norms
    transformers_classes=(ARCHITECTURES[0], ARCHITECTURES[0]), hooks=HOOKS, head_hook=None, task_heads=(),
    expresses=(), approximations=(),
    float64_fix=Float64Fix("Pegasus' sinusoid tables, which transformers builds in float32, replaced by the exact ones",
                           hf_marian.exact_sinusoids))
