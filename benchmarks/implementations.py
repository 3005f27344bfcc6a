"""Every attention implementation the benchmark can time, by name (`transformer-parity bench --list`).

An implementation turns a `Case` and its `Inputs` into a `Runner`: a zero-argument `fn` that does one timed call
(returning framework tensors), `to_numpy` to turn that call's result into float64 arrays for the error check, and a
`context` entered around every call (no_grad, a forced SDPA backend, a device scope). It raises `Unsupported` when it
cannot run the case (a CUDA-only kernel on the CPU, a dtype it lacks) and `NotInstalled` when its framework is
missing; both become rows, not crashes.

Frameworks are imported inside the builders, so listing and the NumPy rows need neither PyTorch nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import numpy as np

from . import reference as ref


class Unsupported(Exception):
    """This implementation cannot run this case; the message says why."""


class NotInstalled(Unsupported):
    """The implementation's framework is not installed here."""


@dataclass
class Runner:
    fn: Callable[[], Any]
    to_numpy: Callable[[Any], dict[str, np.ndarray]]
    context: Callable[[], ContextManager] = contextlib.nullcontext
    kernel: Callable[[], str] | None = None  # asks the framework which kernel ran (runs `fn` once)
    kernel_name: str = ""  # a fixed description where the framework cannot be asked


@dataclass(frozen=True)
class Implementation:
    name: str
    framework: str  # numpy | torch | tf
    summary: str
    scopes: tuple[str, ...]
    builtin: bool  # a framework's own attention (the yardstick for torch_impl / tf_impl)
    builder: Callable[..., Runner]
    kwargs: tuple = ()

    def build(self, case, inputs) -> Runner:
        if case.scope not in self.scopes:
            raise Unsupported(f"{self.name} has no {case.scope} form (scopes: {', '.join(self.scopes)})")
        return self.builder(case, inputs, **dict(self.kwargs))


# --- NumPy ----------------------------------------------------------------------------------------------------------

def _numpy_blas() -> str:
    try:
        return np.__config__.CONFIG["Build Dependencies"]["blas"]["name"]
    except (AttributeError, KeyError, TypeError):
        return "BLAS"


def _build_numpy(case, inputs) -> Runner:
    if case.device != "cpu":
        raise Unsupported("NumPy runs on the CPU only")
    if case.dtype not in ("float32", "float64"):
        raise Unsupported(f"the NumPy reference computes in float32 or float64, not {case.dtype}")
    dtype = np.dtype(case.dtype)
    cast = _cast_inputs(inputs, dtype)
    return Runner(fn=lambda: ref.reference(case, cast, dtype),
                  to_numpy=lambda out: {k: np.asarray(v, dtype=np.float64) for k, v in out.items()},
                  kernel_name=f"numpy ({_numpy_blas()})")


def _cast_inputs(inputs: ref.Inputs, dtype) -> ref.Inputs:
    def cast(a):
        return None if a is None else a.astype(dtype)

    out = dataclasses.replace(inputs, q=cast(inputs.q), k=cast(inputs.k), v=cast(inputs.v), x_q=cast(inputs.x_q),
                              grad_out=cast(inputs.grad_out))
    out.x_kv = out.x_q if inputs.self_attention else cast(inputs.x_kv)
    out.weights = None if inputs.weights is None else {n: cast(w) for n, w in inputs.weights.items()}
    return out


# --- PyTorch ----------------------------------------------------------------------------------------------------------

_TORCH_KERNELS = (  # aten op seen by the profiler -> what to call it, most specific first
    ("aten::_native_multi_head_attention", "native MHA fast path"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "flash (cpu)"),
    ("aten::_scaled_dot_product_flash_attention", "flash"),
    ("aten::_scaled_dot_product_efficient_attention", "mem-efficient"),
    ("aten::_scaled_dot_product_cudnn_attention", "cudnn"),
    ("aten::_scaled_dot_product_fused_attention_overrideable", "fused (overrideable)"),
    ("aten::_scaled_dot_product_attention_math", "math"),
)


