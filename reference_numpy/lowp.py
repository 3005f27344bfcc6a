"""Reduced precision for the reference: bfloat16 / float16 rounding at the op boundaries the frameworks use.

NumPy has no bfloat16, so values stay float32 arrays holding only values the storage dtype can represent: every
op computes in float32 (matmul accumulation, softmax, LayerNorm statistics, GELU) and its output is rounded to the
storage dtype, as PyTorch does for a model cast with `.to(torch.bfloat16)` and Keras for a `bfloat16` dtype policy
(both run LayerNorm in float32 internally and round its output once; measured and cited in docs/verify.md,
"Reduced precision").

`Precision("bfloat16", autocast=True)` models `torch.autocast("cpu", torch.bfloat16)`: weights stay float32;
matmuls (linear layers, attention) take rounded inputs and give rounded outputs; elementwise ops keep their input's
dtype (GELU after a linear layer: rounded; the residual stream, embeddings and LayerNorms: float32). Keras's
`mixed_bfloat16` policy is not that: every layer computes in bfloat16 and only the variables are stored in float32,
which rounds each weight once when it is read, numerically the plain bfloat16 model.

Imports NumPy only.
"""

from __future__ import annotations

import numpy as np

from . import ops

DTYPES = ("bfloat16", "float16")


def round_bfloat16(x) -> np.ndarray:
    """Round to the nearest bfloat16 (ties to even), returned as float32: the top 16 bits of the float32 pattern.

    Overflow goes to inf, subnormals round like normal numbers (bfloat16 has float32's exponent range), NaN stays
    NaN (a quiet one of the same sign).
    """
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # add half an ulp, minus one on an even tie
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.copysign(np.float32(np.nan), x), out).astype(np.float32)


