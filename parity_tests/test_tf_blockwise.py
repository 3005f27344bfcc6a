"""tf_impl's blockwise attention (impl="blockwise") against the float64 NumPy reference: values and gradients, every
mask form, ragged and causal blocks, rows that see no key, eager / tf.function / XLA / dynamic shapes."""

import numpy as np
import pytest

import reference_numpy as rn
from parity_tests.tolerances import atol
from transformer_parity.bench.attention_reference import attention_backward

tf = pytest.importorskip("tensorflow")  # the framework may be absent; our own modules must import, or fail

import tf_impl.attention as ta  # noqa: E402
import tf_impl.blockwise_attention as bw  # noqa: E402

B, H, D = 2, 3, 8


def _inputs(tq, tk, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, tq, D)), rng.standard_normal((B, H, tk, D)),
            rng.standard_normal((B, H, tk, D)), rng.standard_normal((B, H, tq, D)))


def _mask(kind, tq, tk, seed=0):
    """(mask or None, causal flag, the full boolean mask the reference applies)."""
    rng = np.random.default_rng(seed + 1)
    causal = kind.endswith("causal")
    mask = None
    if kind.startswith("padded"):  # (B, 1, 1, Tk) key padding, row 1 padded to 5 keys
        keys = np.ones((B, tk), bool)
        keys[1, 5:] = False
        mask = keys[:, None, None, :]
    elif kind == "full":  # (B, 1, Tq, Tk) arbitrary, with query rows that see no key at all
        mask = rng.random((B, 1, tq, tk)) > 0.4
        mask[0, 0, 2] = False
        mask[1, 0, -1] = False
    full = np.ones((1, 1, tq, tk), bool) if mask is None else mask
    if causal:
        full = full & rn.causal_mask(tq, tk)
    return mask, causal, (None if kind == "none" else full)


KINDS = ["none", "padded", "full", "causal", "padded+causal", "full+causal"]
LENGTHS = [(13, 13), (5, 13), (13, 5)]  # square, fewer queries (a decoder step), more queries (rows see nothing)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tq,tk", LENGTHS, ids=[f"{a}x{b}" for a, b in LENGTHS])
def test_values_match_reference(kind, tq, tk, dtype, monkeypatch):
    q, k, v, _ = _inputs(tq, tk)
    mask, causal, full = _mask(kind, tq, tk)
    desired, _ = rn.scaled_dot_product_attention(q, k, v, full)
    cast = (lambda a: tf.constant(a.astype(dtype)))
    actual = bw.blockwise_attention(cast(q), cast(k), cast(v), None if mask is None else tf.constant(mask),
                                    causal=causal, block_size=4)  # 4 query blocks, the last one ragged
    np.testing.assert_allclose(actual.numpy(), desired, rtol=0, atol=atol(dtype))
    assert np.isfinite(actual.numpy()).all()
    monkeypatch.setattr(bw, "_BLOCK_BYTES", 4 * H * tk)  # one batch element and a few queries per block
    actual = bw.blockwise_attention(cast(q), cast(k), cast(v), None if mask is None else tf.constant(mask),
                                    causal=causal)
    np.testing.assert_allclose(actual.numpy(), desired, rtol=0, atol=atol(dtype))
    assert np.isfinite(actual.numpy()).all()


@pytest.mark.parametrize("kind", ["none", "full+causal"])
def test_gradients_match_reference(kind, dtype):
    tq, tk = 13, 9
    q, k, v, g = _inputs(tq, tk, seed=3)
    mask, causal, full = _mask(kind, tq, tk, seed=3)
    _, weights = rn.scaled_dot_product_attention(q, k, v, full)
    desired = attention_backward(q, k, v, weights, g)
    tensors = [tf.constant(a.astype(dtype)) for a in (q, k, v)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = bw.blockwise_attention(*tensors, None if mask is None else tf.constant(mask), causal=causal,
                                     block_size=4)
    actual = tape.gradient(out, tensors, output_gradients=tf.constant(g.astype(dtype)))
    for name, a, d in zip(("q", "k", "v"), actual, desired):
        np.testing.assert_allclose(a.numpy(), d, rtol=0, atol=atol(dtype), err_msg=f"grad {name}")


@pytest.mark.parametrize("mode", ["eager", "function", "xla", "dynamic"])
def test_dispatch_and_tracing(mode):
    """impl="blockwise" through tf_impl's dispatcher, traced every way the benchmarks and models use it."""
    tq, tk = 11, 11
    q, k, v, _ = _inputs(tq, tk, seed=5)
    mask, causal, full = _mask("padded+causal", tq, tk, seed=5)
    desired, _ = rn.scaled_dot_product_attention(q, k, v, full)

    def attend(q, k, v, mask):
        return ta.scaled_dot_product_attention(q, k, v, mask, causal=True, impl="blockwise")[0]
    args = [tf.constant(a.astype("float32")) for a in (q, k, v)] + [tf.constant(mask)]
    if mode == "function":
        attend = tf.function(attend)
    elif mode == "xla":
        attend = tf.function(attend, jit_compile=True)
    elif mode == "dynamic":  # unknown lengths at trace time: one block
        spec = tf.TensorSpec([None, H, None, D], tf.float32)
        attend = tf.function(attend, input_signature=[spec, spec, spec, tf.TensorSpec([None, 1, 1, None], tf.bool)])
    np.testing.assert_allclose(attend(*args).numpy(), desired, rtol=0, atol=atol("float32"))


def test_weights_or_dropout_take_the_explicit_path():
    q = tf.constant(np.random.default_rng(0).standard_normal((1, 2, 5, 4)))
    out, weights = ta.scaled_dot_product_attention(q, q, q, impl="blockwise", need_weights=True)
    assert weights is not None and weights.shape == (1, 2, 5, 5)


def test_block_shape_keeps_scores_small():
    assert bw.block_shape(4, 8, 1024) == (1, 128)  # 8 heads x 128 queries x 1024 keys x 4 bytes = 4 MiB
    assert bw.block_shape(4, 8, 128) == (4, 128)  # short sequences: the whole batch in one block
    assert bw.block_shape(2, 64, 8192) == (1, 16)  # never below 16 queries
    assert bw.block_shape(None, None, 1024) == (1, bw.BLOCK_QUERIES)
    with pytest.raises(ValueError, match="block_size must be >= 1, received 0"):
        bw.blockwise_attention(tf.zeros((1, 1, 2, 2)), tf.zeros((1, 1, 2, 2)), tf.zeros((1, 1, 2, 2)), block_size=0)
