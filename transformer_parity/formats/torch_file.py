"""The PyTorch twin's checkpoint file, the project's `.pt`: `{"format": FORMAT_TAG, "format_version": "1", "config":
<config JSON>, "state_dict": <torch_impl.Transformer state dict>}`; weights map through `torch_impl.weight_table`.

Files are read with `io.torch_files.read_torch_file` (`torch.load(..., weights_only=True)`: nothing in a pickle ever
runs). Other state dicts are mapped by the external layouts in `transformer_parity.layouts`, e.g. models built around
`torch.nn.Transformer` (`layouts.nn_transformer`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

import reference_numpy as rn
from reference_numpy import TransformerConfig

from ..errors import UsageError
from .record import Format, Loaded, ReadRequest, WriteRequest, check_input, known_origin, write_file

FORMAT_TAG = "transformer-parity/torch"
FORMAT_VERSION = "1"


def is_project_file(obj: Any) -> bool:
    return isinstance(obj, Mapping) and obj.get("format") == FORMAT_TAG


# --- the project's .pt ------------------------------------------------------------------------------------------------

def save_pt(path: str | os.PathLike, config: TransformerConfig, weights: Mapping[str, np.ndarray],
            consume: bool = False, origin: str | None = None) -> None:
    """Write the project's `.pt` (torch_impl state dict + config) to `path` (the caller makes it atomic);
    `consume=True` empties `weights` (a dict) as it converts them; `origin`: the external family they came from."""
    import torch

    from torch_impl.model import weight_table

    state = rn.to_framework_state(config, weights, weight_table(config), consume=consume)
    try:
        torch.save({"format": FORMAT_TAG, "format_version": FORMAT_VERSION, "config": config.to_json(),
                    **({"origin": origin} if origin is not None else {}),
                    "state_dict": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}}, path)
    except RuntimeError as exc:  # PyTorch's zip writer reports a failed write (a full disk) as RuntimeError
        import shutil

        folder = Path(path).parent
        free = shutil.disk_usage(folder).free if folder.is_dir() else 0
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OSError(f"writing a .pt file in {folder} failed ({detail}); {free / 2 ** 20:.0f} MiB free there "
                      "(disk full?)") from None


def load_pt(obj: Mapping[str, Any], path: str | os.PathLike, fields: Mapping[str, Any] | None = None
            ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Canonical `(config, weights)` from a loaded project `.pt` object; `fields` override the stored config."""
    from torch_impl.model import weight_table

    from ..io.torch_files import numpy_state

    if obj.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported format_version {obj.get('format_version')!r}, expected "
                         f"{FORMAT_VERSION!r}")
    if not isinstance(obj.get("config"), str) or not isinstance(obj.get("state_dict"), Mapping):
        raise ValueError(f"{path}: a {FORMAT_TAG} file needs a config string and a state_dict")
    try:
        config = TransformerConfig.from_json(obj["config"])
        if fields:
            config = config.replace(**fields)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{path}: invalid config: {exc}") from None
    rn.schema.check_config_against_file(config, len(obj["state_dict"]), str(path))
    try:
        return config, rn.from_framework_state(config, numpy_state(obj["state_dict"], path, consume=True),
                                               weight_table(config), consume=True)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def looks_like_torch_impl_state(state: Mapping[str, Any]) -> bool:
    return isinstance(state, Mapping) and "src_embed.token.weight" in state


def load_torch_impl_state(state: Mapping[str, Any], path: str | os.PathLike, config: TransformerConfig
                          ) -> dict[str, np.ndarray]:
    """A bare `torch_impl.Transformer.state_dict()` (no config stored) under an explicitly given config."""
    from torch_impl.model import weight_table

    from ..io.torch_files import numpy_state

    rn.schema.check_config_against_file(config, len(state), str(path))
    try:
        return rn.from_framework_state(config, numpy_state(state, path, consume=True), weight_table(config),
                                       consume=True)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# --- the record -------------------------------------------------------------------------------------------------------

def read(request: ReadRequest) -> Loaded:
    """Any PyTorch file, told apart by what it holds: the project's `.pt`, a state dict of a model built around
    `torch.nn.Transformer` (read as `nn-transformer`), or a bare `torch_impl` state dict under the given config. A
    PyTorch Lightning `.ckpt` is read like any of them: its `state_dict`, with `hyper_parameters` where a layout
    names a key (`layouts.hparams`)."""
    from ..io.guards import deferred_signals
    from ..layouts import nn_transformer as nn
    from .hints import config_from_fields

    path, fields = check_input(request.path), request.fields
    with deferred_signals():  # an interrupt inside PyTorch's import aborts the process with a C++ trace
        from ..io import torch_files
    obj = torch_files.read_torch_file(path)
    if is_project_file(obj):
        config, weights = load_pt(obj, path, fields)
        return Loaded(path, FORMAT.name, "torch", config, weights, origin=known_origin(obj.get("origin")))
    hparams, lightning = (torch_files.lightning_parts(obj, path) if torch_files.is_lightning_checkpoint(obj)
                          else (None, None))
    state, wrapper = torch_files.unwrap_state_dict(obj, path)
    if nn.looks_like_nn_transformer(state):
        config, weights, notes = nn.import_nn_transformer(state, path, fields, stored=nn.stored_nn_config(state),
                                                          consume=True, hparams=hparams)
        if wrapper:
            notes.insert(0, lightning or f"read the state dict under key {wrapper!r}")
        return Loaded(path, nn.NAME, "torch", config, weights, notes)
    if looks_like_torch_impl_state(state):
        config = config_from_fields(path, fields, list(state))
        return Loaded(path, FORMAT.name, "torch", config, load_torch_impl_state(state, path, config))
    raise UsageError(f"{path} is a PyTorch file but neither a transformer-parity checkpoint, a torch_impl state "
                     "dict, nor a model built around torch.nn.Transformer (no key ending in "
                     "'layers.0.self_attn.in_proj_weight'); a model of your own ports with a layout file: "
                     f"transformer-parity layout --scaffold {path.name} > layout.toml, then --layout layout.toml")


def write(request: WriteRequest) -> tuple[Path, str]:
    return write_file(request, lambda: lambda tmp: save_pt(tmp, request.config, request.weights, request.consume,
                                                            origin=request.origin))


FORMAT = Format(
    name="torch", what="the PyTorch twin's state dict and its config (a zip, as torch.save writes it)",
    framework="torch", extensions=(".pt", ".pth", ".ckpt"),  # .ckpt: a PyTorch Lightning checkpoint
    containers=("zip", "pickle"), read=read, write=write, streamed=False, families=(), write_extensions=(),
    is_directory=None, output_directory=None, dir_kind=None)
