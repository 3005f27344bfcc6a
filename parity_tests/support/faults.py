"""Planted porting faults: the ways real ports break, planted where a real port would have them, to show that
`verify` catches each one and names the sublayer where it starts.

- in the weights (`WEIGHT_FAULTS`): query and key kernels swapped, a kernel transposed, one weight nudged by 1e-3,
  one layer's weights copied from another layer;
- in the port's config (`CONFIG_FAULTS`): LayerNorm epsilon 1e-3 instead of 1e-5, the other sinusoid layout;
- in the port's code (`CODE_FAULTS`, context managers that patch a backend while active): an inverted mask
  convention, attention scaled by sqrt(d_model) instead of sqrt(d_k), a LayerNorm built with Keras's default
  epsilon, the other sinusoid layout; `MUTANTS` adds the heads concatenated in the wrong order and the attention's
  output bias left out.
- in a mixture of experts' router (`ROUTING_FAULTS`, `ROUTING_MUTANTS`): two experts' router columns swapped, a top-k
  that keeps the lowest scores; each is named at the layer's routing record.

Each fault also says which sublayer should be named first: `expected(config)`. Used by the tests and by
`benchmarks/verify_calibration.py`; nothing else imports it.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import numpy as np

import reference_numpy as rn


def _first_after_norm(config: rn.TransformerConfig) -> str:
    """The first recorded output that a wrong LayerNorm changes: pre-LN normalizes before the first attention;
    post-LN's first norm (after it) first feeds the feed-forward sublayer."""
    return "encoder.layers.0.self_attn" if config.norm_first else "encoder.layers.0.ffn"


@dataclass(frozen=True)
class WeightFault:
    name: str
    apply: Callable[[rn.TransformerConfig, dict], dict]
    expected: Callable[[rn.TransformerConfig], str]


def _swap_qk(block: str) -> Callable:
    def apply(config, weights):
        w = dict(weights)
        w[f"{block}.q.kernel"], w[f"{block}.k.kernel"] = weights[f"{block}.k.kernel"], weights[f"{block}.q.kernel"]
        return w
    return apply


def _transpose(name: str) -> Callable:
    def apply(config, weights):
        return {**weights, name: np.ascontiguousarray(np.asarray(weights[name]).T)}  # (D, D): still fits
    return apply


def _nudge(name: str, index: tuple[int, ...], delta: float = 1e-3) -> Callable:
    def apply(config, weights):
        value = np.array(weights[name], copy=True)
        value[index] += value.dtype.type(delta)
        return {**weights, name: value}
    return apply


def _copy_layer(source: str, target: str) -> Callable:
    def apply(config, weights):
        w = dict(weights)
        for name, value in weights.items():
            if name.startswith(source + "."):
                w[target + name[len(source):]] = value
        return w
    return apply


def _decoder_or_encoder(config: rn.TransformerConfig, decoder: str, encoder: str) -> str:
    return decoder if config.is_encoder_decoder else encoder


WEIGHT_FAULTS = {
    "swapped-qk": WeightFault("swapped-qk", _swap_qk("encoder.layers.0.self_attn"),
                              lambda c: "encoder.layers.0.self_attn"),
    "swapped-qk-cross": WeightFault("swapped-qk-cross", lambda c, w: _swap_qk("decoder.layers.0.cross_attn")(c, w),
                                    lambda c: "decoder.layers.0.cross_attn"),
    "transposed-kernel": WeightFault("transposed-kernel", _transpose("encoder.layers.1.self_attn.v.kernel"),
                                     lambda c: "encoder.layers.1.self_attn"),
    "transposed-out-kernel": WeightFault("transposed-out-kernel", _transpose("decoder.layers.1.self_attn.o.kernel"),
                                         lambda c: "decoder.layers.1.self_attn"),
    # A weight every token uses (a value projection). A nudge behind a ReLU unit that no input token activates
    # changes no output at all, so no output-comparing check can see it on those inputs.
    "nudged-weight": WeightFault("nudged-weight", _nudge("encoder.layers.1.self_attn.v.kernel", (3, 5)),
                                 lambda c: "encoder.layers.1.self_attn"),
    "nudged-attention-weight": WeightFault("nudged-attention-weight",
                                           _nudge("decoder.layers.0.cross_attn.o.kernel", (2, 7)),
                                           lambda c: "decoder.layers.0.cross_attn"),
    "layer-copied": WeightFault("layer-copied", _copy_layer("encoder.layers.0", "encoder.layers.1"),
                                lambda c: "encoder.layers.1.self_attn"),
}

