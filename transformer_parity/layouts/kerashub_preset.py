"""KerasHub preset directories (`save_to_preset`: `config.json`, `metadata.json`, `model.weights.h5`, and for a
task `task.json` and `task.weights.h5`) and bare `.weights.h5` files of KerasHub models <-> canonical weights.

Each family module (listed in `FAMILIES`) exports its record, `FAMILY` (`layouts.family.KerasHubFamily`: its
classes, its config both ways, its table, its text classifier); its table is a layout file (`layouts.user`). Reading
needs h5py only (the files go through the hardened reader, `user.read_keras_h5`); writing needs h5py only: the file
holds the datasets Keras's `load_weights` reads, at the paths it reads them from (Keras names the i-th repeated layer
`transformer_decoder`, `transformer_decoder_1`, ...: `_0` here).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

import reference_numpy as rn
from reference_numpy.mapping import BANKS

from . import kerashub_classifiers as classifiers
from .approximations import RECORD_KEY, Record, record_of
from .table import export_state, import_state

from . import KERASHUB_LAYOUTS as FAMILIES
from . import KERASHUB_PRESETS as PRESETS
from . import kerashub_families, kerashub_family
FORMATS = ("kerashub", *FAMILIES)
CONFIG, TASK_CONFIG, METADATA = "config.json", "task.json", "metadata.json"
WEIGHTS, TASK_WEIGHTS = "model.weights.h5", "task.weights.h5"
TASK_PREFIX = "task/"  # task.weights.h5 entries, in a table


def _preset_dir_kind():
    from transformer_parity.io.outputs import DirKind

    return DirKind(name="a KerasHub preset directory", config_name="a serialized KerasHub object",
                   model_files=(r"config\.json", r"metadata\.json", r"(model|task)\.weights\.h5", r"task\.json"),
                   companions=(r"tokenizer\.json", r"preprocessor\.json", r"(image|audio)_converter\.json", r"assets",
                               r"README(\.md)?", r"\.gitattributes"),
                   config_ok=lambda file: is_preset(file.parent))






def _json(path: Path) -> dict[str, Any]:
    from transformer_parity.io.limits import read_json_object
    from .hf_dir import member

    return read_json_object(member(path.parent, path.name), f"a model's {path.name}")  # a link out is refused


def is_preset(path: str | os.PathLike) -> bool:
    """A directory whose config.json is a serialized KerasHub object (`"registered_name": "keras_hub>..."`), or one
    of keras-nlp, its name before keras-hub 0.16 (`keras_nlp>...`, the same classes and files). A config.json too
    large for any config file is refused here (`ValueError`), not taken for another format's."""
    from transformer_parity.io.limits import FileTooLarge

    config = Path(path) / CONFIG
    try:
        data = _json(config) if config.is_file() else {}
    except FileTooLarge:
        raise
    except (OSError, ValueError):
        return False
    return str(data.get("registered_name", "")).startswith(PACKAGES_GT) or \
        str(data.get("module", "")).startswith(PACKAGES_DOT)


PACKAGES_GT = ("keras_hub>", "keras_nlp>")  # registered names; keras-nlp 0.8-0.15 wrote the second
PACKAGES_DOT = ("keras_hub.", "keras_nlp.")
PRESET_DIR = _preset_dir_kind()  # what `--force` may replace in a preset directory, and what it keeps


def _class_name(data: Mapping[str, Any], path: Path) -> str:
    name = data.get("class_name")
    if not isinstance(name, str):
        raise ValueError(f"{path}: expected a serialized KerasHub object with a class_name, received {name!r}")
    return name


def supported_classes() -> str:
    """The KerasHub backbones (and their tasks) a preset may hold, for error messages."""
    return ", ".join(f"{f.backbone} ({', '.join(f.tasks) or 'backbone only'})"
                     for f in kerashub_families() if f.backbone)


