"""`TransformerConfig`: the one hyperparameter object every backend is built from."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
POSITIONAL = ("sinusoidal", "learned", "rope")
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
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")  # transformers' names


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
    positional: str = "sinusoidal"  # sinusoidal (paper section 3.5) or learned
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
    # (Gemma 2/3) each decoder layer's attention: "sliding" (within `sliding_window`) or "full" (every earlier key);
    # None = every layer as `sliding_window` says
    layer_kinds: tuple[str, ...] | None = None
    local_rope_theta: float | None = None  # (Gemma 3) the rotary base of the sliding layers, without rope_scaling
    # (SmolLM3) per decoder layer, whether rotary positions turn q and k there (False: no positional encoding at all
    # in that layer, "NoPE"); None = every layer rotates
    rope_layers: tuple[bool, ...] | None = None
    attn_logit_softcap: float | None = None  # (Gemma 2) scaled scores -> cap * tanh(scores / cap), before the mask
    final_logit_softcap: float | None = None  # (Gemma 2/3) the logits -> cap * tanh(logits / cap)
    post_norms: bool = False  # (Gemma 2/3) a norm on each sublayer's output too: x + post_norm(f(norm(x)))
    # (GPT-NeoX, GPT-J, Phi) a decoder layer's attention and feed-forward read the same input and add to the
    # residual at once: x + attn(norm1(x)) + ffn(norm3(x)); False = one after the other
    parallel_residual: bool = False
    ffn_shares_norm: bool = False  # (GPT-J, Phi) parallel_residual's feed-forward reads norm1(x) too; no norm3
    # (OLMo, OLMo 2, Granite) the norms and scalings below; `_check_scalings`
    pre_norms: bool = True  # False (OLMo 2): no norm before the sublayers, x + post_norm(f(x)) (needs post_norms)
    qk_norm_over: str = "head"  # qk_norm over each head's d_k (Qwen3) or "all" of q and of k at once (OLMo 2)
    norm_affine: bool = True  # False (OLMo): LayerNorms without gamma and beta, (x - mean) / sqrt(var + eps)
    clip_qkv: float | None = None  # (OLMo) q, k and v clamped to [-clip_qkv, clip_qkv] right after their projection
    embedding_multiplier: float = 1.0  # (Granite) the token embeddings times this
    residual_multiplier: float = 1.0  # (Granite) each sublayer's output times this before the residual add
    logit_divisor: float = 1.0  # (Granite's logits_scaling) the logits divided by this
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
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("num_encoder_layers", "num_decoder_layers", "position_offset", "type_vocab_size"):
            _check_int(name, getattr(self, name), minimum=0)
        if self.pad_id is not None:
            _check_int("pad_id", self.pad_id, minimum=0, or_none=True)
        if self.num_encoder_layers == 0 and self.num_decoder_layers == 0:
            raise ValueError("a model needs at least one layer: num_encoder_layers and num_decoder_layers are both 0")
        for name in ("norm_first", "final_norm", "scale_embedding", "bias", "tie_embeddings", "output_projection",
                     "share_embeddings", "embed_norm", "head_transform", "pooler", "embed_bias",
                     "positions_skip_pad", "shared_layers", "causal_encoder"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, received {getattr(self, name)!r}")
        if self.output_bias is not None and not isinstance(self.output_bias, bool):
            raise ValueError(f"output_bias must be a bool or None (= same as bias), received {self.output_bias!r}")
        if self.d_model % self.num_heads and self.head_size is None:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads} (give head_size "
                             "for heads of another width)")
        if not isinstance(self.dropout, (int, float)) or isinstance(self.dropout, bool) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be a number in [0, 1), received {self.dropout!r}")
        if not isinstance(self.layer_norm_eps, (int, float)) or isinstance(self.layer_norm_eps, bool) \
                or not 0 < self.layer_norm_eps < float("inf"):
            raise ValueError(f"layer_norm_eps must be a positive finite number, received {self.layer_norm_eps!r}")
        _check_choice("activation", self.activation, ACTIVATIONS)
        if self.head_activation is not None:
            _check_choice("head_activation", self.head_activation, ACTIVATIONS)
        if self.head_layer_norm_eps is not None and (
                not isinstance(self.head_layer_norm_eps, (int, float)) or isinstance(self.head_layer_norm_eps, bool)
                or not 0 < self.head_layer_norm_eps < float("inf")):
            raise ValueError("head_layer_norm_eps must be a positive finite number or None (= layer_norm_eps), "
                             f"received {self.head_layer_norm_eps!r}")
        for name in ("head_activation", "head_layer_norm_eps"):
            if getattr(self, name) is not None and not self.head_transform:
                raise ValueError(f"{name}={getattr(self, name)!r} needs head_transform=True (it configures the "
                                 "head transform)")
        _check_choice("head_order", self.head_order, HEAD_ORDERS)
        if self.head_order != HEAD_ORDERS[0] and not self.head_transform:
            raise ValueError(f"head_order={self.head_order!r} needs head_transform=True (it orders the head "
                             "transform)")
        self._check_llm_fields()
        self._check_layer_fields()
        self._check_parallel()
        self._check_scalings()
        self._check_classifier()
        self._check_experts()
        _check_attention_scale(self.attention_scale)
        if not isinstance(self.attention_scale, str):
            object.__setattr__(self, "attention_scale", float(self.attention_scale))  # JSON may give 1 for 1.0
        _check_choice("positional", self.positional, POSITIONAL)
        _check_choice("sinusoid_layout", self.sinusoid_layout, SINUSOID_LAYOUTS)
        if self.positional == "rope" and self.rotary_dim % 2:
            raise ValueError(f"rotary positions turn pairs of dims: rotary_fraction={self.rotary_fraction} of "
                             f"head_dim={self.head_dim} gives {self.rotary_dim}, an odd number")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, received d_model={self.d_model}")
        if self.pad_id is not None and self.has_encoder and self.pad_id >= self.src_vocab_size:
            raise ValueError(f"pad_id={self.pad_id} is outside the source vocabulary (src_vocab_size="
                             f"{self.src_vocab_size})")
        if self.pad_id is not None and self.has_decoder and self.pad_id >= self.tgt_vocab_size:
            raise ValueError(f"pad_id={self.pad_id} is outside the target vocabulary (tgt_vocab_size="
                             f"{self.tgt_vocab_size})")
        if self.tie_embeddings and self.is_encoder_only and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("an encoder-only model can tie its head to the source embedding only when "
                             f"tgt_vocab_size == src_vocab_size, received {self.tgt_vocab_size} and "
                             f"{self.src_vocab_size}")
        if self.share_embeddings and not (self.is_encoder_decoder and self.src_vocab_size == self.tgt_vocab_size):
            raise ValueError("share_embeddings needs an encoder-decoder model with src_vocab_size == tgt_vocab_size, "
                             f"received num_encoder_layers={self.num_encoder_layers}, num_decoder_layers="
                             f"{self.num_decoder_layers}, vocabularies {self.src_vocab_size} and {self.tgt_vocab_size}")
        _check_choice("sinusoid_frequencies", self.sinusoid_frequencies, SINUSOID_FREQUENCIES)
        if self.sinusoid_frequencies == "inclusive" and self.d_model < 4:
            raise ValueError(f"sinusoid_frequencies='inclusive' spreads d_model / 2 frequencies from 1 to 1/10000: it "
                             f"needs d_model >= 4, received d_model={self.d_model}")
        if self.position_offset and not (self.positional == "learned" or (
                self.positional == "sinusoidal" and self.positions_skip_pad)):
            raise ValueError(f"position_offset={self.position_offset} needs positional='learned' (or sinusoidal "
                             f"ones under positions_skip_pad), received "
                             f"positional={self.positional!r}")
        if self.positions_skip_pad and not (self.positional in ("learned", "sinusoidal") and self.pad_id is not None
                                            and self.position_offset >= 1):
            raise ValueError("positions_skip_pad (RoBERTa's and M2M100's positions) needs positional='learned' or "
                             "'sinusoidal', a pad_id and position_offset >= 1 (pad tokens read row position_offset - "
                             f"1), received positional={self.positional!r}, pad_id={self.pad_id}, position_offset="
                             f"{self.position_offset}")
        if self.embedding_size is not None:
            _check_int("embedding_size", self.embedding_size, minimum=1, or_none=True)
            if not (self.is_encoder_only and self.positional == "learned" and not self.embed_bias
                    and not self.scale_embedding):
                raise ValueError("embedding_size (ALBERT's factorized embeddings) needs an encoder-only model with "
                                 "positional='learned', no embed_bias and no scale_embedding, received "
                                 f"num_decoder_layers={self.num_decoder_layers}, positional={self.positional!r}, "
                                 f"embed_bias={self.embed_bias}, scale_embedding={self.scale_embedding}")
            if self.output_projection and not self.head_transform:
                raise ValueError("embedding_size with an output projection needs head_transform (ALBERT's head maps "
                                 "d_model back to embedding_size, which the output projection reads)")
        if self.causal_encoder and not self.is_encoder_only:
            raise ValueError("causal_encoder=True makes an encoder-only model's self-attention causal; this model has "
                             f"num_encoder_layers={self.num_encoder_layers}, num_decoder_layers="
                             f"{self.num_decoder_layers} (a decoder is causal already)")
        if self.shared_layers and not self.is_encoder_only:
            raise ValueError("shared_layers (ALBERT's one set of layer weights) needs an encoder-only model, received "
                             f"num_decoder_layers={self.num_decoder_layers}")
        if (self.type_vocab_size or self.pooler) and not self.has_encoder:
            raise ValueError("type_vocab_size and pooler belong to an encoder; this model has num_encoder_layers=0")
        if not self.output_projection and (self.tie_embeddings or self.head_transform or self.output_bias):
            raise ValueError("output_projection=False (a bare backbone) cannot have tie_embeddings, head_transform "
                             f"or output_bias, received tie_embeddings={self.tie_embeddings}, head_transform="
                             f"{self.head_transform}, output_bias={self.output_bias}")

    @property
    def head_dim(self) -> int:
        """d_k = d_v: `head_size`, or d_model / num_heads."""
        return self.head_size or self.d_model // self.num_heads

    def _check_llm_fields(self) -> None:
        _check_choice("norm", self.norm, NORMS)
        _check_finite("norm_weight_offset", self.norm_weight_offset)
        for name in ("ffn_gated", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, received {getattr(self, name)!r}")
        for name in ("attention_bias", "qkv_bias", "ffn_bias"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool or None (= the broader switch), received "
                                 f"{getattr(self, name)!r}")
        for name in ("num_kv_heads", "head_size", "sliding_window"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=1, or_none=True)
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads} "
                             "(each key/value head serves a whole group of query heads)")
        _check_finite("rope_theta", self.rope_theta, positive=True)
        _check_finite("rotary_fraction", self.rotary_fraction, positive=True)
        if self.rotary_fraction > 1:
            raise ValueError(f"rotary_fraction must be in (0, 1], received {self.rotary_fraction!r}")
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling)
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))  # a copy: the config stays its own
        if self.positional != "rope" and (self.rope_scaling is not None or self.rotary_fraction != 1.0):
            raise ValueError(f"rope_scaling and rotary_fraction need positional='rope', received positional="
                             f"{self.positional!r}")
        if self.qk_norm and not self.has_decoder and not self.has_encoder:
            raise ValueError("qk_norm needs attention layers")
        if self.qk_norm_eps is not None:
            _check_finite("qk_norm_eps", self.qk_norm_eps, positive=True)
            if not self.qk_norm:
                raise ValueError(f"qk_norm_eps={self.qk_norm_eps!r} needs qk_norm=True (it is the q/k norms' epsilon)")
            if self.qk_norm_eps == self.layer_norm_eps:  # one form for one model: None says "the model's epsilon"
                object.__setattr__(self, "qk_norm_eps", None)

    def _check_layer_fields(self) -> None:
        """The soft caps, the post norms and the per-decoder-layer lists (`layer_kinds`, `rope_layers`): one entry
        per decoder layer, each a kind or a bool; a list that says what None says is stored as None."""
        if not isinstance(self.post_norms, bool):
            raise ValueError(f"post_norms must be a bool, received {self.post_norms!r}")
        if self.post_norms and not self.norm_first:
            raise ValueError("post_norms=True normalizes each sublayer's output inside a pre-norm residual, x + "
                             "post_norm(f(norm(x))): it needs norm_first=True, received norm_first=False")
        for name in ("attn_logit_softcap", "final_logit_softcap"):
            if getattr(self, name) is not None:
                _check_finite(name, getattr(self, name), positive=True)
                object.__setattr__(self, name, float(getattr(self, name)))  # JSON may give 30 for 30.0
        if self.final_logit_softcap is not None and not self.output_projection:
            raise ValueError(f"final_logit_softcap={self.final_logit_softcap!r} caps the output projection's logits; "
                             "this model has output_projection=False")
        if self.layer_kinds is not None:
            kinds = self.layer_kinds
            if not isinstance(kinds, (list, tuple)) or len(kinds) != self.num_decoder_layers or not all(
                    isinstance(k, str) and k in LAYER_KINDS for k in kinds):
                raise ValueError(f"layer_kinds must name one of {', '.join(LAYER_KINDS)} per decoder layer "
                                 f"(num_decoder_layers={self.num_decoder_layers}), received {kinds!r}")
            if self.sliding_window is None:
                raise ValueError(f"layer_kinds={list(kinds)!r} says which decoder layers attend within the sliding "
                                 "window; this model has sliding_window=None")
            if "sliding" not in kinds:
                raise ValueError(f"layer_kinds={list(kinds)!r} has no sliding layer, so sliding_window="
                                 f"{self.sliding_window} would be unused (say sliding_window=None)")
            object.__setattr__(self, "layer_kinds", None if "full" not in kinds else tuple(kinds))
        if self.local_rope_theta is not None:
            _check_finite("local_rope_theta", self.local_rope_theta, positive=True)
            object.__setattr__(self, "local_rope_theta", float(self.local_rope_theta))
            if self.positional != "rope" or self.layer_kinds is None:
                raise ValueError(f"local_rope_theta={self.local_rope_theta!r} is the rotary base of the sliding "
                                 "layers beside full ones: it needs positional='rope' and layer_kinds naming both "
                                 f"kinds, received positional={self.positional!r}, layer_kinds={self.layer_kinds!r}")
        if self.rope_layers is not None:
            flags = self.rope_layers
            if not isinstance(flags, (list, tuple)) or len(flags) != self.num_decoder_layers or not all(
                    isinstance(f, bool) for f in flags):
                raise ValueError(f"rope_layers must be one bool per decoder layer (num_decoder_layers="
                                 f"{self.num_decoder_layers}; True = rotary positions there), received {flags!r}")
            if self.positional != "rope":
                raise ValueError(f"rope_layers={list(flags)!r} says which decoder layers take rotary positions; it "
                                 f"needs positional='rope', received positional={self.positional!r}")
            object.__setattr__(self, "rope_layers", None if all(flags) else tuple(flags))

    def _check_parallel(self) -> None:
        """`parallel_residual` (a pre-norm decoder-only layer without post norms) and `ffn_shares_norm` (which
        needs it); `rotary_interleaved` (which needs rotary positions)."""
        for name in ("parallel_residual", "ffn_shares_norm", "rotary_interleaved"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, received {getattr(self, name)!r}")
        if self.parallel_residual:
            if not self.norm_first or self.post_norms or not self.is_decoder_only:
                raise ValueError("parallel_residual=True adds attention and feed-forward of one normalized input "
                                 "to a decoder-only layer's residual: it needs norm_first=True, post_norms=False "
                                 f"and no encoder, received norm_first={self.norm_first}, post_norms="
                                 f"{self.post_norms}, num_encoder_layers={self.num_encoder_layers}")
        if self.ffn_shares_norm and not self.parallel_residual:
            raise ValueError("ffn_shares_norm=True lets the feed-forward read the attention's norm beside it: it "
                             "needs parallel_residual=True, received parallel_residual=False")
        if self.rotary_interleaved and self.positional != "rope":
            raise ValueError("rotary_interleaved=True says which dims rotary positions turn together; it needs "
                             f"positional='rope', received positional={self.positional!r}")

    @property
    def ffn_norm(self) -> str:
        """The norm a decoder layer's feed-forward reads: `norm1` under `ffn_shares_norm`, else its own `norm3`."""
        return "norm1" if self.ffn_shares_norm else "norm3"
    def _check_scalings(self) -> None:
        """The fields of OLMo, OLMo 2 and Granite: norms without parameters or only after the sublayers, q/k norms
        over all heads at once, clamped q/k/v, and three multipliers (each a positive finite number)."""
        for name in ("pre_norms", "norm_affine"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, received {getattr(self, name)!r}")
        _check_choice("qk_norm_over", self.qk_norm_over, QK_NORM_OVER)
        if self.qk_norm_over != "head" and not self.qk_norm:
            raise ValueError(f"qk_norm_over={self.qk_norm_over!r} says what the q/k norms cover; this model has "
                             "qk_norm=False")
        if not self.pre_norms and not (self.norm_first and self.post_norms):
            raise ValueError("pre_norms=False leaves only the norm on each sublayer's output, x + post_norm(f(x)): it "
                             f"needs norm_first=True and post_norms=True, received norm_first={self.norm_first}, "
                             f"post_norms={self.post_norms}")
        if not self.norm_affine and self.norm != "layer":
            raise ValueError(f"norm_affine=False (LayerNorms without gamma and beta) needs norm='layer', received "
                             f"norm={self.norm!r}")
        if self.clip_qkv is not None:
            _check_finite("clip_qkv", self.clip_qkv, positive=True)
            object.__setattr__(self, "clip_qkv", float(self.clip_qkv))
        for name in ("embedding_multiplier", "residual_multiplier", "logit_divisor"):
            _check_finite(name, getattr(self, name), positive=True)
            object.__setattr__(self, name, float(getattr(self, name)))  # JSON may give 1 for 1.0
        if self.logit_divisor != 1.0 and not self.output_projection:
            raise ValueError(f"logit_divisor={self.logit_divisor!r} divides the output projection's logits; this "
                             "model has output_projection=False")

    def layer_window(self, i: int) -> int | None:
        """The sliding window decoder layer `i` attends within: `sliding_window`, or None for a "full" layer of
        `layer_kinds`."""
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

    def _check_classifier(self) -> None:
        for name in ("classifier_bias", "next_sentence", "choice_head"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, received {getattr(self, name)!r}")
        if self.eos_id is not None:
            _check_int("eos_id", self.eos_id, minimum=0)
            if self.eos_id >= self.src_vocab_size:
                raise ValueError(f"eos_id={self.eos_id} is not a source id (src_vocab_size={self.src_vocab_size})")
            if self.classifier_input != "eos":
                raise ValueError(f"eos_id={self.eos_id} says where a classifier_input='eos' classifier reads; this "
                                 f"model has classifier_input={self.classifier_input!r}")
        _check_choice("classifier_input", self.classifier_input, CLASSIFIER_INPUTS)
        if self.problem_type is not None:
            _check_choice("problem_type", self.problem_type, PROBLEM_TYPES)
        if self.next_sentence and not (self.pooler and self.is_encoder_only):
            raise ValueError("next_sentence (BERT's pretraining head) reads the pooler: it needs an encoder-only model "
                             f"with pooler=True, received pooler={self.pooler}, num_decoder_layers="
                             f"{self.num_decoder_layers}")
        if self.choice_head and not (self.is_decoder_only and self.output_projection and self.classifier is None):
            raise ValueError("choice_head (GPT-2's multiple-choice score beside its logits) needs a decoder-only model "
                             f"with an output projection and no classifier, received num_encoder_layers="
                             f"{self.num_encoder_layers}, output_projection={self.output_projection}, classifier="
                             f"{self.classifier!r}")
        if self.classifier is None:
            odd = {k: getattr(self, k) for k in ("num_labels", "classifier_dense", "label_names", "problem_type")
                   if getattr(self, k)}
            if odd or self.classifier_input != "pooler" or not self.classifier_bias:
                raise ValueError(f"{', '.join(odd) or 'classifier_input/classifier_bias'} configure a classifier; "
                                 "this model has classifier=None")
            return
        _check_choice("classifier", self.classifier, CLASSIFIERS)
        _check_int("num_labels", self.num_labels, minimum=1)
        if self.classifier_dense is not None:
            _check_choice("classifier_dense", self.classifier_dense, CLASSIFIER_DENSE)
        if self.output_projection or self.head_transform:
            raise ValueError(f"classifier={self.classifier!r} scores the final hidden states in place of the output "
                             "projection: it needs output_projection=False and head_transform=False")
        if self.is_encoder_decoder and self.classifier == "choice":
            raise ValueError("classifier='choice' needs an encoder-only or a decoder-only model (no encoder-decoder "
                             "family has a multiple-choice class)")
        if self.classifier == "span" and self.num_labels != 2:
            raise ValueError(f"classifier='span' scores a start and an end: num_labels must be 2, received "
                             f"{self.num_labels}")
        if self.classifier == "choice" and self.num_labels != 1:
            raise ValueError(f"classifier='choice' scores each choice (a row of the batch) once: num_labels must be 1, "
                             f"received {self.num_labels}")
        if not self.pooled_classifier and self.classifier_input != "pooler":
            raise ValueError(f"classifier_input={self.classifier_input!r} says where a sequence classifier reads; "
                             f"classifier={self.classifier!r} reads every position")
        if self.pooled_classifier:
            needs = {"pooler": self.pooler, "first": self.is_encoder_only, "last": self.is_decoder_only,
                     "eos": self.is_encoder_decoder and self.eos_id is not None}
            if not needs[self.classifier_input]:
                raise ValueError(f"classifier_input={self.classifier_input!r} needs " + {
                    "pooler": "pooler=True", "first": "an encoder-only model",
                    "last": "a decoder-only (causal) model",
                    "eos": "an encoder-decoder model and eos_id"}[self.classifier_input])
        if self.label_names is not None:
            names = self.label_names
            if not isinstance(names, (list, tuple)) or len(names) != self.num_labels or not all(
                    isinstance(n, str) for n in names):
                raise ValueError(f"label_names must be {self.num_labels} strings (one per label, in id order), "
                                 f"received {names!r}")
            object.__setattr__(self, "label_names", tuple(names))  # JSON gives a list

    def _check_experts(self) -> None:
        """The mixture-of-experts fields: all at their defaults without experts; with them, a decoder-only model
        whose experts have no biases, `experts_per_token` of `num_experts`, and `expert_layers` one bool per decoder
        layer (a width or list that says what None says is stored as None)."""
        _check_int("num_experts", self.num_experts, minimum=0)
        _check_int("experts_per_token", self.experts_per_token, minimum=0)
        _check_choice("router_softmax", self.router_softmax, ROUTER_SOFTMAX)
        if not isinstance(self.router_renormalize, bool):
            raise ValueError(f"router_renormalize must be a bool, received {self.router_renormalize!r}")
        for name in ("expert_d_ff", "shared_expert_d_ff"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=1, or_none=True)
        if self.num_experts == 0:
            odd = [f"{k}={getattr(self, k)!r}" for k, value in EXPERT_DEFAULTS.items() if getattr(self, k) != value]
            if odd:
                raise ValueError(f"{', '.join(odd)} configure a mixture of experts; this model has num_experts=0")
            return
        if not self.is_decoder_only:
            raise ValueError(f"num_experts={self.num_experts} (a mixture-of-experts feed-forward) needs a decoder-only "
                             f"model, received num_encoder_layers={self.num_encoder_layers}")
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts_per_token must be from 1 to num_experts={self.num_experts}, received "
                             f"{self.experts_per_token!r}")
        if self.has_ffn_bias:
            raise ValueError("a mixture of experts has no feed-forward biases: set ffn_bias=False (or bias=False), "
                             f"received bias={self.bias}, ffn_bias={self.ffn_bias}")
        if self.router_renormalize and self.router_softmax == "after_topk":
            raise ValueError("router_renormalize divides the k chosen probabilities by their sum; with router_softmax="
                             "'after_topk' they already sum to 1 (say router_renormalize=False)")
        if self.expert_d_ff == self.d_ff:  # one form for one model: None says "d_ff"
            object.__setattr__(self, "expert_d_ff", None)
        flags = self.expert_layers
        if flags is not None:
            if not isinstance(flags, (list, tuple)) or len(flags) != self.num_decoder_layers or not all(
                    isinstance(f, bool) for f in flags) or not any(flags):
                raise ValueError(f"expert_layers must be one bool per decoder layer (num_decoder_layers="
                                 f"{self.num_decoder_layers}; True = the mixture of experts there, at least one), "
                                 f"received {flags!r}")
            object.__setattr__(self, "expert_layers", None if all(flags) else tuple(flags))

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


# The mixture-of-experts fields but num_experts, and their values without experts (`_check_experts`).
EXPERT_DEFAULTS = {"experts_per_token": 0, "expert_d_ff": None, "router_softmax": "before_topk",
                    "router_renormalize": False, "shared_expert_d_ff": None, "expert_layers": None}


def _check_int(name: str, value: Any, minimum: int, or_none: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}{' or None' if or_none else ''}, received "
                         f"{value!r}")


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


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, received {value!r}")


PRESETS: dict[str, TransformerConfig] = {
    "tiny": TransformerConfig(src_vocab_size=48, tgt_vocab_size=40, d_model=32, num_heads=4, num_encoder_layers=2,
                              num_decoder_layers=2, d_ff=64, max_len=64),
    "base": TransformerConfig(),
    "big": TransformerConfig(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
}
