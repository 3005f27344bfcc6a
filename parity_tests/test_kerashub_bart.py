"""KerasHub BART presets (`layouts.kerashub_bart`), both ways: a tiny `BartBackbone` and `BartSeq2SeqLM` with odd
sizes and every weight perturbed, saved with `save_to_preset` (a tokenizer beside, whose vocabulary tells the pad
id), read, run by the float64 reference against keras_hub on padded inputs holding token id 0, judged by `verify`
against keras_hub, written back (keras_hub loads it and computes the same, bit for bit), and exported to `hf-bart`,
where transformers' `BartForConditionalGeneration` computes keras_hub's logits; and the other way, a transformers
BART directory converted to a preset that keras_hub runs as transformers does. A config.json key keras-hub 0.32 does
not write, a preset without a vocabulary, a bare .weights.h5 and a nonzero logits bias are refused in one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main

keras_hub = pytest.importorskip("keras_hub")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SIZES = dict(vocabulary_size=53, num_layers=2, num_heads=3, hidden_dim=36, intermediate_dim=37,
             max_sequence_length=16)
VOCABULARY = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4, "a": 5, "b": 6, "Ġ": 7, "Ġa": 8}
PAD = 1  # BART's <pad>, so that id 0 (<s>) is a real token
TOLERANCE = 1e-4
CLASSES = {False: "BartBackbone", True: "BartSeq2SeqLM"}
MEASURED: dict[str, float] = {}


def build(task: bool, seed: int):
    model = keras_hub.models.BartBackbone(**SIZES, dropout=0.0)
    if task:
        model = keras_hub.models.BartSeq2SeqLM(backbone=model, preprocessor=None)
    rng = np.random.default_rng(seed)
    model.set_weights([w + 0.1 * rng.standard_normal(w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


@pytest.fixture(scope="module", params=[False, True], ids=["backbone", "seq2seq-lm"])
def preset(request, tmp_path_factory):
    task = request.param
    model = build(task, seed=11 + task)
    path = tmp_path_factory.mktemp("kh-bart") / CLASSES[task]
    model.save_to_preset(str(path))
    keras_hub.models.BartTokenizer(vocabulary=VOCABULARY, merges=["Ġ a"]).save_to_preset(str(path))
    return task, model, path


def inputs(seed: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded source (13) and target (11) ids, every row holding a 0, rows after the first padded."""
    config = rn.TransformerConfig(src_vocab_size=53, tgt_vocab_size=53, max_len=16, pad_id=PAD)
    src = rn.sample_ids(config, batch=3, length=13, vocab_size=53, seed=seed).astype(np.int32)
    tgt = rn.sample_ids(config, batch=3, length=11, vocab_size=53, seed=seed + 1).astype(np.int32)
    for ids in (src, tgt):
        assert (ids == 0).any(axis=1).all() and (ids == PAD).any() and (ids[:, 0] != PAD).all()
    return src, tgt


def keras_output(model, src, tgt, pad=PAD) -> np.ndarray:
    out = model({"encoder_token_ids": src, "encoder_padding_mask": src != pad,
                 "decoder_token_ids": tgt, "decoder_padding_mask": tgt != pad})
    return np.asarray(out["decoder_sequence_output"] if isinstance(out, dict) else out, np.float64)


def transformers_logits(model, src, tgt) -> np.ndarray:
    as_long = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.long)  # noqa: E731
    with torch.no_grad():
        out = model(input_ids=as_long(src), attention_mask=as_long(src != PAD), decoder_input_ids=as_long(tgt),
                    decoder_attention_mask=as_long(tgt != PAD))
    return out.logits.double().numpy()


