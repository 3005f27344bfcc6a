"""Hugging Face Falcon (`FalconForCausalLM`, `FalconModel`; Falcon-7B, -40B, -180B, Falcon-RW): a decoder-only,
pre-norm model with LayerNorms and rotary positions over whole heads, in three forms.

- `parallel_attn` (Falcon-7B): attention and feed-forward read one `input_layernorm` side by side and add to the
  residual at once (canonical `parallel_residual` with `ffn_shares_norm`); usually `multi_query`: one key/value head.
- `new_decoder_architecture` (Falcon-40B / 180B): always parallel, each sublayer with its LayerNorm (`ln_attn` is
  `norm1`, `ln_mlp` `norm3`: `parallel_residual` alone), or one `input_layernorm` where `num_ln_in_parallel_attn`
  is 1; `num_kv_heads` grouped key/value heads (`multi_query` and `parallel_attn` are not read).
- neither (Falcon-RW): one sublayer after the other, `post_attention_layernorm` (`norm3`) before the feed-forward.

`self_attention.query_key_value` holds q, k and v as transformers' `_split_heads` views them: per key/value group
its query heads, then its key, then its value (`fused_qkv_groups_t`: new_decoder_architecture's `num_kv_heads`
groups, one group under multi_query, one per head under neither). `alibi` (Falcon-RW-1B) puts ALiBi biases in place of
rotary positions, added before the scores are scaled by 1/sqrt(head_dim) (canonical `alibi_scaled`), as
transformers' SDPA path computes them (its mask holds alibi / sqrt(head_dim)); its eager path, which
`output_attentions` takes, adds them twice (once scaled with the scores, once in the mask). Its slopes and slopes times
positions are bfloat16 (`build_alibi_tensor`, as Falcon-RW's own code), canonical `alibi_bfloat16`: exact for
power-of-two slopes (up to 8 heads) over at most 256 positions, where the config stores it as False, 8 significant
bits otherwise. `bias` switches every linear's bias but
`lm_head`'s (it has none); the head is tied unless `tie_word_embeddings` is false. Refused, naming the field:
a head_dim other than hidden_size / heads,
`num_kv_heads` other than the heads without new_decoder_architecture or multi_query (transformers cannot run it),
a partial rotary factor, and the norm layouts transformers builds but cannot run (`num_ln_in_parallel_attn` 2
without new_decoder_architecture; new_decoder_architecture with `parallel_attn` false). transformers adds the
attention output into the feed-forward's (in place) and then the residual, `x + (ffn + attn)`, where the canonical
order is `(x + attn) + ffn`: one rounding apart (2.8e-15 in f64).
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_llama
from .family import HFFamily
from .hf import (TO_HF_ACTIVATION, activation, architecture, boolean, integer, number, optional_integer,
                 prefix_rule, refuse)
from .hf_tasks import decoder_heads

NAME = "hf-falcon"
MODEL_TYPE = "falcon"
ARCHITECTURES = ("FalconForCausalLM", "FalconModel")
BASE_PREFIX = "transformer."  # where FalconForCausalLM keeps its FalconModel
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "hidden_size",
               "num_heads": "num_attention_heads", "num_kv_heads": "num_kv_heads",
               "num_decoder_layers": "num_hidden_layers", "d_ff": "ffn_hidden_size",
               "max_len": "max_position_embeddings", "layer_norm_eps": "layer_norm_epsilon",
               "parallel_residual": "parallel_attn", "ffn_shares_norm": "num_ln_in_parallel_attn"}
HOOKS = {"decoder.layers.{i}.self_attn": "h.{i}.self_attention", "decoder.layers.{i}.ffn": "h.{i}.mlp",
         "decoder.layers.{i}": "h.{i}", "decoder.final_norm": "ln_f"}

_L = "h.{i}."
BACKBONE = [
    # canonical                                         FalconModel                                  transform
    ("tgt_embed.embedding",                             "word_embeddings.weight",                    "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",       _L + "self_attention.query_key_value.weight", "fused_qkv_groups_t"),
    ("decoder.layers.{i}.self_attn.{qkv}.bias",         _L + "self_attention.query_key_value.bias",  "fused_qkv_groups"),
    ("decoder.layers.{i}.self_attn.o.kernel",           _L + "self_attention.dense.weight",          "transpose"),
    ("decoder.layers.{i}.self_attn.o.bias",             _L + "self_attention.dense.bias",            "identity"),
    ("decoder.layers.{i}.ffn.linear1.kernel",           _L + "mlp.dense_h_to_4h.weight",             "transpose"),
    ("decoder.layers.{i}.ffn.linear1.bias",             _L + "mlp.dense_h_to_4h.bias",               "identity"),
    ("decoder.layers.{i}.ffn.linear2.kernel",           _L + "mlp.dense_4h_to_h.weight",             "transpose"),
    ("decoder.layers.{i}.ffn.linear2.bias",             _L + "mlp.dense_4h_to_h.bias",               "identity"),
    ("decoder.final_norm.gamma",                        "ln_f.weight",                               "identity"),
    ("decoder.final_norm.beta",                         "ln_f.bias",                                 "identity"),
    ("-",                                               "rotary_emb.inv_freq",                       "rope_inv_freq"),
    ("-",                                               _L + "self_attention.rotary_emb.inv_freq",   "rope_inv_freq"),
]
NORMS = {  # (norm1, norm3) of each form: side by side on one norm, on two, or one after the other
    "shared": ("input_layernorm", None), "two": ("ln_attn", "ln_mlp"),
    "sequential": ("input_layernorm", "post_attention_layernorm")}
HEAD = [
    ("output.kernel",                                   "lm_head.weight",                            "transpose"),
    ("tgt_embed.embedding",                             "lm_head.weight",                            "tied"),
]


def _form(config: rn.TransformerConfig) -> str:
    if not config.parallel_residual:
        return "sequential"
    return "shared" if config.ffn_shares_norm else "two"


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose FalconModel sits under `prefix`."""
    norms = [(f"decoder.layers.{{i}}.{ours}.{param}", f"{_L}{theirs}.{external}", "identity")
             for ours, theirs in zip(("norm1", "norm3"), NORMS[_form(config)]) if theirs is not None
             for param, external in (("gamma", "weight"), ("beta", "bias"))]
    return [(c, prefix + e, t) for c, e, t in BACKBONE + norms] + HEAD


