"""The canonical format: a `.safetensors` file of canonical names, the config in its metadata (`io.safetensors_io`
streams it tensor by tensor both ways)."""

from __future__ import annotations

from pathlib import Path

import reference_numpy as rn

from .record import Format, Loaded, ReadRequest, WriteRequest, check_input, known_origin, write_file


def read(request: ReadRequest) -> Loaded:
    from ..io import limits
    from ..io.safetensors_io import read_canonical, widened_note
    from .hints import config_from_fields

    path, fields = check_input(request.path), request.fields
    stored, tensors, metadata = read_canonical(path, request.on_tensor, request.lazy)
    config = (stored.replace(**fields) if stored is not None and fields
              else stored or config_from_fields(path, fields, list(tensors)))
    limits.check_config_against_file(config, len(tensors), str(path))  # before listing the config's parameters
    try:
        rn.validate_weights(config, tensors)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    note = None if request.lazy else widened_note([path])
    return Loaded(path, FORMAT.name, FORMAT.framework, config, tensors, [] if note is None else [note],
                  origin=known_origin(metadata.get("origin")))


def write(request: WriteRequest) -> tuple[Path, str]:
    def load_writer():
        from ..io.safetensors_io import write_canonical

        return lambda tmp: write_canonical(tmp, request.config, request.weights, request.on_tensor, request.consume,
                                           origin=request.origin)
    return write_file(request, load_writer)


FORMAT = Format(
    name="canonical", what="canonical names, the config in the metadata", framework="numpy",
    extensions=(".safetensors",), containers=("safetensors",), read=read, write=write, streamed=True,
    families=(), write_extensions=(), is_directory=None, output_directory=None, dir_kind=None)
