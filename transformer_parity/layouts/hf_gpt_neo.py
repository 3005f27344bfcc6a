"""Hugging Face GPT-Neo (`GPTNeoForCausalLM`, `GPTNeoModel`): GPT-2's pre-LN decoder with learned positions, a final
`ln_f` and a tied head, with `nn.Linear`s (`(out, in)`, transposed to canonical kernels): q, k and v separate and
without biases, `out_proj`, `c_fc` and `c_proj` with them; attention scores not scaled at all
(`attention_scale="none"`); and layers of two kinds by `attention_types` (expanded as transformers does, e.g.
`[[["global", "local"], 12]]`): a "local" layer's query at i attends keys j with i - j < `window_size` (`layer_kinds`
"sliding", `sliding_window`), a "global" one every earlier key.

transformers' GPT-Neo computes attention scores in float32 even in a float64 model: verify's float64 run computes
them in float64 (`exact_attention`). It masks by adding finfo.min, so a padded query whose whole local window is
padding still attends (to scores near finfo.min) where the reference, which has no key for it, gives zeros: the two
differ at such padded positions alone, which no real position reads; verify leaves them out of its comparisons with
the source (`rn.rows_seeing_no_key`)."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from .family import Float64Fix, HFFamily
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, optional_integer, prefix_rule,
                 refuse, token_id)
from .hf_tasks import decoder_heads

NAME = "hf-gpt-neo"
MODEL_TYPE = "gpt_neo"
ARCHITECTURES = ("GPTNeoForCausalLM", "GPTNeoModel")
BASE_PREFIX = "transformer."  # where GPTNeoForCausalLM keeps its GPTNeoModel
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_size",
               "num_heads": "num_heads", "num_decoder_layers": "num_layers", "d_ff": "intermediate_size",
               "max_len": "max_position_embeddings", "layer_kinds": "attention_types", "sliding_window": "window_size",
               "layer_norm_eps": "layer_norm_epsilon"}
KINDS = {"global": "full", "local": "sliding"}  # its attention types -> canonical layer kinds

_L = "h.{i}."
BACKBONE = [
    # canonical                                        GPTNeoModel                              transform
    ("tgt_embed.embedding",                            "wte.weight",                            "identity"),
    ("tgt_pos.embedding",                              "wpe.weight",                            "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",      _L + "attn.attention.{qkv}_proj.weight",  "transpose"),
    ("decoder.layers.{i}.self_attn.o.kernel",          _L + "attn.attention.out_proj.weight",    "transpose"),
    ("decoder.layers.{i}.self_attn.o.bias",            _L + "attn.attention.out_proj.bias",      "identity"),
    ("decoder.layers.{i}.norm1.gamma",                 _L + "ln_1.weight",                      "identity"),
    ("decoder.layers.{i}.norm1.beta",                  _L + "ln_1.bias",                        "identity"),
    ("decoder.layers.{i}.ffn.linear1.kernel",          _L + "mlp.c_fc.weight",                  "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",            _L + "mlp.c_fc.bias",                    "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",          _L + "mlp.c_proj.weight",                "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",            _L + "mlp.c_proj.bias",                  "identity"),
    ("decoder.layers.{i}.norm3.gamma",                 _L + "ln_2.weight",                      "identity"),
    ("decoder.layers.{i}.norm3.beta",                  _L + "ln_2.bias",                        "identity"),
    ("decoder.final_norm.gamma",                       "ln_f.weight",                           "identity"),
    ("decoder.final_norm.beta",                        "ln_f.bias",                             "identity"),
    # transformers <= 4.30 saved each layer's mask (a local layer's: the causal band of window_size) and fill value
    ("-",                                              _L + "attn.attention.bias",              "causal_mask"),
    ("-",                                              _L + "attn.attention.masked_bias",       "mask_fill"),
]
HEAD = [
    ("output.kernel",                                  "lm_head.weight",                        "transpose"),
    ("tgt_embed.embedding",                            "lm_head.weight",                        "tied"),
]
HOOKS = {"decoder.layers.{i}.self_attn": "h.{i}.attn", "decoder.layers.{i}.ffn": "h.{i}.mlp",
         "decoder.layers.{i}": "h.{i}", "decoder.final_norm": "ln_f"}
WANTED = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "positional": "learned",
          "position_offset": 0, "scale_embedding": False, "embed_norm": False, "head_transform": False,
          "type_vocab_size": 0, "pooler": False, "norm": "layer", "ffn_gated": False, "attention_scale": "none",
          "num_kv_heads": None, "head_size": None}


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose GPTNeoModel sits under `prefix`."""
    return [(c, prefix + e, t) for c, e, t in BACKBONE] + HEAD


