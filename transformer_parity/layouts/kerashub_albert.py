"""KerasHub ALBERT (`keras_hub.models.AlbertBackbone`, `AlbertMaskedLM`): BERT's post-LN encoder with factorized
embeddings and one set of layer weights run by every layer.

The math, read from keras-hub 0.32 (`keras_hub/src/models/albert/albert_backbone.py`): token (`ReversibleEmbedding`),
position (0..T-1) and segment embeddings, `embedding_dim` wide, added; `LayerNormalization(epsilon=1e-12)`; a
`Dense(hidden_dim)` projection (canonical `embedding_size`, `src_embed_proj`); then `num_groups` groups of
`num_inner_repetitions` `TransformerEncoder`s (post-LN, epsilon 1e-12, the tanh GELU `gelu_approximate`), each group
run `num_layers / num_groups` times; a pooler `Dense(tanh)` on position 0. With one group of one layer that is
canonical `shared_layers` (weights `encoder.layers.0.*`); other groupings are refused. `AlbertMaskedLM` adds
`MaskedLMHead`: `Dense(embedding_dim)` with the tanh GELU, `LayerNormalization(epsilon=1e-5)` (not 1e-12:
`head_layer_norm_eps=1e-5`), the tied token embedding plus its own bias; the backbone's pooler weights are kept.

transformers' `AlbertModel` (hf-albert) computes the backbone; its `AlbertForMaskedLM` normalizes the head at the
encoder's epsilon and has no pooler, so that task is refused there. The pad id: the index of `<pad>` among the
pieces of the preset's SentencePiece model (`assets/tokenizer/vocabulary.spm`), else `--set pad_id=N`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from . import kerashub_roberta as roberta
from .approximations import Approximation, fixed_head_norm_eps
from .family import KerasHubFamily
from .kerashub_bert import HEAD
from .kerashub_classifiers import pooled

NAME = "kerashub-albert"
PAD_TOKEN = "<pad>"
BACKBONE = "AlbertBackbone"
TASKS = ("AlbertMaskedLM",)
CLASSIFIER = pooled("AlbertTextClassifier")  # one Dense on the pooled output (`kerashub_classifiers`)
LAYOUT = Path(__file__).with_name("kerashub_albert.toml")
SERIALIZED = {"AlbertBackbone": ("keras_hub.src.models.albert.albert_backbone", "albert_backbone"),
              "AlbertMaskedLM": ("keras_hub.src.models.albert.albert_masked_lm", "albert_masked_lm")}
FIXED = {**roberta.FIXED, "activation": "gelu_tanh", "layer_norm_eps": 1e-12, "pooler": True, "shared_layers": True}
del FIXED["type_vocab_size"], FIXED["embedding_size"]  # from config.json (num_segments, embedding_dim)
HEAD_MATH = {"head_activation": "gelu_tanh", "head_layer_norm_eps": 1e-5}  # AlbertMaskedLM's MaskedLMHead
CONFIG_KEYS = {**roberta.CONFIG_KEYS, "type_vocab_size": "num_segments", "embedding_size": "embedding_dim"}
TASK_FIELDS = {"AlbertMaskedLM": {**roberta.MASKED_LM, "head_layer_norm_eps": 1e-5}}
APPROXIMATIONS = (  # `layouts.approximations`: its head computes the tanh GELU too
    Approximation("gelu_tanh", "KerasHub's AlbertBackbone computes tanh-approximated GELU",
                  lambda c: {"activation": "gelu_tanh", **({"head_activation": None} if c.head_transform
                                                          and c.head_activation in (None, "gelu") else {})}
                  if c.activation == "gelu" else {},
                  lambda c: "the source exact GELU", "its activation", ("ffn", "head")),
    fixed_head_norm_eps("AlbertMaskedLM", HEAD_MATH["head_layer_norm_eps"]),
)


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table + (HEAD if config.output_projection else [])


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `AlbertBackbone.get_config()` (config.json)."""
    from .hf import integer

    for key in ("num_groups", "num_inner_repetitions"):
        if integer(backbone, key, 1) != 1:
            raise ValueError(f"config.json {key}={backbone[key]!r} is not supported (one layer shared by every "
                             "layer only)")
    if integer(backbone, "num_layers") < 1:
        raise ValueError("config.json num_layers=0 is not supported (ALBERT runs its layer at least once)")
    config = roberta.read_config(backbone, None, FIXED, type_vocab_size=integer(backbone, "num_segments", 2),
                                 embedding_size=integer(backbone, "embedding_dim"))
    if task is not None:
        config = config.replace(**TASK_FIELDS[task])
    return config, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub AlbertBackbone or AlbertMaskedLM (empty if it is one)."""
    values = {**config.to_dict(), "output_bias": config.has_output_bias}
    cls = "AlbertMaskedLM" if config.output_projection else "AlbertBackbone"
    wanted = {**FIXED, **roberta.MASKED_LM} if config.output_projection else FIXED
    found = [f"{k}={values[k]!r} (KerasHub {cls} has {v!r})" for k, v in wanted.items() if values[k] != v]
    if config.head_transform:
        for field, encoder in (("head_activation", "activation"), ("head_layer_norm_eps", "layer_norm_eps")):
            value = values[field] if values[field] is not None else values[encoder]
            if value != HEAD_MATH[field]:
                found.append(f"{field}={value!r} (KerasHub {cls}'s head has {HEAD_MATH[field]!r})")
    if config.embedding_size is None:
        found.append("embedding_size=None (AlbertBackbone's embeddings are factorized: give their width)")
    if config.type_vocab_size < 1:
        found.append("type_vocab_size=0 (AlbertBackbone always has segment embeddings)")
    if config.output_projection and config.tgt_vocab_size != config.src_vocab_size:
        found.append(f"tgt_vocab_size={config.tgt_vocab_size} != src_vocab_size={config.src_vocab_size} "
                     f"({cls} predicts the input vocabulary)")
    return found


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(AlbertBackbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = {**roberta.write_config(config), "num_groups": 1, "num_inner_repetitions": 1,
                "embedding_dim": config.embedding_size, "num_segments": config.type_vocab_size}
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS, pad_token=PAD_TOKEN,
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=CLASSIFIER, predicts_mask_positions=TASKS,  # its masked LM predicts its mask_positions only
    expresses=("embedding_size", "shared_layers"),  # `layouts.FAMILY_ONLY` settings it has
    approximations=APPROXIMATIONS)
