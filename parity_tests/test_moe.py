"""A mixture-of-experts feed-forward (`num_experts`; `reference_numpy.moe`, `torch_impl.moe`, `tf_impl.moe`): the
router picks what `torch.topk` picks on the CPU, ties included; both twins within K floors of the float64 reference at
every sublayer, the routing record exactly, whole and block by block; greedy decoding with and without the cache;
Keras's own `.weights.h5`; every new field checked."""

from __future__ import annotations

import numpy as np
import pytest

import reference_numpy as rn
from reference_numpy import moe
from reference_numpy.blocks import begin, block_parameters, blocks

from .conftest import weights_for
from .support.variants import MIXTURES
from .tolerances import assert_within_floor

torch = pytest.importorskip("torch")

MOE = MIXTURES["shared+dense-layer"]


def ids(config: rn.TransformerConfig, seed: int = 0, length: int = 11) -> np.ndarray:
    out = np.random.default_rng(seed).integers(0, config.tgt_vocab_size, size=(2, length))
    out[0, 3] = out[1, 0] = 0
    return out


# --- the router's choice ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("experts, k", [(4, 2), (5, 1), (8, 3), (60, 4), (64, 1), (128, 2), (128, 8), (256, 4)])
def test_the_router_picks_what_torch_topk_picks_ties_included(experts, k):
    """Rows of few distinct scores (most of them tied, at the k-th place too): `moe.top_k` keeps the experts
    `torch.topk` keeps on the CPU, through its introselect (k * 64 > experts) and its heap of k (k * 64 <= experts)."""
    rng = np.random.default_rng(experts * 10 + k)
    scores = rng.integers(0, 3, size=(300, experts)).astype(np.float32)
    scores[:20] = 0.5  # every expert alike
    theirs = torch.topk(torch.from_numpy(scores), k, dim=-1).indices.numpy()
    ours = moe.top_k(scores.astype(np.float64), k)
    np.testing.assert_array_equal(np.sort(ours, axis=-1), np.sort(theirs, axis=-1))
    np.testing.assert_array_equal(np.sort(moe.tied_top_k(experts, k)), np.sort(theirs[0]))


def test_route_weighs_the_chosen_as_each_router_does():
    logits = np.array([[2.0, 1.0, 0.5, -1.0]])
    ids_, weights = moe.route(logits, MOE.replace(router_renormalize=False))
    probs = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_array_equal(ids_, [[0, 1]])
    np.testing.assert_allclose(weights, probs[:, :2], rtol=1e-15)
    _, renormalized = moe.route(logits, MOE)
    np.testing.assert_allclose(renormalized, probs[:, :2] / probs[:, :2].sum(), rtol=1e-15)
    _, after = moe.route(logits, MIXTURES["softmax-after-top-k"])
    np.testing.assert_allclose(after, renormalized, rtol=1e-15)  # the same numbers, another order of operations


# --- the twins against the reference --------------------------------------------------------------------------------

def _build(backend: str, config, weights, dtype: str):
    if backend == "torch":
        import torch_impl

        return torch_impl.Transformer.from_reference(config, weights, dtype=getattr(torch, dtype))
    import tf_impl

    return tf_impl.Transformer.from_reference(config, weights, dtype=dtype)


def _trace(backend: str, model, src) -> dict[str, np.ndarray]:
    if backend == "torch":
        with torch.no_grad():
            return {k: v.numpy() for k, v in model.trace(src).items()}
    return {k: np.asarray(v) for k, v in model.trace(src).items()}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("backend", ["torch", "tf"])
@pytest.mark.parametrize("name", list(MIXTURES))
def test_every_sublayer_of_both_twins_routing_exactly(name, backend, dtype):
    config = MIXTURES[name]
    weights = weights_for(config, seed=3, dtype=np.dtype(dtype))
    src = ids(config)
    desired = rn.Transformer(config, weights).trace(src)
    actual = _trace(backend, _build(backend, config, weights, dtype), src)
    assert_within_floor(actual, desired, rn.Transformer(config, weights, np.float32).trace(src), dtype)
    routing = [n for n in desired if n.endswith(".routing")]
    assert routing == [f"decoder.layers.{i}.ffn.routing" for i in range(config.num_decoder_layers)
                       if config.layer_experts(i)]
    for name_ in routing:
        np.testing.assert_array_equal(actual[name_], desired[name_], err_msg=name_)
        assert desired[name_].shape == (*src.shape, config.experts_per_token)
    chosen = np.unique(np.concatenate([desired[n].ravel() for n in routing]))
    assert chosen.size == config.num_experts  # every expert runs on these inputs


