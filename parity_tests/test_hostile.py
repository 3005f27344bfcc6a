"""Hostile files and faults: every file a test builds here is crafted to make a reader read another file,
allocate without bound, or pass a broken port; each must end in exit 2 with one line (or a clean verdict), and
nothing may be written."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from transformer_parity import cli, formats
from transformer_parity.io import guards, outputs
from transformer_parity.verify import seeded_weights

from .conftest import TINY

REPO = Path(__file__).resolve().parents[1]
H5_DATASET = "layers/output_projection/vars/1"  # output.bias of TINY: (tgt_vocab_size,) float32


def run(args, capsys):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_error(code, err, *fragments):
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("transformer-parity: error:"), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def tiny_h5(tmp_path):
    path = tmp_path / "tiny.weights.h5"
    formats.save(path, TINY, seeded_weights(TINY, 0))
    return path


# --- 1. HDF5: nothing read from outside the file, nothing expanded beyond it ----------------------------------------

def _replace_dataset(path: Path, make) -> None:
    import h5py

    with h5py.File(path, "a") as f:
        shape = f[H5_DATASET].shape
        del f[H5_DATASET]
        make(f, H5_DATASET, shape)


def _external(secret):
    return lambda f, name, shape: f.create_dataset(name, shape=shape, dtype="<f4",
                                                   external=[(str(secret), 0, 4 * shape[0])])


def _virtual(other):
    def make(f, name, shape):
        import h5py

        layout = h5py.VirtualLayout(shape=shape, dtype="<f4")
        layout[:] = h5py.VirtualSource(str(other), "x", shape=shape)
        f.create_virtual_dataset(name, layout)
    return make


def _external_link(other):
    def make(f, name, shape):
        import h5py

        f[name] = h5py.ExternalLink(str(other), "x")
    return make


def _soft_link(f, name, shape):
    import h5py

    f[name] = h5py.SoftLink("/layers/output_projection/vars/0")


H5_CASES = {
    "external-storage": (lambda tmp: _external(tmp / "secret.bin"), "external file"),
    "virtual-dataset": (lambda tmp: _virtual(tmp / "other.h5"), "virtual dataset"),
    "external-link": (lambda tmp: _external_link(tmp / "other.h5"), "external link"),
    "soft-link": (lambda tmp: _soft_link, "soft link"),
    "gzip": (lambda tmp: (lambda f, n, s: f.create_dataset(n, data=np.zeros(s, "f4"), compression="gzip")),
             "filters"),
    "fill-value": (lambda tmp: (lambda f, n, s: f.create_dataset(n, shape=s, dtype="f4", fillvalue=1.0)),
                   "partly stored"),
    "string": (lambda tmp: (lambda f, n, s: f.create_dataset(n, data=np.array(["x"] * s[0], dtype="S8"))),
               "dtype"),
    "wrong-shape": (lambda tmp: (lambda f, n, s: f.create_dataset(n, data=np.zeros((s[0] + 1,), "f4"))),
                    "the config expects"),
    "extra-dataset": (lambda tmp: (lambda f, n, s: (f.create_dataset(n, data=np.zeros(s, "f4")),
                                                    f.create_dataset("stray", data=np.zeros(3, "f4")))),
                      "'stray' is not a weight"),
}


@pytest.mark.parametrize("case", list(H5_CASES), ids=list(H5_CASES))
def test_hostile_h5_refused(tmp_path, tiny_h5, capsys, case):
    import h5py

    (tmp_path / "secret.bin").write_bytes(b"SECRET!!" * 64)
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = np.arange(TINY.tgt_vocab_size, dtype="f4")
    make, fragment = H5_CASES[case]
    _replace_dataset(tiny_h5, make(tmp_path))
    out = tmp_path / "out.safetensors"
    code, _, err = run(["convert", tiny_h5, out], capsys)
    assert_clean_error(code, err, fragment)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.h5", "secret.bin", "tiny.weights.h5"]


def test_h5_config_larger_than_the_file_is_refused(tmp_path, tiny_h5, capsys):
    import h5py

    with h5py.File(tiny_h5, "a") as f:
        f.attrs["transformer_parity_config"] = TINY.replace(num_encoder_layers=10**9).to_json()
    code, _, err = run(["convert", tiny_h5, tmp_path / "out.pt"], capsys)
    assert_clean_error(code, err, "num_encoder_layers=1000000000")


# --- 2. verify never passes on a non-finite judge or floor ------------------------------------------------------------

def _float64_pair(tmp_path, name, value, shift_port=0.0):
    weights = seeded_weights(TINY, 0, np.float64)
    weights[name] = weights[name].copy()
    weights[name].flat[0] = value
    formats.save(tmp_path / "ref.safetensors", TINY, weights)
    port = {k: v.copy() for k, v in weights.items()}
    port["output.bias"] = port["output.bias"] + shift_port
    formats.save(tmp_path / "port.pt", TINY, port)


@pytest.mark.parametrize("value, fragment", [
    (1e39, "weight encoder.layers.0.ffn.linear1.bias has magnitude 1e+39"),
    (np.nan, "weight encoder.layers.0.ffn.linear1.bias holds NaN or inf"),
], ids=["1e39", "nan"])
def test_verify_fails_on_a_nonfinite_floor(tmp_path, capsys, value, fragment):
    _float64_pair(tmp_path, "encoder.layers.0.ffn.linear1.bias", value, shift_port=100.0)
    code, out, err = run(["verify", tmp_path / "ref.safetensors", tmp_path / "port.pt", "--dtype", "float64",
                          "--json", "-", "--outputs-only"], capsys)  # the floor alone must fail it
    assert code == 1, (out, err)
    report = json.loads(out)  # strict JSON: no NaN or Infinity tokens
    assert report["passed"] is False
    assert fragment in report["problems"][0] and "not finite at sublayer" in report["problems"][0]
    assert out.lstrip().startswith("{") and report["verdict"].startswith("FAILED: ")  # the JSON alone on stdout
    code, out, _ = run(["verify", tmp_path / "ref.safetensors", tmp_path / "port.pt", "--dtype", "float64",
                        "--outputs-only"], capsys)
    assert code == 1 and "FAILED: " in out and fragment in " ".join(out.split())
    code, out, _ = run(["verify", tmp_path / "ref.safetensors", tmp_path / "port.pt", "--dtype", "float64"], capsys)
    assert code == 1  # weights first: output.bias differs


def test_verify_float64_port_with_finite_floor_still_passes(tmp_path, capsys):
    _float64_pair(tmp_path, "encoder.layers.0.ffn.linear1.bias", 0.5)
    code, out, _ = run(["verify", tmp_path / "ref.safetensors", tmp_path / "port.pt", "--dtype", "float64", "-q"],
                       capsys)
    assert code == 0, out


# --- 3. output paths: regular files or new paths only; no overwrite race; the umask ---------------------------------

@pytest.fixture
def tiny_file(tmp_path):
    path = tmp_path / "tiny.safetensors"
    formats.save(path, TINY, seeded_weights(TINY, 0))
    return path


def _fifo(path):
    os.mkfifo(path)


def _symlink(path):
    (path.parent / "target.pt").write_bytes(b"keep")
    path.symlink_to(path.parent / "target.pt")


def _dangling(path):
    path.symlink_to(path.parent / "nowhere.pt")


@pytest.mark.parametrize("make, fragment", [(_fifo, "FIFO"), (_symlink, "symbolic link"),
                                            (_dangling, "symbolic link")], ids=["fifo", "symlink", "dangling"])
def test_special_outputs_refused_even_with_force(tmp_path, tiny_file, capsys, make, fragment):
    out = tmp_path / "out.pt"
    make(out)
    before = os.lstat(out)
    for extra in ([], ["--force"]):
        code, _, err = run(["convert", tiny_file, out, *extra], capsys)
        assert_clean_error(code, err, fragment, "even with --force")
    after = os.lstat(out)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    if (tmp_path / "target.pt").exists():
        assert (tmp_path / "target.pt").read_bytes() == b"keep"
    assert not [p for p in tmp_path.iterdir() if ".tp-" in p.name]


def test_a_path_that_turns_special_while_writing_is_not_replaced(tmp_path):
    out = tmp_path / "out.bin"
    with pytest.raises(formats.UsageError, match="FIFO"):
        with outputs.atomic_path(out, force=True) as tmp:
            tmp.write_bytes(b"x")
            os.mkfifo(out)
    assert guards.special_kind(out) == "FIFO (named pipe)" and os.listdir(tmp_path) == ["out.bin"]


def test_racing_writers_cannot_both_create(tmp_path):
    import threading

    out, barrier, results = tmp_path / "out.bin", threading.Barrier(2), []

    def writer(i):
        try:
            with outputs.atomic_path(out) as tmp:
                tmp.write_bytes(b"writer %d" % i)
                barrier.wait()  # both have checked that the path is free and written their file
            results.append(i)
        except formats.UsageError as exc:
            assert "appeared while it was being written" in str(exc)
            results.append(-1)

    threads = [threading.Thread(target=writer, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winner = max(results)
    assert sorted(results) == [-1, winner] and out.read_bytes() == b"writer %d" % winner
    assert os.listdir(tmp_path) == ["out.bin"]


def test_racing_convert_processes(tmp_path, tiny_file):
    out = tmp_path / "out.safetensors"
    cmd = [sys.executable, "-m", "transformer_parity", "convert", str(tiny_file), str(out)]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    codes = sorted(p.wait() for p in procs)
    assert codes in ([0, 2], [0, 0]) and out.exists()  # [0, 0] only if one finished before the other checked
    if codes == [0, 2]:
        err = [p.stderr.read() for p in procs if p.returncode == 2][0]
        assert "exists" in err or "appeared" in err
    assert not [p for p in tmp_path.iterdir() if ".tp-" in p.name]


def test_files_follow_the_umask_and_force_keeps_the_mode(tmp_path, tiny_file, capsys):
    old = os.umask(0o027)
    try:
        out = tmp_path / "out.pt"
        assert run(["convert", tiny_file, out], capsys)[0] == 0
        assert out.stat().st_mode & 0o777 == 0o640
        out.chmod(0o604)
        assert run(["convert", tiny_file, out, "--force"], capsys)[0] == 0
        assert out.stat().st_mode & 0o777 == 0o604
    finally:
        os.umask(old)


@pytest.mark.parametrize("length", [239, 254])
def test_long_output_names(tmp_path, tiny_file, capsys, length):
    out = tmp_path / ("m" * (length - len(".weights.h5")) + ".weights.h5")
    assert len(out.name) == length
    code, _, err = run(["convert", tiny_file, out], capsys)
    assert code == 0, err
    assert formats.load(out).config == TINY
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, tiny_file.name])


# --- 4. unbounded allocation from small files ----------------------------------------------------------------------

def _project_pt(path, mutate=None, config=TINY):
    import torch

    formats.save(path, config, seeded_weights(config, 0))
    obj = torch.load(path, weights_only=True)
    if mutate is not None:
        mutate(obj)
    path.unlink()
    torch.save(obj, path)
    return path


def _expand(obj):
    import torch

    obj["state_dict"]["output.bias"] = torch.zeros(1).expand(10**9)  # 4 GB once copied, 4 bytes stored


def _sparse(obj):
    import torch

    obj["state_dict"]["output.bias"] = torch.zeros(TINY.tgt_vocab_size).to_sparse()


def _huge_config(obj):
    obj["config"] = TINY.replace(num_encoder_layers=10**9).to_json()


@pytest.mark.parametrize("mutate, fragment", [(_expand, "repeats or overlaps"), (_sparse, "layout torch.sparse_coo"),
                                              (_huge_config, "num_encoder_layers=1000000000")],
                         ids=["zero-stride", "sparse", "layers-1e9"])
def test_hostile_pt_refused(tmp_path, capsys, mutate, fragment):
    path = _project_pt(tmp_path / "bad.pt", mutate)
    code, _, err = run(["convert", path, tmp_path / "out.safetensors"], capsys)
    assert_clean_error(code, err, fragment)
    assert not (tmp_path / "out.safetensors").exists()


def _member_data_offset(path, name):
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(name))
    raw = path.read_bytes()
    n, m = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    return info.header_offset + 30 + n + m, info.file_size


def test_pt_with_flipped_bytes_fails_its_crc(tmp_path, capsys):
    import zipfile

    path = _project_pt(tmp_path / "m.pt")
    with zipfile.ZipFile(path) as z:
        largest = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size).filename
    start, size = _member_data_offset(path, largest)
    raw = bytearray(path.read_bytes())
    for i in range(64):
        raw[start + (i * 7) % size] ^= 0xFF
    path.write_bytes(bytes(raw))
    code, _, err = run(["convert", path, tmp_path / "out.safetensors"], capsys)
    assert_clean_error(code, err, "does not match its CRC-32")


def test_pt_deflate_bomb_refused(tmp_path, capsys):
    import zipfile

    import torch

    plain = tmp_path / "plain.pt"
    torch.save({"state_dict": {"src_embed.token.weight": torch.zeros(4_000_000)}}, plain)
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert bomb.stat().st_size < plain.stat().st_size / 50
    code, _, err = run(["convert", bomb, tmp_path / "out.safetensors", "--set", "d_model=8"], capsys)
    assert_clean_error(code, err, "decompression bomb")


def test_safetensors_hostile_headers(tmp_path, tiny_file, capsys):
    from safetensors.numpy import load_file, save_file

    raw = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    deep = tmp_path / "deep.safetensors"
    deep.write_bytes(len(raw).to_bytes(8, "little") + raw)
    code, _, err = run(["convert", deep, tmp_path / "out.pt"], capsys)
    assert_clean_error(code, err, "nests JSON too deeply")
    big = tmp_path / "big.safetensors"
    save_file(load_file(tiny_file), big, metadata={"format": "transformer-parity/canonical", "format_version": "1",
                                                   "config": TINY.replace(num_decoder_layers=10**9).to_json()})
    for args in (["convert", big, tmp_path / "out.pt"], ["convert", tiny_file, tmp_path / "out.pt", "--set",
                                                          "num_encoder_layers=1000000000"]):
        code, _, err = run(args, capsys)
        assert_clean_error(code, err, "layers=1000000000")
    assert not (tmp_path / "out.pt").exists()


def _task_checkpoint(tmp_path):
    import reference_numpy as rn

    config = rn.TaskSpec().model_config(d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32)
    path = tmp_path / "task.safetensors"
    formats.save(path, config, seeded_weights(config, 0))
    return path


@pytest.mark.parametrize("args, fragment", [
    (["init", "--preset", "tiny", "--set", "src_vocab_size=1000000000000", "-o", "{tmp}/x.pt"], "src_vocab_size"),
    (["verify", "--preset", "tiny", "--batch", "1000000000"], "verify needs about"),
    (["verify", "--preset", "tiny", "--set", "max_len=1000000000000"], "max_len"),
    (["verify", "--preset", "tiny", "--set", "src_vocab_size=10000000000"], "src_vocab_size"),
    (["train", "--framework", "torch", "--out", "{tmp}/run", "--batch-size", "1000000000"], "--batch-size 1000000000"),
    (["train", "--framework", "torch", "--out", "{tmp}/run", "--eval-size", "1000000000"], "--eval-size 1000000000"),
    (["train", "--framework", "torch", "--out", "{tmp}/run", "--num-symbols", "1000000000"], "--num-symbols"),
    (["train", "--framework", "torch", "--out", "{tmp}/run", "--threads", "100000"], "--threads must be between"),
    (["generate", "{ckpt}", "--framework", "numpy", "--examples", "1000000000000"], "--examples 1000000000000"),
    (["bench", "--threads", "100000"], "--threads must be between"),
], ids=["init-vocab", "verify-batch", "verify-max-len", "verify-vocab", "train-batch", "train-eval-size",
        "train-symbols", "train-threads", "generate-examples", "bench-threads"])
def test_sizes_beyond_memory_refused_with_the_estimate(tmp_path, capsys, args, fragment):
    ckpt = _task_checkpoint(tmp_path) if "{ckpt}" in args else None
    args = [a.format(tmp=tmp_path, ckpt=ckpt) for a in args]
    code, _, err = run(args, capsys)
    assert_clean_error(code, err, fragment)
    assert "MemoryError" not in err and not (tmp_path / "x.pt").exists() and not (tmp_path / "run").exists()


def test_bench_rows_estimated_and_skipped(capsys):
    from transformer_parity.bench import attention

    peaks = {("cpu", "float32"): {"gflops": 100.0}}
    options = attention.Options(row_budget=60.0)
    assert attention.skip_reason(attention.Case(q_len=1024, k_len=1024), options, peaks) is None
    slow = attention.skip_reason(attention.Case(q_len=65536, k_len=65536), options, peaks)
    assert slow.startswith("one call needs >= 352 s")
    huge = attention.skip_reason(attention.Case(q_len=10**8, k_len=10**8), options, peaks)
    assert huge.startswith("its inputs alone need")


# --- 6. signals at any moment of a write ---------------------------------------------------------------------------

def _wait_for_numpy(pid: int, timeout: float = 60.0) -> None:
    """Until the child has loaded NumPy: past the interpreter's own start-up, inside this project's code (a signal
    earlier than that meets CPython's start-up, which no program can handle)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text():
                return
        except OSError:
            return
        time.sleep(0.01)


@pytest.mark.parametrize("signum, delay", [(2, 0.0), (15, 0.3), (2, 0.8), (15, 1.6)],
                         ids=["int-0s", "term-0.3s", "int-0.8s", "term-1.6s"])
def test_signals_during_convert_leave_no_temp_file_and_no_abort(tmp_path, tiny_file, signum, delay):
    import signal
    import time

    def default_signals():  # a background job starts with SIGINT ignored; a terminal's Ctrl-C is what we test
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    out = tmp_path / "x.pt"
    proc = subprocess.Popen([sys.executable, "-m", "transformer_parity", "convert", str(tiny_file), str(out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)
    _wait_for_numpy(proc.pid)
    time.sleep(delay)  # from NumPy loaded: parsing, reading, importing PyTorch, writing, publishing
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130, -signum), err
    assert "pybind11" not in err and "terminate called" not in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) in (["tiny.safetensors"], ["tiny.safetensors", "x.pt"])
    if out.exists():
        assert formats.load(out).config == TINY


# --- 9. no traceback with exit 1: malformed content is bad input ----------------------------------------------------

def _nn_state():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                 dim_feedforward=32)
    state = {"transformer." + k: v for k, v in model.state_dict().items()}
    state.update({"src_tok_emb.embedding.weight": torch.randn(10, 16), "tgt_tok_emb.embedding.weight":
                  torch.randn(10, 16), "generator.weight": torch.randn(10, 16), "generator.bias": torch.randn(10)})
    return state


