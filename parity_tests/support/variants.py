"""Small configurations that exercise every switch of `TransformerConfig` on the tiny preset: the tests, the
calibration and the training-parity benchmark all draw from these, so each names one set of models.

`VARIANTS` are the paper's model with one switch changed each; `FAMILIES` are one small model per family of real
checkpoints (decoder-only, BERT-style encoder, bare backbone, Marian/BART encoder-decoder). Dict keys are the ids a
failing test prints.
"""

from __future__ import annotations

import reference_numpy as rn

TINY = rn.TransformerConfig.preset("tiny", dropout=0.0)

VARIANTS = {
    "post-ln": TINY,
    "pre-ln+final-norm": TINY.replace(norm_first=True, final_norm=True),
    "final-norm": TINY.replace(final_norm=True),
    "learned-pos": TINY.replace(positional="learned"),
    "concat-sinusoid": TINY.replace(sinusoid_layout="concatenated"),
    "gelu": TINY.replace(activation="gelu"),
    "tied": TINY.replace(tie_embeddings=True),
    "no-bias-unscaled": TINY.replace(bias=False, scale_embedding=False),
    "pad-id-3": TINY.replace(pad_id=3),
    "encoder-only": TINY.replace(num_decoder_layers=0, tgt_vocab_size=7),
    "causal-encoder": TINY.replace(num_decoder_layers=0, tgt_vocab_size=7, causal_encoder=True),
    "asymmetric-depth": TINY.replace(num_encoder_layers=1, num_decoder_layers=3),
    "no-pad-id": TINY.replace(pad_id=None),
    "scale-by-d-model": TINY.replace(attention_scale="model"),
    "embed-bias": TINY.replace(embed_bias=True),
    # the head transform's norm before its activation; (ModernBERT) a pre-norm encoder whose first layer's attention
    # has no norm, a full and a sliding layer (a window both ways) at rotary bases of their own
    "encoder-local-layers+head-norm-first": TINY.replace(num_decoder_layers=0, tgt_vocab_size=7, head_transform=True,
                                                         head_order="dense-norm-activation", norm_first=True,
                                                         positional="rope", sliding_window=3,
                                                         layer_kinds=("full", "sliding"), local_rope_theta=100.0,
                                                         first_attn_norm=False),
    # (Gemma 2/3) a norm after each sublayer too, soft-capped attention scores and logits; (ModernBERT, Cohere)
    # every LayerNorm without a bias
    "post-norms+soft-caps": TINY.replace(norm_first=True, post_norms=True, attn_logit_softcap=2.0,
                                         final_logit_softcap=3.0, norm_bias=False),
    # (Gemma 3, SmolLM3) a sliding and a full decoder layer, the sliding one at its own rotary base, the full one
    # without positions
    "layer-kinds+nope": TINY.replace(positional="rope", sliding_window=3, layer_kinds=("sliding", "full"),
                                     local_rope_theta=100.0, rope_layers=(True, False)),
    # (OLMo, Granite) LayerNorms without parameters, q/k/v clamped, the three multipliers, a query scale of its own
    "plain-norms+clip+multipliers": TINY.replace(norm_affine=False, clip_qkv=0.5, embedding_multiplier=3.0,
                                                 residual_multiplier=0.5, logit_divisor=2.0, attention_scale=0.3),
    # (OLMo 2) RMSNorms after each sublayer only; q/k norms over all heads at once, k narrower (2 of 4 heads)
    "post-norms-only+qk-norm-all": TINY.replace(norm_first=True, final_norm=True, norm="rms", post_norms=True,
                                                pre_norms=False, qk_norm=True, qk_norm_over="all", num_kv_heads=2),
    # (M2M100) [sin | cos] at fairseq's frequencies, counted over non-pad tokens from pad_id + 1, pads a zero row
    "skip-pad-sinusoids": TINY.replace(sinusoid_layout="concatenated", sinusoid_frequencies="inclusive",
                                       positions_skip_pad=True, position_offset=TINY.pad_id + 1),
    # (T5) no absolute positions: RMS pre-norms and a relative position bias per stack, 8 buckets up to distance 5
    "relative-bias": TINY.replace(positional="none", norm="rms", norm_first=True, final_norm=True,
                                  relative_bias_buckets=8, relative_bias_max_distance=5, attention_scale="none"),
}

FAMILIES = {
    "gpt2-like": TINY.replace(num_encoder_layers=0, norm_first=True, final_norm=True, positional="learned",
                              tie_embeddings=True, activation="gelu_tanh", scale_embedding=False,
                              output_bias=False),
    "bert-mlm-like": TINY.replace(num_decoder_layers=0, tgt_vocab_size=48, positional="learned",
                                  type_vocab_size=2, embed_norm=True, head_transform=True, pooler=True,
                                  tie_embeddings=True, scale_embedding=False, activation="gelu", layer_norm_eps=1e-12),
    "bare-backbone": TINY.replace(num_decoder_layers=0, positional="learned", type_vocab_size=3, embed_norm=True,
                                  pooler=True, output_projection=False, scale_embedding=False),
    "marian-like": TINY.replace(tgt_vocab_size=48, activation="silu", sinusoid_layout="concatenated",
                                share_embeddings=True, tie_embeddings=True, output_bias=True),
    "bart-like": TINY.replace(tgt_vocab_size=48, positional="learned", position_offset=2, embed_norm=True,
                              activation="gelu", share_embeddings=True, tie_embeddings=True, scale_embedding=False),
}

# Mixtures of experts (decoder-only, pre-norm, RMSNorm, rotary, SwiGLU experts without biases): 5 experts of 19 wide
# with a shared one of 11 and a dense middle layer, the k = 2 chosen renormalized (Qwen2-MoE's shape); the softmax
# over the chosen only; one expert per token (`reference_numpy.moe`).
_MOE = TINY.replace(num_encoder_layers=0, num_decoder_layers=3, norm_first=True, final_norm=True, norm="rms",
                    positional="rope", bias=False, ffn_gated=True, activation="silu", pad_id=None, num_experts=5,
                    experts_per_token=2, expert_d_ff=19)
MIXTURES = {
    "shared+dense-layer": _MOE.replace(shared_expert_d_ff=11, expert_layers=(True, False, True),
                                       router_renormalize=True),
    "softmax-after-top-k": _MOE.replace(router_softmax="after_topk"),
    "top-1": _MOE.replace(experts_per_token=1, num_decoder_layers=2),
    # (GPT-OSS) attention sinks, biases on q/k/v/o, the router and the experts, the clamped GLU (a limit the
    # features cross), the softmax over the k chosen, a sliding and a full layer
    "sinks+biases+clamped-glu": _MOE.replace(num_decoder_layers=2, attention_bias=True, ffn_bias=True,
                                             router_bias=True, attention_sinks=True, glu_limit=0.3, glu_alpha=1.702,
                                             glu_up_offset=1.0, router_softmax="after_topk", sliding_window=4,
                                             layer_kinds=("sliding", "full")),
}
