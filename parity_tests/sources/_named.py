"""Attribute names as data: a fixture model's modules are set and read through a `names` mapping, so that the same
model can be saved under its author's names (`values`, `to_kv`, `c_attn`, ...) or with every module renamed to a
name that says nothing (`m0`, `m1`, ...): what the role-settling probe must cope with."""

from __future__ import annotations

from typing import Mapping


class Names:
    """`names[role]` -> the attribute name used for that role."""

    def __init__(self, roles: tuple[str, ...], renamed: bool):
        self.map: Mapping[str, str] = {r: (f"m{i}" if renamed else r) for i, r in enumerate(roles)}

    def put(self, module, role: str, child) -> None:
        setattr(module, self.map[role], child)

    def get(self, module, role: str):
        return getattr(module, self.map[role])


def renamed_fixture(base) -> dict:
    """The fixture API (`parity_tests.sources`) of `base`'s model with every module renamed: its constants, and
    `build`, `save_checkpoint`, `make_source`, `forward`, `forward_f64` passing `renamed=True`. A `*_renamed` module
    puts these in its namespace, so that `verify --source FILE.py:forward` finds them there."""
    from parity_tests.sources import checkpoint_path

    def build(seed: int = 0):
        return base.build(seed, renamed=True)

    def save_checkpoint(path, seed: int = 0):
        return base.save_checkpoint(path, seed, renamed=True)

    def make_source(path):
        return base.make_source(path, renamed=True)

    def forward(batch):
        return make_source(checkpoint_path())(batch)

    def forward_f64(batch):
        return forward({**batch, "dtype": "float64"})

    names = ("PAD_ID", "ENCODER_DECODER", "SRC_VOCAB", "TGT_VOCAB", "NUM_HEADS", "MAX_LEN", "CHECKPOINT_SUFFIX")
    return {**{name: getattr(base, name) for name in names}, "RENAMED": True, "build": build,
            "save_checkpoint": save_checkpoint, "make_source": make_source, "forward": forward,
            "forward_f64": forward_f64}
