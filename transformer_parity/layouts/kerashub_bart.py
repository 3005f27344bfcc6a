"""KerasHub BART (`keras_hub.models.BartBackbone`, `BartSeq2SeqLM`): the post-LN encoder-decoder of
`facebook/bart-*`, the same function as transformers' `BartForConditionalGeneration` in another layout.

The math, read from keras-hub 0.32 (`keras_hub/src/models/bart/bart_backbone.py`, `bart_seq_2_seq_lm.py`,
`layers/modeling/transformer_encoder.py`, `transformer_decoder.py`): one `ReversibleEmbedding` token table for both
stacks; per stack a learned `PositionEmbedding` of `max_sequence_length` rows read from row 0, added to the tokens
unscaled, then `LayerNormalization(epsilon=1e-5)`; `num_layers` encoder layers and as many decoder layers (one
count for both), post-LN, `layer_norm_epsilon=1e-5`, Keras's exact (erf) `gelu`, biases everywhere; no norm after
either stack; padding masks are inputs (the pad id is `<pad>`'s in the tokenizer's vocabulary.json, BART's 1).
`BartSeq2SeqLM`'s logits are the token table reversed (tied), without a bias. The backbone returns the decoder's
sequence output (and the encoder's, which the canonical model does not return).

Where it differs from transformers' BART only in form, the canonical config is transformers' (`hf_bart`), so a
preset exports to `hf-bart` and back: transformers reads position p at row p + 2 of a `max_position_embeddings + 2`
row table (`position_offset=2`), and KerasHub's converter slices those two rows off; here the two unread rows are put
back as zeros on reading and taken off on writing. transformers adds `final_logits_bias`; a `BartSeq2SeqLM` reads
as a zero logits bias (`output_bias=True`), and only a zero one is written back. The table is `kerashub_bart.toml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import reference_numpy as rn

from .family import KerasHubFamily
from .hf_bart import POSITION_OFFSET
from .kerashub_llama import unknown_keys

NAME = "kerashub-bart"
PAD_TOKEN = "<pad>"  # the backbone takes padding masks: the pad id is the vocabulary's (`preset_pad_id`)
BACKBONE = "BartBackbone"
TASKS = ("BartSeq2SeqLM",)
LAYOUT = Path(__file__).with_name("kerashub_bart.toml")
SERIALIZED = {"BartBackbone": ("keras_hub.src.models.bart.bart_backbone", "bart_backbone"),
              "BartSeq2SeqLM": ("keras_hub.src.models.bart.bart_seq_2_seq_lm", "bart_seq2_seq_lm")}
KEYS = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim", "dropout",
        "max_sequence_length")  # BartBackbone.get_config() in keras-hub 0.32
FIXED = {"activation": "gelu", "layer_norm_eps": 1e-5, "norm_first": False, "final_norm": False,
         "positional": "learned", "position_offset": POSITION_OFFSET, "positions_skip_pad": False,
         "scale_embedding": False, "embed_norm": True, "share_embeddings": True, "head_transform": False,
         "type_vocab_size": 0, "pooler": False, "embedding_size": None, "shared_layers": False, "norm": "layer",
         "norm_weight_offset": 0.0, "ffn_gated": False, "num_kv_heads": None, "head_size": None, "qk_norm": False,
         "sliding_window": None}
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "num_encoder_layers": "num_layers", "num_decoder_layers": "num_layers",
               "d_ff": "intermediate_dim", "max_len": "max_sequence_length"}  # for messages
SEQ2SEQ_LM = {"output_projection": True, "tie_embeddings": True, "output_bias": True}  # the logits bias: zero
BACKBONE_ONLY = {"output_projection": False, "tie_embeddings": False, "output_bias": False}
POSITIONS = ("layers/position_embedding_0/vars/0", "layers/position_embedding_1/vars/0")  # encoder's, decoder's
ZERO_BIAS = "<zero logits bias>"  # what output.bias reads from: BartSeq2SeqLM has none


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table + ([("output.bias", ZERO_BIAS, "identity")] if config.has_output_bias else [])


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `BartBackbone.get_config()` (config.json); a key keras-hub 0.32 does not write is
    refused."""
    from .hf import integer, number

    unknown_keys(backbone, KEYS, BACKBONE)
    vocab, layers = integer(backbone, "vocabulary_size"), integer(backbone, "num_layers")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"),
        num_heads=integer(backbone, "num_heads"), num_encoder_layers=layers, num_decoder_layers=layers,
        d_ff=integer(backbone, "intermediate_dim"), max_len=integer(backbone, "max_sequence_length", 1024),
        dropout=number(backbone, "dropout", 0.1), bias=True, pad_id=None,  # the pad id: the vocabulary or the user
        **FIXED, **(SEQ2SEQ_LM if task else BACKBONE_ONLY))
    return config, [f"position tables read at position + {POSITION_OFFSET}, as transformers' BART, with two zero "
                    "rows before KerasHub's (never read)"] + (["a zero logits bias (BartSeq2SeqLM has none)"]
                                                               if task else [])


