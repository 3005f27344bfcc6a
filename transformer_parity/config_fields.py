"""Config fields from the command line: `--config FILE.json` and `--set FIELD=VALUE`, typed like the fields of
`TransformerConfig`. Every command that builds a config reads its options here (init, convert, verify, layout,
`bench model --set`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from .errors import UsageError


def parse_fields(config_file: str | None, sets: Sequence[str]) -> dict[str, Any]:
    """--config FILE.json and --set FIELD=VALUE pairs -> config fields (values typed like the field's default)."""
    import reference_numpy as rn

    defaults = rn.TransformerConfig().to_dict()
    fields: dict[str, Any] = {}
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise UsageError(f"--config {config_file}: no such file" if not path.exists()
                             else f"--config {config_file} is not a file")
        from transformer_parity.io import limits

        try:
            data = limits.read_json_object(path, "a config")
        except ValueError as exc:
            raise UsageError(f"--config {exc}") from None
        problems = [rn.config.field_type_problem(name, value) for name, value in data.items() if name in defaults]
        if any(problems):
            raise UsageError(f"--config {config_file}: {next(p for p in problems if p)}")
        fields.update(data)
    for item in sets:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise UsageError(f"--set expects FIELD=VALUE, received {item!r}")
        if name not in defaults:
            raise UsageError(f"--set {item}: unknown config field {name!r}; fields are {', '.join(defaults)}")
        fields[name] = _typed(name, text.strip(), defaults[name])
    unknown = sorted(set(fields) - set(defaults))
    if unknown:
        raise UsageError(f"unknown config field(s) {unknown}; fields are {', '.join(defaults)}")
    return fields


_OPTIONAL_EXAMPLES = {"bool": False, "int": 0, "float": 0.0, "str": ""}


def _field_kinds(name: str) -> list[str]:
    """The types a config field's annotation names, in order: `int | None` -> ["int", "None"]."""
    import reference_numpy as rn

    annotation = next(f.type for f in dataclasses.fields(rn.TransformerConfig) if f.name == name)
    return str(annotation).replace(" ", "").split("|")


def _typed(name: str, text: str, default: Any) -> Any:
    kinds = _field_kinds(name)
    if "None" in kinds and text.lower() in ("none", "null"):  # an optional field: `output_bias`, `pad_id`
        return None
    if default is None:  # typed like the first of its annotation's other kinds
        known = [k for k in kinds if k in _OPTIONAL_EXAMPLES]
        return _typed(name, text, _OPTIONAL_EXAMPLES[known[0]] if known else "")
    if isinstance(default, str) and "float" in kinds:  # `attention_scale`: a name, or a number
        try:
            return float(text)
        except ValueError:
            return text
    if isinstance(default, bool):
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise UsageError(f"--set {name}={text}: expected true or false")
    try:
        return type(default)(text) if isinstance(default, (int, float)) else text
    except ValueError:
        expected = type(default).__name__ + (" or none" if "None" in kinds else "")
        raise UsageError(f"--set {name}={text}: expected {expected}") from None
