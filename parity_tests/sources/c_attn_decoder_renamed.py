"""`c_attn_decoder` with every module attribute renamed `m0`, `m1`, ...: the same model, names that say nothing
(`m11.m9.0.m4.m0.weight`), so that only the source's behaviour can tell each tensor's role."""

from __future__ import annotations

from parity_tests.sources import c_attn_decoder as _base
from parity_tests.sources._named import renamed_fixture

globals().update(renamed_fixture(_base))