def _torch():
    try:
        import torch
    except ImportError:
        raise NotInstalled("PyTorch is not installed") from None
    return torch


def _torch_setup(case):
    torch = _torch()
    if case.device == "cuda" and not torch.cuda.is_available():
        raise Unsupported("no CUDA device")
    return torch, getattr(torch, case.dtype), torch.device(case.device)


def _torch_to_numpy(out: dict) -> dict[str, np.ndarray]:
    import torch
    return {k: v.detach().to(torch.float64).cpu().numpy() for k, v in out.items()}


@contextlib.contextmanager
def _quiet_stderr():
    """Silence C++ chatter on fd 2 (the profiler's start/stop lines) without touching Python's own stderr."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _torch_kernel(fn: Callable[[], Any]) -> Callable[[], str]:
    def ask() -> str:
        import torch
        from torch.profiler import ProfilerActivity, profile
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        names = {event.name for event in prof.events()}
        found = [label for op, label in _TORCH_KERNELS if op in names]
        if found:
            return " > ".join(found)
        if "aten::_softmax" in names:
            return "matmul + softmax (explicit)"
        return "unknown"
    return ask


def _no_grad_unless(backward: bool, context: Callable[[], ContextManager] = contextlib.nullcontext):
    def enter():
        import torch
        stack = contextlib.ExitStack()
        if not backward:
            stack.enter_context(torch.no_grad())
        stack.enter_context(context())
        return stack
    return enter


def _torch_kernel_runner(case, inputs, attend, context=contextlib.nullcontext) -> Runner:
    """q, k, v as tensors; `attend(q, k, v, mask) -> out`; forward, or forward + `autograd.grad` for q, k, v."""
    torch, dtype, device = _torch_setup(case)
    backward = case.mode == "fwd+bwd"

    def tensor(a, grad=False):
        return torch.tensor(a, dtype=dtype, device=device).requires_grad_(grad)

    q, k, v = (tensor(a, backward) for a in (inputs.q, inputs.k, inputs.v))
    mask = None if inputs.mask is None else torch.tensor(inputs.mask, device=device)
    if backward:
        g = tensor(inputs.grad_out)

        def fn():
            out = attend(q, k, v, mask)
            grad_q, grad_k, grad_v = torch.autograd.grad(out, (q, k, v), g)
            return {"out": out, "grad_q": grad_q, "grad_k": grad_k, "grad_v": grad_v}
    else:
        def fn():
            return {"out": attend(q, k, v, mask)}
    return Runner(fn, _torch_to_numpy, _no_grad_unless(backward, context), kernel=_torch_kernel(fn))


def _torch_block_runner(case, inputs, module, call, context=contextlib.nullcontext) -> Runner:
    """`module` holds the block's weights; `call(x_q, x_kv) -> out`; the backward pass computes the input and every
    weight gradient, as a training step does."""
    torch, dtype, device = _torch_setup(case)
    backward = case.mode == "fwd+bwd"
    module.to(device=device, dtype=dtype).eval()
    x_q = torch.tensor(inputs.x_q, dtype=dtype, device=device).requires_grad_(backward)
    x_kv = x_q if inputs.self_attention else (
        torch.tensor(inputs.x_kv, dtype=dtype, device=device).requires_grad_(backward))
    xs = (x_q,) if inputs.self_attention else (x_q, x_kv)
    names = ("grad_x",) if inputs.self_attention else ("grad_x_q", "grad_x_kv")
    params = tuple(module.parameters())
    if backward:
        g = torch.tensor(inputs.grad_out, dtype=dtype, device=device)

        def fn():
            out = call(x_q, x_kv)
            grads = torch.autograd.grad(out, xs + params, g)
            return {"out": out, **dict(zip(names, grads))}
    else:
        def fn():
            return {"out": call(x_q, x_kv)}
    return Runner(fn, _torch_to_numpy, _no_grad_unless(backward, context), kernel=_torch_kernel(fn))


def _canonical_linear_state(inputs, torch) -> dict[str, Any]:
    """Canonical (in, out) kernels -> nn.Linear-style (out, in) weights, keyed q.weight, q.bias, ..."""
    state = {}
    for proj in ("q", "k", "v", "o"):
        state[f"{proj}.weight"] = torch.tensor(inputs.weights[f"{ref.BLOCK_NAME}.{proj}.kernel"].T.copy())
        state[f"{proj}.bias"] = torch.tensor(inputs.weights[f"{ref.BLOCK_NAME}.{proj}.bias"])
    return state


def _combined_mask_tensor(inputs, torch, device):
    mask = inputs.full_mask()
    return None if mask is None else torch.tensor(np.ascontiguousarray(mask), device=device)


def _build_torch_impl(case, inputs, impl: str) -> Runner:
    torch = _torch()
    try:
        import torch_impl
    except ImportError as exc:
        raise NotInstalled(f"torch_impl cannot be imported: {exc}") from None
    if case.scope == "kernel":
        def attend(q, k, v, mask):
            return torch_impl.scaled_dot_product_attention(q, k, v, mask, causal=case.causal, impl=impl)[0]
        return _torch_kernel_runner(case, inputs, attend)
    _, _, device = _torch_setup(case)
    module = torch_impl.MultiHeadAttention(ref.block_config(case), ref.BLOCK_NAME)
    module.load_state_dict(_canonical_linear_state(inputs, torch))
    module.impl = impl
    mask = _combined_mask_tensor(inputs, torch, device)  # the model hands its blocks one combined mask
    return _torch_block_runner(case, inputs, module, lambda x_q, x_kv: module(x_q, x_kv, mask)[0])


def _sdpa_backend(backend: str):
    from torch.nn.attention import SDPBackend
    name = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION"}[backend]
    if not hasattr(SDPBackend, name):
        raise Unsupported(f"this PyTorch has no SDPBackend.{name}")
    return getattr(SDPBackend, name)


def _build_torch_sdpa(case, inputs, backend: str) -> Runner:
    torch, dtype, device = _torch_setup(case)
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    sdp_backend = _sdpa_backend(backend)
    if case.device == "cpu" and backend in ("efficient", "cudnn"):
        raise Unsupported(f"the {backend} SDPA kernel is CUDA-only")
    # The built-in's own mask forms: is_causal for a square causal mask (top-left aligned, so only when Nq == Nk),
    # otherwise one combined bool mask, True = may attend, built before timing.
    square_causal = case.causal and inputs.mask is None and case.q_len == case.k_len
    mask = None if square_causal else _combined_mask_tensor(inputs, torch, device)

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=square_causal)

    context = lambda: sdpa_kernel([sdp_backend])  # noqa: E731
    _probe_sdpa(torch, case, dtype, device, context, mask, square_causal, backend)
    if case.scope == "kernel":
        return _torch_kernel_runner(case, inputs, lambda q, k, v, _: attention(q, k, v), context)

    class Block(torch.nn.Module):  # the projections around the forced kernel, as torch_impl's block has them
        def __init__(self):
            super().__init__()
            d = case.d_model
            for proj in ("q", "k", "v", "o"):
                setattr(self, proj, torch.nn.Linear(d, d))

        def forward(self, x_q, x_kv):
            b, h, dk = x_q.shape[0], case.heads, case.head_dim
            q = self.q(x_q).view(b, -1, h, dk).transpose(1, 2)  # (B, H, Tq, d)
            k = self.k(x_kv).view(b, -1, h, dk).transpose(1, 2)  # (B, H, Tk, d)
            v = self.v(x_kv).view(b, -1, h, dk).transpose(1, 2)  # (B, H, Tk, d)
            out = attention(q, k, v).transpose(1, 2).reshape(b, -1, h * dk)  # (B, H, Tq, d) -> (B, Tq, D)
            return self.o(out)

    module = Block()
    module.load_state_dict(_canonical_linear_state(inputs, torch))
    return _torch_block_runner(case, inputs, module, module, context)


def _probe_sdpa(torch, case, dtype, device, context, mask, is_causal, backend) -> None:
    """Ask the forced backend to run a 1-head, 16-position slice of the case: if it refuses ("No available
    kernel"), the case is unsupported, and PyTorch's warnings say why."""
    import torch.nn.functional as F
    n_q, n_k = min(case.q_len, 16), min(case.k_len, 16)
    q = torch.zeros(1, 1, n_q, case.head_dim, dtype=dtype, device=device)
    k = torch.zeros(1, 1, n_k, case.head_dim, dtype=dtype, device=device)
    small_mask = None if mask is None else mask[:1, :1, -n_q:, :n_k]
    with warnings.catch_warnings(record=True) as caught, context(), torch.no_grad():
        warnings.simplefilter("always")
        try:
            F.scaled_dot_product_attention(q, k, k, attn_mask=small_mask, is_causal=is_causal)
        except RuntimeError as exc:
            if "No available kernel" not in str(exc):
                raise
            reasons = [str(w.message).strip().splitlines()[0] for w in caught
                       if "Memory efficient" in str(w.message) or "Flash" in str(w.message)
                       or "CuDNN" in str(w.message) or "cuDNN" in str(w.message) or "kernel" in str(w.message)]
            raise Unsupported(f"PyTorch has no {backend} kernel for this case"
                              + (f": {reasons[-1]}" if reasons else "")) from None


def _build_torch_mha(case, inputs) -> Runner:
    torch, dtype, device = _torch_setup(case)
    d = case.d_model
    module = torch.nn.MultiheadAttention(d, case.heads, bias=True, batch_first=True)
    w = {p: inputs.weights[f"{ref.BLOCK_NAME}.{p}.kernel"] for p in ("q", "k", "v", "o")}
    b = {p: inputs.weights[f"{ref.BLOCK_NAME}.{p}.bias"] for p in ("q", "k", "v", "o")}
    module.load_state_dict({
        "in_proj_weight": torch.tensor(np.concatenate([w["q"].T, w["k"].T, w["v"].T])),  # (3D, D), (out, in)
        "in_proj_bias": torch.tensor(np.concatenate([b["q"], b["k"], b["v"]])),
        "out_proj.weight": torch.tensor(w["o"].T.copy()),
        "out_proj.bias": torch.tensor(b["o"]),
    })
    # Its own mask forms (True = masked out, the opposite of ours): key_padding_mask (B, Tk) and attn_mask (Tq, Tk).
    key_padding = None if inputs.key_mask is None else torch.tensor(~inputs.key_mask, device=device)
    attn_mask = None
    if case.causal:
        from reference_numpy import causal_mask
        attn_mask = torch.tensor(~causal_mask(case.q_len, case.k_len), device=device)

    def call(x_q, x_kv):
        return module(x_q, x_kv, x_kv, key_padding_mask=key_padding, attn_mask=attn_mask, need_weights=False)[0]
    return _torch_block_runner(case, inputs, module, call)


# --- TensorFlow / Keras -----------------------------------------------------------------------------------------------

def _tf():
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        from tf_impl.startup import tf
    except ImportError:
        raise NotInstalled("TensorFlow is not installed") from None
    return tf


def _tf_setup(case):
    tf = _tf()
    if case.device == "cuda" and not tf.config.list_physical_devices("GPU"):
        raise Unsupported("TensorFlow sees no GPU")
    return tf, tf.dtypes.as_dtype(case.dtype), ("/GPU:0" if case.device == "cuda" else "/CPU:0")


_TF_COMPUTE_OPS = ("BatchMatMulV3", "BatchMatMulV2", "MatMul", "Einsum", "Softmax", "While", "StatelessWhile",
                   "Exp", "Max")


def _tf_kernel_name(step, args, mode: str) -> Callable[[], str]:
    """The compute ops TensorFlow put in the traced graph (a function's own graph; eager runs the same ops one by
    one), or XLA."""
    def ask() -> str:
        if mode == "xla":
            return "XLA (jit_compile)"
        tf = _tf()
        traced = step if hasattr(step, "get_concrete_function") else tf.function(step)
        graph = traced.get_concrete_function(*args).graph
        ops = {op.type for op in graph.get_operations()}
        for fn in graph.as_graph_def().library.function:  # bodies of while loops and nested functions
            ops.update(node.op for node in fn.node_def)
        found = [op for op in _TF_COMPUTE_OPS if op in ops]
        return f"{'graph' if mode == 'function' else 'eager'}: {'+'.join(found) or 'ops'}"
    return ask


def _tf_wrap(step, mode: str):
    tf = _tf()
    if mode == "eager":
        return step
    return tf.function(step, jit_compile=(mode == "xla"), reduce_retracing=False)


def _tf_to_numpy(transpose: bool = False):
    def convert(out):
        arrays = {k: np.asarray(v.numpy(), dtype=np.float64) for k, v in out.items()}
        if transpose:  # (B, T, H, d) -> (B, H, T, d)
            arrays = {k: a.transpose(0, 2, 1, 3) for k, a in arrays.items()}
        return arrays
    return convert


def _tf_kernel_runner(case, inputs, attend, mode: str, layout: str = "bhtd") -> Runner:
    """`attend(q, k, v, mask) -> out` on tensors in `layout` (bhtd, or keras's bthd); run eagerly or traced."""
    tf, dtype, device = _tf_setup(case)
    backward = case.mode == "fwd+bwd"
    perm = (0, 2, 1, 3) if layout == "bthd" else (0, 1, 2, 3)
    with tf.device(device):
        q, k, v, g = (tf.cast(tf.constant(a.transpose(perm)), dtype)
                      for a in (inputs.q, inputs.k, inputs.v, inputs.grad_out))
        mask = None if inputs.mask is None else tf.constant(inputs.mask)

    if backward:
        def step(q, k, v, mask, g):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = attend(q, k, v, mask)
            grad_q, grad_k, grad_v = tape.gradient(out, [q, k, v], output_gradients=g)
            return {"out": out, "grad_q": grad_q, "grad_k": grad_k, "grad_v": grad_v}
        args = (q, k, v, mask, g)
    else:
        def step(q, k, v, mask):
            return {"out": attend(q, k, v, mask)}
        args = (q, k, v, mask)
    wrapped = _tf_wrap(step, mode)
    return Runner(lambda: wrapped(*args), _tf_to_numpy(layout == "bthd"), lambda: tf.device(device),
                  kernel=_tf_kernel_name(wrapped if mode != "eager" else step, args, mode))


def _tf_block_runner(case, inputs, layer, call, mode: str) -> Runner:
    """`call(x_q, x_kv) -> out` on a built Keras layer; the backward pass takes input and weight gradients."""
    tf, dtype, device = _tf_setup(case)
    backward = case.mode == "fwd+bwd"
    with tf.device(device):
        x_q = tf.cast(tf.constant(inputs.x_q), dtype)
        x_kv = x_q if inputs.self_attention else tf.cast(tf.constant(inputs.x_kv), dtype)
        g = tf.cast(tf.constant(inputs.grad_out), dtype)
    names = ("grad_x",) if inputs.self_attention else ("grad_x_q", "grad_x_kv")
    variables = list(layer.trainable_variables)

    if backward:
        def step(x_q, x_kv, g):
            xs = [x_q] if inputs.self_attention else [x_q, x_kv]
            with tf.GradientTape() as tape:
                tape.watch(xs)
                out = call(x_q, x_q if inputs.self_attention else x_kv)
            grads = tape.gradient(out, xs + variables, output_gradients=g)
            return {"out": out, **dict(zip(names, grads))}
        args = (x_q, x_kv, g)
    else:
        def step(x_q, x_kv):
            return {"out": call(x_q, x_q if inputs.self_attention else x_kv)}
        args = (x_q, x_kv)
    wrapped = _tf_wrap(step, mode)
    return Runner(lambda: wrapped(*args), _tf_to_numpy(), lambda: tf.device(device),
                  kernel=_tf_kernel_name(wrapped if mode != "eager" else step, args, mode))


def _tf_block_mask(tf, inputs, device):
    mask = inputs.full_mask()
    if mask is None:
        return None
    with tf.device(device):
        return tf.constant(np.ascontiguousarray(mask))


def _build_tf_impl(case, inputs, impl: str, mode: str) -> Runner:
    tf, dtype, device = _tf_setup(case)
    try:
        import tf_impl
        import tf_impl.attention
        import tf_impl.model
    except ImportError as exc:
        raise NotInstalled(f"tf_impl cannot be imported: {exc}") from None
    if impl not in tf_impl.attention.IMPLS:
        raise Unsupported(f"tf_impl has no impl={impl!r} (it has {', '.join(tf_impl.attention.IMPLS)})")
    if case.scope == "kernel":
        def attend(q, k, v, mask):
            return tf_impl.attention.scaled_dot_product_attention(q, k, v, mask, causal=case.causal, impl=impl)[0]
        return _tf_kernel_runner(case, inputs, attend, mode)
    with tf.device(device):
        layer = tf_impl.model.MultiHeadAttention(ref.block_config(case), impl=impl, name=ref.BLOCK_NAME,
                                                 dtype=case.dtype)
        layer.build((case.batch, case.q_len, case.d_model), (case.batch, case.k_len, case.d_model))
        for proj in ("q", "k", "v", "o"):
            dense = getattr(layer, proj)
            dense.kernel.assign(inputs.weights[f"{ref.BLOCK_NAME}.{proj}.kernel"])
            dense.bias.assign(inputs.weights[f"{ref.BLOCK_NAME}.{proj}.bias"])
    mask = _tf_block_mask(tf, inputs, device)
    return _tf_block_runner(case, inputs, layer, lambda x_q, x_kv: layer(x_q, x_kv, attention_mask=mask)[0], mode)


def _build_keras_dpa(case, inputs, mode: str) -> Runner:
    tf, dtype, device = _tf_setup(case)
    import keras
    square_causal = case.causal and inputs.mask is None and case.q_len == case.k_len
    mask = None if square_causal else _tf_block_mask(tf, inputs, device)  # (B|1, 1, Tq, Tk): broadcasts over heads
    scale = 1.0 / np.sqrt(case.head_dim)

    def attend(q, k, v, _):
        return keras.ops.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=square_causal)
    return _tf_kernel_runner(case, inputs, attend, mode, layout="bthd")


