"""`--source FILE.py:NAME`: a user's own model code as the source of truth (`from_file`), imported from its file
under a module name of its own, called once on verify's inputs (the contract: `source_contract`)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from transformer_parity.errors import UsageError
from .source_contract import Batch, Source, SourceRun, _one_line


def parse_spec(spec: str) -> tuple[Path, str]:
    """`FILE.py:NAME` -> (path, name), checked: the file exists and NAME is an identifier."""
    path_text, sep, name = str(spec).rpartition(":")
    if not sep or not path_text or not name:
        raise UsageError(f"--source needs FILE.py:NAME (the function to call), received {spec!r}")
    if not name.isidentifier():
        raise UsageError(f"--source {spec}: {name!r} is not a Python name")
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"--source {spec}: no such file: {path}")
    return path, name


@contextlib.contextmanager
def _on_sys_path(folder: Path):
    """The source file's folder first on sys.path while it is imported (its own helper modules), then removed."""
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def load_callable(spec: str) -> Callable[[Batch], Any]:
    """Import FILE.py under a name of its own (importlib, no package needed) and return its NAME, callable."""
    path, name = parse_spec(spec)
    resolved = path.resolve()
    module_name = "_transformer_parity_source_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"--source {spec}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up there
    try:
        with _on_sys_path(resolved.parent):
            module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(module_name, None)
        raise UsageError(f"--source {spec}: importing {path} raised {type(exc).__name__}: {_one_line(exc)}") from None
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                         and getattr(v, "__module__", None) == module_name)
        raise UsageError(f"--source {spec}: {path} defines no {name!r} (its functions and classes: "
                         f"{', '.join(defined[:8]) or 'none'})")
    if not callable(fn):
        raise UsageError(f"--source {spec}: {name} is a {type(fn).__name__}, not callable")
    return fn


def from_file(spec: str) -> Source:
    """`--source FILE.py:NAME`: the user's function, called once on verify's inputs."""
    fn = load_callable(spec)

    def run(batch: Batch) -> list[SourceRun]:
        try:
            raw = fn({k: v.copy() for k, v in batch.items()})  # a source that writes into its inputs harms nothing
        except (Exception, SystemExit) as exc:
            raise UsageError(f"--source {spec}: calling it on batch {_shapes(batch)} raised {type(exc).__name__}: "
                             f"{_one_line(exc)}") from None
        return [SourceRun("source", raw)]

    return Source(spec, "file", run)


def _shapes(batch: Mapping[str, np.ndarray]) -> str:
    return "{" + ", ".join(f"{k}: {tuple(v.shape)}" for k, v in batch.items()) + "}"
