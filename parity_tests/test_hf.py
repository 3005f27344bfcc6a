"""Hugging Face checkpoints against the transformers library itself: small random-init GPT-2, BERT and Marian models
saved with `save_pretrained`, imported, run by the float64 reference, torch_impl and tf_impl, exported back, and
decoded greedily. transformers is the outside judge of the layouts in `transformer_parity/layouts/`."""

import copy
import json

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import cli, formats
from transformer_parity.layouts import hf_dir

from . import tolerances
from .tolerances import EPS32, EPS64, property_atol

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB, PAD = 101, 100  # pad (and GPT-2's eos, Marian's decoder start) is the last id


def _gpt2_config():
    return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=32,
                                   bos_token_id=PAD, eos_token_id=PAD)


def _bert_config():
    return transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                   vocab_size=VOCAB, max_position_embeddings=32, pad_token_id=PAD)


def _marian_config():  # OPUS-MT's choices: swish, scaled embeddings
    return transformers.MarianConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                     vocab_size=VOCAB, max_position_embeddings=32, pad_token_id=PAD,
                                     decoder_start_token_id=PAD, eos_token_id=0, forced_eos_token_id=None,
                                     activation_function="swish", scale_embedding=True)


def _bart_config():
    return transformers.BartConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                   decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                   vocab_size=VOCAB, max_position_embeddings=32, pad_token_id=PAD,
                                   decoder_start_token_id=2, eos_token_id=2, forced_eos_token_id=None)


MODELS = {  # id -> (transformers class name, config)
    "gpt2-lm": ("GPT2LMHeadModel", _gpt2_config),
    "gpt2": ("GPT2Model", _gpt2_config),
    "bert-mlm": ("BertForMaskedLM", _bert_config),
    "bert": ("BertModel", _bert_config),
    "marian": ("MarianMTModel", _marian_config),
    "bart": ("BartForConditionalGeneration", _bart_config),
}
_cache: dict = {}


def hf_model(name: str, tmp_path_factory):
    """`(transformers model in eval mode, its save_pretrained directory)`, built once per session. Every parameter
    (and Marian's logits bias) is perturbed, so that a swapped gamma/beta or bias cannot hide behind ones and zeros."""
    if name not in _cache:
        cls_name, make_config = MODELS[name]
        torch.manual_seed(sum(map(ord, name)))
        model = getattr(transformers, cls_name)(make_config()).eval()
        with torch.no_grad():
            for key, p in model.named_parameters():
                if "embed_positions" not in key:  # Marian's fixed sinusoids, recomputed on load, never saved
                    p.add_(0.1 * torch.randn_like(p))
            if hasattr(model, "final_logits_bias"):
                model.final_logits_bias.normal_(0, 0.5)
        path = tmp_path_factory.mktemp(name) / "model"
        model.save_pretrained(path)
        _cache[name] = model, path
    return _cache[name]


def inputs(config: rn.TransformerConfig, seed: int = 0):
    """Right-padded ids `(2, 11)`: row 1 has 4 pads. Returns (reference args, kwargs, transformers kwargs, mask of
    the positions whose outputs are compared)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(1, PAD, size=(2, 11))
    mask = np.ones((2, 11), bool)
    mask[1, 7:] = False
    src[~mask] = PAD if config.pad_id is None else config.pad_id  # GPT-2 has no pad token: the mask says it
    hf = {"input_ids": torch.as_tensor(src), "attention_mask": torch.as_tensor(mask.astype(np.int64))}
    kwargs = {"src_mask": mask}
    if config.is_decoder_only:
        return (src,), kwargs, hf, mask
    if config.is_encoder_only:
        types = rng.integers(0, config.type_vocab_size, size=src.shape)
        hf["token_type_ids"] = torch.as_tensor(types)
        return (src,), {**kwargs, "src_type_ids": types}, hf, mask
    tgt = rng.integers(1, PAD, size=(2, 8))
    tgt[:, 0] = PAD  # Marian's decoder starts from the pad token, which must not be masked
    tgt_mask = np.ones((2, 8), bool)
    tgt_mask[0, 6:] = False
    tgt[~tgt_mask] = PAD if config.pad_id is None else config.pad_id
    hf.update(decoder_input_ids=torch.as_tensor(tgt), decoder_attention_mask=torch.as_tensor(tgt_mask.astype(int)))
    return (src, tgt), {**kwargs, "tgt_mask": tgt_mask}, hf, tgt_mask


def hf_output(model, hf_kwargs) -> np.ndarray:
    with torch.no_grad():
        out = model(**hf_kwargs)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).double().numpy()


_reference: dict = {}


def reference(name: str, tmp_path_factory):
    """The imported checkpoint and the reference's float64 output and float32 floor on the padded inputs."""
    if name not in _reference:
        model, path = hf_model(name, tmp_path_factory)
        loaded = formats.load(path)
        args, kwargs, hf_kwargs, mask = inputs(loaded.config)
        f64 = rn.Transformer(loaded.config, loaded.weights, np.float64)(*args, **kwargs)[mask]
        f32 = rn.Transformer(loaded.config, loaded.weights, np.float32)(*args, **kwargs)[mask]
        _reference[name] = loaded, args, kwargs, hf_kwargs, mask, f64, tolerances.floor(f32, f64)
    return _reference[name]


