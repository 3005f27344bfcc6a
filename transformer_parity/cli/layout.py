"""The `layout` command: a starting layout file for a model this tool does not know, settled by probing its source
where one is given."""

from __future__ import annotations

import sys
import time

from transformer_parity.config_fields import parse_fields
from transformer_parity.errors import UsageError
from transformer_parity.io.safe_text import one_line

from .common import PROG, Formatter, add_config_options, make_console


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
    from transformer_parity.io.user_code import load_callable
    from transformer_parity.layouts import probe

    fields = parse_fields(args.config, args.sets)
    fn = load_callable(args.source)
    started = time.perf_counter()
    settled = probe.settle(path, fn, fields, where=f"--source {args.source}")
    seconds = time.perf_counter() - started
    sys.stdout.write(settled.text)
    for line in settled.unsettled:
        print(f"{PROG}: not settled: {one_line(line)}", file=sys.stderr)
    if not args.quiet:
        make_console(args, stderr=True).print(
            f"{'settled' if settled.passed else 'NOT settled'}: {settled.tried} candidate layouts tried in {seconds:.1f} s; "
            "the chosen one "
            f"is {settled.error:.3g} off the source's {settled.source_dtype} output ({settled.ratio:.2f} floors, "
            f"limit {probe.RATIO_LIMIT:g})", markup=False)
    return 0 if settled.passed else 1


def register(sub) -> None:
    p = sub.add_parser("layout", help="write a starting layout file for a model this tool does not know",
                       epilog=LAYOUT_EXAMPLES, formatter_class=Formatter,
                       description="Print a layout file (TOML) for a PyTorch state dict, .safetensors or .weights.h5: "
                                   "every key,\nwith the canonical names and transforms it could guess filled in.")
    p.add_argument("--scaffold", required=True, metavar="FILE", help="the checkpoint to describe")
    p.add_argument("--source", metavar="FILE.py:NAME",
                   help="settle what the names cannot tell by probing the model the weights came from: NAME(batch) "
                        "returns its output (docs/layouts.md); exit 1 names what could not be settled")
    add_config_options(p)
    p.set_defaults(func=cmd_layout)
