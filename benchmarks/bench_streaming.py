"""Streaming conversion of Llama-shaped bfloat16 checkpoints, beside the libraries and the disk.

    python benchmarks/bench_streaming.py --size 1b --rounds 3   # ~1.2 B parameters, 2.5 GB of bfloat16
    python benchmarks/bench_streaming.py --size 8b --skip-libraries
    python benchmarks/bench_streaming.py --size tiny        # seconds; what the test runs
    python benchmarks/bench_streaming.py --size moe --skip-libraries   # a Mixtral-shaped mixture of experts, 1.6 GB

A synthetic Hugging Face directory (`LlamaForCausalLM`, bfloat16, sharded at 5 GB as `save_pretrained` shards it)
is generated on demand under --dir and removed after. In the same run, each row is timed in a fresh process with its
peak resident set size from the kernel's accounting for that one child (`os.wait4`):

- `cp -r` of the directory (the disk's speed);
- `transformer-parity convert` to a canonical `.safetensors`, to a Keras `.weights.h5` and to a KerasHub Llama
  preset (bfloat16 kept in each, as Keras and KerasHub store it), and each of those back to a Hugging Face directory;
- `transformer-parity verify --stream on` of the directory: the float64 judge, the float32 floor, PyTorch and Keras
  one block at a time (`docs/verify.md`), its verdict recorded beside the figures;
- transformers `from_pretrained` + `save_pretrained` (`--skip-libraries` leaves it out);
- KerasHub `LlamaBackbone.from_preset` + `save_weights` in bfloat16, where it fits in memory, on the preset the
  convert row wrote (outside that library's timed row): `from_preset` on a Hugging Face directory imports every
  KerasHub converter, one of which needs `sentencepiece`, so the preset is KerasHub's own format instead.

The weights are a fixed random block of bfloat16 values tiled over each tensor: the conversion's work and I/O do
not depend on the values, and generating 8 B random normals would dominate the run.

Every row starts with its input in the same state as `cp -r`'s: by default in the page cache (its files read
through once, untimed), with `--cold` out of it (synced, then `posix_fadvise(DONTNEED)` on each file, untimed), so
that every row reads it from the disk and `cp -r` is the disk's speed. (Left as the row before left it, a row would
read from the disk an input that `convert` had written, since `convert` drops what it writes from the page cache
once it is on the disk, while `cp -r` read its source from memory.)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# Llama-3.2-1B and Llama-3.1-8B shapes (tied and untied heads), a 1.5 GB one (774 M parameters: what a default
# verify's memory mode is measured on, docs/verify.md) and a tiny one for the test.
SIZES = {
    "1.5gb": dict(hidden_size=1536, intermediate_size=6144, num_hidden_layers=18, num_attention_heads=24,
                  num_key_value_heads=8, vocab_size=49152, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
    # a mixture of experts (`MixtralForCausalLM`, experts saved one by one as transformers saves them): Mixtral's
    # proportions at a quarter of its width, 8 experts in each of 8 layers; the experts are 88% of the bytes
    "moe": dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=8, num_attention_heads=16,
                num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False, num_local_experts=8,
                num_experts_per_tok=2),
}
PACKAGES = ("reference_numpy", "transformer_parity", "torch_impl", "tf_impl")
TARGET_RSS_X, TARGET_TIME_X = 0.25, 2.0  # the targets: peak RSS <= 0.25x the checkpoint, wall <= 2x cp -r


def shapes(hf: dict) -> dict[str, tuple[int, ...]]:
    """The tensors `LlamaForCausalLM` (or, with experts, `MixtralForCausalLM`) saves, in its order."""
    d, f, v = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    kv = d // hf["num_attention_heads"] * hf["num_key_value_heads"]
    out = {"model.embed_tokens.weight": (v, d)}
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
                    p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
                    p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f), p + "input_layernorm.weight": (d,),
                    p + "post_attention_layernorm.weight": (d,)})
        if "num_local_experts" in hf:  # the feed-forward is a router and its experts
            for name in ("gate_proj", "up_proj", "down_proj"):
                del out[p + f"mlp.{name}.weight"]
            out[p + "block_sparse_moe.gate.weight"] = (hf["num_local_experts"], d)
            for e in range(hf["num_local_experts"]):
                q = p + f"block_sparse_moe.experts.{e}."
                out.update({q + "w1.weight": (f, d), q + "w3.weight": (f, d), q + "w2.weight": (d, f)})
    out["model.norm.weight"] = (d,)
    if not hf["tie_word_embeddings"]:
        out["lm_head.weight"] = (v, d)
    return out


def family(size: str) -> tuple[str, str, str]:
    """(transformers class, model_type, our KerasHub format) of a size's checkpoint."""
    if "num_local_experts" in SIZES[size]:
        return "MixtralForCausalLM", "mixtral", "kerashub-mixtral"
    return "LlamaForCausalLM", "llama", "kerashub-llama"


