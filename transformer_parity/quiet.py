"""Keep the frameworks' start-up chatter off a normal run.

TensorFlow's C++ runtime logs through absl before Python can intervene: "All log messages before
absl::InitializeLog() is called are written to STDERR", the CPU-feature notice and the oneDNN notice land on file
descriptor 2 at `import tensorflow`. Both read `TF_CPP_MIN_LOG_LEVEL` when the library loads, so it must be set
before the first framework import; the CLI calls `configure` first thing, before any command runs.

Only logging is touched. `TF_ENABLE_ONEDNN_OPTS` changes which kernels run (and so the numerics) and is left alone.
A variable the user has set is never overridden, and nothing is restored afterwards: the process ends with the
command. `--debug` asks for everything (level 0, where the user has not chosen a level).
"""

from __future__ import annotations

import os

# variable -> (value on a normal run, value with --debug)
LOG_SETTINGS = {
    "TF_CPP_MIN_LOG_LEVEL": ("2", "0"),  # TF's and absl's C++ logs: 2 = errors only, 0 = everything
}


def configure(debug: bool = False, environ: dict | None = None) -> dict[str, str]:
    """Set the framework log levels the user has not set; returns what was set (name -> value)."""
    environ = os.environ if environ is None else environ
    chosen = {}
    for name, (normal, verbose) in LOG_SETTINGS.items():
        if name not in environ:
            environ[name] = chosen[name] = verbose if debug else normal
    return chosen
