"""Names in tables and layout files: patterns are data, matched and filled by the small parser here, never by
`str.format`; and the names a weights file may hold.

A pattern is literal text with two placeholders, written exactly so: `{i}`, a layer index, written as Python writes
an int (no sign, no leading zeros, so that filling a name back gives the key it was read from), and `{qkv}`, one of
`q`, `k`, `v`. Anything else in braces (`{}`, `{x}`, a format spec such as `{i:>3}`, a lone brace) is refused when
the pattern is parsed. A placeholder used twice (`layers.{i}.norm2.{i}.bias`) matches the same text both times.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Iterable

PLACEHOLDERS = {"i": "the layer index", "qkv": "q, k or v"}
_GROUPS = {"i": "0|[1-9][0-9]{0,17}", "qkv": "[qkv]"}
_BRACES = re.compile(r"\{[^{}]*\}|[{}]")
Part = str | tuple[str]  # literal text, or (placeholder name,)


@functools.lru_cache(maxsize=4096)
def parse_pattern(pattern: str) -> tuple[Part, ...]:
    """A name pattern as its parts: literal text, and `("i",)` / `("qkv",)` for the placeholders. Anything else in
    braces (`{}`, `{x}`, a format spec such as `{i:>3}`, a lone brace) is refused: `ValueError` naming it."""
    if not isinstance(pattern, str):
        raise ValueError(f"a name must be a string, received {pattern!r}")
    parts: list[Part] = []
    position = 0
    for m in _BRACES.finditer(pattern):
        name = m.group()[1:-1]
        if name not in PLACEHOLDERS:
            raise ValueError(f"{pattern!r}: {m.group()!r} is not a placeholder; a name holds literal text, {{i}} (the "
                             "layer index) and {qkv} (q, k or v) only, written exactly so (no format specs)")
        if m.start() > position:
            parts.append(pattern[position:m.start()])
        parts.append((name,))
        position = m.end()
    if position < len(pattern):
        parts.append(pattern[position:])
    return tuple(parts)


def placeholders(pattern: str) -> set[str]:
    """The placeholder names `pattern` uses: `{"i", "qkv"}`, ..."""
    return {p[0] for p in parse_pattern(pattern) if isinstance(p, tuple)}


@functools.lru_cache(maxsize=4096)
def regex(pattern: str) -> re.Pattern:
    """`encoder.layers.{i}.self_attn.{qkv}.kernel` -> a regex with named groups `i` and `qkv`; a placeholder used
    twice must match the same text both times (a backreference)."""
    out, seen = [], set()
    for part in parse_pattern(pattern):
        if isinstance(part, str):
            out.append(re.escape(part))
        elif part[0] in seen:
            out.append(f"(?P={part[0]})")
        else:
            seen.add(part[0])
            out.append(f"(?P<{part[0]}>{_GROUPS[part[0]]})")
    return re.compile("".join(out))


def fill(pattern: str, **values) -> str:
    """`pattern` with its placeholders replaced by `values` (plain substitution, never `str.format`)."""
    out = []
    for part in parse_pattern(pattern):
        if isinstance(part, str):
            out.append(part)
        elif values.get(part[0]) is None:
            raise ValueError(f"{pattern!r} needs a value for {{{part[0]}}}")
        else:
            out.append(str(values[part[0]]))
    return "".join(out)


def index(entries: Iterable[tuple[str, Any]]) -> tuple[dict[str, list], list]:
    """Entries by their literal pattern (looked up in a dict) and the patterned ones (matched one by one), for
    `(pattern, entry)` pairs."""
    literal: dict[str, list] = {}
    patterned = []
    for pattern, entry in entries:
        if placeholders(pattern):
            patterned.append((regex(pattern), entry))
        else:
            literal.setdefault(pattern, []).append(entry)
    return literal, patterned


def hits(name: str, literal: dict[str, list], patterned: list) -> list[tuple[dict[str, str], Any]]:
    """`(placeholder values, entry)` for every entry of an `index` whose pattern matches `name`."""
    found = [({}, entry) for entry in literal.get(name, ())]
    for compiled, entry in patterned:
        m = compiled.fullmatch(name)
        if m:
            found.append((m.groupdict(), entry))
    return found


