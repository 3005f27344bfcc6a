"""Streaming conversion: a sharded bfloat16 Hugging Face directory converted tensor by tensor, its dtype kept, its
tensors bit-identical after the trip, the output sharded as `save_pretrained` shards it; what cannot fit refused in
one line. (Speed and peak memory are figures of `benchmarks/bench_streaming.py`, not tests.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity.streaming import lazy as lz
from transformer_parity.streaming import writer as rio
from transformer_parity.streaming.lazy import LazyArray
from transformer_parity import formats
from transformer_parity.cli import main
from transformer_parity.io import limits, safetensors_io
from transformer_parity.layouts import hf_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory):
    """A tiny random Llama (GQA 6/2, odd sizes) saved by transformers in bfloat16, sharded into several files."""
    config = transformers.LlamaConfig(vocab_size=53, hidden_size=48, intermediate_size=37, num_hidden_layers=2,
                                      num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("bf16") / "llama"
    model.save_pretrained(path, max_shard_size="20KB")
    return model, path


def state_of(path) -> dict:
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    return model.dtype, {k: v.clone() for k, v in model.state_dict().items()}


def test_lazy_load_reads_nothing_until_asked(bf16_llama):
    _, path = bf16_llama
    reads = []
    loaded = formats.load(path, on_tensor=lambda name, n: reads.append(name), lazy=True)
    assert len(hf_dir.weight_files(path)) > 1 and reads == []
    assert all(isinstance(v, LazyArray) for v in loaded.weights.values())
    assert rn.weights_dtype(loaded.weights).name == "bfloat16"
    np.asarray(loaded.weights["decoder.layers.1.self_attn.k.kernel"])
    assert reads == ["model.layers.1.self_attn.k_proj.weight"]


def test_eager_and_lazy_reads_agree(bf16_llama):
    _, path = bf16_llama
    eager = formats.load(path)
    lazy = formats.load(path, lazy=True)
    assert eager.config == lazy.config
    for name, value in eager.weights.items():
        np.testing.assert_array_equal(np.asarray(lazy.weights[name]).astype(np.float32), value, err_msg=name)


def test_convert_keeps_bfloat16_both_ways_and_shards_like_save_pretrained(bf16_llama, tmp_path):
    model, path = bf16_llama
    canonical = tmp_path / "model.safetensors"
    assert main(["convert", str(path), str(canonical), "-q"]) == 0
    header = safetensors_io.read_header(canonical)
    assert set(header.stored.values()) == {"BF16"}
    out = tmp_path / "hf"
    assert main(["convert", str(canonical), str(out), "--to", "hf", "--max-shard-size", "30KB", "-q"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{k}-of-0000{len(files)}.safetensors" for k in range(1, len(files) + 1)]
    assert len(files) > 1 and all((out / f).stat().st_size <= 30_000 + 4096 for f in files)
    assert index["metadata"]["total_size"] == sum(p.numel() * 2 for p in model.state_dict().values())
    dtype, theirs = state_of(out)
    assert dtype == torch.bfloat16
    ours = model.state_dict()
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)


def test_dtype_casts_as_written_and_half_is_refused_where_it_cannot_be_kept(bf16_llama, tmp_path, capsys):
    model, path = bf16_llama
    assert main(["convert", str(path), str(tmp_path / "f32"), "--to", "hf", "--dtype", "float32", "-q"]) == 0
    dtype, theirs = state_of(tmp_path / "f32")
    assert dtype == torch.float32
    assert all(torch.equal(theirs[k], v.float()) for k, v in model.state_dict().items())  # widening is exact
    assert main(["convert", str(path), str(tmp_path / "m.pt"), "--dtype", "bfloat16"]) == 2
    assert "--dtype bfloat16: torch is written in float32 or float64 here" in capsys.readouterr().err
    assert main(["convert", str(path), str(tmp_path / "m.pt")]) == 0
    assert "written as float32 (exactly): torch" in capsys.readouterr().err


def test_a_tensor_that_cannot_fit_is_refused_with_the_figures(bf16_llama, tmp_path, capsys, monkeypatch):
    _, path = bf16_llama
    monkeypatch.setattr(limits, "available_bytes", lambda: 10_000)
    assert main(["convert", str(path), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "convert needs about 14.9 KiB at once (its largest tensor, tgt_embed.embedding, 5.0 KiB" in err, err
    assert "9.8 KiB is available" in err
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("to", ["out.safetensors", "keras.weights.h5"])
def test_a_disk_that_fills_while_writing_ends_in_one_line_and_leaves_nothing(bf16_llama, tmp_path, capsys,
                                                                             monkeypatch, to):
    """The output's bytes go to the disk from the writer's own threads (O_DIRECT where the file system takes it,
    else the page cache): a full disk there is the command's one-line error, exit 2, and no file at the
    destination, whichever path wrote."""
    import errno


    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rio.DirectSink, "_pwrite_all", full)
    monkeypatch.setattr(rio.DirectSink, "SIZE", 4096)  # the tiny model's tensors fill a staging buffer
    real_write = rio.BandWriter._write
    monkeypatch.setattr(rio.BandWriter, "_write", lambda self, data, owner=None: (
        full() if self.sink is None and self.opened and len(data) > 1000 else real_write(self, data, owner)))
    _, path = bf16_llama
    assert main(["convert", str(path), str(tmp_path / to), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err and "Traceback" not in err, err
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize("text, expected", [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30),
                                            ("1234", 1234), ("1.5KB", 1500)])
def test_sizes_parse_as_transformers_writes_them(text, expected):
    assert limits.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0", "5XB", "-1GB", "GB"])
def test_bad_sizes_are_refused_naming_the_value(text):
    with pytest.raises(Exception, match="a size must be a positive number of bytes"):
        limits.parse_size(text)


def test_shards_never_split_a_tensor_and_respect_the_limit():
    groups = hf_dir.shards({"a": 40, "b": 70, "c": 30, "d": 200, "e": 10}, 100)
    assert groups == [["a"], ["b", "c"], ["d"], ["e"]]


def test_a_streamed_tensor_is_written_a_band_at_a_time(bf16_llama, tmp_path):
    """Writing a `.weights.h5` never asks a lazy tensor for its whole value: a file's bytes, a transpose and a
    widening are each made a band of rows at a time (here 1 KiB, so every large tensor takes several bands)."""
    h5py = pytest.importorskip("h5py")
    from transformer_parity.streaming import hdf5

    _, path = bf16_llama
    loaded = formats.load(path, lazy=True)
    eager = formats.load(path)
    whole = []
    for name, value in loaded.weights.items():  # a whole read would be recorded
        value._compute = lambda name=name: whole.append(name)
    with h5py.File(tmp_path / "banded.h5", "w") as f:
        for name, value in loaded.weights.items():
            hdf5.write_dataset(f, name, value.astype(np.float32), max_bytes=1024)
    assert whole == []
    with h5py.File(tmp_path / "banded.h5") as f:
        for name, value in eager.weights.items():
            np.testing.assert_array_equal(f[name][()], value, err_msg=name)


def test_keras_weights_streamed_equal_the_whole_tensor_write_bit_for_bit(bf16_llama, tmp_path):
    _, path = bf16_llama
    assert main(["convert", str(path), str(tmp_path / "streamed.weights.h5"), "--dtype", "float32", "-q"]) == 0
    eager = formats.load(path)  # read whole, widened to float32
    formats.save(tmp_path / "whole.weights.h5", eager.config, eager.weights, origin=eager.origin)
    assert (tmp_path / "streamed.weights.h5").read_bytes() == (tmp_path / "whole.weights.h5").read_bytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"], ids=["as-stored", "--dtype-float32"])
def test_a_bfloat16_llama_streams_to_a_kerashub_preset_keras_hub_loads(bf16_llama, tmp_path, dtype):
    """HF directory (bfloat16, sharded) -> KerasHub preset, streamed: bfloat16 kept as KerasHub stores it (or cast by
    --dtype); keras_hub's loaded weights are the source tensors, bit for bit; the preset reads back the same."""
    keras_hub = pytest.importorskip("keras_hub")
    model, path = bf16_llama
    out = tmp_path / "preset"
    extra = ["--dtype", dtype] if dtype == "float32" else []
    assert main(["convert", str(path), str(out), "--to", "kerashub-llama", "-q", *extra]) == 0
    assert json.loads((out / "config.json").read_text())["config"]["dtype"]["config"]["name"] == dtype
    backbone = keras_hub.models.LlamaBackbone.from_preset(str(out), dtype=dtype)
    src = {k: v.float().numpy() for k, v in model.state_dict().items()}
    d, heads, kv_heads = 48, 6, 2
    dk = d // heads
    expected = {"token_embedding/embeddings": src["model.embed_tokens.weight"],
                "token_embedding/reverse_embeddings": src["lm_head.weight"].T,
                "sequence_output_layernorm/scale": src["model.norm.weight"]}
    for i in range(2):
        p, layer = f"model.layers.{i}.", f"transformer_layer_{i}/"
        expected.update({
            layer + "self_attention/query/kernel": src[p + "self_attn.q_proj.weight"].T.reshape(d, heads, dk),
            layer + "self_attention/key/kernel": src[p + "self_attn.k_proj.weight"].T.reshape(d, kv_heads, dk),
            layer + "self_attention/value/kernel": src[p + "self_attn.v_proj.weight"].T.reshape(d, kv_heads, dk),
            layer + "self_attention/attention_output/kernel": src[p + "self_attn.o_proj.weight"].T.reshape(heads, dk,
                                                                                                             d),
            layer + "self_attention_layernorm/scale": src[p + "input_layernorm.weight"],
            layer + "feedforward_gate_dense/kernel": src[p + "mlp.gate_proj.weight"].T,
            layer + "feedforward_intermediate_dense/kernel": src[p + "mlp.up_proj.weight"].T,
            layer + "feedforward_output_dense/kernel": src[p + "mlp.down_proj.weight"].T,
            layer + "feedforward_layernorm/scale": src[p + "post_attention_layernorm.weight"]})
    theirs = {w.path: w for w in backbone.weights}
    assert theirs.keys() == expected.keys()
    for key, want in expected.items():
        assert theirs[key].dtype == dtype, key
        np.testing.assert_array_equal(np.asarray(theirs[key].numpy()).astype(np.float32), want, err_msg=key)
    back = formats.load(out)
    eager = formats.load(path)
    assert back.config.replace(max_len=eager.config.max_len) == eager.config  # a preset does not store max_len
    for name, value in eager.weights.items():
        np.testing.assert_array_equal(back.weights[name], value, err_msg=name)


