"""torch_impl component by component against the reference, both attention paths, dropout, and CUDA."""

import numpy as np
import pytest
import torch

import reference_numpy as rn
import torch_impl as ti

from .conftest import TINY, weights_for
from .tolerances import atol

RNG = np.random.default_rng(99)
HAS_CUDA = torch.cuda.is_available()


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def load(module: torch.nn.Module, weights: dict, prefix: str, dtype) -> torch.nn.Module:
    """Load the canonical weights under `prefix` into one torch submodule through the model's weight table."""
    state = rn.to_framework_state(TINY, weights, ti.weight_table(TINY))
    own = {k[len(prefix) + 1:]: t(v) for k, v in state.items() if k.startswith(prefix + ".")}
    module.to(getattr(torch, dtype)).load_state_dict(own, strict=True)
    return module.eval()


MASKS = {
    "none": lambda b, tq, tk: None,
    "padding": lambda b, tq, tk: rn.attention_mask(np.arange(tk)[None] < RNG.integers(1, tk + 1, (b, 1)), tq),
    "causal": lambda b, tq, tk: rn.causal_mask(tq, tk)[None, None],
    "fully-masked-rows": lambda b, tq, tk: rn.attention_mask(np.zeros((b, tk), bool), tq),
}


@pytest.mark.parametrize("impl", ti.attention.IMPLS)
@pytest.mark.parametrize("mask_kind", list(MASKS))
def test_attention_paths(impl, mask_kind, dtype):
    q, k, v = (RNG.standard_normal((2, 3, n, 8)).astype(dtype) for n in (5, 7, 7))
    mask = MASKS[mask_kind](2, 5, 7)
    desired, desired_weights = rn.scaled_dot_product_attention(*(x.astype(np.float64) for x in (q, k, v)), mask)
    out, weights = ti.scaled_dot_product_attention(t(q), t(k), t(v), None if mask is None else t(mask), impl=impl,
                                                   need_weights=impl == "explicit")
    np.testing.assert_allclose(out.numpy(), desired, rtol=0, atol=atol(dtype))
    if impl == "explicit":
        np.testing.assert_allclose(weights.numpy(), desired_weights, rtol=0, atol=atol(dtype))


@pytest.mark.parametrize("impl", ti.attention.IMPLS)
def test_causal_flag_equals_causal_mask(impl):
    q, k, v = (t(RNG.standard_normal((2, 2, n, 4))) for n in (3, 6, 6))
    by_flag, _ = ti.scaled_dot_product_attention(q, k, v, causal=True, impl=impl)
    by_mask, _ = ti.scaled_dot_product_attention(q, k, v, t(rn.causal_mask(3, 6)[None, None]), impl=impl)
    torch.testing.assert_close(by_flag, by_mask, rtol=0, atol=1e-12)


def test_attention_rejects_bad_arguments():
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match="impl must be one of .* received 'flash'"):
        ti.scaled_dot_product_attention(q, q, q, impl="flash")
    with pytest.raises(TypeError, match=r"mask must be a bool tensor .* received dtype torch.float32"):
        ti.scaled_dot_product_attention(q, q, q, torch.ones(1, 1, 2, 2))


