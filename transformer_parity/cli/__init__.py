"""The `transformer-parity` command line: init, convert, verify (and subcommands other modules register).

Exit status: 0 success (verify: every sublayer within tolerance), 1 verify found a divergence (nothing else exits
1), 2 bad input or usage (one line on stderr; `--debug` shows the traceback), 3 an internal error: an exception
the command did not expect, a bug to report (one line naming it; `--debug` shows the traceback), 130 interrupted.
Every line printed about an error or a note is one line with control characters escaped (`safe_text.one_line`).

Importing this module imports neither PyTorch nor TensorFlow: `--help` is instant, and each command loads only the
frameworks its files and backends need.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Sequence

from transformer_parity import __version__
from transformer_parity.config_fields import parse_fields
from transformer_parity.errors import UsageError
from transformer_parity.layouts import HF_LAYOUTS
from transformer_parity.io.safe_text import one_line, printable

PROG = "transformer-parity"
INTERNAL_ERROR = 3  # exit status of an exception no command expected (1 is reserved for "the backends differ")
COMMAND_MODULES = ["transformer_parity.bench.cli", "transformer_parity.cli.train"]
FORMAT_CHOICES = ("canonical", "torch", "nn-transformer", "keras", "hf", *HF_LAYOUTS)
FORMAT_CHOICES += ("kerashub", "kerashub-gpt2", "kerashub-bert", "kerashub-seq2seq")  # formats.KERASHUB_FORMATS


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit 2) instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)


# --- shared option handling -----------------------------------------------------------------------------------------

def _add_common(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """--quiet and --debug, accepted before or after the subcommand."""
    default = False if top else argparse.SUPPRESS
    if "--quiet" not in parser._option_string_actions and "-q" not in parser._option_string_actions:
        parser.add_argument("-q", "--quiet", action="store_true", default=default,
                            help="print no tables, notes or progress; errors still go to stderr")
    if "--debug" not in parser._option_string_actions:
        parser.add_argument("--debug", action="store_true", default=default,
                            help="show the full traceback of an error instead of one line")


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.json",
                        help="config fields as a JSON object (all or some TransformerConfig fields)")
    parser.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[], dest="sets",
                        help="set one config field (repeatable; wins over --config), e.g. --set num_heads=4")


def _console(args, stderr: bool = False):
    """A rich console; off a terminal (pipes, CI logs) 120 columns wide so that tables are not squeezed."""
    from rich.console import Console

    console = Console(stderr=stderr, quiet=bool(getattr(args, "quiet", False)) and not stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 120
    return console


def _note(args, message: str) -> None:
    if not getattr(args, "quiet", False):
        _console(args, stderr=True).print(f"note: {one_line(message)}", markup=False)


class _Bytes:
    """A rich progress bar over bytes of tensors (only drawn on a terminal, never with --quiet)."""

    def __init__(self, args, description: str, total: int | None):
        from rich.progress import (BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn)

        console = _console(args, stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TimeElapsedColumn(), console=console, transient=True,
                                 disable=bool(getattr(args, "quiet", False)) or not console.is_terminal)
        self.task = self.progress.add_task(description, total=total)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def advance(self, name: str, nbytes: int) -> None:
        self.progress.advance(self.task, nbytes)

    def describe(self, description: str, total: int | None = None) -> None:
        self.progress.reset(self.task, description=description, total=total)


# --- init -----------------------------------------------------------------------------------------------------------

INIT_EXAMPLES = """\
examples:
  transformer-parity init -o base.safetensors                     # the paper's base model, seeded
  transformer-parity init --preset tiny --seed 3 -o tiny.pt        # straight to a PyTorch file
  transformer-parity init --preset base --set num_heads=16 --set layer_norm_eps=1e-6 -o custom.safetensors
  transformer-parity init --config my_config.json -o mine.weights.h5
  transformer-parity init --exercise-all -o base.safetensors       # non-zero biases, non-unit gammas too
