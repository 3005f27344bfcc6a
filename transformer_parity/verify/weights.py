"""Weights first: compare the canonical weights of checkpoints name by name, before any output is computed.

An output comparison cannot see every changed weight (softmax is nearly blind to a small change of a key kernel; a
ReLU unit no input activates hides its weights), so when `verify` is given two or more checkpoints it first asks
the plainer question: are the weights the same? Each tensor of a checkpoint is, against the reference's (the first
checkpoint's) tensor of the same canonical name:

- **identical**: the same values (a float32 tensor held in float64 counts: widening is exact);
- **rounding**: equal to the other rounded to float32, where that rounding happened: one side is float64 and the
  other holds float32 values, e.g. a float64 source and its float32 port, or a port through float64 -> float32 ->
  float64 (the second file is float64, but every value is a float32 value, and it is exactly the source rounded);
- **different**: anything else; the row names the largest difference, its index and how many elements differ
  (beyond the rounding, where rounding applies to the rest);
- **missing**: present in one checkpoint and not the other.

Different and missing tensors fail `verify` (exit 1) whatever the outputs do; `--outputs-only` skips the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

IDENTICAL, ROUNDING, DIFFERENT, MISSING = "identical", "rounding", "different", "missing"


@dataclass
class WeightRow:
    """One canonical tensor of one checkpoint against the reference checkpoint's tensor of the same name."""

    name: str
    checkpoints: tuple[str, str]  # (this checkpoint, the reference)
    status: str  # identical | rounding | different | missing
    detail: str = ""  # which rounding, or which side lacks the tensor, or a shape mismatch
    max_abs_diff: float = 0.0
    index: tuple[int, ...] | None = None  # where the largest difference is
    differing: int = 0  # elements that differ (beyond the rounding)
    size: int = 0

    @property
    def passed(self) -> bool:
        return self.status in (IDENTICAL, ROUNDING)

    def describe(self) -> str:
        """One line for a person: what differs, where, and by how much."""
        if self.status == MISSING:
            return f"{self.name}: {self.detail}"
        if self.status != DIFFERENT:
            return f"{self.name}: {self.status}" + (f" ({self.detail})" if self.detail else "")
        if self.index is None:
            return f"{self.name}: {self.detail}"
        text = (f"{self.name} differs at index {list(self.index)} by {self.max_abs_diff:.3g}; {self.differing} of "
                f"{self.size} elements differ")
        return text + (f" (beyond {self.detail})" if self.detail else "")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "checkpoints": list(self.checkpoints), "status": self.status,
                "detail": self.detail or None, "passed": self.passed,
                "max_abs_diff": self.max_abs_diff if np.isfinite(self.max_abs_diff) else None,
                "index": list(self.index) if self.index is not None else None,
                "differing": self.differing, "size": self.size}


