"""What a `TransformerConfig` may hold: the allowed values of its choice fields and the checks
`TransformerConfig.__post_init__` runs on itself (`cfg` below).

Each check raises ValueError naming the field and the value received, and puts values JSON gives in another type
(a list for a tuple, 1 for 1.0) into the field's own, so that a config equals itself after a round trip."""

from __future__ import annotations

import math
from typing import Any

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
POSITIONAL = ("sinusoidal", "learned", "rope", "none")  # none: no absolute positions (relative scores, ALiBi)
NORMS = ("layer", "rms")
# transformers' rope types (modeling_rope_utils) and the parameters each reads besides rope_type; `ops.rope_frequencies`
# computes each exactly as transformers does.
ROPE_TYPES = {
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"),
    "longrope": ("short_factor", "long_factor", "factor", "original_max_position_embeddings", "attention_factor"),
}
SINUSOID_LAYOUTS = ("interleaved", "concatenated")
# the sinusoids' frequencies: 10000^(-2i/d) (the paper), or 10000^(-i/(d/2 - 1)), the last exactly 1/10000 (fairseq)
SINUSOID_FREQUENCIES = ("paper", "inclusive")
LAYER_KINDS = ("sliding", "full")  # a decoder layer's self-attention: within `sliding_window`, or every earlier key
ATTENTION_SCALES = ("head", "model", "none")  # or a positive finite number
QK_NORM_OVER = ("head", "all")  # qk_norm over each head, or over all heads of q (and of k) at once
HEAD_ORDERS = ("dense-activation-norm", "dense-norm-activation")
ROUTER_SOFTMAX = ("before_topk", "after_topk")  # a mixture of experts' router: softmax over all, or over the k chosen
# one score vector per sequence, one per position, start/end per position, one score per sequence that is one choice
CLASSIFIERS = ("sequence", "token", "span", "choice")
CLASSIFIER_INPUTS = ("pooler", "first", "last", "eos")  # what a sequence classifier reads
CLASSIFIER_DENSE = ("tanh", *ACTIVATIONS)  # the activation of a classifier's dense layer
RELATIVE_TERMS = ("c2p", "p2c")  # disentangled attention's position terms (DeBERTa), in the order they add
PADDED_QUERIES = ("attend", "average")  # a padding query attends the real keys, or averages every position
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")  # transformers' names



