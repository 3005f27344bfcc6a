"""What `verify` finds, as data: the subjects checked, one `Row` per comparison of one sublayer, and the `Report`
with its verdict properties. Rendering it (table, verdict line, JSON) is `verify.report`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

import reference_numpy as rn

JUDGE = "numpy-f64"


@dataclass
class Subject:
    """One thing to check against the judge: a backend running some canonical weights under some config."""

    label: str  # how the report names it: the backend ("torch"), numbered if two subjects share one ("torch#2")
    backend: str  # numpy | torch | keras
    config: rn.TransformerConfig
    weights: Mapping[str, np.ndarray]
    source: str = ""  # the checkpoint file (or preset) it was loaded from


@dataclass
class Row:
    """One comparison of one sublayer: `backends[0]` (actual) against `backends[1]` (the judge or another backend)."""

    sublayer: str
    backends: tuple[str, str]
    max_abs_err: float
    max_rel_err: float  # max_abs_err / max|desired|
    floor: float
    ratio: float  # max_abs_err / floor
    limit: float  # ratio allowed
    passed: bool
    kind: str = "port"  # port: a backend vs the judge; pair: two backends; source: the source vs the judge or a backend

    @property
    def against_judge(self) -> bool:
        return self.backends[1] == JUDGE

    @property
    def judged(self) -> bool:
        """A comparison with an authority (the judge, or the source), not between two ports."""
        return self.kind != "pair"

    def to_json(self) -> dict[str, Any]:
        return {"sublayer": self.sublayer, "backends": list(self.backends), "kind": self.kind,
                "max_abs_err": finite(self.max_abs_err), "max_rel_err": finite(self.max_rel_err),
                "floor": finite(self.floor), "ratio": finite(self.ratio),
                "tolerance": finite(self.limit * self.floor), "passed": self.passed}


@dataclass
class Report:
    """Everything `verify` found; `passed`, `first_divergence` and `rows` are the verdict."""

    sublayers: list[str]
    floors: dict[str, float]
    rows: list[Row]
    subjects: list[dict[str, str]]  # label, backend, source
    judge: str
    dtype: str
    inputs: dict[str, int]
    config_differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # why the judge itself cannot be trusted (non-finite values)
    weights: list[Any] = field(default_factory=list)  # weight_diff.WeightRow per tensor (two or more checkpoints)
    weights_compared: bool = False  # False: one checkpoint or none, or --outputs-only
    dropped: list[str] = field(default_factory=list)  # tensors left out by --allow-drop ("file: name")
    sources: list[dict[str, str]] = field(default_factory=list)  # label, name, kind, dtype of each source run
    self_consistent: str | None = "no source given"  # why no source judged the outputs (None: one did)

    @property
    def passed(self) -> bool:
        return self.passed_outputs and all(w.passed for w in self.weights)

    @property
    def passed_outputs(self) -> bool:
        """Every output within tolerance (whatever the weights comparison found)."""
        return not self.problems and all(row.passed for row in self.rows)

    @property
    def source_rows(self) -> list[Row]:
        return [r for r in self.rows if r.kind == "source"]

    @property
    def first_failure(self) -> Row | None:
        """The failing comparison with the judge or the source at the earliest sublayer (the worst one there)."""
        for name in self.sublayers:
            failing = [r for r in self.rows if r.sublayer == name and not r.passed and r.judged]
            if failing:  # against the judge first (a source that differs from it says so), then the worst
                return max(failing, key=lambda r: (r.against_judge, r.ratio))
        failing = [r for r in self.rows if not r.passed]
        return failing[0] if failing else None

    @property
    def first_divergence(self) -> str | None:
        row = self.first_failure
        return None if row is None else row.sublayer

    @property
    def comparisons(self) -> list[tuple[str, str]]:
        """The distinct backend pairs, in report order."""
        return list(dict.fromkeys(r.backends for r in self.rows))

    def max_ratio(self, pair: tuple[str, str] | None = None) -> float:
        return max((r.ratio for r in self.rows if pair is None or r.backends == pair), default=0.0)


def finite(x: float) -> float | None:
    """JSON has no inf/NaN: a non-finite error (NaN or inf in an output) is written as null."""
    return float(x) if math.isfinite(x) else None


def output_name(judge: Mapping[str, Any]) -> str:
    """The model's output among the judge's sublayers: `logits`, or `last_hidden_state` for a bare backbone."""
    return "logits" if "logits" in judge else "last_hidden_state"
