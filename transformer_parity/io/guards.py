"""What guards a write: the checks a destination must pass before any work is done (`check_output`), SIGINT and
SIGTERM deferred while a write is half done (`deferred_signals`), and the user's umask for the files written."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from pathlib import Path
from typing import Iterator

from ..errors import UsageError


def check_output(path: str | os.PathLike, force: bool) -> Path:
    """Refuse a directory, a missing parent, anything but a regular file (a FIFO, a device, a socket, a symbolic
    link: even with `force`), or an existing file without `force` — before any work is done."""
    path = Path(path)
    kind = special_kind(path)
    if kind == "directory":
        raise UsageError(f"{path} is a directory; give a file name to write")
    if kind is not None:
        raise UsageError(f"{path} is a {kind}; refusing to write to it or replace it (even with --force)")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {path.parent} does not exist")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    return path


def special_kind(path: str | os.PathLike) -> str | None:
    """What is at `path` if it is neither absent nor a regular file: 'directory', 'FIFO (named pipe)', ...; the
    path itself is examined, not what a symbolic link points to."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return f"symbolic link (to {os.readlink(path)})"
    for test, kind in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO (named pipe)"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends (they are delivered then): for steps that must not be cut in
    half, such as creating or publishing a temporary file, or importing a framework (an interrupt inside PyTorch's
    import aborts the process with a C++ trace)."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    except (AttributeError, OSError, ValueError):
        old = None
    try:
        yield
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no way to read it without setting it
    os.umask(mask)
    return mask


def restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def raise_on_sigterm():
    """Turn SIGTERM into KeyboardInterrupt while a file is being written, so the temporary file is cleaned up."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None
