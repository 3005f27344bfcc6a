"""Showing and saving benchmark reports: the terminal table (rich, or plain text without it), JSON, CSV, and the
comparison of two saved runs."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import sys
from typing import Any, Iterable

from .attention import Report, Row, geomean, ratios_to_fastest_builtin
from .harness import finite_for_json, format_err, format_pct, format_sig

SHOWN = ("ok", "oom", "error")  # statuses that get a table row; the rest are summarised under the table


# --- files ------------------------------------------------------------------------------------------------------------

def to_json(report: Report) -> bytes:
    return (json.dumps(finite_for_json(report.to_json_dict()), indent=1, allow_nan=False) + "\n").encode()


def to_csv(report: Report) -> bytes:
    out = io.StringIO()
    names = [f.name for f in dataclasses.fields(Row)]
    writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for row in report.rows:
        writer.writerow({k: ("" if v is None else v) for k, v in dataclasses.asdict(row).items()})
    return out.getvalue().encode()


def load(path: str) -> Report:
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    try:
        return Report.from_json_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


# --- the table ----------------------------------------------------------------------------------------------------

COLUMNS = ("implementation", "kernel", "median ms", "IQR ms", "runs", "GFLOP/s", "% peak", "x numpy", "mem MiB",
           "1st call ms", "max err")
TEXT_COLUMNS = 2  # left-aligned


def _cells(row: Row) -> list[str]:
    if row.status != "ok":
        return [row.impl, row.kernel, row.status.upper(), "", "", "", "", "", "", "", row.note[:60]]
    return [row.impl, row.kernel, format_sig(row.median_ms), format_sig(row.iqr_ms, 2), str(row.runs),
            format_sig(row.gflops), format_pct(row.pct_peak), "" if row.speedup is None else f"{row.speedup:.3g}x",
            format_sig(row.peak_mem_mib), format_sig(row.first_call_ms), format_err(row.max_abs_err)]


def sections(rows: Iterable[Row]) -> dict[tuple, list[Row]]:
    """Rows grouped by what they compute: (device, scope, mode, shape, mask, dtype), in first-seen order."""
    out: dict[tuple, list[Row]] = {}
    for row in rows:
        if row.status in SHOWN:
            out.setdefault((row.device, row.scope, row.mode, row.shape, row.mask, row.dtype), []).append(row)
    return out


def _title(key: tuple) -> str:
    device, scope, mode, shape, mask, dtype = key
    return f"{scope} {mode}  {shape}  mask {mask}  {dtype} on {device}"


def header_lines(report: Report) -> list[str]:
    m = report.meta
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
    lines = [f"date {m.get('date', '?')}   {versions}",
             f"CPU {m.get('cpu', '?')} ({m.get('cpu_count', '?')} logical cores), threads {m.get('threads', '?')}: "
             f"{m.get('thread_settings', {})}"]
    for device, name in m.get("devices", {}).items():
        if device != "cpu":
            lines.append(f"{device}: {name}")
    for peak in report.peaks:
        if peak.get("gflops"):
            others = ", ".join(f"{k} {v:.1f}" for k, v in peak.get("all", {}).items())
            lines.append(f"measured peak {peak['device']} {peak['dtype']}: {peak['gflops']:.1f} GFLOP/s "
                         f"({peak['n']}^3 GEMM; {others})")
    lines.append(f"FLOPs: {m.get('flop_convention', '')}")
    lines.append(f"TF32: {m.get('tf32', '')}; memory: {m.get('memory', {}).get('cpu', '')}")
    return lines


def footer_lines(report: Report) -> list[str]:
    skipped: dict[tuple[str, str], list[str]] = {}
    for row in report.rows:
        if row.status not in SHOWN:
            names = skipped.setdefault((row.status, row.note), [])
            if row.impl not in names:
                names.append(row.impl)
    lines = [f"not run ({status}): {', '.join(names)} -- {note}" for (status, note), names in skipped.items()]
    ratios = ratios_to_fastest_builtin(report.rows)
    if ratios:
        lines.append("ours / fastest built-in of the same framework (median time ratio; goal <= 1.10):")
        for framework in ("torch", "tf"):
            mine = [r for r in ratios if r["framework"] == framework]
            if not mine:
                continue
            worst = max(mine, key=lambda r: r["ratio"])
            lines.append(f"  {framework}: geomean {geomean(r['ratio'] for r in mine):.2f} over {len(mine)} problems, "
                         f"worst {worst['ratio']:.2f} ({worst['ours']} vs {worst['builtin']}, {worst['shape']} "
                         f"{worst['scope']} {worst['mode']} {worst['mask']} {worst['dtype']})")
    return lines


def render(report: Report, console=None) -> None:
    """Print the report on the terminal: rich when installed, plain text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(render_text(report))
        return
    if console is None:
        import shutil
        console = Console(width=None if sys.stdout.isatty() else max(150, shutil.get_terminal_size().columns))
    for line in header_lines(report):
        console.print(line, highlight=False, soft_wrap=True)
    for key, rows in sections(report.rows).items():
        table = Table(title=_title(key), title_justify="left", show_edge=False, pad_edge=False)
        for i, name in enumerate(COLUMNS):
            table.add_column(name, justify="left" if i < TEXT_COLUMNS else "right", no_wrap=name != "kernel",
                             overflow="fold")
        for row in rows:
            style = None if row.status == "ok" else "red"
            table.add_row(*_cells(row), style=style)
        console.print(table)
    for line in footer_lines(report):
        console.print(line, highlight=False, soft_wrap=True)


