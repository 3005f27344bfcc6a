"""The source fixtures (parity_tests/sources): the source-function contract, seeded and perturbed checkpoints, the
inputs they are probed with, and that each model's own forward is the model it claims to be. The last is shown with
the float64 NumPy reference on the weights its `.before.toml` layout reads, with what the current config cannot say
done by hand: a 1/sqrt(d_model) scale folded into the query projection, an input bias folded into the embedding
table, a Linear -> LayerNorm -> ReLU -> Linear head applied to the reference's hidden states, and the masks passed
explicitly where the model has no pad token."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose

import reference_numpy as rn
from parity_tests import sources
from parity_tests.tolerances import atol
from reference_numpy import ops

@pytest.fixture(scope="module", params=sources.MODELS, ids=list(sources.MODELS))
def saved(request, tmp_path_factory):
    """(module, checkpoint path) for each fixture model, seed 0."""
    if request.param == "keras_encoder":
        pytest.importorskip("tensorflow")
        pytest.importorskip("keras")
    else:
        pytest.importorskip("torch")
    model = sources.module(request.param)
    path = tmp_path_factory.mktemp(request.param) / f"model{model.CHECKPOINT_SUFFIX}"
    return model, model.save_checkpoint(path, seed=0)


# --- the contract ----------------------------------------------------------------------------------------------------

def test_forward_reads_the_checkpoint_named_by_the_environment(saved, monkeypatch):
    model, path = saved
    monkeypatch.setenv(sources.CHECKPOINT_ENV, str(path))
    batch = sources.sample_batch(model, seed=3)
    logits32, logits64 = model.forward(batch), model.forward_f64(batch)
    length = batch["tgt_ids" if model.ENCODER_DECODER else "src_ids"].shape[1]
    assert logits32.shape == logits64.shape == (3, length, model.TGT_VOCAB)
    assert (logits32.dtype, logits64.dtype) == (np.float32, np.float64)
    assert_allclose(model.forward({**batch, "dtype": "float64"}), logits64, rtol=0, atol=0)
    scale = float(np.max(np.abs(logits64)))
    # the same model in two precisions: float32 rounding apart, no further (a float32 step in the float64 run, or
    # another model, is 1e-3 and more)
    assert 0 < float(np.max(np.abs(logits32 - logits64))) < 100 * np.finfo(np.float32).eps * scale


def test_forward_without_the_environment_variable_names_it(saved, monkeypatch):
    model, _ = saved
    monkeypatch.delenv(sources.CHECKPOINT_ENV, raising=False)
    with pytest.raises(ValueError, match=sources.CHECKPOINT_ENV):
        model.forward(sources.sample_batch(model))


@pytest.mark.parametrize("change, message", [
    (lambda b: {**b, "dtype": "bfloat16"}, "received 'bfloat16'"),
    (lambda b: {**b, "src_ids": b["src_ids"].astype(np.int32)}, "int64 ids"),
    (lambda b: {**b, "src_ids": b["src_ids"] + 100}, "outside"),
    (lambda b: {k: v for k, v in b.items() if k != "src_ids"}, "no 'src_ids'"),
], ids=["dtype", "int32", "out-of-vocab", "missing"])
def test_bad_batch_is_refused_naming_the_problem(saved, change, message):
    model, path = saved
    with pytest.raises(ValueError, match=message):
        model.make_source(path)(change(sources.sample_batch(model)))


def test_same_seed_same_checkpoint_other_seed_other_weights(saved, tmp_path):
    model, path = saved
    again = model.save_checkpoint(tmp_path / f"again{model.CHECKPOINT_SUFFIX}", seed=0)
    other = model.save_checkpoint(tmp_path / f"other{model.CHECKPOINT_SUFFIX}", seed=1)
    batch = sources.sample_batch(model)
    first = model.make_source(path)(batch)
    assert np.array_equal(model.make_source(again)(batch), first)
    assert not np.allclose(model.make_source(other)(batch), first)


def test_norms_and_biases_are_away_from_init(saved):
    """Every LayerNorm gamma differs from 1 and every beta and bias from 0 (so a port that mixes them up shows)."""
    from transformer_parity.layouts.user import read_state

    model, path = saved
    state = read_state(path)
    if model.CHECKPOINT_SUFFIX == ".weights.h5":  # Keras: gamma is vars/0, beta and a Dense's bias vars/1
        norms = [k for k in state if "layernorm" in k]
        biases = [k for k in state if k.endswith("/vars/1")]
    else:
        norms = [k for k in state if k.rsplit(".", 1)[0] in _torch_norms(model)]
        biases = [k for k in state if k.endswith("bias")]  # Linear biases, LayerNorm betas, in_proj_bias
    assert norms and biases
    for key in norms:
        init = 1.0 if key.endswith(("weight", "/vars/0")) else 0.0  # gamma 1, beta 0
        assert np.min(np.abs(state[key] - init)) > 0, key
    for key in biases:
        assert np.min(np.abs(state[key])) > 0, key


def _torch_norms(model) -> set[str]:
    from torch import nn

    prefix = getattr(model, "PREFIX", "")
    return {prefix + name for name, module in model.build(0).named_modules() if isinstance(module, nn.LayerNorm)}


@pytest.mark.parametrize("name", sources.MODELS)
def test_sample_batch_holds_id_0_and_pads_only_with_a_pad_token(name):
    model = sources.module(name)
    batch = sources.sample_batch(model, seed=5, batch=4, src_len=9, tgt_len=7)
    for key, vocab in (("src_ids", model.SRC_VOCAB), ("tgt_ids", model.TGT_VOCAB)):
        if key not in batch:
            assert not model.ENCODER_DECODER
            continue
        ids = batch[key]
        assert ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < vocab
        if model.PAD_ID != 0:
            assert all(0 in row for row in ids)  # 0 is an ordinary token here
        if model.PAD_ID is None:
            continue
        real = ids != model.PAD_ID
        assert real[0].all() and not real[1:].all()  # row 0 full, some later row padded
        assert all(np.array_equal(row, np.sort(row)[::-1]) for row in real)  # right padding only


# --- each fixture is the model it claims to be ----------------------------------------------------------------------

def _imported(model, path):
    from transformer_parity.layouts import user

    config, weights, _ = user.import_with_layout(path, sources.LAYOUTS / f"{model.__name__.rsplit('.', 1)[1]}"
                                                 ".before.toml")
    return config, {k: np.asarray(v, np.float64) for k, v in weights.items()}


def _claimed(model, path, batch, dtype) -> np.ndarray:
    """The canonical model each fixture claims to be, in `dtype`, by the float64 NumPy reference's code."""
    config, weights = _imported(model, path)
    masks = {}
    if model.PAD_ID is None:  # no pad token: nothing masked but the causal structure
        masks = {"src_mask": np.ones(batch["src_ids"].shape, bool)}
        if model.ENCODER_DECODER:
            masks["tgt_mask"] = np.ones(batch["tgt_ids"].shape, bool)
    name = model.__name__.rsplit(".", 1)[1]
    if name == "dmodel_scale_seq2seq":  # q k / sqrt(d_model) == (c q) k / sqrt(d_head), c = sqrt(d_head / d_model)
        c = math.sqrt(config.head_dim / config.d_model)
        for key in [k for k in weights if ".q." in k]:
            weights[key] = weights[key] * c
    if name == "lightning_encoder":  # one_hot(ids) @ W.T + b == (W.T + b)[ids]; the head runs below
        from transformer_parity.layouts.user import read_state

        state = read_state(path)
        weights["src_embed.embedding"] = weights["src_embed.embedding"] + state["model.input_net.1.bias"]
        head = {k: weights.pop(k) for k in [k for k in weights if k.startswith(("head.", "output."))]}
        config = config.replace(head_transform=False, output_projection=False, output_bias=None)
    weights = {k: v.astype(dtype) for k, v in weights.items()}
    out = rn.Transformer(config, weights, dtype)(batch["src_ids"], batch.get("tgt_ids"), **masks)
    if name == "lightning_encoder":  # output_net: Linear -> LayerNorm -> ReLU -> (Dropout) -> Linear
        head = {k: v.astype(dtype) for k, v in head.items()}
        x = ops.linear(out, head["head.dense.kernel"], head["head.dense.bias"])
        x = ops.relu(ops.layer_norm(x, head["head.norm.gamma"], head["head.norm.beta"], config.layer_norm_eps))
        out = ops.linear(x, head["output.kernel"], head["output.bias"])
    return out


def test_each_fixture_is_the_model_it_claims_to_be(saved):
    model, path = saved
    batch = sources.sample_batch(model, seed=7)
    source = model.make_source(path)
    claimed64 = _claimed(model, path, batch, np.float64)
    assert_allclose(source({**batch, "dtype": "float64"}), claimed64, rtol=0, atol=atol("float64"))
    assert_allclose(source(batch), claimed64, rtol=0, atol=atol("float32"))



@pytest.mark.slow
def test_measure_before_runs():
    """The measurement script runs and prints a scaffold row per model and a port row per route."""
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    from parity_tests.sources.measure_before import NN_ROUTES, measure

    text = measure(after=False)
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    assert len(rows) == 2 * len(sources.MODELS) + len(NN_ROUTES), text
