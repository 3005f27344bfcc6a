"""Greedy decoding of 64 tokens with the key/value cache versus recomputing the whole prefix every step.

For each framework (each in its own process, so torch's and TensorFlow's thread pools never share the cores) and
each model (the reversal model of docs/training.md and the paper's base model, seeded weights), time
`reference_numpy.generate` over 64 new tokens with `cached_stepper` and with `recompute_stepper`, with
`torch.utils.benchmark` (median of blocked runs), check that both give the same tokens, and print the ratio.
Keras runs twice: each step as a `tf.function` (both paths compiled, the default of `tf_impl.decoding`) and eager.

    python -m benchmarks.bench_decoding [--length 64] [--frameworks torch,tf] [--models reverse,base]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import reference_numpy as rn

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "reverse": (lambda length: rn.TaskSpec().model_config(max_len=max(length + 1, 17)), 8),  # (config, batch)
    "base": (lambda length: rn.TransformerConfig.preset("base", dropout=0.0), 1),
}


def measure(framework: str, model_name: str, length: int, min_run_time: float) -> dict:
    """`framework`: torch, tf (each step one tf.function) or tf-eager (plain eager Keras)."""
    import torch
    from torch.utils.benchmark import Timer

    torch.set_num_threads(1)
    make_config, batch = MODELS[model_name]
    config = make_config(length)
    weights = rn.init_weights(config, seed=0)
    src = rn.sample_ids(config, batch, 16, config.src_vocab_size, seed=0)
    if framework == "torch":
        import torch_impl
        from torch_impl.decoding import cached_stepper, recompute_stepper
        model = torch_impl.Transformer.from_reference(config, weights)
    else:
        import functools

        import tf_impl
        from tf_impl import decoding
        model = tf_impl.Transformer.from_reference(config, weights)
        compiled = framework == "tf"
        cached_stepper = functools.partial(decoding.cached_stepper, compiled=compiled)
        recompute_stepper = functools.partial(decoding.recompute_stepper, compiled=compiled)

    def run(make_stepper):
        # eos_id=-1 never matches: exactly `length` steps whatever the weights choose
        return rn.generate(make_stepper(model, src), batch, bos_id=1, eos_id=-1, pad_id=config.pad_id,
                           max_new_tokens=length)

    tokens = {name: run(fn) for name, fn in (("cache", cached_stepper), ("recompute", recompute_stepper))}
    seconds = {}
    for name, fn in (("cache", cached_stepper), ("recompute", recompute_stepper)):
        timer = Timer(stmt="run(fn)", globals={"run": run, "fn": fn}, num_threads=1,
                      label=f"{framework} {model_name}", description=name)
        seconds[name] = timer.blocked_autorange(min_run_time=min_run_time).median
    return {"framework": framework, "model": model_name, "batch": batch, "length": length,
            "d_model": config.d_model, "layers": config.num_decoder_layers, "cache_s": seconds["cache"],
            "recompute_s": seconds["recompute"], "speedup": seconds["recompute"] / seconds["cache"],
            "same_tokens": bool(np.array_equal(tokens["cache"], tokens["recompute"]))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=64, help="new tokens per sequence (default 64)")
    parser.add_argument("--frameworks", default="torch,tf,tf-eager",
                        help="torch, tf (steps compiled with tf.function), tf-eager")
    parser.add_argument("--models", default="reverse,base")
    parser.add_argument("--min-run-time", type=float, default=3.0, help="seconds per timing (default 3)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    frameworks, models = args.frameworks.split(","), args.models.split(",")
    if args.child:
        for framework in frameworks:
            for model_name in models:
                print(json.dumps(measure(framework, model_name, args.length, args.min_run_time)), flush=True)
        return 0
    results = []
    for framework in frameworks:
        for model_name in models:
            command = [sys.executable, "-m", "benchmarks.bench_decoding", "--child", "--frameworks", framework,
                       "--models", model_name, "--length", str(args.length), "--min-run-time",
                       str(args.min_run_time)]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
            if done.returncode:
                sys.stderr.write(done.stderr)
                return done.returncode
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"greedy decoding of {args.length} new tokens, seeded weights, float32, 1 CPU thread, median of "
          f"torch.utils.benchmark blocked runs\n")
    print("| framework | model | batch | with cache | recomputing the prefix | speed-up | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        model = f"{r['model']} (d_model {r['d_model']}, {r['layers']} decoder layers)"
        print(f"| {r['framework']} | {model} | {r['batch']} | {r['cache_s'] * 1e3:.0f} ms | "
              f"{r['recompute_s'] * 1e3:.0f} ms | {r['speedup']:.2f}x | {'yes' if r['same_tokens'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