# A port whose config says something else than the original: run it from a second checkpoint with this config.
CONFIG_FAULTS = {
    "eps-1e-3": ({"layer_norm_eps": 1e-3}, _first_after_norm),
    "sinusoid-layout": (lambda c: {"sinusoid_layout": "concatenated" if c.sinusoid_layout == "interleaved"
                                   else "interleaved"}, lambda c: "encoder.embed"),
}


def config_fault(name: str, config: rn.TransformerConfig) -> tuple[rn.TransformerConfig, str]:
    """`(the port's wrong config, the sublayer verify should name first)`."""
    change, expected = CONFIG_FAULTS[name]
    fields = change(config) if callable(change) else change
    return config.replace(**fields), expected(config)


# --- faults in a backend's code -------------------------------------------------------------------------------------

@contextlib.contextmanager
def _patched(obj, attr: str, value) -> Iterator[None]:
    original = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, original)


def _attention_module(backend: str):
    if backend == "torch":
        import torch_impl.layers as module
    elif backend == "keras":
        import tf_impl.layers as module
    else:
        raise ValueError(f"code faults are planted in torch or keras, received {backend!r}")
    return module


@contextlib.contextmanager
def inverted_mask(backend: str) -> Iterator[None]:
    """The port hands the attention op a mask with the opposite convention (True = padding, as
    `nn.MultiheadAttention`'s key_padding_mask) while the op expects True = may attend."""
    module = _attention_module(backend)
    original = module.scaled_dot_product_attention

    def wrong(q, k, v, mask=None, **kwargs):
        if mask is not None:
            mask = ~mask if backend == "torch" else _tf_not(mask)
        return original(q, k, v, mask, **kwargs)

    with _patched(module, "scaled_dot_product_attention", wrong):
        yield


def _tf_not(mask):
    from tf_impl.startup import tf

    return tf.logical_not(mask)


@contextlib.contextmanager
def d_model_scale(backend: str, d_model: int) -> Iterator[None]:
    """The port scales scores by 1/sqrt(d_model) instead of 1/sqrt(d_k): same as queries times sqrt(d_k/d_model)."""
    module = _attention_module(backend)
    original = module.scaled_dot_product_attention

    def wrong(q, k, v, mask=None, **kwargs):
        return original(q * math.sqrt(q.shape[-1] / d_model), k, v, mask, **kwargs)

    with _patched(module, "scaled_dot_product_attention", wrong):
        yield


@contextlib.contextmanager
def layer_norm_eps(backend: str, eps: float = 1e-3) -> Iterator[None]:
    """The port builds its LayerNorms with another epsilon than the config's (Keras's default 1e-3)."""
    if backend == "torch":
        import torch.nn as nn

        import torch_impl.model as module

        class WrongEps(nn.LayerNorm):
            def __init__(self, shape, **kwargs):
                kwargs["eps"] = eps
                super().__init__(shape, **kwargs)

        with _patched(module.nn, "LayerNorm", WrongEps):
            yield
    else:
        import tf_impl.startup  # noqa: F401 (TensorFlow's start-up notices kept off the terminal)
        import keras

        original = keras.layers.LayerNormalization

        class WrongEpsKeras(original):
            def __init__(self, *args, **kwargs):
                kwargs["epsilon"] = eps
                super().__init__(*args, **kwargs)

        with _patched(keras.layers, "LayerNormalization", WrongEpsKeras):
            yield


