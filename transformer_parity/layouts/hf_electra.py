"""Hugging Face ELECTRA (`ElectraForMaskedLM`, `ElectraModel`): BERT's post-LN encoder (`hf_bert`'s layer names)
with embeddings `embedding_size` wide, projected to `hidden_size` by `embeddings_project` where the two differ
(canonical `embedding_size` and `src_embed_proj`, as ALBERT's), and no pooler.

The masked-LM head (the generator's) `generator_predictions` maps back: `dense` (hidden -> embedding_size) -> GELU
(erf; ELECTRA calls it whatever `hidden_act` says) -> `LayerNorm`, then `generator_lm_head`, tied to the word
embeddings, with its own bias. The task heads read the first position through a dense layer and GELU
(`classifier.dense`, `classifier.out_proj`; multiple choice: `sequence_summary.summary`, then `classifier`).
`ElectraForPreTraining` (the discriminator's per-token score) is refused in one line: it is not implemented here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Collection

import reference_numpy as rn

from . import hf_bert
from .family import HFFamily
from .hf import TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, prefix_rule, refuse, token_id
from .hf_tasks import encoder_heads, linear

NAME = "hf-electra"
MODEL_TYPE = "electra"
ARCHITECTURES = ("ElectraForMaskedLM", "ElectraModel")
BASE_PREFIX = "electra."  # where ElectraForMaskedLM keeps its ElectraModel
CONFIG_KEYS = {**hf_bert.CONFIG_KEYS, "embedding_size": "embedding_size"}
HEAD_ACTIVATION = "gelu"  # ElectraGeneratorPredictions' activation, whatever hidden_act is
HEAD_HOOK = "generator_predictions.LayerNorm"  # the head transform's output, under the model

PROJECTION = [
    ("src_embed_proj.kernel",                     "embeddings_project.weight",                       "transpose"),
    ("src_embed_proj.bias",                       "embeddings_project.bias",                         "identity"),
]
HEAD = [
    # canonical                                   ElectraForMaskedLM                                 transform
    ("head.dense.kernel",                         "generator_predictions.dense.weight",              "transpose"),
    ("head.dense.bias",                           "generator_predictions.dense.bias",                "identity"),
    ("head.norm.gamma",                           "generator_predictions.LayerNorm.weight",          "identity"),
    ("head.norm.beta",                            "generator_predictions.LayerNorm.bias",            "identity"),
    ("output.kernel",                             "generator_lm_head.weight",                        "transpose"),
    ("output.bias",                               "generator_lm_head.bias",                          "identity"),
    ("src_embed.embedding",                       "generator_lm_head.weight",                        "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose ElectraModel sits under `prefix` (BERT's names, no pooler)."""
    backbone = [entry for entry in hf_bert.BACKBONE if not entry[0].startswith("pooler.")]
    backbone += PROJECTION if config.embedding_size is not None else []
    return [(c, prefix + e, t) for c, e, t in backbone] + HEAD


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from ELECTRA's `config.json`."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, any(k.startswith(("generator_", BASE_PREFIX)) for k in keys))
    refuse(hf, {"is_decoder": False, "add_cross_attention": False, "position_embedding_type": "absolute"})
    mlm = arch == ARCHITECTURES[0]
    vocab, hidden = integer(hf, "vocab_size"), integer(hf, "hidden_size")
    embedding = integer(hf, "embedding_size", 128)
    type_vocab = integer(hf, "type_vocab_size", 2)
    if type_vocab < 1:
        raise ValueError(f"config.json type_vocab_size={type_vocab} is not supported (ELECTRA always adds a token "
                         "type embedding)")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=hidden, num_heads=integer(hf, "num_attention_heads"),
        num_encoder_layers=integer(hf, "num_hidden_layers"), num_decoder_layers=0,
        d_ff=integer(hf, "intermediate_size"), max_len=integer(hf, "max_position_embeddings"),
        dropout=number(hf, "hidden_dropout_prob", 0.1), activation=activation(hf, "hidden_act", "gelu"),
        norm_first=False, final_norm=False, layer_norm_eps=number(hf, "layer_norm_eps", 1e-12), positional="learned",
        scale_embedding=False, bias=True, tie_embeddings=mlm and boolean(hf, "tie_word_embeddings", True),
        pad_id=token_id(hf, "pad_token_id", vocab, default=0), output_bias=mlm, output_projection=mlm,
        type_vocab_size=type_vocab, embed_norm=True, head_transform=mlm,
        head_activation=HEAD_ACTIVATION if mlm else None, pooler=False,
        embedding_size=None if embedding == hidden else embedding)
    return config, arch, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no ELECTRA equivalent (empty if it has one)."""
    problems = hf_bert.encoder_problems(config, "ELECTRA", {"position_offset": 0, "shared_layers": False},
                                        pooled_base=False, segments=True, head_activation=HEAD_ACTIVATION)
    if config.pooler:
        problems.append("pooler=True (ELECTRA has no pooler)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.src_vocab_size,
          "embedding_size": config.embedding_size or config.d_model, "hidden_size": config.d_model,
          "num_attention_heads": config.num_heads, "num_hidden_layers": config.num_encoder_layers,
          "intermediate_size": config.d_ff, "max_position_embeddings": config.max_len,
          "hidden_act": TO_HF_ACTIVATION[config.activation], "layer_norm_eps": config.layer_norm_eps,
          "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.dropout,
          "type_vocab_size": config.type_vocab_size, "pad_token_id": config.pad_id,
          "position_embedding_type": "absolute",
          "tie_word_embeddings": config.tie_embeddings if config.output_projection else True}
    return hf, arch


# Where the ElectraModel sits: under `electra.` in the task classes, at the top in a bare ElectraModel; when
# reading, wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, bare=ARCHITECTURES[1])


# The task classes (`hf_tasks`): sequence scores from the first position through `classifier.dense` and GELU;
# multiple choice the same through `sequence_summary` (transformers' SequenceSummary, first position, projected,
# GELU), then `classifier`; token and span scores from every position.
_FIRST = {"classifier_input": "first", "classifier_dense": "gelu", "pooler": False}
SEQUENCE_HEAD = (_FIRST, linear("classifier.dense", "classifier.dense") + linear("classifier", "classifier.out_proj"))
CHOICE_HEAD = (_FIRST, linear("classifier.dense", "sequence_summary.summary") + linear("classifier", "classifier"))
# SequenceSummary computes this head only under ElectraConfig's summary settings (summary_proj_to_labels unset)
SUMMARY_KEYS = {"summary_type": ("first", "first"), "summary_use_proj": (True, True),
                "summary_activation": ("gelu", "gelu"), "summary_proj_to_labels": (False, False)}
TASK_HEADS = tuple(replace(head, hf_keys=SUMMARY_KEYS) if head.arch.endswith("MultipleChoice") else head
                   for head in encoder_heads("Electra", *SEQUENCE_HEAD, pooled_base=False, choice=CHOICE_HEAD))


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    # the source oracle (`verify`): with an output projection, without one; BERT's sublayers, and the head
    # transform's output, under the model
    transformers_classes=ARCHITECTURES, hooks=hf_bert.FAMILY.hooks, head_hook=HEAD_HOOK, task_heads=TASK_HEADS,
    expresses=("embedding_size",), approximations=(), float64_fix=None)
