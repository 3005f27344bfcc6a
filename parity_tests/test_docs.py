"""The docs cannot rot: every command block marked runnable in README.md and docs/*.md runs, and exits as expected.

The convention (also in docs/README.md, "Commands in the docs are tested"):

- A fenced block whose info string is `sh test` is runnable (GitHub renders it as shell). `sh test exact` runs
  exactly as written; plain `sh test` gets the size substitution below.
- One command per line; a trailing backslash continues it; `#` starts a comment; blank lines are skipped.
- A command ending with the comment `# exit N` must exit with status N (e.g. `verify` finding a changed weight:
  `# exit 1`); every other command must exit 0.
- Size substitution: `--preset base` / `--preset big` become `--preset tiny`; `transformer-parity init` without
  `--preset`, and `transformer-parity verify` without a checkpoint file, get `--preset tiny`.
- The blocks of one file run in order in one fresh temporary directory, so a block may use what an earlier block of
  the same page wrote. `transformer-parity ...` runs in-process through `transformer_parity.cli.main` (what the
  console script calls), so the frameworks load once; anything else runs in a subprocess, in the environment the
  tests run in (the package installed, as the README installs it; the repository is not put on PYTHONPATH). In
  both, a path relative to the repository (`python docs/examples/x.py`, `parity_tests/wild/bert-mlm-tf`) that names
  nothing in the current directory is resolved against it, as from the repository's root.
- `cd "$(mktemp -d)"` moves to a fresh directory (the README's tour starts so, to leave nothing in the reader's
  current directory); the directory the page started in must then stay empty.
"""

import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from transformer_parity import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".h5")
EXPECTED_EXIT = re.compile(r"#\s*exit\s+(\d+)\s*$")


@dataclass
class Command:
    argv: list[str]
    expected: int
    line: int  # where it starts in the file

    def __str__(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv)


def runnable_blocks(text: str) -> list[tuple[int, bool, list[str]]]:
    """`(first line number, exact, lines)` of every fenced block whose info string starts with `sh test`."""
    blocks, current = [], None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if current is None and stripped.startswith("```"):
            words = stripped[3:].split()
            current = (number + 1, words[:2] == ["sh", "test"], "exact" in words[2:], [])
        elif current is not None and stripped.startswith("```"):
            if current[1]:
                blocks.append((current[0], current[2], current[3]))
            current = None
        elif current is not None:
            current[3].append(line)
    return blocks


def commands(start: int, exact: bool, lines: list[str]) -> list[Command]:
    out, pending, first = [], "", start
    for number, line in enumerate(lines, start):
        if not pending:
            first = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text, pending = pending + line, ""
        match = EXPECTED_EXIT.search(text)
        argv = shlex.split(text, comments=True)
        if argv:
            out.append(Command(argv if exact else tiny(argv), int(match.group(1)) if match else 0, first))
    return out


def tiny(argv: list[str]) -> list[str]:
    """The size substitution of the module docstring."""
    argv = list(argv)
    for i, word in enumerate(argv[:-1]):
        if word == "--preset" and argv[i + 1] in ("base", "big"):
            argv[i + 1] = "tiny"
    if argv[0] == "transformer-parity" and len(argv) > 1 and "--preset" not in argv:
        files = [a for a in argv[2:] if a.endswith(CHECKPOINT_SUFFIXES) and not a.startswith("-")]
        if argv[1] == "init" or (argv[1] == "verify" and not files):
            argv += ["--preset", "tiny"]
    return argv


def doc_commands(path: Path) -> list[Command]:
    return [c for start, exact, lines in runnable_blocks(path.read_text()) for c in commands(start, exact, lines)]


RUNNABLE = [p for p in DOCS if doc_commands(p)]


FRESH_DIRECTORY = ["cd", "$(mktemp -d)"]


