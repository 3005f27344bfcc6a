"""Measure the foundation's acceptance case and print the table docs/contract.md shows.

Base preset, seed 0, batch 2, source length 37 and target length 29 with padding in both: the max abs error of the
logits and of every sublayer output, for each backend and dtype, against the float64 NumPy reference.

    python -m benchmarks.base_parity [--preset base] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import reference_numpy as rn


def _torch_trace(config, weights, dtype, src, tgt):
    import torch
    import torch_impl

    model = torch_impl.Transformer.from_reference(config, weights, dtype=getattr(torch, dtype))
    with torch.no_grad():
        return {k: v.numpy() for k, v in model.trace(src, tgt).items()}


def _tf_trace(config, weights, dtype, src, tgt):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tf_impl

    model = tf_impl.Transformer.from_reference(config, weights, dtype=dtype)
    return {k: np.asarray(v) for k, v in model.trace(src, tgt).items()}


def _numpy_trace(config, weights, dtype, src, tgt):
    return rn.Transformer(config, weights, dtype).trace(src, tgt)


BACKENDS = {"numpy": _numpy_trace, "torch": _torch_trace, "tf": _tf_trace}


def measure(preset: str = "base", seed: int = 0, batch: int = 2, src_len: int = 37, tgt_len: int = 29) -> list[dict]:
    config = rn.TransformerConfig.preset(preset)
    weights = rn.init_weights(config, seed)
    src, tgt = rn.sample_batch(config, batch, src_len, tgt_len, seed)
    desired = rn.Transformer(config, weights).trace(src, tgt)
    rows = []
    for backend, trace in BACKENDS.items():
        for dtype in ("float32", "float64"):
            if backend == "numpy" and dtype == "float64":
                continue  # that is the reference itself
            trace(config, weights, dtype, src[:1, :1], None if tgt is None else tgt[:1, :1])  # imports, warm-up
            start = time.perf_counter()
            actual = trace(config, weights, dtype, src, tgt)
            seconds = time.perf_counter() - start
            errors = {name: float(np.abs(actual[name] - desired[name]).max()) for name in desired}
            worst = max(errors, key=errors.get)
            rows.append({"backend": backend, "dtype": dtype, "logits": errors["logits"], "worst": errors[worst],
                         "worst_sublayer": worst, "sublayers": len(errors), "seconds": seconds})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", choices=list(rn.PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (as in docs/contract.md)")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    columns = ("backend", "dtype", "logits", "worst sublayer", "which sublayer", "sublayers", "build+trace s")
    rows = [(r["backend"], r["dtype"], f"{r['logits']:.2e}", f"{r['worst']:.2e}", r["worst_sublayer"],
             str(r["sublayers"]), f"{r['seconds']:.1f}") for r in measure(args.preset, args.seed)]
    title = f"{args.preset} preset, seed {args.seed}, batch 2, lengths 37/29: max abs error vs float64 NumPy"
    if args.markdown:
        print(f"{title}\n\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
        print("\n".join("| " + " | ".join(row) + " |" for row in rows))
        return 0
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column in ("backend", "dtype", "which sublayer") else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=max(Console().width, 120)).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
