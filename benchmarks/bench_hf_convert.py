"""Hugging Face checkpoints, measured: how far transformers, torch_impl and tf_impl land from the float64 reference on
imported GPT-2, BERT (masked LM) and Marian models, and what converting a GPT-2-small-shaped directory to Keras and
back costs in time and peak memory.

    python -m benchmarks.bench_hf_convert                  # everything (GPT-2 small: ~500 MB, a few minutes)
    python -m benchmarks.bench_hf_convert --skip-large     # the three small models only

Each model is built by transformers from a config with random weights (every parameter perturbed, as in
parity_tests/test_hf.py), saved with `save_pretrained`, and imported with `formats.load`. Errors are the max abs
difference of the logits from the float64 reference at the real (unpadded) positions of a right-padded batch; the
floor is NumPy float32's own difference, and `verify` runs every sublayer (torch and Keras) under its rule.
`convert` runs in a fresh process under `/usr/bin/time -v` (peak RSS of the whole process). Results go to
`benchmarks/results/hf/` as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "hf"

SMALL = {
    "gpt2 (2x64)": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=101,
                                                          n_positions=64, bos_token_id=100, eos_token_id=100)),
    "bert-mlm (2x64)": ("BertForMaskedLM", "BertConfig", dict(hidden_size=64, num_hidden_layers=2,
                                                              num_attention_heads=4, intermediate_size=128,
                                                              vocab_size=101, max_position_embeddings=64,
                                                              pad_token_id=100)),
    "marian (2+2x64)": ("MarianMTModel", "MarianConfig", dict(d_model=64, encoder_layers=2, decoder_layers=2,
                                                              encoder_attention_heads=4, decoder_attention_heads=4,
                                                              encoder_ffn_dim=128, decoder_ffn_dim=128,
                                                              vocab_size=101, max_position_embeddings=64,
                                                              pad_token_id=100, decoder_start_token_id=100,
                                                              eos_token_id=0, activation_function="swish",
                                                              scale_embedding=True)),
}
LARGE = {"gpt2-small shape (12x768, 50257)": ("GPT2LMHeadModel", "GPT2Config", {})}  # GPT2Config's defaults


def build(cls_name: str, config_name: str, fields: dict, path: Path, seed: int = 0):
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**fields)).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "embed_positions" not in key:
                p.add_(0.1 * torch.randn_like(p))
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0, 0.5)
    model.save_pretrained(path)
    return model


def padded_inputs(config, length: int, seed: int = 0):
    import torch

    rng = np.random.default_rng(seed)
    pad = config.pad_id
    src = rng.integers(0, min(config.src_vocab_size, config.tgt_vocab_size), size=(2, length))
    if pad is not None:  # GPT-2 has no pad token: every id is real there, and the mask says what is padding
        src[src == pad] = (pad + 1) % config.tgt_vocab_size
    mask = np.ones((2, length), bool)
    mask[1, length * 2 // 3:] = False
    src[~mask] = 0 if pad is None else pad
    hf = {"input_ids": torch.as_tensor(src), "attention_mask": torch.as_tensor(mask.astype(np.int64))}
    if config.is_decoder_only:
        return (src,), {"src_mask": mask}, hf, mask
    if config.is_encoder_only:
        return (src,), {"src_mask": mask}, hf, mask
    tgt = rng.integers(1, config.tgt_vocab_size, size=(2, length - 2))
    tgt[tgt == pad] = 1
    tgt[:, 0] = pad  # Marian's decoder start
    tgt_mask = np.ones(tgt.shape, bool)
    hf.update(decoder_input_ids=torch.as_tensor(tgt))
    return (src, tgt), {"src_mask": mask, "tgt_mask": tgt_mask}, hf, tgt_mask


def accuracy(label: str, spec, workdir: Path, length: int) -> dict:
    import copy

    import torch

    import reference_numpy as rn
    import tf_impl
    import torch_impl
    from transformer_parity import formats, verify

    path = workdir / re.sub(r"\W+", "-", label)
    start = time.perf_counter()
    model = build(*spec, path)
    loaded = formats.load(path)
    config, weights = loaded.config, loaded.weights
    args, kwargs, hf_kwargs, mask = padded_inputs(config, length)
    desired = rn.Transformer(config, weights, np.float64)(*args, **kwargs)[mask]
    row = {"model": label, "parameters": int(sum(v.size for v in weights.values())),
           "floor (numpy f32)": _err(rn.Transformer(config, weights, np.float32)(*args, **kwargs)[mask], desired)}
    for dtype in ("float32", "float64"):
        m = copy.deepcopy(model).to(getattr(torch, dtype))
        if dtype == "float64" and hasattr(m, "model") and hasattr(m.model, "encoder") and \
                hasattr(m.model.encoder, "embed_positions"):
            exact = torch.as_tensor(rn.sinusoidal_positions(config.max_len, config.d_model, config.sinusoid_layout))
            with torch.no_grad():  # transformers computes the fixed table in float32 even for a float64 model
                m.model.encoder.embed_positions.weight.copy_(exact)
                m.model.decoder.embed_positions.weight.copy_(exact)
        with torch.no_grad():
            out = m(**hf_kwargs)
        row[f"transformers {dtype}"] = _err(out.logits.double().numpy()[mask], desired)
        del m
        tm = torch_impl.Transformer.from_reference(config, weights, dtype=getattr(torch, dtype))
        with torch.no_grad():
            row[f"torch_impl {dtype}"] = _err(tm(*args, **kwargs).double().numpy()[mask], desired)
        del tm
        km = tf_impl.Transformer.from_reference(config, weights, dtype=dtype)
        row[f"tf_impl {dtype}"] = _err(np.asarray(km(*args, **kwargs), np.float64)[mask], desired)
        del km
    for dtype in ("float32", "float64"):
        report = verify.run(verify.Request([path], dtype=dtype, batch=2, src_len=length, tgt_len=length - 2))
        row[f"verify {dtype}"] = (f"{'pass' if report.passed else 'FAIL'}, max {report.max_ratio():.2f} floors "
                                  f"over {len(report.sublayers)} sublayers")
    row["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(row), flush=True)
    return row


def _err(actual: np.ndarray, desired: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(actual, np.float64) - desired)))


def timed_convert(args: list[str]) -> dict:
    """`transformer-parity convert ARGS` in a fresh process under /usr/bin/time -v: wall seconds, peak RSS."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "transformer_parity", "convert", "-q", *args]
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr[-2000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)[1])
    return {"command": "transformer-parity convert " + " ".join(Path(a).name if "/" in a else a for a in args),
            "seconds": round(seconds, 1), "peak_rss_mb": round(peak_kb / 1024, 1)}