def _run_impl(impl: str, loaded, args, kwargs, dtype: str) -> np.ndarray:
    if impl == "torch_impl":
        import torch_impl
        m = torch_impl.Transformer.from_reference(loaded.config, loaded.weights, dtype=getattr(torch, dtype))
        with torch.no_grad():
            return m(*args, **kwargs).double().numpy()
    import tf_impl
    m = tf_impl.Transformer.from_reference(loaded.config, loaded.weights, dtype=dtype)
    return np.asarray(m(*args, **kwargs), np.float64)


# --- (a, b) transformers, torch_impl and tf_impl against the float64 reference on the imported weights ----------

@pytest.mark.parametrize("impl", ["transformers", "torch_impl", "tf_impl"])
@pytest.mark.parametrize("name", list(MODELS))
def test_outputs_match_the_reference(name, impl, tmp_path_factory):
    loaded, args, kwargs, hf_kwargs, mask, desired, floor = reference(name, tmp_path_factory)
    if impl == "transformers":
        actual = hf_output(hf_model(name, tmp_path_factory)[0], hf_kwargs)[mask]
    else:
        actual = _run_impl(impl, loaded, args, kwargs, "float32")[mask]
    np.testing.assert_allclose(actual, desired, rtol=0, atol=property_atol("float32", floor))


@pytest.mark.parametrize("name", ["gpt2-lm", "bert-mlm", "marian"])
def test_transformers_in_float64_matches_the_reference(name, tmp_path_factory):
    model, _ = hf_model(name, tmp_path_factory)
    loaded, args, kwargs, hf_kwargs, mask, desired, floor = reference(name, tmp_path_factory)
    model = copy.deepcopy(model).double()
    if name == "marian":  # transformers builds the sinusoid table in float32 even for a float64 model (~6e-8 off)
        exact = torch.as_tensor(rn.sinusoidal_positions(loaded.config.max_len, loaded.config.d_model, "concatenated"))
        with torch.no_grad():
            model.model.encoder.embed_positions.weight.copy_(exact)
            model.model.decoder.embed_positions.weight.copy_(exact)
    actual = hf_output(model, hf_kwargs)[mask]
    np.testing.assert_allclose(actual, desired, rtol=0, atol=property_atol("float64", floor * EPS64 / EPS32))


def test_bert_pooler_matches_transformers(tmp_path_factory):
    model, _ = hf_model("bert", tmp_path_factory)
    loaded, args, kwargs, hf_kwargs, _, _, _ = reference("bert", tmp_path_factory)
    desired = rn.Transformer(loaded.config, loaded.weights).trace(*args, **kwargs)["pooler"]
    with torch.no_grad():
        actual = model(**hf_kwargs).pooler_output.double().numpy()
    np.testing.assert_allclose(actual, desired, rtol=0, atol=1e-5)


# --- GPT-2 has no pad token: id 0 is a word like any other ------------------------------------------------------

