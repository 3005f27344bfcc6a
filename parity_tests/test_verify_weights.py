"""Weights first: `verify` with two or more checkpoints compares their canonical weights name by name, and a tensor
that differs fails the verdict even when every output is within tolerance."""

import json

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import cli, formats
from transformer_parity.verify import weights as weight_diff
from transformer_parity.verify import seeded_weights

from .conftest import TINY

# The issue's config: the base preset's depth, narrow enough to run in seconds.
PLANTED = rn.TransformerConfig.preset("base", d_model=64, d_ff=128, num_heads=4, src_vocab_size=300,
                                      tgt_vocab_size=300)
PLANTED_TENSOR = "decoder.layers.3.cross_attn.k.kernel"
SMALL_INPUTS = ["--batch", "1", "--src-len", "6", "--tgt-len", "5"]


def verify(args, capsys, inputs=SMALL_INPUTS):
    """`transformer-parity verify ARGS --json -`: (exit status, the JSON report)."""
    code = cli.main(["verify", *map(str, args), *inputs, "--json", "-"])
    out, err = capsys.readouterr()
    return code, json.loads(out)


def nudged(weights, name, flat_index, *, add=None, relative=None):
    changed = dict(weights)
    value = changed[name].copy()
    value.flat[flat_index] = value.flat[flat_index] + add if add is not None else value.flat[flat_index] * (
        1 + relative)
    changed[name] = value
    return changed


def test_the_issues_planted_case_fails_naming_tensor_and_index(tmp_path, capsys):
    """+1e-3 at flat index 7 of a cross-attention key kernel moves the outputs on verify's default inputs only
    ~4e-6 (inside the float32 tolerance), but the weight differs: exit 1, with the tensor, the index and the count named."""
    weights = rn.init_weights(PLANTED, 0)
    formats.save(tmp_path / "good.safetensors", PLANTED, weights)
    formats.save(tmp_path / "bad.weights.h5", PLANTED, nudged(weights, PLANTED_TENSOR, 7, add=1e-3))
    files = [str(tmp_path / "good.safetensors"), str(tmp_path / "bad.weights.h5")]
    code = cli.main(["verify", *files, "--json", str(tmp_path / "report.json")])  # the default inputs
    out = " ".join(capsys.readouterr().out.split())
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 1 and report["passed"] is False
    assert all(row["passed"] for row in report["rows"]), "the outputs alone pass: only the weights catch it"
    assert (f"WEIGHTS DIFFER: {PLANTED_TENSOR} differs at index [0, 7] by 0.001; 1 of 4096 elements differ; every "
            "output within tolerance") in out
    section = report["weights"]
    assert section["compared"] and section["different"] == 1 and section["missing"] == 0
    (row,) = section["rows"]
    assert row["name"] == PLANTED_TENSOR and row["index"] == [0, 7] and row["differing"] == 1
    assert row["max_abs_diff"] == pytest.approx(1e-3, rel=1e-4)
    # --outputs-only: for a user who ports with changed weights on purpose
    code, report = verify([*files, "--outputs-only"], capsys, inputs=[])
    assert code == 0 and report["weights"]["compared"] is False and report["weights"]["rows"] == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_a_1e6_relative_nudge_of_any_single_weight_is_named(dtype):
    """Every tensor of the tiny model in turn, one element changed by 1e-6 relative: exactly that tensor fails,
    with that index and one differing element (pure NumPy, no model run)."""
    weights = seeded_weights(TINY, 0, dtype)
    rng = np.random.default_rng(0)
    for name, value in weights.items():
        flat = int(rng.choice(np.flatnonzero(value)))
        rows = weight_diff.compare_checkpoints(weights, [nudged(weights, name, flat, relative=1e-6)],
                                               ["ref", "port"])
        failing = [r for r in rows if not r.passed]
        assert [r.name for r in failing] == [name]
        assert failing[0].index == tuple(int(i) for i in np.unravel_index(flat, value.shape))
        assert failing[0].differing == 1 and failing[0].status == weight_diff.DIFFERENT


def test_nudge_exits_1_through_the_cli(tmp_path, capsys):
    weights = seeded_weights(TINY, 1)
    formats.save(tmp_path / "a.safetensors", TINY, weights)
    formats.save(tmp_path / "b.pt", TINY, nudged(weights, "encoder.layers.1.norm2.gamma", 3, relative=1e-6))
    code, report = verify([tmp_path / "a.safetensors", tmp_path / "b.pt"], capsys)
    assert code == 1 and [r["name"] for r in report["weights"]["rows"]] == ["encoder.layers.1.norm2.gamma"]
    assert report["weights"]["rows"][0]["index"] == [3]


