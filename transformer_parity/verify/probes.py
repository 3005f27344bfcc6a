"""Probe files: `--write-probe FILE.npz` writes verify's inputs; `--expect FILE.npz` reads them back with the
outputs computed elsewhere (by the library that wrote a checkpoint, in its own environment) as a source
(`from_expect`, the contract of `source.Source`). Every member's declared size is checked before it is read."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

import reference_numpy as rn
from transformer_parity.errors import UsageError

from .source_contract import INPUT_KEYS, OUTPUT, Batch, Source, SourceRun, _one_line


def write_probe(path: str | Path, batch: Batch, force: bool = False) -> Path:
    """Write the inputs (`src_ids`, `tgt_ids`, `src_type_ids` where the model takes them) to `path`, atomically."""
    from transformer_parity.io import guards, outputs

    path = Path(path)
    if not path.name.endswith(".npz"):
        raise UsageError(f"--write-probe writes a NumPy .npz file; give a name ending in .npz, received {str(path)!r}")
    guards.check_output(path, force)
    with outputs.atomic_path(path, force) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **batch)
    return path


def read_expect(path: str | Path, config: rn.TransformerConfig) -> tuple[Batch, dict[str, np.ndarray]]:
    """`(inputs, outputs)` of an --expect file: the inputs (checked against `config`) and `output` plus any
    intermediates (their names and shapes are checked with the judge's, by `check_outputs`). A model with one token
    type (`type_vocab_size=1`) takes `src_type_ids` or, where the file has none, zeros: the only id there
    is, as transformers gives it when the caller passes none."""
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--expect: no such file: {path}")
    try:
        _check_npz_sizes(path)
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise UsageError(f"--expect {path}: a single array, not an .npz archive of named arrays")
            arrays = {k: data[k] for k in data.files}
    except UsageError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise UsageError(f"--expect {path} is not a readable .npz file ({type(exc).__name__}: {_one_line(exc)})"
                         ) from None
    wanted = ["src_ids"] + (["tgt_ids"] if config.is_encoder_decoder else []) + \
        (["src_type_ids"] if config.type_vocab_size else [])
    if config.type_vocab_size == 1 and "src_type_ids" not in arrays and "src_ids" in arrays:
        arrays["src_type_ids"] = np.zeros_like(arrays["src_ids"])
    missing = [k for k in wanted + [OUTPUT] if k not in arrays]
    if missing:
        raise UsageError(f"--expect {path} has no {', '.join(missing)} (it holds {sorted(arrays) or 'nothing'}; this "
                         f"model needs {', '.join(wanted)} and {OUTPUT!r})")
    extra = [k for k in INPUT_KEYS if k in arrays and k not in wanted]
    if extra:
        raise UsageError(f"--expect {path} holds {', '.join(extra)}, which this model does not take")
    batch = {}
    for key in wanted:
        ids = arrays.pop(key)
        if ids.dtype.kind not in "iu" or ids.ndim != 2 or 0 in ids.shape:
            raise UsageError(f"--expect {path}: {key} must be a non-empty (batch, length) integer array, received "
                             f"{ids.dtype} of shape {ids.shape}")
        batch[key] = ids.astype(np.int64)
    b, s = batch["src_ids"].shape
    for key in wanted[1:]:
        if batch[key].shape[0] != b or (key == "src_type_ids" and batch[key].shape != (b, s)):
            raise UsageError(f"--expect {path}: {key} has shape {batch[key].shape}, which does not fit src_ids "
                             f"{(b, s)}")
    src_vocab = config.tgt_vocab_size if config.is_decoder_only else config.src_vocab_size
    for key, vocab in (("src_ids", src_vocab), ("tgt_ids", config.tgt_vocab_size),
                       ("src_type_ids", config.type_vocab_size)):
        if key in batch:
            ids = batch[key]
            if ids.shape[1] > config.max_len or ids.min() < 0 or ids.max() >= vocab:
                raise UsageError(f"--expect {path}: {key} {ids.shape} has ids in [{ids.min()}, {ids.max()}] and "
                                 f"length {ids.shape[1]}; this model takes ids in [0, {vocab - 1}] and at most "
                                 f"max_len={config.max_len} positions")
    return batch, arrays


def _check_npz_sizes(path: Path) -> None:
    """Refuse an .npz member whose header declares more bytes than the member holds, before anything is allocated
    (a header may promise 10^12 elements in a file of a few hundred bytes)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return  # np.load says what it is
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            with archive.open(info) as member:
                try:
                    version = np.lib.format.read_magic(member)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                                   np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(member)
                except (ValueError, EOFError, TypeError) as exc:
                    raise UsageError(f"--expect {path}: member {info.filename!r} is not a NumPy array "
                                     f"({_one_line(exc)})") from None
            declared = math.prod(shape) * dtype.itemsize
            if declared > info.file_size:
                raise UsageError(f"--expect {path}: member {info.filename!r} declares shape {shape} of {dtype} "
                                 f"({declared} bytes) but holds {info.file_size} bytes")


def from_expect(path: str | Path, config: rn.TransformerConfig) -> Source:
    """`--expect FILE.npz`: outputs computed elsewhere on the inputs the file holds."""
    batch, outputs = read_expect(path, config)
    raw = {OUTPUT: outputs.pop(OUTPUT), **outputs}
    return Source(str(path), "expect", lambda _: [SourceRun("expected", raw)], inputs=batch)