def check_config(cfg: Any) -> None:
    """Raise ValueError naming the field and value of the first thing wrong with `cfg`; normalize the rest."""
    for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
        _check_int(name, getattr(cfg, name), minimum=1)
    for name in ("num_encoder_layers", "num_decoder_layers", "position_offset", "type_vocab_size"):
        _check_int(name, getattr(cfg, name), minimum=0)
    if cfg.pad_id is not None:
        _check_int("pad_id", cfg.pad_id, minimum=0, or_none=True)
    if cfg.num_encoder_layers == 0 and cfg.num_decoder_layers == 0:
        raise ValueError("a model needs at least one layer: num_encoder_layers and num_decoder_layers are both 0")
    _check_bools(cfg, "norm_first", "final_norm", "scale_embedding", "bias", "tie_embeddings", "output_projection",
                 "share_embeddings", "embed_norm", "head_transform", "pooler", "embed_bias",
                 "positions_skip_pad", "shared_layers", "causal_encoder")
    if cfg.output_bias is not None and not isinstance(cfg.output_bias, bool):
        raise ValueError(f"output_bias must be a bool or None (= same as bias), received {cfg.output_bias!r}")
    if cfg.d_model % cfg.num_heads and cfg.head_size is None:
        raise ValueError(f"d_model={cfg.d_model} is not divisible by num_heads={cfg.num_heads} (give head_size "
                         "for heads of another width)")
    if not isinstance(cfg.dropout, (int, float)) or isinstance(cfg.dropout, bool) or not 0 <= cfg.dropout < 1:
        raise ValueError(f"dropout must be a number in [0, 1), received {cfg.dropout!r}")
    if not isinstance(cfg.layer_norm_eps, (int, float)) or isinstance(cfg.layer_norm_eps, bool) \
            or not 0 < cfg.layer_norm_eps < float("inf"):
        raise ValueError(f"layer_norm_eps must be a positive finite number, received {cfg.layer_norm_eps!r}")
    _check_choice("activation", cfg.activation, ACTIVATIONS)
    if cfg.head_activation is not None:
        _check_choice("head_activation", cfg.head_activation, ACTIVATIONS)
    if cfg.head_layer_norm_eps is not None and (
            not isinstance(cfg.head_layer_norm_eps, (int, float)) or isinstance(cfg.head_layer_norm_eps, bool)
            or not 0 < cfg.head_layer_norm_eps < float("inf")):
        raise ValueError("head_layer_norm_eps must be a positive finite number or None (= layer_norm_eps), "
                         f"received {cfg.head_layer_norm_eps!r}")
    for name in ("head_activation", "head_layer_norm_eps"):
        if getattr(cfg, name) is not None and not cfg.head_transform:
            raise ValueError(f"{name}={getattr(cfg, name)!r} needs head_transform=True (it configures the "
                             "head transform)")
    _check_choice("head_order", cfg.head_order, HEAD_ORDERS)
    if cfg.head_order != HEAD_ORDERS[0] and not cfg.head_transform:
        raise ValueError(f"head_order={cfg.head_order!r} needs head_transform=True (it orders the head "
                         "transform)")
    _check_llm_fields(cfg)
    _check_layer_fields(cfg)
    _check_parallel(cfg)
    _check_alibi(cfg)
    _check_scalings(cfg)
    _check_classifier(cfg)
    _check_experts(cfg)
    _check_relative(cfg)
    _check_sinks_and_glu(cfg)
    _check_relative_bias(cfg)
    _check_attention_scale(cfg.attention_scale)
    if not isinstance(cfg.attention_scale, str):
        object.__setattr__(cfg, "attention_scale", float(cfg.attention_scale))  # JSON may give 1 for 1.0
    _check_choice("positional", cfg.positional, POSITIONAL)
    _check_choice("sinusoid_layout", cfg.sinusoid_layout, SINUSOID_LAYOUTS)
    if cfg.positional == "rope" and cfg.rotary_dim % 2:
        raise ValueError(f"rotary positions turn pairs of dims: rotary_fraction={cfg.rotary_fraction} of "
                         f"head_dim={cfg.head_dim} gives {cfg.rotary_dim}, an odd number")
    if cfg.positional == "sinusoidal" and cfg.d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, received d_model={cfg.d_model}")
    if cfg.pad_id is not None and cfg.has_encoder and cfg.pad_id >= cfg.src_vocab_size:
        raise ValueError(f"pad_id={cfg.pad_id} is outside the source vocabulary (src_vocab_size="
                         f"{cfg.src_vocab_size})")
    if cfg.pad_id is not None and cfg.has_decoder and cfg.pad_id >= cfg.tgt_vocab_size:
        raise ValueError(f"pad_id={cfg.pad_id} is outside the target vocabulary (tgt_vocab_size="
                         f"{cfg.tgt_vocab_size})")
    if cfg.tie_embeddings and cfg.is_encoder_only and cfg.src_vocab_size != cfg.tgt_vocab_size:
        raise ValueError("an encoder-only model can tie its head to the source embedding only when "
                         f"tgt_vocab_size == src_vocab_size, received {cfg.tgt_vocab_size} and "
                         f"{cfg.src_vocab_size}")
    if cfg.share_embeddings and not (cfg.is_encoder_decoder and cfg.src_vocab_size == cfg.tgt_vocab_size):
        raise ValueError("share_embeddings needs an encoder-decoder model with src_vocab_size == tgt_vocab_size, "
                         f"received num_encoder_layers={cfg.num_encoder_layers}, num_decoder_layers="
                         f"{cfg.num_decoder_layers}, vocabularies {cfg.src_vocab_size} and {cfg.tgt_vocab_size}")
    _check_choice("sinusoid_frequencies", cfg.sinusoid_frequencies, SINUSOID_FREQUENCIES)
    if cfg.sinusoid_frequencies == "inclusive" and cfg.d_model < 4:
        raise ValueError(f"sinusoid_frequencies='inclusive' spreads d_model / 2 frequencies from 1 to 1/10000: it "
                         f"needs d_model >= 4, received d_model={cfg.d_model}")
    if cfg.position_offset and not (cfg.positional == "learned" or (
            cfg.positional == "sinusoidal" and cfg.positions_skip_pad)):
        raise ValueError(f"position_offset={cfg.position_offset} needs positional='learned' (or sinusoidal "
                         f"ones under positions_skip_pad), received "
                         f"positional={cfg.positional!r}")
    if cfg.positions_skip_pad and not (cfg.positional in ("learned", "sinusoidal") and cfg.pad_id is not None
                                        and cfg.position_offset >= 1):
        raise ValueError("positions_skip_pad (RoBERTa's and M2M100's positions) needs positional='learned' or "
                         "'sinusoidal', a pad_id and position_offset >= 1 (pad tokens read row position_offset - "
                         f"1), received positional={cfg.positional!r}, pad_id={cfg.pad_id}, position_offset="
                         f"{cfg.position_offset}")
    if cfg.embedding_size is not None:
        _check_int("embedding_size", cfg.embedding_size, minimum=1, or_none=True)
        if not (cfg.is_encoder_only and cfg.positional == "learned" and not cfg.embed_bias
                and not cfg.scale_embedding):
            raise ValueError("embedding_size (ALBERT's factorized embeddings) needs an encoder-only model with "
                             "positional='learned', no embed_bias and no scale_embedding, received "
                             f"num_decoder_layers={cfg.num_decoder_layers}, positional={cfg.positional!r}, "
                             f"embed_bias={cfg.embed_bias}, scale_embedding={cfg.scale_embedding}")
        if cfg.output_projection and not cfg.head_transform:
            raise ValueError("embedding_size with an output projection needs head_transform (ALBERT's head maps "
                             "d_model back to embedding_size, which the output projection reads)")
    if cfg.causal_encoder and not cfg.is_encoder_only:
        raise ValueError("causal_encoder=True makes an encoder-only model's cfg-attention causal; this model has "
                         f"num_encoder_layers={cfg.num_encoder_layers}, num_decoder_layers="
                         f"{cfg.num_decoder_layers} (a decoder is causal already)")
    if cfg.shared_layers and not cfg.is_encoder_only:
        raise ValueError("shared_layers (ALBERT's one set of layer weights) needs an encoder-only model, received "
                         f"num_decoder_layers={cfg.num_decoder_layers}")
    if (cfg.type_vocab_size or cfg.pooler) and not cfg.has_encoder:
        raise ValueError("type_vocab_size and pooler belong to an encoder; this model has num_encoder_layers=0")
    bare_head = cfg.head_transform and cfg.classifier is None  # a classifier may read the head's output
    if not cfg.output_projection and (cfg.tie_embeddings or bare_head or cfg.output_bias):
        raise ValueError("output_projection=False (a bare backbone) cannot have tie_embeddings, head_transform "
                         f"(without a classifier) or output_bias, received tie_embeddings={cfg.tie_embeddings}, head_transform="
                         f"{cfg.head_transform}, output_bias={cfg.output_bias}")


