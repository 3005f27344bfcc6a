"""Which names a weights file can hold: a layout may name a tensor anything, but an HDF5 file (`.weights.h5`) keys
its datasets by paths, so some names cannot be written there, or would land on another name's group."""

from __future__ import annotations

from typing import Iterable

from ..safe_text import quoted


def hdf5_problem(name: str) -> str | None:
    """Why `name` cannot be a dataset path in an HDF5 file, or None: it must be `group/.../dataset`, each part
    non-empty and neither `.` nor `..`, with no NUL byte."""
    if not isinstance(name, str) or name == "":
        return "is empty"
    if "\0" in name:
        return "holds a NUL byte"
    parts = name.split("/")
    if name.startswith("/") or name.endswith("/") or "" in parts:
        return "has an empty path component (a leading, trailing or doubled '/')"
    if any(part in (".", "..") for part in parts):
        return "has a '.' or '..' path component"
    return None


def check_hdf5_paths(names: Iterable[str], where: str) -> None:
    """`ValueError` naming the first name that cannot be written as a dataset of a `.weights.h5` file, or one that
    another name needs as a group (`a` and `a/b`)."""
    names = list(names)
    for name in names:
        problem = hdf5_problem(name)
        if problem is not None:
            raise ValueError(f"{where}: the name {quoted(name)} {problem}; a .weights.h5 file keys its tensors by "
                             "HDF5 paths such as 'layers/dense/vars/0'")
    datasets = set(names)
    for name in names:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            group = "/".join(parts[:depth])
            if group in datasets:
                raise ValueError(f"{where}: {quoted(group)} and {quoted(name)} cannot both be written: in a "
                                 f".weights.h5 file the first would have to be a tensor and the group holding the "
                                 "second")
