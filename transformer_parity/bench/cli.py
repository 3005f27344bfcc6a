"""`transformer-parity bench`: time every attention implementation on a grid and report (also `python -m
transformer_parity.bench.cli`).

    transformer-parity bench                          # the default CPU grid (about two minutes on 2 cores)
    transformer-parity bench --list                   # implementation names
    transformer-parity bench --impl 'torch*' --seq 256,1024 --mask none,causal --json a.json --csv a.csv --plot a.png
    transformer-parity bench --preset gpu --out-dir benchmarks/results/h100
    transformer-parity bench compare A.json B.json    # ratio of medians, row by row
    transformer-parity bench plot A.json A.png        # the plot from a saved run
    transformer-parity bench markdown A.json          # the docs tables from a saved run
    transformer-parity bench model                    # the whole model, every framework (see model_cli.py)

PyTorch and TensorFlow are imported only when a benchmark runs.
"""

from __future__ import annotations

import argparse
import os
import sys

GRID_DEFAULTS = {"batch": [4], "heads": [8], "seq": [1024], "head_dim": [64], "dtype": ["float32"],
                 "mask": ["none"], "mode": ["fwd"], "scope": ["kernel"]}
OUT_NAMES = {"json": "attention_bench.json", "csv": "attention_bench.csv", "plot": "attention_bench.png"}


def _usage_error(message: str) -> Exception:
    from ..errors import UsageError
    return UsageError(message)


def _ints(name: str):
    def parse(text: str) -> list[int]:
        values = []
        for part in text.split(","):
            try:
                value = int(part)
            except ValueError:
                raise ValueError(f"--{name} takes comma-separated positive integers, received "
                                                 f"{part!r}") from None
            if value < 1:
                raise ValueError(f"--{name} values must be >= 1, received {value}")
            values.append(value)
        return values
    return parse


def _choices(name: str, allowed):
    def parse(text: str) -> list[str]:
        values = [p.strip() for p in text.split(",") if p.strip()]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ValueError(f"--{name} takes comma-separated values from {', '.join(allowed)}, "
                                             f"received {text!r}")
        return values
    return parse


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `bench` subcommand (with its `compare` and `plot` actions) to a CLI's subparsers."""
    from .attention import DTYPES, MASKS, MODES, PRESETS, SCOPES
    parser = subparsers.add_parser(
        "bench", help="time attention implementations (NumPy, PyTorch, TensorFlow/Keras) on a grid",
        description="Time every attention implementation on a grid of shapes, dtypes, masks and devices; report "
                    "median time, GFLOP/s, %% of the measured GEMM peak, memory, first-call time and the error "
                    "against the float64 NumPy reference. Grid options are comma-separated lists; giving any of "
                    "them replaces the preset by their product (unset axes: batch 4, heads 8, seq 1024, head-dim "
                    "64, float32, no mask, fwd, kernel).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="actions: `bench compare A.json B.json` (ratio of two saved runs), `bench plot A.json OUT.png`, "
               "`bench markdown A.json` (the docs tables)")
    parser.add_argument("--list", action="store_true", help="list implementation names and exit")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="a named grid (default: 'default', the CPU grid; 'gpu' for a CUDA sweep)")
    parser.add_argument("--impl", type=lambda t: [p for p in t.split(",") if p], default=None,
                        metavar="NAMES", help="implementations by name or glob, comma-separated (default: all)")
    parser.add_argument("--batch", metavar="B[,B...]")
    parser.add_argument("--heads", metavar="H[,H...]")
    parser.add_argument("--seq", metavar="N[,N...]", help="query (and key) lengths")
    parser.add_argument("--kv-len", metavar="N[,N...]",
                        help="key/value lengths, when they differ from --seq (cross-attention)")
    parser.add_argument("--head-dim", metavar="D[,D...]")
    parser.add_argument("--dtype", metavar="|".join(DTYPES))
    parser.add_argument("--mask", metavar="|".join(MASKS))
    parser.add_argument("--mode", metavar="|".join(MODES))
    parser.add_argument("--scope", metavar="|".join(SCOPES))
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default=None,
                        help="cpu (default), cuda, or every device present")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for every framework (default: os.cpu_count())")
    parser.add_argument("--min-time", type=float, default=0.15, help="seconds of timing per row, at least")
    parser.add_argument("--max-time", type=float, default=0.75, help="seconds of timing per row, at most")
    parser.add_argument("--row-budget", type=float, default=60.0, metavar="SECONDS",
                        help="skip rows that would surely take longer (one call at the measured GEMM peak, x3; "
                             "default 60)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved timing rounds over a problem's implementations (default 5)")
    parser.add_argument("--peak-size", type=int, default=None, metavar="N",
                        help="N x N GEMM for the measured peak (default: 2048 on the CPU, 8192 on CUDA)")
    parser.add_argument("--no-kernel-names", action="store_true",
                        help="skip the profiler call that names the PyTorch kernel that ran")
    parser.add_argument("--json", metavar="PATH", help="write every row and the header as JSON")
    parser.add_argument("--csv", metavar="PATH", help="write every row as CSV")
    parser.add_argument("--plot", metavar="PATH.png", help="plot against sequence length (needs matplotlib)")
    parser.add_argument("--plot-metric", choices=("gflops", "time"), default="gflops")
    parser.add_argument("--out-dir", metavar="DIR",
                        help=f"write {', '.join(OUT_NAMES.values())} into DIR (created if needed; the plot only if "
                             "matplotlib is installed)")
    parser.add_argument("--force", action="store_true", help="overwrite existing output files")
    parser.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress lines on stderr")
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of an error instead of one line")
    actions = parser.add_subparsers(dest="bench_action", metavar="{compare,plot,markdown,model}")
    cmp = actions.add_parser("compare", help="ratio of medians between two saved runs (B / A)")
    cmp.add_argument("a", metavar="A.json")
    cmp.add_argument("b", metavar="B.json")
    plt = actions.add_parser("plot", help="plot a saved run")
    plt.add_argument("result", metavar="RESULT.json")
    plt.add_argument("out", metavar="OUT.png")
    plt.add_argument("--metric", choices=("gflops", "time"), default="gflops")
    plt.add_argument("--force", action="store_true", help="overwrite OUT.png")
    md = actions.add_parser("markdown", help="the docs tables (GFLOP/s and %% of peak, ratios) of a saved run")
    md.add_argument("result", metavar="RESULT.json")
    from .model_cli import register as register_model
    register_model(actions)
    parser.set_defaults(func=handler)
    return parser


