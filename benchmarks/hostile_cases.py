"""Every hostile case of the first adversarial round, run through the CLI in a fresh process: its exit status, its one line on stderr,
and its peak memory (max RSS) next to the same command's honest counterpart.

    nice -n 19 python -m benchmarks.hostile_cases --json benchmarks/results/hardening/hostile_cases.json

The files are built here, small (the tiny preset), as the tests build them (parity_tests/test_hostile.py). A program
that reports, not a test; docs/hardening.md quotes its table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


# The child reports its own peak RSS on exit (atexit runs after the CLI's sys.exit): VmHWM, which starts afresh at
# exec (ru_maxrss would carry this parent's peak over through fork and exec).
PROBE = ("import atexit, runpy, sys; atexit.register(lambda: print('MAXRSS_KB', next(int(l.split()[1]) for l in "
         "open('/proc/self/status') if l.startswith('VmHWM:')), file=sys.stderr)); "
         "sys.argv = ['transformer-parity', *sys.argv[1:]]; runpy.run_module('transformer_parity', run_name='__main__')")


def run_command(args: list[str], cwd: Path) -> dict:
    """Exit status, last stderr line and max RSS (MiB) of `transformer-parity ARGS` in a fresh process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"})
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    rss = [int(line.split()[1]) for line in lines if line.startswith("MAXRSS_KB ")]
    lines = [line for line in lines if not line.startswith("MAXRSS_KB ")]
    return {"exit": proc.returncode, "stderr": lines[-1] if lines else "", "stderr_lines": len(lines),
            "max_rss_mb": round(rss[-1] / 1024, 1) if rss else None, "seconds": round(time.perf_counter() - start, 1)}


