"""The attention benchmark's `--plot PATH.png`: time or GFLOP/s against sequence length, one line per implementation,
log scales (matplotlib)."""

from __future__ import annotations

import io
import os

from .attention import Report, Row

METRICS = {"gflops": ("GFLOP/s", lambda r: r.gflops), "time": ("median time (ms)", lambda r: r.median_ms)}


def panels(rows: list[Row]) -> dict[tuple, dict[str, list[tuple[int, float, Row]]]]:
    """Square problems (Nq = Nk) grouped by everything but the length: {panel: {impl: [(length, row), ...]}}.
    Panels with two or more lengths come first; a run without a sweep still gets its points drawn."""
    out: dict[tuple, dict[str, list]] = {}
    for row in rows:
        if row.status != "ok" or row.q_len != row.k_len:
            continue
        key = (row.device, row.scope, row.mode, row.mask, row.dtype, row.batch, row.heads, row.head_dim)
        out.setdefault(key, {}).setdefault(row.impl, []).append((row.q_len, row))
    swept = {k: v for k, v in out.items() if len({n for pts in v.values() for n, _ in pts}) > 1}
    return swept or out


def plot(report: Report, path: str, metric: str = "gflops", force: bool = False) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install matplotlib), or plot later from the JSON with "
                         "`transformer-parity bench plot RESULT.json OUT.png`") from None
    if metric not in METRICS:
        raise ValueError(f"plot metric must be one of {', '.join(METRICS)}, received {metric!r}")
    label, value = METRICS[metric]
    groups = panels(report.rows)
    if not groups:
        raise ValueError("nothing to plot: the report has no measured square (Nq = Nk) rows")
    cols = min(2, len(groups))
    rows_n = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(8.6 * cols, 5.2 * rows_n), squeeze=False)
    colors = plt.get_cmap("tab20").colors
    styles = {"numpy": ":", "torch": "-", "tf": "--"}
    for ax, (key, series) in zip(axes.flat, groups.items()):
        device, scope, mode, mask, dtype, b, h, d = key
        swept = {impl: pts for impl, pts in series.items() if len(pts) > 1} or series  # lines, not lone points
        for i, (impl, points) in enumerate(sorted(swept.items())):
            points.sort(key=lambda p: p[0])
            framework = points[0][1].framework
            ax.plot([n for n, _ in points], [value(r) for _, r in points], marker="o", markersize=4,
                    linestyle=styles.get(framework, "-"), color=colors[i % len(colors)], label=impl)
        peak = next((r.peak_gflops for pts in series.values() for _, r in pts if r.peak_gflops), None)
        if metric == "gflops" and peak:
            ax.axhline(peak, color="grey", linestyle="--", linewidth=1, label=f"measured GEMM peak {peak:.0f}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (Nq = Nk)")
        ax.set_ylabel(label)
        ax.set_title(f"{scope} {mode}, {mask} mask, {dtype} on {device}\nB{b} H{h} D{d}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    names = report.meta.get("devices", {})
    fig.suptitle(f"attention benchmark, {', '.join(f'{k}: {v}' for k, v in names.items())}, "
                 f"{report.meta.get('date', '')[:10]}", fontsize=11)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    from .harness import write_atomic
    write_atomic(path, buffer.getvalue(), force=force)


def default_path_ok(path: str) -> None:
    if not path.lower().endswith(".png"):
        raise ValueError(f"--plot writes a PNG; give a path ending in .png, received {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"--plot: folder {folder} does not exist")
