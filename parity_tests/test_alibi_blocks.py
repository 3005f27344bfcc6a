"""ALiBi in the canonical model (BLOOM, Falcon with `alibi`): a bias slope_h * j on head h's score for key position
j, added beside the scaled scores (`alibi`) or before the scaling, so scaled with them (`alibi_scaled`), the model's
only positions (`positional="none"`).

Checked as the Gemma and parallel blocks are: the config refuses what is invalid, naming the field and the value; the
slopes are the libraries' (6 heads: the closest power of two's, then every other of twice as many); a left-padded
row computes what the same tokens compute unpadded (softmax does not see a constant per row, so counting positions
over the real tokens, as transformers does, changes nothing); both twins equal the float64 reference at every
sublayer within K measured floors, whole and block by block bit for bit, and decode with their caches as the
reference recomputes; an export to a family without ALiBi is refused naming the field. The families themselves are
judged against transformers in test_llm_families.py and test_task_heads.py, and against keras_hub in
test_kerashub_llm.py and test_hf_to_kerashub.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity.verify import seeded_weights

from .test_model_parity import assert_traces_match, floor_trace, reference_trace
from .test_streamed_verify import assert_blocks_are_the_whole_model
from .tolerances import atol

VOCAB = 53
BASE = rn.TransformerConfig(
    src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=96, num_heads=6, num_encoder_layers=0, num_decoder_layers=2,
    d_ff=37, max_len=64, dropout=0.0, activation="gelu_tanh", norm_first=True, final_norm=True, positional="none",
    alibi=True, scale_embedding=False, embed_norm=True, pad_id=None, tie_embeddings=True, output_bias=False)
CONFIGS = {
    "unscaled": BASE,  # BLOOM's: beside the scaled scores
    "scaled+parallel": BASE.replace(alibi_scaled=True, parallel_residual=True, ffn_shares_norm=True, embed_norm=False,
                                    num_kv_heads=2),  # Falcon's: before the scaling, on grouped heads
    # transformers' Falcon: slopes and biases in bfloat16, which 12 heads' slopes (2^(-1/2), ...) are not
    "bfloat16": BASE.replace(num_heads=12, alibi_scaled=True, alibi_bfloat16=True, embed_norm=False),
}


def ids(seed: int = 0, length: int = 11) -> np.ndarray:
    out = np.random.default_rng(seed).integers(0, VOCAB, size=(2, length))
    out[0, 3] = out[1, 0] = 0
    return out


@pytest.mark.parametrize("changes, message", [
    ({"alibi": 1}, r"alibi must be a bool, received 1"),
    ({"alibi_scaled": "yes"}, r"alibi_scaled must be a bool, received 'yes'"),
    ({"positional": "rope"}, r"alibi=True .* positional='none', received num_encoder_layers=0, positional='rope'"),
    ({"num_encoder_layers": 1}, r"alibi=True .* received num_encoder_layers=1"),
    ({"alibi": False}, r"positional='none' .* needs alibi=True, relative_terms or relative_bias_buckets, received alibi=False"),
    ({"alibi": False, "positional": "learned", "alibi_scaled": True},
     r"alibi_scaled=True .* needs alibi=True, received alibi=False"),
    ({"alibi": False, "positional": "learned", "alibi_bfloat16": True},
     r"alibi_bfloat16=True .* needs alibi=True, received alibi=False"),
])
def test_config_refuses_each_invalid_value_naming_it(changes, message):
    with pytest.raises(ValueError, match=message):
        BASE.replace(**changes)


def test_fields_round_trip_and_add_no_weights():
    config = CONFIGS["scaled+parallel"]
    assert rn.TransformerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert not any("pos" in name for name in rn.parameter_shapes(BASE))
    assert config.alibi_factor == 0.25 and BASE.alibi_factor == 1.0  # 1 / sqrt(16)
    # bfloat16 rounds no power-of-two slope (up to 8 heads) times a position below 256: stored as exact
    assert not BASE.replace(alibi_bfloat16=True).alibi_bfloat16
    assert BASE.replace(alibi_bfloat16=True, max_len=257).alibi_bfloat16 and CONFIGS["bfloat16"].alibi_bfloat16


def test_the_bfloat16_bias_is_transformers_falcons():
    """`build_alibi_tensor` of transformers' Falcon (bfloat16 slopes times the positions, in bfloat16) over 300
    positions: 12 heads (slopes not powers of two) and 6 heads past 256 positions."""
    torch = pytest.importorskip("torch")
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    for heads in (12, 6):
        config = BASE.replace(num_heads=heads, alibi_bfloat16=True, max_len=300)
        theirs = build_alibi_tensor(torch.ones(1, 300, dtype=torch.long), heads, torch.float64).numpy()  # (H, 1, T)
        np.testing.assert_array_equal(rn.alibi.bias(config, 300), theirs)
        assert np.abs(rn.alibi.bias(config.replace(alibi_bfloat16=False), 300) - theirs).max() > 1e-3


@pytest.mark.parametrize("heads", [1, 5, 6, 16, 40, 71])
def test_slopes_are_the_libraries(heads):
    """transformers' `_get_alibi_slopes` (float32 powers, a few float32 ulps off where the slopes are not powers of
    two: 0.25000003 for head 16 of 16; exact for 6 heads) and keras_hub's `AlibiBias` (Python floats)."""
    torch = pytest.importorskip("torch")
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    slopes = rn.alibi.slopes(heads)
    np.testing.assert_allclose(_get_alibi_slopes(heads, torch.device("cpu")).double().numpy(), slopes, rtol=1e-6)
    if heads == 6:
        np.testing.assert_array_equal(slopes, [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3])
    keras_hub = pytest.importorskip("keras_hub")
    np.testing.assert_allclose(keras_hub.layers.AlibiBias()._get_slopes(heads), slopes, rtol=1e-14)


