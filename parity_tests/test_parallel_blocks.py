"""The building blocks of the parallel-residual decoders (GPT-NeoX, GPT-J, Phi) in the canonical model: attention
and feed-forward side by side on one residual (`parallel_residual`), with one norm for both (`ffn_shares_norm`) or
two, and rotary positions on adjacent dim pairs (`rotary_interleaved`, GPT-J's `rotate_every_two`) over part of
each head.

Checked as the Gemma blocks are: the config refuses what is invalid, naming the field and the value; the math is
what the formula says; both twins equal the float64 reference at every sublayer within K measured floors (6 query
over 2 key/value heads of 16, id 0 in the inputs), whole and block by block bit for bit; an export to a family
without the blocks is refused naming the field. The families themselves are judged against transformers in
test_llm_families.py, greedy decoding with and without the key/value cache in both twins included (GPT-NeoX's two
norms, Phi's shared one, GPT-J's and CodeGen's shared one with interleaved positions)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity.verify import seeded_weights

from .test_model_parity import assert_traces_match, floor_trace, reference_trace
from .test_streamed_verify import assert_blocks_are_the_whole_model

VOCAB = 53
BASE = rn.TransformerConfig(
    src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=48, num_heads=6, num_kv_heads=2, head_size=16,
    num_encoder_layers=0, num_decoder_layers=2, d_ff=37, max_len=64, dropout=0.0, activation="gelu_tanh",
    norm_first=True, final_norm=True, positional="rope", rotary_fraction=0.5, scale_embedding=False, pad_id=None,
    parallel_residual=True)
CONFIGS = {
    "two-norms": BASE,  # GPT-NeoX's use_parallel_residual
    "shared-norm+interleaved": BASE.replace(ffn_shares_norm=True, rotary_interleaved=True),  # GPT-J
    "interleaved-sequential": BASE.replace(parallel_residual=False, rotary_interleaved=True, rotary_fraction=1.0),
}


def ids(seed: int = 0, length: int = 11) -> np.ndarray:
    out = np.random.default_rng(seed).integers(0, VOCAB, size=(2, length))
    out[0, 3] = out[1, 0] = 0
    return out


@pytest.mark.parametrize("changes, message", [
    ({"parallel_residual": 1}, r"parallel_residual must be a bool, received 1"),
    ({"ffn_shares_norm": "yes"}, r"ffn_shares_norm must be a bool, received 'yes'"),
    ({"rotary_interleaved": 0}, r"rotary_interleaved must be a bool, received 0"),
    ({"norm_first": False}, r"parallel_residual=True .* received norm_first=False"),
    ({"num_encoder_layers": 1}, r"parallel_residual=True .* num_encoder_layers=1"),
    ({"parallel_residual": False, "ffn_shares_norm": True},
     r"ffn_shares_norm=True .* needs parallel_residual=True, received parallel_residual=False"),
    ({"positional": "learned", "rotary_fraction": 1.0, "rotary_interleaved": True},
     r"rotary_interleaved=True .* needs positional='rope', received positional='learned'"),
])
def test_config_refuses_each_invalid_value_naming_it(changes, message):
    with pytest.raises(ValueError, match=message):
        BASE.replace(**changes)


def test_fields_round_trip_and_the_shared_norm_has_no_norm3():
    config = CONFIGS["shared-norm+interleaved"]
    assert rn.TransformerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    names = set(rn.parameter_shapes(config))
    assert "decoder.layers.1.norm1.gamma" in names and not any(".norm3." in n for n in names)
    assert {n for n in rn.parameter_shapes(BASE) if ".norm3." in n} == {
        f"decoder.layers.{i}.norm3.{leaf}" for i in range(2) for leaf in ("gamma", "beta")}
    assert config.ffn_norm == "norm1" and BASE.ffn_norm == "norm3"


def test_the_layer_is_x_plus_attention_plus_feed_forward():
    """One layer by hand from the reference's own pieces: x + attn(n1(x)) + ffn(n3(x)), or ffn(n1(x)) shared."""
    for name in ("two-norms", "shared-norm+interleaved"):
        config = CONFIGS[name]
        weights = seeded_weights(config, 1, np.float64)
        x = np.random.default_rng(2).standard_normal((2, 7, 48))
        layer = rn.DecoderLayer(config, weights, "decoder.layers.0")
        mask = rn.ops.attention_mask(np.ones((2, 7), bool), 7, causal=True)
        n1 = rn.LayerNorm(config, weights, "decoder.layers.0.norm1")(x)
        n3 = n1 if config.ffn_shares_norm else rn.LayerNorm(config, weights, "decoder.layers.0.norm3")(x)
        attn, _ = rn.MultiHeadAttention(config, weights, "decoder.layers.0.self_attn", rotary=True)(n1, n1, mask)
        ffn = rn.FeedForward(config, weights, "decoder.layers.0.ffn")(n3)
        record: dict = {}
        np.testing.assert_array_equal(layer(x, None, mask, None, record), x + attn + ffn)
        assert list(record) == ["decoder.layers.0.self_attn", "decoder.layers.0.ffn", "decoder.layers.0"]