def test_gpt2_with_token_0_and_no_pad_token_matches_transformers(tmp_path):
    """Odd sizes (36 wide, 3 heads, 53 tokens), every parameter perturbed (LayerNorm gammas away from 1, betas from
    0), ids holding 0 in every row and no padding: the import runs in the float64 reference, torch_impl and tf_impl
    within 1e-4 of transformers' float32 logits, and the export loads back into transformers with the same logits.
    A pad_id derived from the ids (the import used to take pad_id=0 here) masks every 0: 0.66 off on these inputs,
    against 1.0e-6 now."""
    torch.manual_seed(11)
    hf_config = transformers.GPT2Config(n_embd=36, n_layer=2, n_head=3, vocab_size=53, n_positions=19,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    loaded = formats.load(tmp_path / "hf")
    assert loaded.config.pad_id is None
    ids = np.random.default_rng(3).integers(0, 53, size=(3, 13))
    ids[:, [4, 9]] = 0  # id 0 in every row, twice
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).logits.double().numpy()
    actual = {"numpy float64": rn.Transformer(loaded.config, loaded.weights, np.float64)(ids)}
    for impl in ("torch_impl", "tf_impl"):
        for dtype in ("float32", "float64"):
            actual[f"{impl} {dtype}"] = _run_impl(impl, loaded, (ids,), {}, dtype)
    for label, logits in actual.items():
        np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-4, err_msg=label)
    masked = rn.Transformer(loaded.config.replace(pad_id=0), loaded.weights, np.float64)(ids)
    assert np.abs(masked - expected).max() > 1e-3  # the test can tell a pad_id that masks the zeros
    formats.save(tmp_path / "out", loaded.config, loaded.weights, "hf")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["pad_token_id"] is None
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        np.testing.assert_array_equal(again(torch.from_numpy(ids)).logits.double().numpy(), expected)


def test_gpt2_pad_token_id_in_config_json_masks_nothing(tmp_path_factory, tmp_path):
    """A pad_token_id in config.json is the tokenizer's filler: GPT-2's forward derives no mask from it, so neither
    does the import (a note says so)."""
    copy_ = _copy(hf_model("gpt2", tmp_path_factory)[1], tmp_path)
    config = json.loads((copy_ / "config.json").read_text())
    (copy_ / "config.json").write_text(json.dumps({**config, "pad_token_id": 0}))
    loaded = formats.load(copy_)
    assert loaded.config.pad_id is None
    assert any("pad_token_id=0 is not used" in note for note in loaded.notes), loaded.notes


# --- (c) the export loads into transformers with no missing or unexpected keys and computes the same ------------

@pytest.mark.parametrize("name", list(MODELS))
def test_export_loads_into_transformers(name, tmp_path_factory, tmp_path):
    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    formats.save(tmp_path / "out", loaded.config, loaded.weights, "hf")
    cls = type(model)
    again, info = cls.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not any(info.values()), info
    _, _, _, hf_kwargs, _, _, _ = reference(name, tmp_path_factory)
    np.testing.assert_array_equal(hf_output(again.eval(), hf_kwargs), hf_output(model, hf_kwargs))


def test_a_bfloat16_directory_reads_exactly_and_converts(tmp_path_factory, tmp_path):
    """A model saved in bfloat16 (as many published checkpoints are): its tensors are read as float32 exactly, with a
    note, and it converts to Keras with every value kept."""
    model, _ = hf_model("gpt2-lm", tmp_path_factory)
    half = copy.deepcopy(model).to(torch.bfloat16)
    half.save_pretrained(tmp_path / "bf16")
    loaded = formats.load(tmp_path / "bf16")
    assert any("in bfloat16, read as float32 exactly" in note for note in loaded.notes)
    state = {k: v.float().numpy() for k, v in half.state_dict().items()}
    assert np.array_equal(loaded.weights["tgt_embed.embedding"], state["transformer.wte.weight"])
    assert cli.main(["convert", "-q", str(tmp_path / "bf16"), str(tmp_path / "m.weights.h5")]) == 0
    back = formats.load(tmp_path / "m.weights.h5")
    assert all(np.array_equal(back.weights[k], v) for k, v in loaded.weights.items())


# --- (d) HF -> canonical -> Keras .weights.h5 -> canonical -> HF is bit-identical --------------------------------

