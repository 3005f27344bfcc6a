"""The PyTorch twin's building layers: norms, rotary positions, multi-head attention with its key/value caches, and
the position-wise feed-forward. `torch_impl.model` wires them into encoder and decoder layers and the Transformer.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

import reference_numpy as rn
from reference_numpy import TransformerConfig

from .attention import scaled_dot_product_attention

Record = dict  # canonical sublayer name -> tensor, in execution order

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu,  # F.gelu: the exact (erf) form
               "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "silu": F.silu}


class AttentionCache:
    """The keys and values one attention layer has computed so far, for incremental decoding.

    `static` (encoder-decoder attention): computed from the memory on the first call, reused afterwards.
    Otherwise (causal self-attention) each call appends the keys and values of its new positions.
    """

    def __init__(self, static: bool):
        self.static = static
        self.k: torch.Tensor | None = None  # (B, H, T_cached, d_k)
        self.v: torch.Tensor | None = None  # (B, H, T_cached, d_k)


class KVCache:
    """Incremental-decoding state of a decoder: per layer `(self_attn, cross_attn)` caches, plus the key mask of
    the target positions processed so far. Make one per source batch with `Transformer.new_cache()`."""

    def __init__(self, num_layers: int, cross_attention: bool = True):
        self.layers = [(AttentionCache(static=False), AttentionCache(static=True) if cross_attention else None)
                       for _ in range(num_layers)]
        self.key_mask: torch.Tensor | None = None  # (B, T_done) bool, True = real token

    @property
    def length(self) -> int:
        """Target positions already decoded (the position offset of the next call)."""
        return 0 if self.key_mask is None else self.key_mask.shape[1]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * (offset + weight): Llama's RMSNorm (offset 0), Gemma's (offset 1)."""

    def __init__(self, width: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps, self.offset = eps, offset

    def forward(self, x):
        scale = self.weight + self.offset if self.offset else self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * scale


def norm_layer(config: TransformerConfig, width: int, eps: float | None = None) -> nn.Module:
    """The model's norm over `width` features: `nn.LayerNorm` (without parameters under `norm_affine=False`, without
    a bias under `norm_bias=False`), or `RMSNorm` under `norm="rms"`."""
    eps = config.layer_norm_eps if eps is None else eps
    if config.norm == "rms":
        return RMSNorm(width, eps, config.norm_weight_offset)
    return nn.LayerNorm(width, eps=eps, elementwise_affine=config.norm_affine, bias=config.norm_bias)


# (id(config), start, length, dtype, device) -> (config, cos, sin): the rotary tables of one call's positions, made
# once and read by every layer's q and k (a decoding step of a 4-layer model asks 8 times: profiled, this was 12% of
# greedy generation's time on the Llama-shaped bench model); the config is kept to tell a reused id apart.
_ROTARY: dict[tuple, tuple] = {}
_ROTARY_ENTRIES = 64


def rotary_tables(config: TransformerConfig, start: int, t: int, dtype: torch.dtype, device, local: bool = False
                  ) -> tuple:
    """`(cos, sin)` `(T, rotary_dim)` in `dtype` for positions `start .. start + T - 1` of a sequence of `start + T`
    positions (its length picks longrope's factors), the angles computed in float32 at least; `local`: a sliding
    layer's own base (`local_rope_theta`)."""
    key = (id(config), start, t, dtype, device, local)
    hit = _ROTARY.get(key)
    if hit is not None and hit[0] is config:
        return hit[1], hit[2]
    inv_freq, scaling = rn.ops.rope_frequencies(config, start + t, local=local)
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    positions = torch.arange(start, start + t, device=device, dtype=work)
    freqs = positions[:, None] * torch.as_tensor(inv_freq, device=device).to(work)  # (T, r/2)
    # (T, r): pair j's angle on dims j and j + r/2, or on dims 2j and 2j + 1 under rotary_interleaved
    angles = freqs.repeat_interleave(2, dim=-1) if config.rotary_interleaved else torch.cat([freqs, freqs], dim=-1)
    cos, sin = (angles.cos() * scaling).to(dtype), (angles.sin() * scaling).to(dtype)
    if not torch.compiler.is_compiling():
        if len(_ROTARY) >= _ROTARY_ENTRIES:
            _ROTARY.clear()
        _ROTARY[key] = (config, cos, sin)
    return cos, sin


def rotate(x, start: int, config: TransformerConfig, local: bool = False):
    """Rotary positions on `x` `(B, H, T, d_k)` at positions `start .. start + T - 1`, for a sequence of
    `start + T` positions (its length picks longrope's factors): the first `rotary_dim` dims turn as two halves
    (transformers' `rotate_half`) or as adjacent pairs (`rotary_interleaved`, GPT-J's `rotate_every_two`), the rest
    pass through. The angles are computed in float32 at least. `local`: at a sliding layer's own base
    (`local_rope_theta`)."""
    cos, sin = rotary_tables(config, start, x.shape[2], x.dtype, x.device, local)
    r = config.rotary_dim
    rot, rest = x[..., :r], x[..., r:]
    if config.rotary_interleaved:  # (..., r/2, 2) -> (..., r): (-x[2j+1], x[2j]) at dims (2j, 2j + 1)
        rotated = torch.stack([-rot[..., 1::2], rot[..., ::2]], dim=-1).flatten(-2)  # rotate_every_two
    else:
        rotated = torch.cat([-rot[..., r // 2:], rot[..., :r // 2]], dim=-1)  # rotate_half
    turned = rot * cos + rotated * sin
    return turned if r == x.shape[-1] else torch.cat([turned, rest], dim=-1)


@functools.lru_cache(maxsize=16)
def _bucket_table(config: TransformerConfig, bidirectional: bool) -> torch.Tensor:
    return torch.from_numpy(rn.ops.relative_bucket_table(config, bidirectional))


def relative_position_bias(table: torch.Tensor, config: TransformerConfig, bidirectional: bool, query_len: int,
                           key_len: int) -> torch.Tensor:
    """T5's relative position bias `(1, H, Tq, Tk)` from a stack's table `(buckets, H)`; the queries are the last Tq
    of Tk positions. The buckets are the reference's (`rn.ops.relative_bucket_table`), gathered by distance."""
    queries = torch.arange(key_len - query_len, key_len, device=table.device)
    relative = torch.arange(key_len, device=table.device)[None, :] - queries[:, None]  # (Tq, Tk)
    buckets = _bucket_table(config, bidirectional).to(table.device)[relative + config.max_len - 1]
    return F.embedding(buckets, table).permute(2, 0, 1)[None]  # (Tq, Tk, H) -> (1, H, Tq, Tk)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (section 3.2.2): self-attention when `x_q is x_kv`, else encoder-decoder attention.

    Grouped-query attention reads `kv_heads` key/value heads, each serving `num_heads / kv_heads` query heads;
    `qk_norm` normalizes each head of q and k; rotary positions turn q and k in self-attention (cached keys are
    stored turned; `local_rope`: at a sliding layer's own base). `attn_logit_softcap` and `attention_sinks` take the
    explicit path.
    `clip_qkv` clamps the projected q, k and v; `qk_norm_over="all"` normalizes all of q's (k's) features at once.
    `relative` (an encoder's self-attention under `relative_terms`, DeBERTa): the disentangled position terms join
    the scores, from the relative positions' table the caller passes (`relative_table`), projected by `pos_k` /
    `pos_q` (by `k` / `q` under `relative_shares_qk`)."""

    def __init__(self, config: TransformerConfig, name: str, rotary: bool = False, local_rope: bool = False,
                 relative: bool = False):
        super().__init__()
        self.config, self.name = config, name
        d, inner, kv = config.d_model, config.num_heads * config.head_dim, config.kv_heads * config.head_dim
        self.q = nn.Linear(d, inner, bias=config.has_qkv_bias)
        self.k = nn.Linear(d, kv, bias=config.has_qkv_bias)
        self.v = nn.Linear(d, kv, bias=config.has_qkv_bias)
        self.o = nn.Linear(inner, d, bias=config.has_o_bias)
        self.all_heads_norm = config.qk_norm and config.qk_norm_over == "all"  # before the split into heads
        q_width, k_width = (inner, kv) if self.all_heads_norm else (config.head_dim, config.head_dim)
        self.q_norm = norm_layer(config, q_width, config.qk_norm_eps) if config.qk_norm else None
        self.k_norm = norm_layer(config, k_width, config.qk_norm_eps) if config.qk_norm else None
        self.rotary = rotary and config.positional == "rope"
        self.local_rope = local_rope
        own = relative and config.relative_terms is not None and not config.relative_shares_qk
        self.pos_k = nn.Linear(d, inner, bias=config.has_qkv_bias) if own and "c2p" in config.relative_terms else None
        self.pos_q = nn.Linear(d, inner, bias=config.has_qkv_bias) if own and "p2c" in config.relative_terms else None
        self.sinks = nn.Parameter(torch.zeros(config.num_heads)) if config.attention_sinks else None
        self.impl = "fused"  # "explicit" forces matmul-softmax-matmul even without weights being asked for

    def forward(self, x_q, x_kv, mask=None, need_weights: bool = False, cache: AttentionCache | None = None,
                relative: torch.Tensor | None = None, position_bias=None):
        """`relative`: the relative positions' table `(2 span, D)`, normed (DeBERTa), or None. `position_bias`
        `(1, H, Tq, Tk)`: T5's relative position bias (`relative_position_bias`), added to the scaled scores."""
        b, tq, _ = x_q.shape
        c = self.config
        h, kvh, dk = c.num_heads, c.kv_heads, c.head_dim
        if cache is not None and cache.static and cache.k is not None:
            q, k, v = self._flat(self.q(x_q), self.q_norm), cache.k, cache.v  # the memory's, from the first step
        else:
            q, k, v = self._project(x_q, x_kv)  # (B, Tq, H*d_k), (B, Tk, KV*d_k), (B, Tk, KV*d_k)
            q, k, v = self._flat(q, self.q_norm), self._flat(k, self.k_norm), self._flat(v, None)
            k = k.view(b, -1, kvh, dk).transpose(1, 2)  # (B, KV, Tk, d_k)
            v = v.view(b, -1, kvh, dk).transpose(1, 2)  # (B, KV, Tk, d_k)
            if self.k_norm is not None and not self.all_heads_norm:
                k = self.k_norm(k)
            cached = 0 if cache is None or cache.k is None else cache.k.shape[2]
            if self.rotary:
                k = rotate(k, cached, c, self.local_rope)
            if cache is not None:
                if not cache.static and cache.k is not None:
                    k = torch.cat([cache.k, k], dim=2)  # (B, KV, T_cached + Tk, d_k)
                    v = torch.cat([cache.v, v], dim=2)  # (B, KV, T_cached + Tk, d_k)
                cache.k, cache.v = k, v
        q = q.view(b, tq, h, dk).transpose(1, 2)  # (B, H, Tq, d_k)
        if self.q_norm is not None and not self.all_heads_norm:
            q = self.q_norm(q)
        if self.rotary:
            q = rotate(q, k.shape[2] - tq, c, self.local_rope)  # the queries are the last Tq positions
        # the fused kernel can neither soft-cap, take a sink's column, nor add a bias (ALiBi's, T5's) to a bool mask
        impl = "explicit" if c.attn_logit_softcap is not None or self.sinks is not None or c.alibi \
            or position_bias is not None else self.impl
        # query head i reads kv head i // groups: the fused kernel takes the kv heads as they are (enable_gqa), the
        # explicit path repeats them, (B, KV, Tk, d_k) -> (B, H, Tk, d_k)
        grouped = kvh != h and impl == "fused" and not need_weights
        if kvh != h and not grouped:
            k = k.repeat_interleave(h // kvh, dim=1)
            v = v.repeat_interleave(h // kvh, dim=1)
        out, weights = scaled_dot_product_attention(
            q, k, v, mask, need_weights=need_weights, impl=impl, dropout_p=c.dropout if self.training else 0.0,
            scale=c.attention_scale_factor, grouped=grouped, softcap=c.attn_logit_softcap,
            position_scores=None if relative is None else self._position_scores(q, k, relative),
            empty_rows="average" if c.padded_queries == "average" else "zero", sinks=self.sinks,
            bias=_summed(self._alibi(k), position_bias))
        out = out.transpose(1, 2).reshape(b, tq, h * dk)  # (B, H, Tq, d_k) -> (B, Tq, H*d_k)
        return self.o(out), weights

    def _position_scores(self, q, k, relative):
        """DeBERTa's position terms `(B, H, Tq, Tk)` before the scale (`reference_numpy.ops.disentangled_scores`):
        q_i . pos_k[index[i, j]] (c2p) plus k_j . pos_q[index[i, j]] (p2c)."""
        c = self.config
        (b, h, tq, dk), tk = q.shape, k.shape[2]
        index = torch.from_numpy(rn.ops.relative_position_index(c, tq, tk)).to(q.device)  # (Tq, Tk)
        scores = torch.zeros(b, h, tq, tk, dtype=q.dtype, device=q.device)
        if "c2p" in c.relative_terms:
            pos_k = (self.pos_k or self.k)(relative).view(-1, h, dk).transpose(0, 1)  # (H, 2 span, d_k)
            c2p = q @ pos_k.transpose(-1, -2)  # (B, H, Tq, 2 span)
            scores = scores + torch.gather(c2p, -1, index.expand(b, h, tq, tk))
        if "p2c" in c.relative_terms:
            pos_q = (self.pos_q or self.q)(relative).view(-1, h, dk).transpose(0, 1)  # (H, 2 span, d_k)
            p2c = k @ pos_q.transpose(-1, -2)  # (B, H, Tk, 2 span)
            scores = scores + torch.gather(p2c, -1, index.T.expand(b, h, tk, tq)).transpose(-1, -2)
        return scores

    def _alibi(self, k):
        """ALiBi's bias `(H, 1, Tk)` for the keys `k` `(B, H, Tk, d_k)` (positions 0 .. Tk-1, cached ones first), in
        k's dtype; None without `alibi`."""
        c = self.config
        if not c.alibi:
            return None
        bias = rn.alibi.bias(c, k.shape[2])  # float64, rounded once
        return torch.from_numpy(bias).to(device=k.device, dtype=k.dtype)

    def _flat(self, x, norm):
        """A projection `(B, T, heads*d_k)` clamped (`clip_qkv`) and, under `qk_norm_over="all"`, normalized."""
        c = self.config
        if c.clip_qkv is not None:
            x = x.clamp(-c.clip_qkv, c.clip_qkv)
        return norm(x) if norm is not None and self.all_heads_norm else x

    def _project(self, x_q, x_kv):
        """Queries, keys and values, `(B, T, D)` each.

        When gradients are being recorded, the projections that share an input run as one matmul over the
        concatenated kernels (self-attention: q, k and v; encoder-decoder attention: k and v), as
        `torch.nn.MultiheadAttention` does with its packed `in_proj_weight`: the backward pass then has one
        input-gradient and one kernel-gradient matmul and one bias sum where it had three of each (60 fewer matmuls
        in a training step of `bench model`'s 4+4-layer model). The parameters stay separate,
        so names, checkpoints and the optimizer see q, k and v as before. Without gradients (inference, decoding one
        token at a time) the concatenation would be a copy of the kernels on every call for no backward pass to
        save, so the projections run separately. Either way the result is the same up to float rounding.
        """
        if not (torch.is_grad_enabled() and self.q.weight.requires_grad):
            return self.q(x_q), self.k(x_kv), self.v(x_kv)
        if x_q is x_kv:
            return _packed_linear(x_q, (self.q, self.k, self.v))
        return (self.q(x_q), *_packed_linear(x_kv, (self.k, self.v)))


def _summed(a, b):
    """The sum of two optional score biases (ALiBi's, T5's): either one alone, or None."""
    return b if a is None else a if b is None else a + b


def _packed_linear(x, linears) -> tuple[torch.Tensor, ...]:
    """`tuple(linear(x) for linear in linears)` as one matmul over the concatenated weights (k and v may be
    narrower than q)."""
    weight = torch.cat([linear.weight for linear in linears])  # (sum of widths, D)
    bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears])
    return F.linear(x, weight, bias).split([linear.out_features for linear in linears], dim=-1)


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (section 3.3); gated (`ffn_gated`): (act(x Wg + bg) * (x W1 + b1)) W2 + b2,
    the clamped GLU where `glu_limit`, `glu_alpha` and `glu_up_offset` say (`reference_numpy.ops.clamped_glu`)."""

    def __init__(self, config: TransformerConfig, name: str, width: int | None = None):
        super().__init__()
        self.config, self.name = config, name
        bias, width = config.has_ffn_bias, width or config.d_ff  # width: a mixture's expert is narrower
        self.gate = nn.Linear(config.d_model, width, bias=bias) if config.ffn_gated else None
        self.linear1 = nn.Linear(config.d_model, width, bias=bias)
        self.linear2 = nn.Linear(width, config.d_model, bias=bias)
        self.dropout = nn.Dropout(config.dropout)
        self.activation = ACTIVATIONS[config.activation]

    def forward(self, x, record: Record | None = None):
        hidden = self.linear1(x)
        hidden = self.activation(hidden) if self.gate is None else self._glu(self.gate(x), hidden)
        return self.linear2(self.dropout(hidden))

    def _glu(self, gate, up):
        c = self.config
        if c.glu_limit is not None:
            gate, up = gate.clamp(max=c.glu_limit), up.clamp(-c.glu_limit, c.glu_limit)
        if c.glu_up_offset:
            up = up + c.glu_up_offset
        return (self.activation(gate) if c.glu_alpha == 1.0 else gate * torch.sigmoid(gate * c.glu_alpha)) * up
