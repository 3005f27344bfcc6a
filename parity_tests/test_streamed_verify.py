"""Layer-streamed verify (`verify --stream`): the model run one block at a time (`reference_numpy.blocks`) in the
reference and both twins is the same computation as the whole model, bit for bit; the verdict rows are those of a
whole-model verify; a planted fault is named at the same sublayer; each block's weights are read from a lazily
loaded checkpoint when that block runs; and what cannot fit is refused in one line with the figures."""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn
from parity_tests.support import faults
from reference_numpy import blocks as rb
from transformer_parity import backends, formats, verify
from transformer_parity.cli import main
from transformer_parity.io import limits
from transformer_parity.verify import Subject, seeded_weights, streamed

from .conftest import FAMILIES, TINY, VARIANTS

DECODER = TINY.replace(num_encoder_layers=0, norm="rms", positional="rope", ffn_gated=True, activation="silu",
                       num_kv_heads=2, final_norm=True, norm_first=True, bias=False, scale_embedding=False,
                       pad_id=None, d_model=48, num_heads=6)
LLM = {
    "llama3-gqa-window": DECODER.replace(sliding_window=5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    "qwen3-qk-norm-tied": DECODER.replace(qk_norm=True, head_size=16, tie_embeddings=True),
    "gemma": DECODER.replace(norm_weight_offset=1.0, activation="gelu_tanh", scale_embedding=True,
                             tie_embeddings=True, head_size=16),
    "phi3-partial-rotary": DECODER.replace(rotary_fraction=0.5, qkv_bias=True),
    "albert-shared": TINY.replace(num_decoder_layers=0, tgt_vocab_size=TINY.src_vocab_size, positional="learned",
                                  type_vocab_size=2, embed_norm=True, head_transform=True, pooler=True,
                                  tie_embeddings=True, scale_embedding=False, activation="gelu", embedding_size=12,
                                  shared_layers=True, num_encoder_layers=3),
    "roberta-positions": TINY.replace(num_decoder_layers=0, tgt_vocab_size=40, positional="learned", embed_norm=True,
                                      position_offset=2, pad_id=1, positions_skip_pad=True, scale_embedding=False),
}
ENCODER = TINY.replace(num_decoder_layers=0, positional="learned", type_vocab_size=2, embed_norm=True,
                       scale_embedding=False, activation="gelu", output_projection=False)
HEADS = {  # the task heads (`classifier`, `next_sentence`): a block each, the last reading the pooler or the mask
    "bert-pretraining": ENCODER.replace(output_projection=True, tgt_vocab_size=TINY.src_vocab_size, pooler=True,
                                        head_transform=True, tie_embeddings=True, next_sentence=True),
    "bert-sequence-classifier": ENCODER.replace(pooler=True, classifier="sequence", num_labels=3),
    "bert-next-sentence-alone": ENCODER.replace(pooler=True, next_sentence=True),
    "roberta-first-token-dense": ENCODER.replace(classifier="sequence", classifier_input="first",
                                                 classifier_dense="tanh", num_labels=5),
    "span": ENCODER.replace(classifier="span", num_labels=2),
    "bart-eos-sequence": FAMILIES["bart-like"].replace(output_projection=False, tie_embeddings=False, output_bias=None,
                                                       classifier="sequence", classifier_input="eos", eos_id=2,
                                                       classifier_dense="tanh", num_labels=3),
    "bart-span": FAMILIES["bart-like"].replace(output_projection=False, tie_embeddings=False, output_bias=None,
                                               classifier="span", num_labels=2),
    "gpt2-double-heads": DECODER.replace(pad_id=3, choice_head=True),
    "gpt2-last-token": DECODER.replace(pad_id=3, classifier="sequence", classifier_input="last", num_labels=3,
                                       classifier_bias=False, output_projection=False),
}
CONFIGS = {**VARIANTS, **FAMILIES, **LLM, **HEADS}
RUNS = [("numpy", "float64"), ("numpy", "float32"), ("torch", "float32"), ("keras", "float32")]


def run_blocks(backend: str, config, weights, dtype: str, src, tgt, types) -> dict[str, np.ndarray]:
    """Every block in turn, as the streamed judge runs them, recording what each records."""
    state, record = streamed._inputs(config, src, tgt, types), {}
    for block in rb.blocks(config):
        rb.begin(block, state)
        block_weights = {name: weights[name] for name in rb.block_parameters(config, block)}
        record.update(backends.get(backend).run_block(config, block, block_weights, dtype, state))
    return {**record, **rb.final_record(config, state)}


def assert_blocks_are_the_whole_model(config, weights, runs, src, tgt=None, types=None) -> None:
    """For each `(backend, dtype)` of `runs`, every block in turn (`run_blocks`) records what the whole model's
    trace records, bit for bit and in the same order."""
    for backend, dtype in runs:
        whole = backends.get(backend).trace(config, weights, dtype, src, tgt if config.is_encoder_decoder else None,
                                            types)
        blockwise = run_blocks(backend, config, weights, dtype, src, tgt, types)
        assert list(blockwise) == list(whole), (backend, dtype)
        for sublayer, value in whole.items():
            np.testing.assert_array_equal(blockwise[sublayer], value, err_msg=f"{backend} {dtype} {sublayer}")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_blocks_compute_what_the_whole_model_computes_bit_for_bit(name):
    config = CONFIGS[name]
    weights = seeded_weights(config, 3)
    src, tgt = rn.sample_batch(config, 2, 11, 7, 0)
    types = rn.sample_type_ids(config, src, 0)
    runs = RUNS + ([("torch", "float64"), ("keras", "float64")] if name in LLM else [])
    assert_blocks_are_the_whole_model(config, weights, runs, src, tgt, types)


def test_every_parameter_is_read_by_some_block_and_no_block_reads_another_layer():
    for name, config in CONFIGS.items():
        read = {n for block in rb.blocks(config) for n in rb.block_parameters(config, block)}
        assert read == set(rn.parameter_shapes(config)), name
        for block in rb.blocks(config):
            if block.kind == "layer":
                prefix = f"{block.stack}.layers.{rb.weight_layer(config, block)}."
                # its own layer's, or a table its stack shares among all layers (T5's relative bias, DeBERTa's)
                shared = [n for n in rb.block_parameters(config, block) if not n.startswith(prefix)]
                assert all(n.startswith(f"{block.stack}.") and ".layers." not in n for n in shared), (name, block)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_streamed_rows_are_the_whole_model_rows(tmp_path, dtype):
    config = FAMILIES["bart-like"]
    path = tmp_path / "bart.safetensors"
    formats.save(path, config, seeded_weights(config, 5), "canonical")
    reports = {}
    for mode in ("on", "off"):
        out = tmp_path / f"{mode}.json"
        assert main(["verify", str(path), "--stream", mode, "--dtype", dtype, "--src-len", "9", "--tgt-len", "7",
                     "--json", str(out), "-q"]) == 0
        reports[mode] = json.loads(out.read_text())
    assert reports["on"]["mode"] == "layer-streamed" and reports["off"]["mode"] == "whole model"
    assert reports["on"]["rows"] == reports["off"]["rows"]
    assert "layer-streamed" in reports["on"]["verdict"] and reports["on"]["verdict"].startswith("PASS (self-consistent")


@pytest.mark.parametrize("backend", ["torch", "keras"])
@pytest.mark.parametrize("fault", ["inverted-mask", "head-order", "output-bias-dropped"])
def test_a_fault_in_a_backends_code_is_named_where_it_starts(fault, backend):
    weights = seeded_weights(TINY, 1)
    plant, expected_of = faults.MUTANTS[fault]
    reference = Subject("reference", "numpy", TINY, weights)
    with plant(backend, TINY):
        report = streamed.report(reference, [Subject(backend, backend, TINY, weights)], "float32", 3, 11, 9, 0)
    assert not report.passed and report.mode == "layer-streamed"
    assert report.first_divergence == expected_of(TINY)
    upstream = report.sublayers[:report.sublayers.index(expected_of(TINY))]
    assert all(r.passed for r in report.rows if r.sublayer in upstream)


def test_a_lazy_checkpoint_is_read_block_by_block(tmp_path):
    """Each tensor of a bfloat16 checkpoint is read when its block runs (the tied table twice: embedding and output),
    in block order, and every backend runs it."""
    from transformer_parity.io.safetensors_io import bfloat16

    config = LLM["qwen3-qk-norm-tied"]
    path = tmp_path / "qwen3.safetensors"
    formats.save(path, config, {k: v.astype(bfloat16()) for k, v in seeded_weights(config, 2).items()}, "canonical")
    reads = []
    loaded = formats.load(path, on_tensor=lambda name, n: reads.append(name), lazy=True)
    assert reads == []
    reference = Subject("qwen3", "numpy", loaded.config, loaded.weights)
    subjects = [Subject(b, b, loaded.config, loaded.weights) for b in ("torch", "keras")]
    report = streamed.report(reference, subjects, "float32", 2, 9, 9, 0)
    assert report.passed
    expected = [n for block in rb.blocks(config) for n in rb.block_parameters(config, block)]
    assert reads == expected


def test_auto_streams_what_would_not_fit_whole_and_refuses_what_cannot_fit_at_all(tmp_path, monkeypatch, capsys):
    config = LLM["llama3-gqa-window"]
    path = tmp_path / "llama.safetensors"
    formats.save(path, config, seeded_weights(config, 4), "canonical")
    whole = limits.estimate_bytes(config, 2, 11, 11, itemsize=4, weight_copies=5, traces=5)  # judge, floor, 2 ports
    one_block = streamed.peak_bytes(config, formats.load(path, lazy=True).weights, "float32")
    assert one_block < whole
    monkeypatch.setattr(limits, "available_bytes", lambda: (one_block + whole) // 2)
    out = tmp_path / "r.json"
    assert main(["verify", str(path), "--src-len", "11", "--json", str(out), "-q"]) == 0
    assert json.loads(out.read_text())["mode"] == "layer-streamed"
    monkeypatch.setattr(limits, "available_bytes", lambda: one_block // 2)
    assert main(["verify", str(path), "--src-len", "11", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "layer-streamed verify" in err and "largest block" in err, err


def test_a_source_cannot_be_asked_of_a_streamed_run(tmp_path, capsys):
    path = tmp_path / "tiny.safetensors"
    formats.save(path, TINY, seeded_weights(TINY, 0), "canonical")
    for given in ([str(path)], ["--preset", "tiny"]):
        assert main(["verify", *given, "--stream", "on", "--source", "model.py:run"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "does not run a source" in err, err


def test_several_checkpoints_are_not_streamed(tmp_path, capsys):
    path = tmp_path / "tiny.safetensors"
    formats.save(path, TINY, seeded_weights(TINY, 0), "canonical")
    assert main(["verify", str(path), str(path), "--stream", "on"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--stream on runs one checkpoint" in err, err


def test_reduced_precision_is_refused_in_a_streamed_run(capsys):
    assert main(["verify", "--preset", "tiny", "--stream", "on", "--dtype", "bfloat16"]) == 2
    assert "float32 or float64" in capsys.readouterr().err


def test_the_whole_model_verify_keeps_its_source(tmp_path):
    """--stream auto on a small checkpoint runs the whole model, and so still reads the eager weights it needs."""
    path = tmp_path / "tiny.safetensors"
    formats.save(path, TINY, seeded_weights(TINY, 0), "canonical")
    report = verify.run(verify.Request([path], src_len=9, tgt_len=7))
    assert report.mode == "whole model" and report.passed
