"""Hugging Face BERT (`BertForMaskedLM`, `BertModel`): a post-LN encoder with a LayerNorm on the embeddings.

Token + learned position + segment embeddings, then `embeddings.LayerNorm`; each layer's attention and FFN are
`nn.Linear`s (`(out, in)`, transposed to canonical kernels). `BertForMaskedLM`'s head is `cls.predictions.transform`
(dense -> activation -> LayerNorm) and a decoder tied to the word embeddings with its own bias
(`cls.predictions.bias`); it has no pooler. `BertModel` is the bare backbone with a pooler (dense + tanh on the first
position); its logits are the final hidden states.
"""

from __future__ import annotations

from typing import Any, Collection

import reference_numpy as rn

from .family import HFFamily
from .hf import TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, prefix_rule, refuse, token_id
from .hf_tasks import Head, causal_lm, encoder_heads, linear

NAME = "hf-bert"
MODEL_TYPE = "bert"
ARCHITECTURES = ("BertForMaskedLM", "BertModel")
BASE_PREFIX = "bert."  # where BertForMaskedLM keeps its BertModel
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_size",
               "num_heads": "num_attention_heads", "num_encoder_layers": "num_hidden_layers",
               "d_ff": "intermediate_size", "max_len": "max_position_embeddings", "type_vocab_size": "type_vocab_size"}


