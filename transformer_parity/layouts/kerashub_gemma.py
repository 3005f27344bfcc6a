"""KerasHub Gemma (`keras_hub.models.GemmaBackbone`, `GemmaCausalLM`): decoder-only, pre-norm, rotary positions,
grouped-query attention with its own `head_dim`, a GeGLU feed-forward, the head tied to the embedding.

The math, read from keras-hub 0.32 (`keras_hub/src/models/gemma/`): `RMSNormalization` multiplies by `1 + scale`
in float32 (`norm_weight_offset=1`); the token embedding is multiplied by `sqrt(hidden_dim)` (computed in float32,
then cast to the compute dtype, as transformers casts it); `CachedGemmaAttention` rotates q and k with
`RotaryEmbedding(max_wavelength=10000)` (rotate-half; the base is fixed, config.json has no key for it), then
interleaves the two halves of each head, the same permutation of q and k, which leaves every score unchanged;
scores times 1/sqrt(head_dim); the feed-forward is `gelu(ffw_gating(x), approximate=True) * ffw_gating_2(x)` (the
tanh GELU on the gate) into `ffw_linear`, each branch `intermediate_dim // 2` wide, so the canonical `d_ff` is half
of config.json's `intermediate_dim`; no biases. `GemmaCausalLM`'s logits are `token_embedding(x, reverse=True)` with
`tie_weights=True`: always tied. The table is the layout file `kerashub_gemma.toml` beside this module.

Gemma 2's settings (the same backbone): `use_post_attention_norm` and `use_post_ffw_norm` put a norm on each
sublayer's output (canonical `post_norms`: both or neither here); `attention_logit_soft_cap` caps the scaled scores
(`cap * tanh(s / cap)`), `final_logit_soft_cap` the logits; `use_sliding_window_attention` makes the even layers
(0, 2, ...) attend within `sliding_window_size` (a key `j` with `|i - j| < window`, causal) and the odd ones to
every earlier key (canonical `layer_kinds`).

Refused on reading (one line naming the key), as no canonical config computes what keras_hub does with them:
one post norm without the other; `layer_norm_epsilon` other than 1e-6 (keras-hub 0.32's backbone hands it to the
final norm only; the decoder blocks keep 1e-6); `query_head_dim_normalize=false` where `hidden_dim //
num_query_heads` is not `head_dim` (the decoder block passes `query_head_dim_normalize=True` to its attention
whatever the backbone says, so which scale the preset means is unknown: Gemma 2 27B's query_pre_attn_scalar of 144
over heads of 128 is such a preset); any config.json key keras-hub 0.32's `GemmaBackbone` does not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_numpy as rn

from .family import KerasHubFamily
from .kerashub_llama import MAX_LEN, unknown_keys

NAME = "kerashub-gemma"
BACKBONE = "GemmaBackbone"
TASKS = ("GemmaCausalLM",)
LAYOUT = Path(__file__).with_name("kerashub_gemma.toml")
SERIALIZED = {"GemmaBackbone": ("keras_hub.src.models.gemma.gemma_backbone", "gemma_backbone"),
              "GemmaCausalLM": ("keras_hub.src.models.gemma.gemma_causal_lm", "gemma_causal_lm")}
EPSILON = 1e-6  # GemmaDecoderBlock's own default: the epsilon of every norm inside the blocks
FIXED = {"num_encoder_layers": 0, "norm": "rms", "norm_weight_offset": 1.0, "norm_first": True, "final_norm": True,
         "positional": "rope", "rope_theta": 10000.0, "rope_scaling": None, "rotary_fraction": 1.0,
         "ffn_gated": True, "activation": "gelu_tanh", "scale_embedding": True, "bias": False, "embed_norm": False,
         "head_transform": False, "type_vocab_size": 0, "pooler": False, "output_bias": False, "pad_id": None,
         "qk_norm": False, "layer_norm_eps": EPSILON}  # pad: the padding_mask input
CONFIG_KEYS = {"src_vocab_size": "vocabulary_size", "tgt_vocab_size": "vocabulary_size", "d_model": "hidden_dim",
               "num_heads": "num_query_heads", "num_kv_heads": "num_key_value_heads", "head_size": "head_dim",
               "num_decoder_layers": "num_layers", "d_ff": "intermediate_dim", "sliding_window": "sliding_window_size",
               "attn_logit_softcap": "attention_logit_soft_cap",
               "final_logit_softcap": "final_logit_soft_cap"}  # canonical field -> config.json key
CAUSAL_LM = {"output_projection": True, "tie_embeddings": True}
TASK_FIELDS = {"GemmaCausalLM": CAUSAL_LM}
POST_NORMS = ("use_post_attention_norm", "use_post_ffw_norm")  # Gemma 2's; canonical post_norms: both or neither
KEYS = ("vocabulary_size", "num_layers", "num_query_heads", "num_key_value_heads", "hidden_dim", "intermediate_dim",
        "head_dim", "layer_norm_epsilon", "dropout", "query_head_dim_normalize", "sliding_window_size", *POST_NORMS,
        "attention_logit_soft_cap", "final_logit_soft_cap", "use_sliding_window_attention")


def table(config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    """The layout file's table, its post norms where the config has them; the head is the tied embedding."""
    from . import user

    left_out = () if config.post_norms else (".post_attn_norm.", ".post_ffn_norm.")
    return [entry for entry in user.load(LAYOUT).table if not any(name in entry[0] for name in left_out)]