def test_keras_weights_keep_bfloat16_as_keras_stores_it_and_read_back_lazily(bf16_llama, tmp_path):
    """HF (bfloat16) -> our Keras .weights.h5 -> HF, streamed both ways: the file holds bfloat16 as Keras stores it
    (2-byte opaque, `dtype="bfloat16"`), Keras's own `load_weights` reads it into our Keras model with the source's
    values, and the directory written back holds the source's tensors bit for bit, in bfloat16."""
    h5py = pytest.importorskip("h5py")
    from tf_impl.model import Transformer

    model, path = bf16_llama
    out = tmp_path / "m.weights.h5"
    assert main(["convert", str(path), str(out), "-q"]) == 0
    with h5py.File(out) as f:
        kinds = set()
        f.visititems(lambda _, obj: kinds.add((obj.dtype.str, obj.attrs.get("dtype")))
                     if isinstance(obj, h5py.Dataset) else None)
    assert kinds == {("|V2", "bfloat16")}
    eager = formats.load(path)  # widened to float32, exactly
    keras_model = Transformer(eager.config)
    keras_model.build()
    keras_model.load_weights(out)
    for name, value in keras_model.to_reference().items():
        np.testing.assert_array_equal(value, eager.weights[name], err_msg=name)
    lazy = formats.load(out, lazy=True)
    assert all(isinstance(v, LazyArray) and v.span is not None for v in lazy.weights.values())
    assert rn.weights_dtype(lazy.weights).name == "bfloat16"
    assert main(["convert", str(out), str(tmp_path / "back"), "--to", "hf", "-q"]) == 0
    dtype, theirs = state_of(tmp_path / "back")
    assert dtype == torch.bfloat16
    ours = model.state_dict()
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)


