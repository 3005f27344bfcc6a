"""`python -m transformer_parity ...`, the same as the `transformer-parity` console script.

SIGINT and SIGTERM are held while the CLI loads: an interrupt that lands inside a C extension's import (NumPy's
takes the datetime module's C API) surfaces there as an ImportError with a traceback, not as an interrupt. Held, it
arrives once the imports are done, as a KeyboardInterrupt (one line, exit 130) or SIGTERM's default end.
"""

import signal
import sys

_HELD = (signal.SIGINT, signal.SIGTERM)

try:
    try:
        _unheld = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    except (AttributeError, OSError, ValueError):  # no signal masks here: load unprotected
        _unheld = None
    try:
        from .cli import main
    finally:
        if _unheld is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, _unheld)  # a held signal is delivered here
except KeyboardInterrupt:  # Ctrl-C while the CLI itself loads: one line, as anywhere else
    sys.stderr.write("transformer-parity: interrupted\n")
    sys.exit(130)

sys.exit(main())