def _check_llm_fields(cfg: Any) -> None:
    _check_choice("norm", cfg.norm, NORMS)
    _check_finite("norm_weight_offset", cfg.norm_weight_offset)
    _check_bools(cfg, "ffn_gated", "qk_norm")
    for name in ("attention_bias", "qkv_bias", "ffn_bias"):
        if getattr(cfg, name) is not None and not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"{name} must be a bool or None (= the broader switch), received "
                             f"{getattr(cfg, name)!r}")
    for name in ("num_kv_heads", "head_size", "sliding_window"):
        if getattr(cfg, name) is not None:
            _check_int(name, getattr(cfg, name), minimum=1, or_none=True)
    if cfg.num_kv_heads is not None and cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(f"num_heads={cfg.num_heads} is not a multiple of num_kv_heads={cfg.num_kv_heads} "
                         "(each key/value head serves a whole group of query heads)")
    _check_finite("rope_theta", cfg.rope_theta, positive=True)
    _check_finite("rotary_fraction", cfg.rotary_fraction, positive=True)
    if cfg.rotary_fraction > 1:
        raise ValueError(f"rotary_fraction must be in (0, 1], received {cfg.rotary_fraction!r}")
    if cfg.rope_scaling is not None:
        _check_rope_scaling(cfg.rope_scaling)
        object.__setattr__(cfg, "rope_scaling", dict(cfg.rope_scaling))  # a copy: the config stays its own
    if cfg.positional != "rope" and (cfg.rope_scaling is not None or cfg.rotary_fraction != 1.0):
        raise ValueError(f"rope_scaling and rotary_fraction need positional='rope', received positional="
                         f"{cfg.positional!r}")
    if cfg.qk_norm and not cfg.has_decoder and not cfg.has_encoder:
        raise ValueError("qk_norm needs attention layers")
    if cfg.qk_norm_eps is not None:
        _check_finite("qk_norm_eps", cfg.qk_norm_eps, positive=True)
        if not cfg.qk_norm:
            raise ValueError(f"qk_norm_eps={cfg.qk_norm_eps!r} needs qk_norm=True (it is the q/k norms' epsilon)")
        if cfg.qk_norm_eps == cfg.layer_norm_eps:  # one form for one model: None says "the model's epsilon"
            object.__setattr__(cfg, "qk_norm_eps", None)


