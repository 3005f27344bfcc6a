"""What the attention and the whole-model benchmarks share: the `Runner` an implementation builds and the exceptions
that make a row of it instead of a crash, the interleaved timing rounds, failures as rows, result files (JSON checked
field by field, atomic writes) and the tables' number formats."""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import numpy as np

from . import timing
from .machine import free_memory


# --- implementations --------------------------------------------------------------------------------------------------

class Unsupported(Exception):
    """This implementation cannot run this case; the message says why."""


class NotInstalled(Unsupported):
    """The implementation's framework is not installed here."""


@dataclass
class Runner:
    fn: Callable[[], Any]
    to_numpy: Callable[[Any], dict[str, np.ndarray]]
    context: Callable[[], ContextManager] = contextlib.nullcontext
    kernel: Callable[[], str] | None = None  # asks the framework which kernel ran (runs `fn` once)
    kernel_name: str = ""  # a fixed description where the framework cannot be asked


def select_from(registry: dict, patterns: list[str] | None, lister: str) -> list:
    """`registry` entries by exact name or glob, in registry order (all when `patterns` is None); an unknown pattern
    is a `ValueError` that names it and the command listing the names."""
    if not patterns:
        return list(registry.values())
    chosen: list[str] = []
    for pattern in patterns:
        matches = [name for name in registry if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise ValueError(f"unknown implementation {pattern!r}; `{lister}` shows the {len(registry)} names")
        chosen.extend(m for m in matches if m not in chosen)
    return [registry[name] for name in registry if name in chosen]


# --- timing rounds ----------------------------------------------------------------------------------------------------

@dataclass
class Live:
    """An implementation built and checked on the current problem, waiting for its timing rounds."""

    impl: Any
    runner: Any
    row: Any  # the row the measurements land on
    number: int  # calls per timed block
    budget: float  # seconds of timing
    rounds: int  # rounds it takes part in
    times: list = field(default_factory=list)  # seconds per call, one entry per block
    block_rounds: list = field(default_factory=list)  # the round each block of `times` ran in
    min_runs: int = 1  # calls it makes over its rounds, at least, however fast its blocks turn out to be

    def round_medians(self) -> list[float]:
        """Seconds per call, the median block of each round it ran (in round order)."""
        by_round: dict[int, list[float]] = {}
        for round_, block in zip(self.block_rounds, self.times):
            by_round.setdefault(round_, []).append(block)
        return [float(np.median(by_round[r])) for r in sorted(by_round)]


SETTLE_S = 0.25  # seconds between frameworks' timing rounds


def round_orders(n: int) -> list[list[int]]:
    """Orders for timing n implementations round after round (a Williams design): across its rows every
    implementation runs in every position, and right after every other implementation, equally often (n rows for
    even n, each once; for odd n those rows and their mirror images, each twice). A round's cost that depends on its
    position (the first after the pause between frameworks) or on its predecessor (thread pools still spinning,
    caches filled by the previous implementation) thus falls on every implementation alike. A plain rotation
    balances positions only: b would always follow a."""
    first, low, high = [0], 1, n - 1
    while low <= high:
        first.append(low)
        low += 1
        if low <= high:
            first.append(high)
            high -= 1
    rows = [[(k + shift) % n for k in first] for shift in range(n)]
    return rows if n % 2 == 0 or n == 1 else rows + [row[::-1] for row in rows]


def timing_rounds(group: list, case, options) -> None:
    """Every implementation of the group, `options.rounds` times, in the orders of `round_orders`."""
    orders = round_orders(len(group))
    for round_ in range(options.rounds):
        order = [group[k] for k in orders[round_ % len(orders)]]
        for item in [item for item in order if round_ < item.rounds and item.runner is not None]:
            try:
                with item.runner.context():
                    # the budget's share, and at least one block per round, and enough blocks for min_runs calls
                    # (the budget comes from one sizing call: slower calls later would otherwise mean fewer)
                    spent, share, blocks = 0.0, item.budget / item.rounds, 0
                    while spent < share or blocks < math.ceil(item.min_runs / (item.number * item.rounds)):
                        block = timing.time_block(item.runner.fn, item.number, case.device, item.impl.framework)
                        item.times.append(block)
                        item.block_rounds.append(round_)
                        spent += block * item.number
                        blocks += 1
            except Exception as exc:  # noqa: BLE001 - out of memory, or a failure only repeated calls show
                failed(item.row, exc)
                item.runner = None
                free_memory()


# --- errors that become rows ------------------------------------------------------------------------------------------

def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "ResourceExhaustedError"):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                               or "failed to allocate" in text)


