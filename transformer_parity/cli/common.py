"""What every command shares: the parser classes, --quiet/--debug and config options, consoles, notes and the
bytes progress bar."""

from __future__ import annotations

import argparse
import os

from transformer_parity.errors import UsageError
from transformer_parity import formats
from transformer_parity.io.safe_text import one_line


PROG = "transformer-parity"
FORMAT_CHOICES = formats.names()  # every format's name and every family's (`hf-FAMILY`, `kerashub-FAMILY`)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit 2) instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)


# --- shared option handling -----------------------------------------------------------------------------------------

def add_common(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """--quiet and --debug, accepted before or after the subcommand."""
    default = False if top else argparse.SUPPRESS
    if "--quiet" not in parser._option_string_actions and "-q" not in parser._option_string_actions:
        parser.add_argument("-q", "--quiet", action="store_true", default=default,
                            help="print no tables, notes or progress; errors still go to stderr")
    if "--debug" not in parser._option_string_actions:
        parser.add_argument("--debug", action="store_true", default=default,
                            help="show the full traceback of an error instead of one line")


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.json",
                        help="config fields as a JSON object (all or some TransformerConfig fields)")
    parser.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[], dest="sets",
                        help="set one config field (repeatable; wins over --config), e.g. --set num_heads=4")


def make_console(args, stderr: bool = False):
    """A rich console; off a terminal (pipes, CI logs) 120 columns wide so that tables are not squeezed."""
    from rich.console import Console

    console = Console(stderr=stderr, quiet=bool(getattr(args, "quiet", False)) and not stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 120
    return console


def print_note(args, message: str) -> None:
    if not getattr(args, "quiet", False):
        make_console(args, stderr=True).print(f"note: {one_line(message)}", markup=False, soft_wrap=True)  # one line


class BytesProgress:
    """A rich progress bar over bytes of tensors (only drawn on a terminal, never with --quiet)."""

    def __init__(self, args, description: str, total: int | None):
        from rich.progress import (BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn)

        console = make_console(args, stderr=True)
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



def add_allow_drop(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-drop", metavar="NAME", action="append", default=[], dest="allow_drop",
                        help="let a layout's `ignore` leave out this float tensor although it holds nonzero values "
                             "(repeatable; a key, or a pattern with {i}); what is dropped is listed")


def input_format(args) -> str | None:
    """--from, or the user's layout file (--layout) that describes the input."""
    if getattr(args, "layout", None) is None:
        return args.from_
    if args.from_:
        raise UsageError("--layout describes the input's format itself; leave out --from")
    from transformer_parity.formats import LAYOUT_PREFIX
    return LAYOUT_PREFIX + args.layout
