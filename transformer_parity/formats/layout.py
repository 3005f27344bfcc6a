"""A checkpoint read through a user's layout file (`--layout FILE.toml`, `layouts.user`): a PyTorch state dict, a
`.safetensors` or a `.weights.h5` of a model this tool never saw, its names mapped by the file. It runs where its
container says (`torch-layout`, `safetensors-layout`, `keras-layout`); nothing is written in it (`layout --export`
writes one)."""

from __future__ import annotations

from ..errors import UsageError
from .record import Format, Loaded, ReadRequest, check_input

PREFIX = "layout:"  # the format `formats.load` is given: PREFIX + the layout file's path
LOADED = {"zip": ("torch-layout", "torch"), "pickle": ("torch-layout", "torch"),
          "safetensors": ("safetensors-layout", "numpy"), "hdf5": ("keras-layout", "keras")}  # container -> (name, framework)


def read(request: ReadRequest) -> Loaded:
    from ..io.sniff import sniff
    from ..layouts import user

    path = check_input(request.path)
    content = sniff(path)
    if content not in LOADED:
        raise UsageError(f"{path}: a layout file describes a PyTorch state dict, a .safetensors or a .weights.h5 "
                         "file; this one's first bytes match none of them")
    layout = (request.name or "")[len(PREFIX):]
    try:
        config, weights, notes = user.import_with_layout(path, layout, request.fields, request.drops)
    except ImportError as exc:
        raise UsageError(f"reading {path} needs {exc.name}, which is not installed") from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:  # a tensor whose shape the layout cannot take
        raise UsageError(f"{path} does not fit the layout {layout}: {type(exc).__name__}: {exc}") from exc
    name, framework = LOADED[content]
    return Loaded(path, name, framework, config, weights, notes)


FORMAT = Format(
    name="layout", what="a checkpoint described by a user's layout file (--layout FILE.toml)", framework=None,
    extensions=(), containers=tuple(LOADED), read=read, write=None, streamed=False, families=(), write_extensions=(),
    is_directory=None, output_directory=None, dir_kind=None)
