"""The tests' view of the one tolerance module, `transformer_parity.tolerances` (which `verify` uses too): every
comparison is `assert_allclose(actual, desired=float64 NumPy, rtol=0, atol=...)`.

- Model outputs (`assert_within_floor`): the verify rule, K = `RATIO_LIMIT` measured float32 rounding floors of
  the same output on the same weights and inputs (times eps64/eps32 for float64).
- Randomly drawn configs and third-party models (`property_atol`): the same rule, never below the fixed table.
- Comparisons with no float32 run of the same computation to measure (`atol`): the fixed table, `ATOL`.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from transformer_parity.tolerances import ATOL, EPS32, EPS64, PAIR_RATIO_LIMIT, RATIO_LIMIT, atol, floor, floor_atol, floors, property_atol


def assert_within_floor(actual: Mapping[str, np.ndarray], desired: Mapping[str, np.ndarray],
                        floor_run: Mapping[str, np.ndarray], dtype: str) -> None:
    """Same output names in the same order, and each within K floors of the float64 `desired`; `floor_run` is the
    NumPy reference computing in float32 on the same weights and inputs."""
    assert list(actual) == list(desired)
    measured = floors(desired, floor_run, dtype)
    for name, value in desired.items():
        np.testing.assert_allclose(actual[name], value, rtol=0, atol=floor_atol(measured[name]),
                                   err_msg=f"sublayer {name}: more than {RATIO_LIMIT:g} floors of {measured[name]:.2e}")
