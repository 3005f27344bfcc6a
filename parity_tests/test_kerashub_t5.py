"""KerasHub T5 presets (`layouts.kerashub_t5`), both ways: tiny `T5Seq2SeqLM`s (v1.0's tied ReLU head, rescaled;
v1.1's untied gated tanh-GELU) and a `T5Backbone` (Keras's exact GELU), with odd sizes (6 heads of 8 beside a
width of 40, 37 wide feed-forwards) and every weight perturbed, saved with `save_to_preset` beside a SentencePiece vocabulary that tells
the pad id; read, run by the float64 reference against keras_hub on padded inputs holding id 0, judged by `verify`
against keras_hub, written back (keras_hub loads it and computes the same, bit for bit), and exported to `hf-t5`,
where transformers computes keras_hub's logits; and a transformers T5 converted to a preset keras_hub runs alike. A
config.json key keras-hub 0.32 does not write and an untied bare backbone are refused in one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main

from .test_kerashub_encoders import spm_model

keras_hub = pytest.importorskip("keras_hub")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SIZES = dict(vocabulary_size=53, num_layers=2, num_heads=6, hidden_dim=40, intermediate_dim=37, key_value_dim=8,
             dropout=0.0)
PIECES = ["<pad>", "</s>", "<unk>", "▁a"]  # T5's <pad> at 0
TOLERANCE = 1e-4
CASES = {  # name -> (task, tie_embedding_weights, activation, use_gated_activation)
    "v1.0-lm": (True, True, "relu", False),
    "v1.1-lm": (True, False, "gelu_approximate", True),
    "backbone": (False, True, "gelu", True),
}


def build(name: str):
    from keras_hub.src.utils.keras_utils import gelu_approximate

    task, tied, activation, gated = CASES[name]
    model = keras_hub.models.T5Backbone(**SIZES, tie_embedding_weights=tied, use_gated_activation=gated,
                                        activation=gelu_approximate if activation == "gelu_approximate" else activation)
    if task:
        model = keras_hub.models.T5Seq2SeqLM(backbone=model, preprocessor=None)
    rng = np.random.default_rng(len(name))
    model.set_weights([w + 0.1 * rng.standard_normal(w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


@pytest.fixture(scope="module", params=["v1.0-lm", "v1.1-lm"])
def preset(request, tmp_path_factory):
    model = build(request.param)
    path = tmp_path_factory.mktemp("kh-t5") / request.param
    model.save_to_preset(str(path))
    (path / "assets" / "tokenizer").mkdir(parents=True)
    (path / "assets" / "tokenizer" / "vocabulary.spm").write_bytes(spm_model(PIECES))
    return request.param, model, path


def inputs(seed: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Source (40) and target (33) ids, id 0 (<pad>) in both: the first source row padded at the end, a target key
    hidden in the middle of the second row."""
    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(1, 53, (2, 40)).astype(np.int32), rng.integers(1, 53, (2, 33)).astype(np.int32)
    src[0, 30:] = src[1, 5] = tgt[1, 4] = tgt[0, 25:] = 0
    return src, tgt


def keras_output(model, src, tgt) -> np.ndarray:
    out = model({"encoder_token_ids": src, "encoder_padding_mask": src != 0,
                 "decoder_token_ids": tgt, "decoder_padding_mask": tgt != 0})
    return np.asarray(out["decoder_sequence_output"] if isinstance(out, dict) else out, np.float64)


def transformers_logits(model, src, tgt) -> np.ndarray:
    as_long = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.long)  # noqa: E731
    with torch.no_grad():
        return model(input_ids=as_long(src), attention_mask=as_long(src != 0), decoder_input_ids=as_long(tgt),
                     decoder_attention_mask=as_long(tgt != 0)).logits.double().numpy()


def test_the_preset_reads_as_keras_hub_computes(preset):
    name, model, path = preset
    task, tied, activation, gated = CASES[name]
    loaded = formats.load(path)
    config = loaded.config
    assert loaded.format == "kerashub-t5" and config.pad_id == 0
    assert (config.relative_bias_buckets, config.relative_bias_max_distance, config.head_dim) == (32, 128, 8)
    assert (config.output_projection, config.tie_embeddings and task, config.ffn_gated) == (task, tied and task, gated)
    assert config.logit_divisor == (40 ** 0.5 if task and tied else 1.0)
    src, tgt = inputs()
    worst = float(np.max(np.abs(rn.Transformer(config, loaded.weights)(src.astype(np.int64), tgt.astype(np.int64))
                                - keras_output(model, src, tgt))))
    print(f"{name}: max |reference - keras_hub| = {worst:.2e}")
    assert worst <= TOLERANCE


