"""Where outputs are written: temporary names a later run recognises, stale ones from killed runs swept away, and
directory outputs (Hugging Face model directories, KerasHub presets) that replace only what this tool wrote.

**Temporary names.** Every temporary file or directory made beside an output `NAME` is called
`.NAME.tp-tmp-<pid>-<random><suffixes>` (a directory being replaced is moved aside as `.NAME.tp-old-<pid>-<random>`),
`NAME` shortened so that the whole fits NAME_MAX. A process killed with SIGKILL cannot remove its own; the next
write to the same output does (`sweep`): only those whose process is gone, or whose pid now belongs to a process
started after they were last modified (the pid was reused), and it says so in a note. A `tp-old` directory is
put back rather than removed: where the output is missing it becomes the output again; where the new output was
already in place, the entries it had to keep (a tokenizer, a README) move into it, and only the previous model's
own files are removed.

**Directory outputs.** Each directory this tool writes holds a manifest, `.transformer-parity.json`, listing the
files it wrote (with their sizes and modification times). `--force` replaces an existing directory only if

- its manifest shows this tool wrote it (the listed files unchanged), or
- it is a model directory of the expected format (`DirKind`) whose every entry is recognised: the format's model
  files (config, weights, shards and their index), and the files that come beside a model which this tool does
  not write (`DirKind.companions`: tokenizer, generation config, README, ...);

anything else is refused with one line naming the entries it does not recognise, before anything moves. The
companions, and in a directory we wrote every file the manifest does not list, are kept: moved into the new
directory, and named in a note. Replacing the directory that holds the current working directory, the input, or
the input's own directory is refused (`check_apart`, `check_output_dir`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..errors import UsageError
from .guards import deferred_signals, raise_on_sigterm, restore_sigterm, special_kind, umask
from .safe_text import names as name_list
from .safe_text import printable

NAME_MAX = 255
TAG = ".tp-"  # what marks a temporary name as ours
_PID_WIDTH = 10  # digits a pid may take (Linux: at most 4194304); names are shortened as if every pid took them
MANIFEST = ".transformer-parity.json"
MANIFEST_FORMAT = "transformer-parity/directory-output"
MAX_MANIFEST = 1 << 20


# --- temporary names and stale ones ---------------------------------------------------------------------------------

def _stem(path: Path, suffix: str) -> str:
    """The part of `path`'s name a temporary name keeps: as much as fits NAME_MAX beside the tag, pid, random part
    (8 characters) and `suffix`."""
    room = NAME_MAX - 1 - len(f"{TAG}tmp-") - _PID_WIDTH - 1 - 8 - len(suffix.encode())
    return path.name.encode()[:max(room, 1)].decode(errors="ignore")


def temp_prefix(path: Path, kind: str = "tmp", suffix: str = "") -> str:
    """`tempfile.mkstemp`/`mkdtemp`'s prefix for a temporary `kind` ("tmp" or "old") beside `path`; with `suffix`
    as the temporary's suffix it names `.NAME.tp-tmp-<pid>-<random><suffix>`."""
    return f".{_stem(path, suffix)}{TAG}{kind}-{os.getpid()}-"