def failed(row, exc: BaseException):
    if is_oom(exc):
        row.status, row.note = "oom", f"{type(exc).__name__}: {first_line(exc)}"
    elif type(exc).__name__ == "Unsupported" or "No available kernel" in str(exc):
        row.status, row.note = "unsupported", first_line(exc)
    else:
        row.status, row.note = "error", f"{type(exc).__name__}: {first_line(exc)}"
    row.median_ms = row.iqr_ms = row.gflops = row.runs = None
    free_memory()
    return row


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# --- result files -----------------------------------------------------------------------------------------------------

_JSON_KINDS = {"str": "a string", "int": "an integer", "float": "a finite number",
               "list[float]": "a list of finite numbers", "dict": "an object", "dict[float]": "an object of numbers"}
# The meta and peak fields that the tables and plots read (others are shown as they are, or not at all).
META_FIELDS = {"date": "str", "cpu": "str", "cpu_flags": "str", "versions": "dict", "devices": "dict",
               "thread_settings": "dict"}
PEAK_FIELDS = {"device": "str", "dtype": "str", "by": "str", "n": "int", "gflops": "float | None",
               "all": "dict[float]"}


def _json_value_fits(value: Any, annotation: str) -> bool:
    """Whether a JSON value fits a field annotated as a key of _JSON_KINDS, maybe `| None`."""
    if value is None:
        return annotation.endswith("| None")
    kind = annotation.removesuffix(" | None")
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "list[float]":
        return isinstance(value, list) and all(_json_value_fits(x, "float") for x in value)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "dict[float]":
        return isinstance(value, dict) and all(_json_value_fits(x, "float") for x in value.values())
    raise TypeError(f"no JSON check for a field of type {annotation}")


def _check_fields(obj: Any, fields: dict[str, str], where: str) -> dict:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be an object, received {type(obj).__name__}")
    for name, annotation in fields.items():
        if name in obj and not _json_value_fits(obj[name], annotation):
            wanted = _JSON_KINDS[annotation.removesuffix(" | None")]
            raise ValueError(f"{where}: {name} must be {wanted}{' or null' if annotation.endswith('| None') else ''}, "
                             f"received {obj[name]!r:.60}")
    return obj


def result_from_json(row_type: type, data: dict[str, Any], meta_fields: dict[str, str] = META_FIELDS
                     ) -> tuple[dict, list[dict], list]:
    """(meta, peaks, rows) of a result file, every row field checked against its annotation and the meta and peak
    fields the reports read against `meta_fields` and PEAK_FIELDS, so that a corrupt or hand-edited file is refused
    here in one line, not by a TypeError deep in a table or a plot. Unknown keys are ignored (files written by other
    versions)."""
    meta = _check_fields(data["meta"], meta_fields, "meta")
    peaks, rows = data["peaks"], data["rows"]
    for name, value in (("peaks", peaks), ("rows", rows)):
        if not isinstance(value, list):
            raise ValueError(f"{name} must be a list, received {type(value).__name__}")
    peaks = [_check_fields(peak, PEAK_FIELDS, f"peak {index}") for index, peak in enumerate(peaks)]
    fields = {f.name: str(f.type) for f in dataclasses.fields(row_type)}
    return meta, peaks, [row_type(**{k: v for k, v in _check_fields(row, fields, f"row {index}").items()
                                     if k in fields}) for index, row in enumerate(rows)]


def write_atomic(path: str, data: bytes, force: bool = False) -> None:
    """Write via a temporary file in the same folder, published atomically (`outputs.atomic_path`: a regular file
    only, no overwrite without `force` even against a racing writer, the umask's mode), so a reader never sees half
    a file."""
    from ..io import guards, outputs

    path = guards.check_output(path, force)
    with outputs.atomic_path(path, force) as tmp:
        tmp.write_bytes(data)


def finite_for_json(value):
    """JSON has no NaN/Infinity: such floats become null (the row's note says the output was not finite)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: finite_for_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_for_json(v) for v in value]
    return value


# --- number formatting ------------------------------------------------------------------------------------------------

def format_sig(x: float | None, digits: int = 3) -> str:
    if x is None:
        return ""
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def format_err(x: float | None) -> str:
    if x is None:
        return ""
    if x != x:  # NaN
        return "NaN"
    return f"{x:.1e}"


def format_pct(x: float | None) -> str:
    return "" if x is None else f"{x:.0f}%"