def test_the_preset_reads_as_keras_hub_computes(preset):
    task, model, path = preset
    loaded = formats.load(path)
    config = loaded.config
    assert loaded.format == "kerashub-bart" and config.pad_id == PAD
    assert (config.num_encoder_layers, config.num_decoder_layers, config.max_len) == (2, 2, 16)
    assert (config.activation, config.layer_norm_eps, config.scale_embedding, config.final_norm) == \
        ("gelu", 1e-5, False, False)
    assert config.position_offset == 2 and not loaded.weights["src_pos.embedding"][:2].any()  # the unread rows
    assert config.output_projection == task and config.tie_embeddings == task and config.has_output_bias == task
    if task:
        assert not loaded.weights["output.bias"].any()
    src, tgt = inputs()
    expected = keras_output(model, src, tgt)
    ours = rn.Transformer(config, loaded.weights, np.float64)(src.astype(np.int64), tgt.astype(np.int64))
    worst = float(np.max(np.abs(ours - expected)))
    MEASURED[CLASSES[task]] = worst
    print(f"{CLASSES[task]}: max |reference - keras_hub| = {worst:.2e}")
    assert worst <= TOLERANCE
    # the padding matters here: a model that attended to the padded positions would be far off
    assert np.max(np.abs(keras_output(model, src, tgt, pad=-1) - expected)) > 100 * TOLERANCE


def test_verify_passes_against_keras_hub(preset, tmp_path):
    task, _, path = preset
    report = tmp_path / "report.json"
    assert main(["verify", str(path), "--src-len", "13", "--json", str(report)]) == 0
    verdict = json.loads(report.read_text())["verdict"]
    assert verdict.startswith(f"PASS: matches the source (keras_hub {CLASSES[task]})"), verdict


def test_written_back_keras_hub_loads_it_and_computes_the_same(preset, tmp_path):
    task, model, path = preset
    loaded = formats.load(path)
    assert formats.save(tmp_path / "again", loaded.config, dict(loaded.weights), "kerashub")[1] == "kerashub-bart"
    again = getattr(keras_hub.models, CLASSES[task]).from_preset(str(tmp_path / "again"))
    assert type(again).__name__ == CLASSES[task]
    src, tgt = inputs(seed=9)
    np.testing.assert_array_equal(keras_output(again, src, tgt), keras_output(model, src, tgt))
    reread = formats.load(tmp_path / "again")  # no vocabulary there: the pad id this tool recorded
    assert reread.config == loaded.config
    assert all(np.array_equal(reread.weights[k], loaded.weights[k]) for k in loaded.weights)


def test_hugging_face_export_matches_transformers(preset, tmp_path):
    task, model, path = preset
    loaded = formats.load(path)
    out = tmp_path / "hf"
    if not task:  # hf-bart writes BartForConditionalGeneration only
        with pytest.raises(ValueError, match=r"as hf-bart: output_projection=False \(BART needs True\)"):
            formats.save(out, loaded.config, dict(loaded.weights), "hf-bart")
        assert not out.exists()
        return
    assert formats.save(out, loaded.config, dict(loaded.weights), "hf")[1] == "hf-bart"
    hf = transformers.BartForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    src, tgt = inputs()
    worst = float(np.max(np.abs(transformers_logits(hf, src, tgt) - keras_output(model, src, tgt))))
    MEASURED["transformers vs keras_hub"] = worst
    print(f"BartSeq2SeqLM: max |transformers (our hf-bart export) - keras_hub| = {worst:.2e}")
    assert worst <= TOLERANCE