@contextlib.contextmanager
def sinusoid_layout(backend: str) -> Iterator[None]:
    """The port builds its position table in the other layout (tensor2tensor's [sin | cos] for the paper's
    interleaved sin/cos, or the reverse)."""
    def other(layout: str) -> str:
        return "concatenated" if layout == "interleaved" else "interleaved"

    if backend == "torch":
        import torch

        import torch_impl.model as module

        def table(self):
            c = self.config
            return torch.from_numpy(rn.sinusoidal_positions(c.max_len, c.d_model, other(c.sinusoid_layout)))

        with _patched(module.Embedding, "_sinusoid_table", table):
            yield
    else:
        import tf_impl.model as module

        original = module.Embedding.__init__

        def init(self, config, vocab_size, **kwargs):
            original(self, config, vocab_size, **kwargs)
            if self.sinusoid is not None:
                self.sinusoid = rn.sinusoidal_positions(config.max_len, config.d_model, other(config.sinusoid_layout)
                                                        ).astype(self.compute_dtype)

        with _patched(module.Embedding, "__init__", init):
            yield


@contextlib.contextmanager
def head_order(backend: str) -> Iterator[None]:
    """The port concatenates the heads' outputs in the wrong order (last head first) before the output projection."""
    module = _attention_module(backend)
    original = module.scaled_dot_product_attention

    def wrong(q, k, v, mask=None, **kwargs):
        out, weights = original(q, k, v, mask, **kwargs)
        return (out.flip(1) if backend == "torch" else _tf_reverse_heads(out)), weights  # (B, H, Tq, d_k)

    with _patched(module, "scaled_dot_product_attention", wrong):
        yield


def _tf_reverse_heads(x):
    from tf_impl.startup import tf

    return tf.reverse(x, [1])


@contextlib.contextmanager
def output_bias_dropped(backend: str) -> Iterator[None]:
    """The port leaves out the bias of the attention's output projection (`o.bias`), as a port that maps only
    kernels does."""
    module = _attention_module(backend)
    cls = module.MultiHeadAttention
    method = "forward" if backend == "torch" else "call"
    original = getattr(cls, method)

    def wrong(self, *args, **kwargs):
        out, weights = original(self, *args, **kwargs)
        return (out if self.o.bias is None else out - self.o.bias), weights

    with _patched(cls, method, wrong):
        yield


CODE_FAULTS: dict[str, tuple[Callable[[str, rn.TransformerConfig], contextlib.AbstractContextManager],
                             Callable[[rn.TransformerConfig], str]]] = {
    "inverted-mask": (lambda b, c: inverted_mask(b), lambda c: "encoder.layers.0.self_attn"),
    "sqrt-d-model-scale": (lambda b, c: d_model_scale(b, c.d_model), lambda c: "encoder.layers.0.self_attn"),
    "eps-1e-3-in-code": (lambda b, c: layer_norm_eps(b, 1e-3), _first_after_norm),
    "sinusoid-layout-in-code": (lambda b, c: sinusoid_layout(b), lambda c: "encoder.embed"),
}

# The code faults, and two more mutations of a twin's code (not in the calibration of docs/verify.md): what the test
# suite must catch when planted in torch_impl or tf_impl (docs/verify.md, "Planted mutants").
MUTANTS = {**CODE_FAULTS,
           "head-order": (lambda b, c: head_order(b), lambda c: "encoder.layers.0.self_attn"),
           "output-bias-dropped": (lambda b, c: output_bias_dropped(b), lambda c: "encoder.layers.0.self_attn")}


# --- faults in a mixture of experts' router (a decoder-only model with `num_experts`) ------------------------------

def _last_expert_layer(config: rn.TransformerConfig) -> int:
    return max(i for i in range(config.num_decoder_layers) if config.layer_experts(i))


def _swapped_router_columns(a: int = 0, b: int = 1) -> Callable:
    """The last expert layer's router scores expert a with expert b's weights and b with a's (a port that numbers
    the experts otherwise than its router does): tokens that chose one of them choose the other."""
    def apply(config, weights):
        name = f"decoder.layers.{_last_expert_layer(config)}.ffn.router.kernel"
        kernel = np.array(weights[name], copy=True)
        kernel[:, [a, b]] = kernel[:, [b, a]]
        return {**weights, name: kernel}
    return apply


