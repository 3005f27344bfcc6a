"""The source fixtures (parity_tests/sources): the source-function contract, seeded and perturbed checkpoints, the
inputs they are probed with, and that each model's own forward is the model it claims to be. Each is ported by
`layout --scaffold --source` (settled by probing), `convert --layout` and `verify --source` with no hand edit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

import reference_numpy as rn
from parity_tests import sources
from parity_tests.tolerances import atol

@pytest.fixture(scope="module", params=sources.MODELS, ids=list(sources.MODELS))
def saved(request, tmp_path_factory):
    """(module, checkpoint path) for each fixture model, seed 0."""
    if request.param.startswith("keras"):
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
    if model.CHECKPOINT_SUFFIX == ".weights.h5":  # Keras: gamma is a 1-D vars/0, beta and a Dense's bias vars/1
        gammas = [k for k in state if k.endswith("/vars/0") and np.ndim(state[k]) == 1]
        norms = gammas + [k[:-1] + "1" for k in gammas]
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


# --- each fixture ported with no hand edit, proven against its own forward -------------------------------------------

def _final(trace: dict) -> np.ndarray:
    return trace["logits"] if "logits" in trace else trace["last_hidden_state"]


def test_scaffold_source_convert_verify_with_no_hand_edit(saved, tmp_path, monkeypatch, capsys):
    """`layout --scaffold --source` -> `convert --layout` -> `verify --source`, nothing edited by hand: both twins
    within 1e-4 of the model's own float32 forward and 1e-10 of its float64 forward, on inputs that hold id 0."""
    from transformer_parity import formats
    from transformer_parity.cli import main
    from transformer_parity.verify import trace

    model, path = saved
    name = model.__name__.rsplit(".", 1)[1]
    monkeypatch.setenv("TP_SOURCE_CKPT", str(path))
    spec = f"{Path(model.__file__)}:forward"
    assert main(["--quiet", "layout", "--scaffold", str(path), "--source", spec]) == 0
    layout = tmp_path / "settled.toml"
    layout.write_text(capsys.readouterr().out)
    out = tmp_path / "ported.safetensors"
    assert main(["--quiet", "convert", "--layout", str(layout), str(path), str(out)]) == 0
    loaded = formats.load(out)
    batch = sources.sample_batch(model, seed=7)
    assert (batch["src_ids"] == 0).any()
    source = model.make_source(path)
    theirs32, theirs64 = source(batch), source({**batch, "dtype": "float64"})
    for backend in ("torch", "keras"):
        ours32 = _final(trace(backend, loaded.config, loaded.weights, "float32", batch["src_ids"], batch.get("tgt_ids")))
        ours64 = _final(trace(backend, loaded.config, loaded.weights, "float64", batch["src_ids"], batch.get("tgt_ids")))
        assert np.max(np.abs(ours32 - theirs32)) <= 1e-4, (name, backend)
        assert np.max(np.abs(ours64 - theirs64)) <= 1e-10, (name, backend)
    capsys.readouterr()
    assert main(["--quiet", "verify", str(out), "--source", spec]) == 0


def test_a_wrong_layout_fails_against_the_source(tmp_path, monkeypatch, capsys):
    """The settled layout with a wrong head count, or with the two norms of each layer swapped, passes our own
    backends' self-consistency but fails against the source: exit 1."""
    from transformer_parity.cli import main

    pytest.importorskip("torch")
    model = sources.module("w_qkvo_encoder")
    path = model.save_checkpoint(tmp_path / f"model{model.CHECKPOINT_SUFFIX}", seed=0)
    monkeypatch.setenv("TP_SOURCE_CKPT", str(path))
    spec = f"{Path(model.__file__)}:forward"
    assert main(["--quiet", "layout", "--scaffold", str(path), "--source", spec]) == 0
    settled = capsys.readouterr().out
    wrong = {"heads": settled.replace(f"num_heads = {model.NUM_HEADS}", "num_heads = 2"),
             "norms": re.sub(r'= "encoder\.layers\.\{i\}\.norm([12])\.',
                             lambda m: f'= "encoder.layers.{{i}}.norm{3 - int(m[1])}.', settled)}
    for kind, text in wrong.items():
        assert text != settled, kind
        layout = tmp_path / f"{kind}.toml"
        layout.write_text(text)
        assert main(["--quiet", "verify", "--layout", str(layout), str(path), "--backends", "torch"]) == 0, kind
        assert main(["--quiet", "verify", "--layout", str(layout), str(path), "--backends", "torch",
                     "--source", spec]) == 1, kind


