"""The measurements behind `verify`'s tolerance: how many floors correct ports sit from the float64 judge, and how
many the planted porting faults do.

    python benchmarks/verify_calibration.py                       # torch and keras, 10 seeds per config
    python benchmarks/verify_calibration.py --seeds 40 --backends torch --json calibration.json

For every config below and every seed, the weights, the batch size and both lengths are drawn from the seed; each
correct backend runs at float32 and float64 and every sublayer's error / floor is recorded. Then every planted fault
(`transformer_parity.faults`) runs on a subset of configs and seeds; its error / floor at the sublayer where it
starts, and whether verify named that sublayer first, are recorded. The printed table is what the README's
"How verify decides" section quotes; K (`verify.RATIO_LIMIT`) must sit well above the first column and well
below the last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import reference_numpy as rn  # noqa: E402
from transformer_parity import faults, verify  # noqa: E402

TINY = rn.TransformerConfig.preset("tiny", dropout=0.0)
CONFIGS = {
    "post-ln": TINY,
    "pre-ln+final-norm": TINY.replace(norm_first=True, final_norm=True),
    "learned-pos": TINY.replace(positional="learned"),
    "concat-sinusoid": TINY.replace(sinusoid_layout="concatenated"),
    "gelu": TINY.replace(activation="gelu"),
    "tied": TINY.replace(tie_embeddings=True),
    "no-bias-unscaled": TINY.replace(bias=False, scale_embedding=False),
    "pad-id-3": TINY.replace(pad_id=3),
    "encoder-only": TINY.replace(num_decoder_layers=0, tgt_vocab_size=7),
    "one-head": TINY.replace(num_heads=1),
    "small": rn.TransformerConfig(src_vocab_size=1000, tgt_vocab_size=900, d_model=128, num_heads=8,
                                  num_encoder_layers=3, num_decoder_layers=3, d_ff=512, max_len=128, dropout=0.0),
}
FAULT_CONFIGS = ("post-ln", "pre-ln+final-norm", "gelu", "no-bias-unscaled", "small")


def shape_for(seed: int, config: rn.TransformerConfig) -> dict[str, int]:
    rng = np.random.default_rng([seed, 99])
    top = min(config.max_len, 40)
    return {"batch": int(rng.integers(1, 6)), "src_len": int(rng.integers(1, top + 1)),
            "tgt_len": int(rng.integers(1, top + 1))}


def correct_ports(seeds: int, backends: list[str]) -> dict[str, list[float]]:
    ratios: dict[str, list[float]] = {}
    for name, config in CONFIGS.items():
        for seed in range(seeds):
            weights = verify.seeded_weights(config, seed)
            reference = verify.Subject("reference", "numpy", config, weights)
            for dtype in ("float32", "float64"):
                subjects = [verify.Subject(b, b, config, weights) for b in backends]
                report = verify.judge_subjects(reference, subjects, dtype=dtype, seed=seed, **shape_for(seed, config))
                for row in report.rows:
                    key = f"{row.backends[0]} vs {row.backends[1]} {dtype}"
                    ratios.setdefault(key, []).append(row.ratio)
                if not report.passed:
                    print(f"  FALSE ALARM: {name} seed {seed} {dtype}: {report.first_divergence}", flush=True)
        print(f"  {name}: done", flush=True)
    return ratios


def planted(seeds: int, backends: list[str], configs=FAULT_CONFIGS) -> dict[str, list[tuple[float, bool]]]:
    results: dict[str, list[tuple[float, bool]]] = {}

    def record(fault: str, report: verify.Report, expected: str) -> None:
        at = max(r.ratio for r in report.rows if r.sublayer == expected and r.against_judge)
        results.setdefault(fault, []).append((at, report.first_divergence == expected))

    for name in configs:
        config = CONFIGS[name]
        for seed in range(seeds):
            shape = shape_for(seed, config)
            shape["src_len"] = max(shape["src_len"], 2)  # padding needs two positions to show
            weights = verify.seeded_weights(config, seed)
            reference = verify.Subject("reference", "numpy", config, weights)
            for backend in backends:
                for fault in faults.WEIGHT_FAULTS:
                    bad, expected = faults.apply_weight_fault(fault, config, weights)
                    report = verify.judge_subjects(reference, [verify.Subject(backend, backend, config, bad)],
                                                   seed=seed, **shape)
                    record(f"{fault} ({backend})", report, expected)
                for fault in faults.CONFIG_FAULTS:
                    wrong, expected = faults.config_fault(fault, config)
                    report = verify.judge_subjects(reference, [verify.Subject(backend, backend, wrong, weights)],
                                                   seed=seed, **shape)
                    record(f"{fault} ({backend})", report, expected)
                for fault, (plant, expected_of) in faults.CODE_FAULTS.items():
                    with plant(backend, config):
                        report = verify.judge_subjects(reference, [verify.Subject(backend, backend, config, weights)],
                                                       seed=seed, **shape)
                    record(f"{fault} ({backend})", report, expected_of(config))
        print(f"  faults on {name}: done", flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="seeds per config for correct ports (default 10)")
    parser.add_argument("--fault-seeds", type=int, default=3, help="seeds per config for planted faults")
    parser.add_argument("--backends", default=",".join(verify.available_backends()),
                        help="comma-separated: torch,keras (default: installed)")
    parser.add_argument("--base", action="store_true",
                        help="also plant every fault in the base preset (one seed, adds minutes)")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    start = time.perf_counter()
    print(f"correct ports: {len(CONFIGS)} configs x {args.seeds} seeds x float32/float64, backends {backends}")
    ratios = correct_ports(args.seeds, backends)
    print(f"planted faults: {len(FAULT_CONFIGS)} configs x {args.fault_seeds} seeds")
    fault_results = planted(args.fault_seeds, backends)
    if args.base:
        CONFIGS["base"] = rn.TransformerConfig.preset("base", dropout=0.0)
        print("planted faults: base preset x 1 seed")
        for key, values in planted(1, backends, ("base",)).items():
            fault_results.setdefault(key.replace(" (", " (base, "), []).extend(values)

    print(f"\nK = verify.RATIO_LIMIT = {verify.RATIO_LIMIT:g} (pairs of backends: {verify.PAIR_RATIO_LIMIT:g})\n")
    print(f"{'correct port (error / floor)':44s} {'rows':>7s} {'median':>8s} {'p99.9':>8s} {'max':>8s}")
    for key, values in sorted(ratios.items()):
        v = np.asarray(values)
        print(f"{key:44s} {v.size:7d} {np.median(v):8.3f} {np.quantile(v, 0.999):8.3f} {v.max():8.3f}")
    print(f"\n{'planted fault (error / floor where it starts)':44s} {'runs':>7s} {'min':>10s} {'median':>10s} "
          f"{'localized':>10s}")
    for key, values in sorted(fault_results.items()):
        at = np.asarray([r for r, _ in values])
        hits = sum(ok for _, ok in values)
        print(f"{key:44s} {len(values):7d} {at.min():10.3g} {np.median(at):10.3g} {hits:>5d}/{len(values):<4d}")
    worst_correct = max((max(v) for v in ratios.values()), default=float("nan"))
    weakest_fault = min((min(r for r, _ in v) for v in fault_results.values()), default=float("nan"))
    print(f"\nlargest correct-port ratio {worst_correct:.3f}; smallest planted-fault ratio {weakest_fault:.3g}; "
          f"K = {verify.RATIO_LIMIT:g}; {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"ratio_limit": verify.RATIO_LIMIT, "correct": ratios,
                                               "faults": fault_results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
