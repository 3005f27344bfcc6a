"""Port the fixture models (parity_tests/sources) as a new user would and measure the result against each model's
own forward pass. Prints two Markdown tables.

    python -m parity_tests.sources.measure_before           # layouts/NAME.before.toml: what the tool can express now
    python -m parity_tests.sources.measure_before --after   # layouts/NAME.toml: the layouts meant for the planned
                                                            # config fields (refused where those do not exist yet)

Scaffold table: `layout --scaffold CKPT`, its exit status, patterns, how many are left "?", how many guesses differ
from layouts/NAME.toml (the layout that is right once the planned config fields exist; a guess under a name the
reader does not produce counts too), and what `convert` does with the scaffold as printed plus `num_heads` (the one
line the scaffold asks for).

Port table, one row per route (a layout file, or `--from nn-transformer` with and without --set): the exit status
of `convert` and of `verify` (0 = PASS; default backends, default inputs), then the max abs error of the converted
canonical weights run through the NumPy reference against the model's own forward (`forward`, `forward_f64`), in
float32 and float64, on inputs holding id 0 (padding where the model has a pad token); "f64 no id 0" is the same on
those inputs with id 0 replaced by 2 (for a model whose pad id is 0 it is the same input: "-"); "argmax" is the share
of positions whose float64 argmax differs from the source's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import sys
import warnings
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the pyproject dependency `tomli; python_version < "3.11"`
    import tomli as tomllib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

import reference_numpy as rn  # noqa: E402
from parity_tests import sources  # noqa: E402
from transformer_parity import formats  # noqa: E402
from transformer_parity.cli import main  # noqa: E402

NN_ROUTES = [("--from nn-transformer", ["--from", "nn-transformer"]),
             ("--from nn-transformer --set num_heads=4", ["--from", "nn-transformer", "--set", "num_heads=4"]),
             ("--from nn-transformer --set num_heads=4 --set pad_id=1",
              ["--from", "nn-transformer", "--set", "num_heads=4", "--set", "pad_id=1"])]


def cli(*argv: str) -> tuple[int, str]:
    """`transformer-parity ARGV` in this process: (exit status, the last line it printed to stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["--quiet", *argv])
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    return code, (lines[-1] if lines else "")


def max_err(actual: np.ndarray, desired: np.ndarray) -> float:
    actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
    return float(np.max(np.abs(actual - desired))) if actual.shape == desired.shape else float("inf")


def port_logits(loaded: formats.Loaded, batch: dict, dtype) -> np.ndarray:
    model = rn.Transformer(loaded.config, loaded.weights, dtype)
    return model(batch["src_ids"], batch.get("tgt_ids"))


def scaffold_row(name: str, model, ckpt: Path, tmp: Path) -> tuple[str, list[str]]:
    """The scaffold's exit status, patterns, "?" left, guesses that differ from the layout meant for the planned
    fields (layouts/NAME.toml: right but for the new config fields), and convert on it plus num_heads."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["layout", "--scaffold", str(ckpt)])
    text = out.getvalue()
    guesses = tomllib.loads(text)["weights"]
    right = tomllib.loads((sources.LAYOUTS / f"{name}.toml").read_text())["weights"]
    unmapped = [k for k, v in guesses.items() if v == "?"]
    wrong = [f"{k} = {v!r}" for k, v in guesses.items() if v != "?" and " ".join(right.get(k, "").split()) != v]
    layout = tmp / f"{name}.scaffold.toml"
    layout.write_text(text.replace("# num_heads = ?", f"num_heads = {model.NUM_HEADS}"))
    convert, error = cli("convert", "--force", "--layout", str(layout), str(ckpt), str(tmp / "scaffold.safetensors"))
    notes = [f"{name}, scaffold: wrong guesses {'; '.join(wrong)}"] if wrong else []
    notes += [f"{name}, scaffold + num_heads: {error}"] if convert else []
    return f"| {name} | {code} | {len(guesses)} | {len(unmapped)} | {len(wrong)} | {convert} |", notes


def port_row(name: str, model, ckpt: Path, route: str, args: list[str], batch: dict, tmp: Path
             ) -> tuple[str, list[str]]:
    out = tmp / f"{name}.port.safetensors"
    convert, error = cli("convert", "--force", *args, str(ckpt), str(out))
    if convert:
        return f"| {name} | {route} | {convert} | | | | | |", [f"{name}, {route}: {error}"]
    verify, verdict = cli("verify", *args, str(ckpt))
    loaded = formats.load(out)
    source = model.make_source(ckpt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = {dtype: max_err(port_logits(loaded, batch, np.dtype(dtype)), source({**batch, "dtype": dtype}))
                  for dtype in sources.DTYPES}
        ours64, theirs64 = port_logits(loaded, batch, np.float64), source({**batch, "dtype": "float64"})
        if model.PAD_ID == 0:
            no_zero = "-"
        else:
            swapped = {k: np.where(v == 0, 2, v) for k, v in batch.items()}
            error = max_err(port_logits(loaded, swapped, np.float64), source({**swapped, "dtype": "float64"}))
            no_zero = f"{error:.1e}"
    argmax = float(np.mean(ours64.argmax(-1) != theirs64.argmax(-1))) if ours64.shape == theirs64.shape else 1.0
    notes = [f"{name}, {route}, verify: {verdict}"] if verify and verdict else []
    return (f"| {name} | {route} | {convert} | {verify} | {errors['float32']:.1e} | {errors['float64']:.1e} | "
            f"{no_zero} | {argmax:.0%} |"), notes


def measure(after: bool) -> str:
    suffix = ".toml" if after else ".before.toml"
    scaffolds = ["| model | scaffold exit | patterns | left \"?\" | wrong guesses | convert (scaffold + num_heads) |",
                 "|---|---|---|---|---|---|"]
    ports = ["| model | route | convert | verify | f32 err | f64 err | f64 no id 0 | argmax |",
             "|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name in sources.MODELS:
            model = sources.module(name)
            ckpt = model.save_checkpoint(tmp / f"{name}{model.CHECKPOINT_SUFFIX}", seed=0)
            batch = sources.sample_batch(model, seed=1, batch=3, src_len=13, tgt_len=11)
            row, more = scaffold_row(name, model, ckpt, tmp)
            scaffolds.append(row)
            notes += more
            layout = sources.LAYOUTS / f"{name}{suffix}"
            routes = [(f"layout {layout.name}", ["--layout", str(layout)])]
            if name == "nn_transformer_4heads":
                routes = NN_ROUTES + routes
            for route, args in routes:
                row, more = port_row(name, model, ckpt, route, args, batch, tmp)
                ports.append(row)
                notes += more
    return "\n".join(scaffolds + [""] + ports + [""] + [f"- {note}" for note in notes])


def cli_main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--after", action="store_true", help="measure layouts/NAME.toml instead of NAME.before.toml")
    print(measure(parser.parse_args().after))


if __name__ == "__main__":
    cli_main()
