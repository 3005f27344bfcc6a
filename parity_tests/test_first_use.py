"""What a first-time user meets: the README's headline command on the base model, the verify table on an 80-column
terminal, errors that name the fix that fits the file, lengths that fit a small model, a report that records only
the inputs the model read, `bench` with `-q`/`--debug` like every command, sizes in MiB."""

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import reference_numpy as rn
from parity_tests.support import faults
from transformer_parity import cli, formats, verify
from transformer_parity import tolerances
from transformer_parity.verify import report
from transformer_parity.verify import Subject, seeded_weights

from .conftest import TINY

REPO = Path(__file__).resolve().parents[1]


def run(args, capsys):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# --- the README's headline command ----------------------------------------------------------------------------------

def test_readme_headline_verify_on_the_base_preset(tmp_path, capsys):
    """`transformer-parity verify` as the README's first command runs it: the paper's base model, seeded, in NumPy,
    PyTorch and Keras, every sublayer within K floors of the float64 judge."""
    readme = (REPO / "README.md").read_text()
    assert re.search(r"pip install --no-deps -r requirements-cpu.lock -e \. && transformer-parity verify\n", readme)
    code, out, _ = run(["verify", "--json", tmp_path / "r.json"], capsys)
    result = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and result["passed"] and "PASS" in out, result["verdict"]
    assert result["inputs"] == {"batch": 2, "src_len": 37, "tgt_len": 29, "seed": 0}
    assert result["judge"] == "numpy-f64 on base preset, seed 0"
    assert [s["label"] for s in result["subjects"]] == ["torch", "keras"]
    assert len({r["sublayer"] for r in result["rows"]}) == 45  # every sublayer of the 6+6-layer model
    assert max(r["ratio"] for r in result["rows"]) < tolerances.RATIO_LIMIT / 2


# --- the verify table at 80 columns ---------------------------------------------------------------------------------

def _failing_report() -> verify.Report:
    weights = seeded_weights(TINY, 1)
    bad, _ = faults.apply_weight_fault("transposed-kernel", TINY, weights)
    return verify.judge_subjects(Subject("reference", "numpy", TINY, weights),
                                 [Subject("torch", "torch", TINY, bad), Subject("keras", "keras", TINY, weights)],
                                 batch=2, src_len=7, tgt_len=5)


def _render(result: verify.Report, width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), highlight=False, color_system=None)
    report.print_report(result, console)
    return console.file.getvalue().splitlines()


def test_the_verify_table_reads_at_80_columns():
    """Every line fits, no cell is cut ("…"), and each row still shows its sublayer (abbreviated, as the caption
    says), its backends, max abs error, floor, ratio and status in full."""
    result = _failing_report()
    lines = _render(result, 80)
    assert max(len(line) for line in lines) <= 80 and not any("…" in line for line in lines)
    text = "\n".join(lines)
    assert "enc.N / dec.N = encoder.layers.N / decoder.layers.N" in text and "FAIL ◀ first" in text
    rows = [line for line in lines if re.search(r"\b(ok|FAIL)\b", line)]
    assert len(rows) == len(result.rows)
    for line, row in zip(rows, [r for name in result.sublayers for r in result.rows if r.sublayer == name]):
        for cell in (report._num(row.max_abs_err), report._num(row.floor), report._ratio(row.ratio)):
            assert cell in line, (cell, line)
    first = [line for line in rows if line.strip() and not line.startswith(" " * 4)]
    assert [line.split()[0] for line in first] == [report.short_sublayer(name) for name in result.sublayers]
    # the control: wide enough, the full table with every name and the max rel column
    wide = "\n".join(_render(result, 140))
    assert "max rel" in wide and "encoder.layers.1.self_attn" in wide and "enc.N" not in wide


# --- a missing config: the fix that fits the file -------------------------------------------------------------------

def _write_h5(path, names):
    import h5py

    with h5py.File(path, "w") as f:
        for name in names:
            f.create_dataset(name, data=np.zeros((2, 3), np.float32))
    return path


def _write_safetensors(path, names):
    from safetensors.numpy import save_file

    save_file({name: np.zeros((2, 3), np.float32) for name in names}, str(path))
    return path


