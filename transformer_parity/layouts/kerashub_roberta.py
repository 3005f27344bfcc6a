"""KerasHub RoBERTa (`keras_hub.models.RobertaBackbone`, `RobertaMaskedLM`): a post-LN encoder without segment
embeddings or a pooler, whose positions are plain 0..T-1.

The math, read from keras-hub 0.32 (`keras_hub/src/models/roberta/roberta_backbone.py`): `TokenAndPositionEmbedding`
(token + position, added; `PositionEmbedding` slices rows 0..T-1 of its `max_sequence_length` table), a
`LayerNormalization(epsilon=1e-5)`, `TransformerEncoder` layers (post-LN, `layer_norm_epsilon=1e-5`, Keras's exact
"gelu"); the padding mask is an input. The backbone returns the sequence output only. This is **not** Hugging Face
RoBERTa's position scheme (fairseq's: real tokens count from `pad_token_id + 1`, pads read row `pad_token_id`;
KerasHub's converter slices the first two rows off transformers' table): the canonical config has
`positions_skip_pad=False`, `position_offset=0`, so an export to hf-roberta is refused (transformers cannot number
positions 0..T-1 from the first row), never written as a model that computes something else.

`RobertaMaskedLM` adds `MaskedLMHead` (`layers/modeling/masked_lm_head.py`): `Dense(hidden_dim)` with the exact GELU,
`LayerNormalization(epsilon=1e-5)`, the tied token embedding plus a bias of its own: `head_transform=True`, the head's
activation and epsilon equal to the encoder's (`head_activation=None`, `head_layer_norm_eps=None`). As for BERT
(`kerashub_bert`), KerasHub's logits are the canonical ones gathered at its `mask_positions`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from .approximations import fixed_head_norm_eps
from .family import KerasHubFamily
from .kerashub_bert import HEAD
from .kerashub_classifiers import first_position

NAME = "kerashub-roberta"
PAD_TOKEN = "<pad>"  # the backbone takes a padding mask: the pad id is the vocabulary's (`preset_pad_id`)
BACKBONE = "RobertaBackbone"
TASKS = ("RobertaMaskedLM",)
CLASSIFIER = first_position("RobertaTextClassifier", "tanh")  # `kerashub_classifiers`
LAYOUT = Path(__file__).with_name("kerashub_roberta.toml")
SERIALIZED = {"RobertaBackbone": ("keras_hub.src.models.roberta.roberta_backbone", "roberta_backbone"),
              "RobertaMaskedLM": ("keras_hub.src.models.roberta.roberta_masked_lm", "roberta_masked_lm")}
FIXED = {"num_decoder_layers": 0, "activation": "gelu", "layer_norm_eps": 1e-5, "norm_first": False,
         "final_norm": False, "positional": "learned", "position_offset": 0, "positions_skip_pad": False,
         "scale_embedding": False, "bias": True, "embed_norm": True, "type_vocab_size": 0, "head_transform": False,
         "pooler": False, "output_projection": False, "tie_embeddings": False, "embedding_size": None,
         "shared_layers": False}
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "num_encoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "max_len": "max_sequence_length"}  # for messages
MASKED_LM = {"head_transform": True, "output_projection": True, "tie_embeddings": True, "output_bias": True}
HEAD_MATH = {"head_activation": "gelu", "head_layer_norm_eps": 1e-5}  # MaskedLMHead's, whatever the encoder's
TASK_FIELDS = {"RobertaMaskedLM": MASKED_LM}  # a bare RobertaMaskedLM .weights.h5 (its save_weights): this task
APPROXIMATIONS = (fixed_head_norm_eps("RobertaMaskedLM", HEAD_MATH["head_layer_norm_eps"]),)


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table + (HEAD if config.output_projection else [])


def head_fields(fixed: dict[str, Any]) -> dict[str, Any]:
    """`HEAD_MATH` as canonical fields over an encoder of `fixed`'s activation and epsilon: None where they agree."""
    return {"head_activation": None if fixed["activation"] == HEAD_MATH["head_activation"] else
            HEAD_MATH["head_activation"], "head_layer_norm_eps": None if fixed["layer_norm_eps"] ==
            HEAD_MATH["head_layer_norm_eps"] else HEAD_MATH["head_layer_norm_eps"]}


def read_config(backbone: dict[str, Any], task: str | None, fixed: dict[str, Any],
                **extra: Any) -> rn.TransformerConfig:
    """The canonical config of an encoder backbone with `BertBackbone`'s config keys (and its masked-LM task)."""
    from .hf import integer, number

    vocab = integer(backbone, "vocabulary_size")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"),
        num_heads=integer(backbone, "num_heads"), num_encoder_layers=integer(backbone, "num_layers"),
        d_ff=integer(backbone, "intermediate_dim"), max_len=integer(backbone, "max_sequence_length"),
        dropout=number(backbone, "dropout", 0.1), pad_id=None, output_bias=False, **{**fixed, **extra})
    if task is not None:
        config = config.replace(**MASKED_LM, **head_fields(config.to_dict()))
    return config


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `RobertaBackbone.get_config()` (config.json)."""
    return read_config(backbone, task, FIXED), ["positions 0..T-1 (KerasHub's RoBERTa; not transformers' "
                                                "pad-skipping positions)"]


def problems(config: rn.TransformerConfig, fixed: dict[str, Any], kind: str) -> list[str]:
    """Why `config` is not the KerasHub encoder of `fixed` (empty if it is one); `kind` names its two classes."""
    values = {**config.to_dict(), "output_bias": config.has_output_bias}
    wanted = {**fixed, **MASKED_LM} if config.output_projection else fixed
    cls = kind + ("MaskedLM" if config.output_projection else "Backbone")
    found = [f"{k}={values[k]!r} (KerasHub {cls} has {v!r})" for k, v in wanted.items() if values[k] != v]
    if config.head_transform:
        for field, encoder in (("head_activation", "activation"), ("head_layer_norm_eps", "layer_norm_eps")):
            value = values[field] if values[field] is not None else values[encoder]
            if value != HEAD_MATH[field]:
                found.append(f"{field}={value!r} (KerasHub {cls}'s head has {HEAD_MATH[field]!r})")
    if config.output_projection and config.tgt_vocab_size != config.src_vocab_size:
        found.append(f"tgt_vocab_size={config.tgt_vocab_size} != src_vocab_size={config.src_vocab_size} "
                     f"({cls} predicts the input vocabulary)")
    return found


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub RobertaBackbone or RobertaMaskedLM (empty if it is one)."""
    return problems(config, FIXED, "Roberta")


def write_config(config: rn.TransformerConfig) -> dict[str, Any]:
    return {"vocabulary_size": config.src_vocab_size, "num_layers": config.num_encoder_layers,
            "num_heads": config.num_heads, "hidden_dim": config.d_model, "intermediate_dim": config.d_ff,
            "dropout": config.dropout, "max_sequence_length": config.max_len}


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(RobertaBackbone config, task class or None)` for a config `export_problems` accepts."""
    return write_config(config), (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS, pad_token=PAD_TOKEN,
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=CLASSIFIER, predicts_mask_positions=TASKS,  # its masked LM predicts its mask_positions only
    expresses=(), approximations=APPROXIMATIONS)
