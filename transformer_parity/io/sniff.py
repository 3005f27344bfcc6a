"""What kind of container a file is, from its first bytes (never from its name alone)."""

from __future__ import annotations

from pathlib import Path


def sniff(path: Path) -> str | None:
    """The container the first bytes announce: safetensors, zip (torch.save), pickle (legacy torch.save), hdf5."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "hdf5"
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= path.stat().st_size - 8:
        return "safetensors"
    if len(head) == 9 and head[:1] == b"\x80" and head[1] in (2, 3, 4, 5):  # PROTO opcode; a safetensors header
        return "pickle"  # length can start with 0x80 too, hence the order
    return None