def _check_layer_fields(cfg: Any) -> None:
    """The soft caps, the post norms and the per-decoder-layer lists (`layer_kinds`, `rope_layers`): one entry
    per decoder layer (`layer_kinds`: per encoder layer in an encoder-only model), each a kind or a bool; a list that
    says what None says is stored as None."""
    _check_bools(cfg, "post_norms")
    if cfg.post_norms and not cfg.norm_first:
        raise ValueError("post_norms=True normalizes each sublayer's output inside a pre-norm residual, x + "
                         "post_norm(f(norm(x))): it needs norm_first=True, received norm_first=False")
    for name in ("attn_logit_softcap", "final_logit_softcap"):
        if getattr(cfg, name) is not None:
            _check_finite(name, getattr(cfg, name), positive=True)
            object.__setattr__(cfg, name, float(getattr(cfg, name)))  # JSON may give 30 for 30.0
    if cfg.final_logit_softcap is not None and not cfg.output_projection:
        raise ValueError(f"final_logit_softcap={cfg.final_logit_softcap!r} caps the output projection's logits; "
                         "this model has output_projection=False")
    if cfg.layer_kinds is not None:
        kinds = cfg.layer_kinds
        if not isinstance(kinds, (list, tuple)) or len(kinds) != cfg.kinds_depth or not all(
                isinstance(k, str) and k in LAYER_KINDS for k in kinds):
            stack = "encoder" if cfg.is_encoder_only else "decoder"
            raise ValueError(f"layer_kinds must name one of {', '.join(LAYER_KINDS)} per {stack} layer "
                             f"(num_{stack}_layers={cfg.kinds_depth}), received {kinds!r}")
        if cfg.sliding_window is None:
            raise ValueError(f"layer_kinds={list(kinds)!r} says which decoder layers attend within the sliding "
                             "window; this model has sliding_window=None")
        if "sliding" not in kinds:
            raise ValueError(f"layer_kinds={list(kinds)!r} has no sliding layer, so sliding_window="
                             f"{cfg.sliding_window} would be unused (say sliding_window=None)")
        if cfg.shared_layers:
            raise ValueError(f"layer_kinds={list(kinds)!r} gives layers kinds of their own; this model has "
                             "shared_layers=True (one layer's weights run as every layer)")
        object.__setattr__(cfg, "layer_kinds", None if "full" not in kinds else tuple(kinds))
    if cfg.local_rope_theta is not None:
        _check_finite("local_rope_theta", cfg.local_rope_theta, positive=True)
        object.__setattr__(cfg, "local_rope_theta", float(cfg.local_rope_theta))
        if cfg.positional != "rope" or cfg.layer_kinds is None:
            raise ValueError(f"local_rope_theta={cfg.local_rope_theta!r} is the rotary base of the sliding "
                             "layers beside full ones: it needs positional='rope' and layer_kinds naming both "
                             f"kinds, received positional={cfg.positional!r}, layer_kinds={cfg.layer_kinds!r}")
    if cfg.rope_layers is not None:
        flags = cfg.rope_layers
        if not isinstance(flags, (list, tuple)) or len(flags) != cfg.num_decoder_layers or not all(
                isinstance(f, bool) for f in flags):
            raise ValueError(f"rope_layers must be one bool per decoder layer (num_decoder_layers="
                             f"{cfg.num_decoder_layers}; True = rotary positions there), received {flags!r}")
        if cfg.positional != "rope":
            raise ValueError(f"rope_layers={list(flags)!r} says which decoder layers take rotary positions; it "
                             f"needs positional='rope', received positional={cfg.positional!r}")
        object.__setattr__(cfg, "rope_layers", None if all(flags) else tuple(flags))


def _check_parallel(cfg: Any) -> None:
    """`parallel_residual` (a pre-norm decoder-only layer without post norms) and `ffn_shares_norm` (which
    needs it); `rotary_interleaved` (which needs rotary positions)."""
    _check_bools(cfg, "parallel_residual", "ffn_shares_norm", "rotary_interleaved")
    if cfg.parallel_residual:
        if not cfg.norm_first or cfg.post_norms or not cfg.is_decoder_only:
            raise ValueError("parallel_residual=True adds attention and feed-forward of one normalized input "
                             "to a decoder-only layer's residual: it needs norm_first=True, post_norms=False "
                             f"and no encoder, received norm_first={cfg.norm_first}, post_norms="
                             f"{cfg.post_norms}, num_encoder_layers={cfg.num_encoder_layers}")
    if cfg.ffn_shares_norm and not cfg.parallel_residual:
        raise ValueError("ffn_shares_norm=True lets the feed-forward read the attention's norm beside it: it "
                         "needs parallel_residual=True, received parallel_residual=False")
    if cfg.rotary_interleaved and cfg.positional != "rope":
        raise ValueError("rotary_interleaved=True says which dims rotary positions turn together; it needs "
                         f"positional='rope', received positional={cfg.positional!r}")


# ALiBi's slopes are powers of two up to 8 heads (2^(-8k/n) with n <= 8, and for n <= 4 the odd k of 2n), and a power
# of two times a position below 256 is a bfloat16 number: `alibi_bfloat16` then rounds nothing
ALIBI_EXACT_HEADS, ALIBI_EXACT_POSITIONS = 8, 256


