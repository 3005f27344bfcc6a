"""`transformer-parity bench model`: time the whole model (forward, a training step, greedy generation with and
without the key/value cache) in every framework and mode, from the same weights, checked while timed.

    transformer-parity bench model                       # the default grid (a few minutes on 2 cores)
    transformer-parity bench model --list                # implementation names, models, presets
    transformer-parity bench model --model base-256 --task forward,train --dtype float32 --impl 'torch*'
    transformer-parity bench model --model tiny --set d_model=64 --set num_heads=8 --batch 4 --src-len 48
    transformer-parity bench model --out-dir benchmarks/results/model-cpu
    transformer-parity bench model compare A.json B.json     # ratio of medians, row by row
    transformer-parity bench model plot A.json A.png         # tokens/s bars from a saved run
    transformer-parity bench model markdown A.json           # the docs' tables from a saved run
"""

from __future__ import annotations

import argparse
import os
import sys

OUT_NAMES = {"json": "model_bench.json", "csv": "model_bench.csv", "plot": "model_bench.png"}


def register(actions) -> argparse.ArgumentParser:
    """Add the `model` action (with its own compare / plot / markdown) to `bench`'s actions."""
    from .model import DTYPES, MODELS, PRESETS, TASKS, Options
    parser = actions.add_parser(
        "model", help="time the whole model: forward, training step, generation, in every framework and mode",
        description="Time the whole model (forward, forward+backward+Adam step, greedy generation with and without "
                    "the key/value cache) for torch_impl (eager, torch.compile), torch.nn.Transformer and tf_impl "
                    "(eager, tf.function, XLA), transformers and KerasHub where the architecture matches, from the "
                    "same weights, each output checked against the float64 reference while timed; float32 and "
                    "bfloat16. Reports ms, tokens/s, % of the measured GEMM "
                    "peak of the dtype, peak memory and the ratios ours / built-in.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="actions: `bench model compare A.json B.json`, `bench model plot A.json OUT.png`, "
               "`bench model markdown A.json`")
    parser.add_argument("--list", action="store_true", dest="model_list",
                        help="list implementations, models and presets and exit")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default", dest="model_preset",
                        help="a named grid (default: 'default'; 'paper-base': the paper's base model, batch 8, "
                             "lengths 64; 'smoke': seconds)")
    parser.add_argument("--model", dest="model_models", metavar="|".join(MODELS),
                        help="models, comma-separated (replaces the preset's)")
    parser.add_argument("--task", dest="model_tasks", metavar="|".join(TASKS), help="tasks, comma-separated")
    parser.add_argument("--dtype", dest="model_dtypes", metavar="|".join(DTYPES), help="dtypes, comma-separated")
    parser.add_argument("--impl", dest="model_impl", metavar="NAMES",
                        help="implementations by name or glob, comma-separated (default: the preset's)")
    parser.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[], dest="model_sets",
                        help="set one config field of every model (repeatable), e.g. --set d_model=128")
    for name, what in (("batch", "batch size"), ("src-len", "source length"), ("tgt-len", "target length"),
                       ("new-tokens", "tokens to generate")):
        parser.add_argument(f"--{name}", type=int, dest=f"model_{name.replace('-', '_')}", metavar="N",
                            help=f"{what} (default: the model's)")
    parser.add_argument("--threads", type=int, default=None, dest="model_threads", metavar="N",
                        help="CPU threads for every framework (default: os.cpu_count())")
    parser.add_argument("--rounds", type=int, default=Options.rounds, dest="model_rounds", metavar="N",
                        help=f"interleaved timing rounds, in orders that balance position and predecessor; a "
                             f"verdict needs 5 that both rows ran (default {Options.rounds})")
    parser.add_argument("--min-time", type=float, default=None, dest="model_min_time", metavar="S",
                        help=f"seconds of timing per row, at least, and enough for one call per round where "
                             f"--max-time allows (default {Options.min_time}, or --max-time if that is less)")
    parser.add_argument("--max-time", type=float, default=Options.max_time, dest="model_max_time", metavar="S",
                        help=f"seconds of timing per row, at most, unless --min-runs needs more (default "
                             f"{Options.max_time})")
    parser.add_argument("--min-runs", type=int, default=Options.min_runs, dest="model_min_runs", metavar="N",
                        help=f"timed calls per row, at least (default {Options.min_runs})")
    parser.add_argument("--peak-size", type=int, default=None, dest="model_peak_size", metavar="N",
                        help="N x N GEMM for the measured peak (default 2048 in float32, 1024 in bfloat16)")
    parser.add_argument("--peak-time", type=float, default=1.0, dest="model_peak_time", metavar="S",
                        help="seconds of timing for each peak GEMM; its fastest block counts (default 1.0)")
    parser.add_argument("--json", metavar="PATH", dest="model_json")
    parser.add_argument("--csv", metavar="PATH", dest="model_csv")
    parser.add_argument("--plot", metavar="PATH.png", dest="model_plot", help="tokens/s bars (needs matplotlib)")
    parser.add_argument("--out-dir", metavar="DIR", dest="model_out_dir",
                        help=f"write {', '.join(OUT_NAMES.values())} into DIR (created if needed)")
    parser.add_argument("--force", action="store_true", dest="model_force", help="overwrite existing output files")
    parser.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress lines on stderr")
    sub = parser.add_subparsers(dest="model_action", metavar="{compare,plot,markdown}")
    cmp = sub.add_parser("compare", help="ratio of medians between two saved runs (B / A)")
    cmp.add_argument("model_a", metavar="A.json")
    cmp.add_argument("model_b", metavar="B.json")
    plt = sub.add_parser("plot", help="plot a saved run")
    plt.add_argument("model_result", metavar="RESULT.json")
    plt.add_argument("model_out", metavar="OUT.png")
    plt.add_argument("--force", action="store_true", dest="model_plot_force", help="overwrite OUT.png")
    md = sub.add_parser("markdown", help="the docs' tables of a saved run")
    md.add_argument("model_result", metavar="RESULT.json")
    return parser