def test_verify_passes_against_keras_hub(preset, tmp_path):
    name, _, path = preset
    if name != "v1.1-lm":
        pytest.skip("one verify run: each takes 8-17 s here, and the reading test holds both to keras_hub")
    report = tmp_path / "report.json"
    assert main(["verify", str(path), "--json", str(report)]) == 0
    verdict = json.loads(report.read_text())["verdict"]
    assert verdict.startswith("PASS: matches the source (keras_hub"), verdict


def test_written_back_keras_hub_loads_it_and_computes_the_same(preset, tmp_path):
    name, model, path = preset
    if name != "v1.1-lm":
        pytest.skip("one write-back: the untied, gated preset has every table the tied one has and more")
    loaded = formats.load(path)
    assert formats.save(tmp_path / "again", loaded.config, dict(loaded.weights), "kerashub")[1] == "kerashub-t5"
    again = type(model).from_preset(str(tmp_path / "again"))
    src, tgt = inputs(seed=9)
    np.testing.assert_array_equal(keras_output(again, src, tgt), keras_output(model, src, tgt))


def test_hugging_face_export_matches_transformers(preset, tmp_path):
    name, model, path = preset
    loaded = formats.load(path)
    assert formats.save(tmp_path / "hf", loaded.config, dict(loaded.weights), "hf")[1] == "hf-t5"
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    src, tgt = inputs()
    worst = float(np.max(np.abs(transformers_logits(hf, src, tgt) - keras_output(model, src, tgt))))
    print(f"{name}: max |transformers (our hf-t5 export) - keras_hub| = {worst:.2e}")
    assert worst <= TOLERANCE


def test_a_transformers_t5_converts_to_a_preset_keras_hub_runs_alike(tmp_path):
    torch.manual_seed(5)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=53, d_model=40, d_kv=8, num_heads=6, d_ff=37, num_layers=2, feed_forward_proj="relu")).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(tmp_path / "hf")
    assert main(["--quiet", "convert", str(tmp_path / "hf"), str(tmp_path / "preset"), "--to", "kerashub-t5"]) == 0
    task = keras_hub.models.T5Seq2SeqLM.from_preset(str(tmp_path / "preset"))
    src, tgt = inputs(seed=6)
    worst = float(np.max(np.abs(keras_output(task, src, tgt) - transformers_logits(model, src, tgt))))
    print(f"T5ForConditionalGeneration -> kerashub-t5: max |keras_hub - transformers| = {worst:.2e}")
    assert worst <= TOLERANCE


def test_buckets_keras_hub_cannot_hold_are_refused(tmp_path, capsys):
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=53, d_model=40, d_kv=8, num_heads=6, d_ff=37, num_layers=1, relative_attention_num_buckets=8))
    model.save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "preset"), "--to", "kerashub-t5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "relative_bias_buckets=8 (KerasHub T5Seq2SeqLM has 32)" in err, err


def test_a_backbone_reads_as_its_decoder_output_and_refuses_what_it_does_not_say(tmp_path, capsys):
    model = build("backbone")
    path = tmp_path / "backbone"
    model.save_to_preset(str(path))
    loaded = formats.load(path, fields={"pad_id": 0})
    assert not loaded.config.output_projection and loaded.config.activation == "gelu"  # Keras's exact GELU
    src, tgt = inputs(seed=2)
    ours = rn.Transformer(loaded.config, loaded.weights)(src.astype(np.int64), tgt.astype(np.int64))
    assert np.max(np.abs(ours - keras_output(model, src, tgt))) <= TOLERANCE
    for key, value, says in [("relative_attention_num_buckets", 8, "config.json key(s) "
                              "relative_attention_num_buckets are not supported"),
                             ("tie_embedding_weights", False, "a T5Backbone with tie_embedding_weights=false")]:
        edited = tmp_path / key
        shutil.copytree(path, edited)
        data = json.loads((edited / "config.json").read_text())
        data["config"][key] = value
        (edited / "config.json").write_text(json.dumps(data))
        capsys.readouterr()
        assert main(["convert", str(edited), str(tmp_path / f"{key}.safetensors"), "--set", "pad_id=0"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
