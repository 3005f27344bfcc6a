"""`verify`'s source oracle: the model the weights came from, run on verify's inputs, its outputs compared with our
float64 reference and every backend (docs/verify.md, "What a verdict proves"). One module per kind of source, one
contract (`source_contract`: `Source.run(batch)` -> `SourceRun`s of canonical-named arrays, checked by
`check_outputs`):

- **a user's file**, `--source FILE.py:NAME` (`source_file`): `NAME(batch)` on a dict of NumPy int64 arrays;
- **a probe's answer**, `--expect FILE.npz` (`probes`): inputs `--write-probe` wrote, outputs computed elsewhere;
- **a built-in source**, used by default for a checkpoint whose library is installed, picked here (`builtin`): a
  Hugging Face directory run by transformers (`source_hf`), a KerasHub preset by keras_hub (`source_kerashub`), an
  `nn-transformer` file by torch.nn (`source_nn`), each loading the checkpoint's own files; several at once judged
  against each other (`combine`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

from transformer_parity.layouts import HF_LAYOUTS, KERASHUB_PRESETS
from .source_contract import Batch, Source, SourceRun
from .source_hf import _hf_source
from .source_kerashub import _kerashub_source
from .source_nn import _nn_source


# --- built-in sources -------------------------------------------------------------------------------------------------

KERASHUB_DIRS = KERASHUB_PRESETS[1:]


def builtin(loaded) -> tuple[Source | None, str | None]:
    """The built-in source for a loaded checkpoint (`formats.Loaded`), or `(None, why there is none)`."""
    fmt, path = loaded.format, Path(loaded.path)
    if fmt in HF_LAYOUTS:
        from transformer_parity.layouts import hf_dir

        legacy = hf_dir.legacy_weights(path)
        if legacy:
            return None, (f"transformers 5 cannot load {legacy}; judge it with --expect FILE.npz, the outputs of "
                          "the library that wrote it (docs/wild.md)")
        missing = _missing("torch", "transformers")
        return (None, f"{missing} not installed") if missing else (_hf_source(path, fmt, loaded.config), None)
    if fmt in KERASHUB_DIRS and path.is_dir():
        missing = _missing("keras_hub")
        return (None, f"{missing} not installed") if missing else (_kerashub_source(path, fmt, loaded.config), None)
    if fmt == "nn-transformer":
        missing = _missing("torch")
        if missing:
            return None, f"{missing} not installed"
        return _nn_source(path, loaded.config)
    return None, "no source given"


def combine(found: Sequence[Source]) -> Source:
    """Several libraries as one source (`verify HF_DIR KERASHUB_PRESET`): every run of each, judged alike and against
    each other, so the report names the first sublayer where the libraries part."""
    if len(found) == 1:
        return found[0]

    def run(batch: Batch) -> list[SourceRun]:
        return [r for s in found for r in s.run(batch)]

    return Source(" and ".join(s.name for s in found), "builtin", run, [n for s in found for n in s.notes])


def _missing(*packages: str) -> str | None:
    return next((p for p in packages if importlib.util.find_spec(p) is None), None)
