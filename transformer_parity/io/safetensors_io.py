"""Streaming reads and writes of canonical `.safetensors` checkpoints, one tensor at a time.

The files are the format `reference_numpy.save_weights` writes (same metadata: format tag, version, config JSON)
and load with `safetensors` and `reference_numpy.load_weights`. This module exists for memory: the library's
`save` builds the whole file in memory as bytes and `reference_numpy.load_weights` reads the whole file before
splitting it, so a conversion would peak at twice the checkpoint. Here the header is validated up front (as
strictly as `safetensors` does: known dtypes, sizes that match shapes, offsets that tile the data exactly) and
each tensor is read into its own array or written from it, so the checkpoint is held once.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

import reference_numpy as rn
from reference_numpy.io import FORMAT_TAG, FORMAT_VERSION

from transformer_parity.io import limits
from transformer_parity.io.safe_text import printable, quoted
from transformer_parity.streaming.lazy import LazyArray, widen_bfloat16
from transformer_parity.streaming.writer import BandWriter

DTYPES = {"F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8"),
          "I32": np.dtype("<i4"), "U8": np.dtype("u1"), "BOOL": np.dtype("?")}
_CODES = {v: k for k, v in DTYPES.items()}
# Half-precision tensors (many Hugging Face checkpoints are stored in bfloat16) are read as float32, exactly:
# a bfloat16 is the top 16 bits of a float32, a float16 widens without rounding.
WIDENED = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2")}
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header


class SafetensorsHeader:
    """The parsed, validated header of a safetensors file: tensor entries and string metadata."""

    def __init__(self, path: Path, entries: dict[str, tuple[np.dtype, tuple[int, ...], int, int]],
                 metadata: dict[str, str], data_start: int, stored: dict[str, str] | None = None):
        self.path, self.entries, self.metadata, self.data_start = path, entries, metadata, data_start
        self.stored = stored or {}  # tensor name -> its stored code, for the tensors read as float32 (WIDENED)


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Parse and check the header; `ValueError` naming the problem for anything that is not a valid file."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path} is empty (0 bytes)")
    if size < 8:
        raise ValueError(f"{path} is not a safetensors file: only {size} bytes")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > MAX_HEADER or header_len > size - 8:  # the length itself is not echoed: bytes of the file
            raise ValueError(f"{path} is not a valid safetensors file: the header length its first 8 bytes declare "
                             f"exceeds the file size {size}" + (f" or the limit of {MAX_HEADER} bytes"
                                                                 if header_len > MAX_HEADER else "")
                             + " (truncated or not safetensors)")
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except UnicodeDecodeError as exc:  # its message quotes the byte
        raise ValueError(f"{path} is not a valid safetensors file: its header is not UTF-8 text (at byte "
                         f"{8 + exc.start})") from None
    except json.JSONDecodeError as exc:  # line, column and position only
        raise ValueError(f"{path} is not a valid safetensors file: its header is not JSON ({exc.msg} at byte "
                         f"{8 + exc.pos})") from None
    except RecursionError:
        raise ValueError(f"{path} is not a valid safetensors file: its header nests JSON too deeply") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a valid safetensors file: header is a JSON {type(header).__name__}, "
                         "expected an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{path} is not a valid safetensors file: __metadata__ must map strings to strings")
    data_len = size - 8 - header_len
    entries, spans, stored = {}, [], {}
    for name, info in header.items():
        try:
            code, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path} is not a valid safetensors file: entry {quoted(name)} lacks dtype, shape or "
                             f"data_offsets, received {printable(repr(info), 80)}") from None
        if not isinstance(code, str) or (code not in DTYPES and code not in WIDENED):
            raise ValueError(f"{path}: tensor {quoted(name)} has dtype {printable(repr(code), 40)}; supported: "
                             f"{', '.join([*DTYPES, *WIDENED])}")
        if not (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)):
            raise ValueError(f"{path}: tensor {quoted(name)} has an invalid shape {printable(repr(shape), 80)}")
        dtype = WIDENED.get(code, DTYPES.get(code))
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise ValueError(f"{path}: tensor {quoted(name)} has invalid data_offsets "
                             f"{printable(repr([begin, end]), 80)}")
        if end - begin != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"{path}: tensor {quoted(name)} of shape {shape} and dtype {code} needs "
                             f"{math.prod(shape) * dtype.itemsize} bytes, its offsets span {end - begin}")
        if code in WIDENED:
            stored[name], dtype = code, np.dtype(np.float32)  # the dtype read_tensors returns
        entries[name] = (dtype, tuple(shape), begin, end)
        spans.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise ValueError(f"{path} is not a valid safetensors file: tensor {quoted(name)} starts at byte {begin}, "
                             f"expected {position} (overlapping or missing data)")
        position = end
    if position != data_len:
        raise ValueError(f"{path} is not a valid safetensors file: the header describes {position} bytes of data, "
                         f"the file holds {data_len} (truncated or padded)")
    return SafetensorsHeader(path, entries, metadata, 8 + header_len, stored)


def read_tensors(header: SafetensorsHeader, names: Iterable[str] | None = None,
                 on_tensor: Callable[[str, int], None] | None = None) -> dict[str, np.ndarray]:
    """Read tensors (all by default) into fresh arrays in native byte order, one read per tensor."""
    names = list(header.entries) if names is None else list(names)
    tensors = {}
    with open(header.path, "rb") as f:
        for name in names:
            dtype, shape, begin, end = header.entries[name]
            f.seek(header.data_start + begin)
            code = header.stored.get(name)
            if code is not None:  # bfloat16 / float16 -> float32, exactly
                raw = np.fromfile(f, dtype=WIDENED[code], count=math.prod(shape)).reshape(shape)
                tensors[name] = widen_bfloat16(raw) if code == "BF16" else raw.astype(np.float32)
            else:
                array = np.fromfile(f, dtype=dtype, count=math.prod(shape)).reshape(shape)
                tensors[name] = array.astype(dtype.newbyteorder("="), copy=False)
            if on_tensor is not None:
                on_tensor(name, end - begin)
    return tensors


def bfloat16() -> np.dtype:
    """NumPy's bfloat16 (from ml_dtypes, the type JAX, TensorFlow and Keras share)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def stored_dtype(header: SafetensorsHeader, name: str) -> np.dtype:
    """The dtype tensor `name` is stored in (bfloat16 and float16 kept, not widened)."""
    code = header.stored.get(name)
    if code == "BF16":
        return bfloat16()
    return np.dtype(np.float16) if code == "F16" else header.entries[name][0].newbyteorder("=")


