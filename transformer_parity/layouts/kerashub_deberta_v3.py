"""KerasHub DeBERTa-v3 (`keras_hub.models.DebertaV3Backbone`, `DebertaV3MaskedLM`, `DebertaV3TextClassifier`): a
post-LN encoder with disentangled attention and no absolute positions.

The math, read from keras-hub 0.32 (`keras_hub/src/models/deberta_v3/`): token embeddings, a
`LayerNormalization(epsilon=1e-7)` (no segments, no positions: canonical `positional="none"`); a `RelativeEmbedding`
table of `2 * bucket_size` rows with its own LayerNorm (`relative_embed_norm`), projected by each layer's own query and
key `EinsumDense` (`relative_shares_qk`); c2p and p2c terms, every score scaled by 1/sqrt(3 * head_dim); distances
log-bucketed into `bucket_size` reaching `max_sequence_length` (`relative_buckets`, `max_relative_positions`);
post-LN `DisentangledAttentionEncoder` layers with exact GELU. Unlike transformers' DeBERTa-v2 it neither zeroes the
embeddings at padding nor hides every key from a padding query (its mask is the key padding mask): the two compute the
same at every real position, and differ at the padding ones (`embed_zero_padding`, `padded_queries`; an export either
way is refused naming them). `DebertaV3MaskedLM` adds BERT's `MaskedLMHead` (dense -> exact GELU -> LayerNorm at
1e-5, the token table tied, a bias) over its `mask_positions` only; `DebertaV3TextClassifier` reads position 0
through `pooled_dense` (GELU), then `logits`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily
from .kerashub_bert import HEAD
from .kerashub_classifiers import first_position
from .kerashub_llama import unknown_keys

NAME = "kerashub-deberta-v3"
PAD_TOKEN = "[PAD]"  # DebertaV3Backbone takes a padding mask: the pad id comes from the vocabulary (`preset_pad_id`)
BACKBONE = "DebertaV3Backbone"
TASKS = ("DebertaV3MaskedLM",)
CLASSIFIER = first_position("DebertaV3TextClassifier", "gelu")  # `kerashub_classifiers`
LAYOUT = Path(__file__).with_name("kerashub_deberta_v3.toml")
SERIALIZED = {"DebertaV3Backbone": ("keras_hub.src.models.deberta_v3.deberta_v3_backbone", "deberta_v3_backbone"),
              "DebertaV3MaskedLM": ("keras_hub.src.models.deberta_v3.deberta_v3_masked_lm", "deberta_v3_masked_lm")}
FIXED = {"num_decoder_layers": 0, "activation": "gelu", "norm": "layer", "layer_norm_eps": 1e-7, "norm_first": False,
         "final_norm": False, "positional": "none", "scale_embedding": False, "bias": True, "attention_bias": None,
         "embed_norm": True, "type_vocab_size": 0, "head_transform": False, "pooler": False,
         "output_projection": False, "tie_embeddings": False, "num_kv_heads": None, "head_size": None,
         "ffn_gated": False, "relative_terms": ("c2p", "p2c"), "relative_embed_norm": True,
         "relative_shares_qk": True, "embed_zero_padding": False, "padded_queries": "attend",
         "embedding_size": None}
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "num_encoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "max_len": "max_sequence_length", "relative_buckets": "bucket_size",
               "max_relative_positions": "max_sequence_length"}  # canonical field -> config.json key, for messages
KEYS = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim", "dropout",
        "max_sequence_length", "bucket_size")  # DebertaV3Backbone.get_config()
MASKED_LM = {"head_transform": True, "head_layer_norm_eps": 1e-5, "output_projection": True, "tie_embeddings": True,
             "output_bias": True}  # DebertaV3MaskedLM's MaskedLMHead (exact GELU, as the encoder), over FIXED
TASK_FIELDS = {"DebertaV3MaskedLM": MASKED_LM}


def scale(config: rn.TransformerConfig) -> float:
    """KerasHub's scale: 1/sqrt(3 * head_dim) (the content, c2p and p2c terms)."""
    return 1.0 / math.sqrt(3 * config.head_dim)


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table + (HEAD if config.output_projection else [])


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `DebertaV3Backbone.get_config()` (config.json)."""
    from .hf import integer, number

    unknown_keys(backbone, KEYS, BACKBONE)
    vocab, hidden, heads = (integer(backbone, "vocabulary_size"), integer(backbone, "hidden_dim"),
                            integer(backbone, "num_heads"))
    max_len = integer(backbone, "max_sequence_length", 512)
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=hidden, num_heads=heads,
        num_encoder_layers=integer(backbone, "num_layers"), d_ff=integer(backbone, "intermediate_dim"),
        max_len=max_len, dropout=number(backbone, "dropout", 0.1),
        relative_buckets=integer(backbone, "bucket_size", 256), max_relative_positions=max_len,
        attention_scale=1.0 / math.sqrt(3 * (hidden // heads)) if heads else "head",
        pad_id=None, output_bias=False, **FIXED)  # the pad id: the preset's vocabulary or the user (load_preset)
    if task == TASKS[0]:
        config = config.replace(**MASKED_LM)
    return config, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub DebertaV3Backbone or DebertaV3MaskedLM (empty if it is one)."""
    wanted = {**FIXED, **MASKED_LM} if config.output_projection else \
        {**FIXED, "head_activation": None, "head_layer_norm_eps": None}
    kind = TASKS[0] if config.output_projection else BACKBONE
    values = {**config.to_dict(), "output_bias": config.has_output_bias}
    problems = [f"{k}={values[k]!r} (KerasHub {kind} has {v!r})" for k, v in wanted.items()
                if k != "attention_bias" and values[k] != v]
    if not (config.has_qkv_bias and config.has_o_bias and config.has_ffn_bias):
        problems.append("a projection without its bias (KerasHub DebertaV3Backbone has a bias on every projection)")
    if config.head_transform and (config.head_activation or config.activation) != "gelu":
        problems.append(f"head_activation={config.head_activation!r} (DebertaV3MaskedLM's head uses exact gelu)")
    if config.max_relative_positions != config.max_len:
        problems.append(f"max_relative_positions={config.max_relative_positions} (KerasHub's log buckets reach "
                        f"max_sequence_length={config.max_len})")
    if config.relative_buckets < 2:
        problems.append(f"relative_buckets={config.relative_buckets} (KerasHub always log-buckets the distances)")
    if not math.isclose(config.attention_scale_factor, scale(config), rel_tol=1e-12):
        problems.append(f"attention_scale={config.attention_scale!r} (KerasHub DebertaV3Backbone scales by "
                        f"1/sqrt(3 * head_dim) = {scale(config)!r})")
    if config.output_projection and config.tgt_vocab_size != config.src_vocab_size:
        problems.append(f"tgt_vocab_size={config.tgt_vocab_size} != src_vocab_size={config.src_vocab_size} "
                        "(DebertaV3MaskedLM predicts the input vocabulary)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(DebertaV3Backbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = {"vocabulary_size": config.src_vocab_size, "num_layers": config.num_encoder_layers,
                "num_heads": config.num_heads, "hidden_dim": config.d_model, "intermediate_dim": config.d_ff,
                "dropout": config.dropout, "max_sequence_length": config.max_len,
                "bucket_size": config.relative_buckets}
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS, pad_token=PAD_TOKEN,
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=CLASSIFIER,
    predicts_mask_positions=TASKS,  # DebertaV3MaskedLM predicts its mask_positions only: the canonical logits gathered
    expresses=("relative_terms", "relative_buckets", "max_relative_positions", "relative_embed_norm",
               "relative_shares_qk", "attention_scale"),
    approximations=())
