"""Hugging Face BLOOM (`BloomForCausalLM`, `BloomModel`): a decoder-only, pre-norm model with LayerNorms, a LayerNorm
on the token embeddings (`word_embeddings_layernorm`, canonical `embed_norm`), no position table and ALiBi biases on
the attention scores (canonical `alibi`: transformers' `baddbmm` adds slope * position beside the scores scaled by
1/sqrt(head_dim), unscaled itself), a feed-forward 4 * hidden_size wide with the tanh GELU (`bloom_gelu_forward`,
whose 0.79788456 is sqrt(2/pi) to 8 digits: 1e-10 relative) and a head tied to the embedding unless
`tie_word_embeddings` is false.

`self_attention.query_key_value` holds q, k and v interleaved per head (`_reshape` views its output as `(heads, 3,
head_dim)`): `fused_qkv_heads_t`. Every linear has a bias but `lm_head`. transformers counts ALiBi's positions over
the real tokens of `attention_mask`; the canonical bias counts every key, which differs by a constant in each
query's row under left padding (softmax does not see it). BLOOM has no maximum length; `seq_length` is read where
config.json has one (`max_len`), else 2048, BLOOM's training length. `pretraining_tp` with `slow_but_exact` splits
two matmuls into slices summed in order: the same function, rounded otherwise. Refused, naming the field:
`apply_residual_connection_post_layernorm` (the residual taken after the norm).
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import Float64Fix, HFFamily
from .hf import architecture, boolean, integer, number, optional_integer, prefix_rule, refuse
from .hf_tasks import decoder_heads

NAME = "hf-bloom"
MODEL_TYPE = "bloom"
ARCHITECTURES = ("BloomForCausalLM", "BloomModel")
BASE_PREFIX = "transformer."  # where BloomForCausalLM keeps its BloomModel
DEFAULT_LENGTH = 2048  # BLOOM's training sequence length, where config.json has no seq_length
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_size",
               "num_heads": "n_head", "num_decoder_layers": "n_layer", "max_len": "seq_length",
               "layer_norm_eps": "layer_norm_epsilon"}
HOOKS = {"decoder.embed": "word_embeddings_layernorm",
         # BloomAttention and BloomMLP add the residual themselves: their last linears are the sublayers' outputs
         "decoder.layers.{i}.self_attn": "h.{i}.self_attention.dense",
         "decoder.layers.{i}.ffn": "h.{i}.mlp.dense_4h_to_h",
         "decoder.layers.{i}": "h.{i}", "decoder.final_norm": "ln_f"}

_L = "h.{i}."
BACKBONE = [
    # canonical                                         BloomModel                                   transform
    ("tgt_embed.embedding",                             "word_embeddings.weight",                    "identity"),
    ("tgt_embed_norm.gamma",                            "word_embeddings_layernorm.weight",          "identity"),
    ("tgt_embed_norm.beta",                             "word_embeddings_layernorm.bias",            "identity"),
    ("decoder.layers.{i}.norm1.gamma",                  _L + "input_layernorm.weight",               "identity"),
    ("decoder.layers.{i}.norm1.beta",                   _L + "input_layernorm.bias",                 "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",       _L + "self_attention.query_key_value.weight", "fused_qkv_heads_t"),
    ("decoder.layers.{i}.self_attn.{qkv}.bias",         _L + "self_attention.query_key_value.bias",  "fused_qkv_heads"),
    ("decoder.layers.{i}.self_attn.o.kernel",           _L + "self_attention.dense.weight",          "transpose"),
    ("decoder.layers.{i}.self_attn.o.bias",             _L + "self_attention.dense.bias",            "identity"),
    ("decoder.layers.{i}.norm3.gamma",                  _L + "post_attention_layernorm.weight",      "identity"),
    ("decoder.layers.{i}.norm3.beta",                   _L + "post_attention_layernorm.bias",        "identity"),
    ("decoder.layers.{i}.ffn.linear1.kernel",           _L + "mlp.dense_h_to_4h.weight",             "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",             _L + "mlp.dense_h_to_4h.bias",               "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",           _L + "mlp.dense_4h_to_h.weight",             "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",             _L + "mlp.dense_4h_to_h.bias",               "identity"),
    ("decoder.final_norm.gamma",                        "ln_f.weight",                               "identity"),
    ("decoder.final_norm.beta",                         "ln_f.bias",                                 "identity"),
]
HEAD = [
    ("output.kernel",                                   "lm_head.weight",                            "transpose"),
    ("tgt_embed.embedding",                             "lm_head.weight",                            "tied"),
]


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose BloomModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from BLOOM's `config.json` (and the saved key names)."""
    has_head = any(k.startswith(BASE_PREFIX) or k.startswith("lm_head.") for k in keys)
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, has_head)
    refuse(hf, {"is_encoder_decoder": False, "add_cross_attention": False})
    if boolean(hf, "apply_residual_connection_post_layernorm", False):
        raise ValueError("config.json apply_residual_connection_post_layernorm=true is not supported (the residual "
                         "taken after each sublayer's LayerNorm; the canonical pre-norm residual is its input)")
    vocab = integer(hf, "vocab_size")
    d = optional_integer(hf, "hidden_size") or optional_integer(hf, "n_embed")
    heads = optional_integer(hf, "n_head") or optional_integer(hf, "num_attention_heads")
    layers = optional_integer(hf, "n_layer") or optional_integer(hf, "num_hidden_layers")
    if d is None or not heads or d % heads:
        raise ValueError(f"config.json hidden_size={d} is not divisible by n_head={heads}")
    if layers is None:
        raise ValueError("config.json has no n_layer")
    lm = arch == ARCHITECTURES[0]
    notes = hf_llama.pad_note(hf, MODEL_TYPE)
    length = optional_integer(hf, "seq_length")
    if length is None:
        notes.append(f"config.json has no seq_length: max_len={DEFAULT_LENGTH} (BLOOM's training length; its ALiBi "
                     "biases take any length, --set max_len=N for longer inputs)")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads, num_encoder_layers=0,
        num_decoder_layers=layers, d_ff=4 * d, max_len=length or DEFAULT_LENGTH,
        dropout=number(hf, "hidden_dropout", 0.0), activation="gelu_tanh", norm_first=True, final_norm=True,
        norm="layer", layer_norm_eps=number(hf, "layer_norm_epsilon", 1e-5), positional="none", alibi=True,
        scale_embedding=False, embed_norm=True, bias=True,
        tie_embeddings=boolean(hf, "tie_word_embeddings", True) if lm else False, pad_id=None, output_bias=False,
        output_projection=lm)
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no BLOOM equivalent (empty if it has one)."""
    wanted = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "norm": "layer",
              "norm_weight_offset": 0.0, "positional": "none", "alibi": True, "alibi_scaled": False,
              "activation": "gelu_tanh", "ffn_gated": False, "scale_embedding": False, "embed_norm": True,
              "head_transform": False, "type_vocab_size": 0, "pooler": False, "qk_norm": False, "head_size": None,
              "num_kv_heads": None, "sliding_window": None, "d_ff": 4 * config.d_model}
    problems = [f"{k}={getattr(config, k)!r} ({MODEL_TYPE} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if not (config.has_qkv_bias and config.has_o_bias and config.has_ffn_bias):
        problems.append(f"a linear without a bias ({MODEL_TYPE} has them on every linear but lm_head)")
    if config.output_projection and config.has_output_bias:
        problems.append(f"output_bias=True ({MODEL_TYPE}'s lm_head has no bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    hf: dict[str, Any] = {
        "model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.tgt_vocab_size,
        "hidden_size": config.d_model, "n_head": config.num_heads, "n_layer": config.num_decoder_layers,
        "seq_length": config.max_len, "layer_norm_epsilon": config.layer_norm_eps,
        "apply_residual_connection_post_layernorm": False, "hidden_dropout": config.dropout,
        "attention_dropout": config.dropout, "pretraining_tp": 1, "slow_but_exact": False,
        "tie_word_embeddings": config.tie_embeddings and config.output_projection,
        "pad_token_id": config.pad_id, "bos_token_id": None, "eos_token_id": None}
    return hf, arch


def exact_float64(model64, config: rn.TransformerConfig) -> None:
    """transformers' float64 BLOOM as float64 throughout: `BloomAttention` takes its softmax in float32 (`F.softmax(...,
    dtype=torch.float32)`) and its ALiBi slopes are float32 (`_get_alibi_slopes`; inexact for head counts whose
    slopes are not powers of two, 16 heads and up). Each is replaced by the same formula in float64: the attention
    (without dropout, as in eval mode) and the slopes the reference's, counted over the real tokens as transformers
    counts them. Its GELU's 0.79788456 is sqrt(2/pi) to 8 digits: 1e-10 relative, 7e-10 on the logits of the test
    models in float64 (nothing in float32), so the float64 run takes sqrt(2/pi), the reference's `gelu_tanh`."""
    import types

    import torch

    def build_alibi_tensor(self, attention_mask, num_heads, dtype):
        slopes = torch.as_tensor(rn.alibi.slopes(num_heads), dtype=torch.float64)
        positions = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :]  # (B, 1, T)
        alibi = slopes[None, :, None] * positions.double()  # (B, H, T)
        return alibi.reshape(-1, 1, attention_mask.shape[1]).to(dtype)

    def attention(self, hidden_states, residual, alibi, attention_mask, layer_past=None, use_cache=False,
                  output_attentions=False, **kwargs):
        b, t, _ = hidden_states.shape
        q, k, v = self._reshape(self.query_key_value(hidden_states))  # (B, H, T, d) each
        if layer_past is not None:
            k, v = layer_past.update(k, v, self.layer_idx)
        scores = q @ k.transpose(-1, -2) * self.inv_norm_factor + alibi.view(b, self.num_heads, 1, -1)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = torch.softmax(scores, dim=-1)  # (B, H, T, Tk)
        context = (probs @ v).transpose(1, 2).reshape(b, t, -1)  # (B, H, T, d) -> (B, T, H*d)
        return residual + self.dense(context), probs

    def gelu(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    for module in model64.modules():
        kind = type(module).__name__
        if kind == "BloomGelu":
            module.forward = types.MethodType(gelu, module)
        elif kind == "BloomModel":
            module.build_alibi_tensor = types.MethodType(build_alibi_tensor, module)
        elif kind == "BloomAttention":
            module.forward = types.MethodType(attention, module)


# Where the BloomModel sits: under `transformer.` in the causal-LM class, at the top in the bare model; when reading,
# wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm=ARCHITECTURES[0])


TASK_HEADS = decoder_heads("Bloom", token_score="classifier")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("alibi",),  # `layouts.FAMILY_ONLY` settings it has
    approximations=(),
    float64_fix=Float64Fix("the attention softmax and the ALiBi slopes, which transformers computes in float32, "
                           "and its GELU's 0.79788456 for sqrt(2/pi), replaced by the exact ones", exact_float64))
