"""Hugging Face T5 (`T5ForConditionalGeneration`, `T5Model`): the encoder-decoder with relative position biases.

Pre-norm with RMS norms (`T5LayerNorm`: no mean, no bias) and a final norm per stack; no biases anywhere, no
absolute positions and unscaled attention scores: each stack's first layer holds a table `(buckets, heads)` whose
rows, picked by bucketed relative distance (bidirectional in the encoder, causal in the decoder), are added to every
layer's self-attention scores (`relative_bias_buckets`); cross-attention has none. One token table `shared` serves both
stacks. The feed-forward is `feed_forward_proj`: `relu` (T5 v1.0), `gated-gelu` (v1.1, mT5, Flan-T5: transformers'
`gelu_new`, the tanh form), or another `[gated-]ACT`. T5 v1.0 ties its head to `shared` and rescales the final states
by d_model**-0.5 before it (`logit_divisor` sqrt(d_model)); v1.1 keeps an untied `lm_head` and no rescale.
transformers 5 writes `tie_word_embeddings: true` even then and says which in `scale_decoder_outputs`; the head is
untied where the file holds an `lm_head.weight`. Decoding starts from `decoder_start_token_id` (T5: the pad id, 0).
"""

from __future__ import annotations

import math
from typing import Any, Collection

import reference_numpy as rn

from .family import Float64Fix, HFFamily
from .hf import ACTIVATIONS, TO_HF_ACTIVATION, architecture, integer, number, refuse, token_id
from .hf_tasks import Head, linear

NAME = "hf-t5"
MODEL_TYPE = "t5"
ARCHITECTURES = ("T5ForConditionalGeneration", "T5Model")
CONFIG_KEYS = {"src_vocab_size": "vocab_size", "tgt_vocab_size": "vocab_size", "d_model": "d_model",
               "num_heads": "num_heads", "head_size": "d_kv", "num_encoder_layers": "num_layers",
               "num_decoder_layers": "num_decoder_layers", "d_ff": "d_ff",
               "relative_bias_buckets": "relative_attention_num_buckets",
               "relative_bias_max_distance": "relative_attention_max_distance", "layer_norm_eps": "layer_norm_epsilon"}
MAX_LEN = 512  # T5 has no position table: the longest sequence accepted here (config.json n_positions if it has one)
# The modules whose outputs are canonical sublayers (`verify`'s source oracle).
HOOKS = {"encoder.layers.{i}.self_attn": "encoder.block.{i}.layer.0.SelfAttention",
         "encoder.layers.{i}.ffn": "encoder.block.{i}.layer.1.DenseReluDense",
         "encoder.layers.{i}": "encoder.block.{i}",
         "encoder.final_norm": "encoder.final_layer_norm",
         "decoder.layers.{i}.self_attn": "decoder.block.{i}.layer.0.SelfAttention",
         "decoder.layers.{i}.cross_attn": "decoder.block.{i}.layer.1.EncDecAttention",
         "decoder.layers.{i}.ffn": "decoder.block.{i}.layer.2.DenseReluDense",
         "decoder.layers.{i}": "decoder.block.{i}",
         "decoder.final_norm": "decoder.final_layer_norm"}

_ENC, _DEC = "encoder.block.{i}.layer.", "decoder.block.{i}.layer."
_FIRST = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"  # each stack's table, in its first layer
TABLE = [
    # canonical                                    T5ForConditionalGeneration                       transform
    ("src_embed.embedding",                        "shared.weight",                                 "identity"),
    ("encoder.relative_bias.embedding",            "encoder." + _FIRST,                             "identity"),
    ("encoder.layers.{i}.self_attn.{qkv}.kernel",  _ENC + "0.SelfAttention.{qkv}.weight",           "transpose"),
    ("encoder.layers.{i}.self_attn.o.kernel",      _ENC + "0.SelfAttention.o.weight",               "transpose"),
    ("encoder.layers.{i}.norm1.gamma",             _ENC + "0.layer_norm.weight",                    "identity"),
    ("encoder.layers.{i}.norm2.gamma",             _ENC + "1.layer_norm.weight",                    "identity"),
    ("encoder.final_norm.gamma",                   "encoder.final_layer_norm.weight",               "identity"),
    ("decoder.relative_bias.embedding",            "decoder." + _FIRST,                             "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel",  _DEC + "0.SelfAttention.{qkv}.weight",           "transpose"),
    ("decoder.layers.{i}.self_attn.o.kernel",      _DEC + "0.SelfAttention.o.weight",               "transpose"),
    ("decoder.layers.{i}.norm1.gamma",             _DEC + "0.layer_norm.weight",                    "identity"),
    ("decoder.layers.{i}.cross_attn.{qkv}.kernel", _DEC + "1.EncDecAttention.{qkv}.weight",         "transpose"),
    ("decoder.layers.{i}.cross_attn.o.kernel",     _DEC + "1.EncDecAttention.o.weight",             "transpose"),
    ("decoder.layers.{i}.norm2.gamma",             _DEC + "1.layer_norm.weight",                    "identity"),
    ("decoder.layers.{i}.norm3.gamma",             _DEC + "2.layer_norm.weight",                    "identity"),
    ("decoder.final_norm.gamma",                   "decoder.final_layer_norm.weight",               "identity"),
    ("src_embed.embedding",                        "encoder.embed_tokens.weight",                   "tied"),
    ("src_embed.embedding",                        "decoder.embed_tokens.weight",                   "tied"),
    # older checkpoints hold a cross-attention table that transformers never reads
    ("-", "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight", "ignore"),
]
# the feed-forward: wi (or the gate wi_0 and wi_1) and wo, in each stack's last sublayer (encoder 1, decoder 2)
_FFN = {"plain": [("linear1", "wi")], "gated": [("gate", "wi_0"), ("linear1", "wi_1")]}


