"""KerasHub GPT-NeoX (`keras_hub.models.GPTNeoXBackbone`, `GPTNeoXCausalLM`): decoder-only, pre-LN, rotary positions
on part of each head, attention and feed-forward side by side on one residual.

The math, read from keras-hub 0.32 (`keras_hub/src/models/gpt_neo_x/`): `GPTNeoXDecoder` is always the parallel
residual `x + attention(norm1(x)) + feedforward(norm3(x))` (canonical `parallel_residual=True`, no switch), its
feed-forward `gelu_approximate` (the tanh GELU, whatever the checkpoint was trained with: transformers' GPT-NeoX
defaults to the exact `gelu`), LayerNorms at `layer_norm_epsilon`, biases on every projection. `GPTNeoXAttention`
rotates the first `int(head_dim * rotary_percentage)` features of q and k (rotate-half, base
`rotary_max_wavelength`), transformers' `partial_rotary_factor`. `GPTNeoXCausalLM`'s logits are
`token_embedding(x, reverse=True)` with keras-hub's default `tie_weights=True`: the head is always the tied embedding
(transformers' Pythia has its own `embed_out`). `max_sequence_length` sizes nothing (no position table).
The table is the layout file `kerashub_gpt_neox.toml` beside this module; the fused q/k/v kernel `(hidden, heads,
3 * head_dim)` is merged to `(hidden, 3 * hidden)` (`fused_qkv_heads`) by `to_canonical_state` and split back by
`from_canonical_state`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import reference_numpy as rn

from .family import KerasHubFamily
from .kerashub_gpt2 import backbone_config
from .kerashub_llama import unknown_keys

NAME = "kerashub-gpt-neox"
BACKBONE = "GPTNeoXBackbone"
TASKS = ("GPTNeoXCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_gpt_neox.toml")
SERIALIZED = {"GPTNeoXBackbone": ("keras_hub.src.models.gpt_neo_x.gpt_neo_x_backbone", "gpt_neo_x_backbone"),
              "GPTNeoXCausalLM": ("keras_hub.src.models.gpt_neo_x.gpt_neo_x_causal_lm", "gpt_neo_x_causal_lm")}
FIXED = {"num_encoder_layers": 0, "activation": "gelu_tanh", "norm": "layer", "norm_first": True, "final_norm": True,
         "positional": "rope", "parallel_residual": True, "scale_embedding": False, "bias": True,
         "attention_bias": None, "rope_scaling": None, "num_kv_heads": None, "head_size": None, "embed_norm": False,
         "head_transform": False, "type_vocab_size": 0, "pooler": False, "output_bias": False, "pad_id": None}
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_heads", "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim",
               "max_len": "max_sequence_length", "layer_norm_eps": "layer_norm_epsilon",
               "rope_theta": "rotary_max_wavelength", "rotary_fraction": "rotary_percentage"}
CAUSAL_LM = {"output_projection": True, "tie_embeddings": True}  # GPTNeoXCausalLM's logits: the tied embedding
TASK_FIELDS = {"GPTNeoXCausalLM": CAUSAL_LM}
KEYS = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim", "dropout",
        "rotary_percentage", "rotary_max_wavelength", "max_sequence_length", "layer_norm_epsilon")  # get_config()
QKV = "layers/gpt_neo_x_decoder_{i}/_self_attention_layer/_qkv_dense/vars/"


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    return user.load(LAYOUT).table  # GPTNeoXCausalLM's head is the tied embedding: nothing to add


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `GPTNeoXBackbone.get_config()` (config.json) and the task class (task.json), if any."""
    from .hf import integer, number

    unknown_keys(backbone, KEYS, BACKBONE)
    vocab = integer(backbone, "vocabulary_size")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=integer(backbone, "hidden_dim"),
        num_heads=integer(backbone, "num_heads"), num_decoder_layers=integer(backbone, "num_layers"),
        d_ff=integer(backbone, "intermediate_dim"), max_len=integer(backbone, "max_sequence_length", 512),
        dropout=number(backbone, "dropout", 0.0), layer_norm_eps=number(backbone, "layer_norm_epsilon", 1e-5),
        rope_theta=number(backbone, "rotary_max_wavelength", 10000.0),
        rotary_fraction=number(backbone, "rotary_percentage", 0.25), tie_embeddings=False, output_projection=False,
        **FIXED)
    if task is not None:
        config = config.replace(**CAUSAL_LM)
    return config, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub GPT-NeoX (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub GPT-NeoX has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id", "attention_bias") and getattr(config, k) != v]
    if not (config.has_qkv_bias and config.has_o_bias and config.has_ffn_bias):
        problems.append("a projection without its bias (KerasHub GPT-NeoX has a bias on every projection)")
    if config.output_projection and not config.tie_embeddings:
        problems.append("tie_embeddings=False (GPTNeoXCausalLM's logits reuse the token embedding)")
    if config.has_output_bias:
        problems.append("output_bias=True (GPTNeoXCausalLM's logits have no bias)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(GPTNeoXBackbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = {**backbone_config(config), "rotary_percentage": config.rotary_fraction,
                "rotary_max_wavelength": config.rope_theta, "layer_norm_epsilon": config.layer_norm_eps}
    return backbone, (TASKS[0] if config.output_projection else None)


def _qkv_keys(config: rn.TransformerConfig) -> list[tuple[str, str]]:
    return [(QKV.replace("{i}", str(i)) + "0", QKV.replace("{i}", str(i)) + "1")
            for i in range(config.num_decoder_layers)]


def to_canonical_state(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
    """The fused q/k/v kernels `(hidden, heads, 3 * head_dim)` -> `(hidden, 3 * hidden)`, biases `(heads, 3 *
    head_dim)` -> `(3 * hidden,)`, in place (the same bytes: q | k | v stay interleaved per head)."""
    for kernel, bias in _qkv_keys(config):
        for key in (kernel, bias):
            if key in state:
                array = np.asarray(state[key])
                if array.shape[-2:] != (config.num_heads, 3 * config.head_dim):
                    raise ValueError(f"{key} {array.shape} is not a fused q/k/v of num_heads={config.num_heads} "
                                     f"heads of 3 x {config.head_dim}")
                state[key] = array.reshape(array.shape[:-2] + (3 * config.d_model,))


def from_canonical_state(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
    """The inverse of `to_canonical_state`: each fused q/k/v array back to KerasHub's per-head shape."""
    for kernel, bias in _qkv_keys(config):
        for key in (kernel, bias):
            array = np.asarray(state[key])
            state[key] = array.reshape(array.shape[:-1] + (config.num_heads, 3 * config.head_dim))


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as GPTNeoXBackbone's padding_mask input; every id is a token
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=to_canonical_state,
    from_canonical_state=from_canonical_state, classifier=None, predicts_mask_positions=(),
    expresses=("parallel_residual",), approximations=())