def test_a_correct_port_and_a_float64_float32_float64_port_pass(tmp_path, capsys):
    """A float64 source, its float32 port, and a port that went float64 -> float32 -> float64 (every value a
    float32 value, exactly the source rounded): the rounding happened, so the tensors pass as `rounding`."""
    source = seeded_weights(TINY, 2, np.float64)
    rounded = {k: v.astype(np.float32) for k, v in source.items()}
    formats.save(tmp_path / "source.safetensors", TINY, source)
    formats.save(tmp_path / "port.pt", TINY, rounded)
    formats.save(tmp_path / "back.weights.h5", TINY, {k: v.astype(np.float64) for k, v in rounded.items()})
    assert formats.load(tmp_path / "back.weights.h5").weights["output.kernel"].dtype == np.float64
    code, report = verify([tmp_path / "source.safetensors", tmp_path / "port.pt", tmp_path / "back.weights.h5"],
                          capsys)
    section = report["weights"]
    assert code == 0 and report["passed"] and section["passed"]
    assert section["different"] == section["missing"] == 0 and section["rounding"] == 2 * len(source)
    details = {(r["checkpoints"][0], r["detail"]) for r in section["rows"]}
    assert details == {("port.pt", "float64->float32 rounding"),
                       ("back.weights.h5", "float64->float32 rounding, held in float64")}
    # the same files the other way round: the reference is the rounded one
    code, report = verify([tmp_path / "port.pt", tmp_path / "source.safetensors"], capsys)
    assert code == 0 and report["weights"]["rounding"] == len(source)
    # and a correct float32 port is identical, tensor for tensor
    formats.save(tmp_path / "port.weights.h5", TINY, rounded)
    code, report = verify([tmp_path / "port.pt", tmp_path / "port.weights.h5"], capsys)
    assert code == 0 and report["weights"]["identical"] == len(source) and report["weights"]["rows"] == []


def test_rounding_that_did_not_happen_is_a_difference():
    """Both float64 and the port not float32-valued everywhere: a float32-sized change is a difference, not
    rounding; and a float32 port of a float32 source has no rounding to hide behind."""
    source = seeded_weights(TINY, 3, np.float64)
    name = "decoder.layers.0.self_attn.v.kernel"
    port = nudged(source, name, 5, relative=1e-7)  # below float32's resolution, but this port never was float32
    (row,) = [r for r in weight_diff.compare_checkpoints(source, [port], ["a", "b"]) if not r.passed]
    assert row.name == name and row.index == np.unravel_index(5, source[name].shape) and row.differing == 1
    source32 = {k: v.astype(np.float32) for k, v in source.items()}
    port32 = nudged(source32, name, 5, relative=1e-6)
    (row,) = [r for r in weight_diff.compare_checkpoints(source32, [port32], ["a", "b"]) if not r.passed]
    assert row.name == name and row.detail == ""


def test_missing_tensors_are_reported(tmp_path, capsys):
    """A checkpoint without the output projection's bias: the weights table names it; the architectures differ,
    so no output is compared, and the verdict fails (exit 1, not a usage error)."""
    unbiased_output = TINY.replace(output_bias=False) if "output_bias" in TINY.to_dict() else None
    if unbiased_output is None:
        pytest.skip("this config has no output_bias field")
    formats.save(tmp_path / "a.safetensors", TINY, seeded_weights(TINY, 0))
    formats.save(tmp_path / "b.safetensors", unbiased_output, seeded_weights(unbiased_output, 0))
    code, report = verify([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], capsys)
    assert code == 1 and report["rows"] == []
    rows = [r for r in report["weights"]["rows"] if r["status"] == "missing"]
    assert [r["name"] for r in rows] == ["output.bias"]
    assert rows[0]["detail"] == "in a.safetensors, not in b.safetensors"
    assert any(note.startswith("outputs not compared") for note in report["notes"])


def test_what_outputs_cannot_see_the_weights_do():
    """A key bias doubled changes no output (softmax ignores `q . b_k`), so the output comparison passes it at any
    size; the weights comparison names it. And the calibration program's bisection runs: a value-kernel element
    must change by a finite amount between float32's resolution and +100% before the outputs see it."""
    from benchmarks.verify_calibration import SENSITIVITY_SHAPE, smallest_detected
    from transformer_parity import verify as v

    weights = seeded_weights(TINY, 0)
    reference = v.Subject("reference", "numpy", TINY, weights)
    name = "decoder.layers.1.cross_attn.k.bias"
    doubled = nudged(weights, name, 2, relative=1.0)
    report = v.judge_subjects(reference, [v.Subject("torch", "torch", TINY, doubled)], **SENSITIVITY_SHAPE)
    assert report.passed
    (row,) = [r for r in weight_diff.compare_checkpoints(weights, [doubled], ["a", "b"]) if not r.passed]
    assert row.name == name and row.index == (2,)
    found = smallest_detected(reference, "torch", TINY, weights, "encoder.layers.0.self_attn.v.kernel", 5,
                              "float32", 0, steps=4)
    assert 1e-8 < found < 1.0