def _layout(hf: Mapping[str, Any], heads: int) -> tuple[bool, bool, int | None]:
    """`(parallel_residual, ffn_shares_norm, num_kv_heads)` as transformers' FalconDecoderLayer and FalconAttention
    read `new_decoder_architecture`, `parallel_attn`, `num_ln_in_parallel_attn`, `multi_query` and `num_kv_heads`."""
    new, parallel = boolean(hf, "new_decoder_architecture", False), boolean(hf, "parallel_attn", True)
    norms, kv = optional_integer(hf, "num_ln_in_parallel_attn"), optional_integer(hf, "num_kv_heads") or heads
    if norms not in (None, 1, 2):
        raise ValueError(f"config.json num_ln_in_parallel_attn={norms!r} is not supported (1 or 2)")
    if new:
        if not parallel:  # FalconDecoderLayer builds input/post_attention_layernorm, then reads ln_attn or nothing
            raise ValueError("config.json parallel_attn=false beside new_decoder_architecture=true is not supported "
                             "(transformers' FalconDecoderLayer cannot run it)")
        if kv <= 0 or heads % kv:
            raise ValueError(f"config.json num_kv_heads={kv} does not divide num_attention_heads={heads}")
        return True, norms == 1, None if kv == heads else kv
    if parallel and norms == 2:  # ln_attn and ln_mlp built, input_layernorm read
        raise ValueError("config.json num_ln_in_parallel_attn=2 without new_decoder_architecture is not supported "
                         "(transformers' FalconDecoderLayer cannot run it)")
    if boolean(hf, "multi_query", True):
        return parallel, parallel, 1
    if kv != heads:  # FalconAttention splits heads key/value heads and reshapes them to num_kv_heads
        raise ValueError(f"config.json num_kv_heads={kv} without new_decoder_architecture or multi_query is not "
                         f"supported (transformers' FalconAttention cannot run it; {heads} key/value heads are)")
    return parallel, parallel, None


