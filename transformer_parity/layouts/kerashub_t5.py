"""KerasHub T5 (`keras_hub.models.T5Backbone`, `T5Seq2SeqLM`): the encoder-decoder with relative position biases,
the same function as transformers' `T5ForConditionalGeneration` (`hf_t5`) within what it can express.

The math, read from keras-hub 0.32 (`keras_hub/src/models/t5/`): one `ReversibleEmbedding` token table for both
stacks; `num_layers` encoder and as many decoder `T5TransformerLayer`s, pre-norm with `T5LayerNorm` (RMS, a weight
alone, `layer_norm_epsilon`), no biases, unscaled scores; each stack's first self-attention holds the relative
position bias table, added to every layer's scores (32 buckets up to distance 128, fixed); the feed-forward is
`activation(input_projector(x))`, times `gate_projector(x)` under `use_gated_activation`; a final `T5LayerNorm`
per stack. `T5Seq2SeqLM`'s logits are the token table reversed: tied, with the final states times
`hidden_dim**-0.5` first (T5 v1.0), or its own reverse table without that rescale (`tie_embedding_weights=False`).
The backbone returns the decoder's sequence output (and the encoder's, which the canonical model does not return).

Where it differs from transformers' T5: the buckets are always 32 up to 128 (transformers reads them from
config.json); the rescale goes with the tied head (transformers has `scale_decoder_outputs` apart); `gelu` is Keras's
exact form and transformers' `gated-gelu` its tanh form (`keras_hub>gelu_approximate` here); padding is an additive
-1e9, so a query that may see no key averages the hidden ones where the canonical model gives zero (transformers
differs there too). A `T5Backbone` with `tie_embedding_weights=False` carries a reverse table its outputs never read:
it is refused (read its `T5Seq2SeqLM`). The table is `kerashub_t5.toml`, its feed-forward rows added here.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily
from .kerashub_llama import unknown_keys

NAME = "kerashub-t5"
PAD_TOKEN = "<pad>"  # the backbone takes padding masks: the pad id is the vocabulary's (`preset_pad_id`)
BACKBONE = "T5Backbone"
TASKS = ("T5Seq2SeqLM",)
LAYOUT = Path(__file__).with_name("kerashub_t5.toml")
SERIALIZED = {"T5Backbone": ("keras_hub.src.models.t5.t5_backbone", "t5_backbone"),
              "T5Seq2SeqLM": ("keras_hub.src.models.t5.t5_seq_2_seq_lm", "t5_seq2_seq_lm")}
KEYS = ("vocabulary_size", "hidden_dim", "intermediate_dim", "num_layers", "num_heads", "activation", "key_value_dim",
        "dropout", "use_gated_activation", "layer_norm_epsilon", "tie_embedding_weights")  # keras-hub 0.32
FIXED = {"norm": "rms", "norm_weight_offset": 0.0, "norm_first": True, "final_norm": True, "positional": "none",
         "relative_bias_buckets": 32, "relative_bias_max_distance": 128, "scale_embedding": False, "bias": False,
         "attention_scale": "none", "share_embeddings": True, "embed_norm": False, "head_transform": False,
         "type_vocab_size": 0, "pooler": False, "embedding_size": None, "shared_layers": False, "num_kv_heads": None,
         "qk_norm": False, "sliding_window": None}
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "head_size": "key_value_dim", "num_encoder_layers": "num_layers",
               "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "layer_norm_eps": "layer_norm_epsilon"}  # for messages
MAX_LEN = 512  # T5 has no position table: the longest sequence read here
# a Keras activation as config.json serializes it -> ours; the tanh GELU is keras_hub's registered function
_TANH_GELU = {"module": "builtins", "class_name": "function", "config": "keras_hub>gelu_approximate",
              "registered_name": "function"}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "swish": "silu", "keras_hub>gelu_approximate":
               "gelu_tanh", "keras_nlp>gelu_approximate": "gelu_tanh"}
_LAYER = re.compile(r"^layers/t5_transformer_layer_(\d+)/")  # as `user.keras_names` numbers them, the first `_0`
REVERSE = "layers/reversible_embedding/vars/1"


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    rows = list(user.load(LAYOUT).table)
    ffn = [("input_projector", "gate"), ("gate_projector", "linear1")] if config.ffn_gated else \
        [("input_projector", "linear1")]
    for stack, where in (("encoder", "layers"), ("decoder", "decoder")):
        rows += [(f"{stack}.layers.{{i}}.ffn.{ours}.kernel", f"{where}/t5_transformer_layer_{{i}}/{theirs}/vars/0",
                  "identity") for theirs, ours in ffn]
    if config.output_projection and not config.tie_embeddings:
        rows.append(("output.kernel", REVERSE, "identity"))
    return rows


def activation(value: Any) -> str:
    """Ours, from a Keras activation as config.json serializes it (a name, or a registered function's object)."""
    name = value.get("config") if isinstance(value, dict) and value.get("class_name") == "function" else value
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ValueError(f"config.json activation={value!r} is not supported (only {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `T5Backbone.get_config()` (config.json); a key keras-hub 0.32 does not write is
    refused."""
    from .hf import boolean, integer, number

    unknown_keys(backbone, KEYS, BACKBONE)
    vocab, layers, d_model, heads = (integer(backbone, key) for key in
                                     ("vocabulary_size", "num_layers", "hidden_dim", "num_heads"))
    kv = backbone.get("key_value_dim")
    kv = d_model // heads if kv is None else integer(backbone, "key_value_dim")
    tied = boolean(backbone, "tie_embedding_weights", True)
    if not task and not tied:
        raise ValueError("a T5Backbone with tie_embedding_weights=false holds a reverse embedding its outputs never "
                         "read: read its T5Seq2SeqLM preset")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d_model, num_heads=heads,
        head_size=None if heads * kv == d_model else kv, num_encoder_layers=layers, num_decoder_layers=layers,
        d_ff=integer(backbone, "intermediate_dim"), max_len=MAX_LEN, dropout=number(backbone, "dropout", 0.1),
        activation=activation(backbone.get("activation", "relu")),
        ffn_gated=boolean(backbone, "use_gated_activation", True),
        layer_norm_eps=number(backbone, "layer_norm_epsilon", 1e-6), pad_id=None,  # the vocabulary's, or the user's
        output_projection=task is not None, tie_embeddings=task is not None and tied,
        logit_divisor=math.sqrt(d_model) if task and tied else 1.0, **FIXED)
    notes = [f"max_len={MAX_LEN}: T5 has no position table; the longest sequence read here"]
    if task:
        notes.append("tied head, the final states rescaled by hidden_dim**-0.5" if tied else
                     "untied head (the reverse embedding), no rescale")
    return config, notes


def to_canonical_state(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
    """The decoder's layers, numbered after the encoder's by Keras, filed under `decoder/t5_transformer_layer_{i}`,
    in place."""
    n = config.num_encoder_layers
    for key in [k for k in state if (m := _LAYER.match(k)) and int(m[1]) >= n]:
        index = int(_LAYER.match(key)[1])
        state[f"decoder/t5_transformer_layer_{index - n}/{key[_LAYER.match(key).end():]}"] = state.pop(key)


def from_canonical_state(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
    """The inverse of `to_canonical_state`, in place."""
    n = config.num_encoder_layers
    for key in [k for k in state if k.startswith("decoder/t5_transformer_layer_")]:
        index, rest = key[len("decoder/t5_transformer_layer_"):].split("/", 1)
        state[f"layers/t5_transformer_layer_{int(index) + n}/{rest}"] = state.pop(key)


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub T5Backbone or T5Seq2SeqLM (empty if it is one)."""
    cls = "T5Seq2SeqLM" if config.output_projection else "T5Backbone"
    problems = [f"{k}={getattr(config, k)!r} (KerasHub {cls} has {v!r})" for k, v in FIXED.items()
                if getattr(config, k) != v]
    if not config.is_encoder_decoder:
        problems.append("not an encoder-decoder model")
    elif config.num_encoder_layers != config.num_decoder_layers:
        problems.append(f"num_encoder_layers={config.num_encoder_layers} != num_decoder_layers="
                        f"{config.num_decoder_layers} (T5Backbone's num_layers is both)")
    if config.has_qkv_bias or config.has_o_bias or config.has_ffn_bias or config.has_output_bias:
        problems.append("biases (KerasHub T5 has none)")
    rescaled = config.tie_embeddings and config.output_projection
    if config.logit_divisor != (math.sqrt(config.d_model) if rescaled else 1.0):
        problems.append(f"logit_divisor={config.logit_divisor!r} with tie_embeddings={config.tie_embeddings} "
                        f"(KerasHub {cls} rescales by hidden_dim**-0.5 exactly when its head is tied)")
    if config.classifier is not None:
        problems.append(f"classifier={config.classifier!r} (KerasHub T5 has no classifier)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(T5Backbone config, task class or None)` for a config `export_problems` accepts."""
    name = {"gelu_tanh": _TANH_GELU}.get(config.activation, config.activation)
    backbone = {"vocabulary_size": config.src_vocab_size, "hidden_dim": config.d_model,
                "intermediate_dim": config.d_ff, "num_layers": config.num_encoder_layers,
                "num_heads": config.num_heads, "activation": name, "key_value_dim": config.head_dim,
                "dropout": config.dropout, "use_gated_activation": config.ffn_gated,
                "layer_norm_epsilon": config.layer_norm_eps,
                "tie_embedding_weights": config.tie_embeddings or not config.output_projection}
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields={}, pad_token=PAD_TOKEN,
    layout=LAYOUT, table=table, settle_from_weights=None,
    to_canonical_state=to_canonical_state, from_canonical_state=from_canonical_state,  # the decoder's layer numbers
    classifier=None, predicts_mask_positions=(),
    expresses=("relative_bias_buckets", "relative_bias_max_distance", "positional", "attention_scale", "logit_divisor"),
    approximations=())
