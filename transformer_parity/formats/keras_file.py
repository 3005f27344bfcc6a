"""The Keras twin's checkpoint file, `.weights.h5`: written and read here with h5py alone.

A `.weights.h5` is an HDF5 file whose layout Keras derives from the model's structure, so it is written and read
here directly, without building a model or importing TensorFlow (which alone costs ~0.5 GB and ~3 s); the layout
itself, as a table over `tf_impl.Transformer`'s structure, is `tf_impl.saved_names.weights_h5_table`. The tests
check it against files `model.save_weights()` writes and that `model.load_weights()` reads ours, for every variant.

The config travels as the root attribute `transformer_parity_config` (Keras ignores it). A `.weights.h5` written by
`tf_impl.Transformer.save_weights()` has none; pass the config explicitly then.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

import reference_numpy as rn
from reference_numpy import TransformerConfig, mapping
from tf_impl.saved_names import keras_path, layer_groups, table_path, weights_h5_table

from ..streaming import hdf5
from ..streaming.lazy import deferred
from .record import Format, Loaded, ReadRequest, WriteRequest, check_input, known_origin, write_file

FORMAT_TAG = "transformer-parity/keras"
FORMAT_VERSION = "1"
CONFIG_ATTR = "transformer_parity_config"
ORIGIN_ATTR = "transformer_parity_origin"  # the external family the weights came from, when known


def save_weights_h5(path: str | os.PathLike, config: TransformerConfig, weights: Mapping[str, np.ndarray],
                    on_tensor: Callable[[str, int], None] | None = None, consume: bool = False,
                    origin: str | None = None) -> None:
    """Write a `.weights.h5` that `tf_impl.Transformer(config).load_weights(path)` accepts, with the config as a root
    attribute (the caller makes it atomic: pass a temporary path ending in `.weights.h5`, then rename).
    `consume=True` deletes each entry of `weights` (a dict) once written; `origin` (the external family the weights
    came from) is kept as the root attribute `ORIGIN_ATTR`."""
    import h5py

    rn.validate_weights(config, weights)
    plan = mapping.plan(rn.parameter_shapes(config), weights_h5_table(config))
    with h5py.File(path, "w") as f:
        f.attrs[CONFIG_ATTR] = config.to_json()
        f.attrs["format"] = FORMAT_TAG
        f.attrs["format_version"] = FORMAT_VERSION
        if origin is not None:
            f.attrs[ORIGIN_ATTR] = origin
        for group, name in layer_groups(config).items():
            vars_group = f.require_group(f"{group}/vars" if group else "vars")
            vars_group.attrs["name"] = name
        laid_out: list = []  # datasets whose bytes are written once the file is closed
        for name, (fw_name, _, _) in plan.items():  # every transform is the identity
            hdf5.write_dataset(f, keras_path(fw_name), weights.pop(name) if consume else weights[name],
                               deferred=laid_out)
    canonical = {keras_path(fw_name): name for name, (fw_name, _, _) in plan.items()}
    hdf5.write_deferred(path, laid_out, None if on_tensor is None else lambda name, n: on_tensor(canonical[name], n))


def read_h5_file(path: str | os.PathLike, fields: Mapping[str, Any] | None = None, lazy: bool = False
                 ) -> tuple[TransformerConfig | None, dict[str, np.ndarray]]:
    """`(config or None, {table path: array})` of a `.weights.h5`; `ValueError` for anything else.

    The file is treated as hostile: every link is checked before anything is read (no soft or external links, no
    virtual datasets, no external storage, no filters: neither this module nor Keras writes any), every dataset must
    be floating-point and stored in full in this file (so no fill-value expansion), and, when the config is known
    (stored, or `fields` applied to it or given alone), each dataset must be one the config expects, with its shape,
    before it is read. What is read is therefore bounded by the file's own size. `lazy=True`: each dataset a
    `LazyArray` in its stored dtype (`read_dataset`).
    """
    import h5py

    path = Path(path)
    size = path.stat().st_size
    try:
        with h5py.File(path, "r") as f:
            config = _h5_config(path, f.attrs.get(CONFIG_ATTR), fields)
            checked = hdf5.check_layout(path, f, size)
            expected = _expected_h5_shapes(path, config, len(checked)) if config is not None else None
            datasets: dict[str, np.ndarray] = {}
            for name, shape in checked.items():
                if expected is not None:
                    if name not in expected:
                        raise ValueError(f"{path}: dataset {name!r} is not a weight of this config")
                    if shape != expected[name]:
                        raise ValueError(f"{path}: dataset {name!r} has shape {shape}, the config expects "
                                         f"{expected[name]}")
                datasets[table_path(name)] = hdf5.read_dataset(f[name], lazy)
    except (OSError, KeyError, RuntimeError) as exc:
        raise ValueError(f"{path} is not a readable HDF5 file (truncated or corrupt?): {exc}") from None
    return config, datasets


def _h5_config(path: Path, text: Any, fields: Mapping[str, Any] | None) -> TransformerConfig | None:
    """The stored config (with `fields` applied), the config `fields` alone give, or None."""
    stored = None
    if text is not None:
        try:
            stored = TransformerConfig.from_json(text.decode() if isinstance(text, bytes) else str(text))
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"{path}: the config stored in its attributes is invalid: {exc}") from None
    if not fields:
        return stored
    try:
        return stored.replace(**fields) if stored is not None else TransformerConfig.from_dict(dict(fields))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: invalid config: {exc}") from None


def _expected_h5_shapes(path: Path, config: TransformerConfig, n_datasets: int) -> dict[str, tuple[int, ...]]:
    """{Keras dataset path: shape} for `config`, after checking the config is not larger than the file can hold."""
    try:
        rn.schema.check_config_against_file(config, n_datasets, source=str(path))
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    shapes = rn.parameter_shapes(config)
    plan = mapping.plan(shapes, weights_h5_table(config))
    return {keras_path(fw_name): shapes[name] for name, (fw_name, _, _) in plan.items()}


class NoStoredConfig(ValueError):
    """A `.weights.h5` without a transformer-parity config and without `fields` to make one; `names` are its
    datasets, which tell the caller what the file is (a plain Keras model's, a KerasHub model's, ours)."""

    def __init__(self, path, names: list[str]):
        super().__init__(f"{path} carries no transformer-parity config (a plain Keras save_weights file?); give the "
                         "config's fields")
        self.path, self.names = Path(path), names


def load_weights_h5(path: str | os.PathLike, fields: Mapping[str, Any] | None = None, lazy: bool = False
                    ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Canonical `(config, weights)` from a `.weights.h5`. The config is the stored one with `fields` applied; a file
    that stores none (one `model.save_weights()` wrote) needs the whole config in `fields`. `lazy=True`: the weights
    are `LazyArray`s in the stored dtype, each read when asked."""
    config, datasets = read_h5_file(path, fields, lazy)
    if config is None:
        raise NoStoredConfig(path, list(datasets))
    if not datasets:
        raise ValueError(f"{path} holds no weights")
    try:
        return config, rn.from_framework_state(config, datasets, weights_h5_table(config), consume=True,
                                               defer=deferred if lazy else None)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# --- the record -------------------------------------------------------------------------------------------------------

def read(request: ReadRequest) -> Loaded:
    import h5py

    from .hints import missing_config

    path = check_input(request.path)
    try:
        config, weights = load_weights_h5(path, request.fields, request.lazy)
    except NoStoredConfig as exc:
        raise missing_config(path, exc.names) from None
    with h5py.File(path, "r") as f:
        origin = f.attrs.get(ORIGIN_ATTR)
    return Loaded(path, FORMAT.name, "keras", config, weights,
                  origin=known_origin(origin.decode() if isinstance(origin, bytes) else origin))


def write(request: WriteRequest) -> tuple[Path, str]:
    return write_file(request, lambda: lambda tmp: save_weights_h5(tmp, request.config, request.weights,
                                                                   request.on_tensor, request.consume,
                                                                   origin=request.origin))


FORMAT = Format(
    name="keras", what="the Keras twin's save_weights layout and its config", framework="keras",
    extensions=(".weights.h5", ".h5"), containers=("hdf5",), read=read, write=write, streamed=True, families=(),
    write_extensions=(".weights.h5",),  # keras.Model.load_weights requires it
    is_directory=None, output_directory=None, dir_kind=None)