def test_the_bias_is_slope_times_key_position_on_the_scaled_scores():
    """One attention by hand: softmax(q k^T / sqrt(d) + factor * slope_h * j) v."""
    for config in (CONFIGS["unscaled"], CONFIGS["scaled+parallel"]):
        weights = seeded_weights(config, 1, np.float64)
        x = np.random.default_rng(2).standard_normal((2, 7, 96))
        mask = rn.ops.attention_mask(np.ones((2, 7), bool), 7, causal=True)
        _, probs = rn.MultiHeadAttention(config, weights, "decoder.layers.0.self_attn")(x, x, mask)
        p = "decoder.layers.0.self_attn"
        q, k = (rn.ops.split_heads(x @ weights[f"{p}.{n}.kernel"] + weights[f"{p}.{n}.bias"], h)
                for n, h in (("q", 6), ("k", config.kv_heads)))
        k = rn.ops.repeat_kv(k, 6 // config.kv_heads)
        slopes = (0.25 if config.alibi_scaled else 1.0) * rn.alibi.slopes(6)
        scores = q @ np.swapaxes(k, -1, -2) / 4.0 + slopes[:, None, None] * np.arange(7)  # (B, H, T, T)
        scores = np.where(mask, scores, -np.inf)
        want = np.exp(scores - scores.max(-1, keepdims=True))
        np.testing.assert_allclose(probs, want / want.sum(-1, keepdims=True), rtol=0, atol=1e-15)


def test_a_left_padded_row_computes_what_its_tokens_compute_alone():
    """Every key position shifts by the padding's length, a constant in each query's row: the real positions' logits
    are those of the unpadded tokens (transformers counts positions over the real tokens, keras_hub over all). Not
    under `alibi_bfloat16`, whose rounding depends on the position itself."""
    for config in (CONFIGS["unscaled"], CONFIGS["scaled+parallel"]):
        model = rn.Transformer(config, seeded_weights(config, 4, np.float64), np.float64)
        src = ids(3)
        mask = np.ones(src.shape, bool)
        mask[1, :4] = False
        padded = model(src, src_mask=mask)
        alone = model(src[1:, 4:])
        np.testing.assert_allclose(padded[1, 4:], alone[0], rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_twins_equal_the_reference_every_sublayer(backend, name, dtype):
    config = CONFIGS[name]
    weights = seeded_weights(config, 6, dtype)
    model = backend.build(config, weights, dtype)
    traced = backend.trace(model, ids(), None)
    assert_traces_match(traced, reference_trace(config, weights, ids(), None),
                        dtype, floor_trace(config, weights, ids(), None))


def test_blocks_compute_what_the_whole_model_computes():
    config = CONFIGS["scaled+parallel"]
    assert_blocks_are_the_whole_model(config, seeded_weights(config, 3),
                                      [("numpy", "float64"), ("torch", "float32"), ("keras", "float64")], ids())


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_the_caches_decode_as_the_reference_recomputes(framework):
    """Cached keys keep their positions: each step's logits equal the reference's over the whole prefix (float64),
    Keras's fixed-size cache (whose slot is the position) included."""
    from .test_decoding import steppers

    config = CONFIGS["scaled+parallel"] if framework == "tf" else BASE
    weights = seeded_weights(config, 5, np.float64)
    desired = rn.reference_stepper(rn.Transformer(config, weights), None)
    cached, _ = steppers(framework, config, weights, None, "float64")
    prefix = ids(6, length=9)
    for t in range(1, prefix.shape[1] + 1):
        np.testing.assert_allclose(cached(prefix[:, :t]), desired(prefix[:, :t]), rtol=0, atol=atol("float64"),
                                   err_msg=f"position {t - 1}")
    if framework == "tf":
        import tf_impl
        from tf_impl.decoding import greedy

        model = tf_impl.Transformer.from_reference(config, weights, dtype="float64")
        want = rn.generate(rn.reference_stepper(rn.Transformer(config, weights), None), 2, prompt=prefix[:, :3],
                           eos_id=-1, pad_id=None, max_new_tokens=6)
        tokens, _ = greedy(model, prefix[:, :3], 6, jit_compile=False)  # the fixed-size cache
        np.testing.assert_array_equal(tokens, want)


@pytest.mark.parametrize("name, target", [("unscaled", "hf-llama"), ("unscaled", "hf-falcon"),
                                          ("scaled+parallel", "hf-bloom")])
def test_no_family_without_these_blocks_takes_them_silently(name, target, tmp_path):
    from transformer_parity import formats
    from transformer_parity.errors import UsageError

    config = CONFIGS[name]
    field = "alibi_scaled" if target == "hf-bloom" else "alibi"
    with pytest.raises((UsageError, ValueError), match=field):
        formats.save(tmp_path / "out", config, rn.init_weights(config, 0), target)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("backend", ["torch", "keras"])
def test_a_bfloat16_port_passes_the_reduced_precision_judge(backend):
    """The reference's bfloat16 attention adds the bias to its float32 scores as the twins' explicit paths do."""
    from transformer_parity.verify import Subject, lowp

    from .test_lowp import judge

    config = CONFIGS["scaled+parallel"]
    weights = seeded_weights(config, 3)
    report = judge(config, weights, Subject(backend, backend, config, weights), seed=3)
    assert report.passed, report.first_divergence
    assert {r.limit for r in report.rows} == {lowp.RATIO_LIMIT} and report.max_ratio() > 0.1
