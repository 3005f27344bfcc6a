"""KerasHub BLOOM (`keras_hub.models.BloomBackbone`, `BloomCausalLM`): decoder-only, pre-LN, an embedding LayerNorm,
ALiBi biases in place of positions, the tanh GELU.

The math, read from keras-hub 0.32 (`keras_hub/src/models/bloom/`, `layers/modeling/alibi_bias.py`): the token
embedding (no scale), `embeddings_layer_norm`, `BloomDecoder` layers (`x + attention(norm1(x))`, then
`x + mlp(norm3(x))`, the mlp `intermediate_dim` wide with `gelu(approximate=True)`, biases everywhere), a final
LayerNorm, all at `layer_norm_epsilon`. `BloomAttention` scales q k^T by 1/sqrt(head_dim) and then adds
`AlibiBias` (canonical `alibi`, unscaled, as transformers' BLOOM): slope_h * (j - (Tk - 1)) for key j, whatever the
padding, where transformers counts positions over the real tokens: a constant apart in each query's row, which
softmax does not see. `BloomCausalLM`'s logits are `token_embedding(x, reverse=True)` (keras-hub's default
`tie_weights=True`): the head is the tied embedding. Unlike transformers' BLOOM (4 * hidden_size), the feed-forward
width is `intermediate_dim`: a preset of another width has no hf-bloom form. The backbone has no maximum length:
`max_len` is 2048, BLOOM's training length. The table is the layout file `kerashub_bloom.toml` beside this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily
from .hf_bloom import DEFAULT_LENGTH
from .kerashub_llama import unknown_keys

NAME = "kerashub-bloom"
BACKBONE = "BloomBackbone"
TASKS = ("BloomCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_bloom.toml")
SERIALIZED = {"BloomBackbone": ("keras_hub.src.models.bloom.bloom_backbone", "bloom_backbone"),
              "BloomCausalLM": ("keras_hub.src.models.bloom.bloom_causal_lm", "bloom_causal_lm")}
FIXED = {"num_encoder_layers": 0, "activation": "gelu_tanh", "norm": "layer", "norm_first": True, "final_norm": True,
         "positional": "none", "alibi": True, "alibi_scaled": False, "embed_norm": True, "scale_embedding": False,
         "bias": True, "attention_bias": None, "num_kv_heads": None, "head_size": None, "ffn_gated": False,
         "head_transform": False, "type_vocab_size": 0, "pooler": False, "output_bias": False, "pad_id": None}
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "layer_norm_eps": "layer_norm_epsilon"}
CAUSAL_LM = {"output_projection": True, "tie_embeddings": True}  # BloomCausalLM's logits: the tied embedding
TASK_FIELDS = {"BloomCausalLM": CAUSAL_LM}
KEYS = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim", "dropout",
        "layer_norm_epsilon")  # BloomBackbone.get_config()
LENGTH_NOTE = (f"max_len={DEFAULT_LENGTH} (the backbone has no maximum length: ALiBi takes any; --set max_len=N for "
               "longer inputs)")


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table  # BloomCausalLM's head is the tied embedding: nothing to add


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `BloomBackbone.get_config()` (config.json) and the task class (task.json), if any."""
    from .hf import integer, number

    unknown_keys(backbone, KEYS, BACKBONE)
    vocab = integer(backbone, "vocabulary_size")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"),
        num_heads=integer(backbone, "num_heads"), num_decoder_layers=integer(backbone, "num_layers"),
        d_ff=integer(backbone, "intermediate_dim"), max_len=DEFAULT_LENGTH, dropout=number(backbone, "dropout", 0.0),
        layer_norm_eps=number(backbone, "layer_norm_epsilon", 1e-5), tie_embeddings=False, output_projection=False,
        **FIXED)
    if task is not None:
        config = config.replace(**CAUSAL_LM)
    return config, [LENGTH_NOTE]


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub BLOOM (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub BLOOM has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id", "attention_bias") and getattr(config, k) != v]
    if not (config.has_qkv_bias and config.has_o_bias and config.has_ffn_bias):
        problems.append("a projection without its bias (KerasHub BLOOM has a bias on every projection)")
    if config.output_projection and not config.tie_embeddings:
        problems.append("tie_embeddings=False (BloomCausalLM's logits reuse the token embedding)")
    if config.has_output_bias:
        problems.append("output_bias=True (BloomCausalLM's logits have no bias)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(BloomBackbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = {"vocabulary_size": config.tgt_vocab_size, "num_layers": config.num_decoder_layers,
                "num_heads": config.num_heads, "hidden_dim": config.d_model, "intermediate_dim": config.d_ff,
                "dropout": config.dropout, "layer_norm_epsilon": config.layer_norm_eps}
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as BloomBackbone's padding_mask input; every id is a token
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=None, predicts_mask_positions=(), expresses=("alibi",), approximations=())
