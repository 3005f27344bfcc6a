"""What a format is: one record per format module (`Format`), what a reader is asked (`ReadRequest`) and gives
(`Loaded`), what a writer is asked (`WriteRequest`), and the steps every single-file writer shares (`write_file`).

Nothing here imports a framework: a format's module imports PyTorch, h5py or TensorFlow only inside the functions
that read or write its files, so the registry can look every format up for the price of reading its record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

import reference_numpy as rn

from ..errors import UsageError
from ..io.guards import check_output, deferred_signals
from ..io.outputs import atomic_path
from ..layouts.table import Drops

OnTensor = Callable[[str, int], None]  # (canonical name, bytes) after each tensor is read or written


@dataclass
class Loaded:
    """A checkpoint read into canonical form."""

    path: Path
    format: str  # the format it was read as: a record's name, or one of its family names (`hf-phi3`)
    framework: str  # where a model read from it runs: numpy, torch or keras
    config: rn.TransformerConfig
    weights: dict[str, np.ndarray]
    notes: list[str] = field(default_factory=list)  # what was read from where, worth telling the user
    dropped: list[str] = field(default_factory=list)  # nonzero tensors left out because --allow-drop named them
    origin: str | None = None  # the external family the weights came from (hf-phi3, kerashub-llama), when known

    @property
    def nbytes(self) -> int:
        return sum(int(v.nbytes) for v in self.weights.values())


@dataclass(frozen=True)
class ReadRequest:
    """What a format's reader is asked: the file or directory, the name it was asked for (`--from`: the record's
    name, or one of its family names; None where it was detected), the settings the user gave (`fields`), which
    nonzero tensors a table may drop (`drops`), and whether to read tensor by tensor (`lazy`)."""

    path: Path
    name: str | None
    fields: Mapping[str, Any]
    on_tensor: OnTensor | None
    drops: Drops
    lazy: bool


@dataclass(frozen=True)
class WriteRequest:
    """What a format's writer is asked. `name` is the format asked for (`--to`: the record's name or one of its
    family names); `consume` lets the writer empty `weights` as it goes; `notes` collects what the user should hear;
    `max_shard_size` (bytes) splits a model directory's weights; `record` (a `layouts.approximations.Record`) goes
    into a directory's metadata; `origin` (the external family the weights came from) into a file's."""

    path: Path
    name: str
    config: rn.TransformerConfig
    weights: Mapping[str, np.ndarray]
    force: bool = False
    on_tensor: OnTensor | None = None
    consume: bool = False
    notes: list[str] | None = None
    max_shard_size: int | None = None
    record: Any = None
    origin: str | None = None


@dataclass(frozen=True)
class Format:
    """One checkpoint format, as its module declares it. Every hook is stated, none has a default: one the format does
    not have is `None` or empty, never missing (`write=None`: read only; `families=()`: it holds no external
    families; `is_directory=None`: its checkpoints are files)."""

    name: str  # what --from / --to call it
    what: str  # one line for --help and messages
    framework: str | None  # where a model read from it runs (numpy, torch, keras); None: its file's container says
    extensions: tuple[str, ...]  # the file names it claims, by ending (longest wins); () for a directory format
    containers: tuple[str, ...]  # what `io.sniff` finds in its files (safetensors, zip, pickle, hdf5)
    read: Callable[[ReadRequest], Loaded]
    write: Callable[[WriteRequest], tuple[Path, str]] | None  # returns (path, the format or family written)
    streamed: bool  # `lazy=True` reads it tensor by tensor (`streaming.lazy.LazyArray`), in its stored dtype
    families: tuple[str, ...]  # other names that pick this format and one family in it (`hf-gpt2`, ...)
    write_extensions: tuple[str, ...]  # the endings a file it writes must have, where its reader needs one
    is_directory: Callable[[Path], bool] | None  # whether a directory holds a checkpoint of this format
    output_directory: Callable[[str], bool] | None  # whether `--to NAME` writes a directory (None: it writes files)
    dir_kind: Callable[[], Any] | None  # the `io.outputs.DirKind` of its output directories

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.families)


def check_input(path: str | os.PathLike) -> Path:
    """An existing, non-empty file (not a directory); `UsageError` naming the problem otherwise."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"no such file: {path}")
    if path.is_dir():
        raise UsageError(f"{path} is a directory, expected a checkpoint file")
    if path.stat().st_size == 0:
        raise UsageError(f"{path} is empty (0 bytes)")
    return path


def write_file(request: WriteRequest, load_writer: Callable[[], Callable[[Path], None]]) -> tuple[Path, str]:
    """The steps every single-file writer shares: refuse an existing file without `force`, check the weights, import
    the writer's framework (`load_writer`, before any temporary file exists, so an interrupt in a framework's import
    leaves nothing behind), then write a temporary file beside `path` and rename it into place."""
    check_output(request.path, request.force)
    rn.validate_weights(request.config, request.weights)
    try:
        with deferred_signals():
            write = load_writer()
        with atomic_path(request.path, request.force, request.notes) as tmp:
            write(tmp)
    except ImportError as exc:
        raise UsageError(f"writing {request.name} needs {exc.name}, which is not installed") from None
    return request.path, request.name


def known_origin(origin: object) -> str | None:
    """A stored origin (the external family the weights came from) this version knows, else None: a value it does
    not know is not used."""
    from ..layouts import HF_LAYOUTS, KERASHUB_LAYOUTS

    return origin if isinstance(origin, str) and (origin in HF_LAYOUTS or origin in KERASHUB_LAYOUTS) else None
