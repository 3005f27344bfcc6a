"""Rendering a verify `Report`: the rich table, the one-line verdict, the JSON file."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from transformer_parity.verify.results import Report


def _num(x: float) -> str:
    return "inf" if x != x or x == float("inf") else f"{x:.1e}"


def _ratio(x: float) -> str:
    if x != x or x == float("inf"):
        return "inf"
    return f"{x:.2f}" if x < 100 else f"{x:.1e}"


def pair_label(pair: tuple[str, str]) -> str:
    from transformer_parity.verify.results import JUDGE

    return pair[0] if pair[1] == JUDGE else f"{pair[0]} vs {pair[1]}"


def table(report: "Report", width: int | None = None) -> "Table":
    """One row per sublayer and comparison, in execution order: a backend against the judge (or two backends against
    each other), its max abs and max relative error, the sublayer's floor, error / floor, and the status. The first
    divergent sublayer is marked.

    Given the console's `width`, a table that would not fit is drawn compact rather than cut: sublayer names
    abbreviated (`enc.3.self_attn` for `encoder.layers.3.self_attn`, said in the caption), the max relative error
    left to the JSON report, and long backend labels wrapped at their spaces; no cell loses a character."""
    full = _table(report, compact=False)
    if width is None or _natural_width(full) <= width:
        return full
    return _table(report, compact=True)


def _natural_width(t: "Table") -> int:
    import io

    from rich.console import Console

    return Console(width=10 ** 4, file=io.StringIO()).measure(t).maximum


def short_sublayer(name: str) -> str:
    """`encoder.layers.3.self_attn` -> `enc.3.self_attn`, `decoder.final_norm` -> `dec.final_norm`."""
    for long, short in (("encoder.layers.", "enc."), ("decoder.layers.", "dec."), ("encoder.", "enc."),
                        ("decoder.", "dec.")):
        if name.startswith(long):
            return short + name[len(long):]
    return name


def _table(report: "Report", compact: bool) -> "Table":
    from rich import box
    from rich.table import Table

    from transformer_parity.verify.results import JUDGE

    first = report.first_failure
    pairs = report.comparisons
    reference = report.judge.split(" on ", 1)[-1]
    sources = ""
    if any(s["source"] != reference for s in report.subjects):
        sources = "; ".join(f"{s['label']} = {s['source']}" for s in report.subjects)
    title = f"every sublayer against {report.judge} ({report.dtype})" + (f"; {sources}" if sources else "")
    if report.sources:
        title += f"; and against the source, {report.sources[0]['name']}"
    t = Table(title=title, title_justify="left", header_style="bold", pad_edge=False, box=box.SIMPLE_HEAD)
    t.add_column("sublayer", no_wrap=True)
    t.add_column("backends", no_wrap=not compact, overflow="fold")
    numbers = ("max abs", "floor", "abs/floor") if compact else ("max abs", "max rel", "floor", "abs/floor")
    for name in numbers:
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("status", no_wrap=True)
    by_key = {(r.sublayer, r.backends): r for r in report.rows}
    for name in report.sublayers:
        shown = [by_key[(name, pair)] for pair in pairs if (name, pair) in by_key]  # a source gives some sublayers
        for i, r in enumerate(shown):
            if not r.passed and report.approximations and report.explained(r):
                status = "[yellow]approx[/]"  # the accepted approximation a checkpoint records, not a fault
            elif not r.passed:
                status = "[bold red]FAIL ◀ first[/]" if r is first else "[red]FAIL[/]"
            else:
                status = "[green]ok[/]"
            ratio = _ratio(r.ratio) if r.passed else f"[bold red]{_ratio(r.ratio)}[/]"
            errors = (_num(r.max_abs_err),) if compact else (_num(r.max_abs_err), _num(r.max_rel_err))
            label = (short_sublayer(name) if compact else name) if i == 0 else ""
            t.add_row(label, pair_label(r.backends), *errors, _num(r.floor), ratio, status)
    limits = sorted({r.limit for r in report.rows if r.kind != "source"}) or [0.0]
    floor_run = {"float32": "float32", "float64": "float32 (x eps64/eps32)"}.get(
        report.dtype, f"{report.dtype} (rounded where the frameworks round)")
    t.caption = (f"backends: one name = that backend vs the {JUDGE} judge; floor: NumPy {floor_run} vs float64 on the "
                 f"same inputs;\npass: max abs <= {limits[0]:g} x floor"
                 + (f" ({limits[-1]:g} x floor between two backends)" if len(limits) > 1 else ""))
    if compact:
        t.caption += ";\nenc.N / dec.N = encoder.layers.N / decoder.layers.N; max rel error: --json"
    if report.sources:
        from transformer_parity.tolerances import PAIR_RATIO_LIMIT, RATIO_LIMIT
        t.caption += (f";\nthe source vs {JUDGE}: {RATIO_LIMIT:g} x the float32 floor (x eps64/eps32 when it returned "
                      f"float64); a backend vs the source: {PAIR_RATIO_LIMIT:g} x floor in one precision, "
                      f"{RATIO_LIMIT:g} x the coarser floor across two")
    t.caption_justify = "left"
    return t


def _source_fit(report: "Report") -> str:
    """How close each source run's output came to the judge: "to 3.1e-07 (1.2 floors) in float32 and ..."."""
    from transformer_parity.verify.results import JUDGE, output_name

    output = output_name(report.sublayers)
    parts = []
    for run in report.sources:
        row = next((r for r in report.source_rows if r.backends == (run["label"], JUDGE) and r.sublayer == output),
                   None)
        if row is not None:
            parts.append(f"to {_num(row.max_abs_err)} ({_ratio(row.ratio)} floors) in {run['dtype']}")
    return " and ".join(parts)


