"""Hugging Face Starcoder2 (`Starcoder2ForCausalLM`, `Starcoder2Model`): Llama's attention (rotary positions,
grouped-query attention, q/k/v/o `nn.Linear`s) with biases on every linear (`use_bias`), LayerNorms with a bias
(`norm_epsilon`), a plain feed-forward `c_fc -> gelu_pytorch_tanh -> c_proj`, and one sliding window for every layer
where config.json sets one. The head is tied to the embedding unless config.json says otherwise.

The attention names and the rotary settings are Llama's (`hf_llama`); the rest is read and written here."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import HFFamily
from .hf import activation, architecture, boolean, integer, number, optional_integer, refuse
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-starcoder2"
MODEL_TYPE = "starcoder2"
ARCHITECTURES = ("Starcoder2ForCausalLM", "Starcoder2Model")
# Llama-style settings for the window and the config.json Llama writes (`hf_llama`): no attention_bias or
# mlp_bias keys, use_bias says both.
SPEC = FamilySpec(MODEL_TYPE, ARCHITECTURES, attention_bias=None, mlp_bias=None, sliding=True)
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "layer_norm_eps": "norm_epsilon"}

_L = "layers.{i}."
MLP = [
    # canonical                                         Starcoder2Model                         transform
    ("decoder.layers.{i}.ffn.linear1.kernel",           _L + "mlp.c_fc.weight",                 "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",             _L + "mlp.c_fc.bias",                   "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",           _L + "mlp.c_proj.weight",               "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",             _L + "mlp.c_proj.bias",                 "identity"),
]
# Llama's names with LayerNorm biases, and a plain feed-forward
BACKBONE = hf_llama.NORMS_AND_EMBEDDING + hf_llama.NORM_BIASES + hf_llama.ATTENTION + MLP


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose Starcoder2Model sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + hf_llama.HEAD


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Starcoder2's `config.json` (and the saved key names)."""
    has_head = any(k.startswith(hf_llama.BASE_PREFIX) or k == "lm_head.weight" for k in keys)
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, has_head)
    refuse(hf, {"is_encoder_decoder": False})
    vocab, d, heads = integer(hf, "vocab_size"), integer(hf, "hidden_size"), integer(hf, "num_attention_heads")
    if heads == 0 or d % heads:
        raise ValueError(f"config.json hidden_size={d} is not divisible by num_attention_heads={heads}")
    theta, scaling, fraction = hf_llama.rope(hf)
    if fraction != 1.0:
        raise ValueError(f"config.json partial_rotary_factor={fraction!r} is not supported for {MODEL_TYPE} (it "
                         "rotates every dim of a head)")
    notes = hf_llama.pad_note(hf, MODEL_TYPE)
    lm = arch == ARCHITECTURES[0]
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads,
        num_kv_heads=hf_llama._kv_heads(hf, heads),
        num_encoder_layers=0, num_decoder_layers=integer(hf, "num_hidden_layers"),
        d_ff=integer(hf, "intermediate_size"), max_len=integer(hf, "max_position_embeddings"),
        dropout=number(hf, "attention_dropout", 0.0), activation=activation(hf, "hidden_act", "gelu_pytorch_tanh"),
        norm_first=True, final_norm=True, norm="layer", layer_norm_eps=number(hf, "norm_epsilon", 1e-5),
        positional="rope", rope_theta=theta, rope_scaling=scaling, scale_embedding=False,
        bias=boolean(hf, "use_bias", True), ffn_gated=False, sliding_window=hf_llama._sliding_window(hf, SPEC),
        tie_embeddings=boolean(hf, "tie_word_embeddings", True) if lm else False, pad_id=None, output_bias=False,
        output_projection=lm)
    if optional_integer(hf, "head_dim") not in (None, config.head_dim):
        raise ValueError(f"config.json head_dim={hf['head_dim']!r} is not hidden_size / num_attention_heads "
                         f"({config.head_dim}), which {MODEL_TYPE} computes")
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no Starcoder2 equivalent (empty if it has one)."""
    wanted = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "norm": "layer",
              "norm_weight_offset": 0.0, "positional": "rope", "rotary_fraction": 1.0, "ffn_gated": False,
              "scale_embedding": False, "embed_norm": False, "head_transform": False, "type_vocab_size": 0,
              "pooler": False, "qk_norm": False, "head_size": None}
    problems = [f"{k}={getattr(config, k)!r} ({MODEL_TYPE} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if len({config.has_qkv_bias, config.has_o_bias, config.has_ffn_bias}) > 1:
        problems.append(f"biases on some linears but not others ({MODEL_TYPE}'s use_bias sets them all)")
    if config.output_projection and config.has_output_bias:
        problems.append(f"output_bias=True ({MODEL_TYPE}'s lm_head has no bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf, _ = hf_llama.write_config(config, SPEC)
    for key in ("rms_norm_eps", "head_dim"):
        hf.pop(key)
    hf.update(norm_epsilon=config.layer_norm_eps, use_bias=config.has_ffn_bias, architectures=[arch],
              residual_dropout=config.dropout, embedding_dropout=config.dropout,
              tie_word_embeddings=config.tie_embeddings if config.output_projection else True)
    return hf, arch


def prefix(arch: str, keys: Collection[str] | None = None) -> str:
    return hf_llama.prefix_for(arch, keys, SPEC, hf_llama.BASE_PREFIX)


TASK_HEADS = decoder_heads("Starcoder2", qa=False)  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=(), approximations=(), float64_fix=None)
