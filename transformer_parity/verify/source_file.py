"""`--source FILE.py:NAME`: a user's own model code as the source of truth (`from_file`), imported from its file
under a module name of its own, called once on verify's inputs (the contract: `source_contract`)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from transformer_parity.errors import UsageError
from transformer_parity.io.user_code import load_callable
from .source_contract import Batch, Source, SourceRun, _one_line


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
