"""`python -m transformer_parity ...`, the same as the `transformer-parity` console script."""

import sys

from .cli import main

sys.exit(main())
