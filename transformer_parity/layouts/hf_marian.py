"""Hugging Face Marian (`MarianMTModel`): the post-LN encoder-decoder of the OPUS-MT translation models.

One token table `model.shared` serves encoder, decoder and (tied) output; positions are fixed `[sin | cos]`
sinusoids (`embed_positions`, recomputed, not saved by transformers 5; a file that has them must hold exactly that
table); the logits get `final_logits_bias`, stored `(1, vocab)`. Every projection is an `nn.Linear` (`(out, in)`).
The decoder starts from `decoder_start_token_id`, which Marian sets to the padding id.
"""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from .family import Float64Fix, HFFamily
from .hf import (TO_HF_ACTIVATION as HF_NAMES, activation, architecture, boolean, integer, number, optional_integer,
                 refuse, token_id)

NAME = "hf-marian"
MODEL_TYPE = "marian"
ARCHITECTURES = ("MarianMTModel",)
BASE_PREFIX = "model."
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "d_model",
               "num_heads": "encoder_attention_heads", "num_encoder_layers": "encoder_layers",
               "num_decoder_layers": "decoder_layers", "d_ff": "encoder_ffn_dim", "max_len": "max_position_embeddings"}
# The modules whose outputs are canonical sublayers, under the base model (`verify`'s source oracle).
HOOKS = {"encoder.layers.{i}.self_attn": "encoder.layers.{i}.self_attn",
         "encoder.layers.{i}.ffn": "encoder.layers.{i}.fc2", "encoder.layers.{i}": "encoder.layers.{i}",
         "decoder.layers.{i}.self_attn": "decoder.layers.{i}.self_attn",
         "decoder.layers.{i}.cross_attn": "decoder.layers.{i}.encoder_attn",
         "decoder.layers.{i}.ffn": "decoder.layers.{i}.fc2", "decoder.layers.{i}": "decoder.layers.{i}"}

TO_HF_ACTIVATION = {**HF_NAMES, "silu": "swish"}  # Marian's own configs name SiLU "swish"
LAYER_NORM_EPS = 1e-5  # Marian's nn.LayerNorm default; config.json has no field for it