def render_text(report: Report) -> str:
    out = list(header_lines(report))
    for key, rows in sections(report.rows).items():
        cells = [list(COLUMNS)] + [_cells(r) for r in rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
        out.append("")
        out.append(_title(key))
        for c in cells:
            out.append("  ".join(v.ljust(w) if i < TEXT_COLUMNS else v.rjust(w)
                                 for i, (v, w) in enumerate(zip(c, widths))))
    out.append("")
    out.extend(footer_lines(report))
    return "\n".join(out)


def markdown_table(report: Report) -> str:
    """One markdown table of every measured row (for docs/benchmarks.md): GFLOP/s and % of measured peak side by side."""
    lines = ["| problem | implementation | kernel | median ms (IQR) | GFLOP/s | % peak | x numpy | max err |",
             "|---|---|---|---|---|---|---|---|"]
    for key, rows in sections(report.rows).items():
        for row in rows:
            problem = _title(key)
            if row.status != "ok":
                lines.append(f"| {problem} | {row.impl} | | {row.status.upper()} | | | | |")
                continue
            speed = "" if row.speedup is None else f"{row.speedup:.3g}x"
            lines.append(f"| {problem} | {row.impl} | {row.kernel} | {format_sig(row.median_ms)} "
                         f"({format_sig(row.iqr_ms, 2)}) | {format_sig(row.gflops)} | {format_pct(row.pct_peak)} "
                         f"| {speed} | {format_err(row.max_abs_err)} |")
    return "\n".join(lines)


# --- compare ------------------------------------------------------------------------------------------------------

def _key(row: Row) -> tuple:
    return (row.impl, row.device, row.scope, row.mode, row.mask, row.dtype, row.shape)


def compare(a: Report, b: Report) -> tuple[list[dict[str, Any]], list[tuple], list[tuple]]:
    """Rows measured in both runs with ratio = B median / A median (< 1: B is faster); keys only in A; only in B."""
    rows_a = {_key(r): r for r in a.rows if r.median_ms}
    rows_b = {_key(r): r for r in b.rows if r.median_ms}
    both = [{"impl": k[0], "device": k[1], "problem": f"{k[2]} {k[3]} {k[6]} {k[4]} {k[5]}",
             "a_ms": rows_a[k].median_ms, "b_ms": rows_b[k].median_ms,
             "a_gflops": rows_a[k].gflops, "b_gflops": rows_b[k].gflops,
             "ratio": rows_b[k].median_ms / rows_a[k].median_ms} for k in rows_a if k in rows_b]
    return both, [k for k in rows_a if k not in rows_b], [k for k in rows_b if k not in rows_a]


def render_compare(a: Report, b: Report, path_a: str, path_b: str) -> str:
    both, only_a, only_b = compare(a, b)
    lines = [f"A = {path_a}: {a.meta.get('date', '?')}, {_where(a)}",
             f"B = {path_b}: {b.meta.get('date', '?')}, {_where(b)}",
             "ratio = B median / A median (< 1: B is faster)"]
    cells = [["implementation", "problem", "A ms", "B ms", "A GFLOP/s", "B GFLOP/s", "B/A"]]
    for r in both:
        cells.append([r["impl"], r["problem"], format_sig(r["a_ms"]), format_sig(r["b_ms"]), format_sig(r["a_gflops"]),
                      format_sig(r["b_gflops"]), f"{r['ratio']:.3f}"])
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    for c in cells:
        lines.append("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths))))
    if both:
        lines.append(f"geomean B/A over {len(both)} rows: {geomean(r['ratio'] for r in both):.3f}")
    else:
        lines.append("no measured row appears in both runs")
    if only_a:
        lines.append(f"{len(only_a)} row(s) only in A, {len(only_b)} only in B")
    elif only_b:
        lines.append(f"{len(only_b)} row(s) only in B")
    return "\n".join(lines)


def _where(report: Report) -> str:
    devices = report.meta.get("devices", {})
    return ", ".join(f"{d}: {n}" for d, n in devices.items()) or "?"


# --- docs tables -------------------------------------------------------------------------------------------------

def _problem(row: Row) -> str:
    """A compact column label: `fwd N1024 causal`, `block fwd+bwd N512`, with dtype/device when not float32/cpu."""
    seq = f"N{row.q_len}" if row.q_len == row.k_len else f"N{row.q_len}x{row.k_len}"
    parts = (["block"] if row.scope == "block" else []) + [row.mode, seq]
    parts += [row.mask] if row.mask != "none" else []
    parts += [row.dtype] if row.dtype != "float32" else []
    parts += [row.device] if row.device != "cpu" else []
    if (row.batch, row.heads, row.head_dim) != (4, 8, 64):
        parts.append(f"B{row.batch} H{row.heads} D{row.head_dim}")
    return " ".join(parts)


def markdown_pivot(report: Report) -> str:
    """Implementations down, problems across; each cell `GFLOP/s (% of the measured peak)`."""
    problems = list(dict.fromkeys(_problem(r) for r in report.rows if r.status in SHOWN))
    impls = list(dict.fromkeys(r.impl for r in report.rows if r.status in SHOWN))
    cells = {(r.impl, _problem(r)): r for r in report.rows if r.status in SHOWN}
    lines = ["| implementation | " + " | ".join(problems) + " |", "|---" * (len(problems) + 1) + "|"]
    for impl in impls:
        out = []
        for problem in problems:
            row = cells.get((impl, problem))
            if row is None:
                out.append("")
            elif row.status != "ok":
                out.append(row.status.upper())
            else:
                out.append(f"{row.gflops:.3g} ({format_pct(row.pct_peak)})" if row.pct_peak is not None
                           else f"{row.gflops:.3g}")
        lines.append(f"| {impl} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def markdown_ratios(report: Report) -> str:
    """Per problem: our fastest path against the fastest built-in of the same framework (median time ratio)."""
    ratios = ratios_to_fastest_builtin(report.rows)
    by_problem: dict[str, dict[str, dict]] = {}
    for r in ratios:
        label = _problem(next(row for row in report.rows if row.impl == r["ours"] and row.shape == r["shape"]
                              and row.scope == r["scope"] and row.mode == r["mode"] and row.mask == r["mask"]
                              and row.dtype == r["dtype"] and row.device == r["device"]))
        by_problem.setdefault(label, {})[r["framework"]] = r
    lines = ["| problem | ours (torch) | fastest torch built-in | ratio | ours (TF) | fastest TF built-in | ratio |",
             "|---|---|---|---|---|---|---|"]

    def cell(r):
        if r is None:
            return ["", "", ""]
        return [f"{r['ours']} {r['ours_ms']:.3g} ms", f"{r['builtin']} {r['builtin_ms']:.3g} ms", f"{r['ratio']:.2f}"]
    for label, fw in by_problem.items():
        lines.append(f"| {label} | " + " | ".join(cell(fw.get("torch")) + cell(fw.get("tf"))) + " |")
    for framework in ("torch", "tf"):
        mine = [r["ratio"] for r in ratios if r["framework"] == framework]
        if mine:
            lines.append(f"\n{framework}: geometric mean {geomean(mine):.2f}, worst {max(mine):.2f} over {len(mine)} "
                         "problems (goal <= 1.10)")
    return "\n".join(lines)


TF_BEFORE = ("tf_impl.explicit.", "tf_impl.keras.", "keras.")  # TensorFlow's attention paths before blockwise


def markdown_tf_vs_torch(report: Report) -> str:
    """Per problem: TensorFlow's best GFLOP/s before the blockwise path and with it, as a fraction of PyTorch's best."""
    groups: dict[str, list[Row]] = {}
    for row in report.rows:
        if row.status == "ok" and row.framework in ("torch", "tf"):
            groups.setdefault(_problem(row), []).append(row)
    lines = ["| problem | PyTorch best | TF best before | fraction | tf_impl.blockwise best | fraction |",
             "|---|---|---|---|---|---|"]
    for label, rows in groups.items():
        torch_rows = [r for r in rows if r.framework == "torch"]
        before = [r for r in rows if r.impl.startswith(TF_BEFORE)]
        after = [r for r in rows if r.impl.startswith("tf_impl.blockwise.")]
        if not torch_rows or not before:
            continue
        best_torch = max(torch_rows, key=lambda r: r.gflops)
        best_before = max(before, key=lambda r: r.gflops)
        cells = [f"{best_torch.impl} {best_torch.gflops:.3g}", f"{best_before.impl} {best_before.gflops:.3g}",
                 f"{best_before.gflops / best_torch.gflops:.2f}"]
        if after:
            best_after = max(after, key=lambda r: r.gflops)
            cells += [f"{best_after.impl} {best_after.gflops:.3g}", f"{best_after.gflops / best_torch.gflops:.2f}"]
        else:
            cells += ["", ""]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(report: Report) -> str:
    """Everything docs/benchmarks.md shows for a run: header, GFLOP/s and % of peak, ratios, TF against PyTorch."""
    return "\n\n".join(["\n".join(f"- {line}" for line in header_lines(report)),
                        "GFLOP/s (% of the measured GEMM peak):\n\n" + markdown_pivot(report),
                        "Our attention against the fastest built-in of its framework (median time ratio):\n\n"
                        + markdown_ratios(report),
                        "TensorFlow's best attention against PyTorch's best, in GFLOP/s:\n\n"
                        + markdown_tf_vs_torch(report)])
