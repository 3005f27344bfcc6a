"""KerasHub OPT (`keras_hub.models.OPTBackbone`, `OPTCausalLM`): decoder-only, pre-LN, learned positions, ReLU.

The math, read from keras-hub 0.32 (`keras_hub/src/models/opt/opt_backbone.py`, `opt_causal_lm.py`,
`layers/modeling/transformer_decoder.py`): `TokenAndPositionEmbedding` adds the token row and the position row
(`max_sequence_length` rows, position p at row p, no scale), then `TransformerDecoder` layers without
cross-attention (`normalize_first=True`, `layer_norm_epsilon=1e-5`, `relu`, biases everywhere), a final
`LayerNormalization(epsilon=1e-5)`. `OPTCausalLM`'s logits are `token_embedding(x, reverse=True)`: the tied
embedding, no bias. The checkpoints' `word_embed_proj_dim` projections (OPT-350m), post-LN layers
(`do_layer_norm_before=False`) and other activations have no KerasHub form: such a config is refused on export.

Where it differs from transformers' OPT only in form, the canonical config is transformers' (`hf_opt`), so a preset
exports to `hf-opt` and back: transformers reads position p at row p + 2 of a `max_position_embeddings + 2` row table
(`position_offset=2`); here the two unread rows are put back as zeros on reading and taken off on writing, as
`kerashub_bart` does. The table is `kerashub_opt.toml` beside this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import reference_numpy as rn

from .family import KerasHubFamily
from .hf_opt import POSITION_OFFSET
from .kerashub_gpt2 import backbone_config
from .kerashub_llama import unknown_keys

NAME = "kerashub-opt"
BACKBONE = "OPTBackbone"
TASKS = ("OPTCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_opt.toml")
SERIALIZED = {"OPTBackbone": ("keras_hub.src.models.opt.opt_backbone", "opt_backbone"),
              "OPTCausalLM": ("keras_hub.src.models.opt.opt_causal_lm", "opt_causal_lm")}
FIXED = {"num_encoder_layers": 0, "activation": "relu", "norm": "layer", "layer_norm_eps": 1e-5, "norm_first": True,
         "final_norm": True, "positional": "learned", "position_offset": POSITION_OFFSET, "positions_skip_pad": False,
         "scale_embedding": False, "bias": True, "attention_bias": None, "num_kv_heads": None, "head_size": None,
         "ffn_gated": False, "embed_norm": False, "head_transform": False, "type_vocab_size": 0, "pooler": False,
         "output_bias": False, "pad_id": None}  # padding arrives as OPTBackbone's padding_mask input
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "max_len": "max_sequence_length"}  # canonical field -> config.json key, for messages
CAUSAL_LM = {"output_projection": True, "tie_embeddings": True}  # OPTCausalLM's logits: the tied embedding
TASK_FIELDS = {"OPTCausalLM": CAUSAL_LM}
KEYS = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim", "dropout",
        "max_sequence_length")  # OPTBackbone.get_config()
POSITIONS = "layers/token_and_position_embedding/position_embedding/vars/0"


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table  # OPTCausalLM's head is the tied embedding: nothing to add


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `OPTBackbone.get_config()` (config.json) and the task class (task.json), if any."""
    from .hf import integer, number

    unknown_keys(backbone, KEYS, BACKBONE)
    vocab = integer(backbone, "vocabulary_size")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"),
        num_heads=integer(backbone, "num_heads"), num_decoder_layers=integer(backbone, "num_layers"),
        d_ff=integer(backbone, "intermediate_dim"), max_len=integer(backbone, "max_sequence_length", 2048),
        dropout=number(backbone, "dropout", 0.1), tie_embeddings=False, output_projection=False, **FIXED)
    if task is not None:
        config = config.replace(**CAUSAL_LM)
    return config, [f"the position table read at position + {POSITION_OFFSET}, as transformers' OPT, with two zero "
                    "rows before KerasHub's (never read)"]


def to_canonical_state(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
    """The position table after `POSITION_OFFSET` zero rows, in place."""
    if POSITIONS in state and np.shape(state[POSITIONS]) == (config.max_len, config.d_model):  # else the shape check
        rows = np.asarray(state[POSITIONS])
        state[POSITIONS] = np.concatenate([np.zeros((POSITION_OFFSET, rows.shape[1]), rows.dtype), rows])


def from_canonical_state(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
    """The inverse of `to_canonical_state`, in place: the position table without its unread rows."""
    state[POSITIONS] = np.ascontiguousarray(np.asarray(state[POSITIONS])[POSITION_OFFSET:])


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub OPT (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub OPT has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id", "attention_bias") and getattr(config, k) != v]
    if not (config.has_qkv_bias and config.has_o_bias and config.has_ffn_bias):
        problems.append("a projection without its bias (KerasHub OPT has a bias on every projection)")
    if config.output_projection and not config.tie_embeddings:
        problems.append("tie_embeddings=False (OPTCausalLM's logits reuse the token embedding)")
    if config.has_output_bias:
        problems.append("output_bias=True (OPTCausalLM's logits have no bias)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(OPTBackbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = backbone_config(config)
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as OPTBackbone's padding_mask input; every id is a token
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=to_canonical_state,
    from_canonical_state=from_canonical_state,  # the position table's two unread rows
    classifier=None, predicts_mask_positions=(), expresses=(), approximations=())
