"""Quiet on every CPU: TensorFlow's C++ start-up notices (absl's pre-init warning, the oneDNN and CPU-feature lines,
written straight to file descriptor 2 whatever `TF_CPP_MIN_LOG_LEVEL` says) never reach the user's terminal, from
the command line or from `import tf_impl` and building a model; a real error from the framework still does.

Each check runs in a fresh process with `TF_ENABLE_ONEDNN_OPTS=1` forced (the notices appear only where oneDNN is
on) and none of the log switches this suite sets for itself, as a new user's shell has them.
"""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("tensorflow", "keras", "keras_hub")


def fresh_env(**extra: str) -> dict[str, str]:
    from transformer_parity.quiet import LOG_SETTINGS

    env = {k: v for k, v in os.environ.items() if k not in LOG_SETTINGS and k != "TF_ENABLE_ONEDNN_OPTS"}
    return {**env, "TF_ENABLE_ONEDNN_OPTS": "1", **extra}


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          env=fresh_env(**env), timeout=300)


def test_verify_writes_nothing_to_stderr():
    """The README's first command, on the tiny preset, in every backend: stderr holds nothing at all."""
    command = [sys.executable, "-m", "transformer_parity", "verify", "--preset", "tiny", "--batch", "1",
               "--src-len", "5", "--tgt-len", "4"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=fresh_env(), timeout=300)
    assert result.returncode == 0 and "PASS" in result.stdout, result.stdout + result.stderr
    assert result.stderr == ""


def test_building_a_keras_model_writes_nothing_but_a_real_error_gets_through():
    """`import tf_impl`, build and run a model: nothing on stderr. Then TensorFlow's C++ runtime writes a line of its
    own to fd 2 (tf.print to the process's stderr, as an op's error report does): it arrives, and it is all there is."""
    result = run_python("""
        import numpy as np
        import reference_numpy as rn
        import tf_impl

        config = rn.TransformerConfig.preset("tiny")
        model = tf_impl.Transformer.from_reference(config, rn.init_weights(config, 0))
        src, tgt = rn.sample_batch(config, 2, 5, 4)
        print(np.asarray(model(src, tgt)).shape, flush=True)
        tf_impl.model.tf.print("a real error from the runtime", output_stream="file:///dev/stderr")
    """)
    assert result.returncode == 0 and result.stdout == "(2, 4, 40)\n", result.stdout + result.stderr
    assert result.stderr == "a real error from the runtime\n"


def test_the_filter_keeps_every_line_that_is_not_a_known_notice(tmp_path):
    """What TensorFlow writes to fd 2 while it is imported, through the filter: the known notices go, anything else
    (an error loading a library, a warning of a kind not seen before) is written back to stderr. A stand-in
    `tensorflow` package writes both, so this runs without the real import."""
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text(textwrap.dedent("""
        import os
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n")
        os.write(2, b"I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on. You may see slightly\\n")
        os.write(2, b"E0000 00:00:1.0 1 loader.cc:7] could not load libcudart.so: a real problem\\n")
        os.write(2, b"I0000 00:00:1.0 1 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available"
                    b" CPU instructions in performance-critical operations.\\n")
        os.write(2, b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the"
                    b" appropriate compiler flags.\\n")
    """))
    result = run_python("""
        import os
        import tf_impl.startup
        assert tf_impl.startup.tf.__file__.startswith(os.environ["FAKE"])  # the stand-in, not TensorFlow
    """, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]), FAKE=str(fake))
    assert result.stderr == "E0000 00:00:1.0 1 loader.cc:7] could not load libcudart.so: a real problem\n", \
        result.stderr
    # the control: --debug's level 0 keeps everything
    result = run_python("import tf_impl.startup", PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]),
                        TF_CPP_MIN_LOG_LEVEL="0")
    assert "absl::InitializeLog" in result.stderr and "oneDNN" in result.stderr and "a real problem" in result.stderr


# --- every product path imports TensorFlow through the filter -------------------------------------------------------

def _is_framework(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] in FRAMEWORKS for a in node.names)
    return isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in FRAMEWORKS


def _is_startup(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "tf_impl.startup" for a in node.names)
    if isinstance(node, ast.ImportFrom):
        module = "." * node.level + (node.module or "")
        return module in ("tf_impl.startup", ".startup") or (module == "tf_impl" and
                                                            any(a.name == "startup" for a in node.names))
    return False


def unfiltered_imports(source: str) -> list[int]:
    """Lines of the framework imports in `source` that no earlier import of `tf_impl.startup` covers: one at module
    level, or one in an enclosing function, or there a call to a function of the same module that makes one."""
    tree = ast.parse(source)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def called(fn) -> set[str]:
        return {c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}

    filtering = {fn.name for fn in functions if any(_is_startup(n) for n in ast.walk(fn))}
    while True:  # a function that calls one that imports through the filter imports through it too
        more = {fn.name for fn in functions if called(fn) & filtering} - filtering
        if not more:
            break
        filtering |= more

    def guards(fn) -> list[int]:
        return [n.lineno for n in ast.walk(fn) if _is_startup(n) or (
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in filtering)]

    module_guard = min((n.lineno for n in tree.body if _is_startup(n)), default=None)
    bad = []
    for node in ast.walk(tree):
        if not _is_framework(node) or (module_guard is not None and module_guard < node.lineno):
            continue
        enclosing = [fn for fn in functions if fn.lineno <= node.lineno <= fn.end_lineno]
        if not any(line < node.lineno for fn in enclosing for line in guards(fn)):
            bad.append(node.lineno)
    return bad


# Scripts that run in side environments holding other library versions and import nothing of the project, so the
# filter is not there to import: the wild corpus's writer (transformers 4.30, TensorFlow 2.13, keras-nlp 0.12).
SIDE_ENVIRONMENT = ("wild_corpus.py",)


def test_every_product_import_of_a_framework_goes_through_the_filter():
    files = [p for folder in ("transformer_parity", "benchmarks", "tf_impl") for p in sorted((REPO / folder).rglob("*.py"))
             if p.name != "startup.py" and not p.name.startswith("test_") and p.name not in SIDE_ENVIRONMENT]
    bad = [f"{p.relative_to(REPO)}:{line}" for p in files for line in unfiltered_imports(p.read_text())]
    assert bad == []
    # the check can fail: a plain import, or one before the startup import, is found
    assert unfiltered_imports("def f():\n    import keras\n") == [2]
    assert unfiltered_imports("def f():\n    from tensorflow import nn\n    import tf_impl.startup\n") == [2]
    assert unfiltered_imports("def g():\n    import tf_impl.startup\n\n\ndef f():\n    g()\n    import keras\n") == []
