"""Benchmark inputs and the float64 NumPy answers every implementation is checked against.

Inputs are drawn once per case in float64, rounded to the case's dtype, and handed to every implementation, so the
float64 reference is computed on exactly the values each implementation sees. The forward pass is
`reference_numpy`'s own code; the backward pass (for `fwd+bwd` rows) is written out here in NumPy, from the same
softmax identities every framework's autograd uses.

Imports NumPy and `reference_numpy` only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

import reference_numpy as rn

BLOCK_NAME = "attn"  # canonical prefix of the block's weights: attn.q.kernel, attn.q.bias, ...


@dataclass
class Inputs:
    """One case's inputs in float64 (already rounded to the case dtype). Kernel scope uses q, k, v; block scope uses
    x_q, x_kv and the canonical weights. `mask` is `(B, 1, Tq, Tk)` bool (True = may attend) or None; `causal` asks
    for the causal mask on top; `grad_out` is the cotangent fed to the backward pass."""

    q: np.ndarray | None = None  # (B, H, Tq, d)
    k: np.ndarray | None = None  # (B, H, Tk, d)
    v: np.ndarray | None = None  # (B, H, Tk, d)
    x_q: np.ndarray | None = None  # (B, Tq, D)
    x_kv: np.ndarray | None = None  # (B, Tk, D); the same array as x_q for self-attention
    weights: dict | None = None  # canonical attn.{q,k,v,o}.{kernel,bias}
    key_mask: np.ndarray | None = None  # (B, Tk) bool, True = real token
    mask: np.ndarray | None = None  # (B, 1, Tq, Tk) bool
    causal: bool = False
    grad_out: np.ndarray | None = None  # like the output

    @property
    def self_attention(self) -> bool:
        return self.x_q is self.x_kv

    def full_mask(self) -> np.ndarray | None:
        """The mask the reference applies: padding and/or causal, `(B|1, 1, Tq, Tk)` bool, or None."""
        tq, tk = self.shape_qk
        mask = self.mask
        if self.causal:
            causal = rn.causal_mask(tq, tk)[None, None]  # (1, 1, Tq, Tk)
            mask = causal if mask is None else mask & causal
        return mask

    @property
    def shape_qk(self) -> tuple[int, int]:
        if self.q is not None:
            return self.q.shape[-2], self.k.shape[-2]
        return self.x_q.shape[1], self.x_kv.shape[1]


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded to `dtype` (float64/float32/float16/bfloat16, round to nearest even) and back."""
    if dtype == "float64":
        return x
    if dtype in ("float32", "float16"):
        return x.astype(dtype).astype(np.float64)
    if dtype == "bfloat16":  # NumPy has no bfloat16: round the float32 bit pattern to its top 16 bits
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    raise ValueError(f"unknown dtype {dtype!r}")