def _to_float32(x: np.ndarray) -> np.ndarray:
    """`x` rounded to float32, as float64 (what a float64 -> float32 conversion writes)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float32).astype(np.float64)


def compare_tensor(name: str, actual: np.ndarray, desired: np.ndarray, labels: tuple[str, str]) -> WeightRow:
    """`actual` (this checkpoint's tensor) against `desired` (the reference's), see the module docstring."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    row = WeightRow(name, labels, IDENTICAL, size=int(desired.size))
    if actual.shape != desired.shape:
        row.status, row.detail = DIFFERENT, f"shape {actual.shape} here, {desired.shape} in the reference"
        row.max_abs_diff = float("inf")
        return row
    if actual.dtype == desired.dtype and np.array_equal(actual, desired, equal_nan=True):
        return row  # the common case, without float64 copies
    a, d = actual.astype(np.float64), desired.astype(np.float64)
    if np.array_equal(a, d, equal_nan=True):
        return row
    # Explanations by a rounding to float32 that happened: this side is float32 (or float64 holding float32
    # values) and the reference is float64, or the other way round. The one that leaves the fewest elements
    # unexplained is the one reported; where it explains every element the tensor passes.
    candidates = [(a == d) | (np.isnan(a) & np.isnan(d))]
    reasons = [""]
    if desired.dtype == np.float64:
        rounded = _to_float32(d)
        candidates.append((a == rounded) | (np.isnan(a) & np.isnan(rounded)))
        reasons.append("float64->float32 rounding" + ("" if actual.dtype == np.float32 else ", held in float64"))
    if actual.dtype == np.float64:
        rounded = _to_float32(a)
        candidates.append((rounded == d) | (np.isnan(rounded) & np.isnan(d)))
        reasons.append("float64->float32 rounding in the reference"
                       + ("" if desired.dtype == np.float32 else ", held in float64"))
    unexplained = [int(np.count_nonzero(~c)) for c in candidates]
    best = int(np.argmin(unexplained))
    same, rounding = candidates[best], reasons[best]
    if unexplained[best] == 0:
        row.status, row.detail = ROUNDING, rounding
        return row
    with np.errstate(invalid="ignore"):
        diff = np.abs(actual.astype(np.float64) - desired.astype(np.float64))
    diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))
    flat = int(np.argmax(diff))
    row.status, row.detail = DIFFERENT, rounding
    row.max_abs_diff = float(diff.flat[flat])
    row.index = tuple(int(i) for i in np.unravel_index(flat, diff.shape)) if diff.ndim else ()
    row.differing = unexplained[best]
    return row


def compare_checkpoints(reference: Mapping[str, np.ndarray], others: Sequence[Mapping[str, np.ndarray]],
                        labels: Sequence[str], unread: Mapping[str, int] | None = None) -> list[WeightRow]:
    """Every canonical tensor of each of `others` against `reference`'s, name by name; `labels` names the
    reference first, then each of `others`. Names in one checkpoint and not the other are `missing` rows.
    `unread` (`reference_numpy.schema.unread_rows`): leading rows of a tensor the model never reads, left out of the
    comparison when both tensors have the same shape."""
    unread = dict(unread or {})
    rows = []
    for weights, label in zip(others, labels[1:]):
        pair = (label, labels[0])
        for name in sorted(set(reference) | set(weights)):
            if name not in weights:
                rows.append(WeightRow(name, pair, MISSING, f"in {labels[0]}, not in {label}",
                                      size=int(np.size(reference[name]))))
            elif name not in reference:
                rows.append(WeightRow(name, pair, MISSING, f"in {label}, not in {labels[0]}",
                                      size=int(np.size(weights[name]))))
            elif unread.get(name) and np.shape(weights[name]) == np.shape(reference[name]):
                skip = unread[name]
                rows.append(compare_tensor(name, np.asarray(weights[name])[skip:], np.asarray(reference[name])[skip:],
                                           pair))
            else:
                rows.append(compare_tensor(name, weights[name], reference[name], pair))
    return rows


def summary(rows: Sequence[WeightRow]) -> dict[str, int]:
    """How many tensors are identical, rounded, different, missing."""
    counts = {IDENTICAL: 0, ROUNDING: 0, DIFFERENT: 0, MISSING: 0}
    for row in rows:
        counts[row.status] += 1
    return counts


def to_json(rows: Sequence[WeightRow], compared: bool) -> dict[str, Any]:
    """The report's `weights` section: counts, and a row for every tensor that is not identical."""
    return {"compared": compared, "passed": all(r.passed for r in rows), **summary(rows),
            "rows": [r.to_json() for r in rows if r.status != IDENTICAL]}


def verdict(rows: Sequence[WeightRow]) -> str | None:
    """One line naming the first failing tensor (and how many fail), or None when every tensor passes."""
    failing = [r for r in rows if not r.passed]
    if not failing:
        return None
    more = f"; {len(failing)} tensors differ or are missing in all" if len(failing) > 1 else ""
    return f"WEIGHTS DIFFER: {failing[0].describe()}" + more
