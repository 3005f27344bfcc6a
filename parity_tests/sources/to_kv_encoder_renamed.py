"""`to_kv_encoder` with every module attribute renamed `m0`, `m1`, ...: the same model, names that say nothing
(`m6.0.0.m4.m0.weight`), so that only the source's behaviour can tell each tensor's role."""

from __future__ import annotations

from parity_tests.sources import to_kv_encoder as _base
from parity_tests.sources._named import renamed_fixture

globals().update(renamed_fixture(_base))