@pytest.mark.parametrize("tq, tk", [(4, 4), (3, 6)], ids=["self", "cross"])
def test_multi_head_attention(tq, tk, dtype):
    weights = weights_for(TINY, dtype=dtype)
    name = "decoder.layers.1.cross_attn"
    x_q, x_kv = RNG.standard_normal((2, tq, 32)).astype(dtype), RNG.standard_normal((2, tk, 32)).astype(dtype)
    mask = MASKS["padding"](2, tq, tk)
    desired, desired_weights = rn.MultiHeadAttention(TINY, rn.Transformer(TINY, weights).weights, name)(
        x_q.astype(np.float64), x_kv.astype(np.float64), mask)
    mha = load(ti.MultiHeadAttention(TINY, name), weights, name, dtype)
    with torch.no_grad():
        out, attn = mha(t(x_q), t(x_kv), t(mask), need_weights=True)
        fused, _ = mha(t(x_q), t(x_kv), t(mask))
    np.testing.assert_allclose(out.numpy(), desired, rtol=0, atol=atol(dtype))
    np.testing.assert_allclose(fused.numpy(), desired, rtol=0, atol=atol(dtype))
    np.testing.assert_allclose(attn.numpy(), desired_weights, rtol=0, atol=atol(dtype))


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_packed_projections_under_autograd(kind, dtype, monkeypatch):
    """With gradients recorded, the projections that share an input run as one packed matmul (q, k, v in
    self-attention; k, v in encoder-decoder attention): the output equals the reference's, and every parameter's
    gradient equals the one taken through separate projections."""
    weights = weights_for(TINY, dtype=dtype)
    name = f"decoder.layers.1.{kind}_attn"
    x_q = t(RNG.standard_normal((2, 4, 32)).astype(dtype))
    x_kv = x_q if kind == "self" else t(RNG.standard_normal((2, 6, 32)).astype(dtype))
    mask = MASKS["padding"](2, 4, x_kv.shape[1])
    desired, _ = rn.MultiHeadAttention(TINY, rn.Transformer(TINY, weights).weights, name)(
        x_q.numpy().astype(np.float64), x_kv.numpy().astype(np.float64), mask)
    mha = load(ti.MultiHeadAttention(TINY, name), weights, name, dtype)
    packed_sizes, grads = [], {}
    packed = ti.layers._packed_linear
    for path, linear in (("packed", packed), ("separate", lambda x, linears: tuple(f(x) for f in linears))):
        monkeypatch.setattr(ti.layers, "_packed_linear",
                            lambda x, linears, linear=linear: packed_sizes.append(len(linears)) or linear(x, linears))
        mha.zero_grad(set_to_none=True)
        out, _ = mha(x_q, x_kv, t(mask))
        out.sum().backward()
        np.testing.assert_allclose(out.detach().numpy(), desired, rtol=0, atol=atol(dtype))
        grads[path] = {n: p.grad.numpy() for n, p in mha.named_parameters()}
    assert packed_sizes == [3, 3] if kind == "self" else [2, 2], packed_sizes
    assert set(grads["packed"]) == {f"{p}.{leaf}" for p in "qkvo" for leaf in ("weight", "bias")}
    for n, g in grads["separate"].items():
        np.testing.assert_allclose(grads["packed"][n], g, rtol=0, atol=atol(dtype),
                                   err_msg=n)
    with torch.no_grad():  # inference does not pack (no backward pass to save)
        mha(x_q, x_kv, t(mask))
    assert len(packed_sizes) == 2


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_and_layer_norm(activation, dtype):
    config = TINY.replace(activation=activation, layer_norm_eps=1e-6)
    weights = weights_for(config, dtype=dtype)
    ref_weights = rn.Transformer(config, weights).weights
    x = RNG.standard_normal((2, 5, 32)).astype(dtype)
    ffn = load(ti.FeedForward(config, "encoder.layers.0.ffn"), weights, "encoder.layers.0.ffn", dtype)
    norm = load(torch.nn.LayerNorm(32, eps=1e-6), weights, "encoder.layers.0.norm1", dtype)
    with torch.no_grad():
        np.testing.assert_allclose(ffn(t(x)).numpy(), rn.FeedForward(config, ref_weights, "encoder.layers.0.ffn")(
            x.astype(np.float64)), rtol=0, atol=atol(dtype))
        np.testing.assert_allclose(norm(t(x)).numpy(), rn.LayerNorm(config, ref_weights, "encoder.layers.0.norm1")(
            x.astype(np.float64)), rtol=0, atol=atol(dtype))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
