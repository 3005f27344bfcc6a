"""Pictures (matplotlib, PNG): positional encodings, attention maps per layer and head (and the difference between
two backends), and loss curves of training runs. Every figure is written atomically; nothing is overwritten
unless asked. matplotlib is imported inside the functions (Agg backend, no display needed)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

import reference_numpy as rn
from reference_numpy.config import SINUSOID_LAYOUTS

from .io import guards, outputs
from .errors import UsageError


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_output(path: str | Path, force: bool) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise UsageError(f"plots are written as PNG; give a path ending in .png, received {str(path)!r}")
    if not path.parent.exists():
        raise UsageError(f"no such directory: {path.parent}")
    return guards.check_output(path, force)  # and no FIFO, device or symbolic link, even with --force


def _save(fig, path: Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    with outputs.atomic_path(path, force=True) as tmp:  # check_output has refused an existing file without --force
        tmp.write_bytes(buffer.getvalue())
    return path


def plot_positional(path: str | Path, d_model: int = 64, length: int = 64, force: bool = False) -> Path:
    """The sinusoidal position table as a heatmap over position and dimension, both layouts side by side."""
    path = check_output(path, force)
    if d_model < 2 or d_model % 2 or length < 1:
        raise UsageError(f"need an even d_model >= 2 and length >= 1, received d_model={d_model}, length={length}")
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, layout in zip(axes, SINUSOID_LAYOUTS):
        table = rn.sinusoidal_positions(length, d_model, layout)  # (L, D)
        image = ax.imshow(table, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
        ax.set_title({"interleaved": "interleaved sin/cos (the paper)",
                      "concatenated": "concatenated [sin | cos] (tensor2tensor)"}[layout])
        ax.set_xlabel("dimension")
    axes[0].set_ylabel("position")
    fig.colorbar(image, ax=axes, shrink=0.85)
    fig.suptitle(f"sinusoidal positional encoding, d_model={d_model}, {length} positions")
    return _save(fig, path)


def attention_maps(framework: str, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray],
                   src: np.ndarray, tgt: np.ndarray | None, dtype: str = "float64") -> dict[str, np.ndarray]:
    """`{sublayer name: (H, Tq, Tk)}` attention weights of the first sequence, from one backend's trace."""
    from . import backends

    traced = backends.get(framework).trace(config, weights, dtype, src, tgt, attention_weights=True)
    return {name[:-len(".weights")]: np.asarray(value[0], dtype=np.float64)
            for name, value in traced.items() if name.endswith(".weights")}


def plot_attention(path: str | Path, maps: Mapping[str, np.ndarray], title: str, force: bool = False,
                   difference: bool = False, src_tokens: Sequence[str] | None = None,
                   tgt_tokens: Sequence[str] | None = None) -> Path:
    """One row per attention sublayer, one column per head. `difference`: the maps are differences between two
    backends (a diverging colour scale centred on 0, the largest |difference| in the title)."""
    path = check_output(path, force)
    if not maps:
        raise UsageError("no attention maps to plot")
    plt = _pyplot()
    names = list(maps)
    heads = next(iter(maps.values())).shape[0]
    fig, axes = plt.subplots(len(names), heads, figsize=(2.4 * heads + 1, 2.3 * len(names)), squeeze=False)
    limit = max(float(np.abs(m).max()) for m in maps.values()) if difference else 1.0
    for row, name in enumerate(names):
        for head in range(heads):
            ax = axes[row, head]
            if difference:
                image = ax.imshow(maps[name][head], cmap="RdBu_r", vmin=-limit or -1, vmax=limit or 1,
                                  interpolation="nearest")
            else:
                image = ax.imshow(maps[name][head], cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"head {head}", fontsize=9)
            if head == 0:
                ax.set_ylabel(name.replace(".layers.", " ").replace("_attn", ""), fontsize=8)
            queries = src_tokens if name.startswith("encoder") else tgt_tokens
            keys = src_tokens if name.startswith("encoder") or name.endswith("cross_attn") else tgt_tokens
            if keys is not None and row == len(names) - 1 and len(keys) == maps[name].shape[-1]:
                ax.set_xticks(range(len(keys)), keys, fontsize=6, rotation=90)
            if queries is not None and head == 0 and len(queries) == maps[name].shape[-2] and len(queries) <= 24:
                ax.set_yticks(range(len(queries)), queries, fontsize=6)
    fig.colorbar(image, ax=axes, shrink=0.6)
    fig.suptitle(f"{title}" + (f" (max |difference| {limit:.2e})" if difference else ""))
    return _save(fig, path)


def plot_loss_curves(path: str | Path, logs: Sequence[tuple[str, dict]], force: bool = False) -> Path:
    """Training loss of one or more runs on one chart (log scale), their token accuracy, and, for two runs, the
    relative difference of their losses step by step (relative to the first run's)."""
    path = check_output(path, force)
    if not logs:
        raise UsageError("give at least one training log")
    plt = _pyplot()
    panels = 3 if len(logs) == 2 else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2))
    for label, log in logs:
        loss = np.asarray(log["loss"], dtype=np.float64).reshape(-1, 3)  # (N, [step, loss, lr])
        axes[0].plot(loss[:, 0], loss[:, 1], label=label, linewidth=1.0, alpha=0.85)
        if log["eval"]:
            steps = [e["step"] for e in log["eval"]]
            axes[1].plot(steps, [100 * e["token_accuracy"] for e in log["eval"]], marker="o", markersize=3,
                         label=f"{label} token")
            axes[1].plot(steps, [100 * e["sequence_accuracy"] for e in log["eval"]], marker="s", markersize=3,
                         linestyle="--", label=f"{label} sequence")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss (token cross-entropy)")
    axes[0].legend()
    axes[0].set_title("loss")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("accuracy on the held-out batch (%)")
    axes[1].set_ylim(0, 101)
    axes[1].legend(fontsize=8)
    axes[1].set_title("accuracy (teacher forcing)")
    if panels == 3:
        (label_a, log_a), (label_b, log_b) = logs
        a = {int(s): v for s, v, _ in log_a["loss"]}
        b = {int(s): v for s, v, _ in log_b["loss"]}
        steps = sorted(set(a) & set(b))
        rel = np.array([abs(b[s] - a[s]) / abs(a[s]) for s in steps])
        axes[2].loglog(steps, np.maximum(rel, 1e-12), linewidth=0.8)  # log steps: the early agreement shows
        axes[2].axhline(1e-3, color="gray", linestyle=":", label="1e-3")
        axes[2].axvline(100, color="gray", linestyle="--", linewidth=0.8, label="step 100")
        axes[2].set_xlabel("step (log scale)")
        axes[2].set_ylabel(f"|loss {label_b} - loss {label_a}| / loss {label_a}  (0 drawn at 1e-12)")
        axes[2].set_title("relative loss difference per step")
        axes[2].legend()
    fig.tight_layout()
    return _save(fig, path)
