"""Settings read from a checkpoint's own hyper-parameters (a PyTorch Lightning `.ckpt`'s `hyper_parameters`), only
where something names the config field explicitly.

Two ways, both explicit: a layout file's `[config]` value `"hparam:KEY"` (a dotted path into the nested dict, e.g.
`num_heads = "hparam:model_kwargs.num_heads"`) reads that key; and an importer without a layout file (`nn-transformer`)
reads a field from a key spelled exactly as the field (`num_heads`), found at one place in the dict (or at several
with one value). A key with another name (`nhead`) is never taken for a field.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

PREFIX = "hparam:"


class Unstated(ValueError):
    """A checkpoint that does not tell config fields its model needs (`missing`): the user gives them, or a source
    settles them by probing (`verify --source`, `convert --source`)."""

    def __init__(self, message: str, missing: list[str]):
        super().__init__(message)
        self.missing = list(missing)


def is_reference(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def lookup(hparams: Mapping[str, Any] | None, reference: str, where: str) -> Any:
    """The value at `hparam:a.b.c`; `ValueError` naming the missing part (and the keys that exist there)."""
    path = reference[len(PREFIX):]
    if hparams is None:
        raise ValueError(f"{where} reads {reference!r}, but the checkpoint carries no hyper_parameters (a PyTorch "
                         "Lightning .ckpt does)")
    node: Any = hparams
    done = []
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            keys = sorted(map(str, node))[:12] if isinstance(node, Mapping) else []
            at = "hyper_parameters" + "".join(f"[{k!r}]" for k in done)
            raise ValueError(f"{where} reads {reference!r}, but {at} has no key {part!r}"
                             + (f" (keys: {', '.join(keys)})" if keys else f" (it is a {type(node).__name__})"))
        node = node[part]
        done.append(part)
    return node


def _walk(node: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in node.items():
        path = f"{prefix}{key}"
        yield path, value
        if isinstance(value, Mapping):
            yield from _walk(value, path + ".")


def by_field_name(hparams: Mapping[str, Any] | None, names) -> tuple[dict[str, tuple[Any, str]], list[str]]:
    """`({field: (value, dotted key)}, ambiguities)`: each of `names` found as a key spelled exactly so, at one
    place (or at several with one value); a name found with different values is listed in `ambiguities`."""
    found: dict[str, list[tuple[Any, str]]] = {}
    for path, value in _walk(hparams or {}):
        name = path.rsplit(".", 1)[-1]
        if name in names and not isinstance(value, Mapping):
            found.setdefault(name, []).append((value, path))
    values, ambiguous = {}, []
    for name, hits in found.items():
        if all(v == hits[0][0] and type(v) is type(hits[0][0]) for v, _ in hits):
            values[name] = hits[0]
        else:
            ambiguous.append(f"{name} ({', '.join(f'{p}={v!r}' for v, p in hits)})")
    return values, ambiguous