def _check_alibi(cfg: Any) -> None:
    """`alibi` (the biases of a decoder-only model whose only positions they are), `alibi_scaled` and
    `alibi_bfloat16` (which need it; stored as False where its rounding changes no bias)."""
    _check_bools(cfg, "alibi", "alibi_scaled", "alibi_bfloat16")
    if cfg.alibi and not (cfg.is_decoder_only and cfg.positional == "none"):
        raise ValueError("alibi=True biases a decoder-only model's causal self-attention by key position, its only "
                         "positions: it needs num_encoder_layers=0 and positional='none', received "
                         f"num_encoder_layers={cfg.num_encoder_layers}, positional={cfg.positional!r}")
    if cfg.positional == "none" and not (cfg.alibi or cfg.relative_terms or cfg.relative_bias_buckets):
        raise ValueError("positional='none' leaves the positions to ALiBi biases or relative position scores: it "
                         f"needs alibi=True, relative_terms or relative_bias_buckets, received alibi=False, "
                         f"relative_terms={cfg.relative_terms!r}, relative_bias_buckets={cfg.relative_bias_buckets}")
    for name, what in (("alibi_scaled", "says where the ALiBi bias is added"),
                       ("alibi_bfloat16", "rounds the ALiBi bias")):
        if getattr(cfg, name) and not cfg.alibi:
            raise ValueError(f"{name}=True {what}; it needs alibi=True, received alibi=False")
    if cfg.alibi_bfloat16 and cfg.num_heads <= ALIBI_EXACT_HEADS and cfg.max_len <= ALIBI_EXACT_POSITIONS:
        object.__setattr__(cfg, "alibi_bfloat16", False)  # the rounding changes no bias: stored as exact


def _check_scalings(cfg: Any) -> None:
    """The fields of OLMo, OLMo 2 and Granite: norms without parameters or only after the sublayers, q/k norms
    over all heads at once, clamped q/k/v, and three multipliers (each a positive finite number)."""
    _check_bools(cfg, "pre_norms", "norm_affine", "norm_bias", "first_attn_norm")
    _check_choice("qk_norm_over", cfg.qk_norm_over, QK_NORM_OVER)
    if cfg.qk_norm_over != "head" and not cfg.qk_norm:
        raise ValueError(f"qk_norm_over={cfg.qk_norm_over!r} says what the q/k norms cover; this model has "
                         "qk_norm=False")
    if not cfg.pre_norms and not (cfg.norm_first and cfg.post_norms):
        raise ValueError("pre_norms=False leaves only the norm on each sublayer's output, x + post_norm(f(x)): it "
                         f"needs norm_first=True and post_norms=True, received norm_first={cfg.norm_first}, "
                         f"post_norms={cfg.post_norms}")
    if not cfg.norm_affine and cfg.norm != "layer":
        raise ValueError(f"norm_affine=False (LayerNorms without gamma and beta) needs norm='layer', received "
                         f"norm={cfg.norm!r}")
    if not cfg.first_attn_norm and not (cfg.is_encoder_only and cfg.norm_first and cfg.pre_norms
                                        and not cfg.shared_layers):
        raise ValueError("first_attn_norm=False leaves encoder layer 0's attention without its norm: it needs an "
                         "encoder-only pre-norm model with its own weights per layer, received num_decoder_layers="
                         f"{cfg.num_decoder_layers}, norm_first={cfg.norm_first}, pre_norms={cfg.pre_norms}, "
                         f"shared_layers={cfg.shared_layers}")
    if not cfg.norm_bias and (cfg.norm != "layer" or not cfg.norm_affine):
        raise ValueError("norm_bias=False (LayerNorms with gamma and no beta) needs norm='layer' and "
                         f"norm_affine=True, received norm={cfg.norm!r}, norm_affine={cfg.norm_affine}")
    if cfg.clip_qkv is not None:
        _check_finite("clip_qkv", cfg.clip_qkv, positive=True)
        object.__setattr__(cfg, "clip_qkv", float(cfg.clip_qkv))
    for name in ("embedding_multiplier", "residual_multiplier", "logit_divisor"):
        _check_finite(name, getattr(cfg, name), positive=True)
        object.__setattr__(cfg, name, float(getattr(cfg, name)))  # JSON may give 1 for 1.0
    if cfg.logit_divisor != 1.0 and not cfg.output_projection:
        raise ValueError(f"logit_divisor={cfg.logit_divisor!r} divides the output projection's logits; this "
                         "model has output_projection=False")