def lazy_tensors(header: SafetensorsHeader, on_tensor: Callable[[str, int], None] | None = None,
                 keep_dtype: bool = True) -> dict[str, LazyArray]:
    """{name: LazyArray} over a file's tensors: each read from disk when asked, in its stored dtype
    (`keep_dtype=False`: bfloat16 and float16 widened to float32, as `read_tensors` does). Nothing is held."""
    def reader(name: str, dtype: np.dtype):
        def read() -> np.ndarray:
            _, shape, begin, end = header.entries[name]
            with open(header.path, "rb") as f:
                f.seek(header.data_start + begin)
                code = header.stored.get(name)
                raw = np.fromfile(f, dtype=WIDENED[code] if code else header.entries[name][0],
                                  count=math.prod(shape)).reshape(shape)
            if on_tensor is not None:
                on_tensor(name, end - begin)
            if code == "BF16":
                return raw.view(bfloat16()) if keep_dtype else widen_bfloat16(raw)
            return raw.astype(dtype.newbyteorder("="), copy=False)
        return read

    out = {}
    for name, (_, shape, begin, end) in header.entries.items():
        dtype = stored_dtype(header, name) if keep_dtype else header.entries[name][0].newbyteorder("=")
        as_stored = keep_dtype or name not in header.stored
        span = (str(header.path), header.data_start + begin, end - begin) if as_stored else None
        out[name] = LazyArray(shape, dtype, reader(name, dtype), span)
    return out