def _pattern(path: Path, suffix: str) -> re.Pattern:
    return re.compile(re.escape(f".{_stem(path, suffix)}{TAG}") + r"(tmp|old)-(\d{1,%d})-[a-z0-9_]{8}" % _PID_WIDTH
                      + re.escape(suffix))


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            return float(next(line.split()[1] for line in f if line.startswith("btime ")))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def process_start(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), from /proc; None where that cannot be read."""
    boot = _boot_time()
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        ticks = int(text[text.rindex(")") + 2:].split()[19])  # field 22, starttime, in clock ticks since boot
    except (OSError, ValueError, IndexError):
        return None
    return None if boot is None else boot + ticks / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    except (OverflowError, ValueError, OSError):
        return False
    return True


def is_stale(pid: int, mtime: float) -> bool:
    """Whether a temporary name made by `pid`, last modified at `mtime`, was left by a process that is gone: none
    runs under that pid, or the one that does started after the file was last touched (2 s of slack for the
    coarse boot time)."""
    if pid == os.getpid() or not _alive(pid):
        return pid != os.getpid()
    started = process_start(pid)
    return started is not None and mtime < started - 2.0


def sweep(path: Path, suffix: str = "") -> list[str]:
    """Remove the stale temporary files and directories beside output `path` (see the module docstring); returns
    notes saying what was removed or put back."""
    path = Path(path)
    pattern = _pattern(path, suffix)
    removed, notes = [], []
    try:
        entries = sorted(os.scandir(path.parent or "."), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISLNK(info.st_mode) or not is_stale(int(match[2]), info.st_mtime):
            continue  # we never make links; a live writer's file is its own
        item = Path(entry.path)
        try:
            if match[1] == "old" and stat.S_ISDIR(info.st_mode):
                notes.append(_recover(item, path))
            elif stat.S_ISDIR(info.st_mode):
                shutil.rmtree(item)
                removed.append(item.name + "/")
            else:
                item.unlink()
                removed.append(item.name)
        except OSError as exc:
            notes.append(f"could not remove {printable(item)} ({exc.strerror}), left by a killed run")
    if removed:
        notes.insert(0, f"removed {len(removed)} temporary file(s) beside {printable(path)} left by runs that were "
                        f"killed: {name_list(removed, 4)}")
    return notes


def _recover(old: Path, path: Path) -> str:
    """A directory moved aside by a replacement that was killed midway: restored, or emptied of what the new
    directory keeps and removed (see `publish_dir`)."""
    if not os.listdir(old):  # made, but nothing moved into it yet
        os.rmdir(old)
        return f"removed {printable(old.name)}, left empty beside {printable(path)} by a run that was killed"
    if not os.path.lexists(path):
        os.rename(old, path)
        return f"restored {printable(path)} from {printable(old.name)}: a run replacing it was killed midway"
    manifest = read_manifest(path)
    replaced = set(manifest.get("replaced", ())) if manifest else None
    if replaced is None:
        return (f"left {printable(old)} in place: it holds the directory a killed run was replacing, and "
                f"{printable(path)} does not say which of its files were kept; move what you need out of it")
    moved = []
    for name in sorted(os.listdir(old)):
        if name not in replaced and not os.path.lexists(path / name):
            os.rename(old / name, path / name)
            moved.append(name)
    shutil.rmtree(old)
    return (f"finished a replacement of {printable(path)} that a killed run left midway" +
            (f" (moved back {name_list(moved, 4)})" if moved else ""))


def tell(notes: list[str] | None, new: list[str]) -> None:
    """Add `new` notes to `notes`, or print them to stderr where the caller keeps none."""
    if notes is not None:
        notes.extend(new)
    else:
        for note in new:
            print(f"note: {note}", file=sys.stderr)


# --- directory outputs ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DirKind:
    """A directory format this tool writes: which entries are a model's own (replaced by a new model), which come
    beside a model and are kept, and how to tell that a config.json is of this format."""

    name: str  # "a Hugging Face model directory"
    config_name: str  # "a Hugging Face config (with a model_type)": what its config.json must be
    model_files: tuple[str, ...]  # regular expressions over entry names
    companions: tuple[str, ...]
    config_ok: Callable[[Path], bool]  # the directory's config.json is this format's

    def is_model_file(self, name: str) -> bool:
        return name == MANIFEST or any(re.fullmatch(p, name) for p in self.model_files)

    def is_companion(self, name: str) -> bool:
        return any(re.fullmatch(p, name) for p in self.companions)


@dataclasses.dataclass
class Existing:
    """What is in a directory `--force` may replace: the previous model's entries and those kept beside it."""

    replaced: list[str]
    kept: list[str]


def read_manifest(path: Path) -> dict | None:
    """The manifest of a directory this tool wrote, or None (absent, too large, or not ours)."""
    file = Path(path) / MANIFEST
    try:
        info = os.lstat(file)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MANIFEST:
            return None
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    if not (isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT and isinstance(data.get("files"), dict)):
        return None
    if not isinstance(data.get("replaced", []), list):
        return None
    return data


def written_settings(path: str | os.PathLike, files: Iterable[str]) -> dict:
    """The settings this tool recorded in a directory's manifest when it wrote it (what the files themselves do not
    say, such as a KerasHub BERT preset's pad id), but only while `files` are still as it wrote them; else {}."""
    path = Path(path)
    manifest = read_manifest(path)
    settings = (manifest or {}).get("settings")
    if not isinstance(settings, dict) or not set(files) <= _ours(path, manifest):
        return {}
    return settings


def _ours(path: Path, manifest: dict | None) -> set[str]:
    """The files the manifest lists that are still as this tool wrote them: regular files (not links) of the
    recorded size and modification time."""
    ours = set()
    for name, record in (manifest or {}).get("files", {}).items():
        if not (isinstance(name, str) and _plain(name) and isinstance(record, dict)):
            continue
        try:
            info = os.lstat(path / name)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and (info.st_size, info.st_mtime_ns) == (record.get("size"),
                                                                              record.get("mtime_ns")):
            ours.add(name)
    return ours


