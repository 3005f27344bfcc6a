"""The `verify` command: every sublayer of every backend (or checkpoint) against the float64 reference and the
source the weights came from."""

from __future__ import annotations

import sys
from pathlib import Path

from transformer_parity.config_fields import parse_fields
from transformer_parity.errors import UsageError

from .common import FORMAT_CHOICES, Formatter, add_allow_drop, add_config_options, make_console


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
  transformer-parity verify translator.pt --config tutorial.json   # config-less files take --set/--config
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
A KerasHub preset written with --accept-approximation (docs/kerashub.md, 'Approximations') verified against the
model it came from (verify HF_DIR PRESET) is APPROXIMATE, never PASS: the verdict names the approximation, where it
first shows and by how much, once the preset matches our reference run with the setting it records.
exit status: 0 all within tolerance (and the weights the same), 1 a weight or an output differs (APPROXIMATE
included), 2 bad input.
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
        request = verify.Request(args.checkpoints, preset=args.preset, fields=fields, formats=declared or None,
                                 **shape, allow_drop=args.allow_drop or ())
        probe = verify.write_probe(args.write_probe, request, force=args.force)
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
    console_err = make_console(args, stderr=True)
    status = None
    if not quiet and console_err.is_terminal:
        status = console_err.status("verifying")
        status.start()

    def progress(step: str) -> None:
        if status is not None:
            status.update(f"running {step}" if not step.startswith(("reading", "seeding")) else step)

    try:
        request = verify.Request(args.checkpoints, preset=args.preset, fields=fields, backends=backends,
                                 formats=declared or None, dtype=args.dtype, **shape, outputs_only=args.outputs_only,
                                 autocast=args.autocast, source=args.source, expect=args.expect,
                                 builtin_source=not args.no_source, allow_drop=args.allow_drop or (),
                                 stream=args.stream, cover=args.cover)
        result = verify.run(request, progress)
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
        console = make_console(args)
        rep.print_report(result, console)
        style = "bold green" if result.passed else "bold yellow" if result.approximate else "bold red"
        console.print(rep.verdict(result), style=style, markup=False)
    elif args.quiet and not result.passed:
        print(rep.verdict(result), file=sys.stderr)
    return 0 if result.passed else 1


def register(sub) -> None:
    p = sub.add_parser("verify", help="compare every sublayer across backends or checkpoints",
                       epilog=VERIFY_EXAMPLES, formatter_class=Formatter,
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
    add_config_options(p)
    p.add_argument("--outputs-only", action="store_true",
                   help="with two or more checkpoints, skip the weight-by-weight comparison that runs first (for "
                        "ports whose weights differ on purpose, e.g. quantised)")
    add_allow_drop(p)
    p.add_argument("--source", metavar="FILE.py:NAME",
                   help="judge the first checkpoint against the model it came from: NAME(batch) in FILE.py returns "
                        "its output on verify's inputs (docs/verify.md, 'The source-file contract')")
    p.add_argument("--expect", metavar="FILE.npz",
                   help="judge against outputs computed elsewhere: a --write-probe file with the model's 'output' "
                        "added (and optional intermediates under canonical names)")
    p.add_argument("--cover", action="store_true",
                   help="probe lengths that run every length-dependent path the config declares (past a sliding "
                        "window or a late rope scaling, every learned position); without it the verdict lists what "
                        "the probe did not exercise")
    p.add_argument("--no-source", action="store_true",
                   help="skip the built-in source (transformers for a Hugging Face directory, keras_hub for a KerasHub "
                        "preset, torch.nn for an nn-transformer file): the verdict is then self-consistent only")
    p.add_argument("--write-probe", metavar="FILE.npz",
                   help="write the inputs verify would use (src_ids, tgt_ids, src_type_ids) to FILE.npz and exit")
    p.add_argument("--stream", choices=("auto", "on", "off"), default="auto",
                   help="run one block at a time (a layer-streamed verify: a model larger than memory; the source "
                        "library is not run): on, off, or auto (default: when the whole model would not fit)")
    p.add_argument("--json", metavar="PATH", help="also write a machine-readable report ('-': stdout only)")
    p.add_argument("--force", action="store_true", help="overwrite the --json or --write-probe file if it exists")
    p.set_defaults(func=cmd_verify)
