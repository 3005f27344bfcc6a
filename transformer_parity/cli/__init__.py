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
import pickle
import sys
from typing import Sequence

from transformer_parity import __version__
from transformer_parity.errors import UsageError
from transformer_parity.io.safe_text import one_line

from .common import PROG, Formatter, Parser, add_common

INTERNAL_ERROR = 3  # exit status of an exception no command expected (1 is reserved for "the backends differ")
COMMAND_MODULES = ["transformer_parity.cli.convert", "transformer_parity.cli.verify", "transformer_parity.cli.layout",
                   "transformer_parity.cli.train", "transformer_parity.bench.cli"]


# --- the parser -----------------------------------------------------------------------------------------------------

DESCRIPTION = """\
Convert Transformer checkpoints between NumPy (safetensors), PyTorch and Keras, and verify that every backend
computes the same function, sublayer by sublayer, with tolerances derived from measured float32 rounding.

start here:
  transformer-parity verify                 # NumPy vs PyTorch vs Keras on the paper's base model
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=DESCRIPTION, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    for name in COMMAND_MODULES:
        _register(sub, name)
    for subparser in sub.choices.values():
        _add_common_everywhere(subparser)
    return parser


def _add_common_everywhere(parser: argparse.ArgumentParser) -> None:
    """--quiet and --debug on a subcommand and on each of its own actions (`bench model compare ...`)."""
    add_common(parser)
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
        if _SIGINT_SEEN:  # Ctrl-C inside an extension's import (NumPy reports it as an ImportError): not a plug-in fault
            raise KeyboardInterrupt from exc
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
    import threading

    from transformer_parity import quiet

    argv = sys.argv[1:] if argv is None else list(argv)
    quiet.configure(debug="--debug" in argv)  # before anything imports a framework
    ours = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not where the caller ignores Ctrl-C
    if ours:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        return _main(argv)
    finally:
        if ours and signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _main(argv: list[str]) -> int:
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
