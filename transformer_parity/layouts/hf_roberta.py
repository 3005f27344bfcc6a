"""Hugging Face RoBERTa (`RobertaForMaskedLM`, `RobertaModel`): BERT's encoder under BERT's names, with RoBERTa's
positions and its own masked-LM head.

The backbone is `hf_bert.BACKBONE` (under `roberta.` in the masked-LM model). Positions are fairseq's: transformers'
`create_position_ids_from_input_ids` gives the k-th non-pad token of a row (k = 0, 1, ...) position
`pad_token_id + 1 + k` and every pad token position `pad_token_id`, so the import sets `positions_skip_pad` with
`position_offset = pad_token_id + 1`, and `max_len = max_position_embeddings - pad_token_id - 1` (the rows a real
token can read). The head is `lm_head`: dense -> GELU (the exact one, whatever `hidden_act` says) -> `layer_norm`, and
a decoder tied to the word embeddings with its own bias (`lm_head.bias`). `RobertaModel` has a pooler; its logits are
the final hidden states.

XLM-RoBERTa (`hf_xlm_roberta`) is this module with its own model type and class names (`Names`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection

import reference_numpy as rn

from . import hf_bert
from .family import HFFamily
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, prefix_rule, refuse,
                 token_id)
from .hf_tasks import causal_lm, encoder_heads, linear

NAME = "hf-roberta"
MODEL_TYPE = "roberta"
ARCHITECTURES = ("RobertaForMaskedLM", "RobertaModel")
BASE_PREFIX = "roberta."  # where RobertaForMaskedLM keeps its RobertaModel
CONFIG_KEYS = {**hf_bert.CONFIG_KEYS, "max_len": "max_position_embeddings", "position_offset": "pad_token_id"}
# `layouts.FAMILY_ONLY` settings it has (causal_encoder: through its causal LM)
EXPRESSES = ("positions_skip_pad", "causal_encoder")
HEAD_HOOK = "lm_head.layer_norm"  # the head transform's output (dense -> GELU -> LayerNorm), under the model
HEAD_ACTIVATION = "gelu"  # RobertaLMHead calls transformers' `gelu` (erf) whatever hidden_act is
PAD_DEFAULT = 1  # RobertaConfig's pad_token_id when config.json has none

HEAD = [
    # canonical                                   RobertaForMaskedLM                                 transform
    ("head.dense.kernel",                         "lm_head.dense.weight",                            "transpose"),
    ("head.dense.bias",                           "lm_head.dense.bias",                              "identity"),
    ("head.norm.gamma",                           "lm_head.layer_norm.weight",                       "identity"),
    ("head.norm.beta",                            "lm_head.layer_norm.bias",                         "identity"),
    ("output.kernel",                             "lm_head.decoder.weight",                          "transpose"),
    ("output.bias",                               "lm_head.bias",                                    "identity"),
    ("src_embed.embedding",                       "lm_head.decoder.weight",                          "tied"),
    ("output.bias",                               "lm_head.decoder.bias",                            "tied"),
]


@dataclass(frozen=True)
class Names:
    """One RoBERTa-architecture family's names (RoBERTa, XLM-RoBERTa)."""

    name: str  # our format name
    model_type: str
    architectures: tuple[str, str]  # the masked-LM class, the bare model


ROBERTA = Names(NAME, MODEL_TYPE, ARCHITECTURES)


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose RobertaModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in hf_bert.BACKBONE] + HEAD


def read_config(hf: dict[str, Any], keys: Collection[str], family: Names) -> tuple[rn.TransformerConfig, str,
                                                                                     list[str]]:
    """`(config, architecture, notes)` from a RoBERTa-architecture `config.json` (and the saved key names)."""
    arch = architecture(hf, family.model_type, family.architectures,
                        any(k.startswith(("lm_head.", BASE_PREFIX)) for k in keys))
    refuse(hf, {"is_decoder": False, "add_cross_attention": False, "position_embedding_type": "absolute"})
    mlm = arch == family.architectures[0]
    notes = [] if mlm else [f"{arch} {'with' if any(k.endswith('pooler.dense.weight') for k in keys) else 'without'}"
                            " a pooler (from the saved weights)"]
    vocab = integer(hf, "vocab_size")
    if "pad_token_id" in hf and hf["pad_token_id"] is None:
        raise ValueError(f"config.json pad_token_id=None is not supported ({family.model_type} numbers its positions "
                         "from the pad token id)")
    if "pad_token_id" not in hf:
        notes.append(f"config.json has no pad_token_id: {family.model_type}'s default {PAD_DEFAULT}")
    pad = token_id(hf, "pad_token_id", vocab, default=PAD_DEFAULT)
    rows = integer(hf, "max_position_embeddings")
    if rows <= pad + 1:
        raise ValueError(f"config.json max_position_embeddings={rows} leaves no position for a real token (the first "
                         f"reads row pad_token_id + 1 = {pad + 1})")
    type_vocab = integer(hf, "type_vocab_size", 2)
    if type_vocab < 1:
        raise ValueError(f"config.json type_vocab_size={type_vocab} is not supported ({family.model_type} always "
                         "adds a token type embedding)")
    act = activation(hf, "hidden_act", "gelu")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(hf, "hidden_size"),
        num_heads=integer(hf, "num_attention_heads"), num_encoder_layers=integer(hf, "num_hidden_layers"),
        num_decoder_layers=0, d_ff=integer(hf, "intermediate_size"), max_len=rows - pad - 1,
        dropout=number(hf, "hidden_dropout_prob", 0.1), activation=act, norm_first=False, final_norm=False,
        layer_norm_eps=number(hf, "layer_norm_eps", 1e-12), positional="learned", position_offset=pad + 1,
        positions_skip_pad=True, scale_embedding=False, bias=True,
        tie_embeddings=mlm and boolean(hf, "tie_word_embeddings", True), pad_id=pad, output_bias=mlm,
        output_projection=mlm, type_vocab_size=type_vocab, embed_norm=True, head_transform=mlm,
        head_activation=HEAD_ACTIVATION if mlm and act != HEAD_ACTIVATION else None,
        pooler=not mlm and any(k.endswith("pooler.dense.weight") for k in keys))
    return config, arch, notes