@pytest.mark.parametrize("case, fix", [
    ("hf-weights-in-its-directory", "give the directory, whose config.json is the config"),
    ("hf-weights-alone", "names are a Hugging Face model's ('transformer.h.0.attn.c_attn.bias', ...): give the model's "
                         "directory"),
    ("kerashub-preset-weights", "weights file of the KerasHub preset"),
    ("kerashub-bare-weights", "--from with its family (kerashub-gpt2, kerashub-gpt-neox, kerashub-opt, "
                              "kerashub-bert, "),
    ("keras-model-of-your-own", "layout --scaffold mine.weights.h5 > layout.toml, then --layout layout.toml"),
    ("safetensors-of-your-own", "layout --scaffold mine.safetensors > layout.toml, then --layout layout.toml"),
    ("canonical-names", "give one with --config FILE.json (or --set FIELD=VALUE ...)"),
], ids=lambda value: value if " " not in value else "")
def test_a_file_without_config_gets_the_fix_that_fits_it(case, fix, tmp_path, capsys):
    hf_names = ["transformer.h.0.attn.c_attn.bias", "transformer.wte.weight"]
    if case == "hf-weights-in-its-directory":
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
        path = _write_safetensors(tmp_path / "model.safetensors", hf_names)
    elif case == "hf-weights-alone":
        path = _write_safetensors(tmp_path / "model.safetensors", hf_names)
    elif case == "kerashub-preset-weights":
        (tmp_path / "config.json").write_text(json.dumps({"registered_name": "keras_hub>GPT2Backbone"}))
        path = _write_h5(tmp_path / "model.weights.h5", ["layers/reversible_embedding/vars/0"])
    elif case == "kerashub-bare-weights":
        path = _write_h5(tmp_path / "backbone.weights.h5", ["layers/reversible_embedding/vars/0",
                                                            "layers/transformer_layer_0/vars/0"])
    elif case == "keras-model-of-your-own":
        path = _write_h5(tmp_path / "mine.weights.h5", ["layers/dense/vars/0", "layers/dense/vars/1"])
    elif case == "safetensors-of-your-own":
        path = _write_safetensors(tmp_path / "mine.safetensors", ["blocks.0.wq", "embed"])
    else:
        path = tmp_path / "canonical.safetensors"
        from safetensors.numpy import save_file

        save_file(rn.init_weights(TINY, 0), str(path))
    code, _, err = run(["convert", path, tmp_path / "out.pt"], capsys)
    assert code == 2 and err.count("\n") == 1 and "carries no config" in err and fix in err, err
    assert (fix == "give one with --config FILE.json (or --set FIELD=VALUE ...)") == ("--config" in err)
    assert not (tmp_path / "out.pt").exists()


# --- lengths that fit the model, inputs as the model read them ------------------------------------------------------

def test_default_lengths_are_clipped_to_a_small_max_len_with_a_note(tmp_path, capsys):
    short = TINY.replace(max_len=16)
    formats.save(tmp_path / "short.safetensors", short, seeded_weights(short, 0))
    code, out, _ = run(["verify", tmp_path / "short.safetensors", "--backends", "numpy", "--json", "-"], capsys)
    result = json.loads(out)
    assert code == 0 and result["inputs"] == {"batch": 2, "src_len": 16, "tgt_len": 16, "seed": 0}
    assert "--src-len 16: the default 37 is longer than the model's max_len=16" in result["notes"]
    assert "--tgt-len 16: the default 29 is longer than the model's max_len=16" in result["notes"]
    # a length the user gives is never clipped: too long is an error, as before
    code, _, err = run(["verify", tmp_path / "short.safetensors", "--backends", "numpy", "--src-len", "17"], capsys)
    assert code == 2 and "longer than max_len=16" in err
    # --write-probe clips the same way
    assert run(["verify", tmp_path / "short.safetensors", "--write-probe", tmp_path / "p.npz"], capsys)[0] == 0
    assert np.load(tmp_path / "p.npz")["src_ids"].shape == (2, 16)


@pytest.mark.parametrize("kind", ["decoder-only", "encoder-only"])
def test_the_report_records_no_target_length_for_a_one_sequence_model(kind, capsys):
    fields = {"num_encoder_layers": "0"} if kind == "decoder-only" else {"num_decoder_layers": "0"}
    sets = [a for k, v in fields.items() for a in ("--set", f"{k}={v}")]
    code, out, _ = run(["verify", "--preset", "tiny", *sets, "--backends", "numpy", "--src-len", "9", "--json", "-"],
                       capsys)
    result = json.loads(out)
    assert code == 0 and result["inputs"] == {"batch": 2, "src_len": 9, "seed": 0} and result["notes"] == []
    code, out, _ = run(["verify", "--preset", "tiny", *sets, "--backends", "numpy", "--tgt-len", "5", "--json", "-"],
                       capsys)
    result = json.loads(out)
    assert "tgt_len" not in result["inputs"]
    assert result["notes"] == [f"--tgt-len 5 not used: a {kind} model reads one sequence (--src-len)"]


# --- bench, like every command; sizes ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["bench", "-q", "--list"], ["bench", "--debug", "--list"],
                                  ["bench", "model", "-q", "--list"], ["bench", "model", "--debug", "--list"]],
                         ids=["bench-q", "bench-debug", "model-q", "model-debug"])
def test_bench_takes_quiet_and_debug(argv, capsys):
    code, out, err = run(argv, capsys)
    assert code == 0 and out.split()[0] in ("name", "implementation") and "torch_impl" in out and err == ""


def test_bench_debug_shows_the_traceback_and_quiet_keeps_errors(tmp_path, capsys):
    code, _, err = run(["bench", "compare", "-q", tmp_path / "a.json", tmp_path / "b.json"], capsys)
    assert code == 2 and err.startswith("transformer-parity: error:") and "a.json" in err
    with pytest.raises(Exception, match="a.json"):
        cli.main(["bench", "compare", "--debug", str(tmp_path / "a.json"), str(tmp_path / "b.json")])


def test_sizes_are_printed_in_mib(tmp_path, capsys):
    code, out, _ = run(["init", "--preset", "tiny", "-o", tmp_path / "t.safetensors"], capsys)
    nbytes = 4 * sum(int(np.prod(s)) for s in rn.parameter_shapes(TINY).values())
    assert code == 0 and f"{nbytes / 2 ** 10:.1f} KiB)" in " ".join(out.split()) and " kB" not in out
    from transformer_parity.io.limits import human_bytes

    assert [human_bytes(n) for n in (512, 2 ** 20, 3 * 2 ** 30, 2 ** 50)] == ["512 B", "1.0 MiB", "3.0 GiB",
                                                                                "1.0 PiB"]
