"""Hugging Face model directories (`save_pretrained`): `config.json` plus `model.safetensors`, shards with an index,
or `pytorch_model.bin`, and transformers 4's `tf_model.h5` / `flax_model.msgpack` (`layouts.hf_legacy`). The family
is config.json's `model_type`; `--from` / `--to` may name one (`hf-FAMILY`, each a module of `layouts`), and
`--to hf` writes the family that can express the config (or the one the weights came from)."""

from __future__ import annotations

from pathlib import Path

from ..layouts import HF_LAYOUTS
from .record import Format, Loaded, ReadRequest, WriteRequest


def is_directory(path: Path) -> bool:
    return (path / "config.json").is_file()


def read(request: ReadRequest) -> Loaded:
    from ..io.safetensors_io import widened_note
    from ..layouts import hf, hf_dir

    path = request.path
    config, weights, notes, family = hf.load_dir(path, request.name, request.fields, request.on_tensor,
                                                 request.drops, request.lazy)
    if not request.lazy:
        read = [f for f in hf_dir.weight_files(path) if f.suffix == ".safetensors"]  # the files read, not all there
        note = widened_note(read)
        notes = notes + ([] if note is None else [note])
    return Loaded(path, family, "torch", config, weights, notes, origin=family)


def write(request: WriteRequest) -> tuple[Path, str]:
    """A Hugging Face model directory, built beside `path` and renamed into place (see `outputs.atomic_dir`)."""
    from ..io import outputs
    from ..layouts import hf, hf_dir

    path = outputs.check_output_dir(request.path, request.force, hf_dir.MODEL_DIR)
    weights = request.weights if request.consume else dict(request.weights)
    family = hf.save_dir(path, request.config, weights, request.name, request.force, request.on_tensor, consume=True,
                         notes=request.notes, max_shard_size=request.max_shard_size or hf_dir.MAX_SHARD_SIZE,
                         record=request.record)
    return path, family


def dir_kind():
    from ..layouts.hf_dir import MODEL_DIR

    return MODEL_DIR


FORMAT = Format(
    name="hf", what="a Hugging Face save_pretrained model directory", framework="torch", extensions=(),
    containers=(), read=read, write=write, streamed=True, families=tuple(HF_LAYOUTS), write_extensions=(),
    is_directory=is_directory, output_directory=lambda name: True, dir_kind=dir_kind)