def widened_note(files: Iterable[str | os.PathLike]) -> str | None:
    """A note for `Loaded.notes` when any of these safetensors files stores bfloat16 or float16 tensors (read as
    float32, exactly): which dtype, how many tensors; None when none does."""
    counts: dict[str, int] = {}
    for file in files:
        for code in read_header(file).stored.values():
            counts[code] = counts.get(code, 0) + 1
    if not counts:
        return None
    names = {"BF16": "bfloat16", "F16": "float16"}
    stored = ", ".join(f"{n} tensor(s) in {names[code]}" for code, n in sorted(counts.items()))
    return (f"stored {stored}, read as float32 exactly; verify --dtype {names[max(counts, key=counts.get)]} runs "
            "the ports in that precision")


def read_canonical(path: str | os.PathLike, on_tensor: Callable[[str, int], None] | None = None, lazy: bool = False
                   ) -> tuple[rn.TransformerConfig | None, dict[str, np.ndarray], dict[str, str]]:
    """`(stored config or None, tensors, metadata)` of a safetensors file (`lazy`: see `lazy_tensors`)."""
    header = read_header(path)
    config = None
    if "config" in header.metadata:
        try:
            config = rn.TransformerConfig.from_json(header.metadata["config"])
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"{path}: the config stored in its metadata is invalid: {exc}") from None
        limits.check_config_against_file(config, len(header.entries), str(path))
    tensors = lazy_tensors(header, on_tensor) if lazy else read_tensors(header, on_tensor=on_tensor)
    return config, tensors, header.metadata


def write_canonical(path: str | os.PathLike, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray],
                    on_tensor: Callable[[str, int], None] | None = None, consume: bool = False,
                    origin: str | None = None) -> None:
    """Write weights in `parameter_shapes` order with the config in the metadata, tensor by tensor, to `path`
    (the caller owns atomicity: pass a temporary path and rename it). `consume=True` deletes each entry of
    `weights` (a dict) once written. `origin`: the external family the weights came from (`hf-phi3`), kept so that
    a later export writes that family again."""
    rn.validate_weights(config, weights)
    metadata = {"format": FORMAT_TAG, "format_version": FORMAT_VERSION, "config": config.to_json()}
    if origin is not None:
        metadata["origin"] = origin
    write_tensors(path, weights, list(rn.parameter_shapes(config)), metadata, on_tensor, consume)


def dtype_code(dtype: np.dtype) -> str:
    """The safetensors dtype code of a NumPy dtype (`BF16` for ml_dtypes' bfloat16)."""
    if dtype.name == "bfloat16":
        return "BF16"
    code = _CODES.get(np.dtype(dtype).newbyteorder("<"))
    if code is None:
        raise ValueError(f"dtype {dtype} cannot be stored in safetensors here")
    return code


def write_tensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray], names: list[str],
                  metadata: Mapping[str, str], on_tensor: Callable[[str, int], None] | None = None,
                  consume: bool = False) -> None:
    """A safetensors file of `tensors[name]` for each of `names`, in that order, with `metadata`, streamed tensor by
    tensor and synced to disk (the caller owns atomicity). `consume=True` deletes each entry once written."""
    header: dict = {"__metadata__": dict(metadata)}
    offset = 0
    for name in names:
        array = tensors[name]
        if not hasattr(array, "dtype"):
            array = np.asarray(array)
        code = dtype_code(array.dtype)
        nbytes = math.prod(array.shape) * array.dtype.itemsize
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data section to 8 bytes
    with open(path, "wb") as f, BandWriter(f) as writes:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        writes.read_ahead([tensors[name] for name in names])  # their sources read while the ones before are written
        for name in names:
            nbytes = writes.put(tensors.pop(name) if consume else tensors[name])
            if on_tensor is not None:
                on_tensor(name, nbytes)
        writes.wait()
        f.flush()
        os.fsync(f.fileno())