def kinds(num_layers: int, sliding: bool) -> list[str]:
    """GemmaBackbone's layer kinds: the even layers sliding with sliding windows on, else all full."""
    return ["sliding" if sliding and i % 2 == 0 else "full" for i in range(num_layers)]


def config_from_kerashub(backbone: dict[str, Any], task: str | None) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)` from `GemmaBackbone.get_config()` (config.json) and the task class (task.json), if any;
    what keras_hub computes and the canonical model cannot is refused, naming the key."""
    from .hf import boolean, integer, number

    from .hf import optional_integer

    unknown_keys(backbone, KEYS, BACKBONE)
    post = {key: boolean(backbone, key, False) for key in POST_NORMS}
    if len(set(post.values())) > 1:
        raise ValueError(f"config.json {', '.join(f'{k}={v}' for k, v in post.items())} is not supported: one post "
                         "norm without the other (canonical post_norms is both or neither)")
    eps = number(backbone, "layer_norm_epsilon", EPSILON)
    if eps != EPSILON:
        raise ValueError(f"config.json layer_norm_epsilon={eps!r} is not supported: keras-hub's GemmaBackbone gives "
                         f"it to the final norm only, its decoder blocks keep {EPSILON} (one epsilon here)")
    vocab, heads, d = integer(backbone, "vocabulary_size"), integer(backbone, "num_query_heads"), \
        integer(backbone, "hidden_dim")
    kv, head_dim = integer(backbone, "num_key_value_heads", heads), integer(backbone, "head_dim")
    if not boolean(backbone, "query_head_dim_normalize", True) and head_dim != d // heads:
        raise ValueError(f"config.json query_head_dim_normalize=false with head_dim={head_dim} != hidden_dim // "
                         f"num_query_heads={d // heads} is not supported: keras-hub's GemmaDecoderBlock scales by "
                         "1/sqrt(head_dim) whatever it says, so the scale the preset means is unknown")
    layer_kinds = kinds(integer(backbone, "num_layers"), boolean(backbone, "use_sliding_window_attention", False))
    window = optional_integer(backbone, "sliding_window_size") if "sliding" in layer_kinds else None
    if "sliding" in layer_kinds and not window:
        raise ValueError(f"config.json sliding_window_size={window!r}: sliding layers need a window of at least 1")
    caps = {key: None if backbone.get(key) is None else number(backbone, key, 0.0)
            for key in ("attention_logit_soft_cap", "final_logit_soft_cap")}
    intermediate = integer(backbone, "intermediate_dim")
    notes = [f"intermediate_dim={intermediate} is odd: keras_hub builds two branches of {intermediate // 2}, "
             f"written back as intermediate_dim={intermediate // 2 * 2}"] if intermediate % 2 else []
    config = rn.TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, num_heads=heads,
        num_kv_heads=None if kv == heads else kv, head_size=None if head_dim * heads == d else head_dim,
        num_decoder_layers=integer(backbone, "num_layers"), d_ff=intermediate // 2, max_len=MAX_LEN,
        dropout=number(backbone, "dropout", 0.0), tie_embeddings=task is not None,
        output_projection=task is not None, post_norms=post["use_post_ffw_norm"], sliding_window=window,
        layer_kinds=tuple(layer_kinds) if window else None, attn_logit_softcap=caps["attention_logit_soft_cap"],
        final_logit_softcap=caps["final_logit_soft_cap"] if task is not None else None, **FIXED)
    return config, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    """Why `config` is not a KerasHub Gemma (empty if it is one)."""
    problems = [f"{k}={getattr(config, k)!r} (KerasHub Gemma has {v!r})" for k, v in FIXED.items()
                if k not in ("output_bias", "pad_id") and getattr(config, k) != v]
    if config.has_qkv_bias or config.has_o_bias or config.has_ffn_bias:
        problems.append("biases on the attention or feed-forward (KerasHub Gemma has none)")
    if config.output_projection and config.has_output_bias:
        problems.append("output_bias=True (GemmaCausalLM's logits have no bias)")
    if config.output_projection and not config.tie_embeddings:
        problems.append("tie_embeddings=False (GemmaCausalLM's logits are always the token embedding's)")
    layer_kinds = [config.layer_kind(i) for i in range(config.num_decoder_layers)]
    if "sliding" in layer_kinds and layer_kinds != kinds(config.num_decoder_layers, True):
        problems.append(f"layer_kinds={layer_kinds} (KerasHub Gemma's sliding layers are the even ones, or none)")
    return problems


def config_to_kerashub(config: rn.TransformerConfig) -> tuple[dict[str, Any], str | None]:
    """`(GemmaBackbone config, task class or None)` for a config `export_problems` accepts."""
    backbone = {"vocabulary_size": config.tgt_vocab_size, "num_layers": config.num_decoder_layers,
                "num_query_heads": config.num_heads, "num_key_value_heads": config.kv_heads,
                "hidden_dim": config.d_model, "intermediate_dim": 2 * config.d_ff, "head_dim": config.head_dim,
                "layer_norm_epsilon": config.layer_norm_eps, "dropout": config.dropout,
                "query_head_dim_normalize": True, "use_post_ffw_norm": config.post_norms,
                "use_post_attention_norm": config.post_norms, "final_logit_soft_cap": config.final_logit_softcap,
                "attention_logit_soft_cap": config.attn_logit_softcap,
                "sliding_window_size": config.sliding_window or 4096,
                "use_sliding_window_attention": config.sliding_window is not None}
    return backbone, (TASKS[0] if config.output_projection else None)


FAMILY = KerasHubFamily(
    name=NAME, backbone=BACKBONE, backbones=(BACKBONE,), tasks=TASKS, serialized=SERIALIZED,
    config_from_kerashub=config_from_kerashub, export_problems=export_problems, config_to_kerashub=config_to_kerashub,
    task_config=None, config_keys=CONFIG_KEYS, fixed=FIXED, task_fields=TASK_FIELDS,
    pad_token=None,  # padding arrives as the backbone's padding_mask input
    layout=LAYOUT, table=table, settle_from_weights=None, to_canonical_state=None, from_canonical_state=None,
    classifier=None, predicts_mask_positions=(),
    expresses=("attn_logit_softcap", "final_logit_softcap", "post_norms", "layer_kinds"), approximations=())
