"""Streaming conversion: a sharded bfloat16 Hugging Face directory converted tensor by tensor, its dtype kept, its
tensors bit-identical after the trip, the output sharded as `save_pretrained` shards it; what cannot fit refused in
one line. (Speed and peak memory are figures of `benchmarks/bench_streaming.py`, not tests.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn
from reference_numpy.mapping import LazyArray
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
    assert main(["convert", str(path), str(tmp_path / "m.weights.h5")]) == 0
    assert "written as float32 (exactly): keras" in capsys.readouterr().err


def test_a_tensor_that_cannot_fit_is_refused_with_the_figures(bf16_llama, tmp_path, capsys, monkeypatch):
    _, path = bf16_llama
    monkeypatch.setattr(limits, "available_bytes", lambda: 10_000)
    assert main(["convert", str(path), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "convert needs about 14.9 KiB at once (its largest tensor, tgt_embed.embedding, 5.0 KiB" in err, err
    assert "9.8 KiB is available" in err
    assert not (tmp_path / "out.safetensors").exists()


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
