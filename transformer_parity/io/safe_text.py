"""Text from files, made safe to print: names read from a checkpoint (tensor names, shard names, file names in a
model directory) may hold terminal escape sequences, NUL bytes, newlines or bidirectional overrides. Every message
that echoes one goes through `printable`; the CLI's error and note lines go through `one_line`, so a name that
reaches a message some other way is escaped there too. `toml_string` quotes a name for a TOML file (the layout
scaffold), so that the file parses whatever the name holds.
"""

from __future__ import annotations

from typing import Iterable

_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: object, limit: int | None = 300) -> str:
    """`text` with every character that is not printable escaped as Python writes it (`\\x1b`, `\\x00`, `\\n`,
    `\\u202e`, a lone surrogate from an undecodable file name as `\\udcff`); longer than `limit` characters, cut
    with `...` and the full length."""
    text = str(text)
    if text.isprintable():
        out = text
    else:
        out = "".join(c if c.isprintable() else _escape(c) for c in text)
    if limit is not None and len(out) > limit:
        out = f"{out[:limit]}... ({len(text)} characters)"
    return out


def quoted(text: object, limit: int | None = 300) -> str:
    """`printable(text)` in single quotes, for a name inside a sentence."""
    return f"'{printable(text, limit)}'"


def one_line(text: object) -> str:
    """A message as one safe line: runs of whitespace (newlines included) become one space, every other
    character that is not printable is escaped. Used on every error and note line the CLI prints."""
    return printable(" ".join(str(text).split()), limit=None)


def names(items: Iterable[object], shown: int = 8) -> str:
    """Up to `shown` names, escaped and comma-separated, then how many more there are."""
    items = list(items)
    text = ", ".join(printable(n, limit=120) for n in items[:shown])
    return text + (f", ... ({len(items) - shown} more)" if len(items) > shown else "")


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    """`text` as a TOML basic string: quotes, backslashes and every control character escaped (TOML forbids raw
    U+0000-U+001F and U+007F in strings; C1 controls and other non-printables are escaped too, so the file is
    safe to view). A lone surrogate cannot be written as TOML: `ValueError` naming it."""
    out = []
    for char in text:
        if char in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif 0xD800 <= ord(char) <= 0xDFFF:
            raise ValueError(f"name {printable(text)} holds {_escape(char)}, which is not Unicode text (an "
                             "undecodable byte); a TOML file cannot hold it")
        else:
            code = ord(char)
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'