def verdict(report: "Report") -> str:
    """One line that says what was proven: PASS naming the source it matches (or "self-consistent only" and why),
    or the first differing weight, or the first divergent sublayer and by how much."""
    from transformer_parity.verify import weights as weight_diff
    from transformer_parity.tolerances import RATIO_LIMIT
    from transformer_parity.verify.results import JUDGE

    limit = min((r.limit for r in report.rows if r.kind != "source"), default=RATIO_LIMIT)  # the judge's K
    n = len(report.rows)
    weights = ""
    if report.weights_compared:
        counts = weight_diff.summary(report.weights)
        n_weights, rounding = len(report.weights), "equal up to a float64->float32 rounding"
        if counts["identical"] == n_weights:
            weights = f"weights: all {n_weights} tensors identical; "
        elif counts["rounding"] == n_weights:
            weights = f"weights: all {n_weights} tensors {rounding}; "
        else:
            weights = f"weights: {counts['identical']} tensors identical, {counts['rounding']} {rounding}; "
    source = report.sources[0]["name"] if report.sources else None
    if report.passed:
        largest = max((r.ratio for r in report.rows if r.kind != "source"), default=0.0)  # the source's: above
        checked = (f"{weights}all {n} comparisons within tolerance; largest error {_ratio(largest)} x floor (limit "
                   f"{limit:g})")
        dropped = (f"; dropped by --allow-drop, not compared: {', '.join(report.dropped)}" if report.dropped
                   else "")
        if source:
            return f"PASS: matches the source ({source}) {_source_fit(report)}; {checked}{dropped}"
        return (f"PASS (self-consistent only: {report.self_consistent}; judged by {JUDGE}, our reference on the same "
                f"weights and config): {checked}{dropped}")
    if report.approximate:
        return approximate_verdict(report)
    weights_failed = weight_diff.verdict(report.weights)
    if weights_failed:
        if not report.rows:
            why = next((n for n in report.notes if n.startswith("outputs not compared")), "outputs not compared")
            return f"{weights_failed}; {why}"
        first = report.first_divergence
        outputs = ("every output within tolerance" if report.passed_outputs
                   else f"outputs diverge too: first divergent sublayer {first}" if first
                   else "outputs fail too")
        return f"{weights_failed}; {outputs}"
    if report.problems:
        return f"FAILED: {report.problems[0]}"
    row = report.first_failure
    failed = sum(not r.passed for r in report.rows)
    where = (f"first divergent sublayer {row.sublayer} ({row.backends[0]} vs {row.backends[1]}: max abs err "
             f"{_num(row.max_abs_err)} = {_ratio(row.ratio)} x floor, limit {row.limit:g}); {failed} of {n} "
             "comparisons fail")
    if any(not r.passed for r in report.source_rows):
        return f"FAIL: differs from the source ({source}): {where}"
    if source:
        return f"DIVERGED: {where}; the source ({source}) matches the reference"
    return f"DIVERGED: {where} (self-consistent check: {report.self_consistent})"


def approximate_verdict(report: "Report") -> str:
    """APPROXIMATE: which subject computes which recorded approximation, where it first shows and by how much, the
    output's gap beside the one recorded when it was written, and that everything else is within tolerance."""
    parts = []
    for a in report.approximations:
        where = "within tolerance at every sublayer"
        if a["first_sublayer"]:
            where = (f"it first shows at {a['first_sublayer']}{', in ' + a['site'] if a.get('site') else ''}, by "
                     f"{_num(a['gap_there'])} = {_ratio(a['gap_there'] / a['floor_there'])} x floor")
        recorded, top1 = a["recorded"].get("max_abs"), a["recorded"].get("top1_changed")
        written = "" if recorded is None else f" (when it was written, on verify's default probe: {_num(recorded)}"
        if written and top1 is not None:
            written += f", the top-1 prediction changed at {top1} of {a['recorded'].get('positions')} positions"
        parties = a["parties"]
        who = (f"{', '.join(parties[:-1])} and {parties[-1]} match" if len(parties) > 1 else f"{parties[0]} matches")
        parts.append(f"{a['computes']}; {where}; its output ({a['output']}) differs by up to "
                     f"{_num(a['output_gap'])}{written + ')' if written else ''}; {who} {a['judge']}, our reference "
                     "with that setting")
    return f"APPROXIMATE: {'; '.join(parts)}; every other comparison within tolerance"


