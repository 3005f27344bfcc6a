"""`keras_dense_n` with every module attribute renamed `m0`, `m1`, ...: the same model, names that say nothing
(`m4/block_1/m0/dense_2/vars/0`), so that only the source's behaviour can tell each tensor's role."""

from __future__ import annotations

from pathlib import Path

from parity_tests.sources import checkpoint_path
from parity_tests.sources import keras_dense_n as _base
from parity_tests.sources.keras_dense_n import (CHECKPOINT_SUFFIX, ENCODER_DECODER, MAX_LEN, NUM_HEADS,  # noqa: F401
                                                PAD_ID, SRC_VOCAB, TGT_VOCAB)

RENAMED = True


def build(seed: int = 0):
    return _base.build(seed, renamed=True)


def save_checkpoint(path: str | Path, seed: int = 0) -> Path:
    return _base.save_checkpoint(path, seed, renamed=True)


def make_source(path: str | Path):
    return _base.make_source(path, renamed=True)


def forward(batch):
    return make_source(checkpoint_path())(batch)


def forward_f64(batch):
    return forward({**batch, "dtype": "float64"})