def baseline_rss_mb() -> float:
    """Peak RSS of a process that only imports what convert imports (the interpreter, NumPy, h5py)."""
    code = "import numpy, h5py, transformer_parity.formats, transformer_parity.cli"
    result = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO)
    return round(int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)[1]) / 1024, 1)


def conversion(workdir: Path) -> dict:
    path = workdir / "gpt2-small"
    if not path.exists():
        build(*LARGE["gpt2-small shape (12x768, 50257)"], path)
    size_mb = sum(f.stat().st_size for f in path.iterdir()) / 2**20
    rows = [timed_convert([str(path), str(workdir / "gpt2-small.weights.h5")]),
            timed_convert([str(workdir / "gpt2-small.weights.h5"), str(workdir / "gpt2-small-back"), "--to", "hf"])]
    for row in rows:
        row["peak / checkpoint"] = round(row["peak_rss_mb"] / size_mb, 2)
    from transformer_parity.layouts import hf_dir

    a, b = hf_dir.read_state(path), hf_dir.read_state(workdir / "gpt2-small-back")
    identical = sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    return {"checkpoint_mb": round(size_mb, 1), "baseline_rss_mb": baseline_rss_mb(), "rows": rows,
            "round_trip_bit_identical": identical}


def markdown(results: dict) -> str:
    lines = []
    acc = results["accuracy"]
    if acc:
        cols = [k for k in acc[0] if k not in ("seconds",)]
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for row in acc:
            lines.append("| " + " | ".join(f"{row[c]:.1e}" if isinstance(row[c], float) else str(row[c])
                                           for c in cols) + " |")
    conv = results.get("conversion")
    if conv:
        lines += ["", f"GPT-2-small-shaped directory: {conv['checkpoint_mb']} MiB; a process importing what convert "
                      f"imports peaks at {conv['baseline_rss_mb']} MiB; round trip bit-identical: "
                      f"{conv['round_trip_bit_identical']}.", "",
                  "| command | seconds | peak RSS (MiB) | peak / checkpoint |", "|---|---|---|---|"]
        lines += [f"| `{r['command']}` | {r['seconds']} | {r['peak_rss_mb']} | {r['peak / checkpoint']} |"
                  for r in conv["rows"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-large", action="store_true", help="only the small models (no 500 MB GPT-2)")
    parser.add_argument("--length", type=int, default=24, help="sequence length of the padded batch")
    parser.add_argument("--workdir", help="where to build the model directories (default: a temporary one)")
    parser.add_argument("--out", default=str(RESULTS), help="results directory")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        models = dict(SMALL) if args.skip_large else {**SMALL, **LARGE}
        results = {"accuracy": [accuracy(label, spec, workdir, args.length) for label, spec in models.items()]}
        if not args.skip_large:
            results["conversion"] = conversion(workdir)
            print(json.dumps(results["conversion"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_hf_convert.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "bench_hf_convert.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