def parameters(size: str) -> int:
    hf = SIZES[size]
    return sum(int(np.prod(s)) for s in shapes(hf).values())


def generate(path: Path, size: str) -> int:
    """Write the synthetic directory; returns its weight bytes."""
    sys.path.insert(0, str(REPO))
    from transformer_parity.streaming.lazy import LazyArray
    from transformer_parity.io.safetensors_io import bfloat16
    from transformer_parity.layouts.hf_dir import write_dir

    arch, model_type, _ = family(size)
    hf = dict(SIZES[size], architectures=[arch], model_type=model_type, rms_norm_eps=1e-5,
              rope_theta=500000.0, max_position_embeddings=8192, hidden_act="silu", dtype="bfloat16",
              bos_token_id=1, eos_token_id=2)
    block = (np.random.default_rng(0).standard_normal(1 << 20) * 0.02).astype(bfloat16())
    state = {name: LazyArray(shape, block.dtype, functools.partial(np.resize, block, shape))
             for name, shape in shapes(hf).items()}  # each made when written: generating 16 GB holds one tensor
    total = sum(int(np.prod(s)) * 2 for s in shapes(hf).values())
    write_dir(path, hf, state, force=False, consume=True)
    return total


def run(cmd: list[str], env_extra: dict | None = None) -> tuple[float, int, float]:
    """(wall seconds, peak RSS bytes, CPU seconds: user + system) of `cmd` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3", **(env_extra or {}))
    start = time.perf_counter()
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    stderr = process.stderr.read().decode()
    process.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed: {stderr.strip()[-400:]}")
    return seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


TRANSFORMERS = """import sys, torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
m.save_pretrained(sys.argv[2])"""
KERAS_HUB = """import os, sys
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import keras_hub
m = keras_hub.models.LlamaBackbone.from_preset(sys.argv[1], dtype="bfloat16")
m.save_weights(sys.argv[2])"""


def _files(path: Path) -> list[Path]:
    """`path` itself if it is a file, else every file under it."""
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def evict(path: Path) -> None:
    """`path`'s files (a file, or a directory's) written to the disk and dropped from the page cache."""
    os.sync()
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(path: Path) -> None:
    """`path`'s files (a file, or a directory's) read through once, into the page cache."""
    buffer = bytearray(8 << 20)  # one small buffer: a child forked from this process starts with its memory
    for file in _files(path):
        with open(file, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def measure(size: str, workdir: Path, libraries: bool = True, kerashub: bool = True, rounds: int = 1,
            cold: bool = False) -> dict:
    """Every row timed in a fresh process; the disk's and our rows `rounds` times, interleaved round by round (the
    median wall time is reported, with every round's, and the largest peak RSS), the verify and library rows once."""
    import statistics

    from transformer_parity.io.limits import available_bytes

    cli = [sys.executable, "-m", "transformer_parity"]
    src = workdir / "src"
    start = time.perf_counter()  # generated in a child: this process stays small, and its children start small
    subprocess.run([sys.executable, __file__, "--generate", str(src), "--size", size], check=True)
    nbytes = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    result = {"size": size, "checkpoint_bytes": nbytes, "parameters": parameters(size), "rounds": rounds,
              "cold": cold,
              "generate_s": round(time.perf_counter() - start, 1), "rows": []}
    timings: dict[str, list[tuple[float, int, float]]] = {}
    # Python's bytecode compiled first, as an install leaves it: otherwise, where PYTHONDONTWRITEBYTECODE is set,
    # every row would compile the modules it imports (0.2 s of a 2.5 s conversion, measured).
    subprocess.run([sys.executable, "-m", "compileall", "-q", *(str(REPO / d) for d in PACKAGES)], check=True,
                   stdout=subprocess.DEVNULL)
    result["transpose"] = _transpose_isa()

    def row(name, cmd, out, env=None, optional=False, source=src):
        (evict if cold else warm)(source)
        try:
            seconds, rss, cpu = run(cmd, env)
        except RuntimeError as exc:  # a library row that cannot run here is reported, not fatal
            if not optional:
                raise
            result["rows"].append({"step": name, "skipped": str(exc).splitlines()[-1][:200]})
            return
        if name not in timings:
            result["rows"].append({"step": name})
        timings.setdefault(name, []).append((seconds, rss, cpu))
        if out is not None:
            (shutil.rmtree if out.is_dir() else os.remove)(out)

    canon, keras, preset = workdir / "model.safetensors", workdir / "m.weights.h5", workdir / "preset"
    kerashub_format = family(size)[2]
    # KerasHub's own row (LlamaBackbone) reads the preset
    keep_preset = kerashub and kerashub_format == "kerashub-llama" and 3 * nbytes < available_bytes()
    for n in range(rounds):
        row("cp -r", ["cp", "-r", str(src), str(workdir / "copy")], workdir / "copy")
        row("cp -r + sync (written to disk, as convert's atomic output is)",
            ["sh", "-c", f"cp -r '{src}' '{workdir / 'copy'}' && sync"], workdir / "copy")
        row("convert -> canonical .safetensors", [*cli, "convert", str(src), str(canon), "-q"], None)
        row("export canonical -> HF directory", [*cli, "convert", str(canon), str(workdir / "hf"), "--to", "hf", "-q"],
            workdir / "hf", source=canon)
        os.remove(canon)
        row("convert -> Keras .weights.h5 (bfloat16)", [*cli, "convert", str(src), str(keras), "-q"], None)
        row("convert Keras .weights.h5 -> HF directory",
            [*cli, "convert", str(keras), str(workdir / "hf"), "--to", "hf", "-q"], workdir / "hf", source=keras)
        os.remove(keras)
        row("convert -> KerasHub preset (bfloat16)",
            [*cli, "convert", str(src), str(preset), "--to", kerashub_format, "-q"], None)
        row("convert KerasHub preset -> HF directory",
            [*cli, "convert", str(preset), str(workdir / "hf"), "--to", "hf", "-q"], workdir / "hf",
            source=preset)
        if not (keep_preset and n == rounds - 1):
            shutil.rmtree(preset)
    report = workdir / "verify.json"
    row("verify (layer-streamed: numpy f64 and f32, torch, keras)",
        [*cli, "verify", str(src), "--stream", "on", "--src-len", "16", "-q", "--json", str(report)], None)
    result["verify"] = {k: json.loads(report.read_text())[k] for k in ("mode", "passed", "verdict", "seconds")}
    os.remove(report)
    if libraries:
        row("transformers from_pretrained + save_pretrained",
            [sys.executable, "-c", TRANSFORMERS, str(src), str(workdir / "tf-out")], workdir / "tf-out", optional=True)
    if keep_preset:  # the model in bfloat16, and TensorFlow's own copies
        row("KerasHub LlamaBackbone.from_preset + save_weights (bfloat16)",
            [sys.executable, "-c", KERAS_HUB, str(preset), str(workdir / "kh.weights.h5")], workdir / "kh.weights.h5",
            optional=True, source=preset)
        shutil.rmtree(preset)
    shutil.rmtree(src)
    for r in result["rows"]:
        if r["step"] in timings:
            seconds = [t for t, _, _ in timings[r["step"]]]
            rss = max(m for _, m, _ in timings[r["step"]])
            cpu = [c for _, _, c in timings[r["step"]]]
            r.update(seconds=round(statistics.median(seconds), 3), seconds_each=[round(t, 3) for t in seconds],
                     cpu_seconds=round(statistics.median(cpu), 3), peak_rss_bytes=rss,
                     rss_x_checkpoint=round(rss / nbytes, 3))
    copy = max(result["rows"][0]["seconds"], 1e-3)
    synced = max(result["rows"][1]["seconds"], 1e-3)
    for r in result["rows"]:
        if "seconds" in r:
            r["time_x_cp"] = round(r["seconds"] / copy, 2)
            r["time_x_cp_sync"] = round(r["seconds"] / synced, 2)
    return result