def family_for(backbone_class: str, path: Path, declared: str | None):
    """The family record whose backbones include `backbone_class` (`declared`, a family's format name, must agree)."""
    found = next((f for f in kerashub_families() if backbone_class in f.backbones), None)
    if found is None:
        raise ValueError(f"{path}: KerasHub class {backbone_class!r} is not supported; supported: "
                         + supported_classes())
    if declared not in (None, "kerashub", found.name):
        raise ValueError(f"{path} holds a {backbone_class} (format {found.name}), not {declared}")
    return found


def _is_classifier(family, task: str | None) -> bool:
    """Whether `task` is the family's text classifier (`kerashub_classifiers`)."""
    return task is not None and family.classifier is not None and task == family.classifier.name


def _task(path: Path, family) -> str | None:
    """The task class of task.json (None without one); a task the family does not have is refused."""
    if not (path / TASK_CONFIG).is_file():
        return None
    task = _class_name(_json(path / TASK_CONFIG), path / TASK_CONFIG)
    if _is_classifier(family, task):
        return task
    if task not in family.tasks:
        raise ValueError(f"{path}: KerasHub task {task!r} is not supported for {family.backbone}; supported: "
                         f"{', '.join(family.tasks) or 'the backbone alone (no task.json)'}")
    return task


def _repeated(table) -> list[str]:
    from .user import repeated_layers
    return repeated_layers(table)


def _read_weights(path: Path, table, task: bool, lazy: bool = False) -> dict[str, np.ndarray]:
    from . import user

    from .hf_dir import member

    state = user.keras_names(user.read_keras_h5(member(path, WEIGHTS) if path.is_dir() else path, lazy),
                             _repeated(table))
    if task and member(path, TASK_WEIGHTS).is_file():
        task_state = user.keras_names(user.read_keras_h5(path / TASK_WEIGHTS, lazy), _repeated(table))
        state.update({TASK_PREFIX + k: v for k, v in task_state.items()})
    return state


