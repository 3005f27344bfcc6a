"""Checkpoint formats: one module per format, each with one record (`record.Format`: its extensions, the containers
its files are, how a directory of it is recognised, its reader and writer, whether it streams), found here by
lookup. An unknown format is an error; nothing falls through to another.

| format           | module           | extensions                     | holds                                      | runs in |
|------------------|------------------|--------------------------------|--------------------------------------------|---------|
| `canonical`      | `canonical`      | `.safetensors`                 | canonical names, config in the metadata    | numpy   |
| `torch`          | `torch_file`     | `.pt`, `.pth`, `.ckpt`         | torch_impl state dict + config (zip)       | torch   |
| `nn-transformer` | `nn_transformer` | `.bin` (and any PyTorch file)  | a model around `torch.nn.Transformer`      | torch   |
| `keras`          | `keras_file`     | `.weights.h5`, `.h5`           | tf_impl `save_weights` layout + config     | keras   |
| `hf`             | `hf_dir`         | a directory                    | Hugging Face `save_pretrained` model dir   | torch   |
| `kerashub`       | `kerashub`       | a directory (or, named, `.weights.h5`) | KerasHub `save_to_preset`          | keras   |
| `layout:FILE`    | `layout`         | a state dict, safetensors, `.weights.h5` | a model a user's layout file describes | its container's |

`hf` and `kerashub` hold external families (`layouts`), one module each; `--from` / `--to` may name one
(`hf-FAMILY`, `kerashub-FAMILY`). A PyTorch file is told apart by what it holds (`torch_file.read`). Frameworks are
imported only when a file of theirs is read or written.

Adding a format is one module with a `FORMAT` record and one line in `MODULES`.
"""

from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

import reference_numpy as rn

from ..errors import UsageError
from ..io.sniff import sniff
from ..layouts.table import Drops
from .record import Format, Loaded, OnTensor, ReadRequest, WriteRequest, check_input  # noqa: F401 (the formats API)

# The registry: one line per format, in the order a file's or a directory's formats are tried (a container's first
# is its default; a KerasHub preset is a directory with a config.json too, so it is asked before `hf`).
MODULES = ("canonical", "torch_file", "nn_transformer", "keras_file", "kerashub", "hf_dir", "layout")
LAYOUT_PREFIX = "layout:"  # `load(path, LAYOUT_PREFIX + layout_file)` reads through a user's layout file
KERAS_ARCHIVE = ".keras"  # a whole-model Keras archive: refused, with what to convert instead


@functools.cache
def records() -> tuple[Format, ...]:
    """Every format's record, in `MODULES` order (the modules are imported once, on the first lookup)."""
    return tuple(importlib.import_module(f"{__name__}.{module}").FORMAT for module in MODULES)


def lookup(name: str) -> Format:
    """The record of format `name` (or of the format that holds family `name`); `UsageError` for any other."""
    if name.startswith(LAYOUT_PREFIX):
        return _by_name()["layout"]
    found = _by_name().get(name)
    if found is None or found.name == "layout":
        raise UsageError(f"unknown format {name!r}; choose one of {', '.join(names())}")
    return found


@functools.cache
def _by_name() -> dict[str, Format]:
    return {name: record for record in records() for name in record.names}


def names() -> tuple[str, ...]:
    """Every name --from and --to take: each format's and each family's."""
    return tuple(name for record in records() if record.name != "layout" for name in record.names)


def home(name: str) -> str | None:
    """The format that format or family `name` belongs to (`hf` for `hf-phi3`); None for a name it does not know
    (a checkpoint read through a layout file is `torch-layout`, ...)."""
    found = _by_name().get(name)
    return None if found is None else found.name


def is_directory_family(name: str, home_name: str) -> bool:
    """Whether `name` is a directory of format `home_name` (`hf`, `kerashub`): the format, or a family in it."""
    return home(name) == home_name and writes_directory(name)


def writes_directory(name: str) -> bool:
    """Whether writing format (or family) `name` makes a directory."""
    record = _by_name().get(name)
    return record is not None and record.output_directory is not None and record.output_directory(name)


def file_names(record: Format) -> tuple[str, ...]:
    """The names that may read a file (not a directory) as `record`: its own where it has extensions, its families'
    where its files may hold them (a KerasHub family's bare `.weights.h5`)."""
    return (record.name,) * bool(record.extensions) + (record.families if record.containers else ())


