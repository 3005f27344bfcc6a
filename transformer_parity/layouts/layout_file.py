"""Reading a layout file (`layouts.user` describes the format): TOML parsed as data, every name checked as a name
(`names`: `{i}` and `{qkv}` only) and as a key a weights file can hold, each line's number kept for messages, and a
tensor that two lines target refused with both lines named. Linear in the file's length."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import reference_numpy as rn
from reference_numpy.mapping import (BANKS, CHECKED, FUSED, PARTS, TRANSFORMS, Entry, check_table, hits, index,
                                     parse_pattern, placeholders)

from . import hparams as hp

OPTIONAL = CHECKED  # tied / sinusoid / causal_mask / ignore: matched keys that are checked or skipped
UNMAPPED = "?"  # the scaffold's mark for what the user still has to fill in
SECTIONS = ("config", "weights")
# TOML has no null: "none" in [config] is None where the field takes None (pad_id = "none": no padding token); a
# field that does not keeps the string (positional = "none", attention_scale = "none")
NONE = "none"


@dataclass
class Layout:
    """A parsed layout file: config fields and the table (canonical, external, transform)."""

    path: Path
    config: dict[str, Any]
    table: list[Entry]
    lines: dict[str, int] = field(default_factory=dict)  # external pattern -> line in the file (for messages)
    config_lines: dict[str, int] = field(default_factory=dict)  # [config] field -> line

    def where(self, entry: Entry) -> str:
        """`line 12 ('layers.{i}.norm.bias')`: an entry of the table, for messages."""
        line = self.lines.get(entry[1])
        return f"line {line} ({entry[1]!r})" if line else repr(entry[1])

    def origins(self) -> dict[str, str]:
        """[config] field -> `layout.toml:3`, for messages about a stated value."""
        return {name: _at(Path(self.path.name), line) for name, line in self.config_lines.items()}


MAX_LAYOUT_BYTES = 64 << 20  # a layout of a 100k-tensor model is a few MB
FOR_HDF5 = "hdf5"  # `parse(..., writing=FOR_HDF5)`: the names become HDF5 paths of a .weights.h5


def _toml():
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    import tomli  # Python 3.10: the pyproject dependency `tomli; python_version < "3.11"`
    return tomli


def parse(text: str, path: str | os.PathLike = "<layout>", writing: str | None = None) -> Layout:
    """A layout from TOML text; `ValueError` naming the file, and the line and column of a syntax error. Names
    are checked as names (`names.parse_pattern`: `{i}` and `{qkv}` only) and as keys a file can hold (`writing=
    FOR_HDF5`: as HDF5 paths too); a tensor two lines target is refused, naming both lines."""
    path = Path(path)
    toml = _toml()
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path}: nests tables or arrays too deeply to be a layout file") from None
    lines = _key_lines(text)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {unknown}; a layout file has [config] and [weights]")
    config = data.get("config", {})
    weights = data.get("weights")
    if not isinstance(config, dict):
        raise ValueError(f"{path}: [config] must be a table of TransformerConfig fields, received {config!r}")
    config_lines = {name: lines.get(("config", name), 0) for name in config}
    known = set(rn.TransformerConfig().to_dict())
    bad = sorted(set(config) - known)
    if bad:
        raise ValueError(f"{path}: [config] has unknown field(s) {bad}; fields are {', '.join(sorted(known))}")
    unfilled = [name for name, value in config.items() if value == UNMAPPED]
    if unfilled:
        raise ValueError(f"{_at(path, config_lines[unfilled[0]])}: [config] {', '.join(unfilled)} still "
                         f"\"{UNMAPPED}\" (from the scaffold): give each its value, as the model's code has it")
    config = {name: None if isinstance(value, str) and value.lower() == NONE
              and rn.config.field_type_problem(name, None) is None else value for name, value in config.items()}
    for name, value in config.items():
        problem = None if hp.is_reference(value) else rn.config.field_type_problem(name, value)
        if problem:
            raise ValueError(f"{_at(path, config_lines[name])}: [config] {problem}")
    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"{path}: a layout file needs a [weights] table: \"your name\" = \"canonical name "
                         "[transform]\"")
    table = []
    entry_lines = {}
    for external, value in weights.items():
        line = lines.get(("weights", external), 0)
        at = _at(path, line)
        if not isinstance(value, str) or len(value.split()) not in (1, 2):
            raise ValueError(f"{at}: [weights] {external!r} = {value!r}: expected \"canonical name\" or "
                             "\"canonical name transform\"")
        canonical, transform = (value.split() + ["identity"])[:2]
        if canonical == UNMAPPED:
            raise ValueError(f"{at}: [weights] {external!r} is not mapped yet (\"?\" from the scaffold); give its "
                             "canonical name, or \"- ignore\" for a buffer that is no parameter (a nonzero float "
                             "tensor also needs --allow-drop NAME)")
        if transform not in TRANSFORMS:
            raise ValueError(f"{at}: [weights] {external!r}: unknown transform {transform!r}; choose one of "
                             f"{', '.join(TRANSFORMS)}")
        try:
            parse_pattern(canonical)
            check_name(external, writing)
            _check_placeholders(canonical, external, transform)
        except ValueError as exc:
            raise ValueError(f"{at}: [weights] {exc}") from None
        table.append((canonical, external, transform))
        entry_lines[external] = line
    layout = Layout(path, dict(config), table, entry_lines, config_lines)
    try:
        check_table(table)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    _check_targets(layout)
    return layout


def _at(path: Path, line: int) -> str:
    """`layout.toml:12` (the file alone when the line is not known)."""
    return f"{path}:{line}" if line else str(path)


def load(path: str | os.PathLike, writing: str | None = None) -> Layout:
    """`parse` of a layout file, read at most `MAX_LAYOUT_BYTES` of it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"layout file {path}: " + ("no such file" if not path.exists() else "not a file"))
    with open(path, "rb") as f:
        data = f.read(MAX_LAYOUT_BYTES + 1)
    if len(data) > MAX_LAYOUT_BYTES:
        raise ValueError(f"layout file {path} is larger than {MAX_LAYOUT_BYTES >> 20} MiB; a layout lists one line per "
                         "tensor name pattern, a few MB for the largest models")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"layout file {path} is not UTF-8 text: {exc}") from None
    return parse(text, path, writing)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_BASIC_KEY = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_LITERAL_KEY = re.compile(r"'([^'\n]*)'")


