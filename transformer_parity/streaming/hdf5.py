"""HDF5 datasets, streamed: written a band at a time (or laid out, then filled by `BandWriter`), read as lazy arrays
from the file's bytes, and a hostile file's layout checked before anything is read.

A `.weights.h5` (Keras's `save_weights`, a KerasHub preset's `model.weights.h5`, transformers 4's `tf_model.h5`) is
an HDF5 file; the formats that read and write them (`formats.keras_file`, `layouts.kerashub_preset`,
`layouts.user`, `layouts.hf_legacy`) do it through these. h5py is imported inside the functions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .lazy import BAND_BYTES, LazyArray, mapped, row_bands, widen_bfloat16
from .writer import BandWriter


def write_dataset(group: Any, name: str, array: Any, max_bytes: int = BAND_BYTES,
                  deferred: list | None = None) -> None:
    """Dataset `name` of `group` holding `array` (an array, or a `LazyArray` read a band of rows at a time:
    the peak is a band, never a second copy of the tensor), in its dtype. bfloat16 is stored as Keras stores it: a
    2-byte opaque type with the attribute `dtype="bfloat16"`.

    With a `deferred` list, a dataset with values is only laid out now (contiguous, its space allocated, no fill
    written) and `(file offset, name, array)` is appended: `write_deferred` writes the bytes once the HDF5 file is
    closed, through `streaming.writer.BandWriter` (a background thread; a file's bytes copied by the
    kernel)."""
    import h5py

    dtype = np.dtype(array.dtype)
    later = deferred is not None and len(array.shape) > 0 and int(np.prod(array.shape, dtype=np.int64)) > 0
    plist = None
    if later:
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        plist.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    dataset = group.create_dataset(name, shape=tuple(array.shape), dtype=dtype, dcpl=plist)
    if dtype.name == "bfloat16":
        dataset.attrs["dtype"] = "bfloat16"
    if later:
        deferred.append((dataset.id.get_offset(), name, array))
        return
    for start, stop, band in row_bands(array, max_bytes):
        if dataset.ndim == 0:
            dataset[()] = band
        else:
            dataset[start:stop] = np.ascontiguousarray(band)


def write_deferred(path: str | os.PathLike, deferred: list, on_dataset: Callable[[str, int], None] | None = None
                   ) -> None:
    """The bytes of the datasets `write_dataset` laid out in the closed HDF5 file `path`, in file order;
    `on_dataset(name given to write_dataset, bytes)` after each."""
    with open(path, "r+b") as f, BandWriter(f) as writer:
        ordered = sorted(deferred, key=lambda item: item[0])
        writer.read_ahead([array for _, _, array in ordered])  # their sources read while the ones before are written
        for offset, name, array in ordered:
            writer.seek(offset)
            nbytes = writer.put(array)
            if on_dataset is not None:
                on_dataset(name, nbytes)
        writer.wait()
        f.flush()


def read_dataset(dataset: Any, lazy: bool = False) -> Any:
    """The values of a checked dataset (`check_layout`); Keras's bfloat16 (2-byte opaque, `dtype="bfloat16"`)
    read as float32, exactly. `lazy=True`: a `LazyArray` in the stored dtype (bfloat16 kept, as ml_dtypes'
    bfloat16), read when asked; a dataset stored in one piece (what Keras and h5py write by default) is read from the
    file's bytes, so a streaming conversion maps, copies and transposes it a band at a time, as it does a safetensors
    tensor."""
    if lazy:
        return _lazy_dataset(dataset)
    value = dataset[()]
    if is_bfloat16(dataset):
        return widen_bfloat16(value)
    return value


def _lazy_dataset(dataset: Any) -> LazyArray:
    file, name, shape = dataset.file.filename, dataset.name, tuple(dataset.shape)
    if is_bfloat16(dataset):
        import ml_dtypes
        dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        dtype = dataset.dtype
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    offset = dataset.id.get_offset() if dataset.chunks is None else None
    if offset is not None and nbytes and (dtype.kind == "V" or dtype.str[0] in "<|"):  # a span is little-endian
        array = LazyArray(shape, dtype, lambda: np.array(mapped(array)), (file, offset, nbytes))
        return array

    def read() -> np.ndarray:  # chunked (or empty): through HDF5
        import h5py
        with h5py.File(file, "r") as f:
            value = f[name][()]
        return value.view(dtype) if dtype.kind == "V" else value

    return LazyArray(shape, dtype, read)


def is_bfloat16(dataset: Any) -> bool:
    return dataset.dtype.kind == "V" and dataset.dtype.itemsize == 2 and dataset.attrs.get("dtype") in (
        "bfloat16", b"bfloat16")


def check_layout(path: Path, f: Any, file_size: int) -> dict[str, tuple[int, ...]]:
    """{dataset path: shape} of every dataset, after refusing anything that could read outside this file or expand
    beyond it (soft/external links, virtual datasets, external storage, filters, non-float or partly stored data)."""
    import h5py

    found: dict[str, tuple[int, ...]] = {}
    total = 0

    def check(name: str, link: Any) -> None:
        nonlocal total
        if isinstance(link, h5py.ExternalLink):
            raise ValueError(f"{path}: {name!r} is an external link (to {link.filename}:{link.path}); refusing to "
                             "read another file")
        if isinstance(link, h5py.SoftLink):
            raise ValueError(f"{path}: {name!r} is a soft link (to {link.path}); weights files have none")
        if not isinstance(link, h5py.HardLink):
            raise ValueError(f"{path}: {name!r} is a {type(link).__name__}, expected a group or dataset")
        obj = f[name]
        if isinstance(obj, h5py.Group):
            return
        if not isinstance(obj, h5py.Dataset):
            raise ValueError(f"{path}: {name!r} is a {type(obj).__name__}, expected a group or dataset")
        if obj.is_virtual:
            raise ValueError(f"{path}: dataset {name!r} is a virtual dataset (data mapped from other datasets or "
                             "files); refusing it")
        plist = obj.id.get_create_plist()
        if plist.get_external_count() > 0:
            raise ValueError(f"{path}: dataset {name!r} keeps its data in an external file "
                             f"({plist.get_external(0)[0].decode(errors='replace')}); refusing to read it")
        if plist.get_nfilters() > 0:
            filters = [plist.get_filter(i)[3].decode(errors="replace") or str(plist.get_filter(i)[0])
                       for i in range(plist.get_nfilters())]
            raise ValueError(f"{path}: dataset {name!r} uses HDF5 filters {filters}; weights files are written "
                             "without compression or filters")
        if (obj.dtype.kind != "f" or obj.dtype.itemsize not in (2, 4, 8)) and not is_bfloat16(obj):
            raise ValueError(f"{path}: dataset {name!r} has dtype {obj.dtype}, expected bfloat16 or float16/32/64 "
                             "weights")
        if obj.shape is None:
            raise ValueError(f"{path}: dataset {name!r} has no dataspace (an empty dataset)")
        nbytes = int(np.prod(obj.shape, dtype=object)) * obj.dtype.itemsize
        stored = obj.id.get_storage_size()
        if stored < nbytes:
            raise ValueError(f"{path}: dataset {name!r} of shape {obj.shape} needs {nbytes} bytes but stores "
                             f"{stored} (the rest would be fill values); refusing a partly stored dataset")
        total += nbytes
        if total > file_size:
            raise ValueError(f"{path}: its datasets declare {total} bytes, more than the file's {file_size}")
        found[name] = tuple(int(n) for n in obj.shape)

    links: list[tuple[str, Any]] = []
    f.visititems_links(lambda name, link: links.append((name, link)))  # raising inside the visit confuses h5py
    for name, link in links:
        check(name, link)
    return found