@pytest.mark.parametrize("name", ["gpt2-lm", "gpt2", "bert-mlm", "bert", "marian", "bart"])
def test_round_trip_through_keras_is_bit_identical(name, tmp_path_factory, tmp_path):
    _, path = hf_model(name, tmp_path_factory)
    for argv in ([str(path), str(tmp_path / "m.weights.h5")],
                 [str(tmp_path / "m.weights.h5"), str(tmp_path / "back"), "--to", "hf"]):
        assert cli.main(["convert", "-q", *argv]) == 0
    original, back = hf_dir.read_state(path), hf_dir.read_state(tmp_path / "back")
    assert sorted(original) == sorted(back)
    for key in original:
        assert original[key].dtype == back[key].dtype and np.array_equal(original[key], back[key]), key
    saved = json.loads((path / "config.json").read_text())
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    for key, value in written.items():
        if key in saved and key not in ("bos_token_id", "eos_token_id", "pad_token_id", "dtype"):
            assert saved[key] == value, key
    assert "decoder_start_token_id" not in written or written["decoder_start_token_id"] == written["pad_token_id"]


# --- (e) greedy generation: the same tokens in transformers, the reference, torch_impl and tf_impl ---------------

def _steppers(config, weights, src=None, src_mask=None):
    import tf_impl
    import torch_impl
    from tf_impl import decoding as tf_decoding
    from torch_impl import decoding as torch_decoding

    tm = torch_impl.Transformer.from_reference(config, weights)
    km = tf_impl.Transformer.from_reference(config, weights, dtype="float32")
    return {"reference": rn.reference_stepper(rn.Transformer(config, weights), src, src_mask),
            "torch cached": torch_decoding.cached_stepper(tm, src, src_mask),
            "torch recompute": torch_decoding.recompute_stepper(tm, src, src_mask),
            "tf cached": tf_decoding.cached_stepper(km, src, src_mask, compiled=False),  # eager: no trace to wait for
            "tf recompute": tf_decoding.recompute_stepper(km, src, src_mask)}


def test_gpt2_greedy_generation_matches_transformers(tmp_path_factory):
    model, path = hf_model("gpt2-lm", tmp_path_factory)
    loaded = formats.load(path)
    prompt = np.random.default_rng(5).integers(1, PAD, size=(2, 4))
    with torch.no_grad():
        expected = model.generate(torch.as_tensor(prompt), attention_mask=torch.ones(2, 4, dtype=torch.long),
                                  do_sample=False, max_new_tokens=8, eos_token_id=PAD, pad_token_id=PAD).numpy()
    for label, stepper in _steppers(loaded.config, loaded.weights).items():
        ours = rn.generate(stepper, 2, prompt=prompt, eos_id=PAD, pad_id=loaded.config.pad_id, max_new_tokens=8)
        np.testing.assert_array_equal(ours[:, :expected.shape[1]], expected, err_msg=label)


def test_marian_greedy_generation_matches_transformers(tmp_path_factory):
    model, path = hf_model("marian", tmp_path_factory)
    loaded = formats.load(path)
    args, kwargs, hf_kwargs, _ = inputs(loaded.config)
    with torch.no_grad():
        expected = model.generate(input_ids=hf_kwargs["input_ids"], attention_mask=hf_kwargs["attention_mask"],
                                  do_sample=False, num_beams=1, max_new_tokens=8, eos_token_id=0,
                                  pad_token_id=PAD, decoder_start_token_id=PAD).numpy()
    for label, stepper in _steppers(loaded.config, loaded.weights, args[0], kwargs["src_mask"]).items():
        ours = rn.generate(stepper, 2, bos_id=PAD, eos_id=0, pad_id=PAD, max_new_tokens=8)
        np.testing.assert_array_equal(ours[:, :expected.shape[1]], expected, err_msg=label)


# --- bad input: exit 2, one line naming the problem, nothing written ---------------------------------------------

def _convert_fails(tmp_path, capsys, source, match: str) -> None:
    out = tmp_path / "out.safetensors"
    capsys.readouterr()  # transformers' progress bars, if a model was just saved
    assert cli.main(["convert", str(source), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert not out.exists()


def _copy(path, tmp_path):
    import shutil
    return shutil.copytree(path, tmp_path / "copy")


def test_unsupported_model_type_lists_the_supported_ones(tmp_path_factory, tmp_path, capsys):
    copy = _copy(hf_model("gpt2", tmp_path_factory)[1], tmp_path)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "model_type": "xlnet"}))
    _convert_fails(tmp_path, capsys, copy, "model_type='xlnet' is not supported; supported model types: gpt2")