def load_preset(path: str | os.PathLike, declared: str | None = None, fields: Mapping[str, Any] | None = None,
                drops=None, lazy: bool = False) -> tuple[rn.TransformerConfig, dict[str, np.ndarray], list[str], str]:
    """`(config, canonical weights, notes, format name)` of a preset directory; `fields` (--set/--config) override
    the mapped config. `lazy=True`: the weights are `LazyArray`s in the stored dtype (bfloat16 kept), each read from
    model.weights.h5 when asked."""
    path = Path(path)
    data = _json(path / CONFIG)
    family = family_for(_class_name(data, path / CONFIG), path, declared)
    task = _task(path, family)
    if not (path / WEIGHTS).is_file():
        raise ValueError(f"{path}: no {WEIGHTS} (a preset saved without weights?)")
    backbone = data.get("config")
    if not isinstance(backbone, dict):
        raise ValueError(f"{path / CONFIG}: expected the backbone's config object under 'config'")
    classifier = _is_classifier(family, task)
    try:
        config, notes = family.config_from_kerashub(backbone, None if classifier else task)
        if classifier:
            config = config.replace(**classifiers.fields(family.classifier, _json(path / TASK_CONFIG).get("config")
                                                         or {}, config, str(path / TASK_CONFIG)))
        if family.pad_token and "pad_id" not in (fields or {}):
            pad_id, note = preset_pad_id(path, family.pad_token)
            config = config.replace(pad_id=pad_id)
            notes.append(note)
        if fields:
            config = config.replace(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    table = _table(family, config)
    state = _read_weights(path, table, task is not None, lazy)
    if family.settle_from_weights is not None:  # what config.json leaves out but the weights show
        config, settled = family.settle_from_weights(config, state)
        notes += settled
        table = _table(family, config)
    if family.to_canonical_state is not None:  # arrays whose form differs from the canonical ones
        family.to_canonical_state(config, state)
    origins = {**{name: f"config.json {key}" for name, key in family.config_keys.items()},
               **{name: "--set/--config" for name in fields or {}}}
    weights = import_state(config, state, table, source=str(path), consume=True, drops=drops, origins=origins,
                           lazy=lazy)
    library = "keras-nlp" if str(data.get("registered_name", "")).startswith("keras_nlp>") else "KerasHub"
    notes.insert(0, f"read {library} {task or family.backbone} ({family.name}) from {path.name}")
    record = read_record(path)
    if record is not None:
        notes.append(record.note(config) if record.holds(config, "target") else
                     f"metadata.json records accepted approximations ({', '.join(record.names)}) that this config no "
                     "longer computes: the record is ignored")
    return config, weights, notes, family.name


def _table(family, config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    """The family's table, with its classifier's weights for a classifier config (`kerashub_classifiers`)."""
    found = family.classifier
    return family.table(config) + (found.weights if config.classifier and found is not None else [])


def read_record(path: str | os.PathLike) -> Record | None:
    """The approximations accepted when this tool wrote the preset (`approximations.Record`, in metadata.json), or
    None: not a preset directory, no metadata.json, or no record in it."""
    path = Path(path)
    if not (path.is_dir() and (path / METADATA).is_file()):
        return None
    return record_of(_json(path / METADATA), f"{path / METADATA}")


VOCABULARY = ("assets", "tokenizer", "vocabulary.txt")  # where KerasHub's WordPiece tokenizer keeps its vocabulary
BPE_VOCABULARY = ("assets", "tokenizer", "vocabulary.json")  # a byte-pair tokenizer's: token -> id
SPM_VOCABULARY = ("assets", "tokenizer", "vocabulary.spm")  # a SentencePiece model: its pieces, in id order
MAX_VOCABULARY = 64 << 20


def _vocabulary_id(path: Path, where: tuple[str, ...], token: str) -> int | None:
    """The id of `token` in the vocabulary file at `where` (a line of vocabulary.txt, vocabulary.json's value,
    vocabulary.spm's piece index);
    None if it has none."""
    from .hf_dir import member

    file = member(path, "/".join(where))
    if file.stat().st_size > MAX_VOCABULARY:
        raise ValueError(f"{'/'.join(where)} is over {MAX_VOCABULARY >> 20} MiB")
    if where == SPM_VOCABULARY:
        return next((i for i, piece in enumerate(_spm_pieces(file.read_bytes())) if piece == token), None)
    if where == BPE_VOCABULARY:
        table = _json(file)
        value = table.get(token)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"{'/'.join(where)} gives {token} the id {value!r}, not a token id")
        return value
    for index, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines()):
        if line.strip() == token:
            return index
    return None


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("vocabulary.spm is not a SentencePiece model (a truncated varint)")
        byte = data[at]
        value, shift, at = value | (byte & 0x7F) << shift, shift + 7, at + 1
        if not byte & 0x80:
            return value, at


