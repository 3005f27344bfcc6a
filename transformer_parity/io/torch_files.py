"""PyTorch files read safely: `torch.load(..., weights_only=True)` only (nothing in a pickle ever runs), after the
archive and every tensor in it are checked; the tensor dict found inside a training checkpoint; tensors to NumPy.

The project's own `.pt` is `transformer_parity.formats.torch_file`; the external layouts that read other state dicts
(`transformer_parity.layouts`) read them through here. PyTorch is imported when this module is.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch


# --- reading .pt files safely ---------------------------------------------------------------------------------------

def read_torch_file(path: str | os.PathLike) -> Any:
    """`torch.load(path, weights_only=True)` with every failure turned into a `ValueError` naming the file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, expected a file")
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is empty (0 bytes)")
    _check_archive(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()
        detail = next((line.strip() for line in first if "GLOBAL" in line or "Unsupported" in line), first[0] if first
                      else type(exc).__name__)
        raise ValueError(f"{path}: refusing to load a pickle that would run code or build arbitrary objects "
                         f"(torch.load weights_only=True rejected it: {detail})") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path} is not a readable PyTorch file (truncated or corrupt?): {message}") from None
    _check_tensors(obj, path)
    return obj


MAX_INFLATION = 2  # a torch.save archive stores its members uncompressed; allow a little beyond that


def _check_archive(path: Path) -> None:
    """Before `torch.load`: a zip archive's members must decompress to at most ~the file's size (no deflate bomb)
    and match their CRC-32s (flipped bytes are refused, not loaded as wrong weights)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return  # the legacy (pickle) format: torch.load checks it
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            declared = sum(m.file_size for m in members)
            if declared > MAX_INFLATION * size + (1 << 20):
                raise ValueError(f"{path}: its zip members declare {declared} bytes uncompressed, "
                                 f"{declared / size:.0f}x the file's {size}; refusing a decompression bomb")
            bad = archive.testzip()  # reads every member, checking its CRC-32 (and its declared size)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, NotImplementedError, RuntimeError) as exc:
        raise ValueError(f"{path} is not a readable PyTorch file (corrupt zip archive: {exc})") from None
    if bad is not None:
        raise ValueError(f"{path} is corrupt: zip member {bad!r} does not match its CRC-32")


def _check_tensors(obj: Any, path: Path) -> None:
    """Every tensor in what `torch.load` returned must be dense and own its elements: a zero-stride (`expand`) or
    overlapping view of a small storage would become a huge array once copied, and a sparse tensor is no weight."""
    stack, seen, total = [obj], 0, 0
    limit = MAX_INFLATION * path.stat().st_size + (1 << 20)
    while stack:
        item = stack.pop()
        seen += 1
        if seen > 10_000_000:
            raise ValueError(f"{path}: too many objects")
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, torch.Tensor):
            _check_tensor(item, path)
            total += item.numel() * item.element_size()
            if total > limit:  # views sharing one storage (tied weights are two; thousands are an attack)
                raise ValueError(f"{path}: its tensors span {total} bytes or more, over {MAX_INFLATION}x the "
                                 "file's size; refusing views that repeat shared storage")


def _check_tensor(t: torch.Tensor, path: Path) -> None:
    if t.layout != torch.strided:
        raise ValueError(f"{path}: a tensor of shape {tuple(t.shape)} has layout {t.layout}; weights must be dense "
                         "(strided) tensors")
    dims = sorted((stride, n) for n, stride in zip(t.shape, t.stride()) if n > 1)
    expected = 1
    for stride, n in dims:
        if stride != expected:
            raise ValueError(f"{path}: a tensor of shape {tuple(t.shape)} has strides {tuple(t.stride())}, a view "
                             "that repeats or overlaps its storage (e.g. expand()); weights must own their elements")
        expected *= n
    need = t.numel() * t.element_size()
    have = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
    if need > have:
        raise ValueError(f"{path}: a tensor of shape {tuple(t.shape)} needs {need} bytes, its storage holds {have}")


def numpy_state(state: Mapping[str, Any], path: Path | str, consume: bool = False,
                 integers: bool = False) -> dict[str, np.ndarray]:
    """Tensors -> NumPy arrays (sharing memory); `consume=True` empties `state` (a dict) as it goes, so that the
    arrays are the only owners of the weights. `integers=True` keeps integer and boolean buffers (position ids, a
    causal mask) for a layout to skip; otherwise they are refused."""
    out = {}
    for key in list(state):
        value = state.pop(key) if consume else state[key]
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: entry {key!r} is a {type(value).__name__}, expected a tensor")
        _check_tensor(value, path)
        if integers and not value.is_floating_point() and not value.is_complex():
            out[key] = value.detach().cpu().numpy()
            continue
        if not value.is_floating_point():
            raise ValueError(f"{path}: entry {key!r} has dtype {value.dtype}, expected a floating dtype")
        if value.dtype == torch.bfloat16:
            value = value.float()
        out[key] = value.detach().cpu().numpy()
    return out


# --- any state dict ----------------------------------------------------------------------------------------------

LIGHTNING_VERSION = "pytorch-lightning_version"  # a key every PyTorch Lightning .ckpt has


def is_lightning_checkpoint(obj: Any) -> bool:
    """A PyTorch Lightning `.ckpt`: `{"state_dict": ..., "hyper_parameters": ..., "epoch": ..., ...}`."""
    return isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping) and (
        LIGHTNING_VERSION in obj or "hyper_parameters" in obj)


def lightning_parts(obj: Mapping[str, Any], path: str | os.PathLike) -> tuple[dict[str, Any] | None, str]:
    """`(hyper_parameters or None, a note)` of a Lightning checkpoint. Its state dict's keys keep the
    LightningModule's attribute prefixes (`model.encoder...`): a layout names them, nothing strips them."""
    hparams = obj.get("hyper_parameters")
    if hparams is not None and not isinstance(hparams, Mapping):
        raise ValueError(f"{path}: hyper_parameters is a {type(hparams).__name__}, expected a dict")
    version = obj.get(LIGHTNING_VERSION)
    about = ", ".join(x for x in (f"pytorch-lightning {version}" if version else "",
                                  f"epoch {obj['epoch']}" if "epoch" in obj else "") if x)
    note = (f"read a PyTorch Lightning checkpoint ({about or 'no version recorded'}): its state_dict"
            + (f"; hyper_parameters has {len(hparams)} key(s), read only where named (\"hparam:KEY\")"
               if hparams else ""))
    return (dict(hparams) if hparams is not None else None), note


def unwrap_state_dict(obj: Any, path: str | os.PathLike) -> tuple[Mapping[str, Any], str | None]:
    """The tensor dict inside a loaded object: the object itself, a Lightning checkpoint's `state_dict`, or a lone
    nested dict such as `{"model_state_dict": ..., "epoch": 3}`. Returns `(state, key it was under or None)`."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path} holds a {type(obj).__name__}, expected a state dict")
    if is_lightning_checkpoint(obj):
        state = obj["state_dict"]
        bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
        if bad or not state:
            raise ValueError(f"{path}: a Lightning checkpoint whose state_dict " + (
                f"holds non-tensor entries {bad[:4]}" if bad else "is empty"))
        return state, "state_dict"
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, None
    nested = [k for k, v in obj.items() if isinstance(v, Mapping) and v
              and all(isinstance(t, torch.Tensor) for t in v.values())]
    if len(nested) == 1:
        return obj[nested[0]], nested[0]
    raise ValueError(f"{path} is not a state dict: expected a dict of tensors (or one nested under a key such as "
                     f"'model_state_dict'), found keys {sorted(map(str, obj))[:8]}")
