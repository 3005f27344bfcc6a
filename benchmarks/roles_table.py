"""Prints docs/layouts.md's table of settled layouts: each hand-written fixture model of `parity_tests/sources`
(the `*_renamed` ones with every module named `m0`, `m1`, ...) saved, then `layout --scaffold --source` run on it
in-process, timed: how many candidate layouts probing tried, how long it took, how far the chosen one is from the
source's own float32 output, and whether it settled.

    python benchmarks/roles_table.py
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parity_tests import sources  # noqa: E402

from transformer_parity.layouts import probe  # noqa: E402


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    print(f"{cpu()}, {os.cpu_count()} cores")
    print("| model | candidates tried | seconds | off the source (f32) | floors | settled |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in sources.MODELS:
            model = sources.module(name)
            path = model.save_checkpoint(Path(tmp) / f"{name}{model.CHECKPOINT_SUFFIX}", seed=0)
            os.environ[sources.CHECKPOINT_ENV] = str(path)
            start = time.perf_counter()
            settled = probe.settle(path, model.forward, {})
            seconds = time.perf_counter() - start
            print(f"| `{name}` | {settled.tried} | {seconds:.1f} | {settled.error:.1e} | {settled.ratio:.2f} | "
                  f"{'yes' if settled.passed else 'NO: ' + '; '.join(settled.unsettled)} |")




def worst_case() -> None:
    """The bound: 48 candidate mappings (`roles.candidates`' most), timed on keras_dense_n by repeating its own
    candidates up to 48 (every one runs the whole switch search, as distinct ones would)."""
    from transformer_parity.layouts import roles

    original = roles.candidates

    def inflated(*args, **kwargs):
        found, why = original(*args, **kwargs)
        return (found * 48)[:48], why

    model = sources.module("keras_dense_n")
    with tempfile.TemporaryDirectory() as tmp:
        path = model.save_checkpoint(Path(tmp) / f"m{model.CHECKPOINT_SUFFIX}", seed=0)
        os.environ[sources.CHECKPOINT_ENV] = str(path)
        roles.candidates = inflated
        try:
            start = time.perf_counter()
            settled = probe.settle(path, model.forward, {})
            seconds = time.perf_counter() - start
        finally:
            roles.candidates = original
    print(f"worst case, 48 candidate mappings (keras_dense_n's repeated): {settled.tried} candidate layouts tried in "
          f"{seconds:.1f} s")


if __name__ == "__main__":
    main()
    worst_case()