def handler(args) -> int:
    """Run `bench` (or its compare / plot action); returns the exit status. Bad input raises UsageError."""
    try:
        return _handle(args)
    except (ValueError, FileExistsError) as exc:
        if type(exc).__name__ == "UsageError":
            raise
        raise _usage_error(str(exc)) from None


def _handle(args) -> int:
    from . import attention_impls, attention_report as report
    action = getattr(args, "bench_action", None)
    if action == "model":
        from . import model_cli
        return model_cli.handle(args)
    if action == "compare":
        a, b = (_load(path) for path in (args.a, args.b))
        print(report.render_compare(a, b, args.a, args.b))
        return 0
    if action == "markdown":
        print(report.markdown(_load(args.result)))
        return 0
    if action == "plot":
        from . import attention_plot as plot
        plot.default_path_ok(args.out)
        plot.plot(_load(args.result), args.out, args.metric, force=args.force)
        print(f"wrote {args.out}")
        return 0
    if args.list:
        _print_list(attention_impls)
        return 0
    plan, threads = _plan(args, attention_impls)
    outputs = _outputs(args)
    from . import attention, harness
    options = attention.Options(threads=threads, min_time=args.min_time, max_time=args.max_time,
                                profile_kernels=not args.no_kernel_names, peak_n=args.peak_size, rounds=args.rounds,
                                row_budget=args.row_budget,
                                progress=None if getattr(args, "quiet", False) else _progress(len(plan)))
    result = attention.run(plan, options)
    report.render(result)
    if outputs.get("json"):
        harness.write_atomic(outputs["json"], report.to_json(result), force=args.force)
    if outputs.get("csv"):
        harness.write_atomic(outputs["csv"], report.to_csv(result), force=args.force)
    if outputs.get("plot"):
        from . import attention_plot as plot
        plot.plot(result, outputs["plot"], args.plot_metric, force=args.force)
    for kind, path in outputs.items():
        if path:
            print(f"wrote {path}", file=sys.stderr)
    bad = [r for r in result.rows if r.status == "error"]
    if bad:
        print(f"{len(bad)} row(s) failed with an error (see the table)", file=sys.stderr)
    return 0


def _load(path: str):
    from . import attention_report as report
    if not os.path.isfile(path):
        raise ValueError(f"no such result file: {path}")
    from .model_cli import is_model_result
    if is_model_result(path):
        raise ValueError(f"{path} is a whole-model result; use `bench model compare|plot|markdown`")
    try:
        return report.load(path)
    except RecursionError:
        raise ValueError(f"{path} nests JSON too deeply to be a bench result") from None
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ValueError(f"{path} is not a bench result ({type(exc).__name__}: {exc})") from None


def _print_list(implementations) -> None:
    print(f"{'name':28s} {'framework':9s} {'scopes':13s} {'installed':9s} description")
    for impl in implementations.REGISTRY.values():
        installed = "yes" if implementations.framework_installed(impl.framework) else "no"
        print(f"{impl.name:28s} {impl.framework:9s} {','.join(impl.scopes):13s} {installed:9s} {impl.summary}")


def _progress(total_cases: int):
    def say(message: str) -> None:
        print(f"bench: {message}", file=sys.stderr, flush=True)
    return say


