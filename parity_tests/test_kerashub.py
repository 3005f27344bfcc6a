"""KerasHub models (`layouts.kerashub_*`, docs/kerashub.md): KerasHub's own GPT-2 and BERT, built from tiny configs
with random weights, against the float64 reference on the imported weights (float32 and float64); import -> export
bit-identical; a Hugging Face GPT-2 directory converted to a KerasHub preset loads with `from_preset` and matches
transformers' logits; BertMaskedLM's logits at its mask positions."""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn
from parity_tests.test_layouts import fill_scaffold, reference_errors
from parity_tests.tolerances import atol, property_atol
from parity_tests.tolerances import floor as measured_floor
from transformer_parity import formats
from transformer_parity.cli import main

keras_hub = pytest.importorskip("keras_hub")

GPT2 = dict(vocabulary_size=50, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=64,
            max_sequence_length=24)
BERT = dict(vocabulary_size=50, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=64,
            max_sequence_length=24, num_segments=3)


def exercise(model, seed: int = 0) -> None:
    """Random-init Keras gives zero biases and unit gammas; draw them too, so a mix-up shows."""
    rng = np.random.default_rng(seed)
    model.set_weights([w + 0.1 * rng.standard_normal(w.shape).astype(w.dtype) for w in model.get_weights()])


