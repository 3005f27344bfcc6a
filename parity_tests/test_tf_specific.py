"""tf_impl component by component against the reference, both attention paths, eager vs tf.function vs XLA,
dropout, weight round trips and input checks (eager and traced)."""

import functools

import numpy as np
import pytest

import reference_numpy as rn

from .conftest import TINY, VARIANTS, weights_for
from .tolerances import atol

tf = pytest.importorskip("tensorflow")  # the frameworks may be absent; our own modules must import, or fail
keras = pytest.importorskip("keras")

import tf_impl as ti  # noqa: E402
from tf_impl.layers import ACTIVATIONS  # noqa: E402
from tf_impl.attention import IMPLS  # noqa: E402

RNG = np.random.default_rng(123)


@functools.lru_cache(maxsize=None)
def built(config: rn.TransformerConfig, dtype: str):
    """A model loaded through weight_table and the float64 reference on the same weights (cached: read-only use)."""
    weights = weights_for(config, dtype=dtype)
    return ti.Transformer.from_reference(config, weights), rn.Transformer(config, weights, np.float64)


def f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


# --- attention ------------------------------------------------------------------------------------------------------

MASKS = {  # name -> (Tq, Tk, mask broadcastable to (B, H, Tq, Tk) or None, causal flag)
    "none": lambda b: (5, 7, None, False),
    "padding": lambda b: (5, 7, rn.attention_mask(np.arange(7)[None] < RNG.integers(1, 8, (b, 1)), 5), False),
    "causal": lambda b: (6, 6, None, True),
    "causal-fewer-queries": lambda b: (3, 6, None, True),
    "causal-more-queries": lambda b: (6, 3, None, True),  # the first 3 queries see no key at all
    "padding-and-causal": lambda b: (5, 5, rn.attention_mask(np.arange(5)[None] < RNG.integers(1, 6, (b, 1)), 5),
                                     True),
    "fully-masked-rows": lambda b: (5, 7, rn.attention_mask(np.arange(7)[None] < np.arange(b)[:, None], 5), False),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("mask_kind", list(MASKS))
def test_attention_paths(impl, mask_kind, dtype):
    tq, tk, mask, causal = MASKS[mask_kind](3)
    q, k, v = (RNG.standard_normal((3, 2, n, 8)).astype(dtype) for n in (tq, tk, tk))
    full_mask = mask if not causal else (rn.causal_mask(tq, tk) if mask is None else mask & rn.causal_mask(tq, tk))
    desired, desired_weights = rn.scaled_dot_product_attention(f64(q), f64(k), f64(v), full_mask)
    out, weights = ti.scaled_dot_product_attention(q, k, v, mask, causal=causal, impl=impl,
                                                   need_weights=impl == "explicit")
    np.testing.assert_allclose(out.numpy(), desired, rtol=0, atol=atol(dtype))
    if impl == "explicit":
        np.testing.assert_allclose(weights.numpy(), desired_weights, rtol=0, atol=atol(dtype))
    if full_mask is not None:  # rows with no visible key: exactly zero, never NaN
        blind = ~np.broadcast_to(full_mask, desired_weights.shape).any(-1)  # (B, H, Tq)
        assert np.isfinite(out.numpy()).all()
        assert not out.numpy()[blind].any()
        assert mask_kind not in ("causal-more-queries", "fully-masked-rows") or blind.any()


def test_attention_rejects_bad_arguments():
    q = tf.zeros((1, 1, 2, 4))
    with pytest.raises(ValueError, match="impl must be one of .* received 'flash'"):
        ti.scaled_dot_product_attention(q, q, q, impl="flash")
    with pytest.raises(TypeError, match=r"mask must be a bool tensor .* received dtype float32"):
        ti.scaled_dot_product_attention(q, q, q, tf.ones((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="impl must be one of .* received 'fused'"):
        ti.Transformer(TINY, attention_impl="fused")


def test_fully_masked_rows_have_finite_gradients():
    """The explicit path never puts an all -inf row through softmax, so no NaN reaches the gradients either."""
    q, k, v = (tf.Variable(RNG.standard_normal((1, 1, 4, 4))) for _ in range(3))
    mask = np.array([True, True, False, False])[None, None, :, None] & np.ones((1, 1, 4, 4), bool)
    with tf.GradientTape() as tape:
        out, _ = ti.scaled_dot_product_attention(q, k, v, mask)
        loss = tf.reduce_sum(out)
    assert all(np.isfinite(g.numpy()).all() for g in tape.gradient(loss, [q, k, v]))


# --- components, loaded through the model's weight_table -------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("tq, tk", [(4, 4), (3, 6)], ids=["self", "cross"])
def test_multi_head_attention(tq, tk, impl, dtype):
    model, reference = built(TINY, dtype)
    mha = model.decoder.layers[1].cross_attn
    x_q, x_kv = RNG.standard_normal((2, tq, 32)).astype(dtype), RNG.standard_normal((2, tk, 32)).astype(dtype)
    mask = rn.attention_mask(np.arange(tk)[None] < np.array([[tk], [2]]), tq)
    desired, desired_weights = rn.MultiHeadAttention(TINY, reference.weights, "decoder.layers.1.cross_attn")(
        f64(x_q), f64(x_kv), mask)
    mha.impl = impl
    try:
        out, weights = mha(x_q, x_kv, mask, need_weights=impl == "explicit")
    finally:
        mha.impl = "explicit"
    np.testing.assert_allclose(out.numpy(), desired, rtol=0, atol=atol(dtype))
    if impl == "explicit":
        np.testing.assert_allclose(weights.numpy(), desired_weights, rtol=0, atol=atol(dtype))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward(activation, dtype):
    config = TINY.replace(activation=activation)
    model, reference = built(config, dtype)
    x = (3 * RNG.standard_normal((2, 5, 32))).astype(dtype)
    np.testing.assert_allclose(model.encoder.layers[0].ffn(x).numpy(),
                               rn.FeedForward(config, reference.weights, "encoder.layers.0.ffn")(f64(x)),
                               rtol=0, atol=atol(dtype))


def test_tf_gelu_would_miss_the_float64_tolerance():
    """Why tf_impl has its own GELU: tf.nn.gelu rounds its 1/sqrt(2) through float32 even for float64 inputs."""
    x = 3 * RNG.standard_normal(10_000)
    desired = rn.ops.gelu(x)
    np.testing.assert_allclose(ACTIVATIONS["gelu"](tf.constant(x)).numpy(), desired, rtol=0, atol=atol("float64"))
    assert np.abs(tf.nn.gelu(x, approximate=False).numpy() - desired).max() > 10 * atol("float64")


@pytest.mark.parametrize("eps", [1e-5, 1e-6], ids=["eps-1e-5", "eps-1e-6"])
def test_layer_norm_uses_the_config_epsilon(eps, dtype):
    config = TINY.replace(layer_norm_eps=eps)
    model, reference = built(config, dtype)
    norm = model.encoder.layers[0].norm1
    assert norm.epsilon == eps
    x = (0.01 * RNG.standard_normal((2, 5, 32)) + 0.5).astype(dtype)  # small variance: epsilon matters
    desired = rn.LayerNorm(config, reference.weights, "encoder.layers.0.norm1")(f64(x))
    np.testing.assert_allclose(norm(x).numpy(), desired, rtol=0, atol=atol(dtype))
    # the porting bug this catches: Keras's default epsilon (1e-3)
    keras_default = keras.layers.LayerNormalization(dtype=dtype)
    keras_default.build(x.shape)
    keras_default.set_weights([w.numpy() for w in (norm.gamma, norm.beta)])
    assert keras_default.epsilon == 1e-3
    assert np.abs(keras_default(x).numpy() - desired).max() > 100 * atol(dtype)


@pytest.mark.parametrize("name", ["post-ln", "pre-ln+final-norm"])
def test_encoder_and_decoder_layers(name, dtype):
    config = VARIANTS[name]
    model, reference = built(config, dtype)
    x, memory = RNG.standard_normal((2, 5, 32)).astype(dtype), RNG.standard_normal((2, 6, 32)).astype(dtype)
    self_mask = rn.attention_mask(np.arange(5)[None] < np.array([[5], [3]]), 5, causal=True)
    cross_mask = rn.attention_mask(np.arange(6)[None] < np.array([[6], [4]]), 5)
    enc_mask = rn.attention_mask(np.arange(5)[None] < np.array([[5], [2]]), 5)
    enc_out, enc_record = model.encoder.layers[1](x, enc_mask)
    record = {}
    desired = rn.EncoderLayer(config, reference.weights, "encoder.layers.1")(f64(x), enc_mask, record)
    np.testing.assert_allclose(enc_out.numpy(), desired, rtol=0, atol=atol(dtype))
    for sublayer in ("self_attn", "ffn"):
        np.testing.assert_allclose(enc_record[sublayer].numpy(), record[f"encoder.layers.1.{sublayer}"], rtol=0,
                                   atol=atol(dtype), err_msg=sublayer)
    dec_out, _ = model.decoder.layers[0](x, memory, self_mask, cross_mask)
    desired = rn.DecoderLayer(config, reference.weights, "decoder.layers.0")(f64(x), f64(memory), self_mask,
                                                                              cross_mask)
    np.testing.assert_allclose(dec_out.numpy(), desired, rtol=0, atol=atol(dtype))


# --- the model ------------------------------------------------------------------------------------------------------

def test_float64_computes_in_float64_everywhere():
    model, _ = built(VARIANTS["gelu"].replace(final_norm=True), "float64")
    src, tgt = rn.sample_batch(model.config, 2, 6, 5)
    assert {v.dtype for v in model.weights} == {"float64"}
    assert {layer.compute_dtype for layer in model._flatten_layers()} == {"float64"}
    assert {v.dtype for v in model.trace(src, tgt, attention_weights=True).values()} == {tf.float64}


def test_encode_decode_equal_the_call():
    model, _ = built(TINY, "float32")
    src, tgt = rn.sample_batch(TINY, 2, 9, 7)
    logits = model.decode(tgt, model.encode(src), src != TINY.pad_id)
    np.testing.assert_array_equal(logits.numpy(), model(src, tgt).numpy())


def test_attention_impls_agree_in_the_model():
    weights = weights_for(TINY)
    src, tgt = rn.sample_batch(TINY, 2, 9, 7)
    explicit = ti.Transformer.from_reference(TINY, weights, attention_impl="explicit")(src, tgt)
    fused = ti.Transformer.from_reference(TINY, weights, attention_impl="keras")(src, tgt)
    np.testing.assert_allclose(fused.numpy(), explicit.numpy(), rtol=0, atol=atol("float32"))


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_eager_function_and_xla_agree(impl, dtype):
    config = VARIANTS["pre-ln+final-norm"]
    weights = weights_for(config, dtype=dtype)
    model = ti.Transformer.from_reference(config, weights, attention_impl=impl)
    src, tgt = rn.sample_batch(config, 3, 9, 7, seed=2)
    desired = rn.Transformer(config, weights).trace(src, tgt, attention_weights=True)
    run = lambda s, t: model.trace(s, t, attention_weights=True)  # noqa: E731
    for mode, fn in {"eager": run, "tf.function": tf.function(run),
                     "jit_compile": tf.function(run, jit_compile=True)}.items():
        traced = fn(src, tgt)
        assert list(traced) == list(desired), mode
        for name, value in desired.items():
            np.testing.assert_allclose(traced[name].numpy(), value, rtol=0, atol=atol(dtype), err_msg=f"{mode} {name}")


def test_traced_with_dynamic_shapes_and_encoder_only():
    config = VARIANTS["encoder-only"]
    model, reference = built(config, "float64")
    fn = tf.function(lambda s: model(s), input_signature=[tf.TensorSpec((None, None), tf.int64)])
    for batch, length in ((2, 9), (1, 4)):
        src, _ = rn.sample_batch(config, batch, length, 1, seed=length)
        np.testing.assert_allclose(fn(src).numpy(), reference(src), rtol=0, atol=atol("float64"))


def test_dropout_is_active_in_training_only():
    config = TINY.replace(dropout=0.3)
    weights = weights_for(config)
    model = ti.Transformer.from_reference(config, weights)
    src, tgt = rn.sample_batch(config, 2, 9, 7)
    train = tf.function(lambda s, t: model(s, t, training=True))
    for mode, fn in {"eager": lambda s, t: model(s, t, training=True), "tf.function": train}.items():
        a, b = fn(src, tgt).numpy(), fn(src, tgt).numpy()
        assert not np.array_equal(a, b), mode
    c, d = model(src, tgt).numpy(), model(src, tgt, training=False).numpy()
    np.testing.assert_array_equal(c, d)
    np.testing.assert_allclose(c, rn.Transformer(config, weights)(src, tgt), rtol=0, atol=atol("float32"))


@pytest.mark.parametrize("site", ["embedding", "attention-weights", "ffn-inner", "residual"])
def test_each_dropout_site_is_active(site):
    config = TINY.replace(dropout=0.5, num_encoder_layers=1, num_decoder_layers=1)
    model = ti.Transformer.from_reference(config, weights_for(config))
    x = RNG.standard_normal((2, 6, 32)).astype(np.float32)
    ids = rn.sample_ids(config, 2, 6, config.src_vocab_size, seed=1)
    layer = model.encoder.layers[0]
    run = {"embedding": lambda training: model.src_embed(ids, training=training),
           "attention-weights": lambda training: layer.self_attn(x, x, training=training)[0],
           "ffn-inner": lambda training: layer.ffn(x, training=training),
           "residual": lambda training: layer.dropout(x, training=training)}[site]
    assert not np.array_equal(run(True).numpy(), run(True).numpy())
    np.testing.assert_array_equal(run(False).numpy(), run(False).numpy())


def test_gradients_reach_every_weight():
    model = ti.Transformer.from_reference(TINY, weights_for(TINY))
    src, tgt = rn.sample_batch(TINY, 2, 9, 7)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(src, tgt, training=True))
    grads = tape.gradient(loss, model.trainable_weights)
    assert len(grads) == len(model.weights)
    assert all(g is not None and np.abs(tf.convert_to_tensor(g).numpy()).sum() > 0 for g in grads)


# --- weights --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(VARIANTS))
def test_round_trip_is_bit_identical(name, dtype):
    weights = weights_for(VARIANTS[name], dtype=dtype)
    model = ti.Transformer.from_reference(VARIANTS[name], weights)
    assert model.compute_dtype == dtype
    back = model.to_reference()
    assert back.keys() == weights.keys()
    for key, value in weights.items():
        assert back[key].dtype == value.dtype and back[key].tobytes() == value.tobytes(), key


def test_variable_paths_do_not_depend_on_how_the_model_was_built():
    """Built by from_reference, or lazily by a first call, or twice in one process: the same paths."""
    src, tgt = rn.sample_batch(TINY, 1, 4, 3)
    lazy = ti.Transformer(TINY)
    lazy(src, tgt)
    loaded, _ = built(TINY, "float32")
    again = ti.Transformer.from_reference(TINY, weights_for(TINY))
    paths = [sorted(m._variables()) for m in (lazy, loaded, again)]
    assert paths[0] == paths[1] == paths[2]
    assert "encoder/layers_1/self_attn/q/kernel" in paths[0]
    np.testing.assert_array_equal(again(src, tgt).numpy(), loaded(src, tgt).numpy())


def test_get_config_round_trip():
    model = ti.Transformer(VARIANTS["tied"], dtype="float64", attention_impl="keras")
    clone = ti.Transformer.from_config(model.get_config())
    assert (clone.config, clone.compute_dtype, clone.attention_impl) == (model.config, "float64", "keras")
    layer = ti.EncoderLayer(TINY, "keras", name="layers_0", dtype="float64")
    assert ti.EncoderLayer.from_config(layer.get_config()).get_config() == layer.get_config()


def test_a_layer_given_the_wrong_width_says_so():
    with pytest.raises(ValueError, match=r"ffn: x must have shape \(batch, length, d_model=32\), received shape "
                                         r"\(2, 5, 16\)"):
        ti.FeedForward(TINY, name="ffn")(np.zeros((2, 5, 16), np.float32))


# --- input checks ---------------------------------------------------------------------------------------------------

SRC, TGT = rn.sample_batch(TINY, 2, 11, 9)


def with_id(ids: np.ndarray, token: int) -> np.ndarray:
    ids = ids.copy()
    ids[1, 2] = token
    return ids


BAD_INPUTS = {
    "rank": (dict(src_ids=SRC[0], tgt_ids=TGT), ValueError,
             r"src_ids must have shape \(batch, length\), received shape \(11,\)"),
    "float-ids": (dict(src_ids=SRC.astype(np.float64), tgt_ids=TGT), TypeError,
                  "src_ids must hold integer token ids, received dtype float64"),
    "id-above-vocab": (dict(src_ids=with_id(SRC, 48), tgt_ids=TGT), ValueError,
                       r"src_ids holds token id 48, outside the vocabulary \[0, 48\)"),
    "negative-id": (dict(src_ids=SRC, tgt_ids=with_id(TGT, -2)), ValueError,
                    r"tgt_ids holds token id -2, outside the vocabulary \[0, 40\)"),
    "too-long": (dict(src_ids=np.ones((2, 65), np.int64), tgt_ids=TGT), ValueError,
                 "src_ids has length 65, longer than max_len=64"),
    "batch-mismatch": (dict(src_ids=SRC, tgt_ids=TGT[:1]), ValueError,
                       "src_ids and tgt_ids have different batch sizes: 2 and 1"),
    "no-target": (dict(src_ids=SRC), ValueError, "needs tgt_ids, received None"),
    "mask-dtype": (dict(src_ids=SRC, tgt_ids=TGT, src_mask=np.ones(SRC.shape, np.int32)), TypeError,
                   r"src_mask must be a bool array \(True = real token\), received dtype int32"),
    "mask-shape": (dict(src_ids=SRC, tgt_ids=TGT, tgt_mask=np.ones((2, 3), bool)), ValueError,
                   r"tgt_mask must have the shape of the ids \(2, 9\), received \(2, 3\)"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_eagerly(case):
    inputs, error, message = BAD_INPUTS[case]
    model, _ = built(TINY, "float32")
    kwargs = dict(inputs)
    src = kwargs.pop("src_ids")
    with pytest.raises(error, match=message):
        model(src, **kwargs)


STATIC = ["rank", "float-ids", "too-long", "batch-mismatch", "mask-dtype", "mask-shape"]


@pytest.mark.parametrize("case", STATIC)
def test_bad_input_inside_tf_function_is_caught_statically(case):
    """Inside tf.function only shapes and dtypes are known; those checks still run, with the same texts."""
    inputs, error, message = BAD_INPUTS[case]
    model, _ = built(TINY, "float32")
    fn = tf.function(lambda kwargs: model(kwargs["src_ids"], kwargs["tgt_ids"], src_mask=kwargs.get("src_mask"),
                                          tgt_mask=kwargs.get("tgt_mask")))
    with pytest.raises(error, match=message):
        fn({k: tf.constant(v) for k, v in inputs.items()})


def test_encoder_only_model_refuses_a_target():
    model, _ = built(VARIANTS["encoder-only"], "float32")
    with pytest.raises(ValueError, match=r"encoder-only model \(num_decoder_layers=0\) takes source ids alone"):
        model(SRC, TGT)


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype must be one of .* received 'int32'"):  # float16: reduced precision
        ti.Transformer(TINY, dtype="int32")