def round_float16(x) -> np.ndarray:
    """Round to the nearest float16 (ties to even; beyond 65504 -> inf), returned as float32."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


ROUNDING = {"bfloat16": round_bfloat16, "float16": round_float16}


class Precision:
    """Where a reduced-precision run rounds: a policy the reference model's modules call instead of `ops`.

    Args:
        dtype: storage dtype, `bfloat16` or `float16`.
        autocast: weights and the residual stream in float32, matmuls in `dtype` (torch.autocast).
    """

    def __init__(self, dtype: str, autocast: bool = False):
        if dtype not in ROUNDING:
            raise ValueError(f"reduced-precision dtype must be one of {DTYPES}, received {dtype!r}")
        self.dtype, self.autocast = dtype, autocast
        self.round = ROUNDING[dtype]
        self.ACTIVATIONS = {name: self._pointwise(fn) for name, fn in ops.ACTIVATIONS.items()}

    def __repr__(self) -> str:
        return f"Precision({self.dtype!r}, autocast={self.autocast})"

    @property
    def label(self) -> str:
        return f"{self.dtype}{' autocast' if self.autocast else ''}"

    # --- storage ---

    def weight(self, value: np.ndarray) -> np.ndarray:
        """A weight as the model holds it: rounded once, or float32 under autocast."""
        value = np.asarray(value, dtype=np.float32)
        return value if self.autocast else self.round(value)

    def store(self, x: np.ndarray) -> np.ndarray:
        """An activation between ops (embedding sums, the residual stream): rounded, float32 under autocast."""
        return x if self.autocast else self.round(x)

    def rounded(self, x: np.ndarray) -> np.ndarray:
        """The output of an elementwise op on a reduced-precision input: rounded in either mode."""
        return self.round(x)

    def _pointwise(self, fn):
        def apply(x: np.ndarray) -> np.ndarray:
            return self.round(fn(x))  # computed in float32, rounded once (torch's CPU kernels upcast internally)
        apply.__name__ = fn.__name__
        return apply

    # --- the ops `reference_numpy.model` calls ---

    def linear(self, x: np.ndarray, kernel: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """float32 accumulation of rounded inputs, bias added before the one rounding of the output (addmm)."""
        r = self.round
        y = r(x) @ r(kernel)
        return r(y if bias is None else y + r(bias))

    def layer_norm(self, x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
        """Statistics and affine in float32; the output rounded (float32 under autocast: LayerNorm of a float32
        residual with float32 weights stays float32)."""
        return self.store(ops.layer_norm(x, gamma, beta, eps))

    def rms_norm(self, x: np.ndarray, gamma: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
        """As `layer_norm`: statistics and scale in float32, the output rounded."""
        return self.store(ops.rms_norm(x, gamma, eps, offset))

    def soft_cap(self, x: np.ndarray, cap: float) -> np.ndarray:
        """cap * tanh(x / cap) in float32, rounded once (the final logits' cap)."""
        return self.rounded(ops.soft_cap(x, cap))

    def apply_rope(self, x, positions, inv_freq, scaling, rotary_dim, interleaved=False):
        """Rotary positions in float32 from a rounded input, the output rounded once."""
        return self.rounded(ops.apply_rope(x, positions, inv_freq, scaling, rotary_dim, interleaved))

    def clamped_glu(self, gate, up, act, config):
        """`ops.clamped_glu` on rounded inputs, each elementwise step rounded (the clamps pick values)."""
        r = self.round
        if config.glu_limit is None and config.glu_up_offset == 0.0 and config.glu_alpha == 1.0:
            return act(gate) * up  # the plain GLU: its activation rounds, the product is stored by the caller
        t = np.float32
        if config.glu_limit is not None:
            gate = np.minimum(gate, t(config.glu_limit))
            up = np.clip(up, t(-config.glu_limit), t(config.glu_limit))
        if config.glu_up_offset:
            up = r(up + t(config.glu_up_offset))
        return r(act(gate) if config.glu_alpha == 1.0 else ops.swish(gate, config.glu_alpha)) * up

    def scaled_dot_product_attention(self, q, k, v, mask=None, scale=None, softcap=None, position_scores=None,
                                     empty_rows="zero", sinks=None, bias=None):
        """torch's fused CPU attention (an online softmax): scores and their exponentials in float32 from rounded
        q, k, v; the exponentials rounded for the product with v (accumulated in float32), then divided by their
        float32 sum, and the output rounded once. Returns `(out, the float32 weights)`; shapes as
        `ops.scaled_dot_product_attention`. A `softcap` caps the float32 scores, `sinks` join the float32 sum and
        an ALiBi `bias` is added to the float32 scores (approximations: the frameworks take their explicit path
        then, which rounds the scores themselves). DeBERTa's `position_scores` (float32, from rounded inputs) join
        the scores before the scale; `empty_rows="average"` as in `ops`."""
        r = self.round
        q, k, v = r(q), r(k), r(v)
        if scale is None:
            scale = 1.0 / np.sqrt(q.shape[-1])
        scores = q @ np.swapaxes(k, -1, -2)  # (B, H, Tq, Tk)
        if position_scores is not None:
            scores = scores + position_scores
        scores = scores * np.float32(scale)
        if bias is not None:  # ALiBi's, T5's relative position bias: rounded as the model holds them
            scores = scores + r(np.asarray(bias, np.float32))
        if softcap is not None:
            scores = ops.soft_cap(scores, softcap)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        row_max = scores.max(axis=-1, keepdims=True)
        sink = None if sinks is None else r(np.asarray(sinks, np.float32)).reshape(-1, 1, 1)  # (H, 1, 1)
        if sink is not None:  # the frameworks' explicit path then: an approximation, as for a soft cap
            row_max = np.maximum(row_max, sink)
        row_max = np.where(np.isfinite(row_max), row_max, 0)  # fully masked rows: avoid inf - inf
        e = np.exp(scores - row_max)  # (B, H, Tq, Tk)
        total = e.sum(axis=-1, keepdims=True)
        if empty_rows == "average":  # a row with no key weighs every key equally
            e = np.where(total > 0, e, np.float32(1.0))
            total = e.sum(axis=-1, keepdims=True)
        if sink is not None:
            total = total + np.exp(sink - row_max)  # the sink's column, dropped
        total = np.where(total > 0, total, 1)  # a row with no key gets a zero output
        return r((r(e) @ v) / total), e / total

    def disentangled_scores(self, q, k, pos_q, pos_k, index):
        """DeBERTa's position terms in float32 from rounded inputs (`ops.disentangled_scores`), rounded once."""
        r = self.round
        return r(ops.disentangled_scores(r(q), r(k), None if pos_q is None else r(pos_q),
                                         None if pos_k is None else r(pos_k), index))

    split_heads = staticmethod(ops.split_heads)
    merge_heads = staticmethod(ops.merge_heads)