def layer_kinds(hf: Mapping[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    """`(kind per layer, window)` from `attention_types` (`[[kinds, repeats], ...]`, expanded in order; absent:
    GPTNeoConfig's `[[["global", "local"], 12]]`), which must agree with `attention_layers` where that is given."""
    types = hf.get("attention_types", [[["global", "local"], 12]])
    try:
        expanded = [kind for kinds, repeats in types for _ in range(repeats) for kind in kinds]
    except (TypeError, ValueError):
        raise ValueError(f"config.json attention_types={types!r} is not a list of [kinds, repeats]") from None
    if len(expanded) != layers or not set(expanded) <= set(KINDS):
        raise ValueError(f"config.json attention_types={types!r} gives {expanded!r}: global or local for each of "
                         f"num_layers={layers}")
    if hf.get("attention_layers") not in (None, expanded):
        raise ValueError(f"config.json attention_layers={hf['attention_layers']!r} disagrees with attention_types="
                         f"{types!r}")
    kinds = tuple(KINDS[kind] for kind in expanded)
    if "sliding" not in kinds:
        return None, None  # every layer global: no window at all
    return kinds, integer(hf, "window_size", 256)


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from GPT-Neo's `config.json` (and the saved key names)."""
    has_head = any(k.startswith(BASE_PREFIX) or k == "lm_head.weight" for k in keys)
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, has_head)
    refuse(hf, {"is_encoder_decoder": False, "add_cross_attention": False})
    vocab, d, layers = integer(hf, "vocab_size"), integer(hf, "hidden_size"), integer(hf, "num_layers")
    pad = token_id(hf, "pad_token_id", vocab)
    notes = [] if pad is None else [f"config.json pad_token_id={pad!r} is not used: GPT-Neo derives no padding mask "
                                    "from ids, so pad_id=None (every id is a real token; --set pad_id=N to mask id N)"]
    kinds, window = layer_kinds(hf, layers)
    lm = arch == ARCHITECTURES[0]
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=integer(hf, "num_heads"),
        num_encoder_layers=0, num_decoder_layers=layers, d_ff=optional_integer(hf, "intermediate_size") or 4 * d,
        max_len=integer(hf, "max_position_embeddings"), dropout=number(hf, "resid_dropout", 0.0),
        activation=activation(hf, "activation_function", "gelu_new"), norm_first=True, final_norm=True,
        layer_norm_eps=number(hf, "layer_norm_epsilon", 1e-5), positional="learned", scale_embedding=False,
        bias=True, qkv_bias=False, attention_scale="none", sliding_window=window, layer_kinds=kinds,
        tie_embeddings=boolean(hf, "tie_word_embeddings", True) if lm else False, pad_id=None, output_bias=False,
        output_projection=lm)
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no GPT-Neo equivalent (empty if it has one)."""
    problems = [f"{k}={getattr(config, k)!r} (GPT-Neo needs {v!r})" for k, v in WANTED.items()
                if getattr(config, k) != v]
    if config.has_qkv_bias or not config.has_o_bias or not config.has_ffn_bias:
        problems.append("biases other than on out_proj, c_fc and c_proj alone (GPT-Neo's)")
    if config.output_projection and config.has_output_bias:
        problems.append("output_bias=True (GPT-Neo's lm_head has no bias)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    ours = {kind: name for name, kind in KINDS.items()}
    kinds = [ours[config.layer_kind(i)] for i in range(config.num_decoder_layers)]
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.tgt_vocab_size,
          "hidden_size": config.d_model, "num_heads": config.num_heads, "num_layers": config.num_decoder_layers,
          "attention_types": [[kinds, 1]], "window_size": config.sliding_window or 256,
          "intermediate_size": config.d_ff, "max_position_embeddings": config.max_len,
          "activation_function": TO_HF_ACTIVATION[config.activation], "layer_norm_epsilon": config.layer_norm_eps,
          "resid_dropout": config.dropout, "embed_dropout": config.dropout, "attention_dropout": config.dropout,
          "tie_word_embeddings": config.tie_embeddings if config.output_projection else True,
          "pad_token_id": config.pad_id, "bos_token_id": None, "eos_token_id": None}
    return hf, arch


# Where the GPTNeoModel sits: under `transformer.` in the causal-LM class, at the top in the bare model; when
# reading, wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm=ARCHITECTURES[0])


def exact_attention(model64, config: rn.TransformerConfig) -> None:
    """GPT-Neo's attention scores in the model's own dtype (transformers casts q and k to float32 first), its
    masks as it applies them."""
    import types

    import torch

    def attend(self, query, key, value, attention_mask=None):
        scores = query @ key.transpose(-1, -2)  # (B, H, Tq, Tk)
        tq, tk = query.size(-2), key.size(-2)
        kept = self.bias[:, :, tk - tq:tk, :tk]
        scores = torch.where(kept, scores, torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
        if attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights

    for module in model64.modules():
        if type(module).__name__ == "GPTNeoSelfAttention":
            module._attn = types.MethodType(attend, module)


TASK_HEADS = decoder_heads("GPTNeo", token_score="classifier")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=("layer_kinds", "attention_scale"),
    approximations=(),
    float64_fix=Float64Fix("GPT-Neo's attention scores, which transformers computes in float32, computed in float64",
                           exact_attention))