"""


def cmd_init(args) -> int:
    import numpy as np

    import reference_numpy as rn

    from transformer_parity import formats
    from transformer_parity.verify import seeded_weights

    fields = parse_fields(args.config, args.sets)
    out_format = formats.output_format(args.output, args.to)
    formats.check_destination(args.output, out_format, args.force)  # a file, or a model directory (--to hf)
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, received {args.seed}")
    try:
        config = rn.TransformerConfig.preset(args.preset, **fields)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid config: {exc}") from None
    start = time.perf_counter()
    dtype = np.dtype(args.dtype)
    from transformer_parity.io import limits
    limits.check_memory(2 * dtype.itemsize * limits.parameter_count(config),  # each tensor drawn in float64, cast
                        f"init --preset {args.preset}" + "".join(f" --set {s}" for s in args.sets))
    weights = seeded_weights(config, args.seed, dtype) if args.exercise_all else rn.init_weights(config, args.seed,
                                                                                                    dtype)
    total = sum(w.nbytes for w in weights.values())
    size_text = _size(weights)
    notes: list[str] = []
    with _Bytes(args, f"writing {printable(Path(args.output).name)}", total) as bar:
        path, fmt = formats.save(args.output, config, weights, out_format, args.force, bar.advance, consume=True,
                                 notes=notes)
    for note in notes:
        _note(args, note)
    if not args.quiet:
        _console(args).print(f"wrote {printable(path)} ({fmt}, {args.preset} preset, {size_text}) in "
                             f"{time.perf_counter() - start:.1f} s", markup=False)
    return 0


def _size(weights) -> str:
    n = sum(int(v.size) for v in weights.values())
    nbytes = sum(int(v.nbytes) for v in weights.values())
    from transformer_parity.io.limits import human_bytes

    return f"{n / 1e6:.1f} M parameters, {human_bytes(nbytes)}"


# --- convert --------------------------------------------------------------------------------------------------------

CONVERT_EXAMPLES = """\
examples:
  transformer-parity convert base.safetensors base.pt                 # canonical -> PyTorch
  transformer-parity convert base.pt base.weights.h5                   # PyTorch -> Keras weights
  transformer-parity convert base.weights.h5 back.safetensors --force  # overwrite an existing file
  # a model built around torch.nn.Transformer (e.g. PyTorch's translation tutorial): what its weights cannot tell
  # (num_heads, activation, norm_first, layer_norm_eps, scale_embedding, pad_id) given in a JSON file:
  transformer-parity convert seq2seq.pt seq2seq.safetensors --from nn-transformer --config tutorial.json
  # canonical -> the tutorial's own state-dict layout (loads with model.load_state_dict):
  transformer-parity convert model.safetensors tutorial.pt --to nn-transformer
  # a Hugging Face model directory (save_pretrained's config.json + weights) to Keras, and back:
  transformer-parity convert gpt2-dir gpt2.weights.h5
  transformer-parity convert gpt2.weights.h5 gpt2-again --to hf

