"""`c_attn_decoder` with every module attribute renamed `m0`, `m1`, ...: the same model, names that say nothing
(`m11.m9.0.m4.m0.weight`), so that only the source's behaviour can tell each tensor's role."""

from __future__ import annotations

from pathlib import Path

from parity_tests.sources import checkpoint_path
from parity_tests.sources import c_attn_decoder as _base
from parity_tests.sources.c_attn_decoder import (CHECKPOINT_SUFFIX, ENCODER_DECODER, MAX_LEN, NUM_HEADS,  # noqa: F401
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
