"""The transpose a streamed conversion spends its time on, copied in cache-sized tiles by compiled code.

`transposed` is `reference_numpy.mapping.transposed` (the same values, the same checks) with its tiles copied by
`_transpose.c` where it was built: the project's one C file, optional, a few lines of Python's C API, with vector
blocks as wide as the CPU has (SSE2, AVX2 or AVX-512). Without it, or with `TRANSFORMER_PARITY_NO_C=1` set (to time
or test the NumPy path alone), NumPy's blocks stand in (docs/formats.md has both speeds).
"""

from __future__ import annotations

import os

import numpy as np

from reference_numpy import mapping

try:
    from . import _transpose as _tiles
except ImportError:
    _tiles = None
if os.environ.get("TRANSFORMER_PARITY_NO_C"):
    _tiles = None

COMPILED = _tiles is not None  # whether the compiled tiles are in use


def transposed(array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-ordered transpose of a 2-D array, in a fresh array or in `out` (see `reference_numpy.mapping.transposed`),
    the tiles copied by the compiled code where it was built."""
    if _tiles is None or not mapping.is_tileable(array):
        return mapping.transposed(array, out)
    if out is not None and (out.shape != array.shape[::-1] or out.dtype != array.dtype
                            or not out.flags.c_contiguous or not out.flags.writeable):
        return mapping.transposed(array, out)  # its error names the problem
    bits = array.view(f"u{array.dtype.itemsize}")
    out = np.empty(bits.shape[::-1], bits.dtype) if out is None else out.view(bits.dtype)
    _tiles.transpose(bits, out)
    return out.view(array.dtype)
