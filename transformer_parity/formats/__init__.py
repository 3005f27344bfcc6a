"""Checkpoint formats: which one a file is, reading any of them into canonical weights, writing any of them.

Orchestration only: the canonical format's streaming IO is `safetensors_io`, the PyTorch files are
`torch_impl.checkpoints`, the Keras files `tf_impl.checkpoints` (h5py only). Frameworks are imported only when a
file of theirs is read or written.

| format           | extensions            | content                                   | runs in |
|------------------|-----------------------|-------------------------------------------|---------|
| `canonical`      | `.safetensors`        | canonical names, config in the metadata    | numpy   |
| `torch`          | `.pt`, `.pth`         | torch_impl state dict + config (zip)       | torch   |
| `nn-transformer` | `.pt`, `.pth`, `.bin`, `.ckpt` | a model around `torch.nn.Transformer` | torch |
| `keras`          | `.weights.h5`, `.h5`  | tf_impl `save_weights` layout + config     | keras   |
| `hf`             | a directory           | Hugging Face `save_pretrained` model dir   | torch   |
| `kerashub`       | a directory           | KerasHub `save_to_preset` (every family)  | keras   |
| `kerashub-seq2seq` | `.weights.h5`       | keras.io's English-to-Spanish KerasHub model | keras |

A PyTorch Lightning `.ckpt` is read like any PyTorch file (`weights_only=True`): its `state_dict`, with
`hyper_parameters` available where something names a key (`layouts.hparams`). A table's `ignore` entry drops a float
tensor with a nonzero value only when the user names it (`allow_drop`, the CLI's `--allow-drop`); `Loaded.dropped`
lists what was dropped so.

`hf` is a directory (`config.json` + `model.safetensors`, shards with an index, or `pytorch_model.bin`) of one of
the families in `layouts.HF_LAYOUTS`, told apart by config.json's `model_type`; `hf-gpt2`, `hf-bert`,
`hf-marian` and `hf-bart` name one family explicitly (`--to hf` picks the family that can express the
config). The external layouts (`nn-transformer` and the Hugging Face families) live in `transformer_parity.layouts`,
one module each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import reference_numpy as rn

from ..errors import UsageError
from ..io.guards import check_output, deferred_signals
from ..io.outputs import atomic_path
from ..io.sniff import sniff
from ..layouts import HF_LAYOUTS, KERASHUB_LAYOUTS, KERASHUB_PRESETS
from ..layouts.table import Drops

HF_FORMATS = ("hf", *HF_LAYOUTS)  # model directories
FORMATS = ("canonical", "torch", "nn-transformer", "keras", *HF_FORMATS)
FRAMEWORK = {"canonical": "numpy", "torch": "torch", "nn-transformer": "torch", "keras": "keras",
             **{name: "torch" for name in HF_FORMATS}}
EXTENSIONS = {".safetensors": "canonical", ".pt": "torch", ".pth": "torch", ".bin": "nn-transformer",
              ".ckpt": "torch", ".weights.h5": "keras", ".h5": "keras"}  # .ckpt: a PyTorch Lightning checkpoint
# What the first bytes say: the container, which may hold more than one of our formats.
CONTENT_FORMATS = {"safetensors": ("canonical",), "zip": ("torch", "nn-transformer"),
                   "pickle": ("torch", "nn-transformer"), "hdf5": ("keras",)}

OnTensor = Callable[[str, int], None]  # (canonical name, bytes) after each tensor is read or written

# A checkpoint read through a user's layout file (`--layout FILE.toml`, `layouts.user`): the format passed to `load`
# is LAYOUT_PREFIX + the file's path; the loaded format is named for the container, which says where it runs.
LAYOUT_PREFIX = "layout:"
LAYOUT_FORMATS = {"zip": "torch-layout", "pickle": "torch-layout", "safetensors": "safetensors-layout",
                  "hdf5": "keras-layout"}
FRAMEWORK.update({"torch-layout": "torch", "safetensors-layout": "numpy", "keras-layout": "keras"})
# KerasHub models (`layouts.kerashub_preset`): a preset directory, or a bare .weights.h5 with --from kerashub-gpt2 ...
KERASHUB_DIRS = KERASHUB_PRESETS  # preset directories
KERASHUB_FORMATS = ("kerashub", *KERASHUB_LAYOUTS)  # and keras.io's seq2seq model, a bare .weights.h5
FORMATS += KERASHUB_FORMATS
FRAMEWORK.update({name: "keras" for name in KERASHUB_FORMATS})
CONTENT_FORMATS["hdf5"] += KERASHUB_FORMATS[1:]


@dataclass
class Loaded:
    """A checkpoint read into canonical form."""

    path: Path
    format: str
    config: rn.TransformerConfig
    weights: dict[str, np.ndarray]
    notes: list[str] = field(default_factory=list)  # what was read from where, worth telling the user
    dropped: list[str] = field(default_factory=list)  # nonzero tensors left out because --allow-drop named them
    origin: str | None = None  # the external family the weights came from (hf-phi3, kerashub-llama), when known

    def __post_init__(self) -> None:
        if self.format in HF_LAYOUTS or self.format in KERASHUB_LAYOUTS:
            self.origin = self.format
        elif self.origin not in (*HF_LAYOUTS, *KERASHUB_LAYOUTS):
            self.origin = None  # a value this version does not know is not used

    @property
    def framework(self) -> str:
        return FRAMEWORK[self.format]

    @property
    def nbytes(self) -> int:
        return sum(int(v.nbytes) for v in self.weights.values())


def extension_format(path: str | os.PathLike) -> str | None:
    name = Path(path).name.lower()
    for ext in sorted(EXTENSIONS, key=len, reverse=True):
        if name.endswith(ext):
            return EXTENSIONS[ext]
    return None


def _extension(path: str | os.PathLike) -> str:
    name = Path(path).name.lower()
    return next((ext for ext in sorted(EXTENSIONS, key=len, reverse=True) if name.endswith(ext)), "")


def check_input(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.exists():
        raise UsageError(f"no such file: {path}")
    if path.is_dir():
        raise UsageError(f"{path} is a directory, expected a checkpoint file")
    if path.stat().st_size == 0:
        raise UsageError(f"{path} is empty (0 bytes)")
    return path


def detect_format(path: str | os.PathLike, declared: str | None = None) -> str:
    """The format of an existing file, from its content and extension (`declared`, the user's --from, wins over
    the extension but not over content that plainly says otherwise)."""
    if Path(path).is_dir():
        return _directory_format(Path(path), declared)
    path = check_input(path)
    content = sniff(path)
    by_ext = extension_format(path)
    if declared is not None:
        if declared not in FORMATS:
            raise UsageError(f"unknown format {declared!r}; choose one of {', '.join(FORMATS)}")
        if content is not None and declared not in CONTENT_FORMATS[content]:
            raise UsageError(f"{path} is a {content} file, which cannot hold the {declared} format "
                             f"(it could be: {', '.join(CONTENT_FORMATS[content])})")
        return declared
    if content is None:
        if path.name.lower().endswith(".keras"):
            raise UsageError(f"{path}: whole-model .keras archives are not supported; save the weights with "
                             "model.save_weights('NAME.weights.h5') and convert that")
        if by_ext is not None:  # let that format's reader say precisely what is wrong
            return by_ext
        raise UsageError(f"{path} is not a checkpoint this tool knows: its first bytes match no supported format "
                         "(safetensors, PyTorch zip or pickle, HDF5) and its extension names none "
                         f"({', '.join(EXTENSIONS)})")
    if content == "zip" and path.name.lower().endswith(".keras"):
        raise UsageError(f"{path}: whole-model .keras archives are not supported; save the weights with "
                         "model.save_weights('NAME.weights.h5') and convert that")
    if by_ext is not None and by_ext not in CONTENT_FORMATS[content]:
        raise UsageError(f"{path} has a {by_ext} ({_extension(path)}) extension but its content is {content}; "
                         f"pass --from {CONTENT_FORMATS[content][0]} to read it anyway")
    if content in ("zip", "pickle"):
        return by_ext if by_ext in CONTENT_FORMATS[content] else "torch"  # refined after loading
    return CONTENT_FORMATS[content][0]


def load(path: str | os.PathLike, fmt: str | None = None, fields: Mapping[str, Any] | None = None,
         on_tensor: OnTensor | None = None, allow_drop: Sequence[str] | None = None, lazy: bool = False) -> Loaded:
    """Read any supported checkpoint into canonical weights.

    `fields` (the CLI's --config/--set) override the stored config, or supply what a file without one cannot tell;
    the weights are validated against the result. `allow_drop` names the float tensors with nonzero values that a
    table's `ignore` entry may leave out (a key, or a pattern with `{i}`); any other is refused.

    `lazy=True` (for streaming conversions): a canonical `.safetensors` file, a Hugging Face directory of
    safetensors, a Keras `.weights.h5` and a KerasHub preset give `LazyArray`s in their stored dtype (bfloat16 kept),
    each read when asked; `on_tensor` then reports each read (safetensors). A PyTorch pickle or zip and a file read
    through a layout file are read whole, as without it.
    """
    fields = dict(fields or {})
    path = Path(path)
    drops = Drops(tuple(allow_drop or ()))
    loaded = _load(path, fmt, fields, on_tensor, drops, lazy)
    from transformer_parity.io import limits
    limits.check_positions(loaded.config, str(path), "--set/--config" if "max_len" in fields else "")
    loaded.dropped = list(drops.dropped)
    loaded.notes += drops.notes
    loaded.notes += [f"--allow-drop {name}: no tensor of that name was dropped from {path.name}"
                     for name in drops.unused()]
    return loaded


def _load(path: Path, fmt: str | None, fields: dict[str, Any], on_tensor: OnTensor | None, drops: Drops,
          lazy: bool = False) -> Loaded:
    if fmt is not None and fmt.startswith(LAYOUT_PREFIX):
        return _load_with_layout(path, fmt[len(LAYOUT_PREFIX):], fields, drops)
    fmt = detect_format(path, fmt)
    try:
        if fmt in ("torch", "nn-transformer"):
            with deferred_signals():  # an interrupt inside PyTorch's import aborts the process with a C++ trace
                import torch_impl.checkpoints  # noqa: F401
        if fmt in KERASHUB_FORMATS:
            return _load_kerashub(path, fmt, fields, drops, lazy)
        if fmt in HF_FORMATS:
            return _load_hf(path, fmt, fields, on_tensor, drops, lazy)
        if fmt == "canonical":
            return _load_canonical(path, fields, on_tensor, lazy)
        if fmt in ("torch", "nn-transformer"):
            return _load_torch(path, fields)
        return _load_keras(path, fields, lazy)
    except ImportError as exc:
        raise UsageError(f"reading {path} ({fmt}) needs {exc.name}, which is not installed") from None
    except (KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:  # a reader tripped on the content
        detail = f"entry {exc.args[0]!r} is missing" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise UsageError(f"{path} is not a readable {fmt} checkpoint: {detail}") from exc


def _load_with_layout(path: Path, layout: str, fields: Mapping[str, Any], drops: Drops) -> Loaded:
    """A state dict, safetensors or `.weights.h5` file described by a user's layout file (`layouts.user`)."""
    from transformer_parity.layouts import user

    path = check_input(path)
    content = sniff(path)
    if content not in LAYOUT_FORMATS:
        raise UsageError(f"{path}: a layout file describes a PyTorch state dict, a .safetensors or a .weights.h5 "
                         "file; this one's first bytes match none of them")
    try:
        config, weights, notes = user.import_with_layout(path, layout, fields, drops)
    except ImportError as exc:
        raise UsageError(f"reading {path} needs {exc.name}, which is not installed") from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:  # a tensor whose shape the layout cannot take
        raise UsageError(f"{path} does not fit the layout {layout}: {type(exc).__name__}: {exc}") from exc
    return Loaded(path, LAYOUT_FORMATS[content], config, weights, notes)


def _load_kerashub(path: Path, fmt: str, fields: Mapping[str, Any], drops: Drops, lazy: bool = False) -> Loaded:
    """A KerasHub preset directory, or a bare .weights.h5 of a KerasHub backbone (--from kerashub-gpt2 ...)."""
    from transformer_parity.layouts import kerashub_preset as kh

    if path.is_dir():
        config, weights, notes, family = kh.load_preset(path, fmt, fields, drops, lazy)
    else:
        config, weights, notes, family = kh.load_weights_file(path, fmt, fields, drops, lazy)
    return Loaded(path, family, config, weights, notes)


def _config_from_fields(path: Path, fields: Mapping[str, Any], names: Sequence[str]) -> rn.TransformerConfig:
    if not fields:
        raise missing_config(path, names)
    return rn.TransformerConfig.from_dict(dict(fields))


# The first component of every canonical name (and of the twins' own names, which follow them)
CANONICAL_TOPS = {"encoder", "decoder", "src_embed", "tgt_embed", "src_pos", "tgt_pos", "src_embed_norm",
                  "tgt_embed_norm", "src_type", "output", "head", "pooler"}
KERASHUB_LAYERS = ("reversible_embedding", "token_and_position_embedding", "position_embedding", "token_embedding",
                   "transformer_layer", "transformer_encoder", "transformer_decoder")
HF_PREFIXES = ("transformer.", "bert.", "model.", "h.", "encoder.layer.", "embeddings.", "lm_head.", "cls.")


def missing_config(path: Path, names: Sequence[str]) -> UsageError:
    """A checkpoint that stores no config, read without --config/--set: one line with the fix that fits what it holds
    (`names`: its tensor or dataset names). Only a file of this tool's own names needs the config's fields; a Hugging
    Face or KerasHub weights file needs its directory (or --from), anything else a layout file."""
    head = f"{path} carries no config"
    sibling = path.parent / "config.json"
    if sibling.is_file():
        from transformer_parity.layouts import hf_dir, kerashub_preset

        if kerashub_preset.is_preset(path.parent):
            return UsageError(f"{head}: it is the weights file of the KerasHub preset {path.parent}; give the preset "
                              "directory, whose config.json is the config")
        try:
            model_type = hf_dir.read_config(path.parent).get("model_type")
        except (OSError, ValueError):
            model_type = None
        if model_type:
            return UsageError(f"{head}: it is the weights file of the Hugging Face model directory {path.parent} "
                              f"(model_type {model_type!r}); give the directory, whose config.json is the config")
    tops = {name.replace("/", ".").split(".")[0] for name in names}
    example = sorted(names)[0] if names else ""
    if names and tops <= CANONICAL_TOPS:
        return UsageError(f"{head}; give one with --config FILE.json (or --set FIELD=VALUE ...)")
    if any(layer in name for name in names for layer in KERASHUB_LAYERS):
        return UsageError(f"{head}, and its weights are a KerasHub model's ({example!r}, ...): --from kerashub-gpt2, "
                          "kerashub-bert or kerashub-seq2seq reads the config off them (or give the preset directory)")
    if any(name.startswith(HF_PREFIXES) for name in names):
        return UsageError(f"{head}, and its names are a Hugging Face model's ({example!r}, ...): give the model's "
                          "directory, with its config.json")
    return UsageError(f"{head}, and its names ({example!r}, ...) are not this tool's: a model of your own ports with a "
                      f"layout file: transformer-parity layout --scaffold {path.name} > layout.toml, then --layout "
                      "layout.toml")


def _load_canonical(path: Path, fields: Mapping[str, Any], on_tensor: OnTensor | None, lazy: bool = False
                    ) -> Loaded:
    from transformer_parity.io.safetensors_io import read_canonical

    stored, tensors, metadata = read_canonical(path, on_tensor, lazy)
    config = (stored.replace(**fields) if stored is not None and fields
              else stored or _config_from_fields(path, fields, list(tensors)))
    from transformer_parity.io import limits
    limits.check_config_against_file(config, len(tensors), str(path))  # before listing the config's parameters
    try:
        rn.validate_weights(config, tensors)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return Loaded(path, "canonical", config, tensors, [] if lazy else _widened_notes([path]),
                  origin=metadata.get("origin"))


def _widened_notes(files) -> list[str]:
    """bfloat16 / float16 safetensors tensors were read as float32: say so (`safetensors_io.widened_note`)."""
    from transformer_parity.io.safetensors_io import widened_note

    note = widened_note(files)
    return [] if note is None else [note]


def _load_torch(path: Path, fields: Mapping[str, Any]) -> Loaded:
    from torch_impl import checkpoints as tc

    from transformer_parity.layouts import nn_transformer as nn

    obj = tc.read_torch_file(path)
    if tc.is_project_file(obj):
        config, weights = tc.load_pt(obj, path, fields)
        return Loaded(path, "torch", config, weights, origin=obj.get("origin"))
    hparams, lightning = tc.lightning_parts(obj, path) if tc.is_lightning_checkpoint(obj) else (None, None)
    state, wrapper = tc.unwrap_state_dict(obj, path)
    if nn.looks_like_nn_transformer(state):
        config, weights, notes = nn.import_nn_transformer(state, path, fields, stored=nn.stored_nn_config(state),
                                                          consume=True, hparams=hparams)
        if wrapper:
            notes.insert(0, lightning or f"read the state dict under key {wrapper!r}")
        return Loaded(path, "nn-transformer", config, weights, notes)
    if tc.looks_like_torch_impl_state(state):
        config = _config_from_fields(path, fields, list(state))
        return Loaded(path, "torch", config, tc.load_torch_impl_state(state, path, config))
    raise UsageError(f"{path} is a PyTorch file but neither a transformer-parity checkpoint, a torch_impl state "
                     "dict, nor a model built around torch.nn.Transformer (no key ending in "
                     "'layers.0.self_attn.in_proj_weight'); a model of your own ports with a layout file: "
                     f"transformer-parity layout --scaffold {path.name} > layout.toml, then --layout layout.toml")


def _directory_format(path: Path, declared: str | None) -> str:
    """A directory is read as a Hugging Face model directory (`hf`, or the family `declared` names), or as a
    KerasHub preset (`kerashub`) when its config.json is a serialized KerasHub object."""
    if declared in KERASHUB_DIRS or (declared is None and (path / "config.json").is_file()
                                        and _kerashub_preset(path)):
        return declared or "kerashub"
    if declared is not None and declared not in HF_FORMATS:
        raise UsageError(f"{path} is a directory, which cannot hold the {declared} format (a directory is read as a "
                         f"Hugging Face model: {', '.join(HF_FORMATS)})")
    if not (path / "config.json").is_file():
        raise UsageError(f"{path} is a directory without config.json; expected a Hugging Face model directory "
                         "(config.json plus model.safetensors, sharded safetensors or pytorch_model.bin) or a "
                         "checkpoint file")
    return declared or "hf"


def _load_hf(path: Path, fmt: str, fields: Mapping[str, Any], on_tensor: OnTensor | None, drops: Drops,
             lazy: bool = False) -> Loaded:
    from transformer_parity.layouts import hf, hf_dir

    config, weights, notes, family = hf.load_dir(path, fmt, fields, on_tensor, drops, lazy)
    read = [f for f in hf_dir.weight_files(path) if f.suffix == ".safetensors"]  # the files read, not every one there
    return Loaded(path, family, config, weights, notes + ([] if lazy else _widened_notes(read)))


def _kerashub_preset(path: Path) -> bool:
    from transformer_parity.layouts import kerashub_preset

    return kerashub_preset.is_preset(path)


def check_source(path: str | os.PathLike) -> Path:
    """`check_input` for a file, or a directory that holds a Hugging Face model's config.json."""
    if Path(path).is_dir():
        _directory_format(Path(path), None)
        return Path(path)
    return check_input(path)


def source_size(path: Path) -> int:
    """Bytes to read: a file's size, or a model directory's weight files."""
    if path.is_dir():
        from transformer_parity.layouts import hf_dir
        return hf_dir.nbytes(path)
    return path.stat().st_size


def check_destination(path: str | os.PathLike, fmt: str, force: bool) -> Path:
    """`check_output` for a file format; for a Hugging Face format, a directory to create (or, with --force,
    a model directory to replace)."""
    if fmt in HF_FORMATS or fmt in KERASHUB_DIRS:
        from transformer_parity.io import outputs
        return outputs.check_output_dir(path, force, dir_kind(fmt))
    return check_output(path, force)


def dir_kind(fmt: str):
    """The `outputs.DirKind` of a directory format: what `--force` may replace and what it keeps."""
    if fmt in KERASHUB_DIRS:
        from transformer_parity.layouts.kerashub_preset import PRESET_DIR
        return PRESET_DIR
    from transformer_parity.layouts.hf_dir import MODEL_DIR
    return MODEL_DIR


def _load_keras(path: Path, fields: Mapping[str, Any], lazy: bool = False) -> Loaded:
    from tf_impl import checkpoints as kc

    try:
        config, weights = kc.load_weights_h5(path, fields, lazy)
    except kc.NoStoredConfig as exc:
        raise missing_config(path, exc.names) from None
    import h5py

    with h5py.File(path, "r") as f:
        origin = f.attrs.get(kc.ORIGIN_ATTR)
    return Loaded(path, "keras", config, weights, origin=origin.decode() if isinstance(origin, bytes) else origin)


# --- writing ------------------------------------------------------------------------------------------------------

def output_format(path: str | os.PathLike, declared: str | None = None) -> str:
    """The format to write: `declared` (--to), else the extension; they must not contradict each other."""
    by_ext = extension_format(path)
    if declared is not None:
        if declared not in FORMATS:
            raise UsageError(f"unknown format {declared!r}; choose one of {', '.join(FORMATS)}")
        if declared in HF_FORMATS or declared in KERASHUB_DIRS:
            if by_ext is not None:
                raise UsageError(f"{path} has a {by_ext} extension, but --to {declared} writes a directory; give a "
                                 "directory name")
            return declared
        if declared == "keras" and not str(path).endswith(".weights.h5"):
            raise UsageError(f"{path}: Keras weights files must end in .weights.h5 (keras.Model.load_weights "
                             "requires it)")
        if by_ext is not None and FRAMEWORK[by_ext] != FRAMEWORK[declared]:
            raise UsageError(f"{path} has a {by_ext} extension, but --to {declared} was asked for")
        return declared
    if by_ext is None:
        if str(path).lower().endswith(".keras"):
            raise UsageError(f"{path}: whole-model .keras archives are not supported; write NAME.weights.h5")
        raise UsageError(f"cannot tell the output format from {Path(path).name!r}; use an extension "
                         f"({', '.join(EXTENSIONS)}) or --to FORMAT (--to hf for a Hugging Face model directory)")
    if by_ext == "keras" and not str(path).endswith(".weights.h5"):
        raise UsageError(f"{path}: Keras weights files must end in .weights.h5 (keras.Model.load_weights requires it)")
    return by_ext


def save(path: str | os.PathLike, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray],
         fmt: str | None = None, force: bool = False, on_tensor: OnTensor | None = None,
         consume: bool = False, notes: list[str] | None = None, max_shard_size: int | None = None,
         record=None, origin: str | None = None) -> tuple[Path, str]:
    """Write canonical weights as `fmt` (default: from the extension), atomically; returns `(path, format)`.
    `max_shard_size` (bytes) splits a Hugging Face directory's weights into shards (default 5 GB). `origin` (the
    external family the weights came from) is kept in a canonical, Keras or .pt file. `record` (a
    `layouts.approximations.Record`, the approximations accepted to write `config`) goes into a KerasHub preset's
    metadata.json or a Hugging Face directory's config.json.

    `consume=True` lets the writer delete each entry of `weights` (a dict) once converted, so a conversion holds the
    checkpoint about once; the dict is left empty or partly emptied. `notes` collects what the user should hear
    (stale temporary files removed, files kept beside a replaced model); without it they go to stderr.
    """
    path = Path(path)
    fmt = output_format(path, fmt)
    if fmt in KERASHUB_FORMATS:
        return _save_kerashub(path, config, weights, fmt, force, notes, on_tensor, record)
    if fmt in HF_FORMATS:
        return _save_hf(path, config, weights, fmt, force, on_tensor, consume, notes, max_shard_size, record)
    check_output(path, force)
    rn.validate_weights(config, weights)
    try:
        with deferred_signals():  # import the writer's framework before any temporary file exists
            if fmt == "canonical":
                from transformer_parity.io import safetensors_io as writer
            elif fmt in ("torch", "nn-transformer"):
                from torch_impl import checkpoints as writer
            else:
                from tf_impl import checkpoints as writer
        with atomic_path(path, force, notes) as tmp:
            if fmt == "canonical":
                writer.write_canonical(tmp, config, weights, on_tensor, consume, origin=origin)
            elif fmt == "torch":
                writer.save_pt(tmp, config, weights, consume, origin=origin)
            elif fmt == "nn-transformer":
                from transformer_parity.layouts import nn_transformer
                nn_transformer.save_nn_transformer(tmp, config, weights, consume)
            else:
                writer.save_weights_h5(tmp, config, weights, on_tensor, consume, origin=origin)
    except ImportError as exc:
        raise UsageError(f"writing {fmt} needs {exc.name}, which is not installed") from None
    return path, fmt


def _save_kerashub(path: Path, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], fmt: str,
                   force: bool, notes: list[str] | None, on_tensor: OnTensor | None = None, record=None
                   ) -> tuple[Path, str]:
    """A KerasHub preset directory (`from_preset(path)` loads it), built beside `path` and renamed into place; each
    tensor is made from `weights` as it is written, so they are left as they are."""
    from transformer_parity.layouts import kerashub_preset

    path = check_destination(path, fmt, force)
    if fmt not in KERASHUB_DIRS:  # a bare .weights.h5
        return path, kerashub_preset.save_weights_file(path, config, weights, fmt, force, notes=notes)
    return path, kerashub_preset.save_preset(path, config, weights, fmt, force, notes=notes, on_tensor=on_tensor,
                                             record=record)


def _save_hf(path: Path, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], fmt: str, force: bool,
             on_tensor: OnTensor | None, consume: bool, notes: list[str] | None, max_shard_size: int | None = None,
             record=None) -> tuple[Path, str]:
    """A Hugging Face model directory, built beside `path` and renamed into place (see `outputs.atomic_dir`)."""
    from transformer_parity.layouts import hf, hf_dir

    path = check_destination(path, fmt, force)
    family = hf.save_dir(path, config, weights if consume else dict(weights), fmt, force, on_tensor, consume=True,
                         notes=notes, max_shard_size=max_shard_size or hf_dir.MAX_SHARD_SIZE, record=record)
    return path, family