def container_formats(content: str) -> tuple[str, ...]:
    """The formats (and families) a file of this container may hold, the default first."""
    return tuple(name for record in records() if content in record.containers and record.name != "layout"
                 for name in file_names(record))


def extension_format(path: str | os.PathLike) -> str | None:
    ext = _extension(path)
    return next((record.name for record in records() if ext and ext in record.extensions), None)


def _extension(path: str | os.PathLike) -> str:
    name = Path(path).name.lower()
    every = sorted({ext for record in records() for ext in record.extensions}, key=len, reverse=True)
    return next((ext for ext in every if name.endswith(ext)), "")


def _refuse_keras_archive(path: Path, content: str | None) -> None:
    if path.name.lower().endswith(KERAS_ARCHIVE) and content in (None, "zip"):
        raise UsageError(f"{path}: whole-model .keras archives are not supported; save the weights with "
                         "model.save_weights('NAME.weights.h5') and convert that")


def detect_format(path: str | os.PathLike, declared: str | None = None) -> str:
    """The format of an existing file, from its content and extension (`declared`, the user's --from, wins over
    the extension but not over content that plainly says otherwise)."""
    if Path(path).is_dir():
        return _directory_format(Path(path), declared)
    path = check_input(path)
    content = sniff(path)
    by_ext = extension_format(path)
    if declared is not None:
        lookup(declared)
        if content is not None and declared not in container_formats(content):
            raise UsageError(f"{path} is a {content} file, which cannot hold the {declared} format "
                             f"(it could be: {', '.join(container_formats(content))})")
        return declared
    _refuse_keras_archive(path, content)
    if content is None:
        if by_ext is not None:  # let that format's reader say precisely what is wrong
            return by_ext
        raise UsageError(f"{path} is not a checkpoint this tool knows: its first bytes match no supported format "
                         "(safetensors, PyTorch zip or pickle, HDF5) and its extension names none "
                         f"({', '.join(sorted({e for r in records() for e in r.extensions}))})")
    held = container_formats(content)
    if by_ext is not None and by_ext not in held:
        raise UsageError(f"{path} has a {by_ext} ({_extension(path)}) extension but its content is {content}; "
                         f"pass --from {held[0]} to read it anyway")
    return by_ext if by_ext is not None else held[0]  # a PyTorch file: refined by what it holds


def _directory_format(path: Path, declared: str | None) -> str:
    """The format of a directory: the one `declared` names, else the first whose record recognises it."""
    directories = [record for record in records() if record.is_directory is not None]
    if declared is not None:
        if lookup(declared).is_directory is None:
            raise UsageError(f"{path} is a directory, which cannot hold the {declared} format (a directory is read "
                             f"as: {', '.join(n for r in directories for n in r.names)})")
        if not (path / "config.json").is_file():
            raise _no_config_json(path)
        return declared
    found = next((record.name for record in directories if record.is_directory(path)), None)
    if found is None:
        raise _no_config_json(path)
    return found


def _no_config_json(path: Path) -> UsageError:
    return UsageError(f"{path} is a directory without config.json; expected a Hugging Face model directory "
                      "(config.json plus model.safetensors, sharded safetensors or pytorch_model.bin), a KerasHub "
                      "preset or a checkpoint file")