def test_encoder_and_decoder_layers(norm_first, dtype):
    config = TINY.replace(norm_first=norm_first)
    weights = weights_for(config, dtype=dtype)
    ref_weights = rn.Transformer(config, weights).weights
    x, memory = RNG.standard_normal((2, 5, 32)).astype(dtype), RNG.standard_normal((2, 6, 32)).astype(dtype)
    self_mask = rn.attention_mask(np.ones((2, 5), bool), 5, causal=True)
    cross_mask = MASKS["padding"](2, 5, 6)
    enc = load(ti.EncoderLayer(config, "encoder.layers.1"), weights, "encoder.layers.1", dtype)
    dec = load(ti.DecoderLayer(config, "decoder.layers.0"), weights, "decoder.layers.0", dtype)
    with torch.no_grad():
        np.testing.assert_allclose(
            enc(t(x), t(cross_mask[:, :, :, :5])).numpy(),
            rn.EncoderLayer(config, ref_weights, "encoder.layers.1")(x.astype(np.float64), cross_mask[:, :, :, :5]),
            rtol=0, atol=atol(dtype))
        np.testing.assert_allclose(
            dec(t(x), t(memory), t(self_mask), t(cross_mask)).numpy(),
            rn.DecoderLayer(config, ref_weights, "decoder.layers.0")(x.astype(np.float64), memory.astype(np.float64),
                                                                     self_mask, cross_mask),
            rtol=0, atol=atol(dtype))


def test_explicit_and_fused_paths_agree_in_the_model():
    weights = weights_for(TINY)
    src, tgt = rn.sample_batch(TINY, 2, 9, 7)
    model = ti.Transformer.from_reference(TINY, weights)
    with torch.no_grad():
        fused = model(src, tgt)
        for module in model.modules():
            if isinstance(module, ti.MultiHeadAttention):
                module.impl = "explicit"
        explicit = model(src, tgt)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=atol("float32"))


def test_dropout_is_active_in_training_only():
    config = TINY.replace(dropout=0.3)
    model = ti.Transformer.from_reference(config, weights_for(config))
    src, tgt = rn.sample_batch(config, 2, 9, 7)
    with torch.no_grad():
        model.train()
        a, b = model(src, tgt), model(src, tgt)
        model.eval()
        c, d = model(src, tgt), model(src, tgt)
    assert not torch.equal(a, b)
    torch.testing.assert_close(c, d, rtol=0, atol=0)
    np.testing.assert_allclose(c.numpy(), rn.Transformer(config, weights_for(config))(src, tgt), rtol=0,
                               atol=atol("float32"))


def test_gradients_reach_every_parameter():
    model = ti.Transformer.from_reference(TINY, weights_for(TINY))
    src, tgt = rn.sample_batch(TINY, 2, 9, 7)
    model(src, tgt).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("impl", ti.attention.IMPLS)
def test_cuda_model_matches_the_reference(impl):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = TINY.replace(final_norm=True)
    weights = weights_for(config)
    src, tgt = rn.sample_batch(config, 3, 11, 9)
    model = ti.Transformer.from_reference(config, weights, device="cuda")
    for module in model.modules():
        if isinstance(module, ti.MultiHeadAttention):
            module.impl = impl
    with torch.no_grad():
        traced = {k: v.cpu().numpy() for k, v in model.trace(src, tgt).items()}
    desired = rn.Transformer(config, weights).trace(src, tgt)
    for name in desired:
        np.testing.assert_allclose(traced[name], desired[name], rtol=0, atol=atol("float32"), err_msg=name)


def test_weights_never_alias_between_model_and_canonical_dicts():
    """An optimizer step on the model must not reach back into the dict it was built from or exported to."""
    weights = weights_for(TINY)
    model = ti.Transformer.from_reference(TINY, weights)
    exported = model.to_reference()
    before = {k: v.copy() for k, v in weights.items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    assert all(np.array_equal(weights[k], before[k]) and np.array_equal(exported[k], before[k]) for k in weights)


def test_bfloat16_model_decodes_to_numpy():
    """A model cast to bfloat16 (verify --dtype bfloat16, bench model) hands NumPy float32 logits to the decoder."""
    from torch_impl.decoding import cached_stepper, recompute_stepper

    config = TINY
    weights = rn.init_weights(config, seed=0)
    model = ti.Transformer.from_reference(config, weights).to(torch.bfloat16)
    src = np.array([[5, 6, 7, 8]])
    for stepper in (cached_stepper(model, src), recompute_stepper(model, src)):
        logits = stepper(np.array([[1]]))
        assert logits.dtype == np.float32 and logits.shape == (1, config.tgt_vocab_size)