@pytest.mark.parametrize("name", ["tutorial_seq2seq_renamed", "to_kv_encoder_renamed", "c_attn_decoder_renamed",
                                  "keras_dense_n_renamed"])
def test_roles_settled_by_the_source_fail_when_changed(name, tmp_path, monkeypatch, capsys):
    """The layout the source's calls settle for a model whose names say nothing, with another head count, or with
    two of its self-attention's projections swapped (q and k; q and o beside a fused k/v; a fused q/k/v read as
    interleaved per head), fails against the source: exit 1.
    The scaffold prints how long probing took."""
    from transformer_parity.cli import main

    pytest.importorskip("keras" if name.startswith("keras") else "torch")
    model = sources.module(name)
    path = model.save_checkpoint(tmp_path / f"model{model.CHECKPOINT_SUFFIX}", seed=0)
    monkeypatch.setenv("TP_SOURCE_CKPT", str(path))
    spec = f"{Path(model.__file__)}:forward"
    assert main(["layout", "--scaffold", str(path), "--source", spec]) == 0
    captured = capsys.readouterr()
    settled = captured.out
    seconds = float(re.search(r"settled: \d+ candidate layouts tried in ([\d.]+) s", captured.err)[1])
    assert 0 < seconds < 60
    other = 2 if model.NUM_HEADS != 2 else 3
    pair = "qk" if "self_attn.k." in settled else "qo"  # k fused with v (to_kv): q and the output projection
    swapped = re.sub(rf"self_attn\.([{pair}])\.", lambda m: f"self_attn.{pair[m[1] == pair[0]]}.", settled)
    if "{qkv}" in settled:  # one fused q/k/v array: its other order
        swapped = settled.replace("fused_qkv_t", "fused_qkv_heads_t")
    wrong = {"heads": settled.replace(f"num_heads = {model.NUM_HEADS}", f"num_heads = {other}"), "roles": swapped}
    for kind, text in wrong.items():
        assert text != settled, kind
        layout = tmp_path / f"{kind}.toml"
        layout.write_text(text)
        assert main(["--quiet", "verify", "--layout", str(layout), str(path), "--backends", "torch",
                     "--source", spec]) == 1, kind


def test_fused_qkv_in_the_wrong_order_fails_against_the_source(tmp_path, monkeypatch, capsys):
    """The Lightning model interleaves q, k, v per head in one projection: the settled layout says so
    (`fused_qkv_heads_t`); read as concatenated (`fused_qkv_t`) the port fails against the source, exit 1."""
    from transformer_parity.cli import main

    pytest.importorskip("torch")
    model = sources.module("lightning_encoder")
    path = model.save_checkpoint(tmp_path / f"model{model.CHECKPOINT_SUFFIX}", seed=0)
    monkeypatch.setenv("TP_SOURCE_CKPT", str(path))
    spec = f"{Path(model.__file__)}:forward"
    assert main(["--quiet", "layout", "--scaffold", str(path), "--source", spec]) == 0
    settled = capsys.readouterr().out
    assert " fused_qkv_heads_t" in settled
    layout = tmp_path / "concatenated.toml"
    layout.write_text(settled.replace(" fused_qkv_heads_t", " fused_qkv_t"))
    assert main(["--quiet", "verify", "--layout", str(layout), str(path), "--backends", "torch"]) == 0
    assert main(["--quiet", "verify", "--layout", str(layout), str(path), "--backends", "torch",
                 "--source", spec]) == 1


