"""BERT's relatives (RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT, ELECTRA, MPNet) against transformers itself: tiny
random models with odd sizes (36 wide, 3 heads, an intermediate size of 37, a vocabulary of 53, 2 layers; ALBERT 3 layers sharing one set
of weights over 20-wide factorized embeddings), every weight perturbed (LayerNorm gammas away from 1, betas away from
0), ids holding token 0 and the pad id (at the end of a row and inside one, where RoBERTa's positions skip it). Each is
saved with `save_pretrained`, imported, run by the float64 reference and both twins, compared with transformers in
float32 and float64, exported back and reloaded by transformers, verified by the CLI against transformers (the
built-in source), and the settings we do not implement are refused."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import cli, formats
from transformer_parity.layouts import hf_dir, hf_family
from transformer_parity.verify.source_hf import exact_float64

from .support.hf_models import perturbed
from .tolerances import property_atol

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB = 53
SIZES = dict(vocab_size=VOCAB, hidden_size=36, num_attention_heads=3, intermediate_size=37, num_hidden_layers=2,
             max_position_embeddings=40)
DISTIL_SIZES = dict(vocab_size=VOCAB, dim=36, n_heads=3, hidden_dim=37, n_layers=2, max_position_embeddings=40)
ALBERT_SIZES = dict(SIZES, num_hidden_layers=3, embedding_size=20, pad_token_id=3)
# DeBERTa: 5 heads of 8, 8 log buckets reaching distance 9 (shorter than the 13-token inputs), a normed relative table
DEBERTA_SIZES = dict(SIZES, hidden_size=40, num_attention_heads=5, pad_token_id=3, relative_attention=True,
                     position_buckets=8, max_relative_positions=9, pos_att_type="p2c|c2p", norm_rel_ebd="layer_norm")
MODERNBERT = dict(SIZES, num_hidden_layers=3, global_attn_every_n_layers=3, local_attention=4, pad_token_id=3,
                  bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None,
                  global_rope_theta=500.0, local_rope_theta=30.0)
MODELS = {  # id -> (transformers class, config class, its settings, our format)
    # a tanh-GELU encoder: RobertaLMHead's exact GELU must come from the head, not hidden_act
    "roberta-mlm": ("RobertaForMaskedLM", "RobertaConfig", dict(SIZES, hidden_act="gelu_new"), "hf-roberta"),
    "roberta": ("RobertaModel", "RobertaConfig", dict(SIZES, pad_token_id=4), "hf-roberta"),
    "xlm-roberta-mlm": ("XLMRobertaForMaskedLM", "XLMRobertaConfig", dict(SIZES, type_vocab_size=1),
                        "hf-xlm-roberta"),
    "distilbert-mlm": ("DistilBertForMaskedLM", "DistilBertConfig", dict(DISTIL_SIZES, pad_token_id=3),
                       "hf-distilbert"),
    "distilbert": ("DistilBertModel", "DistilBertConfig", dict(DISTIL_SIZES, pad_token_id=3, activation="relu"),
                   "hf-distilbert"),
    "albert-mlm": ("AlbertForMaskedLM", "AlbertConfig", ALBERT_SIZES, "hf-albert"),  # gelu_new, ALBERT's default
    "albert": ("AlbertModel", "AlbertConfig", dict(ALBERT_SIZES, hidden_act="gelu"), "hf-albert"),
    # the backbones KerasHub holds (test_hf_to_kerashub.py): BERT and ALBERT with tanh GELU, DistilBERT with GELU
    "bert-tanh-gelu": ("BertModel", "BertConfig", dict(SIZES, hidden_act="gelu_new", pad_token_id=3), "hf-bert"),
    "distilbert-gelu": ("DistilBertModel", "DistilBertConfig", dict(DISTIL_SIZES, pad_token_id=3), "hf-distilbert"),
    "albert-tanh-gelu": ("AlbertModel", "AlbertConfig", ALBERT_SIZES, "hf-albert"),
    # ELECTRA: BERT's layers over 20-wide embeddings projected to 36 (the generator's masked LM, its head's GELU
    # exact whatever hidden_act is), and at the full width with no projection (the bare model, no pooler)
    "electra-mlm": ("ElectraForMaskedLM", "ElectraConfig", dict(SIZES, embedding_size=20, pad_token_id=3,
                                                                hidden_act="gelu_new"), "hf-electra"),
    "electra": ("ElectraModel", "ElectraConfig", dict(SIZES, embedding_size=36, pad_token_id=3), "hf-electra"),
    # DeBERTa-v2: absolute positions and segments beside the disentangled attention's own projections (legacy head);
    # v3: no absolute positions, the positions projected by the layers' q and k (share_att_key)
    "deberta-v2-mlm": ("DebertaV2ForMaskedLM", "DebertaV2Config", dict(DEBERTA_SIZES, type_vocab_size=2),
                       "hf-deberta-v2"),
    "deberta-v3": ("DebertaV2Model", "DebertaV2Config", dict(DEBERTA_SIZES, position_biased_input=False,
                                                             share_att_key=True), "hf-deberta-v2"),
    # MPNet: RoBERTa's positions and head, no segments, one relative position bias table for every layer (32
    # buckets to distance 128); a tanh-GELU encoder under the head's exact GELU
    "mpnet-mlm": ("MPNetForMaskedLM", "MPNetConfig", dict(SIZES, hidden_act="gelu_new"), "hf-mpnet"),
    # ModernBERT: rotary positions, a gated GELU feed-forward, 3 layers (full, sliding, sliding: a window of 2 each
    # way, shorter than the input) at two rotary bases, every bias there is (LayerNorms' too); the bare model
    # without biases, norms without one, every third layer full
    "modernbert-mlm": ("ModernBertForMaskedLM", "ModernBertConfig", dict(MODERNBERT, norm_bias=True,
                                                                         attention_bias=True, mlp_bias=True,
                                                                         classifier_bias=True,
                                                                         classifier_activation="gelu_new"),
                       "hf-modernbert"),
    "modernbert": ("ModernBertModel", "ModernBertConfig", MODERNBERT, "hf-modernbert"),
}
_cache: dict = {}


def hf_model(name: str, tmp_path_factory):
    """`(transformers model in eval mode, its save_pretrained directory)`, built once per session, every parameter
    perturbed by 0.1 N(0, 1)."""
    if name not in _cache:
        _cache[name] = perturbed(*MODELS[name][:3], name, tmp_path_factory.mktemp(name))
    return _cache[name]


def inputs(config: rn.TransformerConfig, seed: int = 0):
    """`(ids (3, 13), segment ids or None, transformers kwargs)`: id 0 in every row; row 1 right-padded, row 2 with a
    pad inside it (RoBERTa numbers the tokens after it as if it were not there); the attention mask marks the pads,
    as a tokenizer's would."""
    rng = np.random.default_rng(seed)
    pad = config.pad_id
    ids = rng.integers(0, VOCAB - 1, size=(3, 13))
    ids = np.where(ids >= pad, ids + 1, ids)  # no pad but the planted ones
    ids[:, 2] = 0
    ids[1, 9:] = pad
    ids[2, 5] = pad
    hf = {"input_ids": torch.as_tensor(ids), "attention_mask": torch.as_tensor((ids != pad).astype(np.int64))}
    types = None
    if config.type_vocab_size > 1:
        types = (np.arange(13)[None, :] >= np.array([[6], [4], [13]])).astype(np.int64)  # sentence A | sentence B
        hf["token_type_ids"] = torch.as_tensor(types)
    return ids, types, hf


