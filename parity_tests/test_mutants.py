"""The test suite catches planted mutants of the twins' code: each mutant of `faults.MUTANTS`, planted in torch_impl
or tf_impl, makes the fast-suite test that docs/verify.md names for it fail ("Planted mutants"). Each named test runs
here, by its node id, in a nested pytest session with the mutant planted for the duration of the test; it must fail.
(The suite's own run of the same test, without the mutant, is the control: it passes.)"""

import re
from pathlib import Path

import pytest

from parity_tests.support import faults

from .conftest import TINY

REPO = Path(__file__).resolve().parents[1]
VERIFY_MD = REPO / "docs" / "verify.md"
MODEL = "parity_tests/test_model_parity.py"
TORCH = "parity_tests/test_torch_specific.py"
KERAS = "parity_tests/test_tf_specific.py"

# (mutant, backend) -> the fast-suite test that catches it. A mutant planted in a constructor is caught by a test that
# builds its model afresh (test_tf_specific caches its models: a model built before the plant would hide it).
CAUGHT_BY = {
    ("eps-1e-3-in-code", "torch"): f"{MODEL}::test_every_variant_every_sublayer[torch-pre-ln+final-norm-float32]",
    ("eps-1e-3-in-code", "keras"): f"{MODEL}::test_every_variant_every_sublayer[tf-pre-ln+final-norm-float32]",
    ("inverted-mask", "torch"): f"{MODEL}::test_heavy_and_left_padding_with_fully_masked_rows[torch-float32]",
    ("inverted-mask", "keras"): f"{MODEL}::test_heavy_and_left_padding_with_fully_masked_rows[tf-float32]",
    ("sqrt-d-model-scale", "torch"): f"{TORCH}::test_multi_head_attention[float32-self]",
    ("sqrt-d-model-scale", "keras"): f"{KERAS}::test_multi_head_attention[float32-self-explicit]",
    ("head-order", "torch"): f"{TORCH}::test_multi_head_attention[float32-cross]",
    ("head-order", "keras"): f"{KERAS}::test_multi_head_attention[float32-cross-explicit]",
    ("output-bias-dropped", "torch"): f"{TORCH}::test_encoder_and_decoder_layers[float32-post-ln]",
    ("output-bias-dropped", "keras"): f"{KERAS}::test_encoder_and_decoder_layers[float32-post-ln]",
    ("sinusoid-layout-in-code", "torch"): f"{MODEL}::test_every_variant_every_sublayer[torch-post-ln-float32]",
    ("sinusoid-layout-in-code", "keras"): f"{MODEL}::test_every_variant_every_sublayer[tf-post-ln-float32]",
}


class Planted:
    """A pytest plugin: plants each test's mutant around its call and records the outcomes."""

    def __init__(self, by_test: dict[str, tuple[str, str]]):
        self.by_test = by_test
        self.outcomes: dict[str, str] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        mutant, backend = self.by_test[item.nodeid]
        with faults.MUTANTS[mutant][0](backend, TINY):
            yield

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            self.outcomes[report.nodeid] = report.outcome


def test_every_mutant_has_a_catching_test_in_both_twins():
    assert set(CAUGHT_BY) == {(m, b) for m in faults.MUTANTS for b in ("torch", "keras")}
    assert len(set(CAUGHT_BY.values())) == len(CAUGHT_BY)  # one test per mutant, so each plant is unambiguous


def test_each_named_test_fails_under_its_mutant(monkeypatch):
    """One nested session runs every named test, each with its own mutant planted."""
    monkeypatch.chdir(REPO)
    planted = Planted({test: key for key, test in CAUGHT_BY.items()})
    code = pytest.main([*CAUGHT_BY.values(), "-q", "-p", "no:cacheprovider", "--no-header", "--tb=no",
                        "-n", "0"],  # in this process, where the plugin plants the mutants (not in -n workers)
                       plugins=[planted])
    survived = [f"{m} in {b}: {CAUGHT_BY[m, b]} {planted.outcomes.get(CAUGHT_BY[m, b], 'did not run')}"
                for m, b in CAUGHT_BY if planted.outcomes.get(CAUGHT_BY[m, b]) != "failed"]
    assert survived == [] and code == pytest.ExitCode.TESTS_FAILED


def test_the_docs_table_lists_each_mutant_and_its_test():
    """docs/verify.md's table of planted mutants: one row per mutant and twin, naming the test above."""
    text = VERIFY_MD.read_text()
    section = text[text.index("## Planted mutants"):]
    rows = re.findall(r"^\| `([\w-]+)` \| (torch_impl|tf_impl) \| [^|]+ \| `([^`]+)` \|$", section, re.MULTILINE)
    listed = {(m, "torch" if twin == "torch_impl" else "keras"): test for m, twin, test in rows}
    assert listed == CAUGHT_BY
