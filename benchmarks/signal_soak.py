"""Signal soak: interrupt `convert` and `train` at random moments and count what is left behind.

    nice -n 19 python -m benchmarks.signal_soak --converts 100 --trains 50 --json benchmarks/results/hardening/signal_soak.json

- **convert**: `transformer-parity init` writes the base checkpoint once; each trial starts `convert base.safetensors
  x.pt` and sends SIGINT or SIGTERM (alternating) at a uniformly random moment within the measured length of an
  uninterrupted conversion. Counted: temporary files left, outputs that exist but differ from the uninterrupted
  one (a partial file), exit statuses, and abort traces (`pybind11`, `terminate called`, `Traceback`, a core dump).
- **train**: a tiny reversal run with `--checkpoint-every 1`; each trial starts it, sends SIGINT or SIGTERM at a
  random moment between its first checkpoint and the end of an uninterrupted run's length, then resumes (`--resume`; a fresh start where no checkpoint was saved yet) until it finishes.
  Counted: temporary files left after the interruption, unresumable runs, and whether the finished run's checkpoint
  and Adam state are bit-identical to an uninterrupted run's.

A program that reports, not a test: it runs for many minutes of CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "transformer_parity"]
ABORT_MARKERS = ("pybind11", "terminate called", "core dumped", "Aborted")
STEPS = 40
TRAIN = ["--framework", "torch", "--steps", str(STEPS), "--warmup", "2", "--batch-size", "16", "--eval-every", "10",
         "--checkpoint-every", "1", "--eval-size", "32", "--d-model", "32", "--heads", "2", "--layers", "1",
         "--d-ff", "64", "--num-symbols", "6", "--max-len", "8", "--threads", "1", "-q"]


def _weights_digest(path: Path) -> str:
    """SHA-256 over a checkpoint's config and canonical weights (name, dtype, shape, bytes), read as the CLI reads it."""
    from transformer_parity import formats

    loaded = formats.load(path)
    h = hashlib.sha256(loaded.config.to_json().encode())
    for name in sorted(loaded.weights):
        value = loaded.weights[name]
        h.update(f"{name} {value.dtype} {value.shape}".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def _temps(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if "tmp" in p.name)


def _default_signals() -> None:
    """In the child: SIGINT as a terminal would deliver it (a shell's background job starts with it ignored, and an
    ignored signal stays ignored through exec, so Ctrl-C would never reach the CLI)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(args: list[str], cwd: Path, kill_after: float | None = None, signum: int = signal.SIGINT,
         after_file: Path | None = None) -> tuple[int, str, float, bool]:
    """(exit status, stderr, seconds, whether the signal was sent: False if the command ended first). With
    `after_file`, `kill_after` counts from the moment that file appears."""
    start = time.perf_counter()
    proc = subprocess.Popen(CLI + args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=_default_signals)
    sent = False
    if after_file is not None:
        while proc.poll() is None and not after_file.exists():
            time.sleep(0.005)
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signum)
            sent = True
    _, err = proc.communicate()
    return proc.returncode, err, time.perf_counter() - start, sent


def _trace(err: str) -> str | None:
    """'abort' (a C++ abort, a core dump), 'traceback' (a Python traceback through this project's code or a
    framework's), 'start-up' (a traceback from the interpreter's own start-up or the standard library's imports,
    before any of this project's code runs), or None."""
    if any(marker in err for marker in ABORT_MARKERS):
        return "abort"
    if "Traceback" in err or "Fatal Python error" in err:
        ours = any(name in err for name in ("transformer_parity/", "torch_impl/", "tf_impl/", "reference_numpy/",
                                            "site-packages/torch", "benchmarks/"))
        only_entry = "transformer_parity/__main__.py" in err and err.count('File "/') == 1
        return "traceback" if ours and not only_entry else "start-up"
    return None


def soak_convert(work: Path, trials: int, rng: random.Random, say) -> dict:
    base = work / "base.safetensors"
    code, err, *_ = _run(["init", "-o", str(base), "-q"], work)
    assert code == 0, err
    durations = []
    for name in ("reference.pt", "reference2.pt"):
        code, err, seconds, _ = _run(["convert", str(base), str(work / name), "-q"], work)
        assert code == 0, err
        durations.append(seconds)
    expected = _weights_digest(work / "reference.pt")  # torch.save names the archive's folder after the file, so
    (work / "reference2.pt").unlink()                   # equal conversions need not be equal bytes
    full = min(durations)
    say(f"convert: an uninterrupted conversion takes {full:.1f} s (the faster of two; signals land in [0, that])")
    counts = {"trials": trials, "uninterrupted_seconds": round(full, 2), "signals_sent": 0, "exit_codes": {},
              "temp_files_left": 0, "partial_outputs": 0, "complete_outputs": 0, "abort_traces": 0, "tracebacks": 0,
              "startup_tracebacks": 0, "examples": []}
    for i in range(trials):
        out = work / "x.pt"
        signum = (signal.SIGINT, signal.SIGTERM)[i % 2]
        delay = rng.uniform(0, full)
        code, err, seconds, sent = _run(["convert", str(base), str(out), "-q"], work, delay, signum)
        counts["signals_sent"] += sent
        if not sent:  # it finished first: the machine is faster now; aim the next ones earlier
            full = min(full, seconds)
        counts["exit_codes"][str(code)] = counts["exit_codes"].get(str(code), 0) + 1
        temps = _temps(work)
        counts["temp_files_left"] += len(temps)
        if out.exists():  # published: it must be the whole conversion
            if _weights_digest(out) == expected:
                counts["complete_outputs"] += 1
            else:
                counts["partial_outputs"] += 1
            out.unlink()
        kind = _trace(err)
        if kind is not None:
            counts[{"abort": "abort_traces", "traceback": "tracebacks", "start-up": "startup_tracebacks"}[kind]] += 1
            counts["examples"].append({"signal": signum, "delay": round(delay, 2), "kind": kind,
                                       "stderr": err[-500:]})
        for t in temps:
            Path(work, t).unlink(missing_ok=True)
        say(f"convert {i + 1}/{trials}: {signal.Signals(signum).name} at {delay:.2f} s -> exit {code}"
            + (f", temp files {temps}" if temps else ""))
    return counts


def _digest(path: Path) -> str:
    """SHA-256 over a safetensors file's tensors (name, dtype, shape, bytes) and metadata, in sorted order: the
    library writes metadata in hash-map order, so equal files need not be equal bytes (and the state's
    `checkpoint_sha256`, a digest of such bytes, is left out)."""
    from safetensors import safe_open

    h = hashlib.sha256()
    with safe_open(str(path), "np") as f:
        metadata = {k: v for k, v in (f.metadata() or {}).items() if k != "checkpoint_sha256"}
        h.update(json.dumps(metadata, sort_keys=True).encode())
        for name in sorted(f.keys()):
            value = f.get_tensor(name)
            h.update(f"{name} {value.dtype} {value.shape}".encode())
            h.update(value.tobytes())
    return h.hexdigest()


def _final(run: Path) -> tuple[str, str]:
    manifest = json.loads((run / "run.json").read_text())
    save = run / manifest["save"]
    return _digest(save / "checkpoint.safetensors"), _digest(save / "train_state.safetensors")


def _first_save_time(args: list[str], cwd: Path, run: Path) -> tuple[float, float]:
    """(seconds until the first checkpoint is published, seconds of the whole run) of an uninterrupted run."""
    start = time.perf_counter()
    proc = subprocess.Popen(CLI + args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=_default_signals)
    first = None
    while proc.poll() is None:
        if first is None and (run / "run.json").exists():
            first = time.perf_counter() - start
        time.sleep(0.01)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    return first or 0.0, time.perf_counter() - start


def soak_train(work: Path, trials: int, rng: random.Random, say) -> dict:
    straight = work / "straight"
    first, full = _first_save_time(["train", "--out", str(straight), *TRAIN], work, straight)
    expected = _final(straight)
    window = full - first  # signals land while it trains and saves: timed from its first checkpoint
    say(f"train: an uninterrupted run takes {full:.1f} s, its first checkpoint appears at {first:.1f} s; signals "
        f"are sent 0 to {window:.1f} s after the first checkpoint appears")
    counts = {"trials": trials, "uninterrupted_seconds": round(full, 2), "first_checkpoint_seconds": round(first, 2),
              "signal_window_after_first_checkpoint_seconds": round(window, 2), "signals_sent": 0, "exit_codes": {},
              "temp_files_left": 0,
              "unresumable": 0, "bit_identical": 0, "different": 0, "abort_traces": 0, "tracebacks": 0,
              "startup_tracebacks": 0, "resumes": 0,
              "complete_when_signalled": 0,
              "examples": []}
    for i in range(trials):
        run = work / f"run{i}"
        signum = (signal.SIGINT, signal.SIGTERM)[i % 2]
        delay = rng.uniform(0, window)
        code, err, seconds, sent = _run(["train", "--out", str(run), *TRAIN], work, delay, signum,
                                        after_file=run / "run.json")
        counts["signals_sent"] += sent
        counts["exit_codes"][str(code)] = counts["exit_codes"].get(str(code), 0) + 1
        temps = _temps(run) if run.exists() else []
        counts["temp_files_left"] += len(temps)
        kind = _trace(err)
        if kind is not None:
            counts[{"abort": "abort_traces", "traceback": "tracebacks", "start-up": "startup_tracebacks"}[kind]] += 1
            counts["examples"].append({"signal": signum, "delay": round(delay, 2), "kind": kind,
                                       "stderr": err[-500:]})
        manifest = run / "run.json"
        if code != 0 and manifest.exists() and json.loads(manifest.read_text())["step"] == STEPS:
            counts["complete_when_signalled"] += 1  # the signal came after the last save: nothing to resume
            code = 0
        if code != 0:
            if manifest.exists():
                counts["resumes"] += 1
                code, err, *_ = _run(["train", "--out", str(run), *TRAIN, "--resume"], work)
            else:  # interrupted before its first checkpoint: nothing to resume, start again
                code, err, *_ = _run(["train", "--out", str(run), *TRAIN, "--force"], work)
            if code != 0:
                counts["unresumable"] += 1
                counts["examples"].append({"signal": signum, "delay": round(delay, 2), "resume_stderr": err[-500:]})
        if code == 0:
            same = _final(run) == expected
            counts["bit_identical" if same else "different"] += 1
        say(f"train {i + 1}/{trials}: {signal.Signals(signum).name} {delay:.2f} s after the first checkpoint -> "
            f"{'finished' if code == 0 else 'FAILED'}" + (f", temp files {temps}" if temps else ""))
        shutil.rmtree(run, ignore_errors=True)
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--converts", type=int, default=100)
    parser.add_argument("--trains", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="write the counts as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="signal-soak-"))

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    try:
        result = {"command": " ".join(sys.argv), "seed": args.seed, "cpu_count": os.cpu_count()}
        if args.converts:
            result["convert"] = soak_convert(work, args.converts, rng, say)
        if args.trains:
            result["train"] = soak_train(work, args.trains, rng, say)
        result["wall_s"] = round(time.perf_counter() - started, 1)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
