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
