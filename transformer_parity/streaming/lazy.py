"""Arrays not read yet: a checkpoint streamed tensor by tensor.

A `LazyArray` knows its shape and dtype now and reads its values when asked. A checkpoint read lazily is a dict of
them; the mapping engine (`reference_numpy.mapping.read` / `write`, given `defer=deferred`) maps them to more of
them, so a writer that takes one entry at a time holds a few tensors, never the model. `row_bands` gives a lazy
array's values a band of rows at a time: from the file's bytes, or through a transpose or a cast of them.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import numpy as np

from reference_numpy.mapping import RESHAPES

from .transpose import transposed

# A streamed tensor is rearranged, cast and written this many bytes at a time, at most: a few bands stay in the
# core's share of the cache, and a writer keeps a few of them as reused buffers (`row_bands(..., out=)`).
BAND_BYTES = 8 << 20

# (rows per band, out=None) -> (start, stop, rows[start:stop]) for each band; `out(shape, dtype)`, where given, is the
# array a band that is made afresh (a transpose) is written into: a writer's recycled buffer, since an array
# allocated afresh for every band costs a page fault and a zeroed page for every 4 KiB of it.
Bands = Callable[..., Iterator[tuple[int, int, np.ndarray]]]


class LazyArray:
    """An array not yet in memory: its shape and dtype now, its values when `np.asarray` asks (each time, nothing
    kept). A checkpoint read lazily is a dict of these; the engine below maps them to more of them, so a writer that
    takes one entry at a time holds a few tensors, never the model. `row_bands` gives the values a band of rows at a
    time: from the file's bytes (`span`), or from `bands`, which a transpose or a cast defines over its source."""

    __slots__ = ("shape", "dtype", "_compute", "span", "bands", "source")

    def __init__(self, shape: tuple[int, ...], dtype, compute: Callable[[], np.ndarray],
                 span: tuple[str, int, int] | None = None, bands: Bands | None = None, source: Any = None):
        self.shape, self.dtype, self._compute = tuple(shape), np.dtype(dtype), compute
        self.span = span  # (file, offset, nbytes) when the values are those bytes of a file, C order, little-endian
        self.bands = bands  # rows per band -> its bands, without the whole array where the source allows
        self.source = source  # the one array the values are made from (a transpose's, a cast's), where there is one

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self._compute()
        return array if dtype is None else array.astype(dtype, copy=False)

    def astype(self, dtype) -> "LazyArray":
        """The same array cast to `dtype` when it is read (a band at a time by `row_bands`)."""
        if np.dtype(dtype) == self.dtype:
            return self
        return LazyArray(self.shape, dtype, lambda: cast(np.asarray(self), dtype),
                         bands=lambda rows, out=None: ((a, b, cast(x, dtype)) for a, b, x in _bands(self, rows)),
                         source=self)  # a cast makes its own array: `out` is not for its source

    def __repr__(self) -> str:
        return f"LazyArray(shape={self.shape}, dtype={self.dtype})"


def widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values (ml_dtypes' bfloat16, or their 2-byte bits: uint16, an opaque HDF5 type) as float32, on the
    bits: a bfloat16 is the top half of a float32, so this is exact, and several times faster than the element-wise
    conversion."""
    bits = np.asarray(bits)
    wide = (bits if bits.dtype.kind == "u" else bits.view(np.uint16)).astype(np.uint32)  # "<u2" read from a file
    wide <<= 16  # in place: one buffer
    return wide.view(np.float32)


def cast(array: np.ndarray, dtype) -> np.ndarray:
    """`array.astype(dtype)`; bfloat16 -> float32 on the bits (`widen_bfloat16`)."""
    dtype = np.dtype(dtype)
    if array.dtype.name == "bfloat16" and dtype == np.float32:
        return widen_bfloat16(array)
    return array.astype(dtype)


def row_bands(array, max_bytes: int = BAND_BYTES, itemsize: int = 0,
              out: Callable[[tuple[int, ...], np.dtype], np.ndarray] | None = None,
              ) -> Iterator[tuple[int, int, np.ndarray]]:
    """`(start, stop, array[start:stop])` along axis 0, in order, each band at most `max_bytes` (counted at the wider
    of the array's itemsize and `itemsize`, the dtype the caller makes of it; at least one row). A `LazyArray` is
    read a band at a time where it can be (a file's bytes, a transpose, a cast of either); otherwise it is read
    whole and sliced. A 0-d array is one band. With `out(shape, dtype)`, a band made afresh (a transpose) is written
    into the array it returns, which the caller may reuse once it is done with the band (`Bands`)."""
    shape = tuple(array.shape)
    if not shape:
        yield 0, 1, np.asarray(array)
        return
    row = int(np.prod(shape[1:], dtype=np.int64)) * max(itemsize, array.dtype.itemsize)
    yield from _bands(array, max(1, max_bytes // max(row, 1)), out)


def _bands(array, rows: int, out=None) -> Iterator[tuple[int, int, np.ndarray]]:
    """`row_bands` with the rows per band given."""
    shape = tuple(array.shape)
    if getattr(array, "bands", None) is not None:
        yield from array.bands(rows, out)
        return
    span = getattr(array, "span", None)
    if span is not None and shape:
        file, offset, _ = span
        row = int(np.prod(shape[1:], dtype=np.int64)) * array.dtype.itemsize
        with open(file, "rb") as f:
            f.seek(offset)
            for a in range(0, shape[0], rows):
                b = min(a + rows, shape[0])
                raw = np.fromfile(f, dtype=np.uint8, count=(b - a) * row)  # the next rows, in order
                if raw.size != (b - a) * row:
                    raise ValueError(f"{file} ended inside a tensor (truncated while being read?)")
                yield a, b, raw.view(_little(array.dtype)).reshape((b - a,) + shape[1:]).astype(array.dtype,
                                                                                                  copy=False)
        return
    whole = np.asarray(array)
    for a in range(0, shape[0], rows):
        yield a, min(a + rows, shape[0]), whole[a:a + rows]


def _little(dtype: np.dtype) -> np.dtype:
    return dtype if dtype.byteorder in ("|", "<") or dtype.kind == "V" else dtype.newbyteorder("<")


def _transposed_bands(source) -> Bands:
    """The bands of a 2-D `source`'s transpose: the source read once (in its own dtype), the transpose copied a band
    of its rows (the source's columns) at a time, so a transposed tensor is never held twice."""
    def bands(rows: int, out=None):
        whole = mapped(source)  # (out, in)
        for a in range(0, whole.shape[1], rows):
            b = min(a + rows, whole.shape[1])
            target = None if out is None else out((b - a, whole.shape[0]), whole.dtype)
            yield a, b, transposed(whole[:, a:b], target)  # (in[a:b], out)
    return bands


def mapped(array) -> np.ndarray:
    """The values of `array`: for a `LazyArray` whose values are a file's bytes (`span`), a read-only view of the
    file mapped into memory (the pages the page cache already holds, with no copy into a fresh buffer, which for a
    large tensor costs a page fault per page); otherwise `np.asarray`. The mapping closes with the last view."""
    span = getattr(array, "span", None)
    dtype = getattr(array, "dtype", None)
    if span is None or dtype is None or dtype.hasobject:
        return np.asarray(array)
    import mmap
    file, offset, nbytes = span
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(file, "rb") as f:
        if os.fstat(f.fileno()).st_size < offset + nbytes:
            raise ValueError(f"{file} ended inside a tensor (truncated while being read?)")
        if nbytes == 0:
            return np.asarray(array)
        region = mmap.mmap(f.fileno(), offset + nbytes - start, access=mmap.ACCESS_READ, offset=start)
    flat = np.frombuffer(region, dtype=np.uint8, count=nbytes, offset=offset - start)
    return flat.view(_little(np.dtype(dtype))).reshape(array.shape)


def _reshaped_bands(source, shape: tuple[int, ...]) -> Bands | None:
    """The bands of `source` reshaped (C order) to `shape`, where a row of `shape` is whole rows of the source
    (identity, a split last axis, a leading unit axis, heads split off the first axis); else None."""
    if not shape or not source.shape:
        return None
    inner, source_inner = int(np.prod(shape[1:], dtype=np.int64)), int(np.prod(source.shape[1:], dtype=np.int64))
    if source_inner == 0 or inner % source_inner:
        return None
    k = inner // source_inner  # source rows per row of `shape`

    def bands(rows: int, out=None):
        for a, b, band in _bands(source, rows * k, out):
            yield a // k, -(-b // k), band.reshape((-1,) + shape[1:])
    return bands


def is_lazy(array: Any) -> bool:
    return isinstance(array, LazyArray)


def leading_rows(array: Any, start: int, stop: int) -> Any:
    """Rows `start:stop` of `array`'s first axis (one expert of a bank of experts): a `LazyArray` that reads only
    those rows from the file where `array`'s values are its bytes (all of it, then the rows, otherwise), or the
    slice of an array in memory."""
    if not is_lazy(array):
        return np.asarray(array)[start:stop]
    shape = (stop - start,) + tuple(array.shape[1:])
    if array.span is None:
        return LazyArray(shape, array.dtype, lambda: np.asarray(array)[start:stop])
    file, offset, _ = array.span
    row = int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize
    rows = LazyArray(shape, array.dtype, lambda: None, span=(file, offset + start * row, (stop - start) * row))
    rows._compute = lambda: next(_bands(rows, max(shape[0], 1)))[2]
    return rows


def file_span(array: Any) -> tuple[str, int, int] | None:
    """The bytes of a file that `array`'s values are made from, through any transposes and casts (`source`); None
    when they are not one file's bytes (an array in memory, a fused tensor's several sources)."""
    while array is not None:
        span = getattr(array, "span", None)
        if span is not None:
            return span
        array = getattr(array, "source", None)
    return None


def deferred(shape: tuple[int, ...], dtype, compute: Callable[[], np.ndarray], source: Any, transform: str
             ) -> LazyArray:
    """The mapping engine's `defer`: a `LazyArray` of `compute()`, which `transform` makes from `source` (None: from
    several arrays). Where the transform only reshapes, it keeps the source's file bytes (`span`); where it reshapes
    or transposes, it reads band by band."""
    if source is None:
        return LazyArray(shape, dtype, compute)
    return LazyArray(shape, dtype, compute, getattr(source, "span", None) if transform in RESHAPES else None,
                     _mapped_bands(source, transform, shape), source)


def _mapped_bands(source, transform: str, shape: tuple[int, ...]) -> Bands | None:
    """The bands of `source` under `transform` (to `shape`), where they can be made band by band."""
    if transform == "transpose" and len(source.shape) == 2:
        return _transposed_bands(source)
    if transform in RESHAPES:
        return _reshaped_bands(source, shape)
    return None
