"""Prints docs/families.md's task-head table: each task class of `parity_tests/test_task_heads.py` (tiny random
transformers models, every parameter perturbed, labels of their own), verified against transformers' own class:
max |transformers - our float64 reference| of the scores, transformers in float32 and in float64.

    python benchmarks/task_heads_table.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parity_tests.test_task_heads import CASES, SCORES, task_dir  # noqa: E402

from transformer_parity.cli import main  # noqa: E402


class _Factory:  # what task_dir asks of pytest's tmp_path_factory
    def __init__(self, root: Path):
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path


def worst(rows: list[dict], source: str) -> float:
    return max(r["max_abs_err"] for r in rows
               if r["backends"] == [source, "numpy-f64"] and r["sublayer"] in SCORES)


def main_table() -> None:
    print("| task class | transformers f32 | transformers f64 | verify |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        factory = _Factory(Path(tmp))
        for arch in CASES:
            path = task_dir(arch, factory)
            report = Path(tmp) / f"{arch}.json"
            main(["--quiet", "verify", str(path), "--src-len", "11", "--json", str(report)])
            result = json.loads(report.read_text())
            print(f"| `{arch}` | {worst(result['rows'], 'transformers-f32'):.1e} | "
                  f"{worst(result['rows'], 'transformers-f64'):.1e} | {'PASS' if result['passed'] else 'FAIL'} |")


if __name__ == "__main__":
    main_table()
