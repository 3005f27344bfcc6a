"""KerasHub BERT (`keras_hub.models.BertBackbone`, `BertMaskedLM`): a post-LN encoder with segment embeddings, an
embedding LayerNorm and a pooler, and the masked-LM head.

The math, read from keras-hub 0.32 (`keras_hub/src/models/bert/bert_backbone.py`,
`layers/modeling/transformer_encoder.py`): token + position + segment embeddings added (no scale), a
`LayerNormalization(epsilon=1e-12)`, `TransformerEncoder` layers (post-LN, `layer_norm_epsilon=1e-12`, the
tanh-approximated GELU — Hugging Face BERT uses the exact one), and a pooler `Dense(tanh)` on position
`cls_token_index` (0). The backbone returns `sequence_output` and `pooled_output`; here a bare backbone
(`output_projection=False`) with `pooler=True`.

`BertMaskedLM` (`models/bert/bert_masked_lm.py`, `layers/modeling/masked_lm_head.py`) adds a `MaskedLMHead`: a
`Dense(hidden_dim)` with the exact GELU (`intermediate_activation="gelu"`), `LayerNormalization(epsilon=1e-05)`,
then the tied token embedding (`token_embedding(x, reverse=True)`) plus a bias of its own. Here:
`head_transform=True` with `head_activation="gelu"` and `head_layer_norm_eps=1e-5` (the encoder keeps its tanh
GELU and 1e-12), `tie_embeddings=True`, `output_bias=True`; the backbone's pooler weights are kept (`pooler=True`),
as the task's preset holds them. KerasHub's head first gathers the positions in its `mask_positions` input and
predicts only those, `(B, M, vocab)`; the canonical model predicts every position, `(B, S, vocab)`, so KerasHub's
logits are the canonical ones gathered at `mask_positions` (`np.take_along_axis(logits, positions[..., None], 1)`).
The backbone's table is `kerashub_bert.toml`; the head's five weights (`task.weights.h5`) are `HEAD` below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from .approximations import Approximation, fixed_head_norm_eps
from .family import KerasHubFamily
from .kerashub_classifiers import pooled

NAME = "kerashub-bert"
PAD_TOKEN = "[PAD]"  # BertBackbone takes a padding mask: the pad id comes from the vocabulary (`preset_pad_id`)
BACKBONE = "BertBackbone"
TASKS = ("BertMaskedLM",)
CLASSIFIER = pooled("BertTextClassifier")  # one Dense on the pooled output (`kerashub_classifiers`)
LAYOUT = Path(__file__).with_name("kerashub_bert.toml")
SERIALIZED = {"BertBackbone": ("keras_hub.src.models.bert.bert_backbone", "bert_backbone"),  # class: (module, name)
              "BertMaskedLM": ("keras_hub.src.models.bert.bert_masked_lm", "bert_masked_lm")}
FIXED = {"num_decoder_layers": 0, "activation": "gelu_tanh", "layer_norm_eps": 1e-12, "norm_first": False,
         "final_norm": False, "positional": "learned", "position_offset": 0, "scale_embedding": False, "bias": True,
         "embed_norm": True, "head_transform": False, "pooler": True, "output_projection": False,
         "tie_embeddings": False}
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "num_encoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "max_len": "max_sequence_length", "type_vocab_size": "num_segments"}  # for messages
MASKED_LM = {"head_transform": True, "head_activation": "gelu", "head_layer_norm_eps": 1e-5, "output_projection": True,
             "tie_embeddings": True, "output_bias": True}  # BertMaskedLM's MaskedLMHead, over FIXED
TASK_FIELDS = {"BertMaskedLM": MASKED_LM}  # a bare BertMaskedLM .weights.h5 (its save_weights) is read as this task
HEAD = [  # MaskedLMHead's weights in task.weights.h5 (`task/` marks that file); the logits' kernel is the embedding
    ("head.dense.kernel", "task/layers/masked_lm_head/_intermediate_dense/vars/0", "identity"),
    ("head.dense.bias", "task/layers/masked_lm_head/_intermediate_dense/vars/1", "identity"),
    ("head.norm.gamma", "task/layers/masked_lm_head/_intermediate_layer_norm/vars/0", "identity"),
    ("head.norm.beta", "task/layers/masked_lm_head/_intermediate_layer_norm/vars/1", "identity"),
    ("output.bias", "task/layers/masked_lm_head/vars/0", "identity"),
]


APPROXIMATIONS = (  # what it computes where the source differs only so (`layouts.approximations`)
    Approximation("gelu_tanh", "KerasHub's BertBackbone computes tanh-approximated GELU",  # its head keeps exact GELU
                  lambda c: {"activation": "gelu_tanh", **({"head_activation": c.head_activation or "gelu"}
                                                          if c.head_transform else {})}
                  if c.activation == "gelu" else {},
                  lambda c: "the source exact GELU", "its activation", ("ffn",)),
    fixed_head_norm_eps("BertMaskedLM", MASKED_LM["head_layer_norm_eps"]),
)


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table + (HEAD if config.output_projection else [])


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `BertBackbone.get_config()` (config.json)."""
    from .hf import integer, number

    if integer(backbone, "cls_token_index", 0) != 0:
        raise ValueError(f"config.json cls_token_index={backbone['cls_token_index']!r} is not supported (the pooler "
                         "reads position 0)")
    vocab = integer(backbone, "vocabulary_size")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"),
        num_heads=integer(backbone, "num_heads"), num_encoder_layers=integer(backbone, "num_layers"),
        d_ff=integer(backbone, "intermediate_dim"), max_len=integer(backbone, "max_sequence_length"),
        type_vocab_size=integer(backbone, "num_segments"), dropout=number(backbone, "dropout", 0.1),
        pad_id=None, output_bias=False, **FIXED)  # the pad id: the preset's vocabulary or the user (load_preset)
    if task == "BertMaskedLM":
        config = config.replace(**MASKED_LM)
    return config, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub BertBackbone or BertMaskedLM (empty if it is one)."""
    wanted = {**FIXED, **MASKED_LM} if config.output_projection else \
        {**FIXED, "head_activation": None, "head_layer_norm_eps": None}
    kind = "BertMaskedLM" if config.output_projection else "BertBackbone"
    values = {**config.to_dict(), "output_bias": config.has_output_bias}  # output_bias=None: the same as bias
    problems = [f"{k}={values[k]!r} (KerasHub {kind} has {v!r})" for k, v in wanted.items() if values[k] != v]
    if config.type_vocab_size < 1:
        problems.append("type_vocab_size=0 (BertBackbone always has segment embeddings)")
    if config.output_projection and config.tgt_vocab_size != config.src_vocab_size:
        problems.append(f"tgt_vocab_size={config.tgt_vocab_size} != src_vocab_size={config.src_vocab_size} "
                        "(BertMaskedLM predicts the input vocabulary)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(BertBackbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = {"vocabulary_size": config.src_vocab_size, "num_layers": config.num_encoder_layers,
                "num_heads": config.num_heads, "hidden_dim": config.d_model, "intermediate_dim": config.d_ff,
                "dropout": config.dropout, "max_sequence_length": config.max_len,
                "num_segments": config.type_vocab_size}  # KerasHub 0.32 writes no cls_token_index (always 0)
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS, pad_token=PAD_TOKEN,
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=CLASSIFIER,
    predicts_mask_positions=TASKS,  # BertMaskedLM predicts its mask_positions only: the canonical logits gathered
    expresses=(), approximations=APPROXIMATIONS)
