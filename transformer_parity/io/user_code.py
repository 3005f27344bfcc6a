"""A user's own Python file, `FILE.py:NAME`: parsed, imported under a module name of its own (importlib, no package
needed, its folder on sys.path only while it is imported) and its NAME returned, checked callable. The source a
scaffold is probed against (`layouts.probe`) and the one `verify --source` judges by (`verify.source_file`)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from transformer_parity.errors import UsageError


def one_line(exc: BaseException) -> str:
    """An exception's first line (its type's name if it has no text)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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


def load_callable(spec: str) -> Callable[..., Any]:
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
        raise UsageError(f"--source {spec}: importing {path} raised {type(exc).__name__}: {one_line(exc)}") from None
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                         and getattr(v, "__module__", None) == module_name)
        raise UsageError(f"--source {spec}: {path} defines no {name!r} (its functions and classes: "
                         f"{', '.join(defined[:8]) or 'none'})")
    if not callable(fn):
        raise UsageError(f"--source {spec}: {name} is a {type(fn).__name__}, not callable")
    return fn