def make_inputs(case, seed: int = 0) -> Inputs:
    """Seeded inputs for a `attention.Case`: unit-variance q/k/v (kernel) or activations and Xavier-scaled
    weights (block); `padded` keeps row 0 full and pads every other row to a random length in [Tk/2, Tk-1]."""
    rng = np.random.default_rng(seed)
    b, h, tq, tk, d = case.batch, case.heads, case.q_len, case.k_len, case.head_dim

    def draw(*shape, scale=1.0):
        return round_to(scale * rng.standard_normal(shape), case.dtype)

    inputs = Inputs(causal=case.mask in ("causal", "padded+causal"))
    if case.scope == "kernel":
        inputs.q, inputs.k, inputs.v = draw(b, h, tq, d), draw(b, h, tk, d), draw(b, h, tk, d)
        inputs.grad_out = draw(b, h, tq, d)
    else:
        dm = h * d
        inputs.x_q = draw(b, tq, dm)
        inputs.x_kv = inputs.x_q if tq == tk else draw(b, tk, dm)
        inputs.weights = {}
        for proj in rn.schema.ATTENTION_PROJECTIONS:
            inputs.weights[f"{BLOCK_NAME}.{proj}.kernel"] = draw(dm, dm, scale=1 / math.sqrt(dm))
            inputs.weights[f"{BLOCK_NAME}.{proj}.bias"] = draw(dm, scale=0.1)
        inputs.grad_out = draw(b, tq, dm)
    if case.mask in ("padded", "padded+causal"):
        lengths = rng.integers(max(1, tk // 2), max(tk // 2, tk - 1) + 1, size=b)
        lengths[0] = tk
        inputs.key_mask = np.arange(tk)[None, :] < lengths[:, None]  # (B, Tk)
        inputs.mask = np.ascontiguousarray(rn.attention_mask(inputs.key_mask, tq))  # (B, 1, Tq, Tk)
    return inputs


def block_config(case) -> rn.TransformerConfig:
    """The config a block-scope case implies (only d_model and num_heads matter to an attention block)."""
    return rn.TransformerConfig(d_model=case.heads * case.head_dim, num_heads=case.heads, dropout=0.0)


# --- the reference computations (any float dtype; float64 is the judge) ---------------------------------------------

def attention_backward(q, k, v, weights, grad_out):
    """Gradients of `out = softmax(q k^T / sqrt(d)) v` given `weights = softmax(...)` (zeros where masked)."""
    scale = q.dtype.type(1 / math.sqrt(q.shape[-1]))
    grad_v = np.swapaxes(weights, -1, -2) @ grad_out  # (B, H, Tk, d)
    grad_w = grad_out @ np.swapaxes(v, -1, -2)  # (B, H, Tq, Tk)
    grad_s = weights * (grad_w - (grad_w * weights).sum(axis=-1, keepdims=True))  # softmax Jacobian-vector product
    grad_q = grad_s @ k * scale  # (B, H, Tq, d)
    grad_k = np.swapaxes(grad_s, -1, -2) @ q * scale  # (B, H, Tk, d)
    return grad_q, grad_k, grad_v


def kernel_forward(inputs: Inputs, dtype=np.float64) -> dict[str, np.ndarray]:
    q, k, v = (a.astype(dtype, copy=False) for a in (inputs.q, inputs.k, inputs.v))
    out, _ = rn.scaled_dot_product_attention(q, k, v, inputs.full_mask())
    return {"out": out}


def kernel_forward_backward(inputs: Inputs, dtype=np.float64) -> dict[str, np.ndarray]:
    q, k, v, g = (a.astype(dtype, copy=False) for a in (inputs.q, inputs.k, inputs.v, inputs.grad_out))
    out, weights = rn.scaled_dot_product_attention(q, k, v, inputs.full_mask())
    grad_q, grad_k, grad_v = attention_backward(q, k, v, weights, g)
    return {"out": out, "grad_q": grad_q, "grad_k": grad_k, "grad_v": grad_v}


def block_forward(inputs: Inputs, config: rn.TransformerConfig, dtype=np.float64) -> dict[str, np.ndarray]:
    weights = {name: w.astype(dtype, copy=False) for name, w in inputs.weights.items()}
    x_q = inputs.x_q.astype(dtype, copy=False)
    x_kv = x_q if inputs.self_attention else inputs.x_kv.astype(dtype, copy=False)
    out, _ = rn.MultiHeadAttention(config, weights, BLOCK_NAME)(x_q, x_kv, inputs.full_mask())
    return {"out": out}


def block_forward_backward(inputs: Inputs, config: rn.TransformerConfig, dtype=np.float64
                           ) -> dict[str, np.ndarray]:
    """Forward and backward of the block; gradients for the inputs and for every weight (a training step's work),
    of which the input gradients are returned for checking."""
    ops, h = rn.ops, config.num_heads
    w = {name.removeprefix(f"{BLOCK_NAME}."): a.astype(dtype, copy=False) for name, a in inputs.weights.items()}
    x_q = inputs.x_q.astype(dtype, copy=False)
    x_kv = x_q if inputs.self_attention else inputs.x_kv.astype(dtype, copy=False)
    g = inputs.grad_out.astype(dtype, copy=False)
    q = ops.split_heads(ops.linear(x_q, w["q.kernel"], w["q.bias"]), h)  # (B, H, Tq, d)
    k = ops.split_heads(ops.linear(x_kv, w["k.kernel"], w["k.bias"]), h)  # (B, H, Tk, d)
    v = ops.split_heads(ops.linear(x_kv, w["v.kernel"], w["v.bias"]), h)  # (B, H, Tk, d)
    heads, weights = rn.scaled_dot_product_attention(q, k, v, inputs.full_mask())
    merged = ops.merge_heads(heads)  # (B, Tq, D)
    out = ops.linear(merged, w["o.kernel"], w["o.bias"])

    grads = {"o.kernel": _weight_grad(merged, g), "o.bias": g.sum(axis=(0, 1))}
    grad_heads = ops.split_heads(g @ w["o.kernel"].T, h)  # (B, H, Tq, d)
    grad_q, grad_k, grad_v = (ops.merge_heads(a) for a in attention_backward(q, k, v, weights, grad_heads))
    for proj, x, grad in (("q", x_q, grad_q), ("k", x_kv, grad_k), ("v", x_kv, grad_v)):
        grads[f"{proj}.kernel"], grads[f"{proj}.bias"] = _weight_grad(x, grad), grad.sum(axis=(0, 1))
    grad_x_q = grad_q @ w["q.kernel"].T
    grad_x_kv = grad_k @ w["k.kernel"].T + grad_v @ w["v.kernel"].T
    if inputs.self_attention:
        return {"out": out, "grad_x": grad_x_q + grad_x_kv}
    return {"out": out, "grad_x_q": grad_x_q, "grad_x_kv": grad_x_kv}


def _weight_grad(x, grad):
    return x.reshape(-1, x.shape[-1]).T @ grad.reshape(-1, grad.shape[-1])  # (in, out)


def reference(case, inputs: Inputs, dtype=np.float64) -> dict[str, np.ndarray]:
    """The answers for `case` computed by the NumPy reference in `dtype` (float64: the judge)."""
    backward = case.mode == "fwd+bwd"
    if case.scope == "kernel":
        return (kernel_forward_backward if backward else kernel_forward)(inputs, dtype)
    config = block_config(case)
    return (block_forward_backward if backward else block_forward)(inputs, config, dtype)


def max_abs_error(actual: dict[str, np.ndarray], desired: dict[str, np.ndarray]) -> tuple[float, str]:
    """The largest |actual - desired| over every output the implementation returned, and which one it was."""
    worst, where = 0.0, ""
    for name, value in actual.items():
        if name not in desired:
            raise KeyError(f"implementation returned {name!r}, which the reference does not compute")
        value = np.asarray(value, dtype=np.float64)
        if value.shape != desired[name].shape:
            raise ValueError(f"{name} has shape {value.shape}, the reference {desired[name].shape}")
        err = float(np.max(np.abs(value - desired[name]))) if value.size else 0.0
        if not np.isfinite(err):
            return float("nan"), name
        if err >= worst:
            worst, where = err, name
    return worst, where


@dataclass
class Slicer:
    """Which part of a case the float64 check covers. Rows of attention are independent per batch element and head
    (and per query in the forward pass), so a slice of a huge problem is checked exactly: the reference runs on the
    sliced inputs and each implementation's outputs are sliced the same way."""

    batch: int | None = None  # keep the first `batch` elements (None = all)
    heads: int | None = None
    rows: int | None = None  # query rows (forward kernel only)

    @classmethod
    def for_case(cls, case, limit: int) -> "Slicer":
        elements = case.batch * case.heads * case.q_len * case.k_len
        if elements <= limit:
            return cls()
        if case.scope == "block":  # projections mix heads: keep whole batch elements
            return cls(batch=1)
        per_head = case.q_len * case.k_len
        heads = max(1, min(case.heads, limit // per_head))
        rows = None
        if per_head > limit and case.mode == "fwd":
            rows = max(1, limit // case.k_len)
        return cls(batch=1, heads=heads, rows=rows)

    @property
    def is_full(self) -> bool:
        return self.batch is None

    def fraction_of(self, case) -> float:
        if self.is_full:
            return 1.0
        heads = case.heads if self.heads is None else self.heads
        rows = case.q_len if self.rows is None else self.rows
        return (self.batch * heads * rows) / (case.batch * case.heads * case.q_len)

    def describe(self) -> str:
        if self.is_full:
            return "all"
        parts = [f"batch[:{self.batch}]"]
        if self.heads is not None:
            parts.append(f"heads[:{self.heads}]")
        if self.rows is not None:
            parts.append(f"queries[:{self.rows}]")
        return " ".join(parts)

    def _index(self, name: str):
        if self.is_full:
            return ...
        if self.heads is None:  # block scope
            return (slice(0, self.batch),)
        rows = slice(None) if name in ("grad_k", "grad_v") else slice(0, self.rows)
        return (slice(0, self.batch), slice(0, self.heads), rows)

    def inputs(self, inputs: Inputs) -> Inputs:
        if self.is_full:
            return inputs
        mask = inputs.full_mask()
        if mask is not None:
            index = (slice(0, self.batch) if mask.shape[0] > 1 else slice(None), slice(None),
                     slice(0, self.rows), slice(None))
            mask = mask[index]
        sliced = dataclasses.replace(inputs, mask=mask, causal=False, key_mask=None)
        if inputs.q is not None:
            kv = (slice(0, self.batch), slice(0, self.heads))
            sliced.q, sliced.grad_out = inputs.q[self._index("out")], inputs.grad_out[self._index("out")]
            sliced.k, sliced.v = inputs.k[kv], inputs.v[kv]
        else:
            b = slice(0, self.batch)
            sliced.x_q, sliced.grad_out = inputs.x_q[b], inputs.grad_out[b]
            sliced.x_kv = sliced.x_q if inputs.self_attention else inputs.x_kv[b]
        return sliced

    def outputs(self, outputs: dict) -> dict:
        if self.is_full:
            return outputs
        return {name: value[self._index(name)] for name, value in outputs.items()}
