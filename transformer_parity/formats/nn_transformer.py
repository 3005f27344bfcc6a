"""State dicts of models built around `torch.nn.Transformer` (the PyTorch tutorials' layout,
`layouts.nn_transformer`): read by the PyTorch file reader, which tells them apart by their keys; written in the
tutorials' layout, the config in the state dict's metadata."""

from __future__ import annotations

from pathlib import Path

from . import torch_file
from .record import Format, WriteRequest, write_file


def write(request: WriteRequest) -> tuple[Path, str]:
    def load_writer():
        from ..layouts import nn_transformer

        return lambda tmp: nn_transformer.save_nn_transformer(tmp, request.config, request.weights, request.consume)
    return write_file(request, load_writer)


FORMAT = Format(
    name="nn-transformer", what="a model built around torch.nn.Transformer (the PyTorch tutorials' state dict)",
    framework="torch", extensions=(".bin",), containers=("zip", "pickle"), read=torch_file.read, write=write,
    streamed=False, families=(), write_extensions=(), is_directory=None, output_directory=None, dir_kind=None)