def load(path: str | os.PathLike, fmt: str | None = None, fields: Mapping[str, Any] | None = None,
         on_tensor: OnTensor | None = None, allow_drop: Sequence[str] | None = None, lazy: bool = False) -> Loaded:
    """Read any supported checkpoint into canonical weights.

    `fields` (the CLI's --config/--set) override the stored config, or supply what a file without one cannot tell;
    the weights are validated against the result. `allow_drop` names the float tensors with nonzero values that a
    table's `ignore` entry may leave out (a key, or a pattern with `{i}`); any other is refused.

    `lazy=True` (for streaming conversions): a format whose record says `streamed` gives `LazyArray`s in their
    stored dtype (bfloat16 kept), each read when asked; `on_tensor` then reports each read (safetensors). The others
    (a PyTorch pickle or zip, a file read through a layout file) are read whole, as without it.
    """
    from ..io import limits

    fields, path, drops = dict(fields or {}), Path(path), Drops(tuple(allow_drop or ()))
    if fmt is None or not fmt.startswith(LAYOUT_PREFIX):
        fmt = detect_format(path, fmt)
    record = lookup(fmt)
    request = ReadRequest(path, fmt, fields, on_tensor, drops, lazy and record.streamed)
    try:
        loaded = record.read(request)
    except ImportError as exc:
        raise UsageError(f"reading {path} ({fmt}) needs {exc.name}, which is not installed") from None
    except (KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:  # a reader tripped on the content
        detail = f"entry {exc.args[0]!r} is missing" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise UsageError(f"{path} is not a readable {fmt} checkpoint: {detail}") from exc
    limits.check_positions(loaded.config, str(path), "--set/--config" if "max_len" in fields else "")
    loaded.dropped = list(drops.dropped)
    loaded.notes += drops.notes
    loaded.notes += [f"--allow-drop {name}: no tensor of that name was dropped from {path.name}"
                     for name in drops.unused()]
    return loaded


def check_source(path: str | os.PathLike) -> Path:
    """`check_input` for a file, or a directory that holds a model of a directory format."""
    if Path(path).is_dir():
        _directory_format(Path(path), None)
        return Path(path)
    return check_input(path)


def source_size(path: Path) -> int:
    """Bytes to read: a file's size, or a model directory's weight files."""
    if path.is_dir():
        from ..layouts import hf_dir
        return hf_dir.nbytes(path)
    return path.stat().st_size


def check_destination(path: str | os.PathLike, fmt: str, force: bool) -> Path:
    """`check_output` for a file format; for a directory format, a directory to create (or, with --force, a model
    directory to replace)."""
    from ..io import guards, outputs

    if writes_directory(fmt):
        return outputs.check_output_dir(path, force, lookup(fmt).dir_kind())
    return guards.check_output(path, force)


# --- writing ------------------------------------------------------------------------------------------------------

def output_format(path: str | os.PathLike, declared: str | None = None) -> str:
    """The format to write: `declared` (--to), else the extension; they must not contradict each other."""
    by_ext = extension_format(path)
    if declared is None:
        if by_ext is None:
            _refuse_keras_archive(Path(path), None)
            raise UsageError(f"cannot tell the output format from {Path(path).name!r}; use an extension "
                             f"({', '.join(sorted({e for r in records() for e in r.extensions}))}) or --to FORMAT "
                             "(--to hf for a Hugging Face model directory)")
        declared = by_ext
    record = lookup(declared)
    if record.write is None:
        raise UsageError(f"{declared} is read only here; write one of {', '.join(_writable())}")
    if writes_directory(declared):
        if by_ext is not None:
            raise UsageError(f"{path} has a {by_ext} extension, but --to {declared} writes a directory; give a "
                             "directory name")
        return declared
    if record.write_extensions and not str(path).endswith(record.write_extensions):
        raise UsageError(f"{path}: {declared} files must end in {' or '.join(record.write_extensions)} (its reader "
                         "requires it)")
    if by_ext is not None and lookup(by_ext).framework != record.framework:
        raise UsageError(f"{path} has a {by_ext} extension, but --to {declared} was asked for")
    return declared


def _writable() -> list[str]:
    return [name for record in records() if record.write is not None for name in record.names]


def save(path: str | os.PathLike, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray],
         fmt: str | None = None, force: bool = False, on_tensor: OnTensor | None = None,
         consume: bool = False, notes: list[str] | None = None, max_shard_size: int | None = None,
         record=None, origin: str | None = None) -> tuple[Path, str]:
    """Write canonical weights as `fmt` (default: from the extension), atomically; returns `(path, format)`.
    `max_shard_size` (bytes) splits a Hugging Face directory's weights into shards (default 5 GB). `origin` (the
    external family the weights came from) is kept in a canonical, Keras or .pt file. `record` (a
    `layouts.approximations.Record`, the approximations accepted to write `config`) goes into a KerasHub preset's
    metadata.json or a Hugging Face directory's config.json.

    `consume=True` lets the writer delete each entry of `weights` (a dict) once converted, so a conversion holds the
    checkpoint about once; the dict is left empty or partly emptied. `notes` collects what the user should hear
    (stale temporary files removed, files kept beside a replaced model); without it they go to stderr.
    """
    fmt = output_format(path, fmt)
    request = WriteRequest(Path(path), fmt, config, weights, force, on_tensor, consume, notes, max_shard_size,
                           record, origin)
    try:
        return lookup(fmt).write(request)
    except ImportError as exc:
        raise UsageError(f"writing {fmt} needs {exc.name}, which is not installed") from None