def weights_table(report: "Report") -> "Table | None":
    """The tensors that differ or are missing (weights first, two or more checkpoints), or None if none does;
    tensors equal up to a rounding that happened are counted in the title (and the verdict), not listed."""
    from rich import box
    from rich.table import Table

    from transformer_parity.verify import weights as weight_diff

    rows = [w for w in report.weights if not w.passed]
    if not rows:
        return None
    counts = weight_diff.summary(report.weights)
    t = Table(title="weights, name by name against " + rows[0].checkpoints[1] + ": " + ", ".join(
        f"{v} {k}" for k, v in counts.items() if v), title_justify="left", header_style="bold", pad_edge=False,
        box=box.SIMPLE_HEAD)
    for name, justify in (("tensor", "left"), ("checkpoint", "left"), ("status", "left"), ("max abs diff", "right"),
                          ("at index", "left"), ("elements differ", "right"), ("note", "left")):
        # on a narrow terminal names and notes fold onto a second line; nothing is cut
        t.add_column(name, justify=justify, no_wrap=name not in ("tensor", "checkpoint", "note"), overflow="fold")
    for w in rows:
        status = "[bold red]" + w.status.upper() + "[/]"
        differ = f"{w.differing} of {w.size}" if w.status == weight_diff.DIFFERENT and w.index is not None else ""
        t.add_row(w.name, w.checkpoints[0], status, _num(w.max_abs_diff) if w.index is not None else "",
                  str(list(w.index)) if w.index is not None else "", differ, w.detail)
    return t


def print_report(report: "Report", console: "Console") -> None:
    weights = weights_table(report)
    if weights is not None:
        console.print(weights)
    if report.rows:
        console.print(table(report, console.width))
    from rich.markup import escape

    for line in report.config_differences:
        console.print(f"[yellow]config differs[/] {escape(line)}", soft_wrap=True)
    for line in report.notes:
        console.print(f"note: {line}", markup=False, soft_wrap=True)
    for line in report.not_exercised:  # a PASS speaks for the paths the probe ran through (verify --cover)
        console.print(f"not exercised: {line}", markup=False, soft_wrap=True)


def to_json_text(report: "Report") -> str:
    return json.dumps(to_json(report), indent=2, allow_nan=False)


def to_json(report: "Report") -> dict[str, Any]:
    """The report as the JSON `--json` writes (schema `transformer-parity/verify-report`)."""
    from transformer_parity.verify import weights as weight_diff

    first = report.first_failure
    return {
        "schema": "transformer-parity/verify-report", "schema_version": 1,
        "passed": report.passed, "approximate": report.approximate, "verdict": verdict(report),
        "approximations": report.approximations,
        "source": {"runs": report.sources, "self_consistent_only": report.self_consistent},
        "first_divergence": report.first_divergence, "dropped": report.dropped,
        "first_divergence_backends": list(first.backends) if first else None,
        "judge": report.judge, "mode": report.mode, "subjects": report.subjects, "dtype": report.dtype,
        "inputs": report.inputs,
        "tolerance": _tolerance_json(report.dtype),
        "config_differences": report.config_differences, "notes": report.notes, "problems": report.problems,
        "not_exercised": report.not_exercised,
        "weights": weight_diff.to_json(report.weights, report.weights_compared),
        "seconds": {k: round(v, 3) for k, v in report.seconds.items()},
        "rows": [r.to_json() for r in report.rows],
    }


def _tolerance_json(dtype: str) -> dict[str, Any]:
    from transformer_parity.verify import lowp
    from transformer_parity.tolerances import PAIR_RATIO_LIMIT, RATIO_LIMIT

    if lowp.is_reduced(dtype.split()[0]):
        return {"rule": f"max_abs_err <= limit * floor; floor = max(max|numpy_{dtype.replace(' ', '_')} - "
                        f"numpy_f64|, eps_{dtype.split()[0]} * max|numpy_f64|)",
                "ratio_limit": lowp.RATIO_LIMIT, "pair_ratio_limit": lowp.PAIR_RATIO_LIMIT}
    return {"rule": "max_abs_err <= limit * floor; floor = max(max|numpy_f32 - numpy_f64|, "
                    "eps32 * max|numpy_f64|), times eps64/eps32 for float64",
            "ratio_limit": RATIO_LIMIT, "pair_ratio_limit": PAIR_RATIO_LIMIT}
