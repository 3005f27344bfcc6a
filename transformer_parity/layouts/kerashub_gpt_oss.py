"""KerasHub GPT-OSS (`GptOssBackbone`, `GptOssCausalLM`): transformers' GPT-OSS blocks, with keras_hub's own choices.

The math, read from keras-hub 0.32 (`keras_hub/src/models/gpt_oss/`): RMSNorms computed in float32; q, k, v and o
with biases (EinsumDense), a sink logit per query head joining each query's softmax (`attention_sinks`); rotary
positions by `RotaryEmbedding(rope_type="yarn")` at `rope_max_wavelength` with `rope_scaling_factor` as the yarn
factor and transformers' yarn constants (beta_fast 32, beta_slow 1, original length 4096, no truncation: canonical
`rope_scaling`, a factor of 1 being plain rope); every layer's feed-forward a mixture of experts: the router is a Dense
with a bias, its `top_k` best scores take a softmax over themselves (`router_softmax="after_topk"`), every expert has
biases and the clamped GLU at keras_hub's fixed alpha 1.702 and limit 7.0 (`glu_alpha`, `glu_limit`,
`glu_up_offset=1`; keras_hub runs every expert on every token, weighed by the routing, zero off the chosen ones: the
same function), stored stacked with gate and up interleaved, as transformers stores them (the layout file's
`expert_bank_interleaved` and `expert_bank`). The head is never tied.

Where keras_hub computes otherwise than transformers' GPT-OSS, this family reads what keras_hub computes:
- the sliding layers are the odd ones (`sliding_window if i % 2 == 1`; transformers' default slides the even ones),
  so a model whose layer kinds are not full, sliding, full, ... has no KerasHub equivalent;
- a sliding layer's query at i sees the keys j with i - j <= `sliding_window` (transformers: i - j < window): the
  canonical window is keras_hub's plus one; a window of 0 or null slides nowhere;
- `head_dim` is read (the docstring's "ignored" is not what its attention does).
The model takes any length (`MAX_LEN`, as KerasHub Llama). keras_hub's own transformers converter
(`convert_gpt_oss.py`) reads only MXFP4 expert blocks (`gate_up_proj_blocks` and scales), reads the yarn factor from
transformers 4's `rope_scaling` only, and keeps transformers' window and layer parity as they are (docs/families.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily
from .kerashub_llama import MAX_LEN, settle_from_weights, unknown_keys

NAME = "kerashub-gpt-oss"
BACKBONE = "GptOssBackbone"
TASKS = ("GptOssCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_gpt_oss.toml")
SERIALIZED = {"GptOssBackbone": ("keras_hub.src.models.gpt_oss.gpt_oss_backbone", "gpt_oss_backbone"),
              "GptOssCausalLM": ("keras_hub.src.models.gpt_oss.gpt_oss_causal_lm", "gpt_oss_causal_lm")}
KEYS = ("vocabulary_size", "num_layers", "num_query_heads", "hidden_dim", "intermediate_dim", "num_experts", "top_k",
        "rope_max_wavelength", "rope_scaling_factor", "num_key_value_heads", "sliding_window", "layer_norm_epsilon",
        "dropout", "output_router_logits", "head_dim")  # GptOssBackbone.get_config()
YARN = {"beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False}
FIXED = {"num_encoder_layers": 0, "norm": "rms", "norm_first": True, "final_norm": True, "positional": "rope",
         "ffn_gated": True, "activation": "silu", "scale_embedding": False, "bias": False, "attention_bias": True,
         "qkv_bias": None, "ffn_bias": True, "embed_norm": False, "head_transform": False, "type_vocab_size": 0,
         "pooler": False, "output_bias": False, "pad_id": None, "qk_norm": False, "norm_weight_offset": 0.0,
         "rotary_fraction": 1.0, "tie_embeddings": False, "router_softmax": "after_topk", "router_bias": True,
         "attention_sinks": True, "glu_limit": 7.0, "glu_alpha": 1.702, "glu_up_offset": 1.0,
         "expert_d_ff": None, "shared_expert_d_ff": None, "expert_layers": None}
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_query_heads", "num_kv_heads": "num_key_value_heads",
               "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim", "layer_norm_eps": "layer_norm_epsilon",
               "rope_theta": "rope_max_wavelength", "num_experts": "num_experts", "experts_per_token": "top_k",
               "sliding_window": "sliding_window", "head_size": "head_dim"}
TASK_FIELDS = {"GptOssCausalLM": {"output_projection": True}}


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    from . import user

    head = [("output.kernel", "layers/reversible_embedding/vars/1", "identity")] if config.output_projection else []
    return user.load(LAYOUT).table + head


def kinds(layers: int, window: int | None) -> tuple[tuple[str, ...] | None, int | None]:
    """`(layer_kinds, sliding_window)` of keras_hub's layers: the odd ones slide within `window` (i - j <= window,
    so the canonical window is one more), the even ones attend every earlier key; none slides without a window."""
    layer_kinds = tuple("sliding" if i % 2 else "full" for i in range(layers))
    if not window or "sliding" not in layer_kinds:
        return None, None
    return layer_kinds, window + 1


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `GptOssBackbone.get_config()` (config.json) and the task class (task.json), if any."""
    from .hf import boolean, integer, number, optional_integer

    unknown_keys(backbone, KEYS, BACKBONE)
    boolean(backbone, "output_router_logits", False)  # only returns the router's scores beside the output
    vocab, heads, d = integer(backbone, "vocabulary_size"), integer(backbone, "num_query_heads"), \
        integer(backbone, "hidden_dim")
    kv, layers = integer(backbone, "num_key_value_heads", heads), integer(backbone, "num_layers")
    experts, per_token = integer(backbone, "num_experts"), integer(backbone, "top_k", 2)
    if not 1 <= per_token <= experts:
        raise ValueError(f"config.json top_k={per_token} must be from 1 to the {experts} experts")
    head_dim = optional_integer(backbone, "head_dim")
    factor = number(backbone, "rope_scaling_factor", 1.0)
    if factor <= 0:
        raise ValueError(f"config.json rope_scaling_factor={factor!r} must be positive")
    layer_kinds, window = kinds(layers, optional_integer(backbone, "sliding_window", 4096))
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads,
        num_kv_heads=None if kv == heads else kv,
        head_size=None if head_dim is None or head_dim * heads == d else head_dim, num_decoder_layers=layers,
        d_ff=integer(backbone, "intermediate_dim"), max_len=MAX_LEN, dropout=number(backbone, "dropout", 0.0),
        layer_norm_eps=number(backbone, "layer_norm_epsilon", 1e-6),
        rope_theta=number(backbone, "rope_max_wavelength", 10000.0),
        rope_scaling={"rope_type": "yarn", "factor": factor, **YARN}, num_experts=experts, experts_per_token=per_token,
        sliding_window=window, layer_kinds=layer_kinds, output_projection=task is not None, **FIXED)
    return config, []


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub GPT-OSS (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub GptOss has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id", "bias", "attention_bias", "qkv_bias", "ffn_bias")
                and getattr(config, k) != v]
    if not (config.has_qkv_bias and config.has_o_bias and config.has_ffn_bias):
        problems.append("a projection without a bias (KerasHub GptOss biases q, k, v, o and every expert)")
    if config.num_experts == 0:
        problems.append("num_experts=0 (KerasHub GptOss has a mixture of experts in every layer)")
    rope = dict(config.rope_scaling or {"rope_type": "yarn", "factor": 1.0, **YARN})
    if rope.pop("rope_type") != "yarn" or rope.pop("factor", None) is None or rope != YARN:
        problems.append(f"rope_scaling={config.rope_scaling!r} (KerasHub GptOss: yarn, its factor "
                        f"rope_scaling_factor, with {YARN})")
    expected, _ = kinds(config.num_decoder_layers, 1)
    if config.sliding_window is not None and (config.layer_kinds != expected or config.sliding_window < 2):
        problems.append(f"layer_kinds={config.layer_kinds!r}, sliding_window={config.sliding_window} (KerasHub "
                        "GptOss slides on the odd layers only, within a window of at least 2)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(GptOssBackbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = {"vocabulary_size": config.tgt_vocab_size, "num_layers": config.num_decoder_layers,
                "num_query_heads": config.num_heads, "hidden_dim": config.d_model, "intermediate_dim": config.d_ff,
                "num_experts": config.num_experts, "top_k": config.experts_per_token,
                "rope_max_wavelength": config.rope_theta,
                "rope_scaling_factor": (config.rope_scaling or {}).get("factor", 1.0),
                "num_key_value_heads": config.kv_heads,
                "sliding_window": None if config.sliding_window is None else config.sliding_window - 1,
                "layer_norm_epsilon": config.layer_norm_eps, "dropout": config.dropout, "output_router_logits": False,
                "head_dim": config.head_dim}
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, table=table, settle_from_weights=settle_from_weights, to_canonical_state=None,
    from_canonical_state=None, classifier=None, predicts_mask_positions=(),
    expresses=("num_experts", "attention_sinks", "router_bias", "glu_limit", "glu_alpha", "glu_up_offset",
               "layer_kinds"),
    approximations=())
