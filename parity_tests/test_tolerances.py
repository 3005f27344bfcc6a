"""The calibrated limits are pinned: K (float32 and float64) and the reduced-precision K equal what docs/verify.md
and `--help` say, and sit where the recorded calibrations put them, between the largest error of a correct port and
the smallest error of a planted fault, with the margins the docs claim. Changing K, or re-running a calibration that
moves it, fails here until the docs say the same."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from transformer_parity import verify
from transformer_parity.cli import verify as cli_verify
from transformer_parity import tolerances
from transformer_parity.verify import lowp
from transformer_parity.layouts import probe

REPO = Path(__file__).resolve().parents[1]
VERIFY_MD = (REPO / "docs" / "verify.md").read_text()
LOWP_RESULTS = REPO / "benchmarks" / "results" / "verify-lowp"


def test_k_is_the_documented_value_everywhere():
    assert tolerances.RATIO_LIMIT == 10 and tolerances.PAIR_RATIO_LIMIT == 2 * tolerances.RATIO_LIMIT
    assert "with **K = 10** against the judge, and 2K = 20 between two backends" in " ".join(VERIFY_MD.split())
    assert "K = 10; see docs/verify.md" in cli_verify.VERIFY_EXAMPLES
    # the product reads the one module: no copy of K anywhere else
    assert verify.RATIO_LIMIT is tolerances.RATIO_LIMIT and probe.RATIO_LIMIT is tolerances.RATIO_LIMIT
    assert lowp.RATIO_LIMIT is tolerances.LOWP_RATIO_LIMIT and lowp.EPS is tolerances.REDUCED_EPS


def test_k_sits_between_the_calibrated_correct_ports_and_planted_faults():
    """docs/verify.md quotes the calibration's last line: the largest ratio of a correct port and the smallest of a
    planted fault. K must leave the margin the docs claim ("about 3 on either side"): at least 2.5 above the first,
    and the weakest fault at least 2.5 times K."""
    line = re.search(r"largest correct-port ratio ([\d.]+); smallest planted-fault ratio ([\d.]+); K = ([\d.]+)",
                     VERIFY_MD)
    assert line, "docs/verify.md lost the calibration's summary line"
    correct, fault, documented = map(float, line.groups())
    assert documented == tolerances.RATIO_LIMIT
    assert tolerances.RATIO_LIMIT / correct >= 2.5, (correct, tolerances.RATIO_LIMIT)
    assert fault / tolerances.RATIO_LIMIT >= 2.5, (fault, tolerances.RATIO_LIMIT)
    # the prose quotes the same figures
    below = re.search(r"Correct ports stay below ([\d.]+) floors", VERIFY_MD)
    least = re.search(r"sits at ([\d.]+) floors at the least", VERIFY_MD)
    assert below and least, "docs/verify.md lost the prose that quotes the calibration"
    assert correct < float(below[1]) <= correct + 0.1 and round(fault) == float(least[1]), (correct, fault)


def _lowp_calibration(dtype: str) -> tuple[float, float]:
    """(largest correct-port ratio against the judge, smallest ratio of a fault the dtype can see) from a recorded
    calibration (benchmarks/verify_calibration.py --dtype DTYPE --json)."""
    data = json.loads((LOWP_RESULTS / f"calibration-{dtype}.json").read_text())
    assert data["dtype"] == dtype
    correct = max(max(ratios) for pair, ratios in data["correct"].items() if "numpy-f64" in pair)
    seen = [ratio for name, runs in data["faults"].items() if name.split(" ")[0] not in lowp.UNSEEN[dtype]
            for ratio, _ in runs]
    return correct, min(seen)


def test_reduced_precision_k_is_the_geometric_middle_of_the_bfloat16_calibration():
    correct, fault = _lowp_calibration("bfloat16")
    assert (round(correct, 2), round(fault, 2)) == (3.91, 7.79)  # the figures docs/verify.md and the comment quote
    assert tolerances.LOWP_RATIO_LIMIT == 5.5 == pytest.approx(math.sqrt(correct * fault), abs=0.05)
    assert tolerances.LOWP_PAIR_RATIO_LIMIT == 2 * tolerances.LOWP_RATIO_LIMIT
    assert "`transformer_parity.verify.lowp.RATIO_LIMIT` = **5.5** (11 between two backends)" in " ".join(VERIFY_MD.split())
    assert "K = 5.5" in cli_verify.VERIFY_EXAMPLES


def test_reduced_precision_k_separates_the_float16_calibration():
    correct, fault = _lowp_calibration("float16")
    assert correct < tolerances.LOWP_RATIO_LIMIT < fault
    assert (round(correct, 2), round(fault)) == (2.58, 61)  # "2.6 against 61" in docs/verify.md
    assert "(2.6 against 61)" in VERIFY_MD


def test_the_floor_rule():
    judge = {"a": np.array([0.0, 2.0]), "b": np.zeros(3), "c": np.array([1.0, -4.0])}
    floor_run = {"a": np.array([0.0, 2.0]), "b": np.zeros(3), "c": np.array([1.0 + 1e-5, -4.0])}
    f32 = tolerances.floors(judge, floor_run, "float32")
    assert f32["a"] == tolerances.EPS32 * 2.0  # exact in float32: one rounding at the largest magnitude
    assert 0 < f32["b"] < 1e-30  # all zeros: any error at all is a divergence, but no division by zero
    assert f32["c"] == pytest.approx(1e-5)
    assert tolerances.floors(judge, floor_run, "float64")["c"] == pytest.approx(1e-5 * 2.0 ** -29)
    assert tolerances.floors(judge, judge, "bfloat16")["c"] == 4.0 * 2.0 ** -7  # one bfloat16 rounding of 4
    assert tolerances.floor_atol(1e-7) == pytest.approx(1e-6) and tolerances.floor_atol(1e-7, pair=True) == 2e-6
    assert tolerances.property_atol("float32", 1e-7) == tolerances.ATOL["float32"]  # never below the table
    assert tolerances.property_atol("float32", 1e-4) == pytest.approx(1e-3)
    assert tolerances.compare(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))[0] == float("inf")