def config_from_hf(hf: Mapping[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from Falcon's `config.json` (and the saved key names)."""
    has_head = any(k.startswith(BASE_PREFIX) or k.startswith("lm_head.") for k in keys)
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, has_head)
    refuse(hf, {"is_encoder_decoder": False, "add_cross_attention": False})
    alibi = boolean(hf, "alibi", False)
    vocab, d = integer(hf, "vocab_size"), optional_integer(hf, "hidden_size") or optional_integer(hf, "n_embed")
    heads = integer(hf, "num_attention_heads")
    if d is None or heads == 0 or d % heads:
        raise ValueError(f"config.json hidden_size={d} is not divisible by num_attention_heads={heads}")
    if optional_integer(hf, "head_dim") not in (None, d // heads):  # FalconConfig.head_dim is hidden / heads
        raise ValueError(f"config.json head_dim={hf['head_dim']!r} is not supported for {MODEL_TYPE} (its heads are "
                         f"hidden_size / num_attention_heads = {d // heads} wide)")
    parallel, shares, kv = _layout(hf, heads)
    theta, scaling, fraction = hf_llama.rope(hf)
    if alibi:  # FalconAttention skips the rotation: its rope parameters are not read
        theta, scaling, fraction = 10000.0, None, 1.0
    if fraction != 1.0:  # FalconRotaryEmbedding turns every dim of a head
        raise ValueError(f"config.json partial_rotary_factor={fraction!r} is not supported for {MODEL_TYPE} (its "
                         "rotary positions turn whole heads)")
    lm, bias = arch == ARCHITECTURES[0], boolean(hf, "bias", False)
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads, num_kv_heads=kv,
        num_encoder_layers=0, num_decoder_layers=integer(hf, "num_hidden_layers"),
        d_ff=optional_integer(hf, "ffn_hidden_size") or 4 * d, max_len=integer(hf, "max_position_embeddings"),
        dropout=number(hf, "hidden_dropout", 0.0), activation=activation(hf, "activation", "gelu"), norm_first=True,
        final_norm=True, norm="layer", layer_norm_eps=number(hf, "layer_norm_epsilon", 1e-5),
        positional="none" if alibi else "rope", alibi=alibi, alibi_scaled=alibi, alibi_bfloat16=alibi,
        rope_theta=theta, rope_scaling=scaling, scale_embedding=False, bias=bias, parallel_residual=parallel,
        ffn_shares_norm=shares, tie_embeddings=boolean(hf, "tie_word_embeddings", True) if lm else False,
        pad_id=None, output_bias=False, output_projection=lm)
    return config, arch, hf_llama.pad_note(hf, MODEL_TYPE)


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no Falcon equivalent (empty if it has one)."""
    wanted = {"num_encoder_layers": 0, "norm_first": True, "final_norm": True, "norm": "layer",
              "norm_weight_offset": 0.0, "rotary_fraction": 1.0, "rotary_interleaved": False,
              "ffn_gated": False, "scale_embedding": False, "embed_norm": False, "head_transform": False,
              "type_vocab_size": 0, "pooler": False, "qk_norm": False, "head_size": None, "sliding_window": None}
    problems = [f"{k}={getattr(config, k)!r} ({MODEL_TYPE} needs {v!r})" for k, v in wanted.items()
                if getattr(config, k) != v]
    if config.positional != ("none" if config.alibi else "rope"):
        problems.append(f"positional={config.positional!r} ({MODEL_TYPE} needs 'rope', or ALiBi: 'none')")
    if config.alibi and not config.alibi_scaled:
        problems.append(f"alibi_scaled=False ({MODEL_TYPE} adds ALiBi's bias before the scores are scaled)")
    if config.alibi and not config.alibi_bfloat16 and config.replace(alibi_bfloat16=True).alibi_bfloat16:
        problems.append(f"alibi_bfloat16=False ({MODEL_TYPE} rounds ALiBi's slopes and biases to bfloat16, which "
                        f"changes them for {config.num_heads} heads over max_len={config.max_len})")
    if len({config.has_qkv_bias, config.has_o_bias, config.has_ffn_bias}) != 1:
        problems.append(f"biases on some linears only ({MODEL_TYPE}'s bias switches q/k/v, the attention output and "
                        "the feed-forward together)")
    if config.output_projection and config.has_output_bias:
        problems.append(f"output_bias=True ({MODEL_TYPE}'s lm_head has no bias)")
    if not config.parallel_residual and config.num_kv_heads not in (None, 1):
        problems.append(f"num_kv_heads={config.num_kv_heads} one sublayer after the other ({MODEL_TYPE} groups key/"
                        "value heads only in new_decoder_architecture, which is parallel)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts: the older decoder where it
    holds the config (one key/value head or all, one norm or sequential), new_decoder_architecture otherwise."""
    arch = ARCHITECTURES[0 if config.output_projection else 1]
    kv = config.num_kv_heads or config.num_heads
    new = config.parallel_residual and (not config.ffn_shares_norm or kv not in (1, config.num_heads))
    hf: dict[str, Any] = {
        "model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.tgt_vocab_size,
        "hidden_size": config.d_model, "num_attention_heads": config.num_heads, "num_kv_heads": kv,
        "num_hidden_layers": config.num_decoder_layers, "ffn_hidden_size": config.d_ff,
        "max_position_embeddings": config.max_len, "activation": TO_HF_ACTIVATION[config.activation],
        "layer_norm_epsilon": config.layer_norm_eps, "bias": config.has_o_bias, "alibi": config.alibi,
        "new_decoder_architecture": new, "multi_query": not new and kv == 1,
        "parallel_attn": config.parallel_residual,
        "num_ln_in_parallel_attn": (1 if config.ffn_shares_norm else 2) if new else None,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta, **(config.rope_scaling or {})},
        "hidden_dropout": config.dropout, "attention_dropout": config.dropout,
        "tie_word_embeddings": config.tie_embeddings and config.output_projection,
        "pad_token_id": config.pad_id, "bos_token_id": None, "eos_token_id": None}
    if (config.rope_scaling or {}).get("rope_type") in hf_llama.TOP_LEVEL_ORIGINAL:  # the one transformers 5 reads
        hf["original_max_position_embeddings"] = config.rope_scaling["original_max_position_embeddings"]
    return hf, arch


# Where the FalconModel sits: under `transformer.` in the causal-LM class, at the top in the bare model; when
# reading, wherever the saved keys put it.
prefix = prefix_rule(BASE_PREFIX, lm=ARCHITECTURES[0])


TASK_HEADS = decoder_heads("Falcon", token_score="classifier")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix=BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("parallel_residual", "ffn_shares_norm", "alibi", "alibi_scaled", "alibi_bfloat16"),  # FAMILY_ONLY
    approximations=(), float64_fix=None)
