"""`keras_dense_n` with every module attribute renamed `m0`, `m1`, ...: the same model, names that say nothing
(`m4/block_1/m0/dense_2/vars/0`), so that only the source's behaviour can tell each tensor's role."""

from __future__ import annotations

from parity_tests.sources import keras_dense_n as _base
from parity_tests.sources._named import renamed_fixture

globals().update(renamed_fixture(_base))
