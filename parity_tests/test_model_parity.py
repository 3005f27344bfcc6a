"""Model-level parity: every framework twin, every variant, both dtypes, every sublayer output against the float64
NumPy reference as `desired`, within K measured rounding floors of that sublayer (the verify rule,
`transformer_parity.tolerances`)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference_numpy as rn

from .conftest import TINY, VARIANTS, weights_for
from transformer_parity import verify

from . import tolerances
from .tolerances import assert_within_floor, property_atol


def assert_traces_match(actual: dict, desired: dict, dtype, floor_run: dict) -> None:
    """Same sublayer names in the same order, and each output within K floors of the reference (`floor_run`: the
    NumPy reference in float32 on the same weights and inputs)."""
    assert_within_floor(actual, desired, floor_run, dtype)


def reference_trace(config, weights, src, tgt, dtype=np.float64, **kwargs):
    return rn.Transformer(config, weights, dtype).trace(src, tgt, **kwargs)


def floor_trace(config, weights, src, tgt, **kwargs):
    """The float32 run that measures each sublayer's rounding floor."""
    return reference_trace(config, weights, src, tgt, np.float32, **kwargs)


def test_every_variant_every_sublayer(backend, variant, dtype):
    weights = weights_for(variant, dtype=dtype)
    src, tgt = rn.sample_batch(variant, batch=3, src_len=9, tgt_len=7, seed=5)
    model = backend.build(variant, weights, dtype)
    traced = backend.trace(model, src, tgt)
    assert_traces_match(traced, reference_trace(variant, weights, src, tgt), dtype,
                        floor_trace(variant, weights, src, tgt))
    assert all(v.dtype == np.dtype(dtype) for v in traced.values())
    np.testing.assert_array_equal(backend.logits(model, src, tgt), traced["logits"])


AWKWARD = {
    "batch1-len1": (1, 1, 1),
    "src-longer": (2, 13, 3),
    "tgt-longer": (2, 3, 13),
    "max-len": (2, 64, 64),
}


@pytest.mark.parametrize("shape", list(AWKWARD.values()), ids=list(AWKWARD))
def test_awkward_shapes(backend, shape, dtype):
    batch, src_len, tgt_len = shape
    weights = weights_for(TINY, dtype=dtype)
    src, tgt = rn.sample_batch(TINY, batch, src_len, tgt_len, seed=7)
    traced = backend.trace(backend.build(TINY, weights, dtype), src, tgt)
    assert_traces_match(traced, reference_trace(TINY, weights, src, tgt), dtype, floor_trace(TINY, weights, src, tgt))


def test_heavy_and_left_padding_with_fully_masked_rows(backend, dtype):
    """Left padding makes the first decoder queries see no key at all: the documented rule (zero attention
    output) must hold in every backend, and attention weights must agree too."""
    weights = weights_for(TINY, dtype=dtype)
    pad = TINY.pad_id
    src = np.array([[5, 6, 7, 8, 9, 10], [11, pad, pad, pad, pad, pad], [pad] * 6])
    tgt = np.array([[pad, pad, pad, 4, 5], [3, pad, pad, pad, pad], [pad, pad, pad, pad, 9]])
    traced = backend.trace(backend.build(TINY, weights, dtype), src, tgt, attention_weights=True)
    desired = reference_trace(TINY, weights, src, tgt, attention_weights=True)
    assert_traces_match(traced, desired, dtype, floor_trace(TINY, weights, src, tgt, attention_weights=True))
    assert not desired["decoder.layers.0.self_attn.weights"][0, :, :3].any()  # queries 0-2 of row 0 see nothing
    assert not desired["encoder.layers.0.self_attn.weights"][2].any()  # an all-padding source row
    assert all(np.isfinite(v).all() for v in traced.values())


def test_explicit_masks_equal_derived_masks(backend):
    weights = weights_for(TINY)
    src, tgt = rn.sample_batch(TINY, 2, 6, 5, seed=3)
    model = backend.build(TINY, weights, "float32")
    np.testing.assert_array_equal(
        backend.logits(model, src, tgt, src_mask=src != TINY.pad_id, tgt_mask=tgt != TINY.pad_id),
        backend.logits(model, src, tgt))
    # a mask that hides more than the padding changes the result, exactly as in the reference
    src_mask = src != TINY.pad_id
    src_mask[0, 0] = False
    desired = rn.Transformer(TINY, weights, np.float64)(src, tgt, src_mask=src_mask)
    floor = tolerances.floor(rn.Transformer(TINY, weights, np.float32)(src, tgt, src_mask=src_mask), desired)
    assert not np.allclose(desired, rn.Transformer(TINY, weights, np.float64)(src, tgt), rtol=0, atol=floor)
    np.testing.assert_allclose(backend.logits(model, src, tgt, src_mask=src_mask), desired, rtol=0,
                               atol=tolerances.floor_atol(floor))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_round_trip_is_bit_identical(backend, name, dtype):
    weights = weights_for(VARIANTS[name], dtype=dtype)
    back = backend.build(VARIANTS[name], weights, dtype).to_reference()
    assert back.keys() == weights.keys()
    for key, value in weights.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert back[key].tobytes() == value.tobytes(), key


def test_dtype_argument_overrides_the_weights(backend):
    weights = weights_for(TINY, dtype=np.float32)
    src, tgt = rn.sample_batch(TINY, 2, 5, 4)
    traced = backend.trace(backend.build(TINY, weights, "float64"), src, tgt)
    assert traced["logits"].dtype == np.float64
    assert_traces_match(traced, reference_trace(TINY, weights, src, tgt), "float64",
                        floor_trace(TINY, weights, src, tgt))