def _plan(args, implementations):
    from . import attention, machine
    chosen = implementations.select(args.impl)
    threads = args.threads if args.threads is not None else (os.cpu_count() or 1)
    most = 4 * (os.cpu_count() or 1)
    if not 1 <= threads <= most:  # a huge count makes the frameworks' thread pools crash, not slow down
        raise ValueError(f"--threads must be between 1 and {most} (4 x this machine's {os.cpu_count()} CPUs), "
                         f"received {threads}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, received {args.rounds}")
    if not args.row_budget > 0:
        raise ValueError(f"--row-budget must be > 0 seconds, received {args.row_budget}")
    if args.peak_size is not None and args.peak_size < 1:
        raise ValueError(f"--peak-size must be >= 1, received {args.peak_size}")
    if args.min_time <= 0 or args.max_time < args.min_time:
        raise ValueError(f"need 0 < --min-time <= --max-time, received {args.min_time} and {args.max_time}")
    present = machine.available_devices()
    if args.device == "cuda" and "cuda" not in present:
        raise ValueError("--device cuda: no CUDA device is visible to PyTorch here")
    parsers = {"batch": _ints("batch"), "heads": _ints("heads"), "seq": _ints("seq"), "kv_len": _ints("kv-len"),
               "head_dim": _ints("head-dim"), "dtype": _choices("dtype", attention.DTYPES),
               "mask": _choices("mask", attention.MASKS), "mode": _choices("mode", attention.MODES),
               "scope": _choices("scope", attention.SCOPES)}
    grid_given = {k: parse(getattr(args, k)) for k, parse in parsers.items() if getattr(args, k) is not None}
    if grid_given and args.preset:
        raise ValueError(f"use --preset or grid options ({', '.join('--' + k.replace('_', '-') for k in grid_given)}),"
                         " not both")
    if args.preset == "gpu":
        devices = ["cuda"] if args.device in (None, "cuda") else present if args.device == "all" else [args.device]
        if "cuda" in devices and "cuda" not in present:
            raise ValueError("--preset gpu: no CUDA device is visible to PyTorch here")
    else:
        devices = present if args.device == "all" else [args.device or "cpu"]
    if not grid_given:
        pairs = attention.preset_cases(args.preset or "default", devices)
    else:
        axes = {k: grid_given.get(k, v) for k, v in GRID_DEFAULTS.items()}
        pairs = []
        for kw in attention.grid_cases(**axes):
            for kv_len in (grid_given.get("kv_len") or [None]):
                for device in devices:
                    case = {**kw, "device": device}
                    if kv_len is not None:
                        case["k_len"] = kv_len
                    pairs.append((attention.Case(**case), None))
    plan = []
    names = {impl.name for impl in chosen}
    for case, patterns in pairs:
        allowed = implementations.select(patterns) if patterns else chosen
        impls = [impl for impl in allowed if impl.name in names and case.scope in impl.scopes]
        if case.device == "cuda":  # NumPy has no GPU form; its CPU baseline rows come from the preset
            impls = [impl for impl in impls if impl.framework != "numpy"]
        if impls:
            plan.append((case, impls))
    if not plan:
        raise ValueError("the chosen implementations have nothing to run on this grid "
                         f"(implementations: {', '.join(sorted(names))})")
    return plan, threads


def _outputs(args) -> dict[str, str | None]:
    outputs = {"json": args.json, "csv": args.csv, "plot": args.plot}
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        for kind, name in OUT_NAMES.items():
            if outputs[kind] is None:
                outputs[kind] = os.path.join(args.out_dir, name)
        if not args.plot:
            import importlib.util
            if importlib.util.find_spec("matplotlib") is None:
                print("bench: matplotlib is not installed; no plot (make it later with `bench plot`)",
                      file=sys.stderr)
                outputs["plot"] = None
    for kind, path in outputs.items():
        if not path:
            continue
        from transformer_parity.io.guards import special_kind
        what = special_kind(path)
        if what is not None and what != "directory":  # refused before the run, not after it
            raise ValueError(f"--{kind}: {path} is a {what}; refusing to write to it or replace it (even with --force)")
        if os.path.exists(path) and not args.force:
            raise ValueError(f"{path} exists; pass --force to overwrite it")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"--{kind}: folder {folder} does not exist")
    if outputs["plot"]:
        from . import attention_plot as plot
        plot.default_path_ok(outputs["plot"])
        import importlib.util
        if importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--plot needs matplotlib (pip install matplotlib), or plot later from the JSON with "
                             "`transformer-parity bench plot RESULT.json OUT.png`")
    return outputs


def main(argv=None) -> int:
    """`python -m transformer_parity.bench.cli ...`: the `bench` subcommand without the rest of the CLI."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = argparse.ArgumentParser(prog="python -m transformer_parity.bench.cli")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *argv])
    try:
        return args.func(args)
    except Exception as exc:  # noqa: BLE001 - one line, exit 2, unless --debug
        if debug or (type(exc).__name__ != "UsageError" and not isinstance(exc, ValueError)):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
