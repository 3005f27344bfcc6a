"""KerasHub Falcon (`keras_hub.models.FalconBackbone`, `FalconCausalLM`): Falcon-RW's form of transformers' Falcon:
decoder-only, pre-LN, one sublayer after the other, ALiBi biases in place of positions, the exact GELU.

The math, read from keras-hub 0.32 (`keras_hub/src/models/falcon/`): the token embedding (no scale, no norm),
`FalconTransformerDecoder` layers (`x + attention(input_layernorm(x))`, then `x + mlp(post_attention_layernorm(x))`,
the mlp `intermediate_dim` wide with `keras.activations.gelu`, exact; biases everywhere; q, k and v with
`num_attention_heads` heads each), a final LayerNorm, all at `layer_norm_epsilon`. `FalconAttention` adds its ALiBi
bias to q k^T and then scales both by 1/sqrt(head_dim) (canonical `alibi` with `alibi_scaled`), the positions
counted over the padding mask's real tokens as transformers' Falcon counts them (a decoding step counts every cached
slot: a constant apart in each query's row). It always computes ALiBi: transformers' rotary Falcon has no KerasHub
form. `FalconCausalLM`'s logits are `token_embedding(x, reverse=True)` (keras-hub's default `tie_weights=True`): the
head is the tied embedding. `attention_dropout_rate` and `feedforward_dropout_rate` are the one canonical `dropout`
(two values are refused); the backbone has no maximum length: `max_len` is 2048. The table is the layout file
`kerashub_falcon.toml` beside this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily
from .kerashub_bloom import LENGTH_NOTE
from .hf_bloom import DEFAULT_LENGTH
from .kerashub_llama import unknown_keys

NAME = "kerashub-falcon"
BACKBONE = "FalconBackbone"
TASKS = ("FalconCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_falcon.toml")
SERIALIZED = {"FalconBackbone": ("keras_hub.src.models.falcon.falcon_backbone", "falcon_backbone"),
              "FalconCausalLM": ("keras_hub.src.models.falcon.falcon_causal_lm", "falcon_causal_lm")}
FIXED = {"num_encoder_layers": 0, "activation": "gelu", "norm": "layer", "norm_first": True, "final_norm": True,
         "positional": "none", "alibi": True, "alibi_scaled": True, "alibi_bfloat16": False, "embed_norm": False,
         "scale_embedding": False, "bias": True, "attention_bias": None, "num_kv_heads": None, "head_size": None,
         "ffn_gated": False, "parallel_residual": False, "head_transform": False, "type_vocab_size": 0, "pooler": False,
         "output_bias": False, "pad_id": None}
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_attention_heads", "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "layer_norm_eps": "layer_norm_epsilon", "dropout": "feedforward_dropout_rate"}
CAUSAL_LM = {"output_projection": True, "tie_embeddings": True}  # FalconCausalLM's logits: the tied embedding
TASK_FIELDS = {"FalconCausalLM": CAUSAL_LM}
KEYS = ("vocabulary_size", "num_layers", "num_attention_heads", "hidden_dim", "intermediate_dim",
        "attention_dropout_rate", "feedforward_dropout_rate", "layer_norm_epsilon")  # FalconBackbone.get_config()


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table  # FalconCausalLM's head is the tied embedding: nothing to add


# keras-hub 0.32's FalconBackbone builds its FalconTransformerDecoder layers without its layer_norm_epsilon: they
# keep their default, 1e-5, and only the final LayerNorm reads the setting (measured: a transformers Falcon at 2e-4
# written with it was 1.5e-2 from transformers in keras_hub's logits)
LAYER_EPS = 1e-5


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `FalconBackbone.get_config()` (config.json) and the task class (task.json), if any."""
    from .hf import integer, number

    unknown_keys(backbone, KEYS, BACKBONE)
    vocab = integer(backbone, "vocabulary_size")
    attention, feedforward = (number(backbone, key, 0.0) for key in ("attention_dropout_rate",
                                                                    "feedforward_dropout_rate"))
    if attention != feedforward:
        raise ValueError(f"config.json attention_dropout_rate={attention!r} beside feedforward_dropout_rate="
                         f"{feedforward!r} is not supported (one dropout rate)")
    eps = number(backbone, "layer_norm_epsilon", LAYER_EPS)
    if eps != LAYER_EPS:
        raise ValueError(f"config.json layer_norm_epsilon={eps!r} is not supported: keras-hub 0.32's FalconBackbone "
                         f"gives it to the final LayerNorm only, its decoder layers normalizing at {LAYER_EPS} "
                         "(one epsilon for every norm here)")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"),
        num_heads=integer(backbone, "num_attention_heads"), num_decoder_layers=integer(backbone, "num_layers"),
        d_ff=integer(backbone, "intermediate_dim"), max_len=DEFAULT_LENGTH, dropout=feedforward,
        layer_norm_eps=eps, tie_embeddings=False, output_projection=False, **FIXED)
    if task is not None:
        config = config.replace(**CAUSAL_LM)
    return config, [LENGTH_NOTE]


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub Falcon (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub Falcon has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id", "attention_bias") and getattr(config, k) != v]
    if not (config.has_qkv_bias and config.has_o_bias and config.has_ffn_bias):
        problems.append("a projection without its bias (KerasHub Falcon has a bias on every projection)")
    if config.output_projection and not config.tie_embeddings:
        problems.append("tie_embeddings=False (FalconCausalLM's logits reuse the token embedding)")
    if config.has_output_bias:
        problems.append("output_bias=True (FalconCausalLM's logits have no bias)")
    if config.layer_norm_eps != LAYER_EPS:  # its layer_norm_epsilon reaches the final norm only
        problems.append(f"layer_norm_eps={config.layer_norm_eps!r} (keras-hub 0.32's Falcon decoder layers normalize "
                        f"at {LAYER_EPS} whatever layer_norm_epsilon says)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(FalconBackbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = {"vocabulary_size": config.tgt_vocab_size, "num_layers": config.num_decoder_layers,
                "num_attention_heads": config.num_heads, "hidden_dim": config.d_model,
                "intermediate_dim": config.d_ff, "attention_dropout_rate": config.dropout,
                "feedforward_dropout_rate": config.dropout, "layer_norm_epsilon": config.layer_norm_eps}
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as FalconBackbone's padding_mask input; every id is a token
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=None, predicts_mask_positions=(), expresses=("alibi", "alibi_scaled"), approximations=())
