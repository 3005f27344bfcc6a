"""`python -m transformer_parity ...`, the same as the `transformer-parity` console script."""

import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the CLI itself loads: one line, as anywhere else
    sys.stderr.write("transformer-parity: interrupted\n")
    sys.exit(130)

sys.exit(main())