def from_repository(argv: list[str], cwd: Path) -> list[str]:
    """Arguments that name a file or directory of the repository by a relative path (and none in `cwd`), made
    absolute (the wild corpus's checkpoints are directories), a source's `FILE.py:NAME` too."""
    def is_repository_file(a: str) -> bool:
        return (re.fullmatch(r"[\w.-]+(/[\w.-]+)+", a) is not None and not (cwd / a).exists()
                and (REPO / a).exists())

    def absolute(a: str) -> str:
        path, colon, name = a.partition(":")
        return str(REPO / path) + colon + name if is_repository_file(path) else a

    return [absolute(a) for a in argv]


@pytest.mark.parametrize("path", RUNNABLE, ids=[str(p.relative_to(REPO)) for p in RUNNABLE])
def test_documented_commands_run(path, tmp_path, monkeypatch, capsys):
    start = tmp_path / "start"
    start.mkdir()
    monkeypatch.chdir(start)
    cwd, moved = start, False
    for command in doc_commands(path):
        where = f"{path.relative_to(REPO)}:{command.line}: {command}"
        if command.argv[:1] == ["cd"]:
            assert command.argv == FRESH_DIRECTORY, f"{where}: the only cd the docs test knows is cd \"$(mktemp -d)\""
            cwd, moved = Path(tempfile.mkdtemp(dir=tmp_path)), True
            monkeypatch.chdir(cwd)
            continue
        if command.argv[0] == "transformer-parity":
            threads = _torch_threads()
            code = cli.main(from_repository(command.argv, cwd)[1:])
            out, err = capsys.readouterr()
            if threads and _torch_threads() != threads:  # e.g. `train --threads 1`: leave the process as it was
                import torch
                torch.set_num_threads(threads)
        else:
            argv = [sys.executable, *command.argv[1:]] if command.argv[0] in ("python", "python3") else command.argv
            result = subprocess.run(from_repository(argv, cwd), cwd=cwd, capture_output=True, text=True,
                                    timeout=120)
            code, out, err = result.returncode, result.stdout, result.stderr
        assert code == command.expected, f"{where}\nexit {code}, expected {command.expected}\n{out[-2000:]}{err}"
    if moved:
        assert sorted(p.name for p in start.iterdir()) == [], f"{path.relative_to(REPO)} left files where it started"


def _torch_threads() -> int | None:
    return sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None


def test_the_front_page_has_its_tour_and_its_links():
    """README's tour is runnable, and every docs/ page it links to exists (and every docs page is linked)."""
    readme = (REPO / "README.md").read_text()
    tour = doc_commands(REPO / "README.md")
    assert tour[0].argv == FRESH_DIRECTORY  # nothing is left in the reader's current directory
    assert {"init", "convert", "verify", "bench", "train"} <= {c.argv[1] for c in tour}
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    assert linked and all((REPO / link).is_file() for link in linked), linked
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    unlinked = pages - linked
    assert not unlinked, f"docs pages the README does not link: {sorted(unlinked)}"


def test_the_convention():
    text = "\n".join(["```sh test", "transformer-parity init -o a.safetensors  # a comment",
                      "transformer-parity verify a.safetensors \\", "    b.pt   # exit 1", "```",
                      "```sh", "not run", "```", "```sh test exact", "transformer-parity verify", "```"])
    blocks = runnable_blocks(text)
    assert [(start, exact) for start, exact, _ in blocks] == [(2, False), (10, True)]
    first = commands(*blocks[0])
    assert [c.argv for c in first] == [["transformer-parity", "init", "-o", "a.safetensors", "--preset", "tiny"],
                                       ["transformer-parity", "verify", "a.safetensors", "b.pt"]]
    assert [c.expected for c in first] == [0, 1] and [c.line for c in first] == [2, 3]
    assert [c.argv for c in commands(*blocks[1])] == [["transformer-parity", "verify"]]
    assert tiny(["transformer-parity", "verify", "--preset", "base"])[-1] == "tiny"
    assert tiny(["transformer-parity", "verify"]) == ["transformer-parity", "verify", "--preset", "tiny"]