@pytest.mark.parametrize("src, tgt, error, message", [
    (np.zeros((2, 3, 1), np.int64), np.ones((2, 3), np.int64), ValueError,
     r"src_ids must have shape \(batch, length\), received shape \(2, 3, 1\)"),
    (np.ones((2, 3), np.float32), np.ones((2, 3), np.int64), TypeError, "src_ids must hold integer token ids"),
    (np.ones((2, 3), np.int64), np.full((2, 3), 40), ValueError, r"tgt_ids holds token id 40, outside .*\[0, 40\)"),
    (np.ones((2, 65), np.int64), np.ones((2, 3), np.int64), ValueError, r"length 65, longer than max_len=64"),
    (np.ones((2, 3), np.int64), np.ones((3, 3), np.int64), ValueError, r"different batch sizes: 2 and 3"),
    (np.ones((2, 3), np.int64), None, ValueError, r"needs tgt_ids, received None"),
], ids=["rank", "dtype", "vocab", "max-len", "batch", "no-target"])
def test_bad_input_is_named_like_the_reference(backend, src, tgt, error, message):
    model = backend.build(TINY, rn.init_weights(TINY, 0), "float32")
    with pytest.raises(error, match=message):
        backend.logits(model, src, tgt)


def test_weights_that_do_not_fit_the_config_are_refused(backend):
    weights = rn.init_weights(TINY, 0)
    with pytest.raises(ValueError, match=r"src_embed.embedding has shape \(48, 32\), expected \(50, 32\)"):
        backend.build(TINY.replace(src_vocab_size=50), weights, "float32")
    del weights["decoder.layers.1.norm3.beta"]
    with pytest.raises(ValueError, match=r"missing 1 parameter\(s\): decoder.layers.1.norm3.beta"):
        backend.build(TINY, weights, "float32")


@pytest.mark.slow
def test_base_preset_every_sublayer_in_float64(backend, base_case):
    """The acceptance case: base preset, seed 0, batch 2, lengths 37/29 with padding in both, every bias and
    LayerNorm parameter drawn away from its initial 0 or 1 (a dropped bias or a swapped gamma would show). In float32
    this is exactly the README's headline `transformer-parity verify` (same weights, inputs and rule), which
    test_first_use.py runs in the fast suite; float64 here."""
    config, weights, src, tgt, desired, floor_run = base_case
    traced = backend.trace(backend.build(config, weights, "float64"), src, tgt)
    assert_traces_match(traced, desired, "float64", floor_run)


@pytest.fixture(scope="module")
def base_case():
    config = rn.TransformerConfig.preset("base")
    weights = verify.seeded_weights(config, 0)
    assert all(w.any() for k, w in weights.items() if k.endswith((".bias", ".beta")))
    assert all((w != 1).any() for k, w in weights.items() if k.endswith(".gamma"))
    src, tgt = rn.sample_batch(config, batch=2, src_len=37, tgt_len=29, seed=0)
    assert (src == config.pad_id).any() and (tgt == config.pad_id).any() and (src == 0).any()
    return config, weights, src, tgt, reference_trace(config, weights, src, tgt), floor_trace(config, weights, src, tgt)


@st.composite
def small_configs(draw):
    heads = draw(st.sampled_from([1, 2, 4]))
    return rn.TransformerConfig(
        src_vocab_size=draw(st.integers(2, 20)), tgt_vocab_size=draw(st.integers(2, 20)),
        d_model=heads * draw(st.sampled_from([2, 4, 8])), num_heads=heads,
        num_encoder_layers=draw(st.integers(1, 2)), num_decoder_layers=draw(st.integers(0, 2)),
        d_ff=draw(st.integers(1, 24)), max_len=16, dropout=0.0,
        activation=draw(st.sampled_from(["relu", "gelu"])), norm_first=draw(st.booleans()),
        final_norm=draw(st.booleans()), layer_norm_eps=draw(st.sampled_from([1e-5, 1e-6, 1e-3])),
        positional=draw(st.sampled_from(["sinusoidal", "learned"])),
        sinusoid_layout=draw(st.sampled_from(["interleaved", "concatenated"])),
        scale_embedding=draw(st.booleans()), bias=draw(st.booleans()), tie_embeddings=False, pad_id=1)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=small_configs(), batch=st.integers(1, 3), src_len=st.integers(1, 16), tgt_len=st.integers(1, 16),
       seed=st.integers(0, 2 ** 16), dtype=st.sampled_from(["float32", "float64"]))
def test_random_configs_and_shapes(backend, config, batch, src_len, tgt_len, seed, dtype):
    weights = weights_for(config, seed=seed, dtype=dtype)
    src, tgt = rn.sample_batch(config, batch, src_len, tgt_len, seed=seed)
    model = backend.build(config, weights, dtype)
    desired = reference_trace(config, weights, src, tgt)
    floor = verify.floors(desired, rn.Transformer(config, weights, np.float32).trace(src, tgt), dtype)
    actual = backend.trace(model, src, tgt)
    assert list(actual) == list(desired)
    for name, value in desired.items():
        np.testing.assert_allclose(actual[name], value, rtol=0, atol=property_atol(dtype, floor[name]),
                                   err_msg=f"sublayer {name}, float32 floor {floor[name]:.2e}")
    back = model.to_reference()
    assert all(back[k].tobytes() == weights[k].tobytes() for k in weights)