_ENC, _DEC = "model.encoder.layers.{i}.", "model.decoder.layers.{i}."
TABLE = [
    # canonical                                   MarianMTModel                                  transform
    ("src_embed.embedding",                       "model.shared.weight",                         "identity"),
    ("encoder.layers.{i}.self_attn.{qkv}.kernel", _ENC + "self_attn.{qkv}_proj.weight",          "transpose"),
    ("encoder.layers.{i}.self_attn.{qkv}.bias",   _ENC + "self_attn.{qkv}_proj.bias",            "identity"),
    ("encoder.layers.{i}.self_attn.o.kernel",     _ENC + "self_attn.out_proj.weight",            "transpose"),
    ("encoder.layers.{i}.self_attn.o.bias",       _ENC + "self_attn.out_proj.bias",              "identity"),
    ("encoder.layers.{i}.norm1.gamma",            _ENC + "self_attn_layer_norm.weight",          "identity"),
    ("encoder.layers.{i}.norm1.beta",             _ENC + "self_attn_layer_norm.bias",            "identity"),
    ("encoder.layers.{i}.ffn.linear1.kernel",     _ENC + "fc1.weight",                           "transpose"),
    ("encoder.layers.{i}.ffn.linear1.bias",       _ENC + "fc1.bias",                             "identity"),
    ("encoder.layers.{i}.ffn.linear2.kernel",     _ENC + "fc2.weight",                           "transpose"),
    ("encoder.layers.{i}.ffn.linear2.bias",       _ENC + "fc2.bias",                             "identity"),
    ("encoder.layers.{i}.norm2.gamma",            _ENC + "final_layer_norm.weight",              "identity"),
    ("encoder.layers.{i}.norm2.beta",             _ENC + "final_layer_norm.bias",                "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel", _DEC + "self_attn.{qkv}_proj.weight",          "transpose"),
    ("decoder.layers.{i}.self_attn.{qkv}.bias",   _DEC + "self_attn.{qkv}_proj.bias",            "identity"),
    ("decoder.layers.{i}.self_attn.o.kernel",     _DEC + "self_attn.out_proj.weight",            "transpose"),
    ("decoder.layers.{i}.self_attn.o.bias",       _DEC + "self_attn.out_proj.bias",              "identity"),
    ("decoder.layers.{i}.norm1.gamma",            _DEC + "self_attn_layer_norm.weight",          "identity"),
    ("decoder.layers.{i}.norm1.beta",             _DEC + "self_attn_layer_norm.bias",            "identity"),
    ("decoder.layers.{i}.cross_attn.{qkv}.kernel", _DEC + "encoder_attn.{qkv}_proj.weight",      "transpose"),
    ("decoder.layers.{i}.cross_attn.{qkv}.bias",  _DEC + "encoder_attn.{qkv}_proj.bias",         "identity"),
    ("decoder.layers.{i}.cross_attn.o.kernel",    _DEC + "encoder_attn.out_proj.weight",         "transpose"),
    ("decoder.layers.{i}.cross_attn.o.bias",      _DEC + "encoder_attn.out_proj.bias",           "identity"),
    ("decoder.layers.{i}.norm2.gamma",            _DEC + "encoder_attn_layer_norm.weight",       "identity"),
    ("decoder.layers.{i}.norm2.beta",             _DEC + "encoder_attn_layer_norm.bias",         "identity"),
    ("decoder.layers.{i}.ffn.linear1.kernel",     _DEC + "fc1.weight",                           "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",       _DEC + "fc1.bias",                             "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",     _DEC + "fc2.weight",                           "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",       _DEC + "fc2.bias",                             "identity"),
    ("decoder.layers.{i}.norm3.gamma",            _DEC + "final_layer_norm.weight",              "identity"),
    ("decoder.layers.{i}.norm3.beta",             _DEC + "final_layer_norm.bias",                "identity"),
    ("output.kernel",                             "lm_head.weight",                              "transpose"),
    ("output.bias",                               "final_logits_bias",                           "row"),
    ("src_embed.embedding",                       "model.encoder.embed_tokens.weight",           "tied"),
    ("src_embed.embedding",                       "model.decoder.embed_tokens.weight",           "tied"),
    ("src_embed.embedding",                       "lm_head.weight",                              "tied"),
    ("-",                                         "model.encoder.embed_positions.weight",        "sinusoid"),
    ("-",                                         "model.decoder.embed_positions.weight",        "sinusoid"),
]


