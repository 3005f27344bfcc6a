"""Showing and saving whole-model benchmark reports: the terminal table, JSON, CSV, the plot, the ratios (ours
against the built-ins, across frameworks, bfloat16 against float32) as Markdown, and `compare`."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import statistics
from typing import Any, Iterable

from .harness import finite_for_json, format_err, format_pct, format_sig, write_atomic
from .model import ModelReport, ModelRow

__all__ = ["to_json", "to_csv", "load", "render_text", "markdown", "ratios", "render_compare", "plot"]


# --- files ------------------------------------------------------------------------------------------------------------

def to_json(report: ModelReport) -> bytes:
    data = report.to_json_dict()
    data["ratios"] = ratios(report.rows)
    return (json.dumps(finite_for_json(data), indent=1, allow_nan=False) + "\n").encode()


def to_csv(report: ModelReport) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[f.name for f in dataclasses.fields(ModelRow)], lineterminator="\n")
    writer.writeheader()
    for row in report.rows:
        writer.writerow({k: ("" if v is None else " ".join(f"{x:.6g}" for x in v) if isinstance(v, list) else v)
                         for k, v in dataclasses.asdict(row).items()})
    return out.getvalue().encode()


def load(path: str) -> ModelReport:
    try:
        with open(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path} nests JSON too deeply to be a bench result") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return ModelReport.from_json_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ValueError(f"{path} is not a whole-model bench result ({type(exc).__name__}: {exc})") from None


# --- the table ----------------------------------------------------------------------------------------------------

COLUMNS = ("implementation", "median ms", "IQR ms", "runs", "tokens/s", "GFLOP/s", "% peak", "mem MiB",
           "1st call ms", "max err", "check")


def _problem(row: ModelRow) -> str:
    decoder_only = row.layers.startswith("0+")
    if row.task.startswith("generate"):
        shape = f"B{row.batch} {'prompt' if decoder_only else 'S'}{row.src_len} +{row.new_tokens} tokens"
    else:
        shape = f"B{row.batch} T{row.tgt_len}" if decoder_only else f"B{row.batch} S{row.src_len} T{row.tgt_len}"
    return f"{row.model} (d{row.d_model}, {row.layers} layers, V{row.vocab}) {shape}: {row.task}, {row.dtype}"


def sections(rows: Iterable[ModelRow]) -> dict[str, list[ModelRow]]:
    out: dict[str, list[ModelRow]] = {}
    for row in rows:
        out.setdefault(_problem(row), []).append(row)
    return out


def _cells(row: ModelRow) -> list[str]:
    if row.status != "ok":
        return [row.impl, row.status.upper(), "", "", "", "", "", "", "", "", row.note[:70]]
    return [row.impl, format_sig(row.median_ms), format_sig(row.iqr_ms, 2), str(row.runs),
            format_sig(row.tokens_per_s), format_sig(row.gflops), format_pct(row.pct_peak),
            format_sig(row.peak_mem_mib), format_sig(row.first_call_ms), format_err(row.max_abs_err),
            row.check + (f" {row.note}" if row.note else "")]


def render_text(report: ModelReport) -> str:
    lines = [f"whole-model benchmark, {report.meta.get('cpu', '')} ({report.meta.get('cpu_flags', '')}), "
             f"{report.meta.get('threads')} threads, {report.meta.get('date', '')}"]
    for peak in report.peaks:
        lines.append(f"measured GEMM peak, {peak['dtype']}: {format_sig(peak.get('gflops'))} GFLOP/s (n={peak['n']}, "
                     f"by {peak.get('by', '')}; all: {peak.get('all', {})})")
    for title, rows in sections(report.rows).items():
        lines += ["", title]
        table = [list(COLUMNS)] + [_cells(r) for r in rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS) - 1)]
        for cells in table:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
                         + "  " + cells[-1])
    lines += ["", "ratios (speed = their median / our median; > 1 means ours is faster):"]
    for r in ratios(report.rows):
        judged = f" ({verdict(r)})" if r["goal"] is not None else ""
        lines.append(f"  {r['kind']}: {r['what']}: {r['ours']} {format_sig(r['ours_ms'])} ms vs {r['theirs']} "
                     f"{format_sig(r['theirs_ms'])} ms -> {r['speed']:.2f}x{judged}")
    return "\n".join(lines)


# --- ratios -------------------------------------------------------------------------------------------------------

def _groups(rows: Iterable[ModelRow]) -> dict[tuple, dict[str, ModelRow]]:
    out: dict[tuple, dict[str, ModelRow]] = {}
    for row in rows:
        if row.status == "ok" and row.median_ms:
            key = (row.model, row.batch, row.src_len, row.tgt_len, row.new_tokens, row.task, row.dtype)
            out.setdefault(key, {})[row.impl] = row
    return out


def _what(key: tuple) -> str:
    model, b, s, t, n, task, dtype = key
    return f"{model} {task} {dtype}"


def ratios(rows: list[ModelRow]) -> list[dict[str, Any]]:
    """The comparisons the benchmark is for, each `speed = their median / our median` (>= 1.0: ours is as fast):
    torch_impl (eager, and its best mode) vs torch.nn.Transformer; tf_impl compiled (best of tf.function and XLA) vs
    KerasHub where such rows exist; bfloat16 vs float32 per implementation (`speed` = float32 / bfloat16 median)."""
    out = []
    groups = _groups(rows)
    for key, impls in groups.items():
        pairs = []
        if "torch.nn.Transformer" in impls:
            torch_ours = {k: v for k, v in impls.items() if k.startswith("torch_impl.")}
            if "torch_impl.eager" in torch_ours:
                pairs.append(("torch_impl vs nn.Transformer", impls["torch_impl.eager"], impls["torch.nn.Transformer"]))
            best = min(torch_ours.values(), key=lambda r: r.median_ms) if torch_ours else None
            if best is not None and best.impl != "torch_impl.eager":
                pairs.append(("torch_impl best vs nn.Transformer", best, impls["torch.nn.Transformer"]))
        if "transformers" in impls:
            torch_ours = {k: v for k, v in impls.items() if k.startswith("torch_impl.")}
            if torch_ours:
                pairs.append(("torch_impl vs transformers", min(torch_ours.values(), key=lambda r: r.median_ms),
                              impls["transformers"]))
        keras_hub = [r for k, r in impls.items() if k.startswith("keras_hub.")]
        tf_compiled = [r for k, r in impls.items() if k in ("tf_impl.function", "tf_impl.xla")]
        if keras_hub and tf_compiled:
            pairs.append(("tf_impl compiled vs KerasHub", min(tf_compiled, key=lambda r: r.median_ms),
                          min(keras_hub, key=lambda r: r.median_ms)))
        for kind, ours, theirs in pairs:
            out.append({"kind": kind, "what": _what(key), "ours": ours.impl, "ours_ms": ours.median_ms,
                        "theirs": theirs.impl, "theirs_ms": theirs.median_ms,
                        "speed": theirs.median_ms / ours.median_ms, "goal": 1.0, "noise": _noise(ours, theirs),
                        "runs": [ours.runs, theirs.runs],
                        "rounds": min(len(ours.round_ms or []), len(theirs.round_ms or []))})
    for key, impls in groups.items():
        if key[-1] != "bfloat16":
            continue
        f32 = groups.get(key[:-1] + ("float32",), {})
        for name, bf16 in impls.items():
            if name in f32:
                out.append({"kind": "bfloat16 vs float32", "what": _what(key[:-1] + ("",)).strip(), "ours": name,
                            "ours_ms": bf16.median_ms, "theirs": f"{name} float32", "theirs_ms": f32[name].median_ms,
                            "speed": f32[name].median_ms / bf16.median_ms, "goal": None})
    return out


def _noise(ours: ModelRow, theirs: ModelRow) -> float | None:
    """Half-width of a 95% interval of `speed`, relative, from the rounds both rows ran: the rounds interleave one
    framework's implementations, so round r of each row was timed within a second or two of the other's, and the
    log of their ratio, round by round, cancels the host's drift between rounds. The interval is Student's t on the
    mean of those logs. None below two paired rounds.

    The unit is the round, not the run: a shared host's speed drifts over seconds, so the runs of one round are not
    independent draws. Counted per run (each median's standard error from its IQR over sqrt(runs)), the default
    grid's gpt2-256 forward, repeated in one process, gave a band of +-5% around ratios that themselves ranged over
    0.93-1.09x (docs/model-bench.md)."""
    a, b = ours.round_ms or [], theirs.round_ms or []
    paired = min(len(a), len(b))
    if paired < 2 or not all(x > 0 for x in a[:paired] + b[:paired]):
        return None
    logs = [math.log(b[r] / a[r]) for r in range(paired)]
    return math.expm1(t95(paired - 1) * statistics.stdev(logs) / math.sqrt(paired))


# Two-sided 95% quantiles of Student's t for 1-9 degrees of freedom; from 10 on, the Cornish-Fisher expansion
# around the normal quantile is within 0.2% of the exact value.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)


def t95(df: int) -> float:
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


# Fewer paired rounds than this and a ratio is not judged: with 5 rounds (the default grid's) the interval's t is
# 2.78 and its spread estimate has 4 degrees of freedom; below that a single odd round decides the verdict.
MIN_JUDGED_ROUNDS = 5


def verdict(ratio: dict[str, Any]) -> str:
    """`met`, `NOT met`, `tie (+-x%)` when the goal lies within the ratio's noise (`_noise`), or `too few rounds`
    when the two rows share fewer than MIN_JUDGED_ROUNDS timing rounds (or a result file has no rounds)."""
    if ratio["goal"] is None:
        return ""
    rounds = ratio.get("rounds") or 0
    if not rounds:
        return "not judged (no per-round times in this result)"
    if rounds < MIN_JUDGED_ROUNDS:
        return f"too few rounds to judge ({rounds}; needs {MIN_JUDGED_ROUNDS})"
    noise = ratio.get("noise")
    if noise is not None and abs(ratio["speed"] - ratio["goal"]) <= noise * ratio["speed"]:
        return f"tie (+-{100 * noise:.0f}%)"
    return "met" if ratio["speed"] >= ratio["goal"] else "NOT met"


# --- Markdown -------------------------------------------------------------------------------------------------------

def markdown(report: ModelReport) -> str:
    """The docs' tables: every problem (ms, tokens/s, % of peak, memory, error), the cross-framework table and the
    ratios."""
    parts = [_md_rows(report), _md_cross(report), _md_ratios(report)]
    return "\n\n".join(p for p in parts if p)


def _md_rows(report: ModelReport) -> str:
    lines = []
    for title, rows in sections(report.rows).items():
        lines += [f"**{title}**", "",
                  "| implementation | median ms (IQR) | tokens/s | GFLOP/s | % peak | mem MiB | 1st call ms "
                  "| compile s | max err | check |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            if r.status != "ok":
                lines.append(f"| {r.impl} | {r.status} | | | | | | | | {r.note} |")
                continue
            lines.append(f"| {r.impl} | {format_sig(r.median_ms)} ({format_sig(r.iqr_ms, 2)}) "
                         f"| {format_sig(r.tokens_per_s)} | {format_sig(r.gflops)} | {format_pct(r.pct_peak)} "
                         f"| {format_sig(r.peak_mem_mib)} | {format_sig(r.first_call_ms)} | {format_sig(r.compile_s)} "
                         f"| {format_err(r.max_abs_err)} | {r.check}{' ' + r.note if r.note else ''} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def _md_cross(report: ModelReport) -> str:
    """Median ms per implementation (rows) and problem (columns), one table per model and dtype."""
    groups = _groups(report.rows)
    out = []
    for model, dtype in dict.fromkeys((k[0], k[-1]) for k in groups):
        keys = [k for k in groups if k[0] == model and k[-1] == dtype]
        impls = list(dict.fromkeys(name for k in keys for name in groups[k]))
        lines = [f"**{model}, {dtype}: median ms (x = speed relative to torch_impl.eager)**", "",
                 "| implementation | " + " | ".join(k[5] for k in keys) + " |",
                 "|---|" + "---:|" * len(keys)]
        for name in impls:
            cells = []
            for k in keys:
                row, base = groups[k].get(name), groups[k].get("torch_impl.eager")
                if row is None:
                    cells.append("")
                else:
                    speed = f" ({base.median_ms / row.median_ms:.2f}x)" if base else ""
                    cells.append(f"{format_sig(row.median_ms)}{speed}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _md_ratios(report: ModelReport) -> str:
    rs = ratios(report.rows)
    if not rs:
        return ""
    lines = ["| comparison | problem | ours | ms | theirs | ms | speed | goal |",
             "|---|---|---|---:|---|---:|---:|---|"]
    for r in rs:
        goal = "" if r["goal"] is None else f">= 1.0: {verdict(r)}"
        lines.append(f"| {r['kind']} | {r['what']} | {r['ours']} | {format_sig(r['ours_ms'])} | {r['theirs']} | "
                     f"{format_sig(r['theirs_ms'])} | {r['speed']:.2f}x | {goal} |")
    return "\n".join(lines)


# --- compare --------------------------------------------------------------------------------------------------------

def _key(row: ModelRow) -> tuple:
    return (row.impl, row.model, row.task, row.dtype, row.batch, row.src_len, row.tgt_len, row.new_tokens)


def render_compare(a: ModelReport, b: ModelReport, path_a: str, path_b: str) -> str:
    """Ratio of medians B / A for every row measured in both runs (< 1: B is faster)."""
    rows_a = {_key(r): r for r in a.rows if r.median_ms}
    rows_b = {_key(r): r for r in b.rows if r.median_ms}
    common = [k for k in rows_a if k in rows_b]
    lines = [f"A: {path_a} ({a.meta.get('cpu', '')}, {a.meta.get('date', '')})",
             f"B: {path_b} ({b.meta.get('cpu', '')}, {b.meta.get('date', '')})",
             f"{'implementation':22s} {'model':9s} {'task':17s} {'dtype':9s} {'A ms':>10s} {'B ms':>10s} {'B/A':>7s}"]
    for k in common:
        ra, rb = rows_a[k], rows_b[k]
        lines.append(f"{k[0]:22s} {k[1]:9s} {k[2]:17s} {k[3]:9s} {format_sig(ra.median_ms):>10s} "
                     f"{format_sig(rb.median_ms):>10s} {rb.median_ms / ra.median_ms:7.3f}")
    only_a, only_b = len(set(rows_a) - set(common)), len(set(rows_b) - set(common))
    if not common:
        lines.append("no row was measured in both runs")
    if only_a or only_b:
        lines.append(f"({only_a} row(s) only in A, {only_b} only in B)")
    return "\n".join(lines)


# --- the plot -----------------------------------------------------------------------------------------------------

def value_axis(values: Iterable[float]) -> tuple[str, tuple[float, float]]:
    """The y axis for one panel of bars: linear from 0 unless the bars span more than 10x, then log over whole
    decades. A log axis autoscaled to close values starts just below the smallest bar, which draws a 0.2% difference
    as a bar several times the other's height."""
    shown = [v for v in values if v > 0]
    low, high = min(shown), max(shown)
    if high <= 10 * low:
        return "linear", (0.0, high * 1.12)
    return "log", (10.0 ** math.floor(math.log10(low)), 10.0 ** math.ceil(math.log10(high * 1.5)))


def plot(report: ModelReport, path: str, force: bool = False) -> None:
    """tokens/s per implementation, one panel per model and task, float32 and bfloat16 bars side by side."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install matplotlib), or plot later from the JSON with "
                         "`transformer-parity bench model plot RESULT.json OUT.png`") from None
    panels: dict[tuple, dict[str, dict[str, float]]] = {}
    for row in report.rows:
        if row.status == "ok" and row.tokens_per_s:
            panels.setdefault((row.model, row.task), {}).setdefault(row.impl, {})[row.dtype] = row.tokens_per_s
    if not panels:
        raise ValueError("nothing to plot: the report has no measured rows")
    cols = min(4, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 4.2 * nrows), squeeze=False)
    dtypes = [d for d in ("float32", "bfloat16") if any(d in v for p in panels.values() for v in p.values())]
    colors = {"float32": "#4878d0", "bfloat16": "#ee854a"}
    for ax, ((model, task), impls) in zip(axes.flat, panels.items()):
        names = list(impls)
        width = 0.8 / len(dtypes)
        for j, dtype in enumerate(dtypes):
            xs = [i + (j - (len(dtypes) - 1) / 2) * width for i in range(len(names))]
            heights = [impls[n].get(dtype, 0) for n in names]
            if not any(heights):
                continue
            bars = ax.bar(xs, heights, width, label=dtype, color=colors.get(dtype))
            ax.bar_label(bars, labels=[format_sig(h) if h else "" for h in heights], fontsize=6, padding=1)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=7)
        scale, limits = value_axis(v for per_dtype in impls.values() for v in per_dtype.values())
        ax.set_yscale(scale)
        ax.set_ylim(*limits)
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{model}: {task}", fontsize=10)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"whole-model benchmark, {report.meta.get('cpu', '')}, {report.meta.get('threads')} threads, "
                 f"{report.meta.get('date', '')[:10]}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buffer.getvalue(), force=force)
