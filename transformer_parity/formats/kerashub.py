"""KerasHub models: a `save_to_preset` directory of any family (`layouts.kerashub_preset`), or, with `--from` naming
the family, a bare `.weights.h5` of its backbone or task (the config read off the weights). A family whose models
ship as a bare `.weights.h5` only (no preset directory: `layouts.KERASHUB_PRESETS` leaves it out) is written as one."""

from __future__ import annotations

from pathlib import Path

from ..layouts import KERASHUB_LAYOUTS, KERASHUB_PRESETS
from .record import Format, Loaded, ReadRequest, WriteRequest


def is_directory(path: Path) -> bool:
    from ..layouts import kerashub_preset

    return (path / "config.json").is_file() and kerashub_preset.is_preset(path)


def read(request: ReadRequest) -> Loaded:
    from ..layouts import kerashub_preset as kh

    path, name = request.path, request.name or FORMAT.name
    load = kh.load_preset if path.is_dir() else kh.load_weights_file
    config, weights, notes, family = load(path, name, request.fields, request.drops, request.lazy)
    return Loaded(path, family, "keras", config, weights, notes, origin=family)


def write(request: WriteRequest) -> tuple[Path, str]:
    """A KerasHub preset directory (`from_preset(path)` loads it), built beside `path` and renamed into place; each
    tensor is made from the weights as it is written, so they are left as they are. A family without presets: its
    bare `.weights.h5`."""
    from ..io import guards, outputs
    from ..layouts import kerashub_preset

    if request.name not in KERASHUB_PRESETS:
        path = guards.check_output(request.path, request.force)
        return path, kerashub_preset.save_weights_file(path, request.config, request.weights, request.name,
                                                       request.force, notes=request.notes)
    path = outputs.check_output_dir(request.path, request.force, kerashub_preset.PRESET_DIR)
    return path, kerashub_preset.save_preset(path, request.config, request.weights, request.name, request.force,
                                             notes=request.notes, on_tensor=request.on_tensor, record=request.record)


def dir_kind():
    from ..layouts.kerashub_preset import PRESET_DIR

    return PRESET_DIR


FORMAT = Format(
    name="kerashub", what="a KerasHub save_to_preset directory (or, with --from FAMILY, a bare .weights.h5)",
    framework="keras", extensions=(), containers=("hdf5",), read=read, write=write, streamed=True,
    families=tuple(KERASHUB_LAYOUTS), write_extensions=(), is_directory=is_directory,
    output_directory=lambda name: name in KERASHUB_PRESETS, dir_kind=dir_kind)