@pytest.mark.parametrize("variant", ["shared+dense-layer", "sinks+biases+clamped-glu"])
@pytest.mark.parametrize("backend", ["numpy", "torch", "tf"])
def test_the_blocks_compute_what_the_whole_model_does(backend, variant):
    config = MIXTURES[variant]
    weights = weights_for(config, seed=4, dtype=np.float64)
    src = ids(config, 1)
    whole = rn.Transformer(config, weights).trace(src)
    if backend == "numpy":
        from reference_numpy.blocks import run_block
    else:
        run_block = __import__("torch_impl.blocks" if backend == "torch" else "tf_impl.blocks",
                               fromlist=["run_block"]).run_block
    state, record = {"tgt_ids": src}, {}
    for block in blocks(config):
        begin(block, state)
        record.update(run_block(config, block, {n: weights[n] for n in block_parameters(config, block)}, np.float64,
                                state))
    assert list(record) == list(whole)
    for name, value in whole.items():
        np.testing.assert_allclose(record[name], value, rtol=0, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_equal_scores_choose_what_torch_chooses_in_every_backend(backend):
    """A router of zeros scores every expert alike for every token: each backend keeps the experts torch.topk keeps
    (`moe.tied_top_k`), not the lowest ids."""
    weights = weights_for(MOE, seed=5)
    weights["decoder.layers.0.ffn.router.kernel"] = np.zeros_like(weights["decoder.layers.0.ffn.router.kernel"])
    src = ids(MOE, 2)
    desired = rn.Transformer(MOE, weights).trace(src)
    tied = np.sort(moe.tied_top_k(MOE.num_experts, MOE.experts_per_token))
    assert not np.array_equal(tied, np.arange(MOE.experts_per_token))
    np.testing.assert_array_equal(desired["decoder.layers.0.ffn.routing"], np.broadcast_to(tied, (*src.shape, 2)))
    actual = _trace(backend, _build(backend, MOE, weights, "float32"), src)
    np.testing.assert_array_equal(actual["decoder.layers.0.ffn.routing"], desired["decoder.layers.0.ffn.routing"])


@pytest.mark.parametrize("variant", ["top-1", "sinks+biases+clamped-glu"])
def test_greedy_decoding_with_and_without_the_cache(variant):
    """The expert block is position-wise: the key/value cache is the attention's alone (its sinks beside it), and
    every stepper decodes what the reference does, past the sliding window."""
    import tf_impl
    import torch_impl
    from tf_impl import decoding as tf_decoding
    from torch_impl import decoding as torch_decoding

    config = MIXTURES[variant]
    weights = weights_for(config, seed=6)
    prompt = ids(config, 3, length=4)
    expected = rn.generate(rn.reference_stepper(rn.Transformer(config, weights)), 2, prompt=prompt, eos_id=10**6,
                           pad_id=None, max_new_tokens=24)
    tm = torch_impl.Transformer.from_reference(config, weights)
    km = tf_impl.Transformer.from_reference(config, weights, dtype="float32")
    steppers = {"torch cached": torch_decoding.cached_stepper(tm),
                "torch recompute": torch_decoding.recompute_stepper(tm),
                "tf cached": tf_decoding.cached_stepper(km, compiled=False),
                "tf recompute": tf_decoding.recompute_stepper(km)}
    for label, stepper in steppers.items():
        ours = rn.generate(stepper, 2, prompt=prompt, eos_id=10**6, pad_id=None, max_new_tokens=24)
        np.testing.assert_array_equal(ours, expected, err_msg=label)


@pytest.mark.parametrize("variant", ["shared+dense-layer", "sinks+biases+clamped-glu"])
def test_keras_weights_h5_of_a_mixture_is_what_keras_writes_and_reads(tmp_path, variant):
    import h5py

    from tf_impl.model import Transformer
    from transformer_parity.formats import keras_file

    def structure(path):
        out = {}
        with h5py.File(path) as f:
            f.visititems(lambda name, obj: out.__setitem__(name, getattr(obj, "shape", None)))
        return out

    config = MIXTURES[variant]
    weights = weights_for(config, seed=7)
    Transformer.from_reference(config, weights).save_weights(tmp_path / "keras.weights.h5")
    keras_file.save_weights_h5(tmp_path / "ours.weights.h5", config, weights)
    assert structure(tmp_path / "keras.weights.h5") == structure(tmp_path / "ours.weights.h5")
    fresh = Transformer(config)
    fresh.build()
    fresh.load_weights(tmp_path / "ours.weights.h5")
    back = fresh.to_reference()
    assert all(np.array_equal(back[k], weights[k]) for k in weights)


# --- the config -----------------------------------------------------------------------------------------------------

DECODER = rn.TransformerConfig.preset("tiny", num_encoder_layers=0, bias=False)


@pytest.mark.parametrize("fields, message", [
    (dict(experts_per_token=2), "experts_per_token=2 configure a mixture of experts; this model has num_experts=0"),
    (dict(num_experts=4, experts_per_token=5), "experts_per_token must be from 1 to num_experts=4, received 5"),
    (dict(router_bias=True), "router_bias=True configure a mixture of experts; this model has num_experts=0"),
    (dict(num_experts=4, experts_per_token=2, router_bias=1), "router_bias must be a bool, received 1"),
    (dict(num_experts=4, experts_per_token=2, num_encoder_layers=2), "needs a decoder-only model"),
    (dict(num_experts=4, experts_per_token=2, router_softmax="sigmoid"), "router_softmax must be one of"),
    (dict(num_experts=4, experts_per_token=2, router_softmax="after_topk", router_renormalize=True),
     "already sum to 1"),
    (dict(num_experts=4, experts_per_token=2, expert_layers=(True,)), "one bool per decoder layer"),
    (dict(num_experts=4, experts_per_token=2, expert_layers=(False, False)), "at least one"),
    (dict(num_experts=4, experts_per_token=2, shared_expert_d_ff=0), "shared_expert_d_ff must be an integer >= 1"),
], ids=["no-experts", "k-above-experts", "router-bias-alone", "router-bias-type", "encoder", "softmax", "renormalized-twice", "short-list",
        "no-expert-layer", "zero-shared"])
def test_every_mixture_field_is_checked_naming_it(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        DECODER.replace(**fields)


@pytest.mark.parametrize("fields, message", [
    (dict(attention_sinks=1), "attention_sinks must be a bool, received 1"),
    (dict(attention_sinks=True, num_encoder_layers=2), "attention_sinks=True .* needs a decoder-only model"),
    (dict(glu_limit=7.0), "glu_limit=7.0 configure a gated feed-forward's GLU; this model has ffn_gated=False"),
    (dict(ffn_gated=True, glu_limit=-1.0), "glu_limit must be a positive finite number, received -1.0"),
    (dict(ffn_gated=True, glu_alpha=float("inf")), "glu_alpha must be a positive finite number, received inf"),
    (dict(ffn_gated=True, glu_up_offset="1"), "glu_up_offset must be a finite number, received '1'"),
    (dict(ffn_gated=True, glu_alpha=1.702), "glu_alpha=1.702 is the sigmoid gain of silu.*activation='relu'"),
], ids=["sinks-type", "sinks-encoder", "glu-not-gated", "glu-limit", "glu-alpha", "glu-offset", "glu-alpha-relu"])
def test_the_sink_and_clamped_glu_fields_are_checked_naming_them(fields, message):
    with pytest.raises(ValueError, match=message):
        DECODER.replace(**fields)


def test_a_list_or_width_that_says_what_none_says_is_stored_as_none():
    config = DECODER.replace(num_experts=4, experts_per_token=2, expert_d_ff=DECODER.d_ff, expert_layers=[True, True])
    assert config.expert_d_ff is None and config.expert_layers is None
    assert rn.TransformerConfig.from_json(MOE.to_json()) == MOE
    gpt_oss = MIXTURES["sinks+biases+clamped-glu"]
    assert rn.TransformerConfig.from_json(gpt_oss.to_json()) == gpt_oss


@pytest.mark.parametrize("backend, mode", [("torch", "bfloat16"), ("keras", "bfloat16"), ("torch", "bfloat16 autocast")])
def test_gpt_oss_blocks_in_reduced_precision_pass_as_the_reference_rounds(backend, mode):
    """The sinks, the biases and the clamped GLU at bfloat16 (and under torch's autocast, where each expert's output
    is bfloat16 and the tokens' sum float32): both twins within the reduced-precision limit of the reference's
    rounding model (`reference_numpy.lowp`). On these inputs no two router scores are within bfloat16 rounding of
    each other at the k-th place (on 11 tokens one is, under autocast: that run is named at layer 0's routing record,
    as verify names any routing that rounding decides)."""
    from transformer_parity import verify
    from transformer_parity.verify import Subject, lowp

    config = MIXTURES["sinks+biases+clamped-glu"]
    weights = weights_for(config, seed=3)
    report = verify.judge_subjects(Subject("reference", "numpy", config, weights),
                                   [Subject(backend, backend, config, weights)], dtype=mode.split()[0],
                                   autocast=mode.endswith("autocast"), seed=3, batch=2, src_len=9, tgt_len=7)
    assert report.passed, report.first_divergence
    assert {r.limit for r in report.rows} == {lowp.RATIO_LIMIT}
