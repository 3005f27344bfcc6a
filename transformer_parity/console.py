"""The command's entry point, for the `transformer-parity` console script and `python -m transformer_parity` alike.

SIGINT and SIGTERM are held while the CLI loads: an interrupt that lands inside a C extension's import (NumPy's
takes the datetime module's C API) surfaces there as an ImportError with a traceback, not as an interrupt. Held, it
arrives once the imports are done, as a KeyboardInterrupt (one line, exit 130) or SIGTERM's default end. The console
script's generated wrapper imports this module, which imports nothing but `signal` and `sys`, so that the CLI's
import happens here, held.
"""

from __future__ import annotations

import signal
import sys

HELD = (signal.SIGINT, signal.SIGTERM)


def main() -> int:
    try:
        try:
            unheld = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
        except (AttributeError, OSError, ValueError):  # no signal masks here: load unprotected
            unheld = None
        try:
            from .cli import main as cli_main
        finally:
            if unheld is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, unheld)  # a held signal is delivered here
    except KeyboardInterrupt:  # Ctrl-C while the CLI itself loads: one line, as anywhere else
        sys.stderr.write("transformer-parity: interrupted\n")
        return 130
    return cli_main()
