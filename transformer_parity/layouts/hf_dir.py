"""Hugging Face model directories as `save_pretrained` writes them, read and written without transformers.

A directory holds `config.json` and the weights as one of:

- `model.safetensors`;
- shards `model-00001-of-0000N.safetensors` listed in `model.safetensors.index.json` (`{"weight_map": {name: file}}`);
- `pytorch_model.bin` (or shards with `pytorch_model.bin.index.json`), read with `torch.load(weights_only=True)`;
- transformers 4's `tf_model.h5` and `flax_model.msgpack` (or their shards with `.index.json`), read as data by
  `hf_legacy` under the PyTorch class's names (docs/wild.md).

Writing produces `config.json` and one `model.safetensors` (metadata `{"format": "pt"}`, as transformers expects),
built in a temporary directory beside the target and renamed into place, so a failed or interrupted write leaves
nothing behind (`outputs.atomic_dir`; `MODEL_DIR` says what `--force` may replace and what it keeps).

Symbolic links: a file of the directory that is a link is read only if it points inside the directory's own tree,
or, for a Hugging Face cache snapshot (`.../snapshots/<revision>/`, whose files link to `../../blobs/<hash>`),
into that cache's `blobs/`; a link that leaves them is refused with one line (`member`). The directory itself may
be a link (the user named it).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from transformer_parity.io.safe_text import names, printable

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
MAX_INDEX_BYTES = 64 << 20  # a shard index lists a few hundred names; more than 64 MiB is not one
TF_H5 = "tf_model.h5"  # transformers 4's TF classes (read by `hf_legacy`)
TF_H5_INDEX = "tf_model.h5.index.json"
FLAX = "flax_model.msgpack"  # transformers 4's Flax classes (read by `hf_legacy`)
FLAX_INDEX = "flax_model.msgpack.index.json"
INDEXES = (SAFETENSORS_INDEX, BIN_INDEX, TF_H5_INDEX, FLAX_INDEX)  # transformers' own order of preference
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, BIN, BIN_INDEX, TF_H5, TF_H5_INDEX, FLAX, FLAX_INDEX)

OnTensor = Callable[[str, int], None]


def _is_hf_config(file: Path) -> bool:
    try:
        if not file.is_file() or file.stat().st_size > (1 << 20):
            return False
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    return isinstance(data, dict) and isinstance(data.get("model_type"), str)


def _model_dir_kind():
    from transformer_parity.io.outputs import DirKind

    shard = r"-\d+-of-\d+"
    return DirKind(
        name="a Hugging Face model directory", config_name="a Hugging Face config with a model_type",
        model_files=(r"config\.json", rf"model(\.safetensors|{shard}\.safetensors|\.safetensors\.index\.json)",
                     rf"pytorch_model(\.bin|{shard}\.bin|\.bin\.index\.json)",
                     rf"tf_model(\.h5|{shard}\.h5|\.h5\.index\.json)",
                     rf"flax_model(\.msgpack|{shard}\.msgpack|\.msgpack\.index\.json)"),
        companions=(r"tokenizer(_config)?\.json", r"special_tokens_map\.json", r"added_tokens\.json",
                    r"vocab\.(json|txt)", r"merges\.txt", r"(spiece|tokenizer|sentencepiece\.bpe)\.model",
                    r"(source|target)\.spm", r"generation_config\.json", r"(pre)?processor_config\.json",
                    r"chat_template\.(jinja|json)", r"README(\.md)?", r"\.gitattributes", r"LICENSE(\.md|\.txt)?",
                    r"training_args\.bin"),
        config_ok=_is_hf_config)


MODEL_DIR = _model_dir_kind()


def member(path: str | os.PathLike, name: str) -> Path:
    """`path / name`, refused (`ValueError`) where it is a symbolic link that leaves the model's tree; links into a
    Hugging Face cache's `blobs/` are followed from a snapshot directory (see the module docstring)."""
    file = Path(path) / name
    if not os.path.islink(file):
        return file
    root = os.path.realpath(path)
    target = os.path.realpath(file)
    allowed = [root]
    if os.path.basename(os.path.dirname(root)) == "snapshots":
        allowed.append(os.path.join(os.path.dirname(os.path.dirname(root)), "blobs"))
    if any(os.path.commonpath([target, a]) == a for a in allowed):
        return file
    raise ValueError(f"{printable(file)} is a symbolic link to {printable(target)}, outside the model directory; "
                     "refusing to read it (links are followed only within the directory, or from a Hugging Face "
                     "cache snapshot into its blobs/)")