def test_a_kerashub_preset_reads_lazily_and_converts_back_bit_for_bit(bf16_llama, tmp_path):
    """A bfloat16 KerasHub preset read lazily: every weight a `LazyArray` over the file's bytes, nothing read until
    asked, bfloat16 kept; the HF directory converted from it holds the source's tensors bit for bit."""
    model, path = bf16_llama
    preset = tmp_path / "preset"
    assert main(["convert", str(path), str(preset), "--to", "kerashub-llama", "-q"]) == 0
    lazy = formats.load(preset, lazy=True)
    assert all(isinstance(v, LazyArray) for v in lazy.weights.values())
    assert rn.weights_dtype(lazy.weights).name == "bfloat16"
    eager = formats.load(preset)
    for name, value in eager.weights.items():
        np.testing.assert_array_equal(np.asarray(lazy.weights[name]).astype(np.float32), value, err_msg=name)
    assert main(["convert", str(preset), str(tmp_path / "back"), "--to", "hf", "-q"]) == 0
    _, theirs = state_of(tmp_path / "back")
    ours = model.state_dict()
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)


def test_a_mixture_of_experts_streams_to_a_kerashub_preset_and_back_bit_for_bit(tmp_path):
    """KerasHub stores each layer's experts as one bank `(experts, in, 2 x out)`: written lazily (a bank made when it
    is written, from its experts' lazy parts) and read lazily (each expert's rows of the bank from the file's bytes,
    `lazy.leading_rows`), so that a conversion holds one bank, not the model. A bfloat16 Mixtral goes to a preset
    and back with every tensor bit for bit."""
    config = transformers.MixtralConfig(vocab_size=53, hidden_size=48, intermediate_size=37, num_hidden_layers=2,
                                        num_attention_heads=6, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    preset = tmp_path / "preset"
    assert main(["convert", str(tmp_path / "hf"), str(preset), "--to", "kerashub-mixtral", "-q"]) == 0
    lazy = formats.load(preset, lazy=True)
    expert = lazy.weights["decoder.layers.1.ffn.experts.3.gate.kernel"]
    assert isinstance(expert, LazyArray) and expert.shape == (48, 37)
    eager = formats.load(preset)
    for name, value in eager.weights.items():
        np.testing.assert_array_equal(np.asarray(lazy.weights[name]).astype(np.float32), value, err_msg=name)
    rows = lz.leading_rows(lazy.weights["decoder.layers.0.self_attn.q.kernel"], 5, 9)  # a file's rows, alone
    assert rows.span is not None and rows.shape == (4, 48)
    whole = np.asarray(lazy.weights["decoder.layers.0.self_attn.q.kernel"])
    np.testing.assert_array_equal(np.asarray(rows), whole[5:9])
    assert main(["convert", str(preset), str(tmp_path / "back"), "--to", "hf", "-q"]) == 0
    _, theirs = state_of(tmp_path / "back")
    ours = model.state_dict()
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)