def to_canonical_state(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
    """The preset's arrays in canonical form, in place: each position table after `POSITION_OFFSET` zero rows, and
    for a `BartSeq2SeqLM` a zero logits bias."""
    for key in POSITIONS:
        if key in state and np.shape(state[key]) == (config.max_len, config.d_model):  # else the shape check says
            rows = np.asarray(state[key])
            state[key] = np.concatenate([np.zeros((POSITION_OFFSET, rows.shape[1]), rows.dtype), rows])
    if config.has_output_bias:  # in the token table's dtype (a missing table is refused by the import)
        tokens = state.get("layers/reversible_embedding/vars/0")
        state[ZERO_BIAS] = np.zeros(config.tgt_vocab_size, np.float32 if tokens is None else tokens.dtype)


def from_canonical_state(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
    """The inverse of `to_canonical_state`, in place: the position tables without their unread rows; a nonzero
    logits bias is refused (`BartSeq2SeqLM` has none)."""
    for key in POSITIONS:
        state[key] = np.ascontiguousarray(np.asarray(state[key])[POSITION_OFFSET:])
    bias = state.pop(ZERO_BIAS, None)
    if bias is not None and np.any(np.asarray(bias)):
        raise ValueError(f"output.bias is not zero (max |x| {float(np.max(np.abs(bias))):.3g}): KerasHub "
                         "BartSeq2SeqLM's logits have no bias")


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub BartBackbone or BartSeq2SeqLM (empty if it is one)."""
    cls = "BartSeq2SeqLM" if config.output_projection else "BartBackbone"
    problems = [f"{k}={getattr(config, k)!r} (KerasHub {cls} has {v!r})" for k, v in FIXED.items()
                if getattr(config, k) != v]
    if not config.is_encoder_decoder:
        problems.append("not an encoder-decoder model")
    elif config.num_encoder_layers != config.num_decoder_layers:
        problems.append(f"num_encoder_layers={config.num_encoder_layers} != num_decoder_layers="
                        f"{config.num_decoder_layers} (BartBackbone's num_layers is both)")
    if not (config.has_qkv_bias and config.has_o_bias and config.has_ffn_bias):
        problems.append("attention or feed-forward without biases (KerasHub BART has them all)")
    if config.output_projection and not config.tie_embeddings:
        problems.append("tie_embeddings=False (BartSeq2SeqLM's logits are the token table reversed)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(BartBackbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = {"vocabulary_size": config.src_vocab_size, "num_layers": config.num_encoder_layers,
                "num_heads": config.num_heads, "hidden_dim": config.d_model, "intermediate_dim": config.d_ff,
                "dropout": config.dropout, "max_sequence_length": config.max_len}
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields={}, pad_token=PAD_TOKEN,
    layout=LAYOUT, table=table, settle_from_weights=None,
    to_canonical_state=to_canonical_state, from_canonical_state=from_canonical_state,  # the position tables' rows
    classifier=None, predicts_mask_positions=(), expresses=(), approximations=())