def _plain(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def classify(path: Path, kind: DirKind) -> Existing:
    """Sort an existing directory's entries for `--force` (see the module docstring); `UsageError` naming every
    entry that is neither ours, nor the format's, nor a known companion."""
    manifest = read_manifest(path)
    ours = _ours(path, manifest)
    replaced, kept, unknown = [], [], []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        name = entry.name
        is_dir = entry.is_dir(follow_symlinks=False)
        if name in ours or (not is_dir and kind.is_model_file(name)):  # a link is removed, never what it points to
            replaced.append(name)
        elif kind.is_companion(name) or (manifest is not None and ours):
            kept.append(name)  # beside a model we wrote, whatever the user added is theirs to keep
        else:
            unknown.append(name + ("/" if is_dir else ""))
    if "config.json" in replaced and "config.json" not in ours and not kind.config_ok(path / "config.json"):
        replaced.remove("config.json")
        unknown.insert(0, f"config.json (not {kind.config_name})")
    if unknown:
        raise UsageError(f"{printable(path)} holds what {kind.name} does not: {name_list(unknown)}; --force replaces "
                         "a directory this tool wrote or a model directory whose every file it recognises, never "
                         "other files: remove them, or give a new directory name")
    return Existing(replaced, kept)


def named(path: str | os.PathLike) -> Path:
    """`path`, made absolute where its last component is `.` or `..` (a directory needs a name to be replaced)."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        path = Path(os.path.abspath(path))
    if path.name == "":
        raise UsageError(f"cannot write a model directory as {printable(path)}: give a directory by its name")
    return path


def _inside(inner: str, outer: str) -> bool:
    return inner != outer and os.path.commonpath([inner, outer]) == outer


def check_output_dir(path: str | os.PathLike, force: bool, kind: DirKind) -> Path:
    """Refuse a missing parent, a link, a file, an existing directory without `force`, and with it one that holds
    the working directory or anything `classify` refuses; returns the path to write."""
    path = named(path)
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {printable(path)}: directory {printable(path.parent)} does not exist")
    if path.is_symlink():
        raise UsageError(f"{printable(path)} is a symbolic link; give a new directory name to write the model to")
    if not path.exists():
        return path
    if not path.is_dir():
        raise UsageError(f"{printable(path)} exists and is not a directory; {kind.name} is written as a directory")
    if not force:
        raise UsageError(f"{printable(path)} exists; pass --force to replace it")
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        cwd = None
    real = os.path.realpath(path)
    if cwd is not None and (cwd == real or _inside(cwd, real)):
        raise UsageError(f"cannot replace {printable(path)}: it holds the current directory ({printable(cwd)}); run "
                         "the command from outside it, or give a new directory name")
    classify(path, kind)
    return path


def check_apart(source: str | os.PathLike, output: str | os.PathLike) -> None:
    """Refuse an output that is the input, holds it, or lies inside the input's directory (a model directory):
    replacing it would remove what is being read, or write into the model being read."""
    if not os.path.lexists(output):
        src, out = os.path.realpath(source), os.path.realpath(output)
        if os.path.isdir(src) and _inside(out, src):
            raise UsageError(f"{printable(output)} lies inside the input directory {printable(source)}; write the "
                             "output elsewhere")
        return
    src, out = os.path.realpath(source), os.path.realpath(output)
    if src == out:
        raise UsageError(f"{printable(output)} is the input; write the conversion elsewhere")
    if os.path.isdir(out) and _inside(src, out):
        raise UsageError(f"the input {printable(source)} lies inside {printable(output)}, which the output would "
                         "replace; write the output elsewhere")
    if os.path.isdir(src) and _inside(out, src):
        raise UsageError(f"{printable(output)} lies inside the input directory {printable(source)}; write the "
                         "output elsewhere")


def _write_manifest(tmp: Path, replaced: list[str], kept: list[str], settings: dict | None = None) -> None:
    files = {}
    for entry in sorted(os.scandir(tmp), key=lambda e: e.name):
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(info.st_mode):
            files[entry.name] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
    from transformer_parity import __version__

    manifest = {"format": MANIFEST_FORMAT, "written_by": f"transformer-parity {__version__}", "files": files,
                "kept": kept, "replaced": replaced, "settings": settings or {}}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def publish_dir(tmp: Path, path: Path, force: bool, kind: DirKind, notes: list[str] | None,
                settings: dict | None = None) -> None:
    """Move the finished directory `tmp` onto `path` (call with SIGINT/SIGTERM held). Without `force` the name is
    claimed with mkdir, so of two writers only one wins. With it, the existing directory is sorted again
    (`classify`: nothing unknown may have appeared), moved aside as `.NAME.tp-old-...`, the new one renamed into
    place, what is kept moved into it, and the rest of the old one removed. A SIGKILL between these steps leaves
    the moved-aside directory for the next write's `sweep` to finish."""
    if force and os.path.lexists(path):
        if path.is_symlink() or not path.is_dir():
            raise UsageError(f"{printable(path)} changed into something other than a directory while it was being "
                             "written; refusing to replace it")
        existing = classify(path, kind)
        _write_manifest(tmp, existing.replaced, existing.kept, settings)
        old = Path(tempfile.mkdtemp(prefix=temp_prefix(path, "old"), dir=path.parent))
        os.rename(path, old)  # onto the empty directory just made
        try:
            os.rename(tmp, path)
        except BaseException:
            os.rename(old, path)  # put the previous directory back
            raise
        moved = []
        for name in sorted(os.listdir(old)):  # what is kept, and anything that appeared since it was sorted
            if name not in existing.replaced and not os.path.lexists(path / name):
                os.rename(old / name, path / name)
                moved.append(name)
        shutil.rmtree(old)
        if moved:
            tell(notes, [f"kept in {printable(path)} what this tool does not write: {name_list(moved)}"])
        return
    _write_manifest(tmp, [], [], settings)
    try:
        os.mkdir(path)  # claim the name: fails if another writer got there first
    except FileExistsError:
        raise UsageError(f"{printable(path)} exists; pass --force to replace it") from None
    try:
        os.replace(tmp, path)  # onto the empty directory just claimed
    except BaseException:
        os.rmdir(path)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, force: bool, kind: DirKind, notes: list[str] | None = None,
               settings: dict | None = None) -> Iterator[Path]:
    """A temporary directory beside `path` to build an output directory in, published onto `path` when the block
    succeeds (`publish_dir`) with a manifest of what it holds; removed when it fails or is interrupted (SIGINT,
    SIGTERM). Stale temporaries of earlier, killed writes are swept first (a note says so)."""

    path = named(path)
    tell(notes, sweep(path))
    with deferred_signals():  # the handler and the temporary directory appear together, or neither
        previous = raise_on_sigterm()
        try:
            tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(path, "tmp"), dir=path.parent))
        except BaseException:
            restore_sigterm(previous)
            raise
    try:
        os.chmod(tmp, 0o777 & ~umask())
        yield tmp
        with deferred_signals():
            publish_dir(tmp, path, force, kind, notes, settings)
    finally:
        with deferred_signals():
            shutil.rmtree(tmp, ignore_errors=True)
            restore_sigterm(previous)


