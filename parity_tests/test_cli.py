"""The `transformer-parity` command line: the README walkthrough, exit codes, the JSON report, and every kind of bad
input (one line on stderr, exit 2, no traceback, no partial output, nothing in a pickle ever run)."""

import importlib.machinery
import json
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from transformer_parity import __version__, cli, formats
from transformer_parity.errors import UsageError
from transformer_parity.verify import seeded_weights

from .conftest import TINY

REPO = Path(__file__).resolve().parents[1]


def run(args, capsys):
    """`cli.main(args)` in-process: (exit status, stdout, stderr)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_error(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("transformer-parity"), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def tiny_file(tmp_path):
    path = tmp_path / "tiny.safetensors"
    formats.save(path, TINY, seeded_weights(TINY, 0))
    return path


# --- basics ---------------------------------------------------------------------------------------------------------

def test_version_and_help(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"transformer-parity {__version__}"
    for command in ("init", "convert", "verify"):
        code, out, _ = run([command, "--help"], capsys)
        assert code == 0 and "examples:" in out and "transformer-parity " + command in out
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and all(c in out for c in ("init", "convert", "verify"))


def test_importing_the_cli_loads_no_framework():
    code = ("import sys, transformer_parity.cli as c; c.build_parser(); "
            "print(sorted(m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_console_entry_point_one_line_errors():
    result = subprocess.run([sys.executable, "-m", "transformer_parity", "convert", "missing.pt", "out.safetensors"],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == "transformer-parity: error: no such file: missing.pt"


# quiet at the file-descriptor level (TensorFlow's start-up notices): parity_tests/test_quiet.py

def test_quiet_never_overrides_the_user():
    from transformer_parity import quiet

    environ = {"TF_CPP_MIN_LOG_LEVEL": "1"}
    assert quiet.configure(environ=environ) == {} and environ == {"TF_CPP_MIN_LOG_LEVEL": "1"}
    environ = {}
    assert quiet.configure(environ=environ) == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    environ = {}
    assert quiet.configure(debug=True, environ=environ) == {"TF_CPP_MIN_LOG_LEVEL": "0"}


# --- the walkthrough ------------------------------------------------------------------------------------------------

def test_init_convert_verify_walkthrough(tmp_path, capsys):
    base = tmp_path / "model.safetensors"
    code, out, _ = run(["init", "--preset", "tiny", "--exercise-all", "--seed", "3", "-o", base], capsys)
    assert code == 0 and "wrote" in out
    assert run(["convert", base, tmp_path / "model.pt"], capsys)[0] == 0
    code, out, _ = run(["convert", base, tmp_path / "model.weights.h5"], capsys)
    assert code == 0 and "canonical" in out and "keras" in out
    code, out, _ = run(["verify", tmp_path / "model.pt", tmp_path / "model.weights.h5", "--json",
                        tmp_path / "report.json"], capsys)
    assert code == 0 and "PASS" in out and "torch vs keras" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] is True and report["first_divergence"] is None
    assert {"sublayer", "backends", "max_abs_err", "max_rel_err", "floor", "passed"} <= set(report["rows"][0])
    sublayers = {r["sublayer"] for r in report["rows"]}
    assert len(report["rows"]) == 3 * len(sublayers) == 3 * 17  # torch, keras, torch vs keras
    back = tmp_path / "back.safetensors"
    assert run(["convert", tmp_path / "model.weights.h5", back], capsys)[0] == 0
    original, round_trip = formats.load(base), formats.load(back)
    assert original.config == round_trip.config
    for name, value in original.weights.items():
        np.testing.assert_array_equal(round_trip.weights[name], value)


def test_verify_without_checkpoints_and_quiet(tmp_path, capsys):
    code, out, err = run(["verify", "--preset", "tiny", "--backends", "torch", "--quiet", "--json",
                          tmp_path / "r.json"], capsys)
    assert code == 0 and out == "" and err == ""
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["subjects"][0]["label"] == "torch" and report["inputs"] == {"batch": 2, "src_len": 37,
                                                                              "tgt_len": 29, "seed": 0}
    code, _, err = run(["verify", "--preset", "tiny", "--backends", "torch", "--json", tmp_path / "r.json"], capsys)
    assert_clean_error(code, err, "exists; pass --force")


def test_init_options_and_refusals(tmp_path, capsys):
    out = tmp_path / "t.pt"
    assert run(["init", "--preset", "tiny", "--set", "num_heads=2", "--set", "norm_first=true", "-o", out],
               capsys)[0] == 0
    config = formats.load(out).config
    assert config.num_heads == 2 and config.norm_first is True
    code, _, err = run(["init", "--preset", "tiny", "-o", out], capsys)
    assert_clean_error(code, err, "exists; pass --force")
    assert run(["init", "--preset", "tiny", "--seed", "1", "-o", out, "--force", "-q"], capsys)[0] == 0
    (tmp_path / "c.json").write_text(json.dumps({"d_model": 16, "num_heads": 2}))
    assert run(["init", "--preset", "tiny", "--config", tmp_path / "c.json", "-o", tmp_path / "c.safetensors"],
               capsys)[0] == 0
    assert formats.load(tmp_path / "c.safetensors").config.d_model == 16


# --- bad input: one line, exit 2, nothing written -------------------------------------------------------------------

class Evil:
    """A pickle payload: unpickling it would create a directory (any code could run there)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _bad_inputs(tmp_path: Path, tiny_file: Path) -> dict[str, tuple[Path, list[str], list[str]]]:
    """name -> (input file, extra args, fragments the error must contain)."""
    import torch

    raw = tiny_file.read_bytes()
    cases = {}

    def case(name, filename, content, extra=(), fragments=()):
        path = tmp_path / filename
        if content is not None:
            path.write_bytes(content) if isinstance(content, bytes) else path.mkdir()
        cases[name] = (path, list(extra), list(fragments))

    case("missing", "nope.safetensors", None, fragments=["no such file"])
    case("unknown-format", "notes.txt", b"hello, world", fragments=["match no supported format"])
    case("wrong-format-flag", "model.safetensors", raw, ["--from", "torch"], ["cannot hold the torch format"])
    case("lying-extension", "model.weights.h5", raw, fragments=["content is safetensors"])
    case("empty", "empty.pt", b"", fragments=["is empty"])
    case("truncated-safetensors", "cut.safetensors", raw[: len(raw) // 2], fragments=["truncated"])
    case("bad-header", "header.safetensors", raw[:8] + b"\xff" * 40 + raw[48:], fragments=["header"])
    case("directory", "adir.pt", "dir", fragments=["is a directory"])
    case("config-mismatch", "model2.safetensors", raw, ["--set", "d_model=64", "--set", "num_heads=4"],
         ["do not match the config"])
    case("bad-set", "model3.safetensors", raw, ["--set", "heads=4"], ["unknown config field 'heads'"])
    case("bad-set-value", "model4.safetensors", raw, ["--set", "num_heads=four"], ["expected int"])
    formats.save(tmp_path / "good.pt", TINY, seeded_weights(TINY))
    case("truncated-pt", "cut.pt", (tmp_path / "good.pt").read_bytes()[:3000], fragments=["truncated or corrupt"])
    formats.save(tmp_path / "good.weights.h5", TINY, seeded_weights(TINY))
    case("truncated-h5", "cut.weights.h5", (tmp_path / "good.weights.h5").read_bytes()[:5000],
         fragments=["truncated or corrupt"])
    torch.save({"format": "transformer-parity/torch", "state_dict": Evil(tmp_path / "pwned-zip")},
               tmp_path / "evil.pt")
    case("pickle-zip", "evil.pt", (tmp_path / "evil.pt").read_bytes(), fragments=["refusing", "weights_only"])
    case("pickle-legacy", "evil_legacy.pth", pickle.dumps(Evil(tmp_path / "pwned-legacy"), protocol=2),
         fragments=["refusing"])
    return cases


CASES = ["missing", "unknown-format", "wrong-format-flag", "lying-extension", "empty", "truncated-safetensors",
         "bad-header", "directory", "config-mismatch", "bad-set", "bad-set-value", "truncated-pt", "truncated-h5",
         "pickle-zip", "pickle-legacy"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_one_line_exit_2_no_output(tmp_path, tiny_file, capsys, case):
    path, extra, fragments = _bad_inputs(tmp_path, tiny_file)[case]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, _, err = run(["convert", path, out_dir / "result.pt", *extra], capsys)
    assert_clean_error(code, err, *fragments)
    assert listing(out_dir) == []  # no partial output, no temporary file
    assert not (tmp_path / "pwned-zip").exists() and not (tmp_path / "pwned-legacy").exists()
    code, _, err = run(["verify", path, *extra], capsys)  # verify reads files the same way
    assert_clean_error(code, err, *fragments)


def test_output_refusals(tmp_path, tiny_file, capsys):
    (tmp_path / "exists.pt").write_bytes(b"precious")
    code, _, err = run(["convert", tiny_file, tmp_path / "exists.pt"], capsys)
    assert_clean_error(code, err, "exists; pass --force")
    assert (tmp_path / "exists.pt").read_bytes() == b"precious"
    (tmp_path / "outdir").mkdir()
    code, _, err = run(["convert", tiny_file, tmp_path / "outdir"], capsys)
    assert_clean_error(code, err)
    code, _, err = run(["convert", tiny_file, tmp_path / "no" / "such" / "dir.pt"], capsys)
    assert_clean_error(code, err, "does not exist")
    code, _, err = run(["convert", tiny_file, tmp_path / "x.keras"], capsys)
    assert_clean_error(code, err, ".keras")
    code, _, err = run(["convert", tiny_file, tmp_path / "x.pt", "--to", "wrong"], capsys)
    assert_clean_error(code, err, "invalid choice")
    assert run(["convert", tiny_file, tmp_path / "exists.pt", "--force"], capsys)[0] == 0
    assert formats.load(tmp_path / "exists.pt").config == TINY


def test_verify_usage_errors(tmp_path, tiny_file, capsys):
    for args, fragment in [(["--batch", "0"], "--batch must be >= 1"),
                           (["--src-len", "999"], "longer than max_len"),
                           (["--backends", "jax"], "unknown backend"),
                           ([str(tiny_file), str(tiny_file), "--backends", "torch"], "--backends applies")]:
        code, _, err = run(["verify", "--preset", "tiny", *args], capsys)
        assert_clean_error(code, err, fragment)
    # another architecture: with weights first, that is a verdict (the weights differ), not a usage error
    formats.save(tmp_path / "other.safetensors", TINY.replace(d_ff=16), seeded_weights(TINY.replace(d_ff=16)))
    code, out, err = run(["verify", tiny_file, tmp_path / "other.safetensors"], capsys)
    out = " ".join(out.split())
    assert code == 1 and err == "" and "WEIGHTS DIFFER: " in out and "tensors differ or are missing in all" in out
    assert "outputs not compared: " in out and "not the same architecture" in out and "d_ff" in out
    code, _, err = run(["verify", tiny_file, tmp_path / "other.safetensors", "--outputs-only"], capsys)
    assert_clean_error(code, err, "not the same architecture", "d_ff")


def test_debug_shows_the_traceback(tmp_path, capsys):
    with pytest.raises(UsageError, match="no such file"):
        cli.main(["convert", str(tmp_path / "missing.pt"), str(tmp_path / "out.pt"), "--debug"])


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, OSError], ids=["ctrl-c", "disk-error"])
@pytest.mark.parametrize("target", ["out.safetensors", "out.weights.h5"])
def test_interrupted_writes_leave_nothing_behind(tmp_path, tiny_file, capsys, monkeypatch, interrupt, target):
    from transformer_parity.formats import keras_file as kc

    from transformer_parity.io import safetensors_io

    def half_written(path, config, weights, on_tensor=None, consume=False, origin=None):
        Path(path).write_bytes(b"half a file")
        raise interrupt("stopped")

    monkeypatch.setattr(safetensors_io, "write_canonical", half_written)
    monkeypatch.setattr(kc, "save_weights_h5", half_written)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, _, err = run(["convert", tiny_file, out_dir / target], capsys)
    assert code == (130 if interrupt is KeyboardInterrupt else 2)
    assert len(err.strip().splitlines()) == 1
    assert listing(out_dir) == []


# --- torch.nn.Transformer checkpoints through the CLI ---------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::UserWarning")
def test_import_a_torch_nn_transformer_and_export_it_to_keras(tmp_path, capsys):
    import torch

    from .test_formats import _randomize, _tutorial_classes

    seq2seq, _ = _tutorial_classes()
    torch.save(_randomize(seq2seq(2, 2, 32, 4, 50, 45, dim_feedforward=64), 7).state_dict(), tmp_path / "tut.pt")
    settings = ["--set", "activation=relu", "--set", "norm_first=false", "--set", "layer_norm_eps=1e-5",
                "--set", "scale_embedding=true", "--set", "pad_id=1"]
    code, out, err = run(["convert", tmp_path / "tut.pt", tmp_path / "tut.safetensors", "--set", "num_heads=4",
                          *settings], capsys)
    assert code == 0 and "(nn-transformer)" in out and "assumed" not in err
    assert run(["convert", tmp_path / "tut.safetensors", tmp_path / "tut.weights.h5"], capsys)[0] == 0
    code, out, _ = run(["verify", tmp_path / "tut.pt", tmp_path / "tut.weights.h5", "--set", "num_heads=4",
                        *settings], capsys)
    assert code == 0 and "PASS" in out
    code, _, err = run(["convert", tmp_path / "tut.pt", tmp_path / "x.safetensors", "--set", "num_heads=3",
                        *settings], capsys)
    assert_clean_error(code, err, "not divisible by num_heads=3")


# --- subcommands from other modules ---------------------------------------------------------------------------------

def test_other_modules_register_subcommands(monkeypatch, capsys):
    plugin = types.ModuleType("fake_plugin_cli")
    plugin.__spec__ = importlib.machinery.ModuleSpec("fake_plugin_cli", None)

    def register(subparsers):
        p = subparsers.add_parser("hello", help="say hello")
        p.add_argument("--fail", action="store_true")

        def handler(args):
            if args.fail:
                raise UsageError("hello failed cleanly")
            print("hello" if not args.quiet else "")
            return 0

        p.set_defaults(func=handler)

    plugin.register = register
    monkeypatch.setitem(sys.modules, "fake_plugin_cli", plugin)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["fake_plugin_cli", "no_such_package.cli"])
    code, out, _ = run(["hello"], capsys)
    assert code == 0 and out.strip() == "hello"
    code, _, err = run(["hello", "--fail"], capsys)
    assert_clean_error(code, err, "hello failed cleanly")


@pytest.mark.parametrize("text, value", [("false", False), ("True", True), ("none", None)])
def test_set_parses_an_optional_switch(text, value):
    from transformer_parity.config_fields import parse_fields

    assert parse_fields(None, [f"output_bias={text}"]) == {"output_bias": value}