def build(work: Path) -> dict[str, tuple[list[str], str | None, str]]:
    """{case: (command, honest case or None, issue item)}; the files are written into `work`."""
    import h5py
    import torch

    import reference_numpy as rn
    from transformer_parity import formats
    from transformer_parity.verify import seeded_weights

    tiny = rn.TransformerConfig.preset("tiny", dropout=0.0)
    w = lambda: seeded_weights(tiny, 0)  # noqa: E731
    formats.save(work / "ok.safetensors", tiny, w())
    formats.save(work / "ok.pt", tiny, w())
    formats.save(work / "ok.weights.h5", tiny, w())
    (work / "secret.bin").write_bytes(b"SECRET!!" * 64)
    with h5py.File(work / "other.h5", "w") as f:
        f["x"] = np.arange(tiny.tgt_vocab_size, dtype="f4")
    bias = "layers/output_projection/vars/1"

    def h5(name, make):
        path = work / f"{name}.weights.h5"
        formats.save(path, tiny, w())
        with h5py.File(path, "a") as f:
            shape = f[bias].shape
            del f[bias]
            make(f, shape)
        return str(path)

    def vds(f, shape):
        layout = h5py.VirtualLayout(shape=shape, dtype="<f4")
        layout[:] = h5py.VirtualSource(str(work / "other.h5"), "x", shape=shape)
        f.create_virtual_dataset(bias, layout)

    def fill(f, shape):
        del f["layers/embedding/token/vars/0"]
        f.create_dataset("layers/embedding/token/vars/0", shape=(10**6, 10**4), dtype="f4", fillvalue=1.0)
        f.create_dataset(bias, data=np.zeros(shape, "f4"))

    def gzip(f, shape):
        del f["layers/embedding/token/vars/0"]
        f.create_dataset("layers/embedding/token/vars/0", data=np.zeros((20000, 10000), "f4"), compression="gzip",
                         chunks=(1000, 10000))
        f.create_dataset(bias, data=np.zeros(shape, "f4"))

    def pt(name, mutate):
        obj = torch.load(work / "ok.pt", weights_only=True)
        mutate(obj)
        torch.save(obj, work / f"{name}.pt")
        return str(work / f"{name}.pt")

    def expand(obj):
        obj["state_dict"]["output.bias"] = torch.zeros(1).expand(3 * 10**9)

    def sparse(obj):
        obj["state_dict"]["output.bias"] = torch.zeros(tiny.tgt_vocab_size).to_sparse()

    def layers_pt(obj):
        obj["config"] = tiny.replace(num_encoder_layers=10**9).to_json()

    from safetensors.numpy import load_file, save_file

    save_file(load_file(work / "ok.safetensors"), work / "layers.safetensors",
              metadata={"format": "transformer-parity/canonical", "format_version": "1",
                        "config": tiny.replace(num_encoder_layers=10**9).to_json()})
    raw = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (work / "deep.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    (work / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    plain = work / "plain.pt"
    torch.save({"state_dict": {"src_embed.token.weight": torch.zeros(50_000_000)}}, plain)
    import zipfile

    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(work / "deflate.pt", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    plain.unlink()
    crc = bytearray((work / "ok.pt").read_bytes())
    with zipfile.ZipFile(work / "ok.pt") as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    start = info.header_offset + 30 + int.from_bytes(crc[info.header_offset + 26:info.header_offset + 28], "little") \
        + int.from_bytes(crc[info.header_offset + 28:info.header_offset + 30], "little")
    for i in range(64):
        crc[start + (i * 7) % info.file_size] ^= 0xFF
    (work / "crc.pt").write_bytes(bytes(crc))
    weights = seeded_weights(tiny, 0, np.float64)
    weights["encoder.layers.0.ffn.linear1.bias"] = weights["encoder.layers.0.ffn.linear1.bias"].copy()
    weights["encoder.layers.0.ffn.linear1.bias"][0] = 1e39
    formats.save(work / "ref.safetensors", tiny, weights)
    port = {k: v.copy() for k, v in weights.items()}
    port["output.bias"] = port["output.bias"] + 100
    formats.save(work / "port.pt", tiny, port)
    weights["encoder.layers.0.ffn.linear1.bias"][0] = np.nan
    formats.save(work / "nan.safetensors", tiny, weights)
    os.mkfifo(work / "fifo.pt")
    (work / "link.pt").symlink_to(work / "ok.pt")
    task = rn.TaskSpec().model_config(d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32)
    formats.save(work / "task.safetensors", task, seeded_weights(task, 0))
    save_file(load_file(work / "task.safetensors"), work / "task-layers.safetensors",
              metadata={"format": "transformer-parity/canonical", "format_version": "1",
                        "config": task.replace(num_encoder_layers=10**9).to_json()})
    out = str(work / "never.safetensors")  # hostile conversions must not write it
    ok = str(work / "ok.safetensors")
    return {
        "convert .weights.h5 (honest)": (["convert", str(work / "ok.weights.h5"), str(work / "h.safetensors")], None,
                                         ""),
        "h5: external storage": (["convert", h5("external", lambda f, s: f.create_dataset(
            bias, shape=s, dtype="<f4", external=[(str(work / "secret.bin"), 0, 4 * s[0])])), out],
            "convert .weights.h5 (honest)", "1"),
        "h5: virtual dataset": (["convert", h5("virtual", vds), out], "convert .weights.h5 (honest)", "1"),
        "h5: external link": (["convert", h5("extlink", lambda f, s: f.__setitem__(
            bias, h5py.ExternalLink(str(work / "other.h5"), "x"))), out], "convert .weights.h5 (honest)", "1"),
        "h5: soft link": (["convert", h5("softlink", lambda f, s: f.__setitem__(
            bias, h5py.SoftLink("/layers/output_projection/vars/0"))), out], "convert .weights.h5 (honest)", "1"),
        "h5: fill value (10^6 x 10^4 declared)": (["convert", h5("fill", fill), out], "convert .weights.h5 (honest)",
                                                  "4"),
        "h5: gzip bomb (800 MB in ~1 MB)": (["convert", h5("gzip", gzip), out], "convert .weights.h5 (honest)", "4"),
        "h5: string dataset": (["convert", h5("string", lambda f, s: f.create_dataset(
            bias, data=np.array(["x"] * s[0], dtype="S8"))), out], "convert .weights.h5 (honest)", "9"),
        "verify (honest, float64)": (["verify", ok, str(work / "ok.pt"), "--dtype", "float64"], None, ""),
        "verify: 1e39 weight, port +100": (["verify", str(work / "ref.safetensors"), str(work / "port.pt"),
                                            "--dtype", "float64"], "verify (honest, float64)", "2"),
        "verify --outputs-only: 1e39 weight, port +100": (
            ["verify", str(work / "ref.safetensors"), str(work / "port.pt"), "--dtype", "float64", "--outputs-only"],
            "verify (honest, float64)", "2"),
        "verify: a NaN weight, --json -": (["verify", str(work / "nan.safetensors"), "--backends", "torch",
                                            "--json", str(work / "nan.json")], "verify (honest, float64)", "2"),
        "convert onto a FIFO --force": (["convert", ok, str(work / "fifo.pt"), "--force"], None, "3"),
        "convert onto a symlink --force": (["convert", ok, str(work / "link.pt"), "--force"], None, "3"),
        "convert .safetensors (honest)": (["convert", ok, str(work / "o2.pt"), "--force"], None, ""),
        "convert .pt (honest)": (["convert", str(work / "ok.pt"), str(work / "h2.safetensors")], None, ""),
        "safetensors: num_encoder_layers=10^9": (["convert", str(work / "layers.safetensors"), str(work / "o3.pt")],
                                                 "convert .safetensors (honest)", "4"),
        "verify: num_encoder_layers=10^9": (["verify", str(work / "layers.safetensors")], "verify (honest, float64)",
                                            "4"),
        "generate: num_encoder_layers=10^9": (["generate", str(work / "task-layers.safetensors"), "--framework",
                                               "numpy"], None, "4"),
        "train --init: num_encoder_layers=10^9": (["train", "--framework", "torch", "--out", str(work / "ft"),
                                                   "--init", str(work / "task-layers.safetensors")], None, "4"),
        ".pt: num_encoder_layers=10^9": (["convert", pt("layers", layers_pt), out], "convert .pt (honest)", "4"),
        ".pt: zero-stride expand() to 3e9": (["convert", pt("expand", expand), out], "convert .pt (honest)", "4"),
        ".pt: deflate bomb (200 MB in ~0.2 MB)": (["convert", str(work / "deflate.pt"), out, "--set", "d_model=8"],
                                                  "convert .pt (honest)", "4"),
        ".pt: 64 flipped bytes": (["convert", str(work / "crc.pt"), out], "convert .pt (honest)", "5"),
        ".pt: sparse tensor": (["convert", pt("sparse", sparse), out], "convert .pt (honest)", "9"),
        "safetensors: deeply nested header": (["convert", str(work / "deep.safetensors"), str(work / "o4.pt")],
                                              "convert .safetensors (honest)", "9"),
        "bench compare: deeply nested JSON": (["bench", "compare", str(work / "deep.json"), str(work / "deep.json")],
                                              None, "9"),
        "plot loss: deeply nested log.json": (["plot", "loss", str(work / "deep.json"), "-o", str(work / "l.png")],
                                              None, "9"),
        "init --set src_vocab_size=10^9": (["init", "--set", "src_vocab_size=1000000000", "-o", str(work / "i.pt")],
                                           None, "4"),
        "verify --set max_len=10^12": (["verify", "--preset", "tiny", "--set", "max_len=1000000000000"], None, "9"),
        "verify --batch 10^9": (["verify", "--preset", "tiny", "--batch", "1000000000"], None, "4"),
        "train --batch-size 10^9": (["train", "--framework", "torch", "--out", str(work / "r1"), "--batch-size",
                                     "1000000000"], None, "4"),
        "train --eval-size 10^9": (["train", "--framework", "torch", "--out", str(work / "r2"), "--eval-size",
                                    "1000000000"], None, "4"),
        "train --num-symbols 10^9": (["train", "--framework", "torch", "--out", str(work / "r3"), "--num-symbols",
                                      "1000000000"], None, "4"),
        "generate --examples 10^12": (["generate", str(work / "task.safetensors"), "--framework", "numpy",
                                       "--examples", "1000000000000"], None, "4"),
        "bench --seq 1000000": (["bench", "--seq", "1000000", "--impl", "numpy", "--peak-size", "256"], None, "4"),
        "bench --seq 65536": (["bench", "--seq", "65536", "--impl", "numpy", "--peak-size", "256"], None, "4"),
        "bench --threads 100000": (["bench", "--threads", "100000"], None, "4"),
        "verify --backends ,": (["verify", "--preset", "tiny", "--backends", ","], None, "10"),
        "init --set layer_norm_eps=inf": (["init", "--preset", "tiny", "--set", "layer_norm_eps=inf", "-o",
                                           str(work / "e.pt")], None, "10"),
        "verify -q (after the subcommand)": (["verify", "-q", "--preset", "tiny", "--backends", "numpy"], None, "10"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        work = Path(tmp)
        cases = build(work)
        results = {}
        for name, (command, honest, item) in cases.items():
            results[name] = {"item": item, "command": " ".join(a.replace(tmp, "$TMP") for a in command),
                             **run_command(command, work), "honest": honest}
            results[name]["stderr"] = results[name]["stderr"].replace(tmp, "$TMP")
            print(f"{name}: exit {results[name]['exit']}, {results[name]['max_rss_mb']} MiB, "
                  f"{results[name]['stderr'][:150]}", file=sys.stderr, flush=True)
        results["(no hostile conversion wrote its output)"] = {"item": "", "exit": int((work / "never.safetensors")
                                                                                      .exists()), "honest": None}
    for name, row in results.items():
        if row["honest"]:
            row["rss_vs_honest"] = round(row["max_rss_mb"] / results[row["honest"]]["max_rss_mb"], 2)
    text = json.dumps(results, indent=1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
