"""Hostile directories and names: directory outputs never destroy what this tool did not write, every failure has
one outcome, names are escaped before they are printed, links out of a model directory are refused, and temporary
files of killed runs are swept. Every input here is built by the test itself, small."""

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from transformer_parity import cli, formats
from transformer_parity.io import outputs
from transformer_parity.io.safe_text import one_line, printable, toml_string
from parity_tests.support.variants import FAMILIES, VARIANTS
from transformer_parity.verify import seeded_weights

GPT = FAMILIES["gpt2-like"]  # 84 KB: writes as a Hugging Face directory or a KerasHub preset in milliseconds
RAW = ("\x1b", "\x00", "\x07", "\x9b")  # bytes a terminal acts on; none may reach stderr raw


def run(args, capsys):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code, err, *fragments, status=2):
    lines = err.strip().splitlines()
    assert code == status, err
    assert len(lines) == 1 and lines[0].startswith("transformer-parity: "), err
    assert not any(c in err for c in RAW), repr(err)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def snapshot(root: Path) -> dict:
    """Every entry under `root` (not following links): its kind, bytes and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = os.lstat(path)
            content = (os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None)
            out[str(path.relative_to(root))] = (info.st_mode, content, info.st_mtime_ns)
    return out


@pytest.fixture
def gpt(tmp_path):
    path = tmp_path / "gpt.safetensors"
    formats.save(path, GPT, seeded_weights(GPT, 0))
    return path


def _same_model(path: Path, seed: int) -> bool:
    """`path` holds GPT's weights of `seed`, every tensor bit for bit (a Hugging Face config maps back to a
    config that differs in fields a decoder-only model does not use, such as src_vocab_size)."""
    loaded = formats.load(path)
    expected = seeded_weights(GPT, seed)
    return sorted(loaded.weights) == sorted(expected) and all(np.array_equal(loaded.weights[k], expected[k])
                                                              for k in expected)


# --- never destroy what we did not write ------------------------------------------------------------------------------

def _project(root: Path) -> Path:
    """A project folder with a config.json (not a model's), sources, a git repository and notes."""
    root.mkdir()
    (root / "config.json").write_text('{"lr": 0.1, "epochs": 3}')
    (root / "src").mkdir()
    (root / "src" / "train.py").write_text("print('hi')\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "notes.txt").write_text("mine")
    return root


@pytest.mark.parametrize("to", ["hf", "kerashub"])
def test_force_over_a_project_folder_refuses_and_touches_nothing(tmp_path, gpt, capsys, to):
    proj = _project(tmp_path / "proj")
    before, siblings = snapshot(proj), sorted(os.listdir(tmp_path))
    code, _, err = run(["convert", gpt, proj, "--to", to, "--force"], capsys)
    assert_one_line(code, err, "config.json (not a", "src/", ".git/", "notes.txt", "never other files")
    code, _, err = run(["init", "--preset", "tiny", "--set", "num_encoder_layers=0", "-o", proj, "--to", to,
                        "--force"], capsys)
    assert_one_line(code, err, "src/", ".git/", "notes.txt")
    assert snapshot(proj) == before and sorted(os.listdir(tmp_path)) == siblings  # no temporary left either


def test_a_forged_manifest_does_not_make_a_folder_ours(tmp_path, gpt, capsys):
    proj = _project(tmp_path / "proj")
    (proj / outputs.MANIFEST).write_text(json.dumps({"format": outputs.MANIFEST_FORMAT, "files": {
        "notes.txt": {"size": 4, "mtime_ns": 1}, "src": {"size": 0, "mtime_ns": 0}}}))
    before = snapshot(proj)
    code, _, err = run(["convert", gpt, proj, "--to", "hf", "--force"], capsys)
    assert_one_line(code, err, "src/", "notes.txt")
    assert snapshot(proj) == before


def _foreign_hf_dir(root: Path) -> Path:
    """A model directory another tool wrote: sharded weights, an index, a tokenizer, a README."""
    formats.save(root, GPT, seeded_weights(GPT, 5), "hf-gpt2")
    (root / outputs.MANIFEST).unlink()
    os.rename(root / "model.safetensors", root / "model-00001-of-00002.safetensors")
    (root / "model-00002-of-00002.safetensors").write_bytes(b"stale shard")
    (root / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    for name, text in (("tokenizer.json", "{}"), ("generation_config.json", '{"max_length": 9}'),
                       ("README.md", "# my model"), ("special_tokens_map.json", "{}")):
        (root / name).write_text(text)
    return root


def test_force_over_a_model_directory_keeps_what_we_do_not_write(tmp_path, gpt, capsys):
    out = _foreign_hf_dir(tmp_path / "out")
    kept = {n: (out / n).read_bytes() for n in ("tokenizer.json", "generation_config.json", "README.md",
                                                "special_tokens_map.json")}
    code, _, err = run(["convert", gpt, out, "--to", "hf", "--force"], capsys)
    assert code == 0, err
    assert "note: kept in" in err and all(n in " ".join(err.split()) for n in kept)
    assert sorted(os.listdir(out)) == sorted([outputs.MANIFEST, "config.json", "model.safetensors", *kept])
    assert {n: (out / n).read_bytes() for n in kept} == kept  # the old shards and index are gone, the rest kept
    assert _same_model(out, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt.safetensors", "out"]


def test_force_over_our_own_output_keeps_what_the_user_added(tmp_path, gpt, capsys):
    out = tmp_path / "out"
    assert run(["convert", gpt, out, "--to", "kerashub", "-q"], capsys)[0] == 0
    manifest = json.loads((out / outputs.MANIFEST).read_text())
    assert {"config.json", "metadata.json", "model.weights.h5"} <= set(manifest["files"]) <= set(os.listdir(out))
    (out / "tokenizer.json").write_text("{}")
    (out / "assets").mkdir()
    (out / "assets" / "vocab.txt").write_text("a\nb\n")
    (out / "my notes.md").write_text("mine")  # unknown to the format, but added beside a model we wrote
    added = snapshot(out / "assets")
    formats.save(tmp_path / "other.safetensors", GPT, seeded_weights(GPT, 1))
    code, _, err = run(["convert", tmp_path / "other.safetensors", out, "--to", "kerashub", "--force"], capsys)
    assert code == 0, err
    assert (out / "my notes.md").read_text() == "mine" and (out / "tokenizer.json").read_text() == "{}"
    assert snapshot(out / "assets") == added
    assert "kept in" in err and "my notes.md" in err
    loaded = formats.load(out)
    assert all(np.array_equal(loaded.weights[k], v) for k, v in seeded_weights(GPT, 1).items())


def test_writing_into_the_input_or_from_inside_the_output_is_refused(tmp_path, gpt, capsys, monkeypatch):
    hf = tmp_path / "hf"
    formats.save(hf, GPT, seeded_weights(GPT, 0), "hf-gpt2")
    inside = _foreign_hf_dir(tmp_path / "holder")
    formats.save(inside / "model.safetensors", GPT, seeded_weights(GPT, 0), force=True)
    before = snapshot(tmp_path)
    for args, fragment in (([hf, hf, "--to", "hf", "--force"], "is the input"),
                           ([hf, hf / "sub", "--to", "hf"], "lies inside the input directory"),
                           ([inside / "model.safetensors", inside, "--to", "hf", "--force"],
                            "lies inside"),
                           ([gpt, tmp_path, "--to", "hf", "--force"], "lies inside")):
        code, _, err = run(["convert", *args], capsys)
        assert_one_line(code, err, fragment)
    monkeypatch.chdir(hf)
    for out in (".", hf, "../hf"):  # `convert X . --to hf --force` from inside: EBUSY before
        code, _, err = run(["convert", gpt, out, "--to", "hf", "--force"], capsys)
        assert_one_line(code, err, "holds the current directory")
    assert snapshot(tmp_path) == before


# --- one outcome per failure ------------------------------------------------------------------------------------------

def test_an_unexpected_exception_is_one_line_and_exit_3(tmp_path, gpt, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("something \x1b[2J went wrong\nbadly")

    monkeypatch.setattr(formats, "load", broken)
    code, _, err = run(["convert", gpt, tmp_path / "o.pt"], capsys)
    assert_one_line(code, err, "internal error: ZeroDivisionError: something \\x1b[2J went wrong badly", "--debug",
                    status=cli.INTERNAL_ERROR)
    assert cli.INTERNAL_ERROR not in (0, 1, 2, 130)
    with pytest.raises(ZeroDivisionError):
        cli.main(["convert", str(gpt), str(tmp_path / "o.pt"), "--debug"])
    monkeypatch.setattr(cli, "build_parser", broken)
    code, _, err = run(["verify"], capsys)
    assert_one_line(code, err, "internal error", status=cli.INTERNAL_ERROR)


ENCODER = VARIANTS["encoder-only"].replace(num_encoder_layers=1)
REPO = Path(__file__).resolve().parents[1]
ENCODER_LAYOUT = (REPO / "docs" / "examples" / "torch_encoder.toml").read_text()


@pytest.fixture
def encoder(tmp_path):
    path = tmp_path / "enc.safetensors"
    formats.save(path, ENCODER, seeded_weights(ENCODER, 0))
    return path


def _layout(tmp_path, **renames) -> Path:
    text = ENCODER_LAYOUT
    for old, new in renames.items():
        assert f'"{old}" ' in text
        text = text.replace(f'"{old}" ', f"{toml_string(new)} ", 1)
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("key, fragment", [("", ":31: [weights] an empty name"),
                                           (".", ":31: [weights] '.' is not an HDF5 dataset path"),
                                           ("/", ":31: [weights] '/' is not an HDF5 dataset path"),
                                           ("a//b", ":31: [weights] 'a//b' is not an HDF5 dataset path"),
                                           ("a/../b", "received '..'"),
                                           ("classifier.weight/x", "'classifier.weight' would be an HDF5 dataset and "
                                                                   "also the group holding 'classifier.weight/x'")],
                         ids=["empty", "dot", "slash", "double-slash", "dot-dot", "dataset-and-group"])
def test_weights_h5_keys_that_hdf5_cannot_hold_are_refused(tmp_path, encoder, capsys, key, fragment):
    layout = _layout(tmp_path, **{"classifier.bias": key})
    out = tmp_path / "o.weights.h5"
    code, _, err = run(["convert", encoder, out, "--to-layout", layout], capsys)
    assert_one_line(code, err, "mine.toml", fragment)  # refused as the layout is read, naming its line
    assert sorted(os.listdir(tmp_path)) == ["enc.safetensors", "mine.toml"]


def test_a_nested_weights_h5_key_is_written_as_a_group(tmp_path, encoder, capsys):
    """`a/b` is a valid HDF5 path (Keras's own names are such paths): the tensor lands in dataset b of group a."""
    import h5py

    layout = _layout(tmp_path, **{"classifier.bias": "a/b"})
    out = tmp_path / "o.weights.h5"
    code, _, err = run(["convert", encoder, out, "--to-layout", layout], capsys)
    assert code == 0, err
    with h5py.File(out, "r") as f:
        assert isinstance(f["a"], h5py.Group)
        np.testing.assert_array_equal(f["a/b"][()], seeded_weights(ENCODER, 0)["output.bias"])


@pytest.mark.parametrize("transform", ["heads_out", "heads_in"])
def test_a_head_split_of_a_1d_tensor_is_bad_input(tmp_path, encoder, capsys, transform):
    """A layout's heads_out / heads_in on a tensor with too few dimensions (was an IndexError traceback)."""
    from safetensors.numpy import load_file, save_file

    mine = tmp_path / "mine.safetensors"
    assert run(["convert", encoder, mine, "--to-layout", _layout(tmp_path), "-q"], capsys)[0] == 0
    state = load_file(mine)
    state["layers.0.attn.W_Q.weight"] = np.ones(ENCODER.d_model, "f4")
    save_file(state, mine)
    layout = tmp_path / "split.toml"
    layout.write_text(ENCODER_LAYOUT.replace('"encoder.layers.{i}.self_attn.q.kernel transpose"',
                                             f'"encoder.layers.{{i}}.self_attn.q.kernel {transform}"'))
    code, _, err = run(["convert", mine, tmp_path / "o.safetensors", "--layout", layout], capsys)
    assert_one_line(code, err, "split.toml", "layers.0.attn.W_Q.weight' has shape (32,)")
    assert not (tmp_path / "o.safetensors").exists()


# --- messages are safe to print --------------------------------------------------------------------------------------

def test_printable_escapes_every_control_character():
    hostile = "a\x1b[31mb\x00c\nd\re\tf\x7fg\x85h\u202ei\udcffj"
    assert printable(hostile) == "a\\x1b[31mb\\x00c\\nd\\re\\tf\\x7fg\\x85h\\u202ei\\udcffj"
    assert one_line("two\nlines \x1b here") == "two lines \\x1b here"
    assert printable("x" * 500, limit=10) == "xxxxxxxxxx... (500 characters)"
    import tomllib
    assert tomllib.loads(f"k = {toml_string(hostile[:-2])}")["k"] == hostile[:-2]
    with pytest.raises(ValueError, match="not Unicode text"):
        toml_string("\udcff")


def _hf_with_shard_index(root: Path, shard_names) -> Path:
    formats.save(root, GPT, seeded_weights(GPT, 0), "hf-gpt2")
    (root / "model.safetensors").unlink()
    weight_map = {f"t{i}": name for i, name in enumerate(shard_names)}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


@pytest.mark.parametrize("name", ["\x1b]0;pwned\x07shard.safetensors", "nul\x00.safetensors",
                                  "two\nlines.safetensors", "csi\x9b31m.safetensors"],
                         ids=["osc", "nul", "newline", "c1"])
def test_shard_names_are_escaped_in_messages(tmp_path, capsys, name):
    model = _hf_with_shard_index(tmp_path / "m", [name])
    code, _, err = run(["convert", model, tmp_path / "o.safetensors"], capsys)
    assert_one_line(code, err, "missing shard(s)", printable(name))


def test_tensor_names_are_escaped_in_messages(tmp_path, capsys):
    from safetensors.numpy import save_file

    from safetensors.numpy import load_file

    wild = Path(__file__).resolve().parent / "wild" / "gpt2-lm-pt"  # a real GPT-2 directory, then one key more
    assert run(["convert", wild, tmp_path / "m", "--to", "hf-gpt2"], capsys)[0] == 0
    state = load_file(tmp_path / "m" / "model.safetensors")
    save_file({**state, "w\x1b[2J\nx": np.zeros(3, "i4")}, tmp_path / "m" / "model.safetensors", {"format": "pt"})
    code, _, err = run(["convert", tmp_path / "m", tmp_path / "o.safetensors"], capsys)
    assert_one_line(code, err, "w\\x1b[2J")  # the escape shown, never sent; the newline a space: one line


SECRET = b"SECRET!!" + b"{" * 56  # what a link out of the directory points to: none of it may be echoed


def _outside_secret(tmp_path) -> Path:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(SECRET)
    return secret


@pytest.mark.parametrize("member", ["model.safetensors", "config.json", "shard"])
def test_links_out_of_a_model_directory_are_refused(tmp_path, capsys, member):
    secret = _outside_secret(tmp_path)
    model = tmp_path / "m"
    formats.save(model, GPT, seeded_weights(GPT, 0), "hf-gpt2")
    if member == "shard":
        model = _hf_with_shard_index(tmp_path / "m2", ["model-00001-of-00001.safetensors"])
        member = "model-00001-of-00001.safetensors"
    (model / member).unlink(missing_ok=True)
    (model / member).symlink_to(secret)
    code, _, err = run(["convert", model, tmp_path / "o.safetensors"], capsys)
    assert_one_line(code, err, "is a symbolic link to", "outside the model directory")
    assert "SECRET" not in err and str(int.from_bytes(SECRET[:8], "little")) not in err
    assert not (tmp_path / "o.safetensors").exists()


def test_a_kerashub_weights_file_linked_out_is_refused(tmp_path, capsys):
    preset = tmp_path / "kh"
    formats.save(preset, GPT, seeded_weights(GPT, 0), "kerashub-gpt2")
    outside = tmp_path / "elsewhere.weights.h5"
    os.rename(preset / "model.weights.h5", outside)
    (preset / "model.weights.h5").symlink_to(outside)
    code, _, err = run(["convert", preset, tmp_path / "o.safetensors"], capsys)
    assert_one_line(code, err, "model.weights.h5 is a symbolic link to", "outside")


def test_links_inside_the_tree_and_into_a_cache_snapshot_are_followed(tmp_path, capsys):
    """A Hugging Face cache: snapshots/<rev>/ holds links to ../../blobs/<hash>; a link within the directory too."""
    source = tmp_path / "src"
    formats.save(source, GPT, seeded_weights(GPT, 0), "hf-gpt2")
    repo = tmp_path / "models--me--gpt"
    snapshot_dir = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot_dir.mkdir(parents=True)
    for i, name in enumerate(("config.json", "model.safetensors")):
        os.rename(source / name, repo / "blobs" / f"blob{i}")
        (snapshot_dir / name).symlink_to(Path("..", "..", "blobs", f"blob{i}"))
    code, _, err = run(["convert", snapshot_dir, tmp_path / "a.safetensors"], capsys)
    assert code == 0, err
    within = tmp_path / "within"
    (within / "weights").mkdir(parents=True)
    formats.save(within / "weights" / "w", GPT, seeded_weights(GPT, 0), "hf-gpt2")
    os.rename(within / "weights" / "w" / "model.safetensors", within / "weights" / "real.safetensors")
    os.rename(within / "weights" / "w" / "config.json", within / "config.json")
    (within / "model.safetensors").symlink_to(Path("weights", "real.safetensors"))
    code, _, err = run(["convert", within, tmp_path / "b.safetensors"], capsys)
    assert code == 0, err
    assert _same_model(tmp_path / "a.safetensors", 0) and _same_model(tmp_path / "b.safetensors", 0)


def test_a_header_length_is_not_echoed(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(SECRET)
    code, _, err = run(["convert", bad, tmp_path / "o.pt"], capsys)
    assert_one_line(code, err, "header length")
    assert str(int.from_bytes(SECRET[:8], "little")) not in err and "SECRET" not in err


def test_scaffold_of_hostile_names_parses(tmp_path, capsys):
    import tomllib

    from safetensors.numpy import save_file

    hostile = ["layers.0.w\nq", 'x\x1b[31m"\\y', "n\x00ul", "bidi\u202e", "del\x7f\x85", "a]\n[config]\nb"]
    path = tmp_path / "na\nme.safetensors"
    save_file({name: np.ones((i + 1,), "f4") for i, name in enumerate(hostile)}, path)
    code, out, err = run(["layout", "--scaffold", path], capsys)
    assert code == 0, err
    parsed = tomllib.loads(out)
    assert sorted(parsed["weights"]) == sorted(hostile)
    assert not any(c in out for c in RAW)


# --- temporary files: recognisable, swept after a SIGKILL ---------------------------------------------------------

def _dead_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can hold it


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if outputs.TAG in p.name)


@pytest.mark.parametrize("out_name, to", [("o.weights.h5", None), ("o.safetensors", None), ("model", "hf")])
def test_stale_temporaries_of_killed_runs_are_removed_with_a_note(tmp_path, gpt, capsys, out_name, to):
    out = tmp_path / out_name
    suffix = "" if to else outputs.temp_suffix(out)
    ppid, started = os.getppid(), outputs.process_start(os.getppid())
    stale = [f".{out_name}{outputs.TAG}tmp-{_dead_pid()}-abcdefgh{suffix}",  # its process is gone
             f".{out_name}{outputs.TAG}tmp-{ppid}-reusedpd{suffix}"]  # its pid now names a younger process
    live = f".{out_name}{outputs.TAG}tmp-{ppid}-stillrun{suffix}"  # a live writer's: kept
    other = f".other{outputs.TAG}tmp-{_dead_pid()}-abcdefgh{suffix}"  # another output's: not ours to sweep
    for name in (*stale, live, other):
        (tmp_path / name).write_bytes(b"partial")
    if started is None:
        pytest.skip("no /proc start times here")
    os.utime(tmp_path / stale[1], (started - 60, started - 60))
    code, _, err = run(["convert", gpt, out, *(["--to", to] if to else [])], capsys)
    assert code == 0, err
    assert _temps(tmp_path) == sorted([live, other])
    assert "removed 2 temporary file(s)" in " ".join(err.split())


def _write_loop(out: Path, ready_fd: int, seed_of) -> None:
    """In a forked child: replace `out` with --force again and again, telling the parent after each write."""
    notes = []
    i = 0
    while True:
        formats.save(out, GPT, seeded_weights(GPT, seed_of(i)), "hf-gpt2", force=True, notes=notes)
        os.write(ready_fd, b".")
        i += 1


def _fork(target) -> int:
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            target()
        finally:
            os._exit(0)
    return pid


def test_twenty_sigkills_during_directory_writes_leave_nothing_behind(tmp_path):
    """20 writers killed at random moments of replacing a model directory that holds a tokenizer: after each,
    the tokenizer is never lost; one more write sweeps every temporary and leaves the model complete."""
    out = tmp_path / "out"
    formats.save(out, GPT, seeded_weights(GPT, 0), "hf-gpt2")
    (out / "tokenizer.json").write_text('{"kept": true}')
    rng = random.Random(26)
    start = time.monotonic()
    for trial in range(20):
        read_fd, write_fd = os.pipe()
        pid = _fork(lambda: _write_loop(out, write_fd, lambda i: i % 2))
        os.close(write_fd)
        os.read(read_fd, 1)  # one write done: the loop is running
        time.sleep(rng.uniform(0, 0.03))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_fd)
        places = [out / "tokenizer.json"] + [p / "tokenizer.json" for p in tmp_path.glob(f".out{outputs.TAG}old-*")]
        assert sum(p.is_file() for p in places) == 1, (trial, _temps(tmp_path))
    left = _temps(tmp_path)
    notes = []
    formats.save(out, GPT, seeded_weights(GPT, 3), "hf-gpt2", force=True, notes=notes)
    assert _temps(tmp_path) == [], (left, notes)
    assert _same_model(out, 3) and (out / "tokenizer.json").read_text() == '{"kept": true}'
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("step", [1, 2, 3, 4], ids=["before-move-aside", "before-new-in-place",
                                                   "before-first-kept-moved", "between-kept-moves"])
def test_a_sigkill_at_each_step_of_a_replacement_is_recovered(tmp_path, step):
    """Kill the writer just before its step-th rename while publishing over a model with a tokenizer and a
    README; the next write finishes or undoes the replacement: nothing lost, nothing left."""
    out = tmp_path / "out"
    formats.save(out, GPT, seeded_weights(GPT, 0), "hf-gpt2")
    (out / "tokenizer.json").write_text("tok")
    (out / "README.md").write_text("readme")

    def killed_at_step():
        rename, count = os.rename, [0]

        def counting(*args):
            count[0] += 1
            if count[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return rename(*args)

        os.rename = counting
        formats.save(out, GPT, seeded_weights(GPT, 1), "hf-gpt2", force=True, notes=[])

    pid = _fork(killed_at_step)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert _temps(tmp_path)  # something was left to sweep
    notes = []
    formats.save(out, GPT, seeded_weights(GPT, 2), "hf-gpt2", force=True, notes=notes)
    assert _temps(tmp_path) == [], notes
    assert (out / "tokenizer.json").read_text() == "tok" and (out / "README.md").read_text() == "readme"
    assert _same_model(out, 2)
    assert any("killed" in n for n in notes)


def test_temporary_names_say_whose_they_are(tmp_path):
    out = tmp_path / ("m" * 240 + ".weights.h5")
    with outputs.atomic_path(out) as tmp:
        assert tmp.name.startswith(".m") and f"{outputs.TAG}tmp-{os.getpid()}-" in tmp.name
        assert tmp.name.endswith(".weights.h5") and len(tmp.name.encode()) <= outputs.NAME_MAX
        tmp.write_bytes(b"x")
    assert out.read_bytes() == b"x" and _temps(tmp_path) == []


def test_a_training_run_sweeps_only_its_own_temporaries(tmp_path):
    """A run directory: a killed save's temporary manifest (ours, dead pid) goes at the next save; a user's
    `.notes.tmp` beside the run stays (it used to match the sweep's `.*.tmp`)."""
    from transformer_parity.train import run as training_run

    from .test_training import small_settings

    out = tmp_path / "run"
    out.mkdir()
    stale = out / f".{training_run.MANIFEST}{outputs.TAG}tmp-{_dead_pid()}-abcdefgh"
    stale.write_text("{")
    (out / ".notes.tmp").write_text("mine")
    training_run.train(out, "torch", small_settings(steps=2, checkpoint_every=2))
    assert not stale.exists() and (out / ".notes.tmp").read_text() == "mine"
    assert not [p for p in out.rglob("*") if outputs.TAG in p.name]


if sys.platform != "linux":  # /proc, fork and pid_max are what these tests stand on
    pytestmark = pytest.mark.skip("Linux only")
