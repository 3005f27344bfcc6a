"""Hugging Face GPT-J (`GPTJForCausalLM`, `GPTJModel`): a decoder-only model whose attention and feed-forward read one
LayerNorm's output (`ln_1`) side by side and add to the residual at once (canonical `parallel_residual` with
`ffn_shares_norm`), with rotary positions on adjacent dim pairs (`rotate_every_two`: canonical
`rotary_interleaved`) over the first `rotary_dim` dims of each head, at GPT-J's fixed base of 10000.

q, k, v and `out_proj` have no biases; the feed-forward's `fc_in` / `fc_out` and the head `lm_head` have them.
`rotary_dim` null (transformers then builds its tables `n_embd` wide, which only a single head could use) is
refused. In a float64 model transformers still builds its sinusoid table in float32 and takes q and k to float32
for the scores (`GPTJAttention._attn`); verify's float64 run replaces both by the float64 ones (`float64_fix`).
"""

from __future__ import annotations

import types
from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import Float64Fix, HFFamily
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, optional_integer, prefix_rule,
                 refuse)
from .hf_tasks import decoder_heads

NAME = "hf-gptj"
MODEL_TYPE = "gptj"
ARCHITECTURES = ("GPTJForCausalLM", "GPTJModel")
BASE_PREFIX = "transformer."  # where GPTJForCausalLM keeps its GPTJModel
ROPE_THETA = 10000.0  # GPT-J's rotary base, fixed in its code
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "n_embd",
               "num_heads": "n_head", "num_decoder_layers": "n_layer", "d_ff": "n_inner", "max_len": "n_positions",
               "layer_norm_eps": "layer_norm_epsilon", "rotary_fraction": "rotary_dim"}
HOOKS = {"decoder.layers.{i}.self_attn": "h.{i}.attn", "decoder.layers.{i}.ffn": "h.{i}.mlp",
         "decoder.layers.{i}": "h.{i}", "decoder.final_norm": "ln_f"}