def _fields(data: bytes):
    """(field number, wire type, value: int or bytes) of a protobuf message."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire in (1, 5):
            value, at = data[at:at + (8 if wire == 1 else 4)], at + (8 if wire == 1 else 4)
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = data[at:at + size], at + size
        else:
            raise ValueError(f"vocabulary.spm is not a SentencePiece model (wire type {wire})")
        if at > len(data):
            raise ValueError("vocabulary.spm is not a SentencePiece model (a field runs past the end)")
        yield number, wire, value


def _spm_pieces(data: bytes) -> list[str]:
    """The pieces of a SentencePiece `ModelProto` (field 1, each a `SentencePiece` whose field 1 is the piece), in
    id order."""
    pieces = []
    for number, wire, value in _fields(data):
        if number == 1 and wire == 2:
            pieces.append(next((v.decode("utf-8", "replace") for n, w, v in _fields(value) if n == 1 and w == 2), ""))
    return pieces


def preset_pad_id(path: Path, token: str) -> tuple[int, str]:
    """The pad id of a preset whose backbone takes a padding mask rather than a pad id: the id of `token` in
    its tokenizer's vocabulary, or what this tool recorded when it wrote the preset; else a `ValueError` asking for
    it (never assumed)."""
    from transformer_parity.io import outputs

    for where in (VOCABULARY, BPE_VOCABULARY, SPM_VOCABULARY):
        if path.joinpath(*where).is_file():
            index = _vocabulary_id(path, where, token)
            if index is None:
                raise ValueError(f"its {'/'.join(where)} has no {token} token; give the pad id with --set pad_id=N "
                                 "(or --set pad_id=none)")
            return index, f"pad_id={index}: {token} in the preset's {'/'.join(where)}"
    recorded = outputs.written_settings(path, [CONFIG, WEIGHTS]).get("pad_id", "absent")
    if recorded is None or (isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 0):
        return recorded, f"pad_id={recorded}: recorded by transformer-parity when it wrote this preset"
    raise ValueError(f"the backbone takes a padding mask, not a pad id, and the preset has no tokenizer vocabulary "
                     f"(vocabulary.txt, .json or .spm in assets/tokenizer) to tell which id pads: give --set pad_id=N "
                     f"(the id of {token}) or --set pad_id=none")


def load_weights_file(path: str | os.PathLike, declared: str, fields: Mapping[str, Any] | None = None,
                      drops=None, lazy: bool = False) -> tuple[rn.TransformerConfig, dict[str, np.ndarray], list[str],
                                                                str]:
    """A bare `.weights.h5` of a KerasHub backbone (`declared` names the family, a `FAMILIES` key): the config is
    read off the weights (layer count, widths, heads from the einsum kernels) with `fields` on top. `lazy`: as
    `load_preset`'s."""
    from . import user

    if declared not in FAMILIES:
        raise ValueError(f"{path}: a bare KerasHub .weights.h5 needs its family: --from "
                         f"{' or --from '.join(FAMILIES)}")
    family = kerashub_family(declared)
    layout = user.load(family.layout)
    banked = any(transform in BANKS for _, _, transform in layout.table)  # its experts stacked: how many, config.json
    if family.to_canonical_state is not None or banked:  # its arrays are read in the form its config.json says
        raise ValueError(f"{path}: a bare {declared} .weights.h5 is not read here (its arrays are reshaped by what "
                         "the preset's config.json says): give the preset directory")
    state = user.keras_names(user.read_keras_h5(path, lazy), _repeated(layout.table))
    state, task = _split_task(family, state)
    matched = user.match(layout, [k for k in state if not k.startswith(TASK_PREFIX)])
    shapes = user.canonical_shapes(layout, state, matched)
    inferred = {**{k: v for k, v in family.fixed.items() if k not in ("num_encoder_layers", "num_decoder_layers")},
                **layout.config, **user.heads_from(layout, state, matched),
                **(family.task_fields[task] if task else {}), **dict(fields or {})}
    if family.pad_token and "pad_id" not in inferred:
        raise ValueError(f"{path} ({declared}): a bare .weights.h5 does not tell which id pads (the backbone takes a "
                         f"padding mask): give --set pad_id=N (the id of {family.pad_token}) or "
                         "--set pad_id=none")
    config, notes = user.infer_config(shapes, inferred, source=f"{path} ({declared})")
    origins = {"num_encoder_layers": "one more than the highest encoder layer index of the weights",
               "num_decoder_layers": "one more than the highest decoder layer index of the weights",
               **{name: "--set/--config" for name in fields or {}}}
    weights = import_state(config, state, family.table(config) if task else layout.table, source=str(path),
                           consume=True, drops=drops, where=layout.where, origins=origins, lazy=lazy)
    notes.insert(0, f"read a KerasHub {task or family.backbone or 'model'} .weights.h5 ({declared}); config read off "
                    "the weights")
    return config, weights, notes, declared


def _split_task(family, state: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str | None]:
    """A task's `save_weights` nests its backbone (`layers/<name>_backbone/...`) beside the head's layers: the
    backbone's paths as in model.weights.h5, the rest under `task/` as in task.weights.h5, and the task's class.
    A family with one task whose fields it states (`task_fields`) has such files; others are left as they are."""
    tasks = family.task_fields
    nested = f"layers/{family.serialized[family.backbone][1]}/" if family.backbone else None
    if len(tasks) != 1 or not any(k.startswith(nested) for k in state):
        return state, None
    return {(k[len(nested):] if k.startswith(nested) else TASK_PREFIX + k): v for k, v in state.items()}, \
        next(iter(tasks))