def test_probing_names_what_it_cannot_settle(tmp_path, monkeypatch, capsys):
    """A source that is not the model of these weights (another seed): no candidate matches, the scaffold names
    that on stderr and exits 1; a source that raises is one line, exit 2."""
    from transformer_parity.cli import main

    pytest.importorskip("torch")
    model = sources.module("w_qkvo_encoder")
    path = model.save_checkpoint(tmp_path / f"model{model.CHECKPOINT_SUFFIX}", seed=0)
    other = model.save_checkpoint(tmp_path / f"other{model.CHECKPOINT_SUFFIX}", seed=1)
    monkeypatch.setenv("TP_SOURCE_CKPT", str(other))
    spec = f"{Path(model.__file__)}:forward"
    assert main(["--quiet", "layout", "--scaffold", str(path), "--source", spec]) == 1
    err = capsys.readouterr().err
    assert "not settled: no candidate matches the source" in err, err
    raising = tmp_path / "raising.py"
    raising.write_text("def forward(batch):\n    raise RuntimeError('CUDA out of memory\\nat step 3')\n")
    assert main(["layout", "--scaffold", str(path), "--source", f"{raising}:forward"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "raised RuntimeError on a probe batch" in err and "CUDA out of memory" in err, err


def test_verify_and_convert_settle_what_the_file_does_not_say_by_probing_the_source(tmp_path, monkeypatch, capsys):
    """An nn.Transformer state dict does not say its head count, activation, norm placement, epsilon, embedding
    scale or pad id. With --source and nothing stated, verify settles each by probing (listing the value, its error
    and the runner-up's) and passes with the same errors as with every setting typed by hand; convert writes the
    same model. Without a source the refusal stands."""
    from transformer_parity import formats
    from transformer_parity.cli import main

    pytest.importorskip("torch")
    model = sources.module("nn_transformer_4heads")
    path = model.save_checkpoint(tmp_path / "model.pt", seed=0)
    monkeypatch.setenv("TP_SOURCE_CKPT", str(path))
    spec = f"{Path(model.__file__)}:forward"
    typed = ["--set", f"num_heads={model.NUM_HEADS}", "--set", "activation=relu", "--set", "norm_first=false",
             "--set", "layer_norm_eps=1e-5", "--set", "scale_embedding=true", "--set", f"pad_id={model.PAD_ID}"]
    reports = {}
    for kind, extra in (("settled", []), ("typed", typed)):
        out = tmp_path / f"{kind}.json"
        assert main(["--quiet", "verify", str(path), "--source", spec, "--json", str(out), *extra]) == 0, kind
        reports[kind] = json.loads(out.read_text())
    assert reports["settled"]["rows"] == reports["typed"]["rows"]
    notes = [n for n in reports["settled"]["notes"] if n.startswith("settled by probing --source: ")]
    assert [n.split(": ", 1)[1].split(" ")[0] for n in notes] == [
        f"num_heads={model.NUM_HEADS}", "activation='relu'", "norm_first=False", "layer_norm_eps=1e-05",
        "scale_embedding=True", f"pad_id={model.PAD_ID}"]
    assert all("off the source; the runner-up " in n for n in notes), notes

    capsys.readouterr()
    assert main(["verify", str(path)]) == 2  # no source: the file alone does not say them
    assert "does not say num_heads" in capsys.readouterr().err
    out = tmp_path / "ported.safetensors"
    assert main(["--quiet", "convert", str(path), str(out), "--source", spec]) == 0
    loaded = formats.load(out)
    assert (loaded.config.num_heads, loaded.config.pad_id, loaded.config.activation) == (model.NUM_HEADS,
                                                                                        model.PAD_ID, "relu")
    assert main(["--quiet", "verify", str(out), "--source", spec]) == 0