_L = "h.{i}."
BACKBONE = [
    # canonical                                         GPTJModel                                transform
    ("tgt_embed.embedding",                             "wte.weight",                            "identity"),
    ("decoder.layers.{i}.norm1.gamma",                  _L + "ln_1.weight",                      "identity"),
    ("decoder.layers.{i}.norm1.beta",                   _L + "ln_1.bias",                        "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",       _L + "attn.{qkv}_proj.weight",           "transpose"),
    ("decoder.layers.{i}.self_attn.o.kernel",           _L + "attn.out_proj.weight",             "transpose"),
    ("decoder.layers.{i}.ffn.linear1.kernel",           _L + "mlp.fc_in.weight",                 "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",             _L + "mlp.fc_in.bias",                   "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",           _L + "mlp.fc_out.weight",                "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",             _L + "mlp.fc_out.bias",                  "identity"),
    ("decoder.final_norm.gamma",                        "ln_f.weight",                           "identity"),
    ("decoder.final_norm.beta",                         "ln_f.bias",                             "identity"),
    ("-",                                               _L + "attn.bias",                        "causal_mask"),  # old
    ("-",                                               _L + "attn.masked_bias",                 "mask_fill"),  # files
]
HEAD = [
    ("output.kernel",                                   "lm_head.weight",                        "transpose"),
    ("output.bias",                                     "lm_head.bias",                          "identity"),
    ("tgt_embed.embedding",                             "lm_head.weight",                        "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose GPTJModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from GPT-J's `config.json` (and the saved key names)."""
    return read_config(hf, keys, MODEL_TYPE, ARCHITECTURES)


def read_config(hf: Mapping[str, Any], keys: Collection[str], model_type: str, architectures: tuple[str, str]
                ) -> tuple[rn.TransformerConfig, str, list[str]]:
    """GPT-J's config reader for `model_type` (CodeGen saves the same fields)."""
    has_head = any(k.startswith(BASE_PREFIX) or k.startswith("lm_head.") for k in keys)
    arch = architecture(hf, model_type, architectures, has_head)
    refuse(hf, {"is_encoder_decoder": False, "add_cross_attention": False})
    vocab, d, heads = integer(hf, "vocab_size"), integer(hf, "n_embd"), integer(hf, "n_head")
    if heads == 0 or d % heads:
        raise ValueError(f"config.json n_embd={d} is not divisible by n_head={heads}")
    rotary = optional_integer(hf, "rotary_dim")
    if rotary is None or not 0 < rotary <= d // heads or rotary % 2:
        raise ValueError(f"config.json rotary_dim={rotary!r} is not supported: an even number of each head's "
                         f"{d // heads} dims is")
    lm = arch == architectures[0]
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads, num_encoder_layers=0,
        num_decoder_layers=integer(hf, "n_layer"), d_ff=optional_integer(hf, "n_inner") or 4 * d,
        max_len=integer(hf, "n_positions"), dropout=number(hf, "resid_pdrop", 0.0),
        activation=activation(hf, "activation_function", "gelu_new"), norm_first=True, final_norm=True,
        norm="layer", layer_norm_eps=number(hf, "layer_norm_epsilon", 1e-5), positional="rope",
        rope_theta=ROPE_THETA, rotary_fraction=rotary / (d // heads), rotary_interleaved=True, scale_embedding=False,
        bias=True, attention_bias=False, parallel_residual=True, ffn_shares_norm=True,
        tie_embeddings=boolean(hf, "tie_word_embeddings", False) if lm else False, pad_id=None,
        output_projection=lm)
    if config.rotary_dim != rotary:
        raise ValueError(f"config.json rotary_dim={rotary} is not a share of head_dim={d // heads} that rounds back")
    return config, arch, hf_llama.pad_note(hf, model_type)


def export_problems(config: rn.TransformerConfig, model_type: str = MODEL_TYPE) -> list[str]:
    """Why `config` has no GPT-J (`model_type`: CodeGen) equivalent (empty if it has one)."""
    wanted = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "norm": "layer",
              "norm_weight_offset": 0.0, "positional": "rope", "rope_theta": ROPE_THETA, "rope_scaling": None,
              "rotary_interleaved": True, "ffn_gated": False, "scale_embedding": False, "embed_norm": False,
              "head_transform": False, "type_vocab_size": 0, "pooler": False, "qk_norm": False, "head_size": None,
              "num_kv_heads": None, "sliding_window": None, "parallel_residual": True, "ffn_shares_norm": True}
    problems = [f"{k}={getattr(config, k)!r} ({model_type} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.has_qkv_bias or config.has_o_bias:
        problems.append(f"attention biases ({model_type} has none)")
    if not config.has_ffn_bias:
        problems.append(f"no feed-forward biases ({model_type} always has them)")
    if config.output_projection and not config.has_output_bias:
        problems.append(f"output_bias=False ({model_type}'s lm_head has a bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig, model_type: str = MODEL_TYPE,
                 architectures: tuple[str, str] = ARCHITECTURES) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = architectures[0 if config.output_projection else 1]
    hf = {"model_type": model_type, "architectures": [arch], "vocab_size": config.tgt_vocab_size,
          "n_embd": config.d_model, "n_head": config.num_heads, "n_layer": config.num_decoder_layers,
          "n_inner": None if config.d_ff == 4 * config.d_model else config.d_ff, "n_positions": config.max_len,
          "rotary_dim": config.rotary_dim, "activation_function": TO_HF_ACTIVATION[config.activation],
          "layer_norm_epsilon": config.layer_norm_eps, "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
          "attn_pdrop": config.dropout, "tie_word_embeddings": config.tie_embeddings and config.output_projection,
          "pad_token_id": config.pad_id, "bos_token_id": None, "eos_token_id": None}
    return hf, arch


# Where the GPTJModel sits: under `transformer.` in the causal-LM class, at the top in the bare model; when reading,
# wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm=ARCHITECTURES[0])


def exact_sinusoids_and_scores(model64, config: rn.TransformerConfig) -> None:
    """Each attention module of a float64 GPT-J (or CodeGen) model: its sinusoid table computed in float64 (transformers builds it from
    float32 frequencies), and its scores from float64 q and k (its `_attn` takes them to float32 first)."""
    import torch

    inv_freq, _ = rn.ops.rope_frequencies(config, config.max_len)
    angles = torch.arange(config.max_len, dtype=torch.float64)[:, None] * torch.as_tensor(inv_freq)  # (T, r/2)
    table = torch.cat((angles.sin(), angles.cos()), dim=1)  # (T, r): sin | cos, as create_sinusoidal_positions

    def scores(self, query, key, value, attention_mask=None):
        weights = torch.matmul(query, key.transpose(-1, -2)) / self.scale_attn  # (B, H, Tq, Tk)
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = torch.nn.functional.softmax(weights, dim=-1)
        return torch.matmul(weights, value), weights

    for module in model64.modules():
        if hasattr(module, "embed_positions") and hasattr(module, "_attn"):
            module.embed_positions = table.clone()
            module._attn = types.MethodType(scores, module)


# `hf_tasks`: the last non-pad position scored by `score`; spans by `qa_outputs` (no token classification class)
TASK_HEADS = tuple(h for h in decoder_heads("GPTJ") if not h.arch.endswith("TokenClassification"))


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("parallel_residual", "ffn_shares_norm", "rotary_interleaved"),  # `layouts.FAMILY_ONLY` settings it has
    approximations=(),
    float64_fix=Float64Fix("the rotary sinusoid table and the attention scores, which transformers computes in float32, "
                           "computed in float64", exact_sinusoids_and_scores))