def _check_classifier(cfg: Any) -> None:
    _check_bools(cfg, "classifier_bias", "next_sentence", "choice_head")
    if cfg.eos_id is not None:
        _check_int("eos_id", cfg.eos_id, minimum=0)
        if cfg.eos_id >= cfg.src_vocab_size:
            raise ValueError(f"eos_id={cfg.eos_id} is not a source id (src_vocab_size={cfg.src_vocab_size})")
        if cfg.classifier_input != "eos":
            raise ValueError(f"eos_id={cfg.eos_id} says where a classifier_input='eos' classifier reads; this "
                             f"model has classifier_input={cfg.classifier_input!r}")
    _check_choice("classifier_input", cfg.classifier_input, CLASSIFIER_INPUTS)
    if cfg.problem_type is not None:
        _check_choice("problem_type", cfg.problem_type, PROBLEM_TYPES)
    if cfg.next_sentence and not (cfg.pooler and cfg.is_encoder_only):
        raise ValueError("next_sentence (BERT's pretraining head) reads the pooler: it needs an encoder-only model "
                         f"with pooler=True, received pooler={cfg.pooler}, num_decoder_layers="
                         f"{cfg.num_decoder_layers}")
    if cfg.choice_head and not (cfg.is_decoder_only and cfg.output_projection and cfg.classifier is None):
        raise ValueError("choice_head (GPT-2's multiple-choice score beside its logits) needs a decoder-only model "
                         f"with an output projection and no classifier, received num_encoder_layers="
                         f"{cfg.num_encoder_layers}, output_projection={cfg.output_projection}, classifier="
                         f"{cfg.classifier!r}")
    if cfg.classifier is None:
        odd = {k: getattr(cfg, k) for k in ("num_labels", "classifier_dense", "label_names", "problem_type")
               if getattr(cfg, k)}
        if odd or cfg.classifier_input != "pooler" or not cfg.classifier_bias:
            raise ValueError(f"{', '.join(odd) or 'classifier_input/classifier_bias'} configure a classifier; "
                             "this model has classifier=None")
        return
    _check_choice("classifier", cfg.classifier, CLASSIFIERS)
    _check_int("num_labels", cfg.num_labels, minimum=1)
    if cfg.classifier_dense is not None:
        _check_choice("classifier_dense", cfg.classifier_dense, CLASSIFIER_DENSE)
    if cfg.output_projection:
        raise ValueError(f"classifier={cfg.classifier!r} scores the final hidden states in place of the output "
                         "projection: it needs output_projection=False")
    if cfg.head_transform and (cfg.embedding_size is not None or cfg.classifier_input == "pooler"
                               and cfg.pooled_classifier):
        raise ValueError(f"head_transform before classifier={cfg.classifier!r} (ModernBERT's task heads) needs the "
                         f"head d_model wide and read by the classifier, received embedding_size="
                         f"{cfg.embedding_size}, classifier_input={cfg.classifier_input!r}")
    if cfg.is_encoder_decoder and cfg.classifier == "choice":
        raise ValueError("classifier='choice' needs an encoder-only or a decoder-only model (no encoder-decoder "
                         "family has a multiple-choice class)")
    if cfg.classifier == "span" and cfg.num_labels != 2:
        raise ValueError(f"classifier='span' scores a start and an end: num_labels must be 2, received "
                         f"{cfg.num_labels}")
    if cfg.classifier == "choice" and cfg.num_labels != 1:
        raise ValueError(f"classifier='choice' scores each choice (a row of the batch) once: num_labels must be 1, "
                         f"received {cfg.num_labels}")
    if not cfg.pooled_classifier and cfg.classifier_input != "pooler":
        raise ValueError(f"classifier_input={cfg.classifier_input!r} says where a sequence classifier reads; "
                         f"classifier={cfg.classifier!r} reads every position")
    if cfg.pooled_classifier:
        needs = {"pooler": cfg.pooler, "first": cfg.is_encoder_only, "last": cfg.is_decoder_only,
                 "eos": cfg.is_encoder_decoder and cfg.eos_id is not None}
        if not needs[cfg.classifier_input]:
            raise ValueError(f"classifier_input={cfg.classifier_input!r} needs " + {
                "pooler": "pooler=True", "first": "an encoder-only model",
                "last": "a decoder-only (causal) model",
                "eos": "an encoder-decoder model and eos_id"}[cfg.classifier_input])
    if cfg.label_names is not None:
        names = cfg.label_names
        if not isinstance(names, (list, tuple)) or len(names) != cfg.num_labels or not all(
                isinstance(n, str) for n in names):
            raise ValueError(f"label_names must be {cfg.num_labels} strings (one per label, in id order), "
                             f"received {names!r}")
        object.__setattr__(cfg, "label_names", tuple(names))  # JSON gives a list


def _check_experts(cfg: Any) -> None:
    """The mixture-of-experts fields: all at their defaults without experts; with them, a decoder-only model
    (its experts have biases where `ffn_bias` says, the router where `router_bias` says), `experts_per_token` of
    `num_experts`, and `expert_layers` one bool per decoder layer (a width or list that says what None says is
    stored as None)."""
    _check_int("num_experts", cfg.num_experts, minimum=0)
    _check_int("experts_per_token", cfg.experts_per_token, minimum=0)
    _check_choice("router_softmax", cfg.router_softmax, ROUTER_SOFTMAX)
    _check_bools(cfg, "router_renormalize", "router_bias")
    for name in ("expert_d_ff", "shared_expert_d_ff"):
        if getattr(cfg, name) is not None:
            _check_int(name, getattr(cfg, name), minimum=1, or_none=True)
    if cfg.num_experts == 0:
        odd = [f"{k}={getattr(cfg, k)!r}" for k, value in EXPERT_DEFAULTS.items() if getattr(cfg, k) != value]
        if odd:
            raise ValueError(f"{', '.join(odd)} configure a mixture of experts; this model has num_experts=0")
        return
    if not cfg.is_decoder_only:
        raise ValueError(f"num_experts={cfg.num_experts} (a mixture-of-experts feed-forward) needs a decoder-only "
                         f"model, received num_encoder_layers={cfg.num_encoder_layers}")
    if not 1 <= cfg.experts_per_token <= cfg.num_experts:
        raise ValueError(f"experts_per_token must be from 1 to num_experts={cfg.num_experts}, received "
                         f"{cfg.experts_per_token!r}")
    if cfg.router_renormalize and cfg.router_softmax == "after_topk":
        raise ValueError("router_renormalize divides the k chosen probabilities by their sum; with router_softmax="
                         "'after_topk' they already sum to 1 (say router_renormalize=False)")
    if cfg.expert_d_ff == cfg.d_ff:  # one form for one model: None says "d_ff"
        object.__setattr__(cfg, "expert_d_ff", None)
    flags = cfg.expert_layers
    if flags is not None:
        if not isinstance(flags, (list, tuple)) or len(flags) != cfg.num_decoder_layers or not all(
                isinstance(f, bool) for f in flags) or not any(flags):
            raise ValueError(f"expert_layers must be one bool per decoder layer (num_decoder_layers="
                             f"{cfg.num_decoder_layers}; True = the mixture of experts there, at least one), "
                             f"received {flags!r}")
        object.__setattr__(cfg, "expert_layers", None if all(flags) else tuple(flags))


