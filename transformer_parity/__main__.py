"""`python -m transformer_parity ...`, the same as the `transformer-parity` console script (`console.main`, which
holds SIGINT and SIGTERM while the CLI loads)."""

import sys

from .console import main

sys.exit(main())
