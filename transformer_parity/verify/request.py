"""What `verify.run` is asked: the checkpoints (or a preset), where they run, the inputs they run on, and what judges
them, as one `Request`. Its checks run when it is made, so a bad combination is refused before anything is read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from transformer_parity.errors import UsageError

STREAM_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class Request:
    """One verify run.

    - no checkpoint: seeded weights for `preset` (with `fields` applied) in every backend;
    - one checkpoint: it in every backend;
    - two or more: each in its own framework (a `.pt` in torch, a `.weights.h5` in Keras, a `.safetensors` in
      NumPy at `dtype`), the first checkpoint's weights being the reference the judge runs.

    `formats` are the checkpoints' `--from` (None: detected); `backends` limits the framework backends of the first
    two modes (default: every installed one). `src_len` / `tgt_len` left out: 37 and 29, clipped to a model whose
    `max_len` is shorter (a note says so); `cover` lengthens them to run every length-dependent path the config
    declares. The first checkpoint is also judged against its source: `source` (FILE.py:NAME), `expect` (an .npz of
    inputs and outputs computed elsewhere), or by default the built-in one for its kind (`builtin_source`).
    `allow_drop` names the nonzero tensors a layout's `ignore` may leave out (`--allow-drop`). `stream`: `on` runs
    one block at a time (`verify.streamed`: a model larger than memory, no source run), `off` the whole model,
    `auto` streams one checkpoint whose whole-model run would not fit in memory. `outputs_only` skips the weight
    comparison of several checkpoints; `autocast` runs the ports under their framework's autocast."""

    checkpoints: Sequence[str | os.PathLike] = ()
    preset: str = "base"
    fields: Mapping[str, Any] = field(default_factory=dict)
    formats: Sequence[str | None] | None = None
    backends: Sequence[str] | None = None
    dtype: str = "float32"
    batch: int = 2
    src_len: int | None = None
    tgt_len: int | None = None
    seed: int = 0
    cover: bool = False
    autocast: bool = False
    source: str | None = None
    expect: str | os.PathLike | None = None
    builtin_source: bool = True
    allow_drop: Sequence[str] = ()
    stream: str = "auto"
    outputs_only: bool = False

    def __post_init__(self) -> None:
        if self.stream not in STREAM_MODES:
            raise UsageError(f"--stream must be one of {', '.join(STREAM_MODES)}, received {self.stream!r}")
        if self.stream == "on" and len(self.checkpoints) >= 2:
            raise UsageError("--stream on runs one checkpoint (or a preset) in every backend; several checkpoints "
                             "are compared whole: give one, or drop --stream on")
        if self.backends is not None:
            from transformer_parity import backends as registry

            # `tf` is `keras`; an unknown name is refused
            object.__setattr__(self, "backends", [registry.canonical_name(b) for b in self.backends])
            if len(self.checkpoints) >= 2:
                raise UsageError("--backends applies to zero or one checkpoint; with several, each runs in its own "
                                 "framework")

    def format_of(self, i: int) -> str | None:
        """The `--from` of checkpoint `i` (None: detected)."""
        return (self.formats or [None] * len(self.checkpoints))[i]
