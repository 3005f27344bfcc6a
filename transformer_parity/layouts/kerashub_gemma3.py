"""KerasHub Gemma 3, text only (`keras_hub.models.Gemma3Backbone` without a vision encoder, `Gemma3CausalLM`):
Gemma's decoder (RMSNorm times `1 + scale`, the embedding times `sqrt(hidden_dim)`, a GeGLU feed-forward, the head
tied) with q/k norms, post norms, soft caps, and five sliding layers to a full one.

The math, read from keras-hub 0.32 (`keras_hub/src/models/gemma3/`): with `use_sliding_window_attention`, layer `i`
attends within `sliding_window_size` when `i % 6 < 5` (a key `j` with `|i - j| < window`, causal), else every
earlier key; each kind has its own fixed rotary base (sliding 10000, full 1000000: config.json has no key for
them) and linear position scaling (`local_rope_scaling_factor`, `global_rope_scaling_factor`). `use_query_key_norm`
puts an RMSNorm (times `1 + scale`) on each head of q and k before the rotation; `use_post_attention_norm` and
`use_post_ffw_norm` one on each sublayer's output (canonical `post_norms`: both or neither here);
`attention_logit_soft_cap` caps the scaled scores (`cap * tanh(s / cap)`), `final_logit_soft_cap` the logits. The
feed-forward is `gelu(ffw_gating(x), approximate=True) * ffw_gating_2(x)` into `ffw_linear`, each branch
`intermediate_dim` wide. Scores times 1/sqrt(head_dim).

Refused on reading (one line naming the key): a vision encoder (the multimodal model), `use_bidirectional_attention`
and `is_embedding_model` (EmbeddingGemma); `layer_norm_epsilon` other than 1e-6 (the backbone hands it to the final
norm only: its decoder blocks and q/k norms keep 1e-6); `query_head_dim_normalize=false` where `hidden_dim //
num_query_heads` is not `head_dim` (the decoder block passes `query_head_dim_normalize=True` to its attention
whatever the backbone says); one post norm without the other; a `local_rope_scaling_factor` other than 1 beside full
layers (the canonical sliding layers rotate without scaling); any key keras-hub 0.32's `Gemma3Backbone` does not
write. The table is the layout file `kerashub_gemma3.toml` beside this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily
from .kerashub_llama import MAX_LEN, unknown_keys

NAME = "kerashub-gemma3"
BACKBONE = "Gemma3Backbone"
TASKS = ("Gemma3CausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_gemma3.toml")
SERIALIZED = {"Gemma3Backbone": ("keras_hub.src.models.gemma3.gemma3_backbone", "gemma3_backbone"),
              "Gemma3CausalLM": ("keras_hub.src.models.gemma3.gemma3_causal_lm", "gemma3_causal_lm")}
EPSILON = 1e-6  # Gemma3DecoderBlock's and CachedGemma3Attention's own default: every norm inside the blocks
THETA = {"sliding": 10_000.0, "full": 1_000_000.0}  # Gemma3Backbone's rotary bases, by layer kind
PATTERN = 6  # with sliding windows on, layer i slides when i % 6 < 5
FIXED = {"num_encoder_layers": 0, "norm": "rms", "norm_weight_offset": 1.0, "norm_first": True, "final_norm": True,
         "positional": "rope", "rotary_fraction": 1.0, "ffn_gated": True, "activation": "gelu_tanh",
         "scale_embedding": True, "bias": False, "embed_norm": False, "head_transform": False, "type_vocab_size": 0,
         "pooler": False, "output_bias": False, "pad_id": None, "layer_norm_eps": EPSILON}  # pad: the padding_mask
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_query_heads", "num_kv_heads": "num_key_value_heads", "head_size": "head_dim",
               "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim", "sliding_window": "sliding_window_size",
               "attn_logit_softcap": "attention_logit_soft_cap", "final_logit_softcap": "final_logit_soft_cap"}
CAUSAL_LM = {"output_projection": True, "tie_embeddings": True}
TASK_FIELDS = {"Gemma3CausalLM": CAUSAL_LM}
KEYS = ("vocabulary_size", "image_size", "num_layers", "num_query_heads", "num_key_value_heads", "hidden_dim",
        "intermediate_dim", "head_dim", "query_head_dim_normalize", "use_query_key_norm", "use_post_ffw_norm",
        "use_post_attention_norm", "attention_logit_soft_cap", "final_logit_soft_cap", "use_sliding_window_attention",
        "sliding_window_size", "local_rope_scaling_factor", "global_rope_scaling_factor", "vision_encoder",
        "use_bidirectional_attention", "layer_norm_epsilon", "dropout", "is_embedding_model",
        "pooling_intermediate_dim", "embedding_dim")  # Gemma3Backbone.get_config()
REFUSED = {"vision_encoder": "a vision encoder (the multimodal Gemma 3; only the text model is read here)",
           "use_bidirectional_attention": "bidirectional attention (EmbeddingGemma)",
           "is_embedding_model": "a pooled embedding head (EmbeddingGemma)"}  # every value but null / false
POST_NORMS = ("post_attn_norm", "post_ffn_norm")
QK_NORMS = ("q_norm", "k_norm")


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    """The layout file's entries that the config has (q/k norms, post norms); the head is the tied embedding."""
    from . import user

    left_out = (POST_NORMS if not config.post_norms else ()) + (QK_NORMS if not config.qk_norm else ())
    return [entry for entry in user.load(LAYOUT).table if not any(f".{n}." in entry[0] for n in left_out)]


