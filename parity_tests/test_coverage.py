"""What a verify probe exercised (`verify.coverage`): a PASS speaks for the paths its inputs ran through. A Mistral
whose 16-position window is longer than the probe passes with the window unexercised and says so; `verify --cover`
lengthens the probe past it, still passes on the correct port and fails on a port whose window is wrong (which the
short probe cannot tell from the right one)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity.cli import main
from transformer_parity.verify import coverage

from .support.hf_models import perturbed

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    settings = dict(vocab_size=61, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                    intermediate_size=37, num_hidden_layers=2, max_position_embeddings=64, sliding_window=16,
                    pad_token_id=3)
    return perturbed("MistralForCausalLM", "MistralConfig", settings, "mistral-window",
                     tmp_path_factory.mktemp("mistral"))[1]


@pytest.mark.parametrize("extra, code, length, window_exercised", [
    ([], 0, 11, False),
    (["--cover"], 0, 17, True),
    (["--set", "sliding_window=32"], 0, 11, False),  # a wrong window the short probe cannot see
    (["--set", "sliding_window=32", "--cover"], 1, 33, True),  # --cover runs past it: the port fails
], ids=["short", "cover", "wrong-window-short", "wrong-window-cover"])
def test_an_unexercised_window_is_named_and_cover_exercises_it(mistral, tmp_path, extra, code, length,
                                                               window_exercised):
    report = tmp_path / "report.json"
    assert main(["--quiet", "verify", str(mistral), "--src-len", "11", "--json", str(report), *extra]) == code
    data = json.loads(report.read_text())
    assert data["inputs"]["src_len"] == length
    assert any("sliding window" in line for line in data["not_exercised"]) != window_exercised


def test_each_input_dependent_path_is_named_when_the_probe_leaves_it_out():
    bert = rn.TransformerConfig.preset("tiny", num_decoder_layers=0, positional="learned", type_vocab_size=2,
                                       embed_norm=True, max_len=32, pad_id=0)
    ids = np.full((2, 9), 5)
    said = coverage.not_exercised(bert, ids, None, np.zeros_like(ids))
    assert [s.split(":")[0].split(" (")[0] for s in said] == ["padding", "segment ids", "learned positions 9..31"]
    padded = ids.copy()
    padded[1, -2:] = 0
    types = np.zeros_like(ids)
    types[0, 4:] = 1
    assert coverage.not_exercised(bert, padded, None, types) == [said[2]]
    assert coverage.cover_lengths(bert, 9, 7) == (32, 7)

    late = rn.TransformerConfig.preset("tiny", num_encoder_layers=0, positional="rope", pad_id=None, max_len=64,
                                       rope_scaling={"rope_type": "dynamic", "factor": 2.0,
                                                     "original_max_position_embeddings": 20})
    assert "rope_scaling 'dynamic', which acts past 20 positions" in coverage.not_exercised(
        late, np.ones((1, 20), int), None, None)[0]
    assert coverage.not_exercised(late, np.ones((1, 21), int), None, None) == []
    assert coverage.cover_lengths(late, 11, 11) == (21, 11)


def test_a_streamed_verify_says_what_it_exercised_and_covers_it(mistral, tmp_path):
    report = tmp_path / "report.json"
    for extra, window_exercised in (([], False), (["--cover"], True)):
        assert main(["--quiet", "verify", str(mistral), "--stream", "on", "--src-len", "11", "--json", str(report),
                     "--force", *extra]) == 0
        data = json.loads(report.read_text())
        assert data["mode"] == "layer-streamed"
        assert any("sliding window" in line for line in data["not_exercised"]) != window_exercised