formats: canonical (.safetensors), torch (.pt/.pth), nn-transformer (.pt/.pth/.bin, a torch.nn.Transformer
model's state dict), keras (.weights.h5), hf (a Hugging Face model directory: GPT-2, BERT, Marian or BART;
hf-gpt2, hf-bert, hf-marian, hf-bart name the family). Inferred from content and extension; --from/--to override.
"""


def cmd_convert(args) -> int:
    from transformer_parity import formats
    from transformer_parity.io import outputs

    fields = parse_fields(args.config, args.sets)
    in_path = formats.check_source(args.input)
    out_format = formats.output_format(args.output, args.to)
    outputs.check_apart(in_path, args.output)  # before anything is read or moved
    out_path = formats.check_destination(args.output, out_format, args.force)
    to_layout = None
    if getattr(args, "to_layout", None):  # parsed (names checked as the output's keys) before the input is read
        from transformer_parity.layouts import user
        to_layout = user.load_for_writing(args.to_layout, out_path)
    start = time.perf_counter()
    size = formats.source_size(in_path)
    notes: list[str] = []
    with _Bytes(args, f"reading {printable(in_path.name)}", size) as bar:
        loaded = formats.load(in_path, _input_format(args), fields, bar.advance, allow_drop=args.allow_drop)
        bar.describe(f"writing {printable(out_path.name)}", loaded.nbytes)
        size_text = _size(loaded.weights)
        if to_layout is not None:
            path, fmt = out_path, user.export_with_layout(out_path, loaded.config, loaded.weights, to_layout,
                                                          args.force)
        else:
            path, fmt = formats.save(out_path, loaded.config, loaded.weights, out_format, args.force, bar.advance,
                                     consume=True, notes=notes)
    for note in loaded.notes + notes:
        _note(args, note)
    if not args.quiet:
        _console(args).print(f"converted {printable(in_path)} ({loaded.format}) -> {printable(path)} ({fmt}), "
                             f"{size_text}, in {time.perf_counter() - start:.1f} s", markup=False)
    return 0


def _add_allow_drop(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-drop", metavar="NAME", action="append", default=[], dest="allow_drop",
                        help="let a layout's `ignore` leave out this float tensor although it holds nonzero values "
                             "(repeatable; a key, or a pattern with {i}); what is dropped is listed")


def _input_format(args) -> str | None:
    """--from, or the user's layout file (--layout) that describes the input."""
    if getattr(args, "layout", None) is None:
        return args.from_
    if args.from_:
        raise UsageError("--layout describes the input's format itself; leave out --from")
    from transformer_parity.formats import LAYOUT_PREFIX
    return LAYOUT_PREFIX + args.layout


# --- verify ---------------------------------------------------------------------------------------------------------

VERIFY_EXAMPLES = """\
examples:
  transformer-parity verify                                  # the base preset, seeded, in every backend
  transformer-parity verify --preset tiny --seed 7           # a quick one
  transformer-parity verify model.safetensors                # one checkpoint in every backend
  transformer-parity verify model.pt model.weights.h5        # a port: weights first, then each file in its own
                                                             # framework
  transformer-parity verify model.safetensors quantised.pt --outputs-only   # weights differ on purpose
  transformer-parity verify model.pt model.weights.h5 --json report.json
  transformer-parity verify model.pt --backends torch --dtype float64 --batch 4 --src-len 64 --tgt-len 48
  transformer-parity verify seq2seq.pt --config tutorial.json   # config-less files take --set/--config
  transformer-parity verify model.safetensors --dtype bfloat16 [--autocast]   # a bfloat16 port
  transformer-parity verify model.safetensors --source my_model.py:forward   # judged against the model's own code
  transformer-parity verify hf-dir                           # a Hugging Face directory: judged by transformers
  transformer-parity verify model.pt --write-probe probe.npz # the inputs, for a machine that has the source
  transformer-parity verify model.pt --expect probe.npz      # ... and the outputs it computed there

The first checkpoint is the reference: the judge is the NumPy reference in float64 on its weights. Each sublayer's
tolerance is K x its floor (the NumPy float32-vs-float64 error on the same inputs), K = 10; see docs/verify.md.
With --dtype bfloat16/float16 the floor is the error of the NumPy reference rounding as that port does, K = 5.5.
With two or more checkpoints their weights are compared first, name by name: a tensor that differs (beyond a
float64 -> float32 rounding that happened) fails verify even when every output is within tolerance.
With a source (--source, --expect, or the built-in one for a Hugging Face directory, a KerasHub preset or an
nn-transformer file) the verdict says whether the port matches the model the weights came from; without one it is
"self-consistent only": the backends agree with our reference on the same weights and config.
exit status: 0 all within tolerance (and the weights the same), 1 a weight or an output differs, 2 bad input.
"""