def table(result: dict) -> str:
    gb = result["checkpoint_bytes"] / 1e9
    lines = [f"{result['size']}: {result['parameters'] / 1e9:.2f} B parameters, {gb:.2f} GB bfloat16"
             + (", every input out of the page cache (--cold)" if result.get("cold") else ", every input in the page cache"),
             f"transposes: {result.get('transpose', 'unknown')}; CPU: user + system seconds, all threads",
             "", "| step | wall (s) | CPU (s) | x cp -r | x cp -r + sync | peak RSS (GB) | x checkpoint |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['step']} | not run: {r['skipped']} | | | | | |")
            continue
        lines.append(f"| {r['step']} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {r['time_x_cp']:.2f} "
                     f"| {r['time_x_cp_sync']:.2f} "
                     f"| {r['peak_rss_bytes'] / 1e9:.2f} | {r['rss_x_checkpoint']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=tuple(SIZES), default="1b")
    parser.add_argument("--dir", help="where to generate the checkpoint (default: a temporary directory)")
    parser.add_argument("--skip-libraries", action="store_true", help="leave out transformers and KerasHub")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the disk's and the conversions' rows this many times, interleaved (median)")
    parser.add_argument("--cold", action="store_true",
                        help="start every row with its input out of the page cache (the module's docstring)")
    parser.add_argument("--generate", metavar="DIR", help=argparse.SUPPRESS)  # the child that writes the checkpoint
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.generate:
        generate(Path(args.generate), args.size)
        return 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = measure(args.size, Path(tmp), libraries=not args.skip_libraries,
                         kerashub=not args.skip_libraries, rounds=args.rounds, cold=args.cold)
    result["cpu"] = _cpu()
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _transpose_isa() -> str:
    """The vector instructions the compiled transpose uses here, or why it does not run."""
    sys.path.insert(0, str(REPO))
    from transformer_parity.streaming import transpose

    return "numpy (no compiled transpose)" if transpose._tiles is None else transpose._tiles.ISA


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