# The final LayerNorm of each stack that the pre-norm relatives of this layout add (mBART, Pegasus): its entries
# and the modules whose outputs they are.
FINAL_NORMS = [
    ("encoder.final_norm.gamma",                  "model.encoder.layer_norm.weight",              "identity"),
    ("encoder.final_norm.beta",                   "model.encoder.layer_norm.bias",                "identity"),
    ("decoder.final_norm.gamma",                  "model.decoder.layer_norm.weight",              "identity"),
    ("decoder.final_norm.beta",                   "model.decoder.layer_norm.bias",                "identity"),
]
FINAL_NORM_HOOKS = {"encoder.final_norm": "encoder.layer_norm", "decoder.final_norm": "decoder.layer_norm"}


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    return TABLE


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Marian's `config.json`."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, True)
    refuse(hf, {"share_encoder_decoder_embeddings": True, "normalize_before": False, "add_final_layer_norm": False,
                "normalize_embedding": False, "static_position_embeddings": True})
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if integer(hf, enc) != integer(hf, dec):
            raise ValueError(f"config.json {enc}={hf[enc]} differs from {dec}={hf[dec]}; one value for both stacks "
                             "is supported")
    vocab = integer(hf, "vocab_size")
    if optional_integer(hf, "decoder_vocab_size") not in (None, vocab):
        raise ValueError(f"config.json decoder_vocab_size={hf['decoder_vocab_size']} differs from vocab_size={vocab}"
                         " (separate vocabularies are not supported)")
    pad = token_id(hf, "pad_token_id", vocab)
    if pad is None:
        raise ValueError("config.json has no pad_token_id (or it is null); Marian masks padding by this id and "
                         "starts decoding from it, so it must be a token id")
    notes = [f"layer_norm_eps={LAYER_NORM_EPS} (Marian's fixed nn.LayerNorm epsilon)"]
    start = token_id(hf, "decoder_start_token_id", vocab, default=pad)
    if start != pad:
        notes.append(f"decoder_start_token_id={start} differs from pad_token_id={pad}; decoding here starts from "
                     "what the caller passes")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(hf, "d_model"),
        num_heads=integer(hf, "encoder_attention_heads"), num_encoder_layers=integer(hf, "encoder_layers"),
        num_decoder_layers=integer(hf, "decoder_layers"), d_ff=integer(hf, "encoder_ffn_dim"),
        max_len=integer(hf, "max_position_embeddings"), dropout=number(hf, "dropout", 0.1),
        activation=activation(hf, "activation_function", "gelu"), norm_first=False, final_norm=False,
        layer_norm_eps=LAYER_NORM_EPS,
        positional="sinusoidal", sinusoid_layout="concatenated", scale_embedding=boolean(hf, "scale_embedding", False),
        bias=True, tie_embeddings=boolean(hf, "tie_word_embeddings", True), pad_id=pad, output_bias=True,
        share_embeddings=True)
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no Marian equivalent (empty if it has one)."""
    wanted = {"norm_first": False, "final_norm": False, "positional": "sinusoidal",
              "sinusoid_layout": "concatenated", "share_embeddings": True, "bias": True, "embed_norm": False,
              "output_projection": True, "head_transform": False, "layer_norm_eps": LAYER_NORM_EPS}
    problems = [f"{k}={getattr(config, k)!r} (Marian needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if not config.is_encoder_decoder:
        problems.append("not an encoder-decoder model")
    if not config.has_output_bias:
        problems.append("no output bias (Marian has final_logits_bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    hf = {"model_type": MODEL_TYPE, "architectures": ["MarianMTModel"], "vocab_size": config.src_vocab_size,
          "decoder_vocab_size": config.tgt_vocab_size, "d_model": config.d_model,
          "encoder_attention_heads": config.num_heads, "decoder_attention_heads": config.num_heads,
          "encoder_layers": config.num_encoder_layers, "decoder_layers": config.num_decoder_layers,
          "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff, "max_position_embeddings": config.max_len,
          "activation_function": TO_HF_ACTIVATION[config.activation], "scale_embedding": config.scale_embedding,
          "dropout": config.dropout, "attention_dropout": 0.0, "activation_dropout": 0.0,
          "pad_token_id": config.pad_id, "decoder_start_token_id": config.pad_id,
          "share_encoder_decoder_embeddings": True, "tie_word_embeddings": config.tie_embeddings,
          "is_encoder_decoder": True}
    return hf, "MarianMTModel"


def prefix(arch: str, keys: Collection[str] | None = None) -> str:
    return ""  # the table names full keys


def exact_sinusoids(model64, config: rn.TransformerConfig) -> None:
    """transformers builds Marian's fixed sinusoid tables in float32, even for a float64 model: the exact ones, in
    place (`verify`'s float64 run of the source)."""
    import torch

    with torch.no_grad():
        for stack in (model64.model.encoder, model64.model.decoder):
            positions = stack.embed_positions.weight
            positions.copy_(torch.as_tensor(rn.sinusoidal_positions(positions.shape[0], positions.shape[1],
                                                                    config.sinusoid_layout)))


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=("MarianMTModel", "MarianMTModel"),  # the source oracle: it always has its output layer
    hooks=HOOKS, head_hook=None, task_heads=(), expresses=(), approximations=(),
    float64_fix=Float64Fix("Marian's sinusoid tables, which transformers builds in float32, replaced by the exact ones",
                           exact_sinusoids))