def is_model_dir(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / CONFIG).is_file()


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """`config.json` of a model directory, as a dict; `ValueError` naming the problem otherwise."""
    path = Path(path)
    file = member(path, CONFIG)
    if not file.is_file():
        raise ValueError(f"{path} is a directory without {CONFIG}; expected a Hugging Face model directory "
                         f"({CONFIG} plus {SAFETENSORS}, sharded safetensors or {BIN})")
    from transformer_parity.io.limits import read_json_object

    return read_json_object(file, "a model's config.json")


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The weight files of a model directory, every shard checked to exist; `ValueError` if there are none. Of
    several kinds, transformers' own order of preference: safetensors, `.bin`, `tf_model.h5`, `flax_model.msgpack`
    (each sharded or not)."""
    path = Path(path)
    for single, index_name in ((SAFETENSORS, SAFETENSORS_INDEX), (BIN, BIN_INDEX), (TF_H5, TF_H5_INDEX),
                               (FLAX, FLAX_INDEX)):
        index = member(path, index_name)
        if index.is_file():
            return _shards(path, index, index_name)
        if member(path, single).is_file():
            return [path / single]
    raise ValueError(f"{path} has a {CONFIG} but no weights ({SAFETENSORS}, {BIN}, {TF_H5} or {FLAX}, or the "
                     "shards of one listed in its .index.json)")


def _shards(path: Path, index: Path, index_name: str) -> list[Path]:
    from transformer_parity.io.limits import read_json_object

    try:  # capped: an index of 200k entries is about 12 MiB, a real one far less
        weight_map = read_json_object(index, "a shard index", cap=MAX_INDEX_BYTES)["weight_map"]
        files = sorted(set(weight_map.values()))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{index} is not a valid shard index (a JSON object with a weight_map): "
                         f"{type(exc).__name__}: {exc}") from None
    if not all(isinstance(f, str) and f and f not in (".", "..") and Path(f).name == f for f in files):
        raise ValueError(f"{index} names shard files outside the directory: {names(files, 4)}")
    suffix = Path(index_name.removesuffix(".index.json")).suffix
    if not all(Path(f).suffix == suffix for f in files):
        raise ValueError(f"{index} names shard files that are not {suffix} files: {names(files, 4)}")
    shards = [member(path, f) for f in files]
    absent = [f.name for f in shards if not f.is_file()]
    if absent:
        raise ValueError(f"{path}: missing shard(s) {names(absent, 4)} listed in {index_name}")
    return shards


def read_state(path: str | os.PathLike, on_tensor: OnTensor | None = None, lazy: bool = False
               ) -> dict[str, np.ndarray]:
    """Every tensor of a model directory's weight files, as NumPy arrays under the names they are saved with.
    `lazy=True`: safetensors tensors as `LazyArray`s in their stored dtype, each read when asked (a streaming
    conversion holds a few at a time); `.bin` files are read whole."""
    state: dict[str, np.ndarray] = {}
    for file in weight_files(path):
        part = _READERS[file.suffix](file, on_tensor, lazy)
        twice = sorted(set(part) & set(state))
        if twice:
            raise ValueError(f"{file}: tensor(s) {twice[:4]} appear in more than one shard")
        state.update(part)
    _check_index(Path(path), state)
    return state


def _check_index(path: Path, state: Mapping[str, Any]) -> None:
    for index_name in (SAFETENSORS_INDEX, BIN_INDEX):  # a TF or Flax index lists the TF or Flax names
        if member(path, index_name).is_file():
            listed = set(json.loads((path / index_name).read_text())["weight_map"])
            absent = sorted(listed - set(state))
            if absent:
                raise ValueError(f"{path}: {index_name} lists tensor(s) no shard holds: {absent[:4]}")
            return


def _read_safetensors(file: Path, on_tensor: OnTensor | None, lazy: bool = False) -> dict[str, np.ndarray]:
    from transformer_parity.io.safetensors_io import lazy_tensors, read_header, read_tensors

    header = read_header(file)  # integer and boolean tensors are buffers; the table checks them or refuses them
    return lazy_tensors(header, on_tensor) if lazy else read_tensors(header, on_tensor=on_tensor)


def _read_bin(file: Path, on_tensor: OnTensor | None = None, lazy: bool = False) -> dict[str, np.ndarray]:
    import torch

    from transformer_parity.io.torch_files import read_torch_file

    obj = read_torch_file(file)
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{file} is not a state dict of tensors")
    out = {}
    for key in list(obj):
        value = obj.pop(key)  # integer and boolean tensors are buffers; the table checks them or refuses them
        out[key] = (value.float() if value.dtype == torch.bfloat16 else value).detach().cpu().numpy()
    return out


def _read_tf_h5(file: Path, on_tensor: OnTensor | None = None, lazy: bool = False) -> dict[str, np.ndarray]:
    from .hf_legacy import read_tf_h5

    return read_tf_h5(file)


def _read_flax(file: Path, on_tensor: OnTensor | None = None, lazy: bool = False) -> dict[str, np.ndarray]:
    from .hf_legacy import read_flax_msgpack

    return read_flax_msgpack(file)


_READERS = {".safetensors": _read_safetensors, ".bin": _read_bin, ".h5": _read_tf_h5, ".msgpack": _read_flax}


def legacy_weights(path: str | os.PathLike) -> str | None:
    """The TF- or Flax-era weight file a directory is read from (`tf_model.h5`, `flax_model.msgpack`), else None."""
    files = weight_files(path)
    if files[0].suffix in (".h5", ".msgpack"):
        return TF_H5 if files[0].suffix == ".h5" else FLAX
    return None


# --- writing ------------------------------------------------------------------------------------------------------



def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: Mapping[str, str],
                      on_tensor: OnTensor | None = None, consume: bool = False) -> None:
    """A plain safetensors file, streamed tensor by tensor; `consume=True` empties `tensors` as it writes."""
    from transformer_parity.io.safetensors_io import write_tensors

    write_tensors(path, tensors, list(tensors), metadata, on_tensor, consume)


MAX_SHARD_SIZE = 5 * 10**9  # bytes per weight file, as `save_pretrained`'s max_shard_size="5GB"


def shards(sizes: Mapping[str, int], max_shard_size: int) -> list[list[str]]:
    """Tensor names grouped into consecutive shards of at most `max_shard_size` bytes each (a larger tensor gets a
    shard of its own), in the order given."""
    groups: list[list[str]] = [[]]
    total = 0
    for name, size in sizes.items():
        if groups[-1] and total + size > max_shard_size:
            groups.append([])
            total = 0
        groups[-1].append(name)
        total += size
    return groups


def write_dir(path: str | os.PathLike, hf_config: Mapping[str, Any], state: dict[str, np.ndarray], force: bool,
              on_tensor: OnTensor | None = None, consume: bool = False, notes: list[str] | None = None,
              max_shard_size: int = MAX_SHARD_SIZE) -> Path:
    """Write `config.json` + `model.safetensors` to the directory `path`, atomically (`outputs.atomic_dir`: with
    `force`, only over a model directory, keeping the tokenizer and other files this tool does not write). Over
    `max_shard_size` bytes of weights, the files are `model-0000k-of-0000n.safetensors` plus
    `model.safetensors.index.json`, as `save_pretrained` writes them; each is streamed tensor by tensor."""
    from transformer_parity.io import outputs
    from transformer_parity.io.safetensors_io import write_tensors

    path = outputs.check_output_dir(path, force, MODEL_DIR)
    sizes = {name: math.prod(a.shape) * a.dtype.itemsize for name, a in state.items()}
    groups = shards(sizes, max_shard_size)
    with outputs.atomic_dir(path, force, MODEL_DIR, notes) as tmp:
        (tmp / CONFIG).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        if len(groups) == 1:
            write_safetensors(tmp / SAFETENSORS, state, {"format": "pt"}, on_tensor, consume)
            return path
        weight_map = {}
        for k, members in enumerate(groups, 1):
            file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
            write_tensors(tmp / file, state, members, {"format": "pt"}, on_tensor, consume)
            weight_map.update(dict.fromkeys(members, file))
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        (tmp / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return path


def nbytes(path: str | os.PathLike) -> int:
    """Total size of a model directory's weight files (for progress bars)."""
    try:
        return sum(f.stat().st_size for f in weight_files(path))
    except ValueError:
        return 0
