"""KerasHub ELECTRA (`keras_hub.models.ElectraBackbone`): BERT's post-LN encoder with embeddings `embedding_dim`
wide, projected to `hidden_dim` where the two differ, and a pooler.

The math, read from keras-hub 0.32 (`keras_hub/src/models/electra/electra_backbone.py`): token + position + segment
embeddings (`embedding_dim` wide) added, a `LayerNormalization(epsilon=1e-12)`, a `Dense(hidden_dim)` projection
only when `hidden_dim != embedding_dim` (canonical `embedding_size`, `src_embed_proj`, as transformers'
`embeddings_project`), `TransformerEncoder` layers (post-LN, `layer_norm_epsilon=1e-12`, the tanh GELU
`gelu_approximate`: transformers' ELECTRA computes the exact `gelu`), and a pooler `Dense(tanh)` on position 0 that
transformers' `ElectraModel` does not have. The backbone returns `sequence_output` and `pooled_output`; keras-hub
0.32 has no ELECTRA task class. The Dense layers are Keras's `dense` / `dense_1` by how many there are, so `table`
adds them to the layout file `kerashub_electra.toml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily
from .kerashub_llama import unknown_keys

NAME = "kerashub-electra"
PAD_TOKEN = "[PAD]"  # ElectraBackbone takes a padding mask: the pad id comes from the vocabulary (`preset_pad_id`)
BACKBONE = "ElectraBackbone"
LAYOUT = Path(__file__).with_name("kerashub_electra.toml")
SERIALIZED = {"ElectraBackbone": ("keras_hub.src.models.electra.electra_backbone", "electra_backbone")}
FIXED = {"num_decoder_layers": 0, "activation": "gelu_tanh", "norm": "layer", "layer_norm_eps": 1e-12,
         "norm_first": False, "final_norm": False, "positional": "learned", "position_offset": 0,
         "positions_skip_pad": False, "scale_embedding": False, "bias": True, "attention_bias": None,
         "embed_norm": True, "head_transform": False, "pooler": True, "output_projection": False,
         "tie_embeddings": False, "num_kv_heads": None, "head_size": None, "ffn_gated": False}
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "num_encoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "max_len": "max_sequence_length", "type_vocab_size": "num_segments",
               "embedding_size": "embedding_dim"}  # canonical field -> config.json key, for messages
KEYS = ("vocab_size", "num_layers", "num_heads", "hidden_dim", "embedding_dim", "intermediate_dim", "dropout",
        "max_sequence_length", "num_segments")  # ElectraBackbone.get_config()
PROJECTION = [("src_embed_proj.kernel", "layers/dense_0/vars/0", "identity"),
              ("src_embed_proj.bias", "layers/dense_0/vars/1", "identity")]


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    """The layout file's entries, then the projection (`dense`, where there is one) and the pooler (the next)."""
    from . import user

    pooler = "layers/dense_1/vars/" if config.embedding_size is not None else "layers/dense/vars/"
    return (user.load(LAYOUT).table + (PROJECTION if config.embedding_size is not None else [])
            + [("pooler.kernel", pooler + "0", "identity"), ("pooler.bias", pooler + "1", "identity")])


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `ElectraBackbone.get_config()` (config.json)."""
    from .hf import integer, number

    unknown_keys(backbone, KEYS, BACKBONE)
    vocab, hidden, embedding = (integer(backbone, "vocab_size"), integer(backbone, "hidden_dim"),
                                integer(backbone, "embedding_dim"))
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=hidden, num_heads=integer(backbone, "num_heads"),
        num_encoder_layers=integer(backbone, "num_layers"), d_ff=integer(backbone, "intermediate_dim"),
        max_len=integer(backbone, "max_sequence_length", 512), type_vocab_size=integer(backbone, "num_segments", 2),
        dropout=number(backbone, "dropout", 0.1), embedding_size=None if embedding == hidden else embedding,
        pad_id=None, output_bias=False, **FIXED)  # the pad id: the preset's vocabulary or the user (load_preset)
    return config, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub ElectraBackbone (empty if it is one)."""
    values = {**config.to_dict(), "output_bias": config.has_output_bias}
    problems = [f"{k}={values[k]!r} (KerasHub ElectraBackbone has {v!r})" for k, v in FIXED.items()
                if k != "attention_bias" and values[k] != v]
    if not (config.has_qkv_bias and config.has_o_bias and config.has_ffn_bias):
        problems.append("a projection without its bias (KerasHub ElectraBackbone has a bias on every projection)")
    if config.type_vocab_size < 1:
        problems.append("type_vocab_size=0 (ElectraBackbone always has segment embeddings)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(ElectraBackbone config, None)` for a config `export_problems` accepts (keras-hub 0.32 has no task)."""
    backbone = {"vocab_size": config.src_vocab_size, "num_layers": config.num_encoder_layers,
                "num_heads": config.num_heads, "hidden_dim": config.d_model,
                "embedding_dim": config.embedding_size or config.d_model, "intermediate_dim": config.d_ff,
                "dropout": config.dropout, "max_sequence_length": config.max_len,
                "num_segments": config.type_vocab_size}
    return backbone, None


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=(), serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields={}, pad_token=PAD_TOKEN,
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=None, predicts_mask_positions=(), expresses=("embedding_size",), approximations=())
