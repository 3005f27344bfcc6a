"""KerasHub RoBERTa and DistilBERT presets (`layouts.kerashub_roberta`, `kerashub_distilbert`): tiny keras_hub
backbones and masked LMs with odd sizes and every weight perturbed, saved with `save_to_preset` (a tokenizer beside,
whose vocabulary tells the pad id), read, run by the float64 reference against keras_hub (the sequence output; the
masked LM's logits at its mask positions), judged by `verify` against keras_hub, written back (keras_hub loads it and
computes the same, bit for bit), and exported to Hugging Face where transformers has the same model: a DistilBERT
backbone matches transformers' DistilBertModel; KerasHub's RoBERTa (positions 0..T-1) and DistilBertMaskedLM (head
LayerNorm at 1e-5) have no Hugging Face equivalent and are refused with their reasons."""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main

keras_hub = pytest.importorskip("keras_hub")

SIZES = dict(vocabulary_size=53, num_layers=2, num_heads=3, hidden_dim=36, intermediate_dim=37,
             max_sequence_length=16)
# name: (backbone class, masked-LM class, format, pad id the tokenizer gives (ALBERT's: the user's), extra arguments)
FAMILIES = {"roberta": ("RobertaBackbone", "RobertaMaskedLM", "kerashub-roberta", 1, {}),
            "xlm_roberta": ("XLMRobertaBackbone", "XLMRobertaMaskedLM", "kerashub-xlm-roberta", 1, {}),
            "distilbert": ("DistilBertBackbone", "DistilBertMaskedLM", "kerashub-distilbert", 3, {}),
            "albert": ("AlbertBackbone", "AlbertMaskedLM", "kerashub-albert", 3, {"embedding_dim": 10,
                                                                                 "num_segments": 3})}
ALBERT_PIECES = ["<unk>", "[CLS]", "[SEP]", "<pad>", "[MASK]", "▁a"]  # <pad> at 3, as FAMILIES says


def spm_model(pieces) -> bytes:
    """A SentencePiece ModelProto with these pieces (field 1: piece, 2: score), written out by hand: AlbertTokenizer
    needs the sentencepiece package to save one."""
    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    return b"".join(field(1, field(1, p.encode()) + b"\x15\x00\x00\x80\xbf") for p in pieces)
CASES = [(name, task) for name in FAMILIES for task in (False, True)]
TOLERANCE = 1e-4
MEASURED: dict[str, float] = {}


def tokenizer(name: str):
    """A vocabulary with the pad token where the family's tokenizer puts it (RoBERTa's <pad> at 1; DistilBERT's
    [PAD] at 3, so that id 0 is a real token)."""
    if name == "roberta":
        vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<mask>": 3, "a": 4, "b": 5, "Ġ": 6, "Ġa": 7}
        return keras_hub.models.RobertaTokenizer(vocabulary=vocabulary, merges=["Ġ a"])
    if name == "distilbert":
        return keras_hub.models.DistilBertTokenizer(vocabulary=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "a"])
    return None  # AlbertTokenizer needs sentencepiece: `spm_model` writes its vocabulary; XLM-R's pad id is fixed