def test_interleaved_rotation_is_the_half_split_one_on_permuted_dims():
    """Turning adjacent pairs (2j, 2j + 1) is turning (j, j + r/2) once the rotating dims are ordered evens first,
    odds next; the dims past `rotary_dim` pass through either way."""
    x = np.random.default_rng(3).standard_normal((2, 3, 9, 16))
    inv_freq = 1.0 / 10000 ** (np.arange(0, 8, 2) / 8)
    positions = np.arange(4, 13)
    order = np.r_[np.arange(0, 8, 2), np.arange(1, 8, 2), np.arange(8, 16)]  # evens, odds, then the rest
    interleaved = rn.ops.apply_rope(x, positions, inv_freq, 1.0, 8, interleaved=True)
    half = rn.ops.apply_rope(x[..., order], positions, inv_freq, 1.0, 8)
    np.testing.assert_allclose(interleaved[..., order], half, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(interleaved[..., 8:], x[..., 8:])
    angle = 5 * inv_freq[1]  # pair 1 = dims 2, 3 at position 5
    turned = rn.ops.apply_rope(x[..., :1, :], np.array([5]), inv_freq, 1.0, 8, interleaved=True)
    np.testing.assert_allclose(turned[..., 2], x[..., :1, 2] * np.cos(angle) - x[..., :1, 3] * np.sin(angle),
                               rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", ["two-norms", "shared-norm+interleaved"])
def test_twins_equal_the_reference_every_sublayer(backend, name, dtype):
    config = CONFIGS[name]
    weights = seeded_weights(config, 6, dtype)
    model = backend.build(config, weights, dtype)
    traced = backend.trace(model, ids(), None)
    assert_traces_match(traced, reference_trace(config, weights, ids(), None),
                        dtype, floor_trace(config, weights, ids(), None))
    back = backend.to_reference(model)
    assert back.keys() == weights.keys() and all(back[k].tobytes() == weights[k].tobytes() for k in weights)


def test_blocks_compute_what_the_whole_model_computes():
    config = CONFIGS["shared-norm+interleaved"]
    assert_blocks_are_the_whole_model(config, seeded_weights(config, 3),
                                      [("numpy", "float64"), ("torch", "float32"), ("keras", "float64")], ids())


@pytest.mark.parametrize("name, field", [("two-norms", "parallel_residual"),
                                         ("interleaved-sequential", "rotary_interleaved")])
def test_no_family_without_these_blocks_takes_them_silently(name, field, tmp_path):
    from transformer_parity import formats
    from transformer_parity.errors import UsageError

    config = CONFIGS[name]
    with pytest.raises((UsageError, ValueError), match=field):
        formats.save(tmp_path / "out", config, rn.init_weights(config, 0), "hf-llama")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("backend", ["torch", "keras"])
def test_a_bfloat16_port_passes_the_reduced_precision_judge(backend):
    """The reference's bfloat16 ops round the parallel sum as the twins do (x + attn, then + ffn, each rounded) and
    turn adjacent pairs in float32: each twin in bfloat16 passes, really away from float32."""
    from transformer_parity.verify import Subject, lowp

    from .test_lowp import judge

    config = CONFIGS["shared-norm+interleaved"]
    weights = seeded_weights(config, 3)
    report = judge(config, weights, Subject(backend, backend, config, weights), seed=3)
    assert report.passed, report.first_divergence
    assert {r.limit for r in report.rows} == {lowp.RATIO_LIMIT} and report.max_ratio() > 0.1


@pytest.mark.parametrize("name", ["two-norms", "shared-norm+interleaved"])
def test_float64_gradients_torch_vs_keras(name):
    """Training goes through the same blocks: the Keras twin's float64 gradients (every parameter, no norm3 under a
    shared norm) and loss equal torch's, as for every variant (test_gradients.py)."""
    from .support.training_parity import batch_for
    from .test_gradients import GRADIENT_RTOL, gradient_errors, loss_and_gradients
    from .tolerances import atol

    config = CONFIGS[name]
    weights = seeded_weights(config, 2, np.float64)
    batch = batch_for(config)
    desired_loss, desired = loss_and_gradients("torch", config, weights, batch, 0.1)
    loss, actual = loss_and_gradients("tf", config, weights, batch, 0.1)
    assert sorted(actual) == sorted(rn.parameter_shapes(config))
    errors = gradient_errors(actual, desired)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRADIENT_RTOL["float64"], f"{worst}: {errors[worst]:.3g}"
    np.testing.assert_allclose(loss, desired_loss, rtol=0, atol=atol("float64"))