def gelu_tanh(x):
    """The tanh GELU written out (float64-exact in float64)."""
    from keras import ops

    return 0.5 * x * (1.0 + ops.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def gelu(x):
    """The exact GELU written out with erf (float64-exact in float64)."""
    from keras import ops

    return 0.5 * x * (1.0 + ops.erf(x * 0.7071067811865476))


def float64_exact(model):
    """Remove the float32-accurate pieces of KerasHub's float64 forward on the TensorFlow backend (measured in
    docs/kerashub.md: ~1e-8 on the logits), so that float64 tests the weight mapping to 1e-10:
    - Keras's MultiHeadAttention passes its softmax scale 1/sqrt(key_dim) as a Python float, which TensorFlow turns
      into a float32 tensor before casting it to float64;
    - tf.nn.gelu(approximate=True), KerasHub's `gelu_approximate`, is off by up to 9e-10 in float64;
    - tf.nn.gelu(approximate=False), Keras's "gelu" (BertMaskedLM's head), is off by up to 5e-9 in float64."""
    for layer in model._flatten_layers():
        if hasattr(layer, "_inverse_sqrt_key_dim"):
            layer._inverse_sqrt_key_dim = np.float64(layer._inverse_sqrt_key_dim)
        name = getattr(getattr(layer, "activation", None), "__name__", "")
        if name in ("gelu_approximate", "gelu"):
            layer.activation = gelu_tanh if name == "gelu_approximate" else gelu
    return model


def float64_copy(cls, kwargs, model):
    """A float64 copy of a KerasHub backbone with the same weights (see `float64_exact`)."""
    copy = cls(**kwargs, dtype="float64")
    copy.set_weights([w.astype(np.float64) for w in model.get_weights()])
    return float64_exact(copy)


def gpt2_logits(lm, ids) -> np.ndarray:
    """GPT-2 has no pad token: every id (0 included, which `sample_ids` puts in every row) is a real token."""
    return np.asarray(lm({"token_ids": ids, "padding_mask": np.ones(ids.shape, bool)}))


@pytest.fixture(scope="module")
def gpt2_preset(tmp_path_factory):
    backbone = keras_hub.models.GPT2Backbone(**GPT2, dropout=0.0)
    exercise(backbone)
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    path = tmp_path_factory.mktemp("kh") / "gpt2_preset"
    lm.save_to_preset(str(path))
    return lm, path


def test_gpt2_causal_lm_matches_the_reference(gpt2_preset):
    lm, path = gpt2_preset
    loaded = formats.load(path)
    assert loaded.format == "kerashub-gpt2" and loaded.config.tie_embeddings and loaded.config.is_decoder_only
    ids = rn.sample_ids(loaded.config, batch=3, length=16, vocab_size=50, seed=1)
    backbone64 = float64_copy(keras_hub.models.GPT2Backbone, {**GPT2, "dropout": 0.0}, lm.backbone)
    lm64 = keras_hub.models.GPT2CausalLM(backbone=backbone64, preprocessor=None)
    reference_errors(loaded.config, loaded.weights, ids, gpt2_logits(lm, ids), gpt2_logits(lm64, ids))


def h5_datasets(file) -> dict[str, np.ndarray]:
    """Every dataset of an .h5 file but the optimizer's state (`model.fit` leaves it; it is no model weight)."""
    import h5py

    out = {}
    with h5py.File(file) as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return {k: v for k, v in out.items() if not k.startswith("optimizer/")}


def assert_same_datasets(original_file, written_file) -> None:
    """The same dataset names, each with the same dtype and values, bit for bit."""
    original, written = h5_datasets(original_file), h5_datasets(written_file)
    assert sorted(original) == sorted(written), written_file
    assert all(original[k].dtype == written[k].dtype and np.array_equal(original[k], written[k])
               for k in original), written_file


def preset_round_trip(path, tmp_path):
    """Preset -> canonical -> preset; checks the JSON files came back equal and returns the written preset."""
    canonical, again = tmp_path / "canonical.safetensors", tmp_path / "again"
    assert main(["--quiet", "convert", str(path), str(canonical)]) == 0
    assert main(["--quiet", "convert", str(canonical), str(again), "--to", "kerashub"]) == 0
    for name in ("config.json", "task.json"):
        assert json.loads((again / name).read_text()) == json.loads((path / name).read_text())
    return again


def test_gpt2_import_export_is_bit_identical(gpt2_preset, tmp_path):
    _, path = gpt2_preset
    again = preset_round_trip(path, tmp_path)
    assert_same_datasets(path / "model.weights.h5", again / "model.weights.h5")
    lm = keras_hub.models.GPT2CausalLM.from_preset(str(again))
    assert type(lm).__name__ == "GPT2CausalLM"


def test_bare_gpt2_weights_file_reads_its_config_off_the_weights(gpt2_preset):
    _, path = gpt2_preset
    preset = formats.load(path)
    bare = formats.load(path / "model.weights.h5", "kerashub-gpt2")
    assert bare.config == preset.config.replace(tie_embeddings=False, output_projection=False, dropout=0.1)
    assert all(np.array_equal(bare.weights[k], preset.weights[k]) for k in bare.weights)


def test_bare_gpt2_causal_lm_weights_file_reads_as_the_task(gpt2_preset, tmp_path):
    """`GPT2CausalLM.save_weights` nests the backbone under `layers/gpt2_backbone/`: read with --from kerashub-gpt2,
    it is the causal LM (tied logits) with the preset's config and weights (whose logits are checked above)."""
    lm, path = gpt2_preset
    bare, out = tmp_path / "lm.weights.h5", tmp_path / "lm.safetensors"
    lm.save_weights(str(bare))
    assert main(["--quiet", "convert", str(bare), str(out), "--from", "kerashub-gpt2", "--set", "dropout=0"]) == 0
    preset, loaded = formats.load(path), formats.load(out)
    assert loaded.config == preset.config and sorted(loaded.weights) == sorted(preset.weights)
    assert all(np.array_equal(loaded.weights[k], preset.weights[k]) for k in preset.weights)


def test_a_set_that_contradicts_the_file_is_one_short_line(gpt2_preset, tmp_path, capsys):
    """`--set d_model=64` against a d_model-32 file misshapes nearly every tensor: exit 2, one line that names the
    field, its value and what the weights hold (it had listed every tensor, kilobytes on one line), nothing
    written."""
    _, path = gpt2_preset
    out = tmp_path / "x.safetensors"
    capsys.readouterr()
    assert main(["convert", str(path / "model.weights.h5"), str(out), "--from", "kerashub-gpt2",
                 "--set", "d_model=64", "--set", "num_heads=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the config does not match the weights: d_model=64 (--set/--config), the weights hold 32 (" in err, err
    assert "\n" not in err and len(err) < 900, err
    assert not out.exists()


def test_hf_gpt2_directory_to_kerashub_preset_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(vocab_size=50, n_positions=24, n_embd=32, n_layer=2, n_head=4,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0)
    model = transformers.GPT2LMHeadModel(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        model.lm_head.weight = model.transformer.wte.weight
    model.save_pretrained(tmp_path / "hf")
    preset = tmp_path / "preset"
    assert main(["--quiet", "convert", str(tmp_path / "hf"), str(preset), "--to", "kerashub"]) == 0
    lm = keras_hub.models.GPT2CausalLM.from_preset(str(preset))
    ids = rn.sample_ids(formats.load(preset).config, batch=3, length=16, vocab_size=50, seed=2)
    assert (ids == 0).any(axis=1).all()  # config.json's pad_token_id=0 masks nothing: GPT-2 has no pad token
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).logits.numpy()
    got = gpt2_logits(lm, ids)
    loaded = formats.load(tmp_path / "hf")
    judge = rn.Transformer(loaded.config, loaded.weights, np.float64)(ids)
    floor = measured_floor(rn.Transformer(loaded.config, loaded.weights, np.float32)(ids), judge)

    np.testing.assert_allclose(got, expected, rtol=0, atol=2 * property_atol("float32", floor))
    np.testing.assert_allclose(got, judge, rtol=0, atol=property_atol("float32", floor))


def bert_tokenizer():
    """A WordPiece vocabulary of the model's size with [PAD] at 0, as BERT's vocabularies have it."""
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocabulary += [f"w{i}" for i in range(BERT["vocabulary_size"] - len(vocabulary))]
    return keras_hub.models.BertTokenizer(vocabulary=vocabulary)


@pytest.fixture(scope="module")
def bert_preset(tmp_path_factory):
    backbone = keras_hub.models.BertBackbone(**BERT, dropout=0.0)
    exercise(backbone, seed=1)
    path = tmp_path_factory.mktemp("kh") / "bert_preset"
    backbone.save_to_preset(str(path))
    bert_tokenizer().save_to_preset(str(path))  # as a real preset has it: the vocabulary tells the pad id
    return backbone, path


def bert_outputs(backbone, ids, segments) -> dict[str, np.ndarray]:
    out = backbone({"token_ids": ids, "segment_ids": segments, "padding_mask": ids != 0})
    return {"last_hidden_state": np.asarray(out["sequence_output"]), "pooler": np.asarray(out["pooled_output"])}


def test_bert_backbone_matches_the_reference(bert_preset):
    backbone, path = bert_preset
    loaded = formats.load(path)
    config = loaded.config
    assert loaded.format == "kerashub-bert" and config.pooler and config.embed_norm and config.type_vocab_size == 3
    ids = rn.sample_ids(config, batch=3, length=16, vocab_size=50, seed=3)
    segments = rn.sample_type_ids(config, ids, seed=3)
    got32 = bert_outputs(backbone, ids, segments)
    got64 = bert_outputs(float64_copy(keras_hub.models.BertBackbone, {**BERT, "dropout": 0.0}, backbone), ids,
                         segments)
    judge = rn.Transformer(config, loaded.weights, np.float64).trace(ids, src_type_ids=segments)
    floor32 = rn.Transformer(config, loaded.weights, np.float32).trace(ids, src_type_ids=segments)
    for name in ("last_hidden_state", "pooler"):
        floor = measured_floor(floor32[name], judge[name])
        np.testing.assert_allclose(got32[name], judge[name], rtol=0, atol=property_atol("float32", floor))
        np.testing.assert_allclose(got64[name], judge[name], rtol=0, atol=atol("float64"))


def test_bert_round_trip_loads_with_from_preset(bert_preset, tmp_path):
    _, path = bert_preset
    canonical, again = tmp_path / "bert.safetensors", tmp_path / "again"
    assert main(["--quiet", "convert", str(path), str(canonical)]) == 0
    assert main(["--quiet", "convert", str(canonical), str(again), "--to", "kerashub-bert"]) == 0
    reloaded = formats.load(again)
    original = formats.load(path)
    assert reloaded.config == original.config
    assert all(np.array_equal(reloaded.weights[k], original.weights[k]) for k in original.weights)
    assert type(keras_hub.models.BertBackbone.from_preset(str(again))).__name__ == "BertBackbone"


@pytest.fixture(scope="module")
def mlm_preset(tmp_path_factory):
    backbone = keras_hub.models.BertBackbone(**BERT, dropout=0.0, name="bert_backbone")  # Keras numbers repeats
    lm = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None, name="bert_masked_lm")
    exercise(lm, seed=5)
    path = tmp_path_factory.mktemp("kh") / "mlm_preset"
    lm.save_to_preset(str(path))
    bert_tokenizer().save_to_preset(str(path))
    return lm, path


def mlm_inputs(config, seed=6):
    """Padded ids, segment ids, and 5 mask positions per row (padding included: KerasHub predicts them too)."""
    ids = rn.sample_ids(config, batch=3, length=16, vocab_size=50, seed=seed)
    rng = np.random.default_rng(seed)
    positions = np.stack([rng.permutation(16)[:5] for _ in ids]).astype(np.int32)
    return ids, rn.sample_type_ids(config, ids, seed=seed), positions


def mlm_logits(lm, ids, segments, positions) -> np.ndarray:
    return np.asarray(lm({"token_ids": ids, "segment_ids": segments, "padding_mask": ids != 0,
                          "mask_positions": positions}))


def test_bert_masked_lm_matches_the_reference_at_its_mask_positions(mlm_preset):
    """KerasHub's head predicts only `mask_positions`; the canonical model every position: gathered to compare."""
    lm, path = mlm_preset
    loaded = formats.load(path)
    config = loaded.config
    assert loaded.format == "kerashub-bert" and (config.head_activation, config.head_layer_norm_eps) == ("gelu", 1e-5)
    assert config.activation == "gelu_tanh" and config.tie_embeddings and config.has_output_bias
    ids, segments, positions = mlm_inputs(config)
    backbone64 = float64_copy(keras_hub.models.BertBackbone, {**BERT, "dropout": 0.0}, lm.backbone)
    lm64 = keras_hub.models.BertMaskedLM(backbone=backbone64, preprocessor=None)
    lm64.set_weights([w.astype(np.float64) for w in lm.get_weights()])
    float64_exact(lm64)

    def gathered(dtype):
        logits = rn.Transformer(config, loaded.weights, dtype)(ids, src_type_ids=segments)  # (B, S, V)
        return np.take_along_axis(logits, positions[..., None].astype(np.int64), axis=1)  # (B, M, V)

    judge = gathered(np.float64)
    floor = measured_floor(gathered(np.float32), judge)

    np.testing.assert_allclose(mlm_logits(lm, ids, segments, positions), judge, rtol=0,
                               atol=property_atol("float32", floor))
    np.testing.assert_allclose(mlm_logits(lm64, ids, segments, positions), judge, rtol=0, atol=atol("float64"))


def test_bert_masked_lm_import_export_is_bit_identical_and_loads(mlm_preset, tmp_path):
    lm, path = mlm_preset
    again = preset_round_trip(path, tmp_path)
    for name in ("model.weights.h5", "task.weights.h5"):
        assert_same_datasets(path / name, again / name)
    reloaded = keras_hub.models.BertMaskedLM.from_preset(str(again))
    assert type(reloaded).__name__ == "BertMaskedLM"
    ids, segments, positions = mlm_inputs(formats.load(again).config, seed=7)
    np.testing.assert_array_equal(mlm_logits(reloaded, ids, segments, positions),
                                  mlm_logits(lm, ids, segments, positions))


def test_bare_bert_masked_lm_weights_file_reads_as_the_task(mlm_preset, tmp_path):
    """`BertMaskedLM.save_weights` nests the backbone beside the head: read with --from kerashub-bert (and --config
    for what the weights cannot tell, here dropout), it gives the preset's config and weights."""
    lm, path = mlm_preset
    bare, fields, out = tmp_path / "mlm.weights.h5", tmp_path / "fields.json", tmp_path / "mlm.safetensors"
    lm.save_weights(str(bare))
    fields.write_text(json.dumps({"dropout": 0.0, "pad_id": 0}))  # a bare weights file does not say which id pads
    assert main(["--quiet", "convert", str(bare), str(out), "--from", "kerashub-bert", "--config", str(fields)]) == 0
    preset, loaded = formats.load(path), formats.load(out)
    assert loaded.config == preset.config and sorted(loaded.weights) == sorted(preset.weights)
    assert all(np.array_equal(loaded.weights[k], preset.weights[k]) for k in preset.weights)


def test_bert_masked_lm_export_refuses_the_encoder_activation_in_the_head(mlm_preset, tmp_path, capsys):
    _, path = mlm_preset
    out, fields = tmp_path / "out", tmp_path / "fields.json"
    fields.write_text(json.dumps({"head_activation": "gelu_tanh"}))
    assert main(["convert", str(path), str(out), "--to", "kerashub", "--config", str(fields)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "head_activation='gelu_tanh' (KerasHub BertMaskedLM has 'gelu')" in err
    assert not out.exists()


def test_bert_masked_lm_has_no_hugging_face_equivalent(mlm_preset, tmp_path, capsys):
    """transformers' BertForMaskedLM head uses the encoder's hidden_act and layer_norm_eps."""
    _, path = mlm_preset
    out = tmp_path / "hf"
    assert main(["convert", str(path), str(out), "--to", "hf-bert"]) == 2
    err = capsys.readouterr().err
    assert "head_activation='gelu' (BERT's head uses the encoder's activation='gelu_tanh')" in err
    assert "head_layer_norm_eps=1e-05 (BERT's head uses the encoder's layer_norm_eps=1e-12)" in err
    assert not out.exists()


def test_gpt2_export_refuses_a_model_kerashub_cannot_express(tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    assert main(["--quiet", "init", "--preset", "tiny", "-o", str(path)]) == 0
    assert main(["convert", str(path), str(tmp_path / "out"), "--to", "kerashub"]) == 2
    err = capsys.readouterr().err
    assert "no KerasHub equivalent" in err and not (tmp_path / "out").exists()


# --- keras.io's English-to-Spanish translation model, assembled from KerasHub layers -------------------------------

def english_to_spanish(eng_vocab=60, spa_vocab=70, max_len=20, embed_dim=32, intermediate_dim=64, num_heads=4):
    """The keras.io example's model ("English-to-Spanish translation with KerasHub"), at a tiny size."""
    import keras

    layers = keras_hub.layers
    encoder_inputs = keras.Input(shape=(None,), name="encoder_inputs")
    x = layers.TokenAndPositionEmbedding(vocabulary_size=eng_vocab, sequence_length=max_len, embedding_dim=embed_dim,
                                         mask_zero=True)(encoder_inputs)
    encoder_outputs = layers.TransformerEncoder(intermediate_dim=intermediate_dim, num_heads=num_heads)(inputs=x)
    encoder = keras.Model(encoder_inputs, encoder_outputs)
    decoder_inputs = keras.Input(shape=(None,), name="decoder_inputs")
    encoded_seq_inputs = keras.Input(shape=(None, embed_dim), name="decoder_state_inputs")
    x = layers.TokenAndPositionEmbedding(vocabulary_size=spa_vocab, sequence_length=max_len, embedding_dim=embed_dim,
                                         mask_zero=True)(decoder_inputs)
    x = layers.TransformerDecoder(intermediate_dim=intermediate_dim, num_heads=num_heads)(
        decoder_sequence=x, encoder_sequence=encoded_seq_inputs)
    x = keras.layers.Dropout(0.5)(x)
    decoder_outputs = keras.layers.Dense(spa_vocab, activation="softmax")(x)
    decoder = keras.Model([decoder_inputs, encoded_seq_inputs], decoder_outputs)
    decoder_outputs = decoder([decoder_inputs, encoder_outputs])
    return keras.Model([encoder_inputs, decoder_inputs], decoder_outputs, name="transformer")


def seq2seq_logits(model, src, tgt) -> np.ndarray:
    """The model's logits: its final Dense without the softmax (the canonical output)."""
    import keras

    dense = model.layers[-1].layers[-1]
    dense.activation = keras.activations.linear
    try:
        return np.asarray(model([src, tgt]))
    finally:
        dense.activation = keras.activations.softmax


@pytest.fixture(scope="module")
def seq2seq_file(tmp_path_factory):
    model = english_to_spanish()
    exercise(model, seed=2)
    path = tmp_path_factory.mktemp("kh") / "transformer.weights.h5"
    model.save_weights(path)
    return model, path


def test_seq2seq_matches_the_reference(seq2seq_file):
    model, path = seq2seq_file
    loaded = formats.load(path, "kerashub-seq2seq")
    config = loaded.config
    assert (config.num_encoder_layers, config.num_decoder_layers, config.src_vocab_size, config.tgt_vocab_size,
            config.max_len, config.num_heads) == (1, 1, 60, 70, 20, 4)
    src, tgt = rn.sample_batch(config, batch=3, src_len=14, tgt_len=11, seed=4)
    src[0, -4:], src[1, 1:], tgt[2, -3:] = 0, 0, 0  # right padding (mask_zero: id 0); source row 1 has one real token
    assert config.pad_id == 0 and (src == 0).any(axis=1).all() and (tgt == 0).any()
    import keras

    previous = keras.config.dtype_policy(), keras.config.floatx()
    keras.config.set_floatx("float64")  # the decoder's keras.Input for the encoder states (float32 would cast back)
    keras.config.set_dtype_policy("float64")  # every layer, the Dropout too
    try:
        model64 = english_to_spanish()
    finally:
        keras.config.set_dtype_policy(previous[0])
        keras.config.set_floatx(previous[1])
    model64.set_weights([w.astype(np.float64) for w in model.get_weights()])
    float64_exact(model64)
    judge = rn.Transformer(config, loaded.weights, np.float64)(src, tgt)
    floor = measured_floor(rn.Transformer(config, loaded.weights, np.float32)(src, tgt), judge)

    np.testing.assert_allclose(seq2seq_logits(model, src, tgt), judge, rtol=0, atol=property_atol("float32", floor))
    np.testing.assert_allclose(seq2seq_logits(model64, src, tgt), judge, rtol=0, atol=atol("float64"))
    # the padding matters on these inputs: a model that attended to the padded source positions would be far off
    unmasked = rn.Transformer(config, loaded.weights, np.float64)(src, tgt, src_mask=np.ones(src.shape, bool))
    assert np.max(np.abs(unmasked - judge)) > 100 * property_atol("float32", floor)


def test_seq2seq_round_trip_is_bit_identical_and_loads(seq2seq_file, tmp_path):
    model, path = seq2seq_file
    canonical, again = tmp_path / "s2s.safetensors", tmp_path / "again.weights.h5"
    assert main(["--quiet", "convert", str(path), str(canonical), "--from", "kerashub-seq2seq"]) == 0
    assert main(["--quiet", "convert", str(canonical), str(again), "--to", "kerashub-seq2seq"]) == 0
    assert_same_datasets(path, again)
    fresh = english_to_spanish()
    fresh.load_weights(again)
    assert all(np.array_equal(a, b) for a, b in zip(fresh.get_weights(), model.get_weights()))


def test_scaffold_of_the_seq2seq_file_guesses_the_builtin_table(seq2seq_file, tmp_path, capsys):
    """`layout --scaffold` on the example's .weights.h5 guesses every line; with num_heads and the unscaled
    embeddings added, the layout reads the same config and weights as the built-in kerashub-seq2seq table."""
    _, path = seq2seq_file
    assert main(["layout", "--scaffold", str(path)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith('"')]
    assert len(rows) == 48 and not any('= "?"' in row for row in rows)
    layout = tmp_path / "s2s.toml"
    layout.write_text(fill_scaffold(text, attention_scale="head", activation="relu", norm_first=False, layer_norm_eps=1e-5,
                                    scale_embedding=False, pad_id=0, position_offset=0))
    mine = formats.load(path, formats.LAYOUT_PREFIX + str(layout))
    builtin = formats.load(path, "kerashub-seq2seq")
    assert mine.config == builtin.config
    assert all(np.array_equal(mine.weights[k], builtin.weights[k]) for k in builtin.weights)


def test_bert_pad_id_comes_from_the_vocabulary_or_the_user(bert_preset, tmp_path, capsys):
    """BertBackbone takes a padding mask, not a pad id: the preset's vocabulary tells it ([PAD]'s line), our own
    export records it, and without either it is refused (exit 2, one line) until the user gives it."""
    import shutil

    _, path = bert_preset
    assert formats.load(path).config.pad_id == 0
    moved = tmp_path / "pad3"
    shutil.copytree(path, moved)
    vocabulary = moved / "assets" / "tokenizer" / "vocabulary.txt"
    words = vocabulary.read_text().splitlines()
    words[0], words[3] = words[3], words[0]  # [PAD] on line 3
    vocabulary.write_text("\n".join(words) + "\n")
    assert formats.load(moved).config.pad_id == 3
    shutil.rmtree(moved / "assets")
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(moved), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "to tell which id pads: give --set pad_id=N" in err, err
    assert main(["--quiet", "convert", str(moved), str(out), "--set", "pad_id=none"]) == 0
    assert formats.load(out).config.pad_id is None
    again = tmp_path / "again"  # our own export has no vocabulary either: it records the pad id it wrote
    assert main(["--quiet", "convert", str(out), str(again), "--to", "kerashub-bert"]) == 0
    assert formats.load(again).config.pad_id is None