def family_for_export(config: rn.TransformerConfig, declared: str | None = None):
    """The family record a canonical config is written as: `declared` (a family's format name), or the first
    preset family that can express it."""
    from . import first_exporter

    return first_exporter(_candidates(declared), config, "KerasHub", _problems(config))


def _candidates(declared: str | None) -> list:
    """The family records `declared` (kerashub: every preset family) names."""
    names = [n for n in PRESETS[1:] if declared in (None, "kerashub", n)] or [declared]
    return [kerashub_family(name) for name in names]


def _problems(config: rn.TransformerConfig):
    """How a family is asked whether it writes `config`: a classifier through its text classifier
    (`kerashub_classifiers`); None: its own `export_problems`."""
    return classifiers.export_problems if config.classifier is not None else None


def export_plan(config: rn.TransformerConfig, declared: str | None = None):
    """The `approximations.Plan` of a model that no family (of `declared`: kerashub or one family) takes as it is
    but one takes once its approximations are applied; None where one takes it exactly, or none even so."""
    from . import approximations, why_not

    try:
        family_for_export(config, declared)
        return None
    except ValueError:
        pass
    problems = _problems(config)
    return approximations.plan(_candidates(declared), config, lambda family, c: why_not(family, c, problems))


def known_approximations() -> list[str]:
    """The names `--accept-approximation` takes: every KerasHub family's approximations."""
    from . import approximations, kerashub_families

    return approximations.known(kerashub_families())


def approximations_named(names: Sequence[str]) -> list:
    """The `approximations.Approximation` of each name a record lists, as KerasHub's families define them (a name
    none defines is left out)."""
    from . import approximations, hf_families, kerashub_families

    ours = approximations.named(names, kerashub_families())
    return ours + [a for a in approximations.named(names, hf_families()) if a.name not in {b.name for b in ours}]


def _serialized(family, class_name: str, config: dict[str, Any], dtype: str | None) -> dict[str, Any]:
    """`keras.saving.serialize_keras_object` of a KerasHub backbone or task, as `save_to_preset` writes it."""
    module_path, name = family.serialized[class_name] if class_name in family.serialized else \
        classifiers.serialized(family)
    head = {"name": name}
    if dtype is not None:
        head.update(trainable=True, dtype={"module": "keras", "class_name": "DTypePolicy", "config": {"name": dtype},
                                           "registered_name": None})
    return {"module": module_path, "class_name": class_name, "config": {**head, **config},
            "registered_name": f"keras_hub>{class_name}"}


def _keras_path(name: str, repeated: list[str]) -> str:
    from .user import keras_path
    return keras_path(name, repeated)


def save_preset(path: str | os.PathLike, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray],
                declared: str | None = None, force: bool = False, notes: list[str] | None = None,
                on_tensor=None, record=None) -> str:
    """Write a preset directory `keras_hub.models.<Backbone or task>.from_preset(path)` loads; returns the format.
    With `force`, only over a preset directory (`PRESET_DIR`), keeping its tokenizer and other files this tool does
    not write. The weights are written dataset by dataset, each made from the canonical weights as it is written
    (`LazyArray`s are read a band at a time), in their dtype: bfloat16 as Keras stores it, with the backbone's
    dtype policy `bfloat16`, as KerasHub's own presets are; `on_tensor(name, bytes)` after each. `record` (an
    `approximations.Record`: the approximations accepted to write `config`) goes into metadata.json."""
    from transformer_parity.io import outputs

    family = family_for_export(config, declared)
    if config.classifier is not None:
        (backbone, _), task = family.config_to_kerashub(classifiers.base(config)), family.classifier.name
    else:
        backbone, task = family.config_to_kerashub(config)
    dtype = str(rn.weights_dtype(weights))
    table = _table(family, config)
    state = export_state(config, weights, table, lazy=True)
    if family.from_canonical_state is not None:  # refused here, before anything is written
        family.from_canonical_state(config, state)
    repeated = _repeated(table)
    files: dict[str, Any] = {CONFIG: _serialized(family, family.backbone, backbone, dtype),
                             METADATA: {"keras_version": _version("keras"), "keras_hub_version": _version("keras-hub"),
                                        "parameter_count": int(sum(v.size for v in state.values())),
                                        "tasks": [], "written_by": "transformer-parity"}}
    if record is not None:
        files[METADATA][RECORD_KEY] = record.to_json()
    if task is not None:
        own = classifiers.task_config(config, family.classifier) if config.classifier else \
            family.task_config(backbone, task) if family.task_config is not None else {}
        files[TASK_CONFIG] = _serialized(family, task, {"backbone": files[CONFIG], "preprocessor": None, **own}, None)
    path = outputs.check_output_dir(path, force, PRESET_DIR)
    _write_dir(path, files, {WEIGHTS: _keras_file({k: v for k, v in state.items() if not k.startswith(TASK_PREFIX)},
                                              repeated),
                             TASK_WEIGHTS: _keras_file({k[len(TASK_PREFIX):]: v for k, v in state.items()
                                                        if k.startswith(TASK_PREFIX)}, repeated)}, force, notes,
               {"pad_id": config.pad_id} if family.pad_token else None, on_tensor)
    return family.name


def _keras_file(state: dict[str, np.ndarray], repeated: list[str]) -> dict[str, np.ndarray]:
    """One file's datasets under Keras's paths: `X_0` back to `X` for a repeated layer or where an `X_1` sibling
    exists (`dense`, `dense_1`), as `user.keras_names` read them."""
    from .user import keras_paths

    paths = keras_paths(list(state), repeated)
    return {paths[k]: v for k, v in state.items()}


def save_weights_file(path: str | os.PathLike, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray],
                      declared: str, force: bool = False, notes: list[str] | None = None) -> str:
    """A bare `.weights.h5` of a model that has no preset: the datasets its `load_weights` reads."""
    from transformer_parity.io.outputs import atomic_path
    from . import why_not

    family = kerashub_family(declared)
    problems = why_not(family, config)
    if problems:
        raise ValueError(f"this model has no {declared} equivalent: {', '.join(problems)}")
    table = family.table(config)
    state = export_state(config, weights, table, lazy=True)
    with atomic_path(Path(path), force, notes) as tmp:
        _write_h5(tmp, {_keras_path(k, _repeated(table)): v for k, v in state.items()})
    return family.name


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _write_h5(file: Path, datasets: Mapping[str, np.ndarray], on_tensor=None) -> None:
    """The datasets laid out, then their bytes written in file order (`streaming.hdf5.write_dataset` and
    `write_deferred`: a lazy tensor a band of rows at a time)."""
    import h5py

    from transformer_parity.streaming.hdf5 import write_dataset, write_deferred

    deferred: list = []
    with h5py.File(file, "w") as f:
        for name, array in datasets.items():
            write_dataset(f, name, array, deferred=deferred)
    write_deferred(file, deferred, on_tensor)
    with open(file, "rb+") as f:  # on the disk before the preset is renamed into place
        os.fsync(f.fileno())


def _write_dir(path: Path, files: Mapping[str, Any], h5_files: Mapping[str, Mapping[str, np.ndarray]],
               force: bool, notes: list[str] | None, settings: dict | None = None, on_tensor=None) -> None:
    """Build the preset in a temporary directory beside `path`, then publish it (`outputs.atomic_dir`: the name
    claimed with mkdir without --force; with it, only over a preset, what is kept moved into the new one)."""
    from transformer_parity.io.outputs import atomic_dir

    with atomic_dir(path, force, PRESET_DIR, notes, settings) as tmp:
        for name, content in files.items():
            (tmp / name).write_text(json.dumps(content, indent=4) + "\n")
        for name, datasets in h5_files.items():
            if datasets:
                _write_h5(tmp / name, datasets, on_tensor)