def problems_for(config: rn.TransformerConfig, family: Names) -> list[str]:
    """Why `config` has no equivalent in a RoBERTa-architecture family (empty if it has one)."""
    wanted = {"positions_skip_pad": True}
    if config.pad_id is not None:
        wanted["position_offset"] = config.pad_id + 1
    return hf_bert.encoder_problems(config, family.model_type, wanted, pooled_base=True, segments=True,
                                    head_activation=HEAD_ACTIVATION)


def write_config(config: rn.TransformerConfig, family: Names) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `problems_for` accepts."""
    arch = family.architectures[0 if config.output_projection else 1]
    hf = {"model_type": family.model_type, "architectures": [arch], "vocab_size": config.src_vocab_size,
          "hidden_size": config.d_model, "num_attention_heads": config.num_heads,
          "num_hidden_layers": config.num_encoder_layers, "intermediate_size": config.d_ff,
          "max_position_embeddings": config.position_rows, "hidden_act": TO_HF_ACTIVATION[config.activation],
          "layer_norm_eps": config.layer_norm_eps, "hidden_dropout_prob": config.dropout,
          "attention_probs_dropout_prob": config.dropout, "type_vocab_size": config.type_vocab_size,
          "pad_token_id": config.pad_id, "position_embedding_type": "absolute", "is_decoder": False,
          "tie_word_embeddings": config.tie_embeddings if config.output_projection else True}
    return hf, arch


def prefix_for(arch: str, keys: Collection[str] | None, family: Names) -> str:
    """Where the base model sits: under `roberta.` in the masked-LM class, at the top in the bare model; when
    reading, wherever the saved keys put it."""
    return prefix_rule(BASE_PREFIX, lm=family.architectures[0])(arch, keys)


def functions(family: Names) -> dict[str, Callable]:
    """A RoBERTa-architecture family's config and table hooks, by their `HFFamily` field names (`table`,
    `config_from_hf`, `export_problems`, `config_to_hf`, `prefix`)."""
    return {"table": table, "config_from_hf": lambda hf, keys: read_config(hf, keys, family),
            "export_problems": lambda config: problems_for(config, family),
            "config_to_hf": lambda config: write_config(config, family),
            "prefix": lambda arch, keys=None: prefix_for(arch, keys, family)}


# The task classes (`hf_tasks`): the sequence head reads position 0 through `classifier.dense` and tanh, then
# `classifier.out_proj`; none has a pooler.
SEQUENCE_HEAD = ({"classifier_input": "first", "classifier_dense": "tanh", "pooler": False},
                 linear("classifier.dense", "classifier.dense") + linear("classifier", "classifier.out_proj"))
CHOICE_HEAD = ({"classifier_input": "pooler", "pooler": True}, linear("classifier", "classifier"))  # its pooler
TASK_HEADS = encoder_heads("Roberta", *SEQUENCE_HEAD, pooled_base=True, choice=CHOICE_HEAD) + (
    causal_lm("RobertaForCausalLM", "RobertaForMaskedLM"),)



FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    **functions(ROBERTA),  # table, config_from_hf, export_problems, config_to_hf, prefix
    config_keys=CONFIG_KEYS, base_prefix=BASE_PREFIX,
    # the source oracle (`verify`): with an output projection, without one; BERT's sublayers, and the head
    # transform's output (dense -> GELU -> LayerNorm), under the model
    transformers_classes=ARCHITECTURES, hooks=hf_bert.FAMILY.hooks, head_hook=HEAD_HOOK, task_heads=TASK_HEADS,
    expresses=EXPRESSES, approximations=(), float64_fix=None)