@pytest.mark.parametrize("damage", ["missing-key", "1-d-weight"])
def test_malformed_nn_transformer_files(tmp_path, capsys, damage):
    import torch

    state = _nn_state()
    if damage == "missing-key":
        del state["transformer.encoder.layers.0.linear1.weight"]
    else:
        state["transformer.encoder.layers.0.self_attn.in_proj_weight"] = torch.randn(48)
    torch.save(state, tmp_path / "m.pt")
    settings = ["num_heads=2", "activation=relu", "norm_first=false", "layer_norm_eps=1e-5", "scale_embedding=true",
                "pad_id=0"]
    code, _, err = run(["convert", tmp_path / "m.pt", tmp_path / "o.safetensors",
                        *[a for s in settings for a in ("--set", s)]], capsys)
    assert_clean_error(code, err, "m.pt")
    assert not (tmp_path / "o.safetensors").exists()


def test_deeply_nested_json_everywhere(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for args, fragment in ([["bench", "compare", deep, deep], "too deeply"],
                           [["plot", "loss", deep, "-o", tmp_path / "l.png"], "too deeply"],
                           [["init", "--preset", "tiny", "--config", deep, "-o", tmp_path / "x.pt"], "deep.json"]):
        code, _, err = run(args, capsys)
        assert_clean_error(code, err, fragment)


# --- 4 (measured). under a memory limit, no hostile case allocates what it declares -------------------------------

MEMORY_PROBE = r"""
import contextlib, io, json, resource, sys
import torch, h5py  # the frameworks' own address space first
from transformer_parity import cli
def vm_kib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmSize:"))
limit = (vm_kib() + 768 * 1024) * 1024  # what is mapped now + 768 MiB: each hostile file declares GBs or more
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
results = {}
for name, args in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(args)
    results[name] = [code, err.getvalue()]
print(json.dumps(results))
"""


def test_hostile_files_under_a_memory_limit(tmp_path):
    import h5py

    honest = tmp_path / "honest.safetensors"
    formats.save(honest, TINY, seeded_weights(TINY, 0))
    expand = _project_pt(tmp_path / "expand.pt", _expand)
    layers = _project_pt(tmp_path / "layers.pt", _huge_config)
    fill = tmp_path / "fill.weights.h5"
    formats.save(fill, TINY, seeded_weights(TINY, 0))
    with h5py.File(fill, "a") as f:
        del f["layers/embedding/token/vars/0"]
        f.create_dataset("layers/embedding/token/vars/0", shape=(10**6, 10**4), dtype="f4", fillvalue=1.0)
    out = str(tmp_path / "out.safetensors")
    cases = {"honest": ["convert", str(honest), out],
             "expand": ["convert", str(expand), out + "2"], "layers": ["convert", str(layers), out + "2"],
             "fill": ["convert", str(fill), out + "2"],
             "verify-batch": ["verify", "--preset", "tiny", "--batch", "100000000", "--backends", "numpy"],
             "init-vocab": ["init", "--set", "src_vocab_size=1000000000", "-o", out + ".pt"]}
    result = subprocess.run([sys.executable, "-c", MEMORY_PROBE, json.dumps(cases)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome.pop("honest")[0] == 0
    for name, (code, err) in outcome.items():
        assert code == 2 and "MemoryError" not in err and len(err.strip().splitlines()) == 1, (name, err)


def test_a_full_disk_while_writing_pt_is_an_oserror():
    from transformer_parity.formats import torch_file as tc

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with pytest.raises(OSError, match="disk full"):
        tc.save_pt("/dev/full", TINY, seeded_weights(TINY, 0))


def test_a_device_is_refused_before_anything_is_written():
    if not Path("/dev/null").exists():
        pytest.skip("no /dev/null here")
    with pytest.raises(formats.UsageError, match="is a character device; refusing"):
        guards.check_output("/dev/null", force=True)  # only stats the path


def test_ctrl_c_inside_a_subcommand_modules_import_is_an_interrupt_not_a_broken_plug_in(monkeypatch, tmp_path,
                                                                                          capsys):
    """NumPy turns a Ctrl-C that lands inside its C extensions' import into an ImportError. Once the interrupt is
    seen, a subcommand module failing to import is that interrupt (exit 130, "interrupted"), not a plug-in to warn
    about and leave out (which made the command itself an "invalid choice", exit 2)."""
    import importlib

    real = importlib.import_module

    def interrupted_import(name, *args, **kwargs):
        if name == "transformer_parity.cli.convert":
            cli._SIGINT_SEEN.append(True)  # what the handler records before NumPy reports an ImportError
            raise ImportError("PyCapsule_Import could not import module \"datetime\"")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(cli, "_SIGINT_SEEN", [])
    monkeypatch.setattr(importlib, "import_module", interrupted_import)
    assert cli.main(["convert", "--preset", "tiny", str(tmp_path / "m.safetensors")]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "transformer-parity: interrupted", err


def test_an_interrupt_while_the_console_script_loads_the_cli_waits_for_the_import(tmp_path):
    """The console script's entry point is `console.main`, which holds SIGINT while it imports the CLI: a Ctrl-C that
    lands inside that import is delivered after it, whole (exit 130, one line), never inside a C extension's import.
    Here the interrupt is sent as the import of `transformer_parity.cli` starts; the module is complete afterwards."""
    import importlib.metadata

    (entry,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "transformer-parity"]
    assert entry.value == "transformer_parity.console:main"
    code = """
import importlib.abc, os, signal, sys
class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "transformer_parity.cli":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["transformer-parity", "--help"]
from transformer_parity.console import main
code = main()
print(hasattr(sys.modules.get("transformer_parity.cli"), "main"))
sys.exit(code)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 130 and proc.stderr == "transformer-parity: interrupted\n", proc.stderr
    assert proc.stdout.strip() == "True"  # held: the CLI loaded whole before the interrupt arrived