def _key_lines(text: str) -> dict[tuple[str, str], int]:
    """`(section, key) -> line number` of each `key = value` line, in one pass over the text (for messages)."""
    out: dict[tuple[str, str], int] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("["):
            section = stripped[1:].split("]", 1)[0].strip()
            continue
        m = _BASIC_KEY.match(stripped) or _LITERAL_KEY.match(stripped) or _BARE_KEY.match(stripped)
        if not m:
            continue
        key = m.group(1) if m.re is not _BARE_KEY else m.group()
        if m.re is _BASIC_KEY and "\\" in key:
            try:
                key = _toml().loads(f"{m.group()} = 0").popitem()[0]  # TOML's escapes, decoded as TOML does
            except (ValueError, KeyError):
                pass
        out.setdefault((section, key), number)
    return out


def check_name(name: str, writing: str | None = None) -> None:
    """Refuse a key no weights file can hold under its name: empty, or with a NUL; for HDF5 (`writing=FOR_HDF5`)
    also an empty, `.` or `..` path component (a leading, trailing or doubled `/`), since `/` separates groups."""
    parse_pattern(name)
    if not name:
        raise ValueError("an empty name: a tensor needs a name")
    if "\0" in name:
        raise ValueError(f"{name!r} contains a NUL character, which no weights file keeps in a name")
    if writing == FOR_HDF5:
        bad = [part for part in name.split("/") if part in ("", ".", "..")]
        if bad:
            raise ValueError(f"{name!r} is not an HDF5 dataset path: '/' separates groups, so each part between "
                             f"slashes must be a name, received {bad[0]!r}")


def _check_placeholders(canonical: str, external: str, transform: str) -> None:
    needed = placeholders(canonical) - (set(PARTS) if transform in FUSED else set()) - (
        {"e", *PARTS} if transform in BANKS else set())  # a bank's key holds every expert (and gate and up)
    if transform not in OPTIONAL and not needed <= placeholders(external):
        raise ValueError(f"{external!r} = {canonical!r}: the canonical name uses "
                         f"{sorted(needed - placeholders(external))} which the key pattern does not")
    if transform in FUSED and placeholders(external) & set(PARTS):
        raise ValueError(f"{external!r}: a fused entry ({transform}) is one array holding all its parts (q, k and "
                         "v, or gate and linear1); its key pattern cannot contain {qkv} or {gate_up}")


def _check_targets(layout: Layout) -> None:
    """Refuse two lines that target one tensor: one canonical name (an explicit line and a `{i}` pattern line, or
    two explicit lines), or one key (an explicit key a pattern line also matches)."""
    written = [(c, (c, e, t)) for c, e, t in layout.table if t not in OPTIONAL]
    for what, pairs in (("canonical parameter", written), ("key", [(e, (c, e, t)) for c, e, t in layout.table])):
        by_text: dict[str, list[Entry]] = {}
        for name, entry in pairs:
            by_text.setdefault(name, []).append(entry)
        literal, patterned = index(pairs)
        twice = [(name, entries) for name, entries in by_text.items() if len(entries) > 1]
        twice += [(name, entries + [e for _, e in hits(name, {}, patterned)]) for name, entries in literal.items()]
        for name, found in twice:
            found = sorted(found, key=lambda entry: layout.lines.get(entry[1], 0))
            if len(found) > 1:
                raise ValueError(f"{layout.path}: {what} {name!r} is targeted twice, by {layout.where(found[0])} and "
                                 f"{layout.where(found[1])}; a tensor is read from, and written to, one name: keep "
                                 "one")


def output_kind(path: str | os.PathLike) -> str:
    """What `--to-layout` writes to `path`: `torch` (.pt/.pth/.bin), `safetensors` or `keras` (.weights.h5)."""
    name = Path(path).name.lower()
    kind = ("keras" if name.endswith(".weights.h5") else "torch" if name.endswith((".pt", ".pth", ".bin"))
            else "safetensors" if name.endswith(".safetensors") else None)
    if kind is None:
        raise ValueError(f"{path}: --to-layout writes a .pt/.pth/.bin state dict, a .safetensors or a .weights.h5")
    return kind


def load_for_writing(layout_path: str | os.PathLike, path: str | os.PathLike) -> Layout:
    """`load` a layout whose names will be written to `path`: as HDF5 dataset paths for a `.weights.h5`."""
    return load(layout_path, writing=FOR_HDF5 if output_kind(path) == "keras" else None)


def check_hdf5_paths(names: Mapping[str, str], layout: Layout) -> None:
    """Refuse names of which one is a group of another (`a` and `a/b`: a dataset cannot hold a dataset)."""
    paths = set(names.values())
    for name, h5_path in names.items():
        parts = h5_path.split("/")
        for depth in range(1, len(parts)):
            group = "/".join(parts[:depth])
            if group in paths:
                other = next(n for n, p in names.items() if p == group)
                raise ValueError(f"{layout.path}: {other!r} would be an HDF5 dataset and also the group holding "
                                 f"{name!r}; a .weights.h5 cannot hold both (rename one in [weights])")
