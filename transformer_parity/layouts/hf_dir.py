"""Hugging Face model directories as `save_pretrained` writes them, read and written without transformers.

A directory holds `config.json` and the weights as one of:

- `model.safetensors`;
- shards `model-00001-of-0000N.safetensors` listed in `model.safetensors.index.json` (`{"weight_map": {name: file}}`);
- `pytorch_model.bin` (or shards with `pytorch_model.bin.index.json`), read with `torch.load(weights_only=True)`.

Writing produces `config.json` and one `model.safetensors` (metadata `{"format": "pt"}`, as transformers expects),
built in a temporary directory beside the target and renamed into place, so a failed or interrupted write leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, BIN, BIN_INDEX)

OnTensor = Callable[[str, int], None]


def is_model_dir(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / CONFIG).is_file()


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """`config.json` of a model directory, as a dict; `ValueError` naming the problem otherwise."""
    path = Path(path)
    file = path / CONFIG
    if not file.is_file():
        raise ValueError(f"{path} is a directory without {CONFIG}; expected a Hugging Face model directory "
                         f"({CONFIG} plus {SAFETENSORS}, sharded safetensors or {BIN})")
    from ..limits import read_json_object

    return read_json_object(file, "a model's config.json")


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The weight files of a model directory, every shard checked to exist; `ValueError` if there are none."""
    path = Path(path)
    for index_name in (SAFETENSORS_INDEX, BIN_INDEX):
        index = path / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                files = sorted(set(weight_map.values()))
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError,
                    RecursionError) as exc:
                raise ValueError(f"{index} is not a valid shard index (a JSON object with a weight_map): "
                                 f"{type(exc).__name__}: {exc}") from None
            if not all(isinstance(f, str) and f and Path(f).name == f for f in files):
                raise ValueError(f"{index} names shard files outside the directory: {files[:4]}")
            absent = [f for f in files if not (path / f).is_file()]
            if absent:
                raise ValueError(f"{path}: missing shard(s) {', '.join(absent)} listed in {index_name}")
            return [path / f for f in files]
    for single in (SAFETENSORS, BIN):
        if (path / single).is_file():
            return [path / single]
    raise ValueError(f"{path} has a {CONFIG} but no weights ({SAFETENSORS}, {SAFETENSORS_INDEX}, {BIN} or "
                     f"{BIN_INDEX})")


def read_state(path: str | os.PathLike, on_tensor: OnTensor | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a model directory's weight files, as NumPy arrays under the names they are saved with."""
    state: dict[str, np.ndarray] = {}
    for file in weight_files(path):
        part = _read_safetensors(file, on_tensor) if file.suffix == ".safetensors" else _read_bin(file)
        twice = sorted(set(part) & set(state))
        if twice:
            raise ValueError(f"{file}: tensor(s) {twice[:4]} appear in more than one shard")
        state.update(part)
    _check_index(Path(path), state)
    return state


def _check_index(path: Path, state: Mapping[str, Any]) -> None:
    for index_name in (SAFETENSORS_INDEX, BIN_INDEX):
        if (path / index_name).is_file():
            listed = set(json.loads((path / index_name).read_text())["weight_map"])
            absent = sorted(listed - set(state))
            if absent:
                raise ValueError(f"{path}: {index_name} lists tensor(s) no shard holds: {absent[:4]}")
            return


def _read_safetensors(file: Path, on_tensor: OnTensor | None) -> dict[str, np.ndarray]:
    from ..safetensors_io import read_header, read_tensors

    header = read_header(file)
    for name, (dtype, _, _, _) in header.entries.items():
        if dtype.kind != "f":
            raise ValueError(f"{file}: tensor {name!r} has dtype {dtype}, expected a floating dtype")
    return read_tensors(header, on_tensor=on_tensor)


def _read_bin(file: Path) -> dict[str, np.ndarray]:
    import torch

    from torch_impl.checkpoints import read_torch_file

    obj = read_torch_file(file)
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{file} is not a state dict of tensors")
    out = {}
    for key in list(obj):
        value = obj.pop(key)
        if not value.is_floating_point():
            raise ValueError(f"{file}: entry {key!r} has dtype {value.dtype}, expected a floating dtype")
        out[key] = (value.float() if value.dtype == torch.bfloat16 else value).detach().cpu().numpy()
    return out


# --- writing ------------------------------------------------------------------------------------------------------



def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: Mapping[str, str],
                      on_tensor: OnTensor | None = None, consume: bool = False) -> None:
    """A plain safetensors file, streamed tensor by tensor; `consume=True` empties `tensors` as it writes."""
    from ..safetensors_io import write_tensors

    write_tensors(path, tensors, list(tensors), metadata, on_tensor, consume)


def check_output_dir(path: str | os.PathLike, force: bool) -> Path:
    """Refuse a missing parent, a file, or an existing directory without `force` (and with it, any directory
    that is not a model directory: --force replaces a model, never an arbitrary folder)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"cannot write {path}: directory {path.parent} does not exist")
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link; give a new directory name to write the model to")
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{path} exists and is not a directory; a Hugging Face model is written as a directory")
        if not force:
            raise ValueError(f"{path} exists; pass --force to replace it")
        if any(path.iterdir()) and not (path / CONFIG).is_file():
            raise ValueError(f"{path} is a non-empty directory without {CONFIG}; refusing to replace it even with "
                             "--force (give a new directory name)")
    return path


def write_dir(path: str | os.PathLike, hf_config: Mapping[str, Any], state: dict[str, np.ndarray], force: bool,
              on_tensor: OnTensor | None = None, consume: bool = False) -> Path:
    """Write `config.json` + `model.safetensors` to the directory `path`, atomically (see `atomic_dir`)."""
    path = check_output_dir(path, force)
    with atomic_dir(path, force) as tmp:
        (tmp / CONFIG).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        write_safetensors(tmp / SAFETENSORS, state, {"format": "pt"}, on_tensor, consume)
    return path


@contextlib.contextmanager
def atomic_dir(path: Path, force: bool) -> Iterator[Path]:
    """A temporary directory beside `path` to build a model directory in, published as `path` when the block
    succeeds. Without `force` the name is claimed with `mkdir` (so two writers cannot both win) and the finished
    directory renamed onto it; with `force` an existing directory is moved aside first and put back if publishing
    fails. SIGINT/SIGTERM leave nothing behind."""
    from ..formats import _raise_on_sigterm, _restore_sigterm, deferred_signals

    with deferred_signals():  # the handler and the temporary directory appear together, or neither
        previous = _raise_on_sigterm()
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent))
    old = None
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        with deferred_signals():
            if force and path.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{path.name[:100]}.", suffix=".old", dir=path.parent))
                os.replace(path, old / "model")
            else:
                try:
                    os.mkdir(path)  # claim the name: fails if another writer got there first
                except FileExistsError:
                    raise ValueError(f"{path} exists; pass --force to replace it") from None
            try:
                os.replace(tmp, path)  # onto the empty directory just claimed (or the name just vacated)
            except BaseException:
                if old is not None:
                    os.replace(old / "model", path)  # put the previous model back
                else:
                    os.rmdir(path)
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        _restore_sigterm(previous)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def nbytes(path: str | os.PathLike) -> int:
    """Total size of a model directory's weight files (for progress bars)."""
    try:
        return sum(f.stat().st_size for f in weight_files(path))
    except ValueError:
        return 0