def _build_keras_mha(case, inputs, mode: str) -> Runner:
    tf, dtype, device = _tf_setup(case)
    import keras
    h, dk, d = case.heads, case.head_dim, case.d_model
    w = {p: inputs.weights[f"{ref.BLOCK_NAME}.{p}.kernel"] for p in ("q", "k", "v", "o")}
    b = {p: inputs.weights[f"{ref.BLOCK_NAME}.{p}.bias"] for p in ("q", "k", "v", "o")}
    with tf.device(device):
        layer = keras.layers.MultiHeadAttention(num_heads=h, key_dim=dk, use_bias=True, dtype=case.dtype)
        layer.build((case.batch, case.q_len, d), (case.batch, case.k_len, d))
        for dense, p in ((layer.query_dense, "q"), (layer.key_dense, "k"), (layer.value_dense, "v")):
            dense.kernel.assign(w[p].reshape(d, h, dk))  # heads split out of the output features, head-major
            dense.bias.assign(b[p].reshape(h, dk))
        layer.output_dense.kernel.assign(w["o"].reshape(h, dk, d))
        layer.output_dense.bias.assign(b["o"])
    # Its own mask forms: use_causal_mask for a square causal mask, else one (B, Tq, Tk) mask, True = may attend.
    square_causal = case.causal and inputs.mask is None and case.q_len == case.k_len
    full = None if square_causal else inputs.full_mask()
    with tf.device(device):
        mask = None if full is None else tf.constant(np.ascontiguousarray(
            np.broadcast_to(full[:, 0], (case.batch, case.q_len, case.k_len))))

    def call(x_q, x_kv):
        return layer(x_q, x_kv, x_kv, attention_mask=mask, use_causal_mask=square_causal)
    return _tf_block_runner(case, inputs, layer, call, mode)


