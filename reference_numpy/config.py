"""`TransformerConfig`: the one hyperparameter object every backend is built from."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

# the allowed values of the choice fields, re-exported here where callers have always found them
from .config_checks import (  # noqa: F401
    ACTIVATIONS, ATTENTION_SCALES, CLASSIFIER_DENSE, CLASSIFIER_INPUTS, CLASSIFIERS, EXPERT_DEFAULTS, HEAD_ORDERS,
    LAYER_KINDS, NORMS, POSITIONAL, PROBLEM_TYPES, QK_NORM_OVER, ROPE_TYPES, ROUTER_SOFTMAX, SINUSOID_FREQUENCIES,
    SINUSOID_LAYOUTS, check_config)


@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of a Transformer: encoder-decoder, encoder-only or decoder-only.

    Defaults are the paper's base model (Vaswani et al. 2017, Table 3), with a 37000-token vocabulary
    on each side as in its WMT 2014 English-German setup. The three families:

    - encoder-decoder (both layer counts > 0): the paper, Marian, BART;
    - encoder-only (`num_decoder_layers=0`): `(src_ids) -> (B, S, tgt_vocab_size)`, e.g. BERT;
    - decoder-only (`num_encoder_layers=0`): `(ids) -> (B, T, tgt_vocab_size)`, causal, decoder layers without
      cross-attention, e.g. GPT-2. It reads `tgt_embed`/`tgt_pos` and `tgt_vocab_size`; `src_vocab_size` is unused.

    Fields marked "(BERT)", "(GPT-2)" or "(Marian)" exist for one model family; each is named for what it does.
    """

    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000  # encoder-only model: the number of per-position classes
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6  # 0 = decoder-only model (causal self-attention, no cross-attention)
    num_decoder_layers: int = 6  # 0 = encoder-only model with a per-position classifier head
    d_ff: int = 2048
    max_len: int = 512  # longest sequence accepted; rows of the learned position table
    dropout: float = 0.1
    activation: str = "relu"  # relu (paper), gelu (exact erf form; BERT), gelu_tanh (GPT-2), silu (Marian's swish)
    norm_first: bool = False  # False = post-LN as in the paper; True = pre-LN
    final_norm: bool = False  # a LayerNorm after each stack, as torch.nn.Transformer always has
    layer_norm_eps: float = 1e-5  # PyTorch's default; Keras's LayerNormalization defaults to 1e-3
    positional: str = "sinusoidal"  # sinusoidal (paper section 3.5), learned, rope, or none (DeBERTa-v3, ALiBi, T5)
    sinusoid_layout: str = "interleaved"  # interleaved sin/cos (paper) or concatenated [sin | cos] (tensor2tensor)
    sinusoid_frequencies: str = "paper"  # 10000^(-2i/d) (paper) or inclusive: 10000^(-i/(d/2 - 1)) (M2M100, fairseq)
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model) (paper section 3.4)
    bias: bool = True  # biases on the attention and feed-forward projections and the output layer
    tie_embeddings: bool = False  # output projection reuses the target (encoder-only: source) embedding
    pad_id: int | None = 0  # token id that padding masks are derived from; None = no pad token (all ids are real)
    output_bias: bool | None = None  # a bias on the logits; None = same as `bias` (GPT-2 has none, BERT/Marian do)
    output_projection: bool = True  # False = a bare backbone returning final hidden states (BertModel)
    share_embeddings: bool = False  # the decoder reads the source embedding table (Marian; equal vocabularies)
    position_offset: int = 0  # learned positions: position p reads row p + offset (BART: 2); table is max_len + offset
    # (sinusoidal positions take an offset only under positions_skip_pad: M2M100's pad_id + 1)
    type_vocab_size: int = 0  # (BERT) segment embeddings added to the source embedding; 0 = none
    embed_norm: bool = False  # (BERT, BART) a LayerNorm on token + position (+ segment) embeddings
    head_transform: bool = False  # (BERT) dense -> activation -> LayerNorm before the output projection
    head_activation: str | None = None  # the head transform's activation; None = activation (KerasHub BERT: gelu)
    head_layer_norm_eps: float | None = None  # the head's LayerNorm epsilon; None = layer_norm_eps
    pooler: bool = False  # (BERT) dense + tanh on the first position's final hidden state; an extra output
    attention_scale: str | float = "head"  # scores times: head 1/sqrt(d_head) (paper), model 1/sqrt(d_model), none 1
    embed_bias: bool = False  # a learned bias on the token embedding: one-hot ids through Linear(vocab, d, bias=True)
    head_order: str = "dense-activation-norm"  # the head transform's order (BERT); or dense-norm-activation
    norm: str = "layer"  # layer (LayerNorm: gamma, beta) or rms (RMSNorm: x / rms(x) * gamma; Llama and kin)
    norm_weight_offset: float = 0.0  # every norm multiplies by (offset + gamma); Gemma stores w and uses 1 + w
    ffn_gated: bool = False  # gated feed-forward: linear2(act(gate(x)) * linear1(x)) (SwiGLU with silu, GeGLU)
    num_kv_heads: int | None = None  # key/value heads (grouped-query attention; 1 = multi-query); None = num_heads
    head_size: int | None = None  # per-head width when it is not d_model / num_heads (Gemma, Qwen3); None = that
    attention_bias: bool | None = None  # biases on q, k, v and o; None = `bias`
    qkv_bias: bool | None = None  # biases on q, k and v (Qwen2: yes, with o and the FFN without); None = attention's
    ffn_bias: bool | None = None  # biases on the feed-forward's linears; None = `bias`
    # A mixture-of-experts feed-forward (Mixtral, Qwen-MoE; `reference_numpy.moe`): a router scores `num_experts`
    # experts (each a feed-forward of `expert_d_ff`, without biases) for every token, which runs through its
    # `experts_per_token` best, their outputs weighted by the router. 0 = a dense feed-forward. Decoder-only models.
    num_experts: int = 0
    experts_per_token: int = 0  # top-k: the experts each token runs through (1 .. num_experts)
    expert_d_ff: int | None = None  # each routed expert's inner width; None = d_ff
    router_softmax: str = "before_topk"  # over every expert, then the top k (Mixtral, Qwen); or over the k chosen
    router_renormalize: bool = False  # before_topk: the k chosen probabilities divided by their sum (Mixtral)
    shared_expert_d_ff: int | None = None  # (Qwen2-MoE) a shared expert beside the routed ones, times sigmoid(x w)
    router_bias: bool = False  # (GPT-OSS) a bias on the router's scores, `{ffn}.router.bias` (num_experts,)
    # per decoder layer, whether its feed-forward is the mixture (False: a dense one of d_ff; Qwen-MoE's
    # decoder_sparse_step and mlp_only_layers); None = every layer
    expert_layers: tuple[bool, ...] | None = None
    qk_norm: bool = False  # (Qwen3) a norm over each head of q and k, after projection, before the rotation
    qk_norm_eps: float | None = None  # the q/k norms' epsilon; None = layer_norm_eps (KerasHub Qwen3: always 1e-5)
    sliding_window: int | None = None  # a query at i attends keys j with i - j < window (and j <= i); None = all
    rope_theta: float = 10000.0  # positional="rope": the base of the rotation frequencies
    rope_scaling: dict | None = None  # transformers' rope parameters: {"rope_type": "llama3", "factor": 8.0, ...}
    rotary_fraction: float = 1.0  # the share of each head's dims that rotate (transformers' partial_rotary_factor)
    # rotary positions turn adjacent dims (2i, 2i + 1) together (GPT-J's rotate_every_two), not dim i with dim
    # i + rotary_dim / 2 (transformers' rotate_half)
    rotary_interleaved: bool = False
    # (Gemma 2/3, ModernBERT) each decoder layer's attention (an encoder-only model's: each encoder layer's):
    # "sliding" (within `sliding_window`) or "full" (every key it may see); None = every layer as `sliding_window` says
    layer_kinds: tuple[str, ...] | None = None
    local_rope_theta: float | None = None  # (Gemma 3) the rotary base of the sliding layers, without rope_scaling
    # (SmolLM3) per decoder layer, whether rotary positions turn q and k there (False: no positional encoding at all
    # in that layer, "NoPE"); None = every layer rotates
    rope_layers: tuple[bool, ...] | None = None
    attn_logit_softcap: float | None = None  # (Gemma 2) scaled scores -> cap * tanh(scores / cap), before the mask
    final_logit_softcap: float | None = None  # (Gemma 2/3) the logits -> cap * tanh(logits / cap)
    post_norms: bool = False  # (Gemma 2/3) a norm on each sublayer's output too: x + post_norm(f(norm(x)))
    # (GPT-OSS) a learned logit per query head, `{attn}.sinks` (num_heads,), joins each query's softmax over the
    # keys as one more column that is then dropped: the weights of the keys sum to less than 1. Self-attention of a
    # decoder-only model.
    attention_sinks: bool = False
    # (GPT-OSS) a gated feed-forward's clamped GLU: act(min(g, glu_limit)) * (clip(u, -glu_limit, glu_limit) +
    # glu_up_offset), g = x Wg + bg, u = x W1 + b1; under activation="silu", act(g) = g * sigmoid(glu_alpha * g).
    # Defaults: no clamp, sigmoid gain 1, no offset (SwiGLU)
    glu_limit: float | None = None
    glu_alpha: float = 1.0
    glu_up_offset: float = 0.0
    # (GPT-NeoX, GPT-J, Phi) a decoder layer's attention and feed-forward read the same input and add to the
    # residual at once: x + attn(norm1(x)) + ffn(norm3(x)); False = one after the other
    parallel_residual: bool = False
    ffn_shares_norm: bool = False  # (GPT-J, Phi) parallel_residual's feed-forward reads norm1(x) too; no norm3
    # (Bloom, Falcon) ALiBi: head h's self-attention score for key position j gets + slope_h * j (Press et al. 2021,
    # `alibi.slopes`), the model's only positions (positional="none"); decoder-only models
    alibi: bool = False
    alibi_scaled: bool = False  # (Falcon) the ALiBi bias is added before the scores' scaling, so scaled with them
    alibi_bfloat16: bool = False  # (Falcon) slope and slope * position rounded to bfloat16, as transformers' Falcon
    # (OLMo, OLMo 2, Granite) the norms and scalings below; `_check_scalings`
    pre_norms: bool = True  # False (OLMo 2): no norm before the sublayers, x + post_norm(f(x)) (needs post_norms)
    qk_norm_over: str = "head"  # qk_norm over each head's d_k (Qwen3) or "all" of q and of k at once (OLMo 2)
    norm_affine: bool = True  # False (OLMo): LayerNorms without gamma and beta, (x - mean) / sqrt(var + eps)
    norm_bias: bool = True  # False (ModernBERT, Cohere): LayerNorms with gamma and no beta, normed(x) * gamma
    first_attn_norm: bool = True  # False (ModernBERT): encoder layer 0's attention reads x itself (no norm1 there)
    clip_qkv: float | None = None  # (OLMo) q, k and v clamped to [-clip_qkv, clip_qkv] right after their projection
    embedding_multiplier: float = 1.0  # (Granite) the token embeddings times this
    residual_multiplier: float = 1.0  # (Granite) each sublayer's output times this before the residual add
    logit_divisor: float = 1.0  # (Granite's logits_scaling) the logits divided by this
    # (T5) a learned bias per head and bucket of relative distance (key position - query position), added to every
    # self-attention's scores: one table per stack, `{stack}.relative_bias.embedding` (buckets, heads); the encoder's
    # buckets are bidirectional, the decoder's causal (`ops.relative_position_buckets`). 0 = none
    relative_bias_buckets: int = 0
    relative_bias_max_distance: int = 128  # (T5) distances from this on share the last bucket
    # (RoBERTa) learned positions count non-pad ids only: the k-th non-pad token of a row (k = 0, 1, ...) reads row
    # position_offset + k, every pad_id token row position_offset - 1 (`ops.skip_pad_positions`)
    positions_skip_pad: bool = False
    # (ALBERT) factorized embeddings: the token, position and segment tables and the embedding norm are this wide, a
    # projection `src_embed_proj` (embedding_size -> d_model) follows them, and the head transform maps d_model back
    # to this width for the output projection (tied: the token table). None = no factorization (d_model wide).
    embedding_size: int | None = None
    shared_layers: bool = False  # (ALBERT) every encoder layer applies one set of weights, `encoder.layers.0.*`
    # (BERT as a decoder: BertLMHeadModel, RobertaForCausalLM) an encoder-only model whose self-attention is causal:
    # position i attends the real positions j <= i
    causal_encoder: bool = False
    # (DeBERTa) disentangled attention: beside the content scores q k^T, every encoder self-attention adds the
    # position terms named here, "c2p" (each query against the key of its relative position to the key) and "p2c"
    # (each key against the query of that position), scaled as the content scores; the relative positions' table
    # `encoder.rel_embed` is shared by every layer. None = no relative positions.
    relative_terms: tuple[str, ...] | None = None
    relative_buckets: int = 0  # the table's rows each way: log-bucketed distances (0: max_relative_positions exact)
    max_relative_positions: int = 0  # the largest distance the log buckets reach (without buckets: the table's rows)
    relative_embed_norm: bool = False  # a LayerNorm on the relative positions' table (`encoder.rel_embed_norm`)
    relative_shares_qk: bool = False  # the positions are projected by q's and k's kernels, not pos_q's and pos_k's
    embed_zero_padding: bool = False  # (DeBERTa) the embeddings (after their norm) times the padding mask
    # a padding position's query: "attend" the real keys (BERT), or "average" every position's value with equal
    # weights (DeBERTa: its mask hides every key from a padding query, and its softmax of equal fills is uniform)
    padded_queries: str = "attend"
    # A task head on the final hidden states, in place of the output projection (`output_projection=False`); its
    # scores are the model's `logits`. `classifier`: "sequence" (one score vector per sequence, read from
    # `classifier_input`: the pooler's output, position 0, the last non-pad position of a causal model, or the
    # last position where the source holds `eos_id`), "token" (per position), "span" (start and end scores per
    # position: question answering, num_labels=2) or "choice" (multiple choice: each row of the batch one choice,
    # scored once as "sequence" with num_labels=1). An encoder-decoder's classifier reads the decoder's states.
    classifier: str | None = None
    num_labels: int = 0  # the classifier's scores per sequence or position
    # classifier="sequence": "pooler", "first", "last" or "eos" (BART: the decoder's state at the source's last
    # `eos_id`, so the decoder input is as long as the source)
    classifier_input: str = "pooler"
    eos_id: int | None = None  # classifier_input="eos": the end-of-sequence id whose last position it reads
    classifier_dense: str | None = None  # a dense layer with this activation before the scores (RoBERTa: tanh)
    classifier_bias: bool = True  # a bias on the scores (GPT-2's and Llama's `score` have none)
    next_sentence: bool = False  # (BERT pretraining) two scores from the pooler beside the masked-LM logits
    # (GPT-2 double heads) beside a causal model's logits, one multiple-choice score per row (a choice) from its last
    # real position, traced as `choice`
    choice_head: bool = False
    label_names: tuple | None = None  # the labels in id order (transformers' id2label): carried, computes nothing
    problem_type: str | None = None  # transformers' problem_type: carried, computes nothing

    def __hash__(self) -> int:  # rope_scaling is a dict: hash the whole config through its JSON
        return hash(self.to_json())

    def __post_init__(self) -> None:
        check_config(self)

    @property
    def head_dim(self) -> int:
        """d_k = d_v: `head_size`, or d_model / num_heads."""
        return self.head_size or self.d_model // self.num_heads

    @property
    def ffn_norm(self) -> str:
        """The norm a decoder layer's feed-forward reads: `norm1` under `ffn_shares_norm`, else its own `norm3`."""
        return "norm1" if self.ffn_shares_norm else "norm3"
    @property
    def kinds_depth(self) -> int:
        """How many layers `layer_kinds` lists: the decoder's, or an encoder-only model's encoder layers (whose
        self-attention `sliding_window` then windows both ways)."""
        return self.num_encoder_layers if self.is_encoder_only else self.num_decoder_layers

    def layer_window(self, i: int) -> int | None:
        """The sliding window decoder layer `i` (an encoder-only model's encoder layer `i`) attends within:
        `sliding_window`, or None for a "full" layer of `layer_kinds`."""
        return None if self.layer_kinds is not None and self.layer_kinds[i] == "full" else self.sliding_window

    def layer_kind(self, i: int) -> str:
        """`sliding` or `full`: how decoder layer `i` attends (`layer_kinds`, or `sliding_window` alone)."""
        return "full" if self.layer_window(i) is None else "sliding"

    @property
    def decoder_kinds(self) -> tuple[str, ...]:
        """The kinds (`layer_kind`) the decoder's layers use, each once, in LAYER_KINDS order: the self-attention
        masks a decoder makes."""
        used = {self.layer_kind(i) for i in range(self.num_decoder_layers)}
        return tuple(kind for kind in LAYER_KINDS if kind in used)

    @property
    def encoder_kinds(self) -> tuple[str, ...]:
        """The kinds the encoder's layers use, each once, in LAYER_KINDS order: an encoder-only model's as
        `layer_kind` says, an encoder-decoder's encoder "full" (its window and kinds are the decoder's)."""
        if not self.is_encoder_only:
            return ("full",)
        used = {self.layer_kind(i) for i in range(self.num_encoder_layers)}
        return tuple(kind for kind in LAYER_KINDS if kind in used)

    def encoder_layer_kind(self, i: int) -> str:
        """How encoder layer `i` attends: `layer_kind(i)` in an encoder-only model, "full" beside a decoder."""
        return self.layer_kind(i) if self.is_encoder_only else "full"

    def encoder_local_rope(self, i: int) -> bool:
        """Whether encoder layer `i` rotates by `local_rope_theta` (a sliding layer of an encoder-only model)."""
        return self.is_encoder_only and self.layer_local_rope(i)

    def kind_window(self, kind: str) -> int | None:
        """The window of a layer kind: `sliding_window` for "sliding", None for "full"."""
        return self.sliding_window if kind == "sliding" else None

    def layer_rotary(self, i: int) -> bool:
        """Whether decoder layer `i` turns q and k by rotary positions (`positional="rope"`, not off in
        `rope_layers`)."""
        return self.positional == "rope" and (self.rope_layers is None or self.rope_layers[i])

    def layer_local_rope(self, i: int) -> bool:
        """Whether decoder layer `i` rotates by `local_rope_theta` (a sliding layer beside full ones), not by
        `rope_theta` and `rope_scaling`."""
        return self.local_rope_theta is not None and self.layer_kind(i) == "sliding"

    def layer_experts(self, i: int) -> bool:
        """Whether decoder layer `i`'s feed-forward is the mixture of experts (`num_experts`, `expert_layers`)."""
        return self.num_experts > 0 and (self.expert_layers is None or self.expert_layers[i])

    @property
    def expert_width(self) -> int:
        """Each routed expert's inner width: `expert_d_ff`, or d_ff."""
        return self.expert_d_ff or self.d_ff

    @property
    def pooled_classifier(self) -> bool:
        """A classifier that scores one position per sequence (`classifier_input`): "sequence" or "choice"."""
        return self.classifier in ("sequence", "choice")

    @property
    def embed_width(self) -> int:
        """The width of the embedding tables, the head transform's output and the output projection's input:
        `embedding_size`, or d_model."""
        return self.embedding_size or self.d_model

    @property
    def encoder_weight_layers(self) -> int:
        """How many encoder layers have weights of their own: 1 under `shared_layers` (and any layer at all)."""
        return min(1, self.num_encoder_layers) if self.shared_layers else self.num_encoder_layers

    @property
    def relative_span(self) -> int:
        """The relative positions' table has `2 * relative_span` rows: `relative_buckets`, or
        `max_relative_positions` without buckets."""
        return self.relative_buckets or self.max_relative_positions

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `num_kv_heads`, or `num_heads` (plain multi-head attention)."""
        return self.num_kv_heads or self.num_heads

    @property
    def rotary_dim(self) -> int:
        """How many of each head's dims rotate (transformers: `int(head_dim * partial_rotary_factor)`)."""
        return int(self.head_dim * self.rotary_fraction)

    @property
    def has_o_bias(self) -> bool:
        return self.bias if self.attention_bias is None else self.attention_bias

    @property
    def has_qkv_bias(self) -> bool:
        return self.has_o_bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_ffn_bias(self) -> bool:
        return self.bias if self.ffn_bias is None else self.ffn_bias

    @property
    def attention_scale_factor(self) -> float:
        """What attention scores are multiplied by before the softmax (`attention_scale` as a number)."""
        if self.attention_scale == "head":
            return 1.0 / math.sqrt(self.head_dim)
        if self.attention_scale == "model":
            return 1.0 / math.sqrt(self.d_model)
        if self.attention_scale == "none":
            return 1.0
        return float(self.attention_scale)

    @property
    def alibi_factor(self) -> float:
        """What the ALiBi bias slope_h * j is multiplied by: the scores' scale under `alibi_scaled`, else 1."""
        return self.attention_scale_factor if self.alibi_scaled else 1.0

    @property
    def has_encoder(self) -> bool:
        return self.num_encoder_layers > 0

    @property
    def has_decoder(self) -> bool:
        return self.num_decoder_layers > 0

    @property
    def is_encoder_decoder(self) -> bool:
        return self.has_encoder and self.has_decoder

    @property
    def is_encoder_only(self) -> bool:
        return not self.has_decoder

    @property
    def is_decoder_only(self) -> bool:
        return not self.has_encoder

    @property
    def has_output_bias(self) -> bool:
        """Whether the logits have a bias (`output_bias`, or `bias` when that is None)."""
        return self.output_projection and (self.bias if self.output_bias is None else self.output_bias)

    @property
    def position_rows(self) -> int:
        """Rows of a learned position table: `max_len + position_offset`."""
        return self.max_len + self.position_offset

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "TransformerConfig":
        """A named configuration: `tiny` (fast tests), `base` or `big` (the paper's Table 3)."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def replace(self, **changes: Any) -> "TransformerConfig":
        """A copy with some fields changed (validated like a new config)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TransformerConfig":
        if not isinstance(data, dict):
            raise ValueError(f"a config must be a JSON object, received {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TransformerConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"config is not valid JSON: {exc}") from None
        return cls.from_dict(data)


def field_type_problem(name: str, value: Any) -> str | None:
    """What is wrong with the type of `value` for config field `name` (None if nothing), for readers of partial
    configs (a JSON or TOML file) that use a value before a whole config validates it: an int field takes an int
    (not a bool, not 3.7, not "0"), a bool field a bool (not "false"), a float field a finite number, a str field a
    string; a field whose annotation allows None takes None."""
    kinds = _FIELD_KINDS.get(name)
    if kinds is None:
        return f"unknown config field {name!r}"
    if value is None:
        return None if "None" in kinds else f"{name} must be {_KIND_TEXT[kinds[0]]}, received None"
    for kind in kinds:
        if kind == "bool" and isinstance(value, bool):
            return None
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return None
        if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return None
        if kind == "str" and isinstance(value, str):
            return None
        if kind == "dict" and isinstance(value, dict):
            return None
        if kind == "tuple" and isinstance(value, (list, tuple)):
            return None
    return f"{name} must be {' or '.join(_KIND_TEXT[k] for k in kinds)}, received {value!r}"


_FIELD_KINDS = {f.name: tuple(kind.split("[")[0] for kind in str(f.type).replace(" ", "").split("|"))
                for f in dataclasses.fields(TransformerConfig)}  # `tuple[str, ...] | None` -> ("tuple", "None")
_KIND_TEXT = {"int": "an integer", "bool": "true or false", "float": "a finite number", "str": "a string",
              "dict": "an object", "tuple": "a list", "None": "none"}


PRESETS: dict[str, TransformerConfig] = {
    "tiny": TransformerConfig(src_vocab_size=48, tgt_vocab_size=40, d_model=32, num_heads=4, num_encoder_layers=2,
                              num_decoder_layers=2, d_ff=64, max_len=64),
    "base": TransformerConfig(),
    "big": TransformerConfig(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
}
