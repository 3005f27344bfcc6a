"""The hostile model directories, KerasHub configs and layout files of docs/hardening.md ("Model directories,
KerasHub configs and layout files"), run through the CLI in a fresh process each: exit status, the one line on
stderr, seconds and peak memory (max RSS) next to an honest conversion of the same kind.

    nice -n 19 python -m benchmarks.hostile_inputs --json benchmarks/results/hardening/hostile_inputs.json

The inputs are built here, small, as parity_tests/test_hostile_inputs.py builds them (plus a 210 MB config.json,
too large for a test). A program that reports, not a test.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from parity_tests.support.hostile import LAYOUT

from .hostile_cases import run_command

VOCAB = 23


def build(work: Path) -> dict[str, tuple[list[str], str | None, str]]:
    """{case: (command, honest case or None, issue item)}; the inputs are written into `work`."""
    import reference_numpy as rn
    from transformer_parity import formats
    from transformer_parity.layouts import user
    from transformer_parity.verify import seeded_weights

    gpt2 = rn.TransformerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, num_heads=2,
                                num_encoder_layers=0, num_decoder_layers=2, d_ff=24, max_len=9,
                                activation="gelu_tanh", norm_first=True, final_norm=True, positional="learned",
                                scale_embedding=False, tie_embeddings=True, pad_id=None, output_bias=False,
                                dropout=0.0)
    bert = rn.TransformerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, num_heads=2,
                                num_encoder_layers=2, num_decoder_layers=0, d_ff=24, max_len=9, activation="gelu",
                                positional="learned", scale_embedding=False, tie_embeddings=True, pad_id=0,
                                output_bias=True, embed_norm=True, type_vocab_size=2, head_transform=True,
                                layer_norm_eps=1e-12, dropout=0.0)
    marian = rn.TransformerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, num_heads=2,
                                  num_encoder_layers=2, num_decoder_layers=2, d_ff=24, max_len=9, activation="silu",
                                  sinusoid_layout="concatenated", share_embeddings=True, tie_embeddings=True,
                                  output_bias=True, pad_id=VOCAB - 1, dropout=0.0)
    encoder = rn.TransformerConfig(src_vocab_size=VOCAB, tgt_vocab_size=7, d_model=16, num_heads=2,
                                   num_encoder_layers=2, num_decoder_layers=0, d_ff=24, max_len=9,
                                   positional="learned", scale_embedding=False, pad_id=0, dropout=0.0)
    for name, fmt, config in (("gpt2", "hf-gpt2", gpt2), ("bert", "hf-bert", bert), ("marian", "hf-marian", marian),
                              ("kerashub", "kerashub-gpt2", gpt2)):
        formats.save(work / name, config, seeded_weights(config, 0), fmt=fmt)
    (work / "layout.toml").write_text(LAYOUT)
    user.export_with_layout(work / "model.safetensors", encoder, seeded_weights(encoder, 0), work / "layout.toml")
    formats.save(work / "canonical.safetensors", encoder, seeded_weights(encoder, 0))

    numbers = itertools.count()

    def directory(model: str, key: str, raw: str, under: str | None = None) -> str:
        path = work / f"{model}-{key}-{next(numbers)}"
        shutil.copytree(work / model, path)
        data = json.loads((path / "config.json").read_text())
        (data[under] if under else data)[key] = "@@RAW@@"
        (path / "config.json").write_text(json.dumps(data).replace('"@@RAW@@"', raw))
        return str(path)

    def padded(model: str, size: int) -> str:
        path = work / f"{model}-padded-{size}"
        shutil.copytree(work / model, path)
        data = json.loads((path / "config.json").read_text())
        with open(path / "config.json", "w") as f:
            f.write(json.dumps(data)[:-1] + ', "padding": "')
            for _ in range(size >> 20):
                f.write("x" * (1 << 20))
            f.write('"}')
        return str(path)

    def layout(name: str, text: str) -> str:
        (work / f"{name}.toml").write_text(text)
        return str(work / f"{name}.toml")

    from safetensors.numpy import load_file, save_file

    state = load_file(str(work / "model.safetensors"))
    state["layers.999999999999.norm1.weight"] = np.ones(16, np.float32)
    save_file(state, str(work / "far.safetensors"))
    big = "[config]\nnum_heads = 2\n\n[weights]\n" + "".join(
        f'"blocks.{i}.w" = "encoder.layers.{i}.norm1.gamma"\n' for i in range(100_000))
    big_twice = big.replace('"blocks.99998.w" = "encoder.layers.99998', '"blocks.99998.w" = "encoder.layers.99999')

    out = str(work / "never.safetensors")
    to = ["convert", str(work / "canonical.safetensors")]
    with_layout = ["--layout", str(work / "layout.toml")]
    return {
        "convert hf-marian (honest)": (["convert", str(work / "marian"), str(work / "h1.safetensors")], None, ""),
        "convert kerashub-gpt2 (honest)": (["convert", str(work / "kerashub"), str(work / "h3.safetensors")], None,
                                           ""),
        "convert --layout (honest)": (["convert", str(work / "model.safetensors"), str(work / "h2.safetensors"),
                                       *with_layout], None, ""),
        "GPT-2 n_layer 10^9": (["convert", directory("gpt2", "n_layer", "1000000000"), out],
                               "convert hf-marian (honest)", "4"),
        "GPT-2 n_layer 10^30": (["convert", directory("gpt2", "n_layer", "1" + "0" * 30), out],
                                "convert hf-marian (honest)", "4"),
        "BERT num_hidden_layers 10^9": (["convert", directory("bert", "num_hidden_layers", "1000000000"), out],
                                        "convert hf-marian (honest)", "4"),
        "Marian decoder_layers 10^9": (["convert", directory("marian", "decoder_layers", "1000000000"), out],
                                       "convert hf-marian (honest)", "4"),
        "--set num_decoder_layers=10^9 over a directory": (["convert", str(work / "marian"), out, "--set",
                                                            "num_decoder_layers=1000000000"],
                                                           "convert hf-marian (honest)", "4"),
        "GPT-2 n_embd 10^9": (["convert", directory("gpt2", "n_embd", "1000000000"), out],
                              "convert hf-marian (honest)", "4"),
        "Marian max_position_embeddings 10^8": (["convert", directory("marian", "max_position_embeddings",
                                                                      "100000000"), out],
                                                "convert hf-marian (honest)", "4"),
        "Marian max_position_embeddings 10^12": (["convert", directory("marian", "max_position_embeddings",
                                                                       "1000000000000"), out],
                                                 "convert hf-marian (honest)", "4"),
        "verify --set max_len=10^8": (["verify", "--preset", "tiny", "--set", "max_len=100000000", "--backends",
                                       "numpy"], None, "4"),
        "KerasHub num_layers 10^9": (["convert", directory("kerashub", "num_layers", "1000000000", "config"), out],
                                     "convert kerashub-gpt2 (honest)", "4"),
        "layout [config] num_encoder_layers 10^9": (
            ["convert", str(work / "model.safetensors"), out, "--layout",
             layout("deep-layers", LAYOUT.replace("pad_id = 0", "pad_id = 0\nnum_encoder_layers = 1000000000"))],
            "convert --layout (honest)", "4"),
        "a key layers.999999999999 through a layout": (["convert", str(work / "far.safetensors"), out,
                                                        *with_layout], "convert --layout (honest)", "4"),
        "config.json of 2 MB": (["convert", padded("gpt2", 2 << 20), out], "convert hf-marian (honest)", "4"),
        "config.json of 210 MB": (["convert", padded("gpt2", 210 << 20), out], "convert hf-marian (honest)", "4"),
        "KerasHub config.json of 2 MB": (["convert", padded("kerashub", 2 << 20), out],
                                         "convert kerashub-gpt2 (honest)", "4"),
        "name {i:>3000000000}": (["convert", str(work / "model.safetensors"), out, "--layout",
                                  layout("spec", LAYOUT.replace('"head.bias"', '"head.{i:>3000000000}"'))],
                                 "convert --layout (honest)", "5"),
        "name {}": (["convert", str(work / "model.safetensors"), out, "--layout",
                     layout("empty", LAYOUT.replace('"head.bias"', '"head.{}"'))], "convert --layout (honest)", "5"),
        "name layers.{i}.norm2.{i}.bias (--to-layout)": (
            [*to, str(work / "twice.safetensors"), "--to-layout",
             layout("twice", LAYOUT.replace('"layers.{i}.norm2.bias"', '"layers.{i}.norm2.{i}.bias"'))], None, "5"),
        "100k-line layout, one tensor targeted twice": (
            [*to, str(work / "never.pt"), "--to-layout", layout("big", big_twice)], None, "5"),
        "explicit line over a {i} line (--to-layout)": (
            [*to, str(work / "never.pt"), "--to-layout",
             layout("over", LAYOUT + '"layers.0.norm2.bias" = "encoder.layers.0.norm2.gamma"\n')], None, "3"),
        "--to-layout .weights.h5, key \"\"": ([*to, str(work / "never.weights.h5"), "--to-layout",
                                              layout("h5-empty", LAYOUT.replace('"head.bias"', '""'))], None, "6"),
        "--to-layout .weights.h5, key \".\"": ([*to, str(work / "never.weights.h5"), "--to-layout",
                                               layout("h5-dot", LAYOUT.replace('"head.bias"', '"."'))], None, "6"),
        "--to-layout .weights.h5, keys a and a/b": (
            [*to, str(work / "never.weights.h5"), "--to-layout",
             layout("h5-group", LAYOUT.replace('"head.bias"', '"head.weight/b"'))], None, "6"),
        "TOML nested 3000 deep": (["convert", str(work / "model.safetensors"), out, "--layout",
                                   layout("deep", "x = " + "[" * 3000 + "]" * 3000 + "\n")], None, "6"),
        "heads_in on a 1-D tensor": (
            ["convert", str(work / "model.safetensors"), out, "--layout",
             layout("heads", LAYOUT.replace('"encoder.layers.{i}.norm1.gamma"',
                                            '"encoder.layers.{i}.norm1.gamma heads_in"'))], None, "6"),
        "pad_token_id 1e999": (["convert", directory("bert", "pad_token_id", "1e999"), out], None, "6"),
        "tie_word_embeddings \"false\"": (["convert", directory("gpt2", "tie_word_embeddings", '"false"'), out],
                                          None, "7"),
        "pad_token_id 3.7": (["convert", directory("bert", "pad_token_id", "3.7"), out], None, "7"),
        "pad_token_id true": (["convert", directory("bert", "pad_token_id", "true"), out], None, "7"),
        "pad_token_id \"0\"": (["convert", directory("bert", "pad_token_id", '"0"'), out], None, "7"),
        "layout [config] norm_first = \"false\"": (
            ["convert", str(work / "model.safetensors"), out, "--layout",
             layout("bool", LAYOUT.replace("norm_first = false", 'norm_first = "false"'))], None, "7"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hostile-inputs-") as tmp:
        work = Path(tmp)
        cases = build(work)
        results = {}
        for name, (command, honest, item) in cases.items():
            results[name] = {"item": item, "command": " ".join(a.replace(tmp, "$TMP") for a in command),
                             **run_command(command, work), "honest": honest}
            results[name]["stderr"] = results[name]["stderr"].replace(tmp, "$TMP")
            print(f"{name}: exit {results[name]['exit']}, {results[name]['max_rss_mb']} MB, "
                  f"{results[name]['seconds']} s, {results[name]['stderr'][:150]}", file=sys.stderr, flush=True)
        written = sorted(p.name for p in work.glob("never*"))
        results["(no refused case wrote its output)"] = {"item": "", "exit": len(written), "written": written,
                                                         "honest": None}
    for name, row in results.items():
        if row["honest"]:
            row["rss_vs_honest"] = round(row["max_rss_mb"] / results[row["honest"]]["max_rss_mb"], 2)
    text = json.dumps(results, indent=1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