def hf_output(model, hf_kwargs) -> np.ndarray:
    with torch.no_grad():
        out = model(**hf_kwargs)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).double().numpy()


def float64_model(model, loaded):
    """A float64 copy of `model`, with what transformers keeps in float32 even then (ModernBERT's rotary tables and
    rotation) computed in float64, as verify's built-in source does (`source_hf`)."""
    model64 = copy.deepcopy(model).double()
    fix = hf_family(loaded.format).float64_fix
    if fix is not None:
        fix.apply(model64, loaded.config)
    if loaded.config.positional == "rope":
        exact_float64(model64, loaded.config)
    return model64


def ours(loaded, ids, types, dtype=np.float64) -> np.ndarray:
    return rn.Transformer(loaded.config, loaded.weights, dtype)(ids, src_type_ids=types)


# --- (1) the import computes what transformers computes, in float32 and float64 -------------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_float64_reference_matches_transformers_in_float32_and_float64(name, tmp_path_factory):
    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    assert loaded.format == MODELS[name][3]
    ids, types, hf_kwargs = inputs(loaded.config)
    actual = ours(loaded, ids, types)
    np.testing.assert_allclose(actual, hf_output(model, hf_kwargs), rtol=0, atol=1e-4)
    np.testing.assert_allclose(actual, hf_output(float64_model(model, loaded), hf_kwargs), rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", ["torch_impl", "tf_impl"])
@pytest.mark.parametrize("name", list(MODELS))
def test_both_twins_match_the_reference_on_the_import(name, impl, tmp_path_factory):
    loaded = formats.load(hf_model(name, tmp_path_factory)[1])
    ids, types, _ = inputs(loaded.config)
    desired = ours(loaded, ids, types)
    floor = np.max(np.abs(ours(loaded, ids, types, np.float32) - desired))
    if impl == "torch_impl":
        import torch_impl

        with torch.no_grad():
            actual = torch_impl.Transformer.from_reference(loaded.config, loaded.weights)(
                ids, src_type_ids=types).double().numpy()
    else:
        import tf_impl

        actual = np.asarray(tf_impl.Transformer.from_reference(loaded.config, loaded.weights, dtype="float32")(
            ids, src_type_ids=types), np.float64)
    np.testing.assert_allclose(actual, desired, rtol=0, atol=property_atol("float32", floor))


def test_roberta_positions_skip_the_pad_tokens(tmp_path_factory):
    """The import reads RoBERTa's positions as `positions_skip_pad` with the table offset by pad + 1; plain offset
    positions (what the table's shape alone suggests) are off on every row with a pad in it, so the test can tell."""
    model, path = hf_model("roberta-mlm", tmp_path_factory)
    loaded = formats.load(path)
    assert (loaded.config.positions_skip_pad, loaded.config.position_offset, loaded.config.max_len) == (True, 2, 38)
    assert loaded.config.head_activation == "gelu" and loaded.config.activation == "gelu_tanh"
    ids, types, hf_kwargs = inputs(loaded.config)
    plain = rn.Transformer(loaded.config.replace(positions_skip_pad=False), loaded.weights)(ids, src_type_ids=types)
    off = np.abs(plain - hf_output(model, hf_kwargs)).max(axis=(1, 2))
    assert off[0] < 1e-4 and off[1] > 1e-2 and off[2] > 1e-2, off


def test_roberta_pooler_matches_transformers(tmp_path_factory):
    model, path = hf_model("roberta", tmp_path_factory)
    loaded = formats.load(path)
    assert loaded.config.pooler and loaded.config.pad_id == 4 and loaded.config.position_offset == 5
    ids, types, hf_kwargs = inputs(loaded.config)
    desired = rn.Transformer(loaded.config, loaded.weights).trace(ids, src_type_ids=types)["pooler"]
    with torch.no_grad():
        actual = model(**hf_kwargs).pooler_output.double().numpy()
    np.testing.assert_allclose(actual, desired, rtol=0, atol=1e-5)


# --- (2) the export loads into transformers, as the same family, and computes the same ------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_export_reloads_in_transformers_with_the_same_outputs(name, tmp_path_factory, tmp_path):
    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    formats.save(tmp_path / "out", loaded.config, dict(loaded.weights), MODELS[name][3])
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == json.loads((path / "config.json").read_text())["model_type"]
    auto = transformers.AutoModelForMaskedLM if loaded.config.output_projection else transformers.AutoModel
    again, info = auto.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert type(again) is type(model) and not any(info.values()), info
    _, _, hf_kwargs = inputs(loaded.config)
    np.testing.assert_array_equal(hf_output(again.eval(), hf_kwargs), hf_output(model, hf_kwargs))


@pytest.mark.parametrize("name", ["roberta-mlm", "distilbert", "albert-mlm"])
def test_round_trip_through_keras_is_bit_identical(name, tmp_path_factory, tmp_path):
    _, path = hf_model(name, tmp_path_factory)
    for argv in ([str(path), str(tmp_path / "m.weights.h5")],
                 [str(tmp_path / "m.weights.h5"), str(tmp_path / "back"), "--to", MODELS[name][3]]):
        assert cli.main(["convert", "-q", *argv]) == 0
    original, back = hf_dir.read_state(path), hf_dir.read_state(tmp_path / "back")
    assert sorted(original) == sorted(back)
    assert all(np.array_equal(original[k], back[k]) for k in original)


def test_a_roberta_model_has_no_bert_or_distilbert_equivalent(tmp_path_factory, tmp_path, capsys):
    loaded = formats.load(hf_model("roberta-mlm", tmp_path_factory)[1])
    with pytest.raises(ValueError, match=r"as hf-bert: positions_skip_pad=True \(positions counted over non-pad "
                                         r"ids, which hf-roberta, hf-xlm-roberta, hf-mpnet and hf-m2m-100 have; hf-bert has none\)"):
        formats.save(tmp_path / "bert", loaded.config, dict(loaded.weights), "hf-bert")
    with pytest.raises(ValueError, match="as hf-distilbert: positions_skip_pad=True"):
        formats.save(tmp_path / "distil", loaded.config, dict(loaded.weights), "hf-distilbert")
    assert formats.save(tmp_path / "auto", loaded.config, dict(loaded.weights), "hf")[1] == "hf-roberta"


# --- (3) verify judges the directory against transformers -------------------------------------------------------------

@pytest.mark.parametrize("name", [name for name in MODELS if name != "deberta-v3"])  # v2's verify covers v3's blocks
def test_verify_judges_the_directory_against_transformers(name, tmp_path_factory, tmp_path, capsys):
    _, path = hf_model(name, tmp_path_factory)
    report = tmp_path / "report.json"
    assert cli.main(["verify", str(path), "--src-len", "13", "--json", str(report)]) == 0, capsys.readouterr().err
    result = json.loads(report.read_text())
    assert result["verdict"].startswith("PASS: matches the source (transformers"), result["verdict"]
    assert [run["label"] for run in result["source"]["runs"]] == ["transformers-f32", "transformers-f64"]
    judged = {row["sublayer"] for row in result["rows"] if "transformers-f64" in row["backends"]}
    wanted = {"encoder.embed", "encoder.layers.1.self_attn", "encoder.layers.1.ffn", "encoder.layers.1"}
    wanted |= {"head", "logits"} if MODELS[name][0].endswith("MaskedLM") else {"last_hidden_state"}
    assert wanted <= judged, judged


# --- (4) what we do not implement is refused, with one line naming the field -----------------------------------------

@pytest.mark.parametrize("name, field, value, named", [
    ("distilbert-mlm", "sinusoidal_pos_embds", True, "config.json sinusoidal_pos_embds=True is not supported"),
    ("roberta-mlm", "position_embedding_type", "relative_key", "position_embedding_type='relative_key'"),
    ("roberta-mlm", "is_decoder", True, "config.json is_decoder=True is not supported"),
    ("roberta-mlm", "pad_token_id", None, "config.json pad_token_id=None is not supported"),
    ("xlm-roberta-mlm", "max_position_embeddings", 2, "max_position_embeddings=2 leaves no position"),
    ("roberta", "type_vocab_size", 0, "config.json type_vocab_size=0 is not supported"),
    ("distilbert", "activation", "gelu_fast", "config.json activation='gelu_fast' is not supported"),
    ("albert-mlm", "num_hidden_groups", 2, "config.json num_hidden_groups=2 is not supported (only 1)"),
    ("albert", "inner_group_num", 2, "config.json inner_group_num=2 is not supported (only 1)"),
    ("deberta-v2-mlm", "conv_kernel_size", 3, "config.json conv_kernel_size=3 is not supported (only 0)"),
    ("deberta-v2-mlm", "legacy", False, "config.json legacy=False is not supported (only True)"),
    ("deberta-v2-mlm", "tie_word_embeddings", False, "config.json tie_word_embeddings=False is not supported"),
    ("deberta-v3", "pos_att_type", ["c2p", "p2p"], "config.json pos_att_type=['c2p', 'p2p'] is not supported"),
    ("deberta-v3", "embedding_size", 20, "config.json embedding_size=20 is not supported (only hidden_size=40)"),
    ("mpnet-mlm", "relative_attention_num_buckets", 16, "config.json relative_attention_num_buckets=16 is not "
                                                         "supported (only 32)"),
    ("mpnet-mlm", "pad_token_id", 0, "config.json pad_token_id=0 is not supported (only 1)"),
    ("modernbert", "rope_parameters", {"full_attention": {"rope_type": "linear", "rope_theta": 10.0, "factor": 2.0}},
     "rope_parameters.full_attention={'rope_type': 'linear'"),
    ("modernbert", "layer_types", ["full_attention", "chunked_attention", "full_attention"], "layer_types=["),
])
def test_a_config_field_we_do_not_implement_is_refused(name, field, value, named, tmp_path_factory, tmp_path,
                                                       capsys):
    _, path = hf_model(name, tmp_path_factory)
    edited = shutil.copytree(path, tmp_path / "edited")
    config = json.loads((edited / "config.json").read_text())
    config[field] = value
    (edited / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert cli.main(["convert", str(edited), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("buckets, distance", [(8, 9), (8, 40), (256, 512), (64, 128)])
def test_deberta_log_buckets_are_transformers(buckets, distance):
    """The reference's log buckets (float64) are transformers' (float32) at every distance a model of that size
    reads: the tested models' and the released checkpoints' (256 buckets to 512)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    relative = np.arange(-distance, distance + 1)
    desired = make_log_bucket_position(torch.as_tensor(relative), buckets, distance).long().numpy()
    np.testing.assert_array_equal(rn.ops.log_bucket_positions(relative, buckets, distance), desired)


def test_a_short_probe_names_the_relative_rows_it_left_out():
    """verify's coverage: a probe shorter than max_relative_positions + 1 reads only some rows of the relative table,
    and says which; `--cover` lengthens it to read them all."""
    from transformer_parity.verify import coverage

    config = rn.TransformerConfig(src_vocab_size=53, tgt_vocab_size=53, d_model=40, num_heads=5, d_ff=37,
                                  num_encoder_layers=1, num_decoder_layers=0, max_len=40, positional="none",
                                  relative_terms=("c2p", "p2c"), relative_buckets=8, max_relative_positions=9)
    notes = coverage.not_exercised(config, np.ones((1, 5), np.int64), None, None)
    assert "relative positions: the probe's distances up to 4 read rows 4..12 of the 16-row table" in notes[-1]
    assert coverage.cover_lengths(config, 5, 5)[0] == 10
    assert not any("relative" in n for n in coverage.not_exercised(config, np.ones((1, 10), np.int64), None, None))


def test_a_deberta_model_has_no_bert_equivalent(tmp_path_factory, tmp_path):
    """Disentangled attention, zeroed padding embeddings and averaging padding queries are DeBERTa's alone: an
    export to BERT names each; invalid values are refused naming the field."""
    loaded = formats.load(hf_model("deberta-v2-mlm", tmp_path_factory)[1])
    with pytest.raises(ValueError) as info:
        formats.save(tmp_path / "bert", loaded.config, dict(loaded.weights), "hf-bert")
    for named in ("relative_terms=('c2p', 'p2c') (disentangled attention over relative positions, which "
                  "hf-deberta-v2 and kerashub-deberta-v3 have; hf-bert has none)",
                  "embed_zero_padding=True (embeddings zeroed at padding, which hf-deberta-v2 has; hf-bert has none)",
                  "padded_queries='average'"):
        assert named in str(info.value), str(info.value)
    for field, value in (("relative_terms", ("c2p", "p2p")), ("relative_buckets", 16),
                         ("padded_queries", "zero")):
        with pytest.raises(ValueError, match=field):
            loaded.config.replace(**{field: value})


def test_distilbert_export_refuses_what_it_cannot_hold(tmp_path_factory, tmp_path):
    """DistilBERT's LayerNorms are fixed at 1e-12 and it has no segment embeddings or pooler: a config with any of
    them is refused, naming each."""
    loaded = formats.load(hf_model("distilbert", tmp_path_factory)[1])
    config = loaded.config.replace(layer_norm_eps=1e-5, type_vocab_size=2, pooler=True)
    weights = rn.init_weights(config)
    with pytest.raises(ValueError) as info:
        formats.save(tmp_path / "out", config, weights, "hf-distilbert")
    for named in ("layer_norm_eps=1e-05 (DistilBERT needs 1e-12)", "type_vocab_size=2 (DistilBERT has no segment",
                  "pooler=True (transformers' bare DistilBERT model never has a pooler)"):
        assert named in str(info.value), str(info.value)
    assert not (tmp_path / "out").exists()


# --- ModernBERT: a padded row computes on its real tokens what the row alone computes ----------------------------

def test_modernbert_padded_rows_compute_what_the_unpadded_ones_do(tmp_path_factory):
    """transformers' unpadded path (flash attention: the real tokens packed, no padding) is not run on CPU; what it
    promises, that padding changes nothing at the real tokens, holds for the padded model here and in transformers:
    the right-padded row, run alone without its pads, gives the same outputs at its 9 real tokens (its local layers'
    windows reach past where the pads begin)."""
    model, path = hf_model("modernbert-mlm", tmp_path_factory)
    loaded = formats.load(path)
    ids, types, hf_kwargs = inputs(loaded.config)
    padded, alone = ours(loaded, ids, types)[1, :9], ours(loaded, ids[1:2, :9], None)[0]
    np.testing.assert_allclose(padded, alone, rtol=0, atol=1e-12)
    theirs = hf_output(model, {"input_ids": hf_kwargs["input_ids"][1:2, :9]})[0]
    np.testing.assert_allclose(hf_output(model, hf_kwargs)[1, :9], theirs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(theirs, alone, rtol=0, atol=1e-4)


# --- ALBERT: factorized embeddings and one set of layer weights, in all three implementations ------------------------

def test_albert_reads_as_shared_layers_over_factorized_embeddings(tmp_path_factory):
    """One layer's weights (`encoder.layers.0.*`) run three times, and 20-wide tables projected to 36; the same
    weights copied into three unshared layers compute the same, so sharing is exactly a copy of the weights."""
    loaded = formats.load(hf_model("albert-mlm", tmp_path_factory)[1])
    config, weights = loaded.config, loaded.weights
    assert (config.embedding_size, config.shared_layers, config.num_encoder_layers) == (20, True, 3)
    assert weights["src_embed.embedding"].shape == (VOCAB, 20) and weights["src_embed_proj.kernel"].shape == (20, 36)
    assert weights["head.dense.kernel"].shape == (36, 20) and not any(k.startswith("encoder.layers.1") for k in weights)
    unshared = config.replace(shared_layers=False)
    copied = dict(weights)
    for i in (1, 2):
        copied.update({k.replace("layers.0.", f"layers.{i}."): v for k, v in weights.items() if ".layers.0." in k})
    ids, types, _ = inputs(config)
    np.testing.assert_array_equal(ours(loaded, ids, types), rn.Transformer(unshared, copied)(ids, src_type_ids=types))
    with pytest.raises(ValueError, match="as hf-albert: shared_layers=False"):
        formats.save(tmp_path_factory.mktemp("unshared") / "out", unshared, copied, "hf-albert")


def test_albert_and_roberta_models_have_no_bert_equivalent_and_back(tmp_path_factory, tmp_path):
    albert = formats.load(hf_model("albert-mlm", tmp_path_factory)[1])
    with pytest.raises(ValueError) as info:
        formats.save(tmp_path / "bert", albert.config, dict(albert.weights), "hf-bert")
    assert ("embedding_size=20 (factorized embeddings, which hf-albert, hf-electra, kerashub-albert and "
            "kerashub-electra have; hf-bert has none)" in str(info.value))
    assert ("shared_layers=True (one set of layer weights run by every layer, which hf-albert and kerashub-albert "
            "have; hf-bert has none)" in str(info.value))
    bert = albert.config.replace(embedding_size=None, shared_layers=False)
    with pytest.raises(ValueError, match=r"as hf-albert: embedding_size=None \(ALBERT's embeddings are factorized"):
        formats.save(tmp_path / "albert", bert, rn.init_weights(bert), "hf-albert")
    assert not (tmp_path / "bert").exists() and not (tmp_path / "albert").exists()


def _h5_structure(path):
    import h5py

    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: out.__setitem__(name, (getattr(obj, "shape", None), dict(obj.attrs))))
    return out


@pytest.mark.parametrize("name", ["albert-mlm", "albert", "roberta-mlm", "deberta-v2-mlm"])
def test_keras_weights_h5_is_what_keras_writes_and_reads(name, tmp_path_factory, tmp_path):
    """The `.weights.h5` layout of the new settings (the embedding projection, the one shared layer) is the one Keras
    itself writes for tf_impl, and Keras reads ours back to the same weights."""
    from transformer_parity.formats import keras_file as kc
    from tf_impl.model import Transformer

    loaded = formats.load(hf_model(name, tmp_path_factory)[1])
    model = Transformer.from_reference(loaded.config, loaded.weights)
    model.save_weights(tmp_path / "keras.weights.h5")
    kc.save_weights_h5(tmp_path / "ours.weights.h5", loaded.config, loaded.weights)
    assert _h5_structure(tmp_path / "keras.weights.h5") == _h5_structure(tmp_path / "ours.weights.h5")
    fresh = Transformer(loaded.config)
    fresh.build()
    fresh.load_weights(tmp_path / "ours.weights.h5")
    back = fresh.to_reference()
    assert sorted(back) == sorted(loaded.weights) and all(np.array_equal(back[k], v) for k, v in loaded.weights.items())