def test_a_config_key_keras_hub_does_not_write_is_refused(preset, tmp_path, capsys):
    _, _, path = preset
    changed = tmp_path / "changed"
    shutil.copytree(path, changed)
    data = json.loads((changed / "config.json").read_text())
    data["config"]["layer_norm_epsilon"] = 1e-6
    (changed / "config.json").write_text(json.dumps(data))
    assert main(["convert", str(changed), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json key(s) layer_norm_epsilon are not supported" in err, err


def test_a_preset_without_a_vocabulary_asks_for_the_pad_id(preset, tmp_path, capsys):
    task, model, path = preset
    bare = tmp_path / "no_vocabulary"
    shutil.copytree(path, bare)
    shutil.rmtree(bare / "assets")
    assert main(["convert", str(bare), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --set pad_id=N (the id of <pad>)" in err, err
    assert main(["--quiet", "convert", str(bare), str(tmp_path / "out.safetensors"), "--set", "pad_id=1"]) == 0
    assert formats.load(tmp_path / "out.safetensors").config == formats.load(path).config


def test_a_bare_weights_file_is_refused(preset, tmp_path, capsys):
    task, model, _ = preset
    bare = tmp_path / "m.weights.h5"
    model.save_weights(str(bare))
    assert main(["convert", str(bare), str(tmp_path / "m.safetensors"), "--from", "kerashub-bart"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give the preset directory" in err, err


def hf_bart(tmp_path, bias: bool = False):
    """A tiny transformers BART (KerasHub's settings: post-LN, exact GELU, unscaled embeddings, tied head), every
    parameter perturbed; with `bias`, a nonzero `final_logits_bias`, which KerasHub has no place for."""
    config = transformers.BartConfig(vocab_size=53, d_model=36, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=3, decoder_attention_heads=3, encoder_ffn_dim=37,
                                     decoder_ffn_dim=37, max_position_embeddings=16, pad_token_id=PAD, bos_token_id=0,
                                     eos_token_id=2, decoder_start_token_id=2, dropout=0.0, attention_dropout=0.0,
                                     activation_dropout=0.0, activation_function="gelu", scale_embedding=False)
    torch.manual_seed(5)
    model = transformers.BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
        if bias:
            model.final_logits_bias.add_(0.1 * torch.randn_like(model.final_logits_bias))
    model.save_pretrained(tmp_path / "hf")
    return model, tmp_path / "hf"


def test_a_transformers_bart_converts_to_a_preset_keras_hub_runs_alike(tmp_path):
    model, hf_dir = hf_bart(tmp_path)
    out = tmp_path / "preset"
    assert main(["--quiet", "convert", str(hf_dir), str(out), "--to", "kerashub-bart"]) == 0
    task = keras_hub.models.BartSeq2SeqLM.from_preset(str(out))
    src, tgt = inputs(seed=6)
    worst = float(np.max(np.abs(keras_output(task, src, tgt) - transformers_logits(model, src, tgt))))
    MEASURED["keras_hub (our preset) vs transformers"] = worst
    print(f"BartForConditionalGeneration -> kerashub-bart: max |keras_hub - transformers| = {worst:.2e}")
    assert worst <= TOLERANCE


def test_a_nonzero_logits_bias_has_no_kerashub_equivalent(tmp_path, capsys):
    _, hf_dir = hf_bart(tmp_path, bias=True)
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(["convert", str(hf_dir), str(tmp_path / "preset"), "--to", "kerashub-bart"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "output.bias is not zero" in err and "have no bias" in err, err
    assert not (tmp_path / "preset").exists()


def test_verify_a_bart_directory_against_its_preset_compares_what_is_read(tmp_path):
    """`verify HF_DIR KERASHUB_PRESET`: the two position rows neither model reads (transformers' random, KerasHub's
    none) are left out of the weights comparison, with a note; every other weight is compared, and a changed one
    still fails."""
    import h5py

    _, hf_dir = hf_bart(tmp_path)
    out = tmp_path / "preset"
    assert main(["--quiet", "convert", str(hf_dir), str(out), "--to", "kerashub-bart"]) == 0
    report = tmp_path / "r.json"
    assert main(["verify", str(hf_dir), str(out), "--src-len", "9", "--tgt-len", "7", "--json", str(report),
                 "-q"]) == 0
    result = json.loads(report.read_text())
    assert result["weights"]["compared"] and result["weights"]["passed"]
    assert any("tgt_pos.embedding: rows 0..1 never read" in n for n in result["notes"])
    changed = tmp_path / "changed"
    shutil.copytree(out, changed)
    with h5py.File(changed / "model.weights.h5", "r+") as f:
        f["layers/position_embedding_1/vars/0"][0, 0] += 1e-3  # position 0: read
    # the edited preset's manifest no longer vouches for its pad id: given
    assert main(["verify", str(hf_dir), str(changed), "--src-len", "9", "--tgt-len", "7", "-q", "--force",
                 "--json", str(report), "--set", f"pad_id={PAD}"]) == 1
    failing = [r["name"] for r in json.loads(report.read_text())["weights"]["rows"] if not r["passed"]]
    assert failing == ["tgt_pos.embedding"]