# --- the registry -----------------------------------------------------------------------------------------------------

def _registry() -> dict[str, Implementation]:
    both, kernel, block = ("kernel", "block"), ("kernel",), ("block",)
    impls = [
        Implementation("numpy", "numpy", "the NumPy reference (reference_numpy) in the case dtype, float32/float64; "
                       "the speedup baseline", both, False, _build_numpy),
        Implementation("torch_impl.fused", "torch", "torch_impl attention, impl='fused' "
                       "(F.scaled_dot_product_attention, PyTorch picks the kernel)", both, False, _build_torch_impl,
                       (("impl", "fused"),)),
        Implementation("torch_impl.explicit", "torch", "torch_impl attention, impl='explicit' (matmul, softmax, "
                       "matmul)", both, False, _build_torch_impl, (("impl", "explicit"),)),
    ]
    for backend, text in (("math", "the math (unfused) backend"), ("flash", "FlashAttention (CPU or CUDA)"),
                          ("efficient", "memory-efficient attention (CUDA)"), ("cudnn", "cuDNN attention (CUDA)")):
        impls.append(Implementation(f"torch.sdpa.{backend}", "torch",
                                    f"F.scaled_dot_product_attention forced to {text} via sdpa_kernel; block scope "
                                    "wraps it in nn.Linear projections", both, True, _build_torch_sdpa,
                                    (("backend", backend),)))
    impls.append(Implementation("torch.nn.MHA", "torch", "torch.nn.MultiheadAttention (batch_first; its fast path "
                                "where eligible)", block, True, _build_torch_mha))
    modes = {"eager": "eager", "function": "tf.function", "xla": "tf.function(jit_compile=True)"}
    for impl, text in (("explicit", "matmul, softmax, matmul"), ("keras", "keras.ops.dot_product_attention inside"),
                       ("blockwise", "blockwise online softmax, tf_impl/blockwise_attention.py")):
        for mode, how in modes.items():
            impls.append(Implementation(f"tf_impl.{impl}.{mode}", "tf", f"tf_impl attention, impl='{impl}' "
                                        f"({text}), {how}", both, False, _build_tf_impl,
                                        (("impl", impl), ("mode", mode))))
    for mode, how in modes.items():
        impls.append(Implementation(f"keras.dpa.{mode}", "tf", f"keras.ops.dot_product_attention, {how}", kernel,
                                    True, _build_keras_dpa, (("mode", mode),)))
    for mode, how in modes.items():
        impls.append(Implementation(f"keras.MHA.{mode}", "tf", f"keras.layers.MultiHeadAttention, {how}", block,
                                    True, _build_keras_mha, (("mode", mode),)))
    return {impl.name: impl for impl in impls}


REGISTRY = _registry()


def select(patterns: list[str] | None) -> list[Implementation]:
    """Implementations by exact name or glob (`torch*`, `*.xla`), in registry order; all when `patterns` is None."""
    return select_from(REGISTRY, patterns, "transformer-parity bench --list")


def select_from(registry: dict, patterns: list[str] | None, lister: str) -> list:
    """`registry` entries by exact name or glob, in registry order (all when `patterns` is None); an unknown pattern
    is a `ValueError` that names it and the command listing the names."""
    if not patterns:
        return list(registry.values())
    chosen: list[str] = []
    for pattern in patterns:
        matches = [name for name in registry if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise ValueError(f"unknown implementation {pattern!r}; `{lister}` shows the {len(registry)} names")
        chosen.extend(m for m in matches if m not in chosen)
    return [registry[name] for name in registry if name in chosen]


def framework_installed(framework: str) -> bool:
    import importlib.util
    module = {"numpy": "numpy", "torch": "torch", "tf": "tensorflow"}[framework]
    return importlib.util.find_spec(module) is not None
