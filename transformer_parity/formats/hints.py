"""What to say when a checkpoint file carries no config: the fix that fits what its names say it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import reference_numpy as rn

from ..errors import UsageError


def config_from_fields(path: Path, fields: Mapping[str, Any], names: Sequence[str]) -> rn.TransformerConfig:
    if not fields:
        raise missing_config(path, names)
    return rn.TransformerConfig.from_dict(dict(fields))


# The first component of every canonical name (and of the twins' own names, which follow them)
CANONICAL_TOPS = {"encoder", "decoder", "src_embed", "tgt_embed", "src_pos", "tgt_pos", "src_embed_norm",
                  "tgt_embed_norm", "src_type", "output", "head", "pooler"}
KERASHUB_LAYERS = ("reversible_embedding", "token_and_position_embedding", "position_embedding", "token_embedding",
                   "transformer_layer", "transformer_encoder", "transformer_decoder")
# Where a Hugging Face model's keys start besides its families' base models (`HFFamily.base_prefix`): the layers and
# embeddings of a bare base model, and the heads around one.
HF_TOPS = ("h.", "encoder.layer.", "embeddings.", "lm_head.", "cls.")


def _hf_prefixes() -> tuple[str, ...]:
    from ..layouts import hf_families

    return tuple(sorted({family.base_prefix for family in hf_families() if family.base_prefix})) + HF_TOPS


def missing_config(path: Path, names: Sequence[str]) -> UsageError:
    """A checkpoint that stores no config, read without --config/--set: one line with the fix that fits what it holds
    (`names`: its tensor or dataset names). Only a file of this tool's own names needs the config's fields; a Hugging
    Face or KerasHub weights file needs its directory (or --from), anything else a layout file."""
    head = f"{path} carries no config"
    sibling = path.parent / "config.json"
    if sibling.is_file():
        from transformer_parity.layouts import hf_dir, kerashub_preset

        if kerashub_preset.is_preset(path.parent):
            return UsageError(f"{head}: it is the weights file of the KerasHub preset {path.parent}; give the preset "
                              "directory, whose config.json is the config")
        try:
            model_type = hf_dir.read_config(path.parent).get("model_type")
        except (OSError, ValueError):
            model_type = None
        if model_type:
            return UsageError(f"{head}: it is the weights file of the Hugging Face model directory {path.parent} "
                              f"(model_type {model_type!r}); give the directory, whose config.json is the config")
    tops = {name.replace("/", ".").split(".")[0] for name in names}
    example = sorted(names)[0] if names else ""
    if names and tops <= CANONICAL_TOPS:
        return UsageError(f"{head}; give one with --config FILE.json (or --set FIELD=VALUE ...)")
    if any(layer in name for name in names for layer in KERASHUB_LAYERS):
        from ..layouts import KERASHUB_LAYOUTS

        return UsageError(f"{head}, and its weights are a KerasHub model's ({example!r}, ...): --from with its family "
                          f"({', '.join(KERASHUB_LAYOUTS)}) reads the config off them (or give the preset directory)")
    if any(name.startswith(_hf_prefixes()) for name in names):
        return UsageError(f"{head}, and its names are a Hugging Face model's ({example!r}, ...): give the model's "
                          "directory, with its config.json")
    return UsageError(f"{head}, and its names ({example!r}, ...) are not this tool's: a model of your own ports with a "
                      f"layout file: transformer-parity layout --scaffold {path.name} > layout.toml, then --layout "
                      "layout.toml")