def test_a_chunked_hdf5_dataset_reads_lazily_through_hdf5(tmp_path):
    """A dataset stored in chunks (not what Keras writes, but HDF5 allows it) has no single span of the file: it is
    read through h5py, with the same values; a contiguous one is read from the file's bytes."""
    h5py = pytest.importorskip("h5py")
    from transformer_parity.streaming import hdf5

    values = np.arange(7 * 5, dtype=np.float32).reshape(7, 5) - 3.5
    with h5py.File(tmp_path / "w.h5", "w") as f:
        f.create_dataset("plain", data=values)
        f.create_dataset("chunked", data=values, chunks=(2, 5))
    with h5py.File(tmp_path / "w.h5") as f:
        plain, chunked = hdf5.read_dataset(f["plain"], lazy=True), hdf5.read_dataset(f["chunked"], lazy=True)
    assert plain.span is not None and chunked.span is None
    for lazy in (plain, chunked):
        np.testing.assert_array_equal(np.asarray(lazy), values)
        assert [b for _, _, b in lz.row_bands(lazy, 40)][0].shape == (2, 5)


@pytest.mark.parametrize("to", ["kerashub-llama", "keras"])
def test_a_preset_and_a_keras_file_verify_layer_streamed(bf16_llama, tmp_path, to):
    """The HDF5 outputs read back one dataset at a time are verified one block at a time, as a Hugging Face
    directory is."""
    _, path = bf16_llama
    out = tmp_path / ("preset" if to != "keras" else "m.weights.h5")
    assert main(["convert", str(path), str(out), "--to", to, "-q"]) == 0
    report = tmp_path / "verify.json"
    assert main(["verify", str(out), "--stream", "on", "--src-len", "8", "-q", "--json", str(report)]) == 0
    result = json.loads(report.read_text())
    assert result["mode"] == "layer-streamed" and result["passed"], result["verdict"]


@pytest.mark.parametrize("to", ["canonical.safetensors", "hf-dir", "keras.weights.h5"])
def test_each_made_tensor_has_its_source_read_ahead_and_each_copied_one_not(bf16_llama, tmp_path, monkeypatch, to):
    """While one tensor is written, the file bytes of the tensors after it that are made rather than copied (a
    transpose, a widening) are read on a second thread (`BandWriter.read_ahead`); a tensor copied as it is stored is
    left to the kernel. Every transposed Linear's source span is asked for, once, and the output is unchanged."""

    _, path = bf16_llama
    asked: list[tuple[str, int, int]] = []
    real = rio.read_through
    monkeypatch.setattr(rio, "read_through", lambda span, **kw: (asked.append(span), real(span, **kw))[1])
    out = tmp_path / to if to != "hf-dir" else tmp_path / "hf"
    assert main(["convert", str(path), str(out), "-q", *(["--to", "hf"] if to == "hf-dir" else [])]) == 0
    loaded = formats.load(path, lazy=True)
    spans = {lz.file_span(v) for v in loaded.weights.values()}
    made = {lz.file_span(v) for v in loaded.weights.values() if v.span is None}
    assert asked and set(asked) == made and made <= spans and len(asked) == len(set(asked))
    back = formats.load(out)
    for name, value in formats.load(path).weights.items():
        np.testing.assert_array_equal(np.asarray(back.weights[name], np.float32), np.asarray(value, np.float32),
                                      err_msg=name)


def test_file_span_follows_transposes_and_casts_to_the_stored_bytes(bf16_llama):
    _, path = bf16_llama
    loaded = formats.load(path, lazy=True)
    for name, value in loaded.weights.items():
        span = lz.file_span(value)
        assert span is not None and span[2] == value.size * 2, name  # bfloat16 bytes in a shard of the directory
        assert lz.file_span(value.astype(np.float32)) == span
    assert lz.file_span(np.zeros(3)) is None