def _check_sinks_and_glu(cfg: Any) -> None:
    """`attention_sinks` (a decoder-only model's self-attention) and the clamped GLU (`glu_limit`, `glu_alpha`,
    `glu_up_offset`: a gated feed-forward; a gain other than 1 on silu only)."""
    _check_bools(cfg, "attention_sinks")
    if cfg.attention_sinks and not cfg.is_decoder_only:
        raise ValueError(f"attention_sinks=True (a learned logit per head in self-attention) needs a decoder-only "
                         f"model, received num_encoder_layers={cfg.num_encoder_layers}")
    if cfg.glu_limit is not None:
        _check_finite("glu_limit", cfg.glu_limit, positive=True)
        object.__setattr__(cfg, "glu_limit", float(cfg.glu_limit))  # JSON may give 7 for 7.0
    _check_finite("glu_alpha", cfg.glu_alpha, positive=True)
    _check_finite("glu_up_offset", cfg.glu_up_offset)
    object.__setattr__(cfg, "glu_alpha", float(cfg.glu_alpha))
    object.__setattr__(cfg, "glu_up_offset", float(cfg.glu_up_offset))
    odd = [f"{name}={value!r}" for name, value, default in (("glu_limit", cfg.glu_limit, None),
                                                            ("glu_alpha", cfg.glu_alpha, 1.0),
                                                            ("glu_up_offset", cfg.glu_up_offset, 0.0))
           if value != default]
    if odd and not cfg.ffn_gated:
        raise ValueError(f"{', '.join(odd)} configure a gated feed-forward's GLU; this model has ffn_gated=False")
    if cfg.glu_alpha != 1.0 and cfg.activation != "silu":
        raise ValueError(f"glu_alpha={cfg.glu_alpha!r} is the sigmoid gain of silu, g * sigmoid(glu_alpha * g); "
                         f"this model has activation={cfg.activation!r}")


# The mixture-of-experts fields but num_experts, and their values without experts (`_check_experts`).
EXPERT_DEFAULTS = {"experts_per_token": 0, "expert_d_ff": None, "router_softmax": "before_topk",
                    "router_renormalize": False, "router_bias": False, "shared_expert_d_ff": None,
                    "expert_layers": None}


def _check_int(name: str, value: Any, minimum: int, or_none: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}{' or None' if or_none else ''}, received "
                         f"{value!r}")


def _check_relative_bias(cfg: Any) -> None:
    """T5's relative position bias: `relative_bias_buckets` (0 = none) and `relative_bias_max_distance`."""
    _check_int("relative_bias_buckets", cfg.relative_bias_buckets, minimum=0)
    _check_int("relative_bias_max_distance", cfg.relative_bias_max_distance, minimum=1)
    if cfg.relative_bias_buckets == 0:
        if cfg.relative_bias_max_distance != 128:
            raise ValueError(f"relative_bias_max_distance={cfg.relative_bias_max_distance} needs a relative position bias "
                             "(relative_bias_buckets > 0), received relative_bias_buckets=0")
        return
    if cfg.relative_bias_buckets < 4:
        raise ValueError("relative_bias_buckets must be 0 (none) or >= 4 (a bidirectional stack halves them, and half "
                         "of "
                         f"each half are exact distances), received {cfg.relative_bias_buckets}")
    if cfg.relative_bias_max_distance <= cfg.relative_bias_buckets // 2:
        raise ValueError(f"relative_bias_max_distance={cfg.relative_bias_max_distance} must exceed the exact distances, "
                         f"relative_bias_buckets // 2 = {cfg.relative_bias_buckets // 2}")


def _check_attention_scale(value: Any) -> None:
    if isinstance(value, str):
        if value in ATTENTION_SCALES:
            return
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return
    raise ValueError(f"attention_scale must be one of {', '.join(ATTENTION_SCALES)} (1/sqrt(d_head), "
                     f"1/sqrt(d_model), 1) or a positive finite number, received {value!r}")