def kinds(num_layers: int, sliding: bool) -> list[str]:
    """Gemma3Backbone's layer kinds: five sliding layers to a full one with sliding windows on, else all full."""
    return ["sliding" if sliding and i % PATTERN < PATTERN - 1 else "full" for i in range(num_layers)]


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `Gemma3Backbone.get_config()` (config.json) and the task class (task.json), if any;
    what keras_hub computes and the canonical model cannot is refused, naming the key."""
    from .hf import boolean, integer, number, optional_integer

    unknown_keys(backbone, KEYS, BACKBONE)
    for key, what in REFUSED.items():
        if backbone.get(key) not in (None, False):
            raise ValueError(f"config.json {key}={backbone[key]!r} is not supported: {what}")
    eps = number(backbone, "layer_norm_epsilon", EPSILON)
    if eps != EPSILON:
        raise ValueError(f"config.json layer_norm_epsilon={eps!r} is not supported: keras-hub's Gemma3Backbone gives "
                         f"it to the final norm only, its decoder blocks and q/k norms keep {EPSILON} (one epsilon "
                         "here)")
    vocab, heads, d = integer(backbone, "vocabulary_size"), integer(backbone, "num_query_heads"), \
        integer(backbone, "hidden_dim")
    kv, head_dim, depth = integer(backbone, "num_key_value_heads", heads), integer(backbone, "head_dim"), \
        integer(backbone, "num_layers")
    if not boolean(backbone, "query_head_dim_normalize", True) and head_dim != d // heads:
        raise ValueError(f"config.json query_head_dim_normalize=false with head_dim={head_dim} != hidden_dim // "
                         f"num_query_heads={d // heads} is not supported: keras-hub's Gemma3DecoderBlock scales by "
                         "1/sqrt(head_dim) whatever it says, so the scale the preset means is unknown")
    post = {key: boolean(backbone, key, False) for key in ("use_post_attention_norm", "use_post_ffw_norm")}
    if len(set(post.values())) > 1:
        raise ValueError(f"config.json {', '.join(f'{k}={v}' for k, v in post.items())} is not supported: one post "
                         "norm without the other (canonical post_norms is both or neither)")
    layer_kinds = kinds(depth, boolean(backbone, "use_sliding_window_attention", False))
    window = optional_integer(backbone, "sliding_window_size") if "sliding" in layer_kinds else None
    if "sliding" in layer_kinds and not window:
        raise ValueError(f"config.json sliding_window_size={window!r}: sliding layers need a window of at least 1")
    scaling = {kind: number(backbone, f"{'local' if kind == 'sliding' else 'global'}_rope_scaling_factor", 1.0)
               for kind in THETA}
    if set(layer_kinds) == {"sliding", "full"} and scaling["sliding"] != 1.0:
        raise ValueError(f"config.json local_rope_scaling_factor={scaling['sliding']!r} is not supported beside full "
                         "layers: the canonical sliding layers rotate at their own base without scaling")
    main = "full" if "full" in layer_kinds else "sliding"  # the kind whose rotation is rope_theta, rope_scaling
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads,
        num_kv_heads=None if kv == heads else kv, head_size=None if head_dim * heads == d else head_dim,
        num_decoder_layers=depth, d_ff=integer(backbone, "intermediate_dim"), max_len=MAX_LEN,
        dropout=number(backbone, "dropout", 0.0), tie_embeddings=task is not None, output_projection=task is not None,
        qk_norm=boolean(backbone, "use_query_key_norm", True), post_norms=post["use_post_ffw_norm"],
        attn_logit_softcap=_cap(backbone, "attention_logit_soft_cap"),
        final_logit_softcap=_cap(backbone, "final_logit_soft_cap") if task is not None else None,
        sliding_window=window, layer_kinds=tuple(layer_kinds) if window else None,
        rope_theta=THETA[main], local_rope_theta=THETA["sliding"] if set(layer_kinds) == set(THETA) else None,
        rope_scaling=None if scaling[main] == 1.0 else {"rope_type": "linear", "factor": scaling[main]}, **FIXED)
    notes = [] if task is not None or backbone.get("final_logit_soft_cap") is None else [
        "final_logit_soft_cap applies to Gemma3CausalLM's logits: a backbone alone has none"]
    return config, notes


def _cap(backbone: dict[str, Any], key: str) -> float | None:
    from .hf import number

    return None if backbone.get(key) is None else number(backbone, key, 0.0)


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub Gemma3Backbone or Gemma3CausalLM (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub Gemma3 has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id") and getattr(config, k) != v]
    if config.has_qkv_bias or config.has_o_bias or config.has_ffn_bias:
        problems.append("biases on the attention or feed-forward (KerasHub Gemma3 has none)")
    if config.output_projection and not config.tie_embeddings:
        problems.append("tie_embeddings=False (Gemma3CausalLM's logits are always the token embedding's)")
    layer_kinds = [config.layer_kind(i) for i in range(config.num_decoder_layers)]
    if "sliding" in layer_kinds and layer_kinds != kinds(config.num_decoder_layers, True):
        problems.append(f"layer_kinds={layer_kinds} (KerasHub Gemma3's sliding layers are those with i % 6 < 5, or "
                        "none)")
    main = "full" if "full" in layer_kinds else "sliding"
    if config.rope_theta != THETA[main]:
        problems.append(f"rope_theta={config.rope_theta:g} (KerasHub Gemma3's {main} layers rotate at base "
                        f"{THETA[main]:g})")
    if set(layer_kinds) == set(THETA) and config.local_rope_theta != THETA["sliding"]:
        problems.append(f"local_rope_theta={config.local_rope_theta!r} (KerasHub Gemma3's sliding layers rotate at "
                        f"base {THETA['sliding']:g})")
    if (config.rope_scaling or {}).get("rope_type") not in (None, "linear"):
        problems.append(f"rope_scaling={config.rope_scaling!r} (KerasHub Gemma3 scales positions linearly)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(Gemma3Backbone config, task class or None)` for a config `export_problems` accepts."""
    sliding = any(config.layer_kind(i) == "sliding" for i in range(config.num_decoder_layers))
    full = any(config.layer_kind(i) == "full" for i in range(config.num_decoder_layers))
    factor = (config.rope_scaling or {}).get("factor", 1.0)
    backbone = {"vocabulary_size": config.tgt_vocab_size, "image_size": None, "num_layers": config.num_decoder_layers,
                "num_query_heads": config.num_heads, "num_key_value_heads": config.kv_heads,
                "hidden_dim": config.d_model, "intermediate_dim": config.d_ff, "head_dim": config.head_dim,
                "query_head_dim_normalize": True, "use_query_key_norm": config.qk_norm,
                "use_post_ffw_norm": config.post_norms, "use_post_attention_norm": config.post_norms,
                "attention_logit_soft_cap": config.attn_logit_softcap,
                "final_logit_soft_cap": config.final_logit_softcap, "use_sliding_window_attention": sliding,
                "sliding_window_size": config.sliding_window if sliding else 4096,
                "local_rope_scaling_factor": 1.0 if full else factor, "global_rope_scaling_factor": factor,
                "vision_encoder": None, "use_bidirectional_attention": False,
                "layer_norm_epsilon": config.layer_norm_eps, "dropout": config.dropout, "is_embedding_model": False,
                "pooling_intermediate_dim": None, "embedding_dim": None}
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=None, predicts_mask_positions=(),
    expresses=("attn_logit_softcap", "final_logit_softcap", "post_norms", "layer_kinds", "local_rope_theta"),
    approximations=())