def build(name: str, task: bool, seed: int):
    backbone_cls, task_cls = FAMILIES[name][:2]
    model = getattr(keras_hub.models, backbone_cls)(**SIZES, **FAMILIES[name][4], dropout=0.0)
    if task:
        model = getattr(keras_hub.models, task_cls)(backbone=model, preprocessor=None)
    rng = np.random.default_rng(seed)
    model.set_weights([w + 0.1 * rng.standard_normal(w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-{'mlm' if t else 'backbone'}" for n, t in CASES])
def preset(request, tmp_path_factory):
    name, task = request.param
    model = build(name, task, seed=len(name) + task)
    path = tmp_path_factory.mktemp("kh") / f"{name}_{task}"
    model.save_to_preset(str(path))
    if tokenizer(name) is not None:
        tokenizer(name).save_to_preset(str(path))
    elif name == "albert":
        (path / "assets" / "tokenizer").mkdir(parents=True)
        (path / "assets" / "tokenizer" / "vocabulary.spm").write_bytes(spm_model(ALBERT_PIECES))
    return name, task, model, path


def inputs(pad: int, seed: int = 4):
    """Right-padded ids (every row holds a 0; rows 1 and 2 padded) and 5 mask positions per row."""
    config = rn.TransformerConfig(src_vocab_size=53, num_decoder_layers=0, max_len=16, pad_id=pad)
    ids = rn.sample_ids(config, batch=3, length=16, vocab_size=53, seed=seed).astype(np.int32)
    assert (ids == 0).any(axis=1).all() and (ids == pad).any() and pad != 0
    rng = np.random.default_rng(seed)
    positions = np.stack([rng.permutation(16)[:5] for _ in ids]).astype(np.int32)
    return ids, positions


def segments(ids) -> np.ndarray:
    return (np.arange(ids.shape[1]) * 3 // ids.shape[1])[None].repeat(len(ids), 0).astype(np.int32)  # 0, 1, 2


def keras_output(model, ids, positions, pad) -> np.ndarray:
    feed = {"token_ids": ids, "padding_mask": ids != pad}
    if "segment_ids" in {i.name for i in getattr(model, "backbone", model).inputs}:
        feed["segment_ids"] = segments(ids)
    if hasattr(model, "backbone"):
        feed["mask_positions"] = positions
    out = model(feed)
    return np.asarray(out["sequence_output"] if isinstance(out, dict) else out, np.float64)


def load(name, path):
    return formats.load(path)


def reference_output(loaded, ids, positions) -> np.ndarray:
    types = segments(ids).astype(np.int64) if loaded.config.type_vocab_size else None
    out = rn.Transformer(loaded.config, loaded.weights, np.float64)(ids.astype(np.int64), src_type_ids=types)
    if loaded.config.output_projection:  # KerasHub predicts only its mask positions
        out = np.take_along_axis(out, positions[..., None].astype(np.int64), axis=1)
    return out


def test_the_preset_reads_as_keras_hub_computes(preset):
    name, task, model, path = preset
    loaded = load(name, path)
    config = loaded.config
    assert loaded.format == FAMILIES[name][2] and config.pad_id == FAMILIES[name][3]
    assert (config.position_offset, config.positions_skip_pad) == (0, False)  # KerasHub's positions: 0..T-1
    assert config.layer_norm_eps == (1e-5 if name in ("roberta", "xlm_roberta") else 1e-12)
    if name == "albert":
        assert config.activation == "gelu_tanh" and config.pooler and config.type_vocab_size == 3
        assert config.embedding_size == 10 and config.shared_layers
    else:
        assert config.activation == "gelu" and not config.pooler and config.type_vocab_size == 0
    if task:
        assert config.head_transform and config.tie_embeddings and config.has_output_bias
        assert (config.head_layer_norm_eps or config.layer_norm_eps) == 1e-5
    ids, positions = inputs(config.pad_id)
    expected = keras_output(model, ids, positions, config.pad_id)
    ours = reference_output(loaded, ids, positions)
    worst = float(np.max(np.abs(ours - expected)))
    MEASURED[f"{name}-{'mlm' if task else 'backbone'}"] = worst
    print(f"{name} {'masked LM' if task else 'backbone'}: max |reference - keras_hub| = {worst:.2e}")
    assert worst <= TOLERANCE
    # the padding matters here: a model that attended to the padded positions would be far off
    unmasked = keras_output(model, ids, positions, -1)
    assert np.max(np.abs(unmasked - expected)) > 100 * TOLERANCE


def test_verify_passes_against_keras_hub(preset, tmp_path):
    name, task, _, path = preset
    report = tmp_path / "report.json"
    assert main(["verify", str(path), "--src-len", "13", "--json", str(report)]) == 0
    cls = FAMILIES[name][1 if task else 0]
    assert json.loads(report.read_text())["verdict"].startswith(f"PASS: matches the source (keras_hub {cls})")


def test_written_back_keras_hub_loads_it_and_computes_the_same(preset, tmp_path):
    name, task, model, path = preset
    loaded = load(name, path)
    assert formats.save(tmp_path / "again", loaded.config, dict(loaded.weights), loaded.format)[1] == loaded.format
    cls = FAMILIES[name][1 if task else 0]
    again = getattr(keras_hub.models, cls).from_preset(str(tmp_path / "again"))
    assert type(again).__name__ == cls
    ids, positions = inputs(loaded.config.pad_id, seed=9)
    np.testing.assert_array_equal(keras_output(again, ids, positions, loaded.config.pad_id),
                                  keras_output(model, ids, positions, loaded.config.pad_id))
    reread = formats.load(tmp_path / "again")
    assert reread.config == loaded.config
    assert all(np.array_equal(reread.weights[k], loaded.weights[k]) for k in loaded.weights)


def test_hugging_face_export_matches_transformers_or_is_refused(preset, tmp_path):
    name, task, model, path = preset
    loaded = load(name, path)
    out = tmp_path / "hf"
    if name in ("roberta", "xlm_roberta"):  # transformers' numbers positions from pad_token_id + 1, skipping pads
        hf_format = "hf-" + name.replace("_", "-")
        with pytest.raises(ValueError, match=rf"as {hf_format}: .*positions_skip_pad=False \(.* needs True\)"):
            formats.save(out, loaded.config, dict(loaded.weights), hf_format)
        assert not out.exists()
        return
    hf_format, hf_name = {"distilbert": ("hf-distilbert", "DistilBERT"), "albert": ("hf-albert", "ALBERT")}[name]
    if task:  # transformers' masked-LM heads normalize at the encoder's 1e-12
        with pytest.raises(ValueError, match=rf"head_layer_norm_eps=1e-05 \({hf_name}'s head uses the encoder's "
                                             r"layer_norm_eps=1e-12\)"):
            formats.save(out, loaded.config, dict(loaded.weights), hf_format)
        assert not out.exists()
        return
    import torch
    import transformers

    assert formats.save(out, loaded.config, dict(loaded.weights), "hf")[1] == hf_format
    hf = transformers.AutoModel.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == FAMILIES[name][0].replace("Backbone", "Model")
    ids, positions = inputs(loaded.config.pad_id)
    kwargs = {"input_ids": torch.as_tensor(ids, dtype=torch.long),
              "attention_mask": torch.as_tensor(ids != loaded.config.pad_id, dtype=torch.long)}
    if loaded.config.type_vocab_size:
        kwargs["token_type_ids"] = torch.as_tensor(segments(ids), dtype=torch.long)
    with torch.no_grad():
        theirs = hf(**kwargs).last_hidden_state.double().numpy()
    worst = float(np.max(np.abs(theirs - keras_output(model, ids, positions, loaded.config.pad_id))))
    print(f"{name} backbone: max |transformers - keras_hub| = {worst:.2e}")
    assert worst <= TOLERANCE


def test_hugging_face_roberta_positions_have_no_kerashub_equivalent(preset, tmp_path):
    """The other way: a canonical RoBERTa with transformers' pad-skipping positions is refused as kerashub-roberta."""
    name, task, _, path = preset
    if name not in ("roberta", "xlm_roberta"):
        pytest.skip("RoBERTa's positions only")
    loaded = load(name, path)
    skipping = loaded.config.replace(positions_skip_pad=True, position_offset=2)
    with pytest.raises(ValueError, match=r"positions_skip_pad=True \(positions counted over non-pad ids"):
        formats.save(tmp_path / "kh", skipping, dict(loaded.weights), FAMILIES[name][2])
    assert not (tmp_path / "kh").exists()


@pytest.mark.parametrize("key", ["num_groups", "num_inner_repetitions"])
def test_albert_groupings_other_than_one_shared_layer_are_refused(key, tmp_path):
    backbone = keras_hub.models.AlbertBackbone(**{**SIZES, "num_layers": 4}, embedding_dim=10, **{key: 2})
    backbone.save_to_preset(str(tmp_path / "grouped"))
    with pytest.raises(ValueError, match=rf"config.json {key}=2 is not supported"):
        formats.load(tmp_path / "grouped", fields={"pad_id": 3})


def test_xlm_roberta_pad_id_is_its_tokenizers_and_no_other_is_written(preset, tmp_path):
    """XLMRobertaTokenizer puts <pad> at 1 ahead of any vocabulary: read as 1 with no vocabulary in the preset, and a
    model padding with another id is refused for export (keras_hub would mask id 1)."""
    name, task, _, path = preset
    if name != "xlm_roberta":
        pytest.skip("XLM-RoBERTa's tokenizer only")
    assert not (path / "assets").exists()
    loaded = load(name, path)
    assert loaded.config.pad_id == 1 and any("XLMRobertaTokenizer" in n for n in loaded.notes)
    with pytest.raises(ValueError, match=r"pad_id=3 \(XLMRobertaTokenizer's <pad> is always 1\)"):
        formats.save(tmp_path / "kh", loaded.config.replace(pad_id=3), dict(loaded.weights), "kerashub-xlm-roberta")
    assert not (tmp_path / "kh").exists()


def test_albert_preset_without_a_vocabulary_asks_for_the_pad_id(preset, tmp_path, capsys):
    import shutil

    name, task, _, path = preset
    if name != "albert":
        pytest.skip("ALBERT's SentencePiece vocabulary only")
    bare = tmp_path / "no_vocabulary"
    shutil.copytree(path, bare)
    shutil.rmtree(bare / "assets")
    assert main(["convert", str(bare), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --set pad_id=N (the id of <pad>)" in err, err


def test_bare_weights_file_reads_as_the_preset(preset, tmp_path):
    """`save_weights` of a RoBERTa or DistilBERT backbone or masked LM, read with --from and the fields the weights
    cannot tell (dropout, the pad id), gives the preset's config and weights."""
    name, task, model, path = preset
    if name == "albert":
        pytest.skip("a bare ALBERT file does not tell d_model from embedding_dim: read its preset")
    bare, fields, out = tmp_path / "m.weights.h5", tmp_path / "fields.json", tmp_path / "m.safetensors"
    model.save_weights(str(bare))
    fields.write_text(json.dumps({"dropout": 0.0, "pad_id": FAMILIES[name][3]}))
    assert main(["--quiet", "convert", str(bare), str(out), "--from", FAMILIES[name][2], "--config", str(fields)]) == 0
    preset_model, loaded = load(name, path), formats.load(out)
    assert loaded.config == preset_model.config and sorted(loaded.weights) == sorted(preset_model.weights)
    assert all(np.array_equal(loaded.weights[k], preset_model.weights[k]) for k in preset_model.weights)


# --- ELECTRA (`layouts.kerashub_electra`): a backbone only (keras-hub 0.32 has no ELECTRA task), embeddings 10 wide
# projected to 36, three segments, a pooler that transformers' ElectraModel does not have -----------------------------

@pytest.fixture(scope="module")
def electra(tmp_path_factory):
    model = keras_hub.models.ElectraBackbone(vocab_size=53, num_layers=2, num_heads=3, hidden_dim=36, embedding_dim=10,
                                             intermediate_dim=37, max_sequence_length=16, num_segments=3, dropout=0.0)
    rng = np.random.default_rng(9)
    model.set_weights([w + 0.1 * rng.standard_normal(w.shape).astype(w.dtype) for w in model.get_weights()])
    path = tmp_path_factory.mktemp("kh") / "electra"
    model.save_to_preset(str(path))
    keras_hub.models.ElectraTokenizer(vocabulary=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "a"]).save_to_preset(
        str(path))  # [PAD] at 3: id 0 is a real token
    return model, path


def test_electra_preset_reads_verifies_and_writes_back(electra, tmp_path):
    model, path = electra
    loaded = formats.load(path)
    config = loaded.config
    assert loaded.format == "kerashub-electra" and config.pad_id == 3 and config.embedding_size == 10
    assert config.activation == "gelu_tanh" and config.pooler and config.type_vocab_size == 3
    ids, positions = inputs(config.pad_id)
    expected = keras_output(model, ids, positions, config.pad_id)
    worst = float(np.max(np.abs(reference_output(loaded, ids, positions) - expected)))
    MEASURED["electra-backbone"] = worst
    assert worst <= TOLERANCE
    report = tmp_path / "r.json"
    assert main(["verify", str(path), "--src-len", "16", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["verdict"].startswith("PASS: matches the source (keras_hub ElectraBackbone")
    formats.save(tmp_path / "again", config, dict(loaded.weights), "kerashub")
    again = keras_hub.models.Backbone.from_preset(str(tmp_path / "again"))
    np.testing.assert_array_equal(keras_output(again, ids, positions, config.pad_id), expected)


def test_electra_without_its_pooler_is_transformers_electra_model(electra, tmp_path, capsys):
    """The sequence output is transformers' (its tanh GELU written as gelu_new); the pooler is not: `verify HF_DIR
    PRESET` names it (its two weights missing in transformers, the outputs not compared)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    _, path = electra
    loaded = formats.load(path)
    with pytest.raises(ValueError, match="pooler=True"):
        formats.save(tmp_path / "refused", loaded.config, dict(loaded.weights), "hf-electra")
    weights = {k: v for k, v in loaded.weights.items() if not k.startswith("pooler.")}
    formats.save(tmp_path / "hf", loaded.config.replace(pooler=False), weights, "hf-electra")
    hf = transformers.ElectraModel.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids, positions = inputs(loaded.config.pad_id)
    with torch.no_grad():
        theirs = hf(input_ids=torch.as_tensor(ids).long(), token_type_ids=torch.as_tensor(segments(ids)).long(),
                    attention_mask=torch.as_tensor(ids != 3).long()).last_hidden_state.double().numpy()
    expected = keras_output(electra[0], ids, positions, loaded.config.pad_id)
    assert np.max(np.abs(theirs - expected)[ids != 3]) <= TOLERANCE  # the padded rows: neither library's concern
    assert main(["verify", str(tmp_path / "hf"), str(path), "--src-len", "16"]) == 1
    assert "not the same architecture as torch: (reference, this) = {'pooler': (False, True)}" in \
        capsys.readouterr().out


# --- DeBERTa-v3 (`layouts.kerashub_deberta_v3`): disentangled attention over 8 log buckets reaching 16 positions, 5
# heads of 8, no absolute positions; KerasHub masks padding keys only, transformers also zeroes the padding embeddings
# and averages every position for a padding query: the two agree at every real position ------------------------------

DEBERTA_PIECES = ["<unk>", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "▁a"]  # [PAD] at 3: id 0 is a real token


@pytest.fixture(scope="module", params=[False, True], ids=["backbone", "mlm"])
def deberta(request, tmp_path_factory):
    model = keras_hub.models.DebertaV3Backbone(vocabulary_size=53, num_layers=2, num_heads=5, hidden_dim=40,
                                               intermediate_dim=37, max_sequence_length=16, bucket_size=8,
                                               dropout=0.0)
    if request.param:
        model = keras_hub.models.DebertaV3MaskedLM(backbone=model, preprocessor=None)
    rng = np.random.default_rng(11)
    model.set_weights([w + 0.1 * rng.standard_normal(w.shape).astype(w.dtype) for w in model.get_weights()])
    path = tmp_path_factory.mktemp("kh") / "deberta"
    model.save_to_preset(str(path))
    (path / "assets" / "tokenizer").mkdir(parents=True)
    (path / "assets" / "tokenizer" / "vocabulary.spm").write_bytes(spm_model(DEBERTA_PIECES))
    return model, path


def test_deberta_preset_reads_verifies_and_writes_back(deberta, tmp_path):
    model, path = deberta
    loaded = formats.load(path)
    config = loaded.config
    assert loaded.format == "kerashub-deberta-v3" and config.pad_id == 3 and config.positional == "none"
    assert (config.relative_terms, config.relative_buckets, config.max_relative_positions) == (("c2p", "p2c"), 8, 16)
    assert config.relative_shares_qk and config.relative_embed_norm and config.padded_queries == "attend"
    ids, positions = inputs(config.pad_id)
    expected = keras_output(model, ids, positions, config.pad_id)
    worst = float(np.max(np.abs(reference_output(loaded, ids, positions) - expected)))
    MEASURED[f"deberta-v3-{'mlm' if config.output_projection else 'backbone'}"] = worst
    print(f"deberta-v3 {'masked LM' if config.output_projection else 'backbone'}: max |reference - keras_hub| = "
          f"{worst:.2e}")
    assert worst <= TOLERANCE
    report = tmp_path / "r.json"
    assert main(["verify", str(path), "--src-len", "16", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["verdict"].startswith("PASS: matches the source (keras_hub DebertaV3")
    formats.save(tmp_path / "again", config, dict(loaded.weights), "kerashub")
    cls = "DebertaV3MaskedLM" if config.output_projection else "DebertaV3Backbone"
    again = getattr(keras_hub.models, cls).from_preset(str(tmp_path / "again"))
    np.testing.assert_array_equal(keras_output(again, ids, positions, config.pad_id), expected)


def test_deberta_v3_is_transformers_at_every_real_position(deberta, tmp_path):
    """KerasHub's backbone exported with transformers' padding (zeroed embeddings, averaging padding queries) is
    transformers' DebertaV2Model at every real position; as it is, it is refused as hf-deberta-v2, naming both, and a
    transformers DeBERTa is refused as kerashub-deberta-v3 the same way."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    model, path = deberta
    loaded = formats.load(path)
    if loaded.config.output_projection:
        pytest.skip("the backbone only: DebertaV3MaskedLM's head LayerNorm (1e-5) is not transformers' (the encoder's)")
    with pytest.raises(ValueError, match=r"embed_zero_padding=False .*padded_queries='attend'"):
        formats.save(tmp_path / "refused", loaded.config, dict(loaded.weights), "hf-deberta-v2")
    hf_like = loaded.config.replace(embed_zero_padding=True, padded_queries="average")
    formats.save(tmp_path / "hf", hf_like, dict(loaded.weights), "hf-deberta-v2")
    with pytest.raises(ValueError, match=r"as kerashub-deberta-v3: .*embed_zero_padding=True"):
        formats.save(tmp_path / "kh", hf_like, dict(loaded.weights), "kerashub-deberta-v3")
    hf = transformers.DebertaV2Model.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids, positions = inputs(loaded.config.pad_id)
    with torch.no_grad():
        theirs = hf(input_ids=torch.as_tensor(ids).long(),
                    attention_mask=torch.as_tensor(ids != 3).long()).last_hidden_state.double().numpy()
    expected = keras_output(model, ids, positions, loaded.config.pad_id)
    real = ids != 3
    worst = float(np.max(np.abs(theirs - expected)[real]))
    MEASURED["deberta-v3-vs-transformers-real"] = worst
    print(f"deberta-v3 backbone: max |transformers - keras_hub| = {worst:.2e} at the real positions, "
          f"{np.max(np.abs(theirs - expected)[~real]):.2e} at the padding ones")
    assert worst <= TOLERANCE
    assert np.max(np.abs(theirs - expected)[~real]) > 100 * TOLERANCE  # the padding positions: another function


def test_deberta_text_classifier_reads_as_keras_hub_computes_and_writes_back(tmp_path):
    """`DebertaV3TextClassifier`: position 0 through `pooled_dense` (GELU), then the scores (5 classes)."""
    import keras

    keras.utils.set_random_seed(5)
    backbone = keras_hub.models.DebertaV3Backbone(vocabulary_size=53, num_layers=2, num_heads=5, hidden_dim=40,
                                                  intermediate_dim=37, max_sequence_length=16, bucket_size=8,
                                                  dropout=0.0)
    task = keras_hub.models.DebertaV3TextClassifier(backbone=backbone, num_classes=5, preprocessor=None)
    rng = np.random.default_rng(5)
    for v in task.weights:
        v.assign(v.numpy() + 0.1 * rng.standard_normal(v.shape).astype("float32"))
    task.save_to_preset(str(tmp_path / "preset"))
    loaded = formats.load(tmp_path / "preset", fields={"pad_id": 3})
    config = loaded.config
    assert (config.classifier, config.classifier_input, config.classifier_dense, config.num_labels) == (
        "sequence", "first", "gelu", 5)
    ids, _ = inputs(3)
    feed = {"token_ids": ids, "padding_mask": ids != 3}
    theirs = np.asarray(task(feed), np.float64)
    worst = float(np.max(np.abs(rn.Transformer(config, loaded.weights)(ids.astype(np.int64)) - theirs)))
    MEASURED["deberta-v3-classifier"] = worst
    print(f"deberta-v3 text classifier: max |reference - keras_hub| = {worst:.2e}")
    assert worst <= TOLERANCE
    formats.save(tmp_path / "again", config, dict(loaded.weights), "kerashub")
    again = keras_hub.models.TextClassifier.from_preset(str(tmp_path / "again"))
    np.testing.assert_array_equal(np.asarray(again(feed)), np.asarray(task(feed)))