def _check_finite(name: str, value: Any, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (positive and value <= 0):
        raise ValueError(f"{name} must be a {'positive ' if positive else ''}finite number, received {value!r}")


def _check_rope_scaling(value: Any) -> None:
    """A rope type transformers ships and only the parameters it reads, each a finite number (a list of them for
    longrope's factors, `truncate` a bool)."""
    if not isinstance(value, dict) or not isinstance(value.get("rope_type"), str):
        raise ValueError(f"rope_scaling must be an object with a rope_type, received {value!r}")
    kind = value["rope_type"]
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling rope_type={kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    unknown = sorted(set(value) - {"rope_type", *ROPE_TYPES[kind]})
    if unknown:
        raise ValueError(f"rope_scaling has parameter(s) {unknown} that rope_type={kind!r} does not read "
                         f"(it reads {', '.join(ROPE_TYPES[kind])})")
    for key, item in value.items():
        if key == "rope_type":
            continue
        if key == "truncate":
            if not isinstance(item, bool):
                raise ValueError(f"rope_scaling truncate must be true or false, received {item!r}")
        elif key in ("short_factor", "long_factor"):
            if not isinstance(item, (list, tuple)) or not item:
                raise ValueError(f"rope_scaling {key} must be a list of numbers, received {item!r}")
            for x in item:
                _check_finite(f"rope_scaling {key}", x, positive=True)
        elif item is not None:
            _check_finite(f"rope_scaling {key}", item)


def _check_bools(cfg: Any, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"{name} must be a bool, received {getattr(cfg, name)!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, received {value!r}")


def _check_relative(cfg: Any) -> None:
    """DeBERTa's fields: disentangled attention (`relative_terms` and the table's size, norm and projections),
    embeddings zeroed at padding, and padding queries that average every position."""
    _check_bools(cfg, "relative_embed_norm", "relative_shares_qk", "embed_zero_padding")
    _check_choice("padded_queries", cfg.padded_queries, PADDED_QUERIES)
    if cfg.padded_queries != "attend" and not (cfg.is_encoder_only and not cfg.causal_encoder):
        raise ValueError(f"padded_queries={cfg.padded_queries!r} needs an encoder-only model without "
                         f"causal_encoder, received num_decoder_layers={cfg.num_decoder_layers}, causal_encoder="
                         f"{cfg.causal_encoder}")
    _check_int("relative_buckets", cfg.relative_buckets, minimum=0)
    _check_int("max_relative_positions", cfg.max_relative_positions, minimum=0)
    terms = cfg.relative_terms
    if terms is None:
        for name in ("relative_buckets", "max_relative_positions", "relative_embed_norm", "relative_shares_qk"):
            if getattr(cfg, name):
                raise ValueError(f"{name}={getattr(cfg, name)!r} configures disentangled attention; this model has "
                                 "relative_terms=None")
        return
    if not isinstance(terms, (list, tuple)) or not terms or len(set(terms)) != len(terms) or not all(
            isinstance(t, str) and t in RELATIVE_TERMS for t in terms):
        raise ValueError(f"relative_terms must name one or both of {', '.join(RELATIVE_TERMS)}, each once, or be "
                         f"None, received {terms!r}")
    object.__setattr__(cfg, "relative_terms", tuple(t for t in RELATIVE_TERMS if t in terms))
    if not (cfg.is_encoder_only and not cfg.causal_encoder and not cfg.shared_layers
            and cfg.kv_heads == cfg.num_heads and cfg.positional in ("learned", "none") and not cfg.qk_norm
            and cfg.norm == "layer" and cfg.norm_affine):
        raise ValueError(f"relative_terms={list(terms)!r} (disentangled attention) needs an encoder-only model "
                         "without causal_encoder, shared_layers, grouped key/value heads or q/k norms, with learned "
                         "or no absolute positions and LayerNorms with parameters, received norm="
                         f"{cfg.norm!r}, norm_affine={cfg.norm_affine},  num_decoder_layers={cfg.num_decoder_layers}, "
                         f"causal_encoder={cfg.causal_encoder}, shared_layers={cfg.shared_layers}, num_kv_heads="
                         f"{cfg.num_kv_heads}, qk_norm={cfg.qk_norm}, positional={cfg.positional!r}")
    if cfg.max_relative_positions < 1:
        raise ValueError(f"relative_terms={list(terms)!r} needs max_relative_positions >= 1, received "
                         f"{cfg.max_relative_positions}")
    if cfg.relative_buckets:
        mid = cfg.relative_buckets // 2
        if cfg.relative_buckets < 2 or cfg.max_relative_positions - 1 <= mid:
            raise ValueError(f"relative_buckets={cfg.relative_buckets} log-buckets distances up to "
                             f"max_relative_positions={cfg.max_relative_positions}: it needs relative_buckets >= 2 "
                             "and max_relative_positions > relative_buckets // 2 + 1")