def test_config_json_of_neither_kind_names_both_kinds(tmp_path, capsys):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    _convert_fails(tmp_path, capsys, tmp_path / "other", "config.json has no model_type, so it is not a Hugging Face "
                                                         "model directory, and it is not a serialized KerasHub object")
    _convert_fails(tmp_path, capsys, tmp_path / "other", "KerasHub presets of GPT2Backbone (GPT2CausalLM)")


def test_config_that_disagrees_with_the_weights(tmp_path_factory, tmp_path, capsys):
    copy = _copy(hf_model("bert-mlm", tmp_path_factory)[1], tmp_path)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    _convert_fails(tmp_path, capsys, copy, "the config does not match the weights: d_ff=96 (config.json "
                                           "intermediate_size), the weights hold 128 (bert.encoder.layer.0."
                                           "intermediate.dense.weight has shape (128, 64))")
    (copy / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    _convert_fails(tmp_path, capsys, copy, "config field num_encoder_layers=3 (config.json num_hidden_layers) does not "
                                           "match the weights, which hold 2 encoder layers (0, 1)")


def test_missing_shard(tmp_path_factory, tmp_path, capsys):
    model, _ = hf_model("gpt2", tmp_path_factory)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1
    assert cli.main(["convert", "-q", str(tmp_path / "sharded"), str(tmp_path / "ok.safetensors")]) == 0
    shards[-1].unlink()
    _convert_fails(tmp_path, capsys, tmp_path / "sharded", f"missing shard(s) {shards[-1].name}")


def test_directory_without_weights_or_config(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    _convert_fails(tmp_path, capsys, tmp_path / "empty", "is a directory without config.json")
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    _convert_fails(tmp_path, capsys, tmp_path / "empty", "has a config.json but no weights")


def test_pytorch_model_bin_reads_like_safetensors(tmp_path_factory, tmp_path):
    model, path = hf_model("bert-mlm", tmp_path_factory)
    (tmp_path / "bin").mkdir()  # transformers 5 saves safetensors only; older versions wrote the full state dict
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")  # (tied decoder weights included)
    (tmp_path / "bin" / "config.json").write_text((path / "config.json").read_text())
    a, b = formats.load(path), formats.load(tmp_path / "bin")
    assert a.config == b.config and all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)


def test_export_refuses_to_overwrite_and_names_what_has_no_equivalent(tmp_path, capsys):
    config = rn.TransformerConfig.preset("tiny")
    formats.save(tmp_path / "tiny.safetensors", config, rn.init_weights(config))
    assert cli.main(["convert", str(tmp_path / "tiny.safetensors"), str(tmp_path / "out"), "--to", "hf"]) == 2
    err = capsys.readouterr().err
    assert "no Hugging Face equivalent" in err and "as hf-gpt2: num_encoder_layers=2" in err and "as hf-marian" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    gpt = config.replace(num_encoder_layers=0, norm_first=True, final_norm=True, positional="learned",
                         scale_embedding=False, output_bias=False)
    formats.save(tmp_path / "gpt.safetensors", gpt, rn.init_weights(gpt))
    assert cli.main(["convert", str(tmp_path / "gpt.safetensors"), str(tmp_path / "out"), "--to", "hf"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert cli.main(["convert", str(tmp_path / "gpt.safetensors"), str(tmp_path / "out"), "--to", "hf",
                     "--force"]) == 2
    assert "holds what a Hugging Face model directory does not: notes.txt" in capsys.readouterr().err
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


# --- verify takes a model directory like any other checkpoint ------------------------------------------------------

def test_verify_a_directory_alone_and_against_its_keras_port(tmp_path_factory, tmp_path, capsys):
    _, path = hf_model("marian", tmp_path_factory)
    assert cli.main(["convert", "-q", str(path), str(tmp_path / "m.weights.h5")]) == 0
    shape = ["--src-len", "9", "--tgt-len", "7", "--json", "-"]
    assert cli.main(["verify", str(path), "--backends", "torch", *shape]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["subjects"][0]["source"] == "model"
    assert cli.main(["verify", str(path), str(tmp_path / "m.weights.h5"), *shape]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and [s["backend"] for s in report["subjects"]] == ["torch", "keras"]
    assert any("MarianMTModel" in note for note in report["notes"])


def test_reading_and_writing_directories_imports_no_framework(tmp_path_factory, tmp_path):
    """Without transformers (or torch) installed these formats still read and write: they are JSON and safetensors."""
    import subprocess
    import sys
    from pathlib import Path

    _, path = hf_model("marian", tmp_path_factory)
    code = ("import sys; from transformer_parity import cli; "
            f"assert cli.main(['convert', '-q', {str(path)!r}, {str(tmp_path / 'm.safetensors')!r}]) == 0; "
            f"assert cli.main(['convert', '-q', {str(tmp_path / 'm.safetensors')!r}, {str(tmp_path / 'back')!r}, "
            "'--to', 'hf']) == 0; "
            "print(sorted(m for m in ('torch', 'transformers', 'tensorflow', 'keras') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    original, back = hf_dir.read_state(path), hf_dir.read_state(tmp_path / "back")
    assert sorted(original) == sorted(back) and all(np.array_equal(original[k], back[k]) for k in original)


def test_extra_tensors_and_an_untied_copy_of_a_tied_head_are_refused(tmp_path_factory, tmp_path, capsys):
    _, path = hf_model("gpt2-lm", tmp_path_factory)
    copy_ = _copy(path, tmp_path)
    state = hf_dir.read_state(copy_)
    wte = state["transformer.wte.weight"]
    for extra, match in (({"lm_head.weight": wte.copy()}, None),  # a saved copy of the tied head: fine
                         ({"lm_head.weight": wte + 1}, "lm_head.weight should repeat tgt_embed.embedding"),
                         ({"score.weight": wte.copy()}, "unexpected 1: score.weight")):
        hf_dir.write_safetensors(copy_ / "model.safetensors", {**state, **extra}, {"format": "pt"})
        if match is None:
            assert cli.main(["convert", "-q", str(copy_), str(tmp_path / "ok.safetensors")]) == 0
        else:
            _convert_fails(tmp_path, capsys, copy_, match)


def test_force_replaces_a_model_directory_and_leaves_no_temporary_files(tmp_path):
    gpt = rn.TransformerConfig.preset("tiny").replace(num_encoder_layers=0, norm_first=True, final_norm=True,
                                                       positional="learned", scale_embedding=False, output_bias=False)
    for seed, force in ((0, []), (1, ["--force"])):
        formats.save(tmp_path / f"{seed}.safetensors", gpt, rn.init_weights(gpt, seed), force=True)
        assert cli.main(["convert", "-q", str(tmp_path / f"{seed}.safetensors"), str(tmp_path / "out"), "--to", "hf",
                         *force]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.safetensors", "1.safetensors", "out"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".transformer-parity.json", "config.json",
                                                                    "model.safetensors"]
    back = formats.load(tmp_path / "out")
    assert np.array_equal(back.weights["tgt_embed.embedding"], rn.init_weights(gpt, 1)["tgt_embed.embedding"])


def test_a_pretraining_checkpoint_with_legacy_names_reads_as_the_masked_lm(tmp_path_factory, tmp_path, capsys):
    """bert-base-uncased as published: LayerNorm `gamma`/`beta`, and the next-sentence head next to the MLM head."""
    _, path = hf_model("bert-mlm", tmp_path_factory)
    copy_ = _copy(path, tmp_path)
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in hf_dir.read_state(copy_).items()}
    state["cls.seq_relationship.weight"] = np.ones((2, 64), np.float32)
    state["cls.seq_relationship.bias"] = np.zeros(2, np.float32)
    hf_dir.write_safetensors(copy_ / "model.safetensors", state, {"format": "pt"})
    capsys.readouterr()
    assert cli.main(["convert", str(copy_), str(tmp_path / "m.safetensors")]) == 2  # a trained head is not dropped
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cls.seq_relationship.weight (shape (2, 64), max |x| 1)" in err, err
    assert cli.main(["convert", str(copy_), str(tmp_path / "m.safetensors"),
                     "--allow-drop", "cls.seq_relationship.weight"]) == 0  # its bias is zero: no name needed
    err = capsys.readouterr().err
    assert "renamed 12 LayerNorm gamma/beta" in err and "left out 2 tensor(s)" in err
    assert "dropped (--allow-drop): cls.seq_relationship.weight" in err
    a, b = formats.load(path), formats.load(tmp_path / "m.safetensors")
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)
