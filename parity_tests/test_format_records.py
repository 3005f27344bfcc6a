"""One record per format (`transformer_parity.formats`): every module in the formats room but the registry's own
helpers is registered and exports one `Format` with every hook stated; names and extensions belong to one format
each; an unknown format is an error, never another format's reader."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from transformer_parity import formats
from transformer_parity.errors import UsageError
from transformer_parity.formats.record import Format

ROOM = Path(formats.__file__).parent
HELPERS = {"__init__", "record", "hints"}  # the registry, the record type, what to say about a file without config


def test_every_format_module_is_registered_and_exports_its_record():
    modules = {p.stem for p in ROOM.glob("*.py")} - HELPERS
    assert modules == set(formats.MODULES), "a format module that is not registered, or a registry line without one"
    for name in formats.MODULES:
        record = importlib.import_module(f"transformer_parity.formats.{name}").FORMAT
        assert isinstance(record, Format), name
        for field in dataclasses.fields(Format):  # every hook stated: the record type has no defaults
            assert field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING, field.name
        assert callable(record.read), name
        assert record.write is None or callable(record.write), name
        assert (record.output_directory is None) == (record.dir_kind is None), name
        assert record.extensions or record.is_directory is not None or record.containers, f"{name}: found by nothing"


def test_names_and_extensions_belong_to_one_format_each():
    names = [n for record in formats.records() for n in record.names]
    assert len(names) == len(set(names))
    extensions = [e for record in formats.records() for e in record.extensions]
    assert len(extensions) == len(set(extensions))
    for name in formats.names():
        assert name in formats.lookup(name).names


def test_a_format_without_a_hook_is_refused_when_the_record_is_made():
    with pytest.raises(TypeError):
        Format(name="x", what="", framework="numpy", extensions=(".x",), containers=(), read=lambda r: None,
               write=None, streamed=False)  # the absent hooks are not stated


@pytest.mark.parametrize("name", ["nope", "hf-nope", "kerashub-", "layout"])
def test_an_unknown_format_is_an_error(name, tmp_path):
    with pytest.raises(UsageError, match="unknown format"):
        formats.lookup(name)
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + b" " * 14)
    with pytest.raises(UsageError, match="unknown format"):
        formats.load(path, name)


def test_a_file_no_format_claims_is_refused_not_read_as_another(tmp_path):
    path = tmp_path / "model.weights"
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(UsageError, match="not a checkpoint this tool knows"):
        formats.load(path)
    with pytest.raises(UsageError, match="cannot tell the output format"):
        formats.output_format(tmp_path / "out.weights")
