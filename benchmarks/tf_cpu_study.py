"""Why TensorFlow attention is slow on the CPU, measured: `python -m benchmarks.tf_cpu_study [--seq 1024]`.

Each configuration runs in a fresh process, because TensorFlow reads its oneDNN switch (`TF_ENABLE_ONEDNN_OPTS`)
at import and fixes its thread pools at start-up. Within a process the variants are timed in interleaved rounds
(every variant once per round) so that a noisy neighbour hurts them alike; PyTorch's fused kernel, the yardstick,
runs in its own process with the same thread count (two frameworks' spinning worker threads in one process would
slow each other down). Reported: the median over rounds, and GFLOP/s by the benchmark's FLOP convention.

Parts: the whole attention (B4 H8 N1024 D64 float32 by default) by path and configuration, then its pieces (the
score matmul, the softmax, the value matmul) for one 128-query block and for the whole sequence.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CONFIGS = {  # name -> (environment, intra-op threads, inter-op threads); None = the run's --threads
    "default (intra=inter=threads)": ({}, None, None),
    "inter-op 1": ({}, None, 1),
    "oneDNN off": ({"TF_ENABLE_ONEDNN_OPTS": "0"}, None, None),
    "1 thread": ({}, 1, 1),
}
TF_VARIANTS = ("tf_impl explicit, tf.function", "tf_impl explicit, XLA", "keras.ops.dot_product_attention, "
               "tf.function", "keras.ops.dot_product_attention, XLA", "tf_impl blockwise, tf.function",
               "tf_impl blockwise, XLA")


def _rounds(variants: dict, rounds: int) -> dict[str, float]:
    for fn in variants.values():  # first calls: tracing and compilation
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def _worker(spec: dict) -> dict[str, float]:
    import numpy as np
    b, h, n, d = spec["shape"]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32) for _ in range(3))
    if spec["framework"] == "torch":
        import torch
        import torch.nn.functional as F
        torch.set_num_threads(spec["intra"])
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        s, block = tq @ tk.transpose(-1, -2), tq[:, :, :128] @ tk.transpose(-1, -2)
        variants = {"torch F.scaled_dot_product_attention (flash, cpu)": lambda: F.scaled_dot_product_attention(
            tq, tk, tv)}
        if spec.get("parts"):
            variants.update({
                "part: scores, whole sequence": lambda: tq @ tk.transpose(-1, -2),
                "part: scores, one 128-query block": lambda: tq[:, :, :128] @ tk.transpose(-1, -2),
                "part: softmax, one block": lambda: torch.softmax(block, -1),
                "part: values, one block": lambda: block @ tv,
                "part: softmax, whole sequence": lambda: torch.softmax(s, -1),
            })
        with torch.no_grad():
            return _rounds(variants, spec["rounds"])

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tf_impl.startup import tf  # before keras: its import loads TensorFlow
    import keras
    tf.config.threading.set_intra_op_parallelism_threads(spec["intra"])
    tf.config.threading.set_inter_op_parallelism_threads(spec["inter"])
    import tf_impl.attention as ta
    tq, tk, tv = (tf.constant(a) for a in (q, k, v))
    bq, bk, bv = (tf.constant(a.transpose(0, 2, 1, 3)) for a in (q, k, v))  # keras layout (B, T, H, d)

    def traced(fn, xla=False):
        return tf.function(fn, jit_compile=xla)

    explicit = lambda q, k, v: ta.scaled_dot_product_attention(q, k, v, impl="explicit")[0]  # noqa: E731
    blockwise = lambda q, k, v: ta.scaled_dot_product_attention(q, k, v, impl="blockwise")[0]  # noqa: E731
    dpa = lambda q, k, v: keras.ops.dot_product_attention(q, k, v)  # noqa: E731
    fns = {TF_VARIANTS[0]: (traced(explicit), "bhtd"), TF_VARIANTS[1]: (traced(explicit, True), "bhtd"),
           TF_VARIANTS[2]: (traced(dpa), "bthd"), TF_VARIANTS[3]: (traced(dpa, True), "bthd"),
           TF_VARIANTS[4]: (traced(blockwise), "bhtd"), TF_VARIANTS[5]: (traced(blockwise, True), "bhtd")}
    variants = {name: (lambda f=f, args=((tq, tk, tv) if layout == "bhtd" else (bq, bk, bv)): f(*args))
                for name, (f, layout) in fns.items()}
    if spec.get("parts"):
        scores = traced(lambda q, k: tf.matmul(q, k, transpose_b=True))
        scores_xla = traced(lambda q, k: tf.matmul(q, k, transpose_b=True), True)
        softmax = traced(lambda s: tf.nn.softmax(s, -1))
        values = traced(lambda p, v: tf.matmul(p, v))
        values_xla = traced(lambda p, v: tf.matmul(p, v), True)
        block_q = tf.constant(q[:, :, :128])
        block = scores(block_q, tk)
        whole = scores(tq, tk)
        variants.update({
            "part: scores, whole sequence": lambda: scores(tq, tk),
            "part: scores, one 128-query block": lambda: scores(block_q, tk),
            "part: scores, one 128-query block, XLA": lambda: scores_xla(block_q, tk),
            "part: softmax, one block": lambda: softmax(block),
            "part: values, one block": lambda: values(block, tv),
            "part: values, one block, XLA": lambda: values_xla(block, tv),
            "part: softmax, whole sequence": lambda: softmax(whole),
        })
    return _rounds(variants, spec["rounds"])


def _spawn(spec: dict, env: dict) -> dict[str, float]:
    cmd = [sys.executable, "-m", "benchmarks.tf_cpu_study", "--worker", json.dumps(spec)]
    result = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if result.returncode != 0:
        raise RuntimeError(f"worker failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tf_cpu_study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: "
                        + ", ".join(CONFIGS))
    parser.add_argument("--no-parts", action="store_true", help="skip the per-piece timings")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    gflop = 4 * args.batch * args.heads * args.seq ** 2 * args.head_dim / 1e9
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown config(s) {unknown}; choose from {list(CONFIGS)}")
    print(f"attention B{shape[0]} H{shape[1]} N{shape[2]} D{shape[3]} float32, {gflop:.2f} GFLOP per call; "
          f"threads {args.threads}; median of {args.rounds} interleaved rounds")
    results = {}
    for name in names:
        env, intra, inter = CONFIGS[name]
        intra, inter = intra or args.threads, inter or args.threads
        parts = not args.no_parts and name == names[0]
        torch_spec = {"framework": "torch", "shape": shape, "intra": intra, "rounds": args.rounds, "parts": parts}
        torch_ms = _spawn(torch_spec, {})
        tf_ms = _spawn({"framework": "tf", "shape": shape, "intra": intra, "inter": inter, "rounds": args.rounds,
                        "parts": parts}, env)
        again = _spawn({**torch_spec, "parts": False}, {})  # PyTorch before and after: the load may drift
        results[name] = (torch_ms, tf_ms)
        before, after = next(iter(torch_ms.values())), next(iter(again.values()))
        yardstick = (before + after) / 2
        print(f"\n## {name}: TensorFlow intra-op {intra}, inter-op {inter} {env or ''}")
        print(f"(PyTorch measured before and after TensorFlow: {1e3 * before:.1f} and {1e3 * after:.1f} ms; "
              "their mean is the yardstick)")
        print(f"| path | median ms | GFLOP/s | vs PyTorch fused |\n|---|---|---|---|")
        print(f"| {next(iter(torch_ms))} | {1e3 * yardstick:.1f} | {gflop / yardstick:.1f} | 1.00 |")
        for variant, seconds in tf_ms.items():
            if not variant.startswith("part:"):
                print(f"| {variant} | {1e3 * seconds:.1f} | {gflop / seconds:.1f} | {yardstick / seconds:.2f} |")
        if parts:
            print("\n| piece | PyTorch ms | TensorFlow ms | TF XLA ms |\n|---|---|---|---|")
            for piece in ("scores, whole sequence", "scores, one 128-query block", "softmax, whole sequence",
                          "softmax, one block", "values, one block"):
                t = torch_ms.get(f"part: {piece}")
                f = tf_ms.get(f"part: {piece}")
                x = tf_ms.get(f"part: {piece}, XLA")
                cells = ["" if s is None else f"{1e3 * s:.2f}" for s in (t, f, x)]
                print(f"| {piece} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
