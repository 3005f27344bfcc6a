"""Scaled dot-product attention in PyTorch: a fused path and an explicit-softmax path, chosen by the caller.

Mask convention (the project's, and `F.scaled_dot_product_attention`'s): bool, **True = may attend**. This module
is the one place where torch_impl meets a framework attention convention.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

IMPLS = ("fused", "explicit")


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None, *, causal: bool = False,
                                 need_weights: bool = False, impl: str = "fused", dropout_p: float = 0.0,
                                 scale: float | None = None, grouped: bool = False, softcap: float | None = None,
                                 position_scores: torch.Tensor | None = None, empty_rows: str = "zero",
                                 sinks: torch.Tensor | None = None, bias: torch.Tensor | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(scale q k^T) v (equation 1 with scale = 1/sqrt(d_k)); with `softcap`, the scaled scores are
    cap * tanh(scores / cap) before the mask (Gemma 2); `bias` is added to the scaled scores first (ALiBi); with
    `sinks` `(H,)`, head h's logit joins its queries' softmax as one more column, dropped after it (GPT-OSS).

    Args:
        q: `(B, H, Tq, d_k)`; k: `(B, H, Tk, d_k)`; v: `(B, H, Tk, d_v)`.
        mask: bool, broadcastable to `(B, H, Tq, Tk)`, True = may attend.
        causal: also hide key j from query i when j > i + (Tk - Tq).
        need_weights: return the attention weights too; this takes the explicit path.
        impl: `fused` (`F.scaled_dot_product_attention`, whichever kernel PyTorch dispatches to) or `explicit`
            (matmul, softmax, matmul in plain ops). The caller picks; nothing is feature-detected.
        dropout_p: dropout on the attention weights (training only).
        scale: what the scores are multiplied by (`TransformerConfig.attention_scale_factor`); None = 1/sqrt(d_k).
        grouped: k and v hold fewer heads than q (grouped-query attention), each serving `H / KV` consecutive query
            heads; the fused path only (`enable_gqa`), the explicit one takes them repeated.
        softcap: `TransformerConfig.attn_logit_softcap`. `F.scaled_dot_product_attention` cannot cap its scores,
            so a cap takes the explicit path (and the caller repeats grouped heads).
        position_scores: DeBERTa's position terms `(B, H, Tq, Tk)`, added to q k^T before the scale (explicit path).
        empty_rows: "average": a query row with no key weighs every key equally (DeBERTa's padding queries;
            explicit path), not zero.
        sinks: `TransformerConfig.attention_sinks`' logits, one per head; the explicit path, as a cap.
        bias: added to the scaled scores before the cap and the mask, broadcastable to `(B, H, Tq, Tk)`, in q's
            dtype (ALiBi's; T5's relative position bias); the explicit path, as a cap.

    Returns:
        `(out, weights)`: `(B, H, Tq, d_v)` and `(B, H, Tq, Tk)` or None. A query row with no key it may attend
        to gets all-zero weights and an all-zero output, as in the NumPy reference.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, received {impl!r}")
    if softcap is not None or position_scores is not None or empty_rows != "zero" or sinks is not None \
            or bias is not None:
        impl = "explicit"
    if grouped and (impl != "fused" or need_weights):
        raise ValueError("grouped k/v heads go to the fused kernel only; repeat them for the explicit path")
    gqa = {"enable_gqa": True} if grouped else {}
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = may attend), received dtype {mask.dtype}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    tq, tk = q.shape[-2], k.shape[-2]
    if causal:
        if mask is None and tq == tk and not need_weights and impl == "fused":
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale, **gqa)
            return out, None
        allowed = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)
        mask = allowed if mask is None else mask & allowed
    # Rows with no visible key: let them see every key (no NaN from an all -inf softmax), then zero them.
    has_key = None if mask is None else mask.any(dim=-1, keepdim=True)  # (..., Tq, 1)
    if impl == "fused" and not need_weights:
        if has_key is not None and q.device.type == "cpu" and bool(has_key.all()):
            # No blind row (padding leaves every query a key): skip the repair, two more passes over the mask and
            # one over the output (6-12% of the kernel's time on CPU, benchmarks/). On CUDA the check would sync.
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                                  **gqa), None
        safe_mask = None if mask is None else mask | ~has_key
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe_mask, dropout_p=dropout_p, scale=scale, **gqa)
        return (out if has_key is None else out.masked_fill(~has_key, 0)), None
    scores = q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
    scores = (scores if position_scores is None else scores + position_scores) * scale
    if bias is not None:
        scores = scores + bias
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:  # (B, H, Tq, Tk + 1): the sink's column last, dropped after the softmax
        column = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    if has_key is not None:
        weights = weights.masked_fill(~has_key, 0)
        if empty_rows == "average":
            weights = torch.where(has_key, weights, weights.new_tensor(1.0 / k.shape[-2]))
    if dropout_p > 0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights
