"""Hugging Face model directories <-> canonical weights, through the families' records.

Each family module (`layouts.HF_LAYOUTS`) exports its record, `FAMILY` (`layouts.family.HFFamily`: its name, model
type and classes, its config both ways, its table and where the base model sits); this module reads and writes the
directory (`hf_dir`) and applies the table (`table.import_state` / `export_state`). Neither imports transformers.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import numpy as np

import reference_numpy as rn
from reference_numpy.mapping import regex

from . import hf_dir, hf_tasks
from .table import export_state, import_state


def architecture(hf: Mapping[str, Any], model_type: str, supported: tuple[str, ...], has_head: bool) -> str:
    """The supported class `config.json` names; without `architectures`, the head model if its keys are there."""
    archs = hf.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"config.json architectures must be a list of class names, received {archs!r}")
    known = [a for a in archs if a in supported]
    if known:
        return known[0]
    if archs:
        raise ValueError(f"config.json architectures={archs} is not supported for model_type {model_type!r}; "
                         f"supported: {', '.join(supported)}")
    return supported[0] if has_head or len(supported) == 1 else supported[1]


def refuse(hf: Mapping[str, Any], supported: Mapping[str, Any]) -> None:
    """Fail on a config.json field set to a value this layout cannot compute (absent fields take the default); a
    value of another type (`"false"`, `0` for a boolean) is refused as well."""
    for key, value in supported.items():
        if key in hf and hf[key] is not None and (type(hf[key]) is not type(value) or hf[key] != value):
            raise ValueError(f"config.json {key}={hf[key]!r} is not supported (only {value!r})")


# transformers' activation names (its ACT2FN) -> ours, and the name each of ours is written back as.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "silu": "silu", "swish": "silu"}
TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def activation(hf: Mapping[str, Any], key: str, default: str) -> str:
    """Our name for the activation config.json names under `key` (absent: `default`)."""
    name = hf.get(key, default)
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ValueError(f"config.json {key}={name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


# Strict readers of config.json fields (also KerasHub's config.json): JSON types mean what they say. An integer is
# an int (not 3.7, true, "0" or 1e999, which JSON reads as inf), a boolean a bool (not "false", which is truthy), a
# number finite; each refusal names the field and the value.
REQUIRED = object()


def integer(hf: Mapping[str, Any], key: str, default: Any = REQUIRED, where: str = "config.json") -> int:
    """A non-negative integer field (`default` when absent; required when no default is given)."""
    value = _get(hf, key, default, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} {key} must be a non-negative integer, received {value!r}")
    return value


def optional_integer(hf: Mapping[str, Any], key: str, where: str = "config.json") -> int | None:
    """`integer`, or None when the field is absent or null."""
    return None if hf.get(key) is None else integer(hf, key, where=where)


def boolean(hf: Mapping[str, Any], key: str, default: bool, where: str = "config.json") -> bool:
    """A true/false field (`default` when absent or null)."""
    value = hf.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{where} {key} must be true or false, received {value!r}")
    return value


def number(hf: Mapping[str, Any], key: str, default: float, where: str = "config.json") -> float:
    """A finite number (`default` when absent)."""
    value = hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} {key} must be a finite number, received {value!r}")
    return float(value)


def token_id(hf: Mapping[str, Any], key: str, vocab: int, default: Any = None, where: str = "config.json"
             ) -> int | None:
    """A token id field: null, or an integer in `0 .. vocab - 1` (`default` when absent)."""
    value = hf.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise ValueError(f"{where} {key} must be a token id (an integer from 0 to {vocab - 1}, the vocabulary's "
                         f"last) or null, received {value!r}")
    return value


def _get(hf: Mapping[str, Any], key: str, default: Any, where: str) -> Any:
    if key not in hf and default is REQUIRED:
        raise ValueError(f"{where} has no {key}; it is needed to build the model")
    return hf.get(key, default)


def prefix_rule(base_prefix: str, *, lm: str | None = None, bare: str | None = None) -> Callable[..., str]:
    """A family's `prefix` hook, `prefix(arch, keys=None)`: where its base model's weights sit. Reading (`keys`
    given): wherever the saved keys put them, under `base_prefix` or at the top. Writing: under `base_prefix` in the
    class `lm` (the language-model class that wraps the base model), or in every class but the bare model `bare`;
    at the top otherwise."""
    if (lm is None) == (bare is None):
        raise ValueError("prefix_rule takes exactly one of lm= and bare=")

    def prefix(arch: str, keys: Collection[str] | None = None) -> str:
        if keys is not None:
            return base_prefix if any(k.startswith(base_prefix) for k in keys) else ""
        wrapped = arch == lm if lm is not None else arch != bare
        return base_prefix if wrapped else ""

    return prefix


def family_for(hf: Mapping[str, Any], path: str | os.PathLike, declared: str | None = None):
    """The family record for a config.json (`declared`, a family's format name, must agree with its model_type)."""
    from . import hf_families

    model_type = hf.get("model_type")
    families = hf_families()
    found = next((f for f in families if f.model_type == model_type), None)
    if found is None:
        supported = ", ".join(f"{f.model_type} ({', '.join(f.architectures)})" for f in families)
        if model_type is None:  # not a Hugging Face config at all: say what else a directory may be
            from .kerashub_preset import supported_classes
            raise ValueError(f"{path}: config.json has no model_type, so it is not a Hugging Face model directory, "
                             "and it is not a serialized KerasHub object either; supported directories: Hugging "
                             f"Face model types {supported}; KerasHub presets of {supported_classes()}")
        raise ValueError(f"{path}: config.json model_type={model_type!r} is not supported; supported model types: "
                         + supported)
    if declared not in (None, "hf", found.name):
        raise ValueError(f"{path} holds a {model_type} model (format {found.name}), not {declared}")
    return found


def load_dir(path: str | os.PathLike, declared: str | None = None, fields: Mapping[str, Any] | None = None,
             on_tensor=None, drops=None, lazy: bool = False
             ) -> tuple[rn.TransformerConfig, dict[str, np.ndarray], list[str], str]:
    """`(config, canonical weights, notes, format name)` of a model directory. `fields` (--set/--config) override
    the mapped config; the weights are checked against the result; `drops` (`table.Drops`) names the nonzero
    tensors the table's `ignore` entries may leave out. `lazy=True`: the weights are `LazyArray`s in their stored
    dtype, read from the shards when asked."""
    path = Path(path)
    hf = hf_dir.read_config(path)
    family = family_for(hf, path, declared)
    files = hf_dir.weight_files(path)  # fails on a missing shard or no weights before anything is read
    state = hf_dir.read_state(path, on_tensor, lazy)
    try:
        head = hf_tasks.head_named(family, hf)  # a task class (a sequence classifier, ...): its base, then it
        if head is not None:
            config, arch, notes, table = hf_tasks.read(family, head, hf, list(state), token_id)
        else:
            config, arch, notes = family.config_from_hf(hf, list(state))
        if fields:
            config = config.replace(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if head is not None:
        table = hf_tasks.table(family, head, config)
    else:
        table = family.table(config, family.prefix(arch, list(state)))
    renamed = _legacy_norm_names(state)
    if renamed:
        notes.append(f"renamed {renamed} LayerNorm gamma/beta entries to weight/bias (an older transformers' names)")
    dropped = sorted(k for k in state if any(t == "ignore" and regex(e).fullmatch(k) for _, e, t in table))
    origins = {**{name: f"config.json {key}" for name, key in family.config_keys.items()},
               **{name: "--set/--config" for name in fields or {}}}
    skipped: list[str] = []
    weights = import_state(config, state, table, source=str(path), consume=True, drops=drops, origins=origins,
                           lazy=lazy, skipped=skipped)
    notes.insert(0, f"read {arch} ({family.name}) from {', '.join(f.name for f in files)}")
    if skipped:
        notes.append(f"skipped {len(skipped)} buffer(s) the model recomputes, each checked to hold what it "
                     "recomputes: " + ", ".join(skipped[:3]) + (", ..." if len(skipped) > 3 else ""))
    if dropped:
        notes.append(f"left out {len(dropped)} tensor(s) that are not parameters of {arch}: "
                     + ", ".join(dropped[:4]) + (", ..." if len(dropped) > 4 else ""))
    return config, weights, notes, family.name


def _legacy_norm_names(state: dict[str, np.ndarray]) -> int:
    """`...LayerNorm.gamma` / `.beta` (TF-era checkpoints) -> `.weight` / `.bias`, as transformers renames them
    on load. Returns how many were renamed."""
    count = 0
    for key in [k for k in state if k.endswith((".gamma", ".beta"))]:
        new = key[: key.rindex(".")] + (".weight" if key.endswith(".gamma") else ".bias")
        if new not in state:
            state[new] = state.pop(key)
            count += 1
    return count


def family_for_export(config: rn.TransformerConfig, declared: str | None = None):
    """The family record a canonical config is written as: `declared` (a family's format name), or the first that
    can express it."""
    from . import first_exporter

    return first_exporter(_candidates(declared), config, "Hugging Face", _problems(config))


def _candidates(declared: str | None) -> list:
    """The family records `declared` (hf: every one) names."""
    from . import HF_LAYOUTS, hf_family

    names = [n for n in HF_LAYOUTS if declared in (None, "hf", n)]
    if not names:
        raise ValueError(f"unknown Hugging Face format {declared!r}; choose hf or one of {', '.join(HF_LAYOUTS)}")
    return [hf_family(name) for name in names]


def _problems(config: rn.TransformerConfig):
    """How a family is asked whether it writes `config`: with a task head (`hf_tasks`), through its task classes;
    None: its own `export_problems`."""
    return hf_tasks.export_problems if hf_tasks.has_head(config) else None


def export_plan(config: rn.TransformerConfig, declared: str | None = None):
    """The `approximations.Plan` of a model that no family (of `declared`: hf or one family) takes as it is but one
    takes once its approximations are applied; None where one takes it exactly, or none even so."""
    from . import approximations, why_not

    try:
        family_for_export(config, declared)
        return None
    except ValueError:
        pass
    problems = _problems(config)
    return approximations.plan(_candidates(declared), config, lambda family, c: why_not(family, c, problems))


def read_record(path: str | os.PathLike):
    """The approximations accepted when this tool wrote a model directory (`approximations.Record`, in config.json),
    or None: not a model directory, or no record in its config.json."""
    from .approximations import record_of

    path = Path(path)
    if not (path.is_dir() and (path / hf_dir.CONFIG).is_file()):
        return None
    return record_of(hf_dir.read_config(path), str(path / hf_dir.CONFIG))


def known_approximations() -> list[str]:
    """The approximation names the Hugging Face families define."""
    from . import approximations, hf_families

    return approximations.known(hf_families())


def save_dir(path: str | os.PathLike, config: rn.TransformerConfig, weights: dict[str, np.ndarray],
             declared: str | None = None, force: bool = False, on_tensor=None, consume: bool = False,
             notes: list[str] | None = None, max_shard_size: int = hf_dir.MAX_SHARD_SIZE, record=None) -> str:
    """Write canonical weights as a model directory `from_pretrained` loads; returns the format name. Lazily read
    weights (`LazyArray`) are streamed: each external tensor is made and written in turn. `record` (an
    `approximations.Record`) goes into config.json under `approximations.RECORD_KEY` (transformers keeps unknown
    keys as attributes and computes nothing from them)."""
    from .approximations import RECORD_KEY

    family = family_for_export(config, declared)
    if hf_tasks.has_head(config):
        hf, arch, table = hf_tasks.write(family, config)
    else:
        hf, arch = family.config_to_hf(config)
        table = family.table(config, family.prefix(arch))
    if record is not None:
        hf[RECORD_KEY] = record.to_json()
    dtype = rn.weights_dtype(weights)
    hf["dtype"] = str(dtype)  # transformers loads the weights in this dtype
    from transformer_parity.streaming.lazy import is_lazy

    lazy = any(is_lazy(v) for v in weights.values())
    state = export_state(config, weights, table, consume=consume, lazy=lazy)
    hf_dir.write_dir(path, hf, state, force, on_tensor, consume=True, notes=notes, max_shard_size=max_shard_size)
    return family.name
