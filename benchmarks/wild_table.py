"""Prints docs/wild.md's table: every checkpoint of the wild corpus (`parity_tests/wild/`) converted to Keras and
run by our three implementations on its probe ids, each against the outputs its own library recorded.

    python benchmarks/wild_table.py

The checkpoints and how each is given are `parity_tests/test_wild_corpus.py`'s, which asserts what this prints.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity_tests"))

from test_wild_corpus import CORPUS, DIRS, REFUSED, source_args, versions  # noqa: E402

from transformer_parity.cli import main  # noqa: E402

LIBRARIES = ("transformers", "torch", "tensorflow", "flax", "keras_nlp")
BACKENDS = ("numpy-f64", "torch", "keras")


def measured(name: str) -> tuple[dict[str, float], bool]:
    """max |ours - the source's output| per backend (over `output` and, where recorded, `pooler`), and the verdict."""
    with tempfile.TemporaryDirectory() as tmp:
        keras_file, report = Path(tmp) / "model.weights.h5", Path(tmp) / "report.json"
        if main(["--quiet", "convert", *source_args(name), str(keras_file)]) != 0:
            raise SystemExit(f"{name}: convert failed")
        main(["--quiet", "verify", str(keras_file), "--expect", str(CORPUS / name / "probe.npz"),
              "--json", str(report)])
        result = json.loads(report.read_text())
    worst: dict[str, float] = {}
    for row in result["rows"]:
        if "expected" in row["backends"]:
            ours = next(b for b in row["backends"] if b != "expected")
            worst[ours] = max(worst.get(ours, 0.0), row["max_abs_err"])
    return worst, result["passed"]


def main_table() -> None:
    print("| checkpoint | written by | NumPy f64 | PyTorch | Keras | verify |")
    print("|---|---|---|---|---|---|")
    for name in DIRS:
        v = versions(name)
        libs = [f"{k} {v[k]}" for k in LIBRARIES if k in v] or [f"keras {v['keras']}"]
        if name in REFUSED:  # the reader refuses it (test_wild_corpus says why)
            print(f"| `{name}` | {', '.join(libs)} | - | - | - | refused |")
            continue
        worst, passed = measured(name)
        cells = " | ".join(f"{worst.get(b, float('nan')):.1e}" for b in BACKENDS)
        print(f"| `{name}` | {', '.join(libs)} | {cells} | {'PASS' if passed else 'FAIL'} |")


if __name__ == "__main__":
    main_table()
