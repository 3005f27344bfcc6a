"""How long `transformer-parity convert` takes on the base model between every pair of formats, and how much memory
it needs compared with the checkpoint; and how long `transformer-parity verify` (no arguments) takes.

    python benchmarks/bench_convert.py                  # base preset, 3 runs per pair
    python benchmarks/bench_convert.py --repeat 1 --preset tiny --no-verify

Every figure is measured on a fresh process, exactly as a user runs the command (`python -m transformer_parity ...`,
imports included): wall time around the process, and its peak resident set size from the kernel's accounting for
that one child (`os.wait4`). The checkpoint size is the input file's size. The `nn-transformer` rows use the base
preset with `final_norm=True`, because `torch.nn.Transformer` always ends each stack with a LayerNorm.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORMATS = {"canonical": "model.safetensors", "torch": "model.pt", "keras": "model.weights.h5"}
TIME_LIMIT_S, MEMORY_LIMIT_X, VERIFY_LIMIT_S = 10.0, 3.0, 30.0


def run_cli(args: list[str]) -> tuple[float, int]:
    """Run `python -m transformer_parity ARGS` in a fresh process; returns (wall seconds, peak RSS bytes)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "transformer_parity", *args], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    stderr = process.stderr.read().decode()
    process.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"transformer-parity {' '.join(args)} failed ({code}): {stderr.strip()}")
    return seconds, usage.ru_maxrss * 1024  # Linux reports kilobytes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base", choices=("tiny", "base", "big"))
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is reported")
    parser.add_argument("--no-verify", action="store_true", help="skip timing `verify` with no arguments")
    parser.add_argument("--dir", help="where to put the checkpoints (default: a temporary directory)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
              f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; median of {args.repeat} run(s)\n")
        sources = {}
        for fmt, name in FORMATS.items():
            sources[fmt] = tmp / "src" / name
            sources[fmt].parent.mkdir(exist_ok=True)
        run_cli(["init", "--preset", args.preset, "--exercise-all", "-o", str(sources["canonical"]), "-q"])
        run_cli(["convert", str(sources["canonical"]), str(sources["torch"]), "-q"])
        run_cli(["convert", str(sources["canonical"]), str(sources["keras"]), "-q"])
        nn_canonical = tmp / "src" / "nn-model.safetensors"
        run_cli(["init", "--preset", args.preset, "--exercise-all", "--set", "final_norm=true", "-o",
                 str(nn_canonical), "-q"])
        nn_file = tmp / "src" / "nn-model.pt"
        run_cli(["convert", str(nn_canonical), str(nn_file), "--to", "nn-transformer", "-q"])

        pairs = [(s, t, sources[s], FORMATS[t], []) for s in FORMATS for t in FORMATS if s != t]
        pairs += [("canonical", "nn-transformer", nn_canonical, "out.pt", ["--to", "nn-transformer"]),
                  ("nn-transformer", "canonical", nn_file, "model.safetensors", []),
                  ("nn-transformer", "keras", nn_file, "model.weights.h5", [])]
        header = f"{'convert':32s} {'checkpoint':>11s} {'seconds':>8s} {'peak RSS':>10s} {'x size':>7s}  status"
        print(header + "\n" + "-" * len(header))
        worst_time = worst_memory = 0.0
        for source, target, path, out_name, extra in pairs:
            out = tmp / "out" / out_name
            out.parent.mkdir(exist_ok=True)
            size = path.stat().st_size
            runs = [run_cli(["convert", str(path), str(out), "--force", "-q", *extra]) for _ in range(args.repeat)]
            seconds = statistics.median(r[0] for r in runs)
            peak = statistics.median(r[1] for r in runs)
            ok = seconds < TIME_LIMIT_S and peak < MEMORY_LIMIT_X * size
            worst_time, worst_memory = max(worst_time, seconds), max(worst_memory, peak / size)
            print(f"{source + ' -> ' + target:32s} {size / 2**20:9.1f}MiB {seconds:8.2f} {peak / 2**20:8.0f}MiB "
                  f"{peak / size:7.2f}  {'ok' if ok else 'OVER TARGET'}", flush=True)
            out.unlink()
        print(f"\nslowest conversion {worst_time:.2f} s (target < {TIME_LIMIT_S:g} s); largest peak "
              f"{worst_memory:.2f} x the checkpoint (target < {MEMORY_LIMIT_X:g} x)")

        if not args.no_verify:
            command = ["verify", "-q"] if args.preset == "base" else ["verify", "--preset", args.preset, "-q"]
            runs = [run_cli(command) for _ in range(args.repeat)]
            seconds = statistics.median(r[0] for r in runs)
            print(f"\ntransformer-parity verify (no arguments: {args.preset} preset, numpy/torch/keras): "
                  f"{seconds:.1f} s wall, imports included (runs: {', '.join(f'{r[0]:.1f}' for r in runs)}); "
                  f"peak RSS {statistics.median(r[1] for r in runs) / 2**30:.2f} GiB; target < {VERIFY_LIMIT_S:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