def _verify_sources(args) -> None:
    """--source, --expect, --no-source and --write-probe: which go together."""
    given = [flag for flag, value in (("--source", args.source), ("--expect", args.expect),
                                      ("--no-source", args.no_source), ("--write-probe", args.write_probe)) if value]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} exclude each other: --source FILE.py:NAME or --expect FILE.npz is "
                         "the source, --no-source skips the built-in one, --write-probe only writes inputs")
    if args.expect:
        shape = [flag for flag, value in (("--batch", args.batch), ("--src-len", args.src_len),
                                          ("--tgt-len", args.tgt_len), ("--seed", args.seed)) if value is not None]
        if shape:
            raise UsageError(f"--expect runs on the inputs {args.expect} holds; leave out {', '.join(shape)}")
    if args.write_probe and (args.json or len(args.checkpoints) > 1):
        raise UsageError("--write-probe writes the inputs of one checkpoint (or the preset) and exits; leave out "
                         + ("--json" if args.json else "the other checkpoints"))


def cmd_verify(args) -> int:
    from transformer_parity.verify import report as rep
    from transformer_parity import verify

    _verify_sources(args)
    shape = {"batch": 2 if args.batch is None else args.batch, "src_len": args.src_len, "tgt_len": args.tgt_len,
             "seed": 0 if args.seed is None else args.seed}  # lengths left out: verify's defaults, clipped to max_len
    fields = parse_fields(args.config, args.sets)
    if args.json and args.json != "-":
        from transformer_parity.io import guards
        guards.check_output(args.json, args.force)
    declared = args.from_ or []
    if len(declared) not in (0, 1, len(args.checkpoints)):
        raise UsageError(f"--from given {len(declared)} times for {len(args.checkpoints)} checkpoints; give it once "
                         "(for all) or once per checkpoint")
    declared = declared * len(args.checkpoints) if len(declared) == 1 else declared
    if args.layout is not None:  # the first checkpoint is the user's model, described by the layout file
        if declared or not args.checkpoints:
            raise UsageError("--layout describes the first checkpoint's format itself; give a checkpoint and leave "
                             "out --from")
        from transformer_parity.formats import LAYOUT_PREFIX
        declared = [LAYOUT_PREFIX + args.layout] + [None] * (len(args.checkpoints) - 1)
    if args.write_probe:
        probe = verify.write_probe(args.write_probe, args.checkpoints, preset=args.preset, fields=fields,
                                   formats=declared or None, **shape, force=args.force,
                                   allow_drop=args.allow_drop)
        if not args.quiet:
            print(f"wrote {args.write_probe}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in probe.items())
                  + "; add the model's output as 'output' and run verify CHECKPOINT --expect FILE.npz")
        return 0
    backends = None
    if args.backends:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        if not backends:
            raise UsageError(f"--backends {args.backends!r} names no backend; give a comma-separated list of "
                             "numpy, torch, keras")
    quiet = args.quiet or args.json == "-"
    console_err = _console(args, stderr=True)
    status = None
    if not quiet and console_err.is_terminal:
        status = console_err.status("verifying")
        status.start()

    def progress(step: str) -> None:
        if status is not None:
            status.update(f"running {step}" if not step.startswith(("reading", "seeding")) else step)

    try:
        result = verify.run(args.checkpoints, preset=args.preset, fields=fields, backends=backends,
                            formats=declared or None,
                            dtype=args.dtype, **shape, progress=progress, outputs_only=args.outputs_only,
                            autocast=args.autocast, source=args.source, expect=args.expect,
                            builtin_source=not args.no_source, allow_drop=args.allow_drop)
    finally:
        if status is not None:
            status.stop()
    if args.json:
        text = rep.to_json_text(result)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            from transformer_parity.io import outputs
            with outputs.atomic_path(Path(args.json), args.force) as tmp:
                tmp.write_text(text + "\n")
    if not quiet:
        console = _console(args)
        rep.print_report(result, console)
        console.print(rep.verdict(result), style="bold green" if result.passed else "bold red", markup=False)
    elif args.quiet and not result.passed:
        print(rep.verdict(result), file=sys.stderr)
    return 0 if result.passed else 1