def temp_suffix(path: Path) -> str:
    """The final suffixes a temporary file beside `path` keeps (libraries check them)."""
    return "".join(path.suffixes[-2:]) if path.name.endswith(".weights.h5") else path.suffix


def publish(tmp: Path, path: Path, force: bool) -> None:
    """Move the finished `tmp` onto `path`: with `force` an atomic replace (of a regular file only); without, an
    atomic create that fails if `path` appeared meanwhile (a hard link, or an O_EXCL placeholder where the file
    system has no hard links), so of two racing writers only one succeeds."""
    kind = special_kind(path)
    if kind is not None:
        raise UsageError(f"{path} is a {kind}; refusing to write to it or replace it (even with --force)")
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise UsageError(f"{path} appeared while it was being written (another writer?); pass --force to "
                         "overwrite it") from None
    except OSError:  # no hard links here (some network or FUSE file systems): claim the name, then replace it
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            raise UsageError(f"{path} appeared while it was being written (another writer?); pass --force to "
                             "overwrite it") from None
        os.replace(tmp, path)
    else:
        tmp.unlink()


@contextlib.contextmanager
def atomic_path(path: Path, force: bool = False, notes: list[str] | None = None) -> Iterator[Path]:
    """A temporary path beside `path` (`.NAME.tp-tmp-<pid>-<random>` + the same suffixes, so libraries that check
    them are content), published onto `path` when the block succeeds (see `publish`: without `force`, never over a
    file that appeared meanwhile) and removed when it fails or is interrupted (Ctrl-C, SIGTERM). The file gets the
    mode a new file would get under the umask, or, replacing a file with `force`, that file's mode. Temporary
    files of earlier writes to `path` that were killed are removed first (`sweep`), and `notes` (or
    stderr) says so."""

    path = Path(path)
    suffix = temp_suffix(path)
    tell(notes, sweep(path, suffix))
    with deferred_signals():  # the handler and the file appear together, or neither
        previous = raise_on_sigterm()
        try:
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path, "tmp", suffix), suffix=suffix,
                                       dir=path.parent)
        except BaseException:
            restore_sigterm(previous)
            raise
        os.close(fd)
        tmp_path = Path(tmp)
    try:
        yield tmp_path
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode) if force and os.path.isfile(path) else 0o666 & ~umask()
        except OSError:
            mode = 0o666 & ~umask()
        with open(tmp_path, "rb+") as f:
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        with deferred_signals():
            publish(tmp_path, path, force)
    finally:
        with deferred_signals():
            tmp_path.unlink(missing_ok=True)
            restore_sigterm(previous)
