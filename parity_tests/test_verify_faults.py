"""A verifier is only worth the faults it catches: every planted porting fault makes `verify` fail and name the
sublayer where it starts, in every backend it can be planted in; correct ports never fail."""

import json

import numpy as np
import pytest

from parity_tests.support import faults

from transformer_parity import cli, verify
from transformer_parity.formats import save
from transformer_parity.verify import Subject, seeded_weights

from .conftest import TINY, VARIANTS
from .support.variants import MIXTURES

PRE_LN = VARIANTS["pre-ln+final-norm"]
MIXTURE = MIXTURES["shared+dense-layer"]
SHAPE = {"batch": 3, "src_len": 11, "tgt_len": 9}


def check(config, weights, subject: Subject, seed: int = 0, dtype: str = "float32") -> verify.Report:
    return verify.judge_subjects(Subject("reference", "numpy", config, weights), [subject], dtype=dtype, seed=seed,
                                 **SHAPE)


def assert_localized(report: verify.Report, expected: str) -> None:
    assert not report.passed
    assert report.first_divergence == expected, report.first_divergence
    before = report.sublayers[:report.sublayers.index(expected)]
    assert all(r.passed for r in report.rows if r.sublayer in before)  # nothing upstream of the fault moved
    failing = [r for r in report.rows if r.sublayer == expected and not r.passed]
    assert min(r.ratio for r in failing) > 10 * verify.RATIO_LIMIT  # not a near miss


@pytest.mark.parametrize("fault", list(faults.WEIGHT_FAULTS))
def test_weight_faults_are_caught_and_localized(fault):
    weights = seeded_weights(TINY, 1)
    bad, expected = faults.apply_weight_fault(fault, TINY, weights)
    assert_localized(check(TINY, weights, Subject("torch", "torch", TINY, bad)), expected)


@pytest.mark.parametrize("config", [TINY, PRE_LN], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("fault", list(faults.CONFIG_FAULTS))
def test_a_port_with_the_wrong_config_is_caught_and_localized(fault, config):
    weights = seeded_weights(config, 2)
    wrong, expected = faults.config_fault(fault, config)
    assert_localized(check(config, weights, Subject("torch", "torch", wrong, weights)), expected)


@pytest.mark.parametrize("backend", ["torch", "keras"])
@pytest.mark.parametrize("fault", list(faults.MUTANTS))
def test_faults_in_a_backends_code_are_caught_and_localized(fault, backend):
    plant, expected = faults.MUTANTS[fault]
    config = PRE_LN if fault.startswith("eps") else TINY
    weights = seeded_weights(config, 3)
    with plant(backend, config):
        report = check(config, weights, Subject(backend, backend, config, weights))
    assert_localized(report, expected(config))
    assert verify.judge_subjects(Subject("reference", "numpy", config, weights),  # the patch is gone again
                                 [Subject(backend, backend, config, weights)], **SHAPE).passed


@pytest.mark.parametrize("fault", list(faults.ROUTING_FAULTS))
def test_a_router_that_picks_other_experts_is_named_at_its_routing_record(fault):
    """Every token's chosen experts are a sublayer of their own (`{ffn}.routing`, compared exactly): a port that
    routes otherwise is named there, at the layer where it does, not only seen downstream as a logit gap."""
    weights = seeded_weights(MIXTURE, 7)
    bad, expected = faults.apply_weight_fault(fault, MIXTURE, weights)
    report = check(MIXTURE, weights, Subject("torch", "torch", MIXTURE, bad))
    assert_localized(report, expected)
    assert min(r.max_abs_err for r in report.rows if r.sublayer == expected and not r.passed) == 1  # an expert id


@pytest.mark.parametrize("backend", ["torch", "keras"])
@pytest.mark.parametrize("fault", list(faults.ROUTING_MUTANTS))
def test_a_router_fault_in_a_backends_code_is_named_at_its_routing_record(fault, backend):
    plant, expected = faults.ROUTING_MUTANTS[fault]
    weights = seeded_weights(MIXTURE, 8)
    with plant(backend, MIXTURE):
        report = check(MIXTURE, weights, Subject(backend, backend, MIXTURE, weights))
    assert_localized(report, expected(MIXTURE))


def test_float64_catches_what_float32_cannot_see():
    """A nudge of 1e-9 hides in float32 rounding, but not from a float64 port (floor scaled by eps64 / eps32)."""
    weights = seeded_weights(TINY, 4, np.float64)
    bad = faults._nudge("encoder.layers.1.self_attn.v.kernel", (3, 5), 1e-9)(TINY, weights)
    assert check(TINY, weights, Subject("torch", "torch", TINY, bad)).passed
    assert_localized(check(TINY, weights, Subject("torch", "torch", TINY, bad), dtype="float64"),
                     "encoder.layers.1.self_attn")


@pytest.mark.parametrize("name", list(VARIANTS), ids=list(VARIANTS))
def test_correct_ports_never_fail(name):
    """Every variant, alternating dtypes, seeds and shapes (benchmarks/verify_calibration.py samples far more)."""
    config = VARIANTS[name]
    i = list(VARIANTS).index(name)
    weights = seeded_weights(config, 10 + i)
    shape = {"batch": 1 + i % 4, "src_len": 3 + 5 * i % 31, "tgt_len": 1 + 7 * i % 23}
    report = verify.judge_subjects(Subject("reference", "numpy", config, weights),
                                   [Subject("torch", "torch", config, weights),
                                    Subject("keras", "keras", config, weights)],
                                   dtype=("float32", "float64")[i % 2], seed=i, **shape)
    assert report.passed, (report.first_divergence, report.max_ratio())
    assert report.max_ratio() < verify.RATIO_LIMIT / 2  # far from the limit, not just under it


# --- through the command line, with files: the porting check ---------------------------------------------------------

def test_verify_two_files_names_the_planted_fault(tmp_path, capsys):
    weights = seeded_weights(TINY, 5)
    save(tmp_path / "port.pt", TINY, weights)
    bad, expected = faults.apply_weight_fault("transposed-kernel", TINY, weights)
    save(tmp_path / "port.weights.h5", TINY, bad)
    code = cli.main(["verify", str(tmp_path / "port.pt"), str(tmp_path / "port.weights.h5"),
                     "--json", str(tmp_path / "r.json"), "--src-len", "9", "--tgt-len", "7"])
    out = capsys.readouterr().out
    assert code == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] is False and report["first_divergence"] == expected
    assert report["first_divergence_backends"] == ["keras", "numpy-f64"]
    assert f"first divergent sublayer {expected}" in " ".join(out.split()) and "FAIL ◀ first" in out
    # weights first: the transposed kernel is named before any output is computed
    assert [r["name"].rsplit(".", 2)[0] for r in report["weights"]["rows"]] == [expected]
    torch_rows = [r for r in report["rows"] if r["backends"] == ["torch", "numpy-f64"]]
    assert torch_rows and all(r["passed"] for r in torch_rows)  # the original is fine; the port is not


def test_verify_flags_a_port_saved_with_the_wrong_config(tmp_path, capsys):
    weights = seeded_weights(TINY, 6)
    save(tmp_path / "orig.safetensors", TINY, weights)
    save(tmp_path / "port.weights.h5", TINY.replace(layer_norm_eps=1e-3), weights)
    code = cli.main(["verify", str(tmp_path / "orig.safetensors"), str(tmp_path / "port.weights.h5"),
                     "--json", "-"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["first_divergence"] == "encoder.layers.0.ffn"
    assert any("layer_norm_eps=0.001" in line for line in report["config_differences"])