# --- layout ---------------------------------------------------------------------------------------------------------

LAYOUT_EXAMPLES = """\
examples:
  transformer-parity layout --scaffold model.pt > my_layout.toml       # every key listed, the guessable ones guessed
  transformer-parity layout --scaffold epoch=3.ckpt > my_layout.toml   # a PyTorch Lightning checkpoint
  transformer-parity layout --scaffold model.weights.h5 > my_layout.toml
  transformer-parity layout --scaffold model.pt --source my_model.py:forward > my_layout.toml   # settled by probing
  transformer-parity convert --layout my_layout.toml model.pt model.safetensors
  transformer-parity verify --layout my_layout.toml model.pt

A layout file describes a model this tool does not know: its [config] (what the weights cannot tell, such as
num_heads: each "?" of the scaffold must be replaced) and its [weights] ("your name" = "canonical name
[transform]", {i} for the layer). See docs/layouts.md.
"""


def cmd_layout(args) -> int:
    from transformer_parity import formats
    from transformer_parity.layouts import user

    path = formats.check_input(args.scaffold)
    if args.source is None:
        if args.sets or args.config:
            raise UsageError("--set/--config settle a scaffold only with --source (they fix what probing tries)")
        try:
            text = user.scaffold(path)
        except ImportError as exc:
            raise UsageError(f"reading {path} needs {exc.name}, which is not installed") from None
        sys.stdout.write(text)
        return 0
    from transformer_parity.verify import source as src
    from transformer_parity.verify import probe

    fields = parse_fields(args.config, args.sets)
    fn = src.load_callable(args.source)
    settled = probe.settle(path, fn, fields, where=f"--source {args.source}")
    sys.stdout.write(settled.text)
    for line in settled.unsettled:
        print(f"{PROG}: not settled: {one_line(line)}", file=sys.stderr)
    if not args.quiet:
        _console(args, stderr=True).print(
            f"{'settled' if settled.passed else 'NOT settled'}: {settled.tried} candidate layouts tried; the chosen one "
            f"is {settled.error:.3g} off the source's {settled.source_dtype} output ({settled.ratio:.2f} floors, "
            f"limit {probe.RATIO_LIMIT:g})", markup=False)
    return 0 if settled.passed else 1


# --- the parser -----------------------------------------------------------------------------------------------------