def table(config: rn.TransformerConfig, prefix: str) -> list[tuple[str, str, str]]:
    """The full table for a state dict whose T5Model sits under `prefix` (a task class's `transformer.`)."""
    rows = list(TABLE)
    for stack, sublayer in (("encoder", 1), ("decoder", 2)):
        for ours, theirs in _FFN["gated" if config.ffn_gated else "plain"] + [("linear2", "wo")]:
            rows.append((f"{stack}.layers.{{i}}.ffn.{ours}.kernel",
                         f"{stack}.block.{{i}}.layer.{sublayer}.DenseReluDense.{theirs}.weight", "transpose"))
    if config.output_projection:
        rows.append(("src_embed.embedding", "lm_head.weight", "tied") if config.tie_embeddings else
                    ("output.kernel", "lm_head.weight", "transpose"))
    return [(ours, prefix + theirs, transform) for ours, theirs, transform in rows]


def feed_forward(hf: dict[str, Any]) -> tuple[str, bool]:
    """`(activation, gated)` as transformers reads them: `feed_forward_proj` `[gated-]ACT` (`gated-gelu`: the tanh
    form, `gelu_new`), unless config.json states `dense_act_fn` / `is_gated_act` itself (transformers 5 writes both,
    and they win)."""
    proj = hf.get("feed_forward_proj", "relu")
    parts = proj.split("-") if isinstance(proj, str) else []
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ValueError(f"config.json feed_forward_proj={proj!r} is not supported (only ACT or gated-ACT)")
    name = "gelu_new" if proj == "gated-gelu" else parts[-1]  # transformers' backwards-compatible reading
    name, gated = hf.get("dense_act_fn", name), hf.get("is_gated_act", len(parts) == 2)
    if name not in ACTIVATIONS or not isinstance(gated, bool):
        raise ValueError(f"config.json feed_forward_proj={proj!r} (dense_act_fn={name!r}, is_gated_act={gated!r}) is "
                         f"not supported (activations: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name], gated


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from T5's `config.json`; `keys`: the saved tensors (an `lm_head.weight` there
    is an untied head)."""
    arch = architecture(hf, MODEL_TYPE, ARCHITECTURES, True)
    refuse(hf, {"is_encoder_decoder": True, "is_decoder": False})
    vocab, heads, d_model, d_kv = (integer(hf, key) for key in ("vocab_size", "num_heads", "d_model", "d_kv"))
    pad = token_id(hf, "pad_token_id", vocab, default=0)
    if pad is None:
        raise ValueError("config.json pad_token_id is null; T5 masks padding by this id and starts decoding from it, "
                         "so it must be a token id")
    activation, gated = feed_forward(hf)
    head = arch == ARCHITECTURES[0]
    tied = head and "lm_head.weight" not in keys
    scaled = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True) is not False)
    if not isinstance(scaled, bool):
        raise ValueError(f"config.json scale_decoder_outputs={scaled!r} is not supported (true or false)")
    max_len = integer(hf, "n_positions", MAX_LEN)
    notes = [f"max_len={max_len}: T5 has no position table; the longest sequence read here"
             + ("" if "n_positions" in hf else " (config.json has no n_positions)"),
             f"{'tied' if tied else 'untied'} head" + (", the final states rescaled by d_model**-0.5 (logits divided"
                                                       " by sqrt(d_model))" if scaled and head else "")]
    start = token_id(hf, "decoder_start_token_id", vocab, default=pad)
    if start != pad:
        notes.append(f"decoder_start_token_id={start} differs from pad_token_id={pad}; decoding here starts from "
                     "what the caller passes")
    layers = integer(hf, "num_layers")
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d_model, num_heads=heads,
        head_size=None if heads * d_kv == d_model else d_kv, num_encoder_layers=layers,
        num_decoder_layers=integer(hf, "num_decoder_layers", layers), d_ff=integer(hf, "d_ff"), max_len=max_len,
        dropout=number(hf, "dropout_rate", 0.1), activation=activation, ffn_gated=gated, norm="rms",
        norm_first=True, final_norm=True, layer_norm_eps=number(hf, "layer_norm_epsilon", 1e-6), positional="none",
        scale_embedding=False, bias=False, attention_scale="none", share_embeddings=True, pad_id=pad,
        tie_embeddings=tied, output_projection=head, logit_divisor=math.sqrt(d_model) if scaled and head else 1.0,
        relative_bias_buckets=integer(hf, "relative_attention_num_buckets", 32),
        relative_bias_max_distance=integer(hf, "relative_attention_max_distance", 128))
    return config, arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` has no T5 equivalent (empty if it has one)."""
    wanted = {"norm": "rms", "norm_weight_offset": 0.0, "norm_first": True, "final_norm": True, "positional": "none",
              "scale_embedding": False, "bias": False, "attention_bias": None, "qkv_bias": None, "ffn_bias": None,
              "output_bias": None, "attention_scale": "none", "share_embeddings": True, "embed_norm": False,
              "head_transform": False, "type_vocab_size": 0, "pooler": False, "classifier": None,
              "num_kv_heads": None, "qk_norm": False, "sliding_window": None}
    problems = [f"{k}={getattr(config, k)!r} (T5 needs {v!r})" for k, v in wanted.items() if getattr(config, k) != v]
    if not config.is_encoder_decoder:
        problems.append("not an encoder-decoder model")
    if not config.relative_bias_buckets:
        problems.append("relative_bias_buckets=0 (T5's positions are its relative position bias)")
    if config.pad_id is None:
        problems.append("pad_id=None (T5 masks padding by its pad id and starts decoding from it)")
    if config.logit_divisor not in (1.0, math.sqrt(config.d_model)):
        problems.append(f"logit_divisor={config.logit_divisor!r} (T5 divides by sqrt(d_model)="
                        f"{math.sqrt(config.d_model)!r} or not at all)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    """`(config.json contents, architecture)` for a config `export_problems` accepts."""
    name = TO_HF_ACTIVATION[config.activation]
    proj = ("gated-gelu" if name == "gelu_new" else f"gated-{name}") if config.ffn_gated else name
    arch = ARCHITECTURES[0] if config.output_projection else ARCHITECTURES[1]
    hf = {"model_type": MODEL_TYPE, "architectures": [arch], "vocab_size": config.src_vocab_size,
          "d_model": config.d_model, "d_kv": config.head_dim, "d_ff": config.d_ff, "num_heads": config.num_heads,
          "num_layers": config.num_encoder_layers, "num_decoder_layers": config.num_decoder_layers,
          "relative_attention_num_buckets": config.relative_bias_buckets,
          "relative_attention_max_distance": config.relative_bias_max_distance, "dropout_rate": config.dropout,
          "layer_norm_epsilon": config.layer_norm_eps, "feed_forward_proj": proj, "dense_act_fn": name,
          "is_gated_act": config.ffn_gated, "n_positions": config.max_len, "is_encoder_decoder": True,
          "pad_token_id": config.pad_id, "decoder_start_token_id": config.pad_id,
          "tie_word_embeddings": config.tie_embeddings or not config.output_projection,
          "scale_decoder_outputs": config.logit_divisor != 1.0}
    return hf, arch


def prefix(arch: str, keys: Collection[str] | None = None) -> str:
    return ""  # the table names full keys


def task_heads(stem: str) -> tuple[Head, ...]:
    """The sequence and span classes of a T5-style family (`stem`: the class names' start), on its
    conditional-generation model's weights: the sequence head reads the decoder at the source's last eos_token_id
    through `classification_head.dense`, tanh and `out_proj` (its T5Model under `transformer.`), the span head scores
    every decoder position. Neither rescales; the encoder-only classes (`T5EncoderModel`, token classification) are
    not read."""
    no_output = {"output_projection": False, "tie_embeddings": False, "output_bias": None, "logit_divisor": 1.0}
    output = {"output_projection": True, "tie_embeddings": True, "output_bias": None}
    return (
        Head(f"{stem}ForSequenceClassification", f"{stem}ForConditionalGeneration",
             {"classifier": "sequence", "classifier_input": "eos", "classifier_dense": "tanh", **no_output},
             linear("classifier.dense", "classification_head.dense") + linear("classifier",
                                                                              "classification_head.out_proj"),
             output, prefix="transformer.", token_ids={"eos_id": "eos_token_id"}),
        Head(f"{stem}ForQuestionAnswering", f"{stem}ForConditionalGeneration", {"classifier": "span", **no_output},
             linear("classifier", "qa_outputs"), output))


TASK_HEADS = task_heads("T5")


def exact_norms(model64, config: rn.TransformerConfig) -> None:
    """transformers' `T5LayerNorm` takes the mean square in float32 even in a float64 model: each one computes it in
    float64 instead, in place (`verify`'s float64 run of the source)."""
    import types

    import torch

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for module in model64.modules():
        if type(module).__name__.endswith("LayerNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(forward, module)


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf, config_keys=CONFIG_KEYS,
    table=table, prefix=prefix, base_prefix="",
    transformers_classes=ARCHITECTURES, hooks=HOOKS, head_hook=None, task_heads=TASK_HEADS,
    expresses=("relative_bias_buckets", "relative_bias_max_distance", "positional", "attention_scale", "logit_divisor"),
    approximations=(),
    float64_fix=Float64Fix("T5's RMS norms, whose mean square transformers takes in float32, computed in float64",
                           exact_norms))