@contextlib.contextmanager
def lowest_experts(backend: str) -> Iterator[None]:
    """The port's router keeps the k lowest-scoring experts (a top-k that sorts the wrong way)."""
    if backend == "torch":
        import torch_impl.moe as module
    elif backend == "keras":
        import tf_impl.moe as module
    else:
        raise ValueError(f"code faults are planted in torch or keras, received {backend!r}")
    original = module.route

    def wrong(logits, config):
        return original(-logits, config)

    with _patched(module, "route", wrong):
        yield


# A router that picks other experts than the original's: named at the layer's routing record, before its output.
ROUTING_FAULTS = {
    "swapped-router-columns": WeightFault("swapped-router-columns", _swapped_router_columns(),
                                          lambda c: f"decoder.layers.{_last_expert_layer(c)}.ffn.routing"),
}
ROUTING_MUTANTS = {"lowest-experts": (lambda b, c: lowest_experts(b), lambda c: "decoder.layers.0.ffn.routing")}


def apply_weight_fault(name: str, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray]
                       ) -> tuple[dict[str, np.ndarray], str]:
    fault = WEIGHT_FAULTS.get(name) or ROUTING_FAULTS[name]
    return fault.apply(config, dict(weights)), fault.expected(config)


# --- planted faults in reduced precision (test_lowp and benchmarks/verify_calibration.py --dtype) -------------------

def _decoder_only_weight_faults() -> dict[str, tuple]:
    """The weight faults re-aimed at a decoder-only model's layers: `name -> (apply, expected sublayer)`."""
    def swap(config, weights):
        w, b = dict(weights), "decoder.layers.0.self_attn"
        w[f"{b}.q.kernel"], w[f"{b}.k.kernel"] = weights[f"{b}.k.kernel"], weights[f"{b}.q.kernel"]
        return w

    def transpose(name):
        return lambda config, weights: {**weights, name: np.ascontiguousarray(weights[name].T)}

    def nudge(name, index):
        def apply(config, weights):
            value = np.array(weights[name], copy=True)
            value[index] += value.dtype.type(1e-3)
            return {**weights, name: value}
        return apply

    def copy(config, weights):
        return {**weights, **{"decoder.layers.1" + k[len("decoder.layers.0"):]: v for k, v in weights.items()
                              if k.startswith("decoder.layers.0.")}}

    return {"swapped-qk": (swap, "decoder.layers.0.self_attn"),
            "transposed-kernel": (transpose("decoder.layers.1.self_attn.v.kernel"), "decoder.layers.1.self_attn"),
            "transposed-out-kernel": (transpose("decoder.layers.1.self_attn.o.kernel"), "decoder.layers.1.self_attn"),
            "nudged-weight": (nudge("decoder.layers.1.self_attn.v.kernel", (3, 5)), "decoder.layers.1.self_attn"),
            "layer-copied": (copy, "decoder.layers.1.self_attn")}


def fault_cases(config, weights, backend: str):
    """Every planted fault (`faults`) that applies to `config`, re-aimed at a decoder-only model's layers where
    needed: `(name, the port's config, the port's weights, a context manager planting the code fault (a null one
    for the others), the sublayer verify should name first)`."""
    none = contextlib.nullcontext
    if config.is_decoder_only:
        first = "decoder.layers.0.self_attn" if config.norm_first else "decoder.layers.0.ffn"
        cases = [(name, config, apply(config, weights), none(), expected)
                 for name, (apply, expected) in _decoder_only_weight_faults().items()]
        cases.append(("eps-1e-3", config.replace(layer_norm_eps=1e-3), weights, none(), first))
        cases += [(name, config, weights, plant(backend, config), first)
                  for name, (plant, _) in CODE_FAULTS.items() if "sinusoid" not in name]
        return cases
    cases = []
    for name in WEIGHT_FAULTS:
        bad, expected = apply_weight_fault(name, config, weights)
        cases.append((name, config, bad, none(), expected))
    for name in CONFIG_FAULTS:
        wrong, expected = config_fault(name, config)
        cases.append((name, wrong, weights, none(), expected))
    cases += [(name, config, weights, plant(backend, config), expected_of(config))
              for name, (plant, expected_of) in CODE_FAULTS.items()]
    return cases