def _list(values: str | None, name: str, allowed) -> list[str] | None:
    if values is None:
        return None
    items = [v.strip() for v in values.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ValueError(f"--{name} takes comma-separated values from {', '.join(allowed)}, received {values!r}")
    return items


def handle(args) -> int:
    """Run `bench model` (or its compare / plot / markdown); bad input raises ValueError (exit 2 in the CLI)."""
    from . import model_report
    action = getattr(args, "model_action", None)
    if action == "compare":
        print(model_report.render_compare(_load(args.model_a), _load(args.model_b), args.model_a, args.model_b))
        return 0
    if action == "markdown":
        print(model_report.markdown(_load(args.model_result)))
        return 0
    if action == "plot":
        _png_ok(args.model_out, "plot")
        if os.path.exists(args.model_out) and not args.model_plot_force:
            raise ValueError(f"{args.model_out} exists; pass --force to overwrite it")
        model_report.plot(_load(args.model_result), args.model_out, force=args.model_plot_force)
        print(f"wrote {args.model_out}")
        return 0
    if args.model_list:
        _print_list()
        return 0
    from . import harness, model
    from .model_impls import TASKS
    threads = args.model_threads if args.model_threads is not None else (os.cpu_count() or 1)
    most = 4 * (os.cpu_count() or 1)
    if not 1 <= threads <= most:  # as `bench`: a huge count makes the frameworks' thread pools crash
        raise ValueError(f"--threads must be between 1 and {most} (4 x this machine's {os.cpu_count()} CPUs), "
                         f"received {threads}")
    if args.model_rounds < 1:
        raise ValueError(f"--rounds must be >= 1, received {args.model_rounds}")
    if args.model_min_runs < 1:
        raise ValueError(f"--min-runs must be >= 1, received {args.model_min_runs}")
    if args.model_peak_size is not None and args.model_peak_size < 1:
        raise ValueError(f"--peak-size must be >= 1, received {args.model_peak_size}")
    if not args.model_peak_time > 0:
        raise ValueError(f"--peak-time must be > 0, received {args.model_peak_time}")
    if args.model_min_time is None:  # `--max-time 1` alone asks for short rows; it contradicts no --min-time given
        args.model_min_time = min(model.Options.min_time, args.model_max_time)
    if not 0 < args.model_min_time <= args.model_max_time:
        raise ValueError(f"need 0 < --min-time <= --max-time, received {args.model_min_time} and "
                         f"{args.model_max_time}")
    shape = {}
    for name in ("batch", "src_len", "tgt_len", "new_tokens"):
        value = getattr(args, f"model_{name}")
        if value is not None:
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, received {value}")
            shape[name] = value
    overrides = {}
    if args.model_sets:
        from ..config_fields import parse_fields
        overrides = parse_fields(None, args.model_sets)
    impls = [p for p in args.model_impl.split(",") if p] if args.model_impl else None
    pairs = model.plan(args.model_preset, _list(args.model_models, "model", list(model.MODELS)),
                       _list(args.model_tasks, "task", TASKS), _list(args.model_dtypes, "dtype", model.DTYPES),
                       impls, overrides, shape)
    _check_memory(pairs)
    outputs = _outputs(args)
    progress = None if getattr(args, "quiet", False) else (
        lambda m: print(f"bench model: {m}", file=sys.stderr, flush=True))
    options = model.Options(threads=threads, min_time=args.model_min_time, max_time=args.model_max_time,
                            rounds=args.model_rounds, min_runs=args.model_min_runs,
                            peak_n=args.model_peak_size, peak_time=args.model_peak_time, progress=progress)
    result = model.run(pairs, options)
    print(model_report.render_text(result))
    writers = {"json": model_report.to_json, "csv": model_report.to_csv}
    for kind, path in outputs.items():
        if not path:
            continue
        if kind == "plot":
            model_report.plot(result, path, force=args.model_force)
        else:
            harness.write_atomic(path, writers[kind](result), force=args.model_force)
        print(f"wrote {path}", file=sys.stderr)
    flagged = [r for r in result.rows if r.check == "FLAGGED" or r.status == "error"]
    if flagged:
        print(f"{len(flagged)} row(s) flagged or failed (see the table)", file=sys.stderr)
    return 0


def _check_memory(pairs) -> None:
    """Refuse, before anything is built, a model or shape (`--set`, `--batch`, ...) that cannot fit in memory: the
    weights held by every implementation at once (float64 reference included), training state and activations."""
    from transformer_parity.io import limits

    seen = set()
    for problem, impls in pairs:
        key = (problem.config, problem.batch, problem.src_len, problem.tgt_len)
        if key in seen:
            continue
        seen.add(key)
        limits.check_run(problem.config, f"bench model --model {problem.model}", batch=problem.batch,
                         src_len=problem.src_len, tgt_len=problem.tgt_len + problem.new_tokens,
                         weight_copies=4 + len(impls), training=True)


def is_model_result(path: str) -> bool:
    """Whether `path` is a saved `bench model` run (so that the attention actions can say so)."""
    import json
    try:
        with open(path) as f:
            return json.load(f).get("kind") == "model-bench"
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def _load(path: str):
    from . import model_report
    if not os.path.isfile(path):
        raise ValueError(f"no such result file: {path}")
    return model_report.load(path)


def _png_ok(path: str, option: str) -> None:
    if not path.lower().endswith(".png"):
        raise ValueError(f"--{option} writes a PNG; give a path ending in .png, received {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"--{option}: folder {folder} does not exist")


def _outputs(args) -> dict[str, str | None]:
    import importlib.util
    outputs = {"json": args.model_json, "csv": args.model_csv, "plot": args.model_plot}
    if args.model_out_dir:
        os.makedirs(args.model_out_dir, exist_ok=True)
        for kind, name in OUT_NAMES.items():
            if outputs[kind] is None:
                outputs[kind] = os.path.join(args.model_out_dir, name)
        if not args.model_plot and importlib.util.find_spec("matplotlib") is None:
            print("bench model: matplotlib is not installed; no plot", file=sys.stderr)
            outputs["plot"] = None
    for kind, path in outputs.items():
        if not path:
            continue
        if os.path.exists(path) and not args.model_force:
            raise ValueError(f"{path} exists; pass --force to overwrite it")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"--{kind}: folder {folder} does not exist")
    if outputs["plot"]:
        _png_ok(outputs["plot"], "plot")
        if importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--plot needs matplotlib (pip install matplotlib)")
    return outputs


def _print_list() -> None:
    from .model import MODELS, PRESETS
    from .model_impls import REGISTRY
    print(f"{'implementation':22s} {'framework':9s} {'tasks':40s} {'dtypes':17s} description")
    for impl in REGISTRY.values():
        print(f"{impl.name:22s} {impl.framework:9s} {','.join(impl.tasks):40s} {','.join(impl.dtypes):17s} "
              f"{impl.summary}")
    print("\nmodels:")
    for name, spec in MODELS.items():
        c, s = spec["config"], spec["shape"]
        print(f"  {name:9s} d_model {c.get('d_model', 512)}, {c.get('num_encoder_layers', 6)}+"
              f"{c.get('num_decoder_layers', 6)} layers, vocab {c['tgt_vocab_size']}; batch {s['batch']}, lengths "
              f"{s['src_len']}/{s['tgt_len']}, {s['new_tokens']} new tokens")
    print("\npresets:")
    for name, entries in PRESETS.items():
        print(f"  {name:9s} " + "; ".join(f"{'+'.join(m)}: {','.join(t)} in {','.join(d)}"
                                          + (f" ({','.join(p)})" if p else "") for m, t, d, p in entries))
