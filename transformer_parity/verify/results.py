"""What `verify` finds, as data: the subjects checked, one `Row` per comparison of one sublayer, and the `Report`
with its verdict properties. Rendering it (table, verdict line, JSON) is `verify.report`."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

import reference_numpy as rn

from transformer_parity.tolerances import compare, max_abs

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
    mode: str = "whole model"  # or "layer-streamed" (`verify.streamed`): one block at a time
    dropped: list[str] = field(default_factory=list)  # tensors left out by --allow-drop ("file: name")
    sources: list[dict[str, str]] = field(default_factory=list)  # label, name, kind, dtype of each source run
    self_consistent: str | None = "no source given"  # why no source judged the outputs (None: one did)
    approximations: list[dict[str, Any]] = field(default_factory=list)  # `approximation.judge`'s findings
    not_exercised: list[str] = field(default_factory=list)  # paths the probe left out (`verify.coverage`)

    @property
    def passed(self) -> bool:
        """Every output within tolerance and the weights the same; never with an accepted approximation."""
        return self.passed_outputs and all(w.passed for w in self.weights) and not self.approximations

    @property
    def approximate(self) -> bool:
        """Not a PASS, but every difference is an accepted approximation a checkpoint records: each approximated
        subject (and its library's source runs) matches the reference run with the recorded config, every comparison
        that leaves them out passes, and so do the weights."""
        if not self.approximations or self.problems or not all(w.passed for w in self.weights):
            return False
        return all(r.passed for r in self.rows if not self.explained(r))

    def explained(self, r: Row) -> bool:
        """Whether a failing row's difference is an accepted approximation: one side computes it (an approximated
        subject or its library's run), the other the source's function."""
        judges = {a["judge"] for a in self.approximations}
        parties = {p for a in self.approximations for p in a["parties"]}
        return r.backends[1] not in judges and bool(parties & set(r.backends)) and not parties >= set(r.backends)

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


def nonfinite_problems(judge: Mapping[str, np.ndarray], floor_run: Mapping[str, np.ndarray],
                       weights: Mapping[str, np.ndarray]) -> list[str]:
    """A judge or floor that is not finite cannot judge anything (an infinite floor would pass any error): name the
    first sublayer where it happens and the weight behind it."""
    for name, desired in judge.items():
        for label, values in ((JUDGE, desired), ("the float32 floor run", floor_run.get(name))):
            if values is not None and not np.all(np.isfinite(values)):
                return [f"{label} is not finite at sublayer {name} ({_culprit(weights)}); no tolerance can be "
                        "derived, so nothing can pass"]
    return []


def _culprit(weights: Mapping[str, np.ndarray]) -> str:
    """The weight that makes the reference overflow: a NaN/inf one, else the largest beyond float32's range."""
    top = float(np.finfo(np.float32).max)
    worst_name, worst = None, 0.0
    for name, value in weights.items():
        value = np.asarray(value)
        if not np.all(np.isfinite(value)):
            return f"weight {name} holds NaN or inf"
        m = max_abs(value)
        if m > worst:
            worst_name, worst = name, m
    if worst > top:
        return f"weight {worst_name} has magnitude {worst:.3g}, beyond float32's largest {top:.3g}"
    return (f"no weight is beyond float32's range; the largest is {worst_name} at {worst:.3g}, so an activation "
            "overflows")


def row(name: str, backends: tuple[str, str], actual, desired, floor: float, limit: float,
         kind: str = "port") -> Row:
    if actual is None or desired is None:
        err = rel = math.inf
    else:
        err, rel = compare(actual, desired)
    ratio = err / floor if math.isfinite(floor) else math.inf  # an infinite floor must not excuse any error
    return Row(name, backends, err, rel, floor, ratio, limit, bool(ratio <= limit), kind)


def port_rows(name: str, labels: Sequence[str], outputs: Mapping[str, Mapping[str, Any]], desired, floor: float,
              limit: float, pair_limit: float) -> list[Row]:
    """At sublayer `name`: each port (`labels`, their outputs by label) against the judge's `desired`, then every
    two ports against each other."""
    rows = [row(name, (label, JUDGE), outputs[label].get(name), desired, floor, limit) for label in labels]
    return rows + [row(name, (a, b), outputs[a].get(name), outputs[b].get(name), floor, pair_limit, "pair")
                   for a, b in itertools.combinations(labels, 2)]


def recorded_inputs(config: rn.TransformerConfig, batch: int, src_len: int, tgt_len: int, seed: int | None
                    ) -> dict[str, int | None]:
    """The inputs as the report records them: no target length for a model that reads one sequence."""
    inputs = {"batch": batch, "src_len": src_len, "tgt_len": tgt_len, "seed": seed}
    if not config.is_encoder_decoder:
        del inputs["tgt_len"]
    return inputs
