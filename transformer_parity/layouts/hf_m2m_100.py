"""Hugging Face M2M100 (`M2M100ForConditionalGeneration`): Marian's names (`hf_marian`: one shared token table,
`q_proj` ... `out_proj`, `fc1`, `fc2`), computed pre-norm with a final `layer_norm` per stack like mBART and Pegasus,
embeddings scaled by sqrt(d_model) where `scale_embedding` says so, no `final_logits_bias`, and fairseq's sinusoids:
`[sin | cos]` at frequencies 10000^(-i / (d/2 - 1)) (`sinusoid_frequencies="inclusive"`), counted over the non-pad
tokens from `pad_token_id + 1` on, a pad token reading a zero row (`positions_skip_pad`, `position_offset`). The
tables are recomputed, not saved. Decoding starts from what the caller passes (its `decoder_start_token_id`, 2, or a
language id).

transformers builds the sinusoid tables in float32 even for a float64 model: verify's float64 run replaces them by
the exact ones (`exact_sinusoids`)."""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from . import hf_marian
from .family import Float64Fix, HFFamily
from .hf import TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, refuse, token_id

NAME = "hf-m2m-100"
MODEL_TYPE = "m2m_100"
ARCHITECTURES = ("M2M100ForConditionalGeneration",)
CONFIG_KEYS = hf_marian.CONFIG_KEYS
LAYER_NORM_EPS = 1e-5  # its nn.LayerNorm default; config.json has no field for it

# transformers <= 4.30 saved the sinusoid tables as `embed_positions.weights` (the pad's row zeros), later releases not
TABLE = hf_marian.FINAL_NORMS + [entry for entry in hf_marian.TABLE if entry[2] != "sinusoid"] + [
    ("-", f"model.{stack}.embed_positions.weights", "sinusoid") for stack in ("encoder", "decoder")]
HOOKS = {**hf_marian.HOOKS, **hf_marian.FINAL_NORM_HOOKS}
ITS_POSITIONS = {"positional": "sinusoidal", "sinusoid_layout": "concatenated", "sinusoid_frequencies": "inclusive",
                 "positions_skip_pad": True}


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    return TABLE


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from M2M100's `config.json`."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, True)
    refuse(hf, {"is_encoder_decoder": True})
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if integer(hf, enc) != integer(hf, dec):
            raise ValueError(f"config.json {enc}={hf[enc]} differs from {dec}={hf[dec]}; one value for both stacks "
                             "is supported")
    vocab = integer(hf, "vocab_size")
    pad = token_id(hf, "pad_token_id", vocab, default=1)
    if pad is None:
        raise ValueError("config.json pad_token_id is null; M2M100 counts positions over the tokens that are not "
                         "its pad id, so it must be a token id")
    notes = [f"layer_norm_eps={LAYER_NORM_EPS} (M2M100's fixed nn.LayerNorm epsilon)"]
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(hf, "d_model"),
        num_heads=integer(hf, "encoder_attention_heads"), num_encoder_layers=integer(hf, "encoder_layers"),
        num_decoder_layers=integer(hf, "decoder_layers"), d_ff=integer(hf, "encoder_ffn_dim"),
        max_len=integer(hf, "max_position_embeddings"), dropout=number(hf, "dropout", 0.1),
        activation=activation(hf, "activation_function", "relu"), norm_first=True, final_norm=True,
        layer_norm_eps=LAYER_NORM_EPS, **ITS_POSITIONS, position_offset=pad + 1,
        scale_embedding=boolean(hf, "scale_embedding", True), bias=True,
        tie_embeddings=boolean(hf, "tie_word_embeddings", True), pad_id=pad, output_bias=False,
        share_embeddings=True)
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no M2M100 equivalent (empty if it has one)."""
    wanted = {"norm_first": True, "final_norm": True, **ITS_POSITIONS, "share_embeddings": True, "bias": True,
              "embed_norm": False, "output_projection": True, "head_transform": False,
              "layer_norm_eps": LAYER_NORM_EPS, "output_bias": False}
    problems = [f"{k}={getattr(config, k)!r} (M2M100 needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if not config.is_encoder_decoder:
        problems.append("not an encoder-decoder model")
    if config.pad_id is None or config.position_offset != config.pad_id + 1:
        problems.append(f"position_offset={config.position_offset} (M2M100 counts positions from pad_id + 1, "
                        f"pad_id={config.pad_id})")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf = {"model_type": MODEL_TYPE, "architectures": list(ARCHITECTURES), "vocab_size": config.src_vocab_size,
          "d_model": config.d_model, "encoder_attention_heads": config.num_heads,
          "decoder_attention_heads": config.num_heads, "encoder_layers": config.num_encoder_layers,
          "decoder_layers": config.num_decoder_layers, "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
          "max_position_embeddings": config.max_len, "activation_function": TO_HF_ACTIVATION[config.activation],
          "scale_embedding": config.scale_embedding, "dropout": config.dropout, "attention_dropout": 0.0,
          "activation_dropout": 0.0, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
          "pad_token_id": config.pad_id, "tie_word_embeddings": config.tie_embeddings, "is_encoder_decoder": True}
    return hf, ARCHITECTURES[0]


def prefix(arch: str, keys: Collection[str] | None = None) -> str:
    return ""  # the table names full keys


def exact_sinusoids(model64, config: rn.TransformerConfig) -> None:
    """transformers builds M2M100's sinusoid tables in float32, even for a float64 model: the exact ones, in place
    (`verify`'s float64 run of the source), its pad row zero."""
    import torch

    with torch.no_grad():
        for stack in (model64.model.encoder, model64.model.decoder):
            table = stack.embed_positions.weights
            exact = rn.sinusoidal_positions(table.shape[0], table.shape[1], "concatenated", "inclusive")
            exact[config.pad_id] = 0.0
            table.copy_(torch.as_tensor(exact))


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix="",
    # the source oracle (it always has its output layer), and its sublayers with the final norms
    transformers_classes=(ARCHITECTURES[0], ARCHITECTURES[0]), hooks=HOOKS, head_hook=None, task_heads=(),
    expresses=("sinusoid_frequencies", "positions_skip_pad"), approximations=(),
    float64_fix=Float64Fix("M2M100's sinusoid tables, which transformers builds in float32, replaced by the exact ones",
                           exact_sinusoids))
