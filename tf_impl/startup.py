"""TensorFlow imported with its C++ start-up notices kept off the terminal.

TensorFlow's runtime writes "All log messages before absl::InitializeLog() is called are written to STDERR" and,
on CPUs where oneDNN is on, an INFO line about it straight to file descriptor 2 while `import tensorflow` runs,
whatever `TF_CPP_MIN_LOG_LEVEL` says. Python's `sys.stderr` cannot catch that, so fd 2 is pointed at a temporary
file for the import alone, and every line that is not one of those known notices is written back to stderr: a real
error still gets through. `TF_CPP_MIN_LOG_LEVEL=0` (what `--debug` sets) keeps everything.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

# Notices TensorFlow prints at import on a healthy machine (absl's pre-init warning, oneDNN, CPU features, CUDA
# probing on a CPU-only build); matched on the text after absl's "I0000 00:00:... file.cc:N]" prefix.
NOTICES = re.compile(r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
                     r"|oneDNN custom operations are on"
                     r"|This TensorFlow binary is optimized to use available CPU instructions"
                     r"|To enable the following instructions: .* in other operations, rebuild TensorFlow"
                     r"|Could not find cuda drivers on your machine|Unable to register cu(DNN|FFT|BLAS) factory"
                     r"|TF-TRT Warning: Could not find TensorRT")


def import_tensorflow():
    """`import tensorflow`, with the start-up notices above filtered out of fd 2 (once per process)."""
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        import tensorflow
        return tensorflow
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not NOTICES.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
    return tensorflow


tf = import_tensorflow()