_LAYER = "encoder.layer.{i}."
BACKBONE = [
    # canonical                                   BertModel                                          transform
    ("src_embed.embedding",                       "embeddings.word_embeddings.weight",               "identity"),
    ("src_pos.embedding",                         "embeddings.position_embeddings.weight",           "identity"),
    ("src_type.embedding",                        "embeddings.token_type_embeddings.weight",         "identity"),
    ("src_embed_norm.gamma",                      "embeddings.LayerNorm.weight",                     "identity"),
    ("src_embed_norm.beta",                       "embeddings.LayerNorm.bias",                       "identity"),
    ("encoder.layers.{i}.self_attn.q.kernel",     _LAYER + "attention.self.query.weight",            "transpose"),
    ("encoder.layers.{i}.self_attn.q.bias",       _LAYER + "attention.self.query.bias",              "identity"),
    ("encoder.layers.{i}.self_attn.k.kernel",     _LAYER + "attention.self.key.weight",              "transpose"),
    ("encoder.layers.{i}.self_attn.k.bias",       _LAYER + "attention.self.key.bias",                "identity"),
    ("encoder.layers.{i}.self_attn.v.kernel",     _LAYER + "attention.self.value.weight",            "transpose"),
    ("encoder.layers.{i}.self_attn.v.bias",       _LAYER + "attention.self.value.bias",              "identity"),
    ("encoder.layers.{i}.self_attn.o.kernel",     _LAYER + "attention.output.dense.weight",          "transpose"),
    ("encoder.layers.{i}.self_attn.o.bias",       _LAYER + "attention.output.dense.bias",            "identity"),
    ("encoder.layers.{i}.norm1.gamma",            _LAYER + "attention.output.LayerNorm.weight",      "identity"),
    ("encoder.layers.{i}.norm1.beta",             _LAYER + "attention.output.LayerNorm.bias",        "identity"),
    ("encoder.layers.{i}.ffn.linear1.kernel",     _LAYER + "intermediate.dense.weight",              "transpose"),
    ("encoder.layers.{i}.ffn.linear1.bias",       _LAYER + "intermediate.dense.bias",                "identity"),
    ("encoder.layers.{i}.ffn.linear2.kernel",     _LAYER + "output.dense.weight",                    "transpose"),
    ("encoder.layers.{i}.ffn.linear2.bias",       _LAYER + "output.dense.bias",                      "identity"),
    ("encoder.layers.{i}.norm2.gamma",            _LAYER + "output.LayerNorm.weight",                "identity"),
    ("encoder.layers.{i}.norm2.beta",             _LAYER + "output.LayerNorm.bias",                  "identity"),
    ("pooler.kernel",                             "pooler.dense.weight",                             "transpose"),
    ("pooler.bias",                               "pooler.dense.bias",                               "identity"),
    ("-",                                         "embeddings.position_ids",                         "position_ids"),
    ("-",                                         "embeddings.token_type_ids",                       "zero_type_ids"),
]
HEAD = [
    ("head.dense.kernel",                         "cls.predictions.transform.dense.weight",          "transpose"),
    ("head.dense.bias",                           "cls.predictions.transform.dense.bias",            "identity"),
    ("head.norm.gamma",                           "cls.predictions.transform.LayerNorm.weight",      "identity"),
    ("head.norm.beta",                            "cls.predictions.transform.LayerNorm.bias",        "identity"),
    ("output.kernel",                             "cls.predictions.decoder.weight",                  "transpose"),
    ("output.bias",                               "cls.predictions.bias",                            "identity"),
    ("src_embed.embedding",                       "cls.predictions.decoder.weight",                  "tied"),
    ("output.bias",                               "cls.predictions.decoder.bias",                    "tied"),
    ("-",                                         "cls.seq_relationship.weight",                     "ignore"),  # NSP
    ("-",                                         "cls.seq_relationship.bias",                       "ignore"),  # head
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose BertModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from BERT's `config.json` (and the saved key names: whether a pooler is
    there is not in the config)."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, any(k.startswith(("cls.", BASE_PREFIX)) for k in keys))
    refuse(hf, {"is_decoder": False, "add_cross_attention": False, "position_embedding_type": "absolute"})
    mlm = arch == "BertForMaskedLM"
    vocab = integer(hf, "vocab_size")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(hf, "hidden_size"),
        num_heads=integer(hf, "num_attention_heads"), num_encoder_layers=integer(hf, "num_hidden_layers"),
        num_decoder_layers=0, d_ff=integer(hf, "intermediate_size"), max_len=integer(hf, "max_position_embeddings"),
        dropout=number(hf, "hidden_dropout_prob", 0.1), activation=activation(hf, "hidden_act", "gelu"),
        norm_first=False, final_norm=False, layer_norm_eps=number(hf, "layer_norm_eps", 1e-12), positional="learned",
        scale_embedding=False, bias=True, tie_embeddings=mlm and boolean(hf, "tie_word_embeddings", True),
        pad_id=token_id(hf, "pad_token_id", vocab, default=0) or 0, output_bias=mlm, output_projection=mlm,
        type_vocab_size=integer(hf, "type_vocab_size", 2), embed_norm=True, head_transform=mlm,
        pooler=not mlm and any(k.endswith("pooler.dense.weight") for k in keys))
    notes = [] if mlm else [f"BertModel {'with' if config.pooler else 'without'} a pooler (from the saved weights)"]
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no BERT equivalent (empty if it has one)."""
    return encoder_problems(config, "BERT", {"position_offset": 0}, pooled_base=True, segments=True)


def encoder_problems(config: rn.TransformerConfig, family: str, wanted: dict[str, Any], pooled_base: bool,
                     segments: bool, head_activation: str | None = None) -> list[str]:
    """Why `config` has no equivalent in a BERT-like encoder family (BERT, RoBERTa, DistilBERT): `wanted` holds the
    family's own fixed settings, `pooled_base` whether its bare model always has a pooler (else never), `segments`
    whether it has segment embeddings, `head_activation` its head's fixed activation (None: the encoder's)."""
    wanted = {"num_decoder_layers": 0, "norm_first": False, "final_norm": False, "positional": "learned",
              "scale_embedding": False, "bias": True, "embed_norm": True, **wanted}
    problems = [f"{k}={getattr(config, k)!r} ({family} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.output_projection and not (config.head_transform and config.has_output_bias and not config.pooler):
        problems.append(f"an output projection without head_transform and an output bias, or with a pooler (not "
                        f"{family}'s masked-LM model)")
    if not config.output_projection and config.pooler != pooled_base:
        always = "always" if pooled_base else "never"
        problems.append(f"pooler={config.pooler} (transformers' bare {family} model {always} has a pooler)")
    fixed = (("head_activation", config.activation if head_activation is None else head_activation, "activation"),
             ("head_layer_norm_eps", config.layer_norm_eps, "layer_norm_eps"))
    for field, value, encoder in fixed:
        if config.head_transform and (getattr(config, field) or getattr(config, encoder)) != value:
            problems.append(f"{field}={getattr(config, field) or getattr(config, encoder)!r} ({family}'s head uses "
                            + (f"{value!r})" if field == "head_activation" and head_activation else
                               f"the encoder's {encoder}={value!r})"))
    if segments and config.type_vocab_size < 1:
        problems.append(f"type_vocab_size=0 ({family} has segment embeddings)")
    if not segments and config.type_vocab_size:
        problems.append(f"type_vocab_size={config.type_vocab_size} ({family} has no segment embeddings)")
    if config.output_projection and config.tgt_vocab_size != config.src_vocab_size:
        problems.append(f"tgt_vocab_size={config.tgt_vocab_size} != src_vocab_size={config.src_vocab_size}")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = "BertForMaskedLM" if config.output_projection else "BertModel"
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.src_vocab_size,
          "hidden_size": config.d_model, "num_attention_heads": config.num_heads,
          "num_hidden_layers": config.num_encoder_layers, "intermediate_size": config.d_ff,
          "max_position_embeddings": config.max_len, "hidden_act": TO_HF_ACTIVATION[config.activation],
          "layer_norm_eps": config.layer_norm_eps, "hidden_dropout_prob": config.dropout,
          "attention_probs_dropout_prob": config.dropout, "type_vocab_size": config.type_vocab_size,
          "pad_token_id": config.pad_id, "position_embedding_type": "absolute",
          "tie_word_embeddings": config.tie_embeddings if config.output_projection else True}
    return hf, arch


# Where the BertModel sits: under `bert.` in a BertForMaskedLM, at the top in a bare BertModel; when reading,
# wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm="BertForMaskedLM")


# The task classes (`hf_tasks`): sequence scores from the pooler; token and span scores from every position (their
# BertModel has no pooler); pretraining: the masked-LM model plus two next-sentence scores from the pooler;
# next-sentence prediction alone: those two scores beside the bare model's hidden states; the causal LM: the
# masked-LM model with causal self-attention.
TASK_HEADS = encoder_heads("Bert", {"classifier_input": "pooler", "pooler": True}, linear("classifier", "classifier"),
                           pooled_base=True) + (
    Head("BertForPreTraining", "BertForMaskedLM", {"next_sentence": True, "pooler": True, "output_projection": True},
         linear("next_sentence", "cls.seq_relationship"), {"pooler": False}),
    Head("BertForNextSentencePrediction", "BertModel", {"next_sentence": True, "pooler": True,
                                                         "output_projection": False},
         linear("next_sentence", "cls.seq_relationship")),
    causal_lm("BertLMHeadModel", "BertForMaskedLM"))


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    # the source oracle (`verify`): transformers' class with an output projection and without one, the modules whose
    # outputs are canonical sublayers, under the base model, and the head transform's (dense -> activation -> norm)
    transformers_classes=("BertForMaskedLM", "BertModel"),
    hooks={"encoder.layers.{i}.self_attn": "encoder.layer.{i}.attention.output.dense",
           "encoder.layers.{i}.ffn": "encoder.layer.{i}.output.dense", "encoder.layers.{i}": "encoder.layer.{i}"},
    head_hook="cls.predictions.transform", task_heads=TASK_HEADS,
    expresses=("causal_encoder",),  # `layouts.FAMILY_ONLY` settings it has (through BertLMHeadModel)
    approximations=(), float64_fix=None)
