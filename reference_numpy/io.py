"""Canonical checkpoints: safetensors files whose metadata carries the config.

safetensors is imported inside the functions so that `import reference_numpy` pulls in NumPy only.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Mapping

import numpy as np

from .config import TransformerConfig
from .schema import validate_weights

FORMAT_TAG = "transformer-parity/canonical"
FORMAT_VERSION = "1"


def save_weights(path: str | os.PathLike, config: TransformerConfig, weights: Mapping[str, np.ndarray],
                 *, overwrite: bool = False) -> Path:
    """Write canonical weights and their config to a `.safetensors` file, atomically (temp file, then rename)."""
    from safetensors.numpy import save

    validate_weights(config, weights)
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True (CLI: --force) to replace it")
    metadata = {"format": FORMAT_TAG, "format_version": FORMAT_VERSION, "config": config.to_json()}
    data = save({k: np.ascontiguousarray(v) for k, v in weights.items()}, metadata=metadata)
    atomic_write_bytes(path, data)
    return path


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Tensors and metadata of any safetensors file; a clear `ValueError` if it is not one."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    path = _existing_file(path)
    raw = path.read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path} is not a safetensors file: only {len(raw)} bytes")
    header_len = int.from_bytes(raw[:8], "little")
    if header_len > len(raw) - 8:
        raise ValueError(f"{path} is not a valid safetensors file: header length {header_len} exceeds the file "
                         f"size {len(raw)} (truncated or not safetensors)")
    try:
        header = json.loads(raw[8:8 + header_len])
        tensors = load(raw)
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a valid safetensors file: {exc}") from None
    metadata = header.get("__metadata__") or {}
    return tensors, metadata


def load_weights(path: str | os.PathLike, config: TransformerConfig | None = None
                 ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Read a canonical checkpoint; returns `(config, weights)`, validated against each other.

    `config` is needed only for a file without a config in its metadata; if both are present they must agree.
    """
    tensors, metadata = read_safetensors(path)
    stored = TransformerConfig.from_json(metadata["config"]) if "config" in metadata else None
    if stored is None and config is None:
        raise ValueError(f"{path} carries no config in its metadata; give one explicitly")
    if stored is not None and config is not None and stored != config:
        changed = {k: (v, getattr(config, k)) for k, v in stored.to_dict().items() if getattr(config, k) != v}
        raise ValueError(f"the config given does not match the one stored in {path}: (stored, given) = {changed}")
    config = stored or config
    try:
        validate_weights(config, tensors)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return config, tensors


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it into place. Only a regular file (or a
    new name) is replaced: a symbolic link, FIFO or device at `path` is refused. The file gets the mode the umask
    gives a new file (mkstemp's 0600 would hide it from other users), or keeps the mode of the file it replaces."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ValueError(f"{path} exists and is not a regular file (a link, FIFO, device or directory); refusing to "
                         "replace it")
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it is to set it
    os.umask(mask)
    return mask


def _existing_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, expected a file")
    return path