DESCRIPTION = """\
Convert Transformer checkpoints between NumPy (safetensors), PyTorch and Keras, and verify that every backend
computes the same function, sublayer by sublayer, with tolerances derived from measured float32 rounding.

start here:
  transformer-parity verify                 # NumPy vs PyTorch vs Keras on the paper's base model
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=DESCRIPTION, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("init", help="write a seeded model of a preset or config", epilog=INIT_EXAMPLES,
                       formatter_class=_Formatter, description="Write seeded weights for a preset or config.")
    p.add_argument("--preset", choices=("tiny", "base", "big"), default="base",
                   help="starting config (default: base, the paper's)")
    _add_config_options(p)
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="weight dtype")
    p.add_argument("--exercise-all", action="store_true",
                   help="draw biases and LayerNorm parameters at random too (better for verification)")
    p.add_argument("--to", choices=FORMAT_CHOICES, help="output format (default: from the extension)")
    p.add_argument("-o", "--output", required=True, metavar="PATH", help="file to write")
    p.add_argument("--force", action="store_true", help="overwrite PATH if it exists")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("convert", help="convert a checkpoint to another format", epilog=CONVERT_EXAMPLES,
                       formatter_class=_Formatter,
                       description="Read a checkpoint in any supported format and write it in another, atomically\n"
                                   "(a temporary file renamed into place; nothing is left behind on error or Ctrl-C).")
    p.add_argument("input", metavar="IN", help="checkpoint to read (a file, or a Hugging Face model directory)")
    p.add_argument("output", metavar="OUT", help="file to write (a directory with --to hf)")
    p.add_argument("--from", dest="from_", choices=FORMAT_CHOICES, help="input format (default: inferred)")
    p.add_argument("--to", choices=FORMAT_CHOICES, help="output format (default: from OUT's extension)")
    p.add_argument("--layout", metavar="FILE.toml", help="a layout file describing IN, a model this tool does not "
                   "know (docs/layouts.md)")
    p.add_argument("--to-layout", metavar="FILE.toml", help="write OUT under the names of a layout file, for your own "
                   "model's load_state_dict / load_weights (.pt, .safetensors or .weights.h5)")
    _add_config_options(p)
    _add_allow_drop(p)
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("verify", help="compare every sublayer across backends or checkpoints",
                       epilog=VERIFY_EXAMPLES, formatter_class=_Formatter,
                       description="Run seeded, padded inputs through each backend (or each checkpoint in its own "
                                   "framework)\nand compare every sublayer with the float64 NumPy reference.")
    p.add_argument("checkpoints", nargs="*", metavar="CHECKPOINT",
                   help="none: the preset with seeded weights; one: it in every backend; several: each in its "
                        "own framework, the first being the reference")
    p.add_argument("--from", dest="from_", choices=FORMAT_CHOICES, action="append",
                   help="checkpoint format (default: inferred); once for all, or once per checkpoint in order")
    p.add_argument("--layout", metavar="FILE.toml", help="a layout file describing the first checkpoint, a model "
                   "this tool does not know (docs/layouts.md)")
    p.add_argument("--preset", choices=("tiny", "base", "big"), default="base",
                   help="model to seed when no checkpoint is given (default: base)")
    p.add_argument("--backends", metavar="LIST",
                   help="comma-separated backends for zero or one checkpoint: numpy,torch,keras (default: all "
                        "installed frameworks)")
    p.add_argument("--dtype", choices=("float32", "float64", "bfloat16", "float16"), default="float32",
                   help="compute dtype of the backends under test (default float32); bfloat16/float16 are judged "
                        "against the NumPy reference rounding as they do (docs/verify.md, 'Reduced precision')")
    p.add_argument("--autocast", action="store_true",
                   help="with --dtype bfloat16/float16: float32 weights under torch.autocast / Keras's "
                        "mixed_<dtype> policy instead of a model cast to that dtype")
    p.add_argument("--batch", type=int, help="sequences per batch (default 2)")
    p.add_argument("--src-len", type=int, help="source length, with padding (default 37, or the model's max_len if "
                                               "shorter)")
    p.add_argument("--tgt-len", type=int, help="target length, with padding (default 29, or the model's max_len if "
                                               "shorter); encoder-decoder models only")
    p.add_argument("--seed", type=int, help="seed of the inputs (and of the preset's weights; default 0)")
    _add_config_options(p)
    p.add_argument("--outputs-only", action="store_true",
                   help="with two or more checkpoints, skip the weight-by-weight comparison that runs first (for "
                        "ports whose weights differ on purpose, e.g. quantised)")
    _add_allow_drop(p)
    p.add_argument("--source", metavar="FILE.py:NAME",
                   help="judge the first checkpoint against the model it came from: NAME(batch) in FILE.py returns "
                        "its output on verify's inputs (docs/verify.md, 'The source-file contract')")
    p.add_argument("--expect", metavar="FILE.npz",
                   help="judge against outputs computed elsewhere: a --write-probe file with the model's 'output' "
                        "added (and optional intermediates under canonical names)")
    p.add_argument("--no-source", action="store_true",
                   help="skip the built-in source (transformers for a Hugging Face directory, keras_hub for a KerasHub "
                        "preset, torch.nn for an nn-transformer file): the verdict is then self-consistent only")
    p.add_argument("--write-probe", metavar="FILE.npz",
                   help="write the inputs verify would use (src_ids, tgt_ids, src_type_ids) to FILE.npz and exit")
    p.add_argument("--json", metavar="PATH", help="also write a machine-readable report ('-': stdout only)")
    p.add_argument("--force", action="store_true", help="overwrite the --json or --write-probe file if it exists")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("layout", help="write a starting layout file for a model this tool does not know",
                       epilog=LAYOUT_EXAMPLES, formatter_class=_Formatter,
                       description="Print a layout file (TOML) for a PyTorch state dict, .safetensors or .weights.h5: "
                                   "every key,\nwith the canonical names and transforms it could guess filled in.")
    p.add_argument("--scaffold", required=True, metavar="FILE", help="the checkpoint to describe")
    p.add_argument("--source", metavar="FILE.py:NAME",
                   help="settle what the names cannot tell by probing the model the weights came from: NAME(batch) "
                        "returns its output (docs/layouts.md); exit 1 names what could not be settled")
    _add_config_options(p)
    p.set_defaults(func=cmd_layout)

    for name in COMMAND_MODULES:
        _register(sub, name)
    for subparser in sub.choices.values():
        _add_common_everywhere(subparser)
    return parser


def _add_common_everywhere(parser: argparse.ArgumentParser) -> None:
    """--quiet and --debug on a subcommand and on each of its own actions (`bench model compare ...`)."""
    _add_common(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for nested in action.choices.values():
                _add_common_everywhere(nested)


def _register(sub, module_name: str) -> None:
    """Let another module add its subcommands: `module.register(subparsers)`, if the module exists."""
    try:
        if importlib.util.find_spec(module_name) is None:
            return
    except ModuleNotFoundError:  # its package is absent
        return
    try:
        importlib.import_module(module_name).register(sub)
    except Exception as exc:  # a broken plug-in must not take init/convert/verify down with it
        print(f"{PROG}: warning: subcommands from {module_name} unavailable: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
        text = f"{exc.filename}: {text}"
    return one_line(text)


def _internal_error(exc: BaseException) -> str:
    """An exception no command expected: one line naming it (exit 3), never a traceback without --debug."""
    return (f"{PROG}: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug in {PROG}, not a verdict; "
            "rerun with --debug for the traceback)")


_SIGINT_SEEN: list[bool] = []


def _on_sigint(signum, frame) -> None:
    """Ctrl-C: remembered, then raised as usual. An interrupt that lands inside the interpreter's own machinery (a
    warning being issued, a C extension's import) can surface as another exception; the memory says what it was."""
    _SIGINT_SEEN.append(True)
    raise KeyboardInterrupt


def _interrupted(argv: Sequence[str]) -> int:
    if "--debug" in argv:
        raise
    print(f"{PROG}: interrupted", file=sys.stderr)
    return 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script passes it to sys.exit)."""
    import signal

    from transformer_parity import quiet

    argv = sys.argv[1:] if argv is None else list(argv)
    quiet.configure(debug="--debug" in argv)  # before anything imports a framework
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where the caller ignores Ctrl-C
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:  # Ctrl-C while the subcommands' modules load
        return _interrupted(argv)
    except Exception as exc:
        if _SIGINT_SEEN:
            return _interrupted(argv)
        if "--debug" in argv:
            raise
        print(_internal_error(exc), file=sys.stderr)
        return INTERNAL_ERROR
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return _interrupted(argv)
    except (UsageError, ValueError, OSError, pickle.UnpicklingError, EOFError) as exc:
        if args.debug:
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # anything else is a bug: one line and its own status, never 1 ("the backends differ")
        if _SIGINT_SEEN:
            return _interrupted(argv)
        if args.debug:
            raise
        print(_internal_error(exc), file=sys.stderr)
        return INTERNAL_ERROR
