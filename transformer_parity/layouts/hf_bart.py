"""Hugging Face BART (`BartForConditionalGeneration`): Marian's encoder-decoder layout with learned positions and a
LayerNorm on the embeddings.

Everything Marian has (`hf_marian.TABLE`: shared token table, post-LN layers, `final_logits_bias`) plus, per stack,
a learned position table read at `position + 2` (BART's offset; the table has `max_position_embeddings + 2` rows) and
`layernorm_embedding`. Activation GELU, unscaled embeddings by default; the decoder starts from
`decoder_start_token_id` (BART: the eos id, 2), which the caller passes to decoding.
"""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from . import hf_marian
from .family import HFFamily
from .hf import architecture, refuse
from .hf_tasks import Head, linear

NAME = "hf-bart"
MODEL_TYPE = "bart"
ARCHITECTURES = ("BartForConditionalGeneration",)
BASE_PREFIX = ""  # the table names full keys (`model.` included), as every BART class keeps them
POSITION_OFFSET = 2  # BartLearnedPositionalEmbedding's fixed offset
CONFIG_KEYS = hf_marian.CONFIG_KEYS
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default; config.json has no field for it

TABLE = [
    # canonical                                   BartForConditionalGeneration                    transform
    ("src_pos.embedding",                         "model.encoder.embed_positions.weight",         "identity"),
    ("tgt_pos.embedding",                         "model.decoder.embed_positions.weight",         "identity"),
    ("src_embed_norm.gamma",                      "model.encoder.layernorm_embedding.weight",     "identity"),
    ("src_embed_norm.beta",                       "model.encoder.layernorm_embedding.bias",       "identity"),
    ("tgt_embed_norm.gamma",                      "model.decoder.layernorm_embedding.weight",     "identity"),
    ("tgt_embed_norm.beta",                       "model.decoder.layernorm_embedding.bias",       "identity"),
    *(entry for entry in hf_marian.TABLE if entry[2] != "sinusoid"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    return TABLE


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from BART's `config.json`."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, True)
    refuse(hf, {"normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": True})
    marian_view = {k: v for k, v in hf.items() if k not in ("normalize_embedding", "static_position_embeddings")}
    marian_view["architectures"] = list(hf_marian.ARCHITECTURES)
    config, _, _ = hf_marian.config_from_hf(marian_view, keys)  # the same fields, checked the same way
    notes = [f"layer_norm_eps={LAYER_NORM_EPS} (BART's fixed nn.LayerNorm epsilon)"]
    start, pad = hf.get("decoder_start_token_id"), config.pad_id  # both checked as token ids by hf_marian
    notes.append(f"decoder_start_token_id={start}; pad_token_id={pad} is what padding masks use")
    return config.replace(positional="learned", sinusoid_layout="interleaved", position_offset=POSITION_OFFSET,
                          embed_norm=True), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no BART equivalent (empty if it has one)."""
    wanted = {"norm_first": False, "final_norm": False, "positional": "learned", "position_offset": POSITION_OFFSET,
              "share_embeddings": True, "bias": True, "embed_norm": True, "output_projection": True,
              "head_transform": False, "layer_norm_eps": LAYER_NORM_EPS}
    problems = [f"{k}={getattr(config, k)!r} (BART needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if not config.is_encoder_decoder:
        problems.append("not an encoder-decoder model")
    if not config.has_output_bias:
        problems.append("no output bias (BART has final_logits_bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf, _ = hf_marian.config_to_hf(config.replace(positional="sinusoidal", position_offset=0, embed_norm=False,
                                                  sinusoid_layout="concatenated"))
    hf.update(model_type=MODEL_TYPE, architectures=list(ARCHITECTURES))
    hf.pop("share_encoder_decoder_embeddings")
    # Marian starts decoding from its pad id, BART from its eos id, which the canonical config does not hold: leave
    # it to transformers' BartConfig default (2) rather than write Marian's pad id
    hf.pop("decoder_start_token_id")
    return hf, ARCHITECTURES[0]


def prefix(arch: str, keys: Collection[str] | None = None) -> str:
    return ""  # the table names full keys


# The task classes (`hf_tasks`): each reads the decoder's final states of its BartModel (under `model.`, with no
# output projection). The sequence head reads the last position where the source holds eos_token_id through
# `classification_head.dense`, tanh and `out_proj`; the span head scores every decoder position.
_NO_OUTPUT = {"output_projection": False, "tie_embeddings": False, "output_bias": None}
_OUTPUT = {"output_projection": True, "tie_embeddings": True, "output_bias": True}  # BartForConditionalGeneration's


def task_heads(stem: str, generation: str) -> tuple[Head, ...]:
    """The sequence and span classes of a BART-style family (`stem`: the class names' start; `generation`: its
    conditional-generation class, whose weights the heads' models share)."""
    return (
        Head(f"{stem}ForSequenceClassification", generation,
             {"classifier": "sequence", "classifier_input": "eos", "classifier_dense": "tanh", **_NO_OUTPUT},
             linear("classifier.dense", "classification_head.dense") + linear("classifier",
                                                                              "classification_head.out_proj"),
             _OUTPUT, token_ids={"eos_id": "eos_token_id"}),
        Head(f"{stem}ForQuestionAnswering", generation, {"classifier": "span", **_NO_OUTPUT},
             linear("classifier", "qa_outputs"), _OUTPUT))


TASK_HEADS = task_heads("Bart", ARCHITECTURES[0])


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    # the source oracle (it always has its output layer), and Marian's sublayers
    transformers_classes=("BartForConditionalGeneration", "BartForConditionalGeneration"), hooks=hf_marian.HOOKS,
    head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=(), float64_fix=None)
