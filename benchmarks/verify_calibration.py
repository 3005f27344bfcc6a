"""The measurements behind `verify`'s tolerance: how many floors correct ports sit from the float64 judge, and how
many the planted porting faults do.

    python benchmarks/verify_calibration.py                       # torch and keras, 10 seeds per config
    python benchmarks/verify_calibration.py --seeds 40 --backends torch --json calibration.json

For every config below and every seed, the weights, the batch size and both lengths are drawn from the seed; each
correct backend runs at float32 and float64 and every sublayer's error / floor is recorded. Then every planted fault
(`parity_tests.support.faults`) runs on a subset of configs and seeds; its error / floor at the sublayer where it
starts, and whether verify named that sublayer first, are recorded. The printed table is what docs/verify.md
quotes; K (`verify.RATIO_LIMIT`) must sit well above the first column and well below the last.

    python benchmarks/verify_calibration.py --sensitivity 5 --backends torch

measures instead what an output-only comparison can see: per kind of weight (q, k, v, o, ffn, norms, embeddings,
and the key bias), float32 and float64, the smallest relative change of one element that makes the output
comparison fail, by bisection (docs/verify.md, "What an output comparison can see").

    python benchmarks/verify_calibration.py --dtype bfloat16 --seeds 10 --fault-seeds 2

calibrates reduced-precision verify instead (`transformer_parity.verify.lowp.RATIO_LIMIT`): the same two measurements in
bfloat16 or float16, for models cast to that dtype and for autocast, on LOWP_CONFIGS (docs/verify.md, "Reduced
precision").
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
from parity_tests.support import faults  # noqa: E402
from parity_tests.support.variants import FAMILIES, TINY, VARIANTS  # noqa: E402
from transformer_parity import verify  # noqa: E402

CONFIGS = {
    **{name: VARIANTS[name] for name in ("post-ln", "pre-ln+final-norm", "learned-pos", "concat-sinusoid", "gelu",
                                         "tied", "no-bias-unscaled", "pad-id-3", "encoder-only")},
    "one-head": TINY.replace(num_heads=1),
    "small": rn.TransformerConfig(src_vocab_size=1000, tgt_vocab_size=900, d_model=128, num_heads=8,
                                  num_encoder_layers=3, num_decoder_layers=3, d_ff=512, max_len=128, dropout=0.0),
}
FAULT_CONFIGS = ("post-ln", "pre-ln+final-norm", "gelu", "no-bias-unscaled", "small")

# --dtype bfloat16 / float16: a decoder-only model (GPT-2's switches) besides encoder-decoder ones.
LOWP_CONFIGS = {**{name: CONFIGS[name] for name in ("post-ln", "pre-ln+final-norm", "gelu", "small")},
                "gpt2-like": FAMILIES["gpt2-like"]}


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


def _fault_run(config, seed: int) -> tuple[dict, dict, verify.Subject]:
    """`(shape, weights, reference subject)` of one planted-fault run."""
    shape = shape_for(seed, config)
    shape["src_len"] = max(shape["src_len"], 2)  # padding needs two positions to show
    weights = verify.seeded_weights(config, seed)
    return shape, weights, verify.Subject("reference", "numpy", config, weights)


def _record(results: dict, fault: str, report: verify.Report, expected: str) -> None:
    """A planted fault's error / floor where it starts (`expected`), and whether verify named that sublayer."""
    at = max(r.ratio for r in report.rows if r.sublayer == expected and r.against_judge)
    results.setdefault(fault, []).append((at, report.first_divergence == expected))


def planted(seeds: int, backends: list[str], configs=FAULT_CONFIGS) -> dict[str, list[tuple[float, bool]]]:
    results: dict[str, list[tuple[float, bool]]] = {}

    for name in configs:
        config = CONFIGS[name]
        for seed in range(seeds):
            shape, weights, reference = _fault_run(config, seed)
            for backend in backends:
                for fault in faults.WEIGHT_FAULTS:
                    bad, expected = faults.apply_weight_fault(fault, config, weights)
                    report = verify.judge_subjects(reference, [verify.Subject(backend, backend, config, bad)],
                                                   seed=seed, **shape)
                    _record(results, f"{fault} ({backend})", report, expected)
                for fault in faults.CONFIG_FAULTS:
                    wrong, expected = faults.config_fault(fault, config)
                    report = verify.judge_subjects(reference, [verify.Subject(backend, backend, wrong, weights)],
                                                   seed=seed, **shape)
                    _record(results, f"{fault} ({backend})", report, expected)
                for fault, (plant, expected_of) in faults.CODE_FAULTS.items():
                    with plant(backend, config):
                        report = verify.judge_subjects(reference, [verify.Subject(backend, backend, config, weights)],
                                                       seed=seed, **shape)
                    _record(results, f"{fault} ({backend})", report, expected_of(config))
        print(f"  faults on {name}: done", flush=True)
    return results


# --- reduced precision: --dtype bfloat16 / float16 -----------------------------------------------------------------

def calibrate_lowp(dtype: str, seeds: int, fault_seeds: int, backends: list[str], autocast_modes=(False, True)):
    """Correct ports' error / floor and planted faults' error / floor where they start, in `dtype` (plain and
    autocast), on LOWP_CONFIGS."""
    from transformer_parity.verify import lowp

    ratios: dict[str, list[float]] = {}
    results: dict[str, list[tuple[float, bool]]] = {}
    for autocast in autocast_modes:
        mode = f"{dtype}{' autocast' if autocast else ''}"
        for name, config in LOWP_CONFIGS.items():
            for seed in range(seeds):
                shape = shape_for(seed, config)
                weights = verify.seeded_weights(config, seed)
                reference = verify.Subject("reference", "numpy", config, weights)
                subjects = [verify.Subject(b, b, config, weights) for b in backends]
                report = verify.judge_subjects(reference, subjects, dtype=dtype, autocast=autocast, seed=seed,
                                               **shape)
                for row in report.rows:
                    ratios.setdefault(f"{row.backends[0]} vs {row.backends[1]} {mode}", []).append(row.ratio)
                if not report.passed:
                    print(f"  FALSE ALARM: {name} seed {seed} {mode}: {report.first_divergence}", flush=True)
            for seed in range(fault_seeds):
                shape, weights, reference = _fault_run(config, seed)
                for backend in backends:
                    for fault, port, bad, plant, expected in faults.fault_cases(config, weights, backend):
                        with plant:
                            report = verify.judge_subjects(reference, [verify.Subject(backend, backend, port, bad)],
                                                           dtype=dtype, autocast=autocast, seed=seed, **shape)
                        _record(results, f"{fault} ({backend}, {mode})", report, expected)
            print(f"  {mode} {name}: done", flush=True)
    return ratios, results


def print_ratio_tables(ratios, results, limit_name: str, limit: float, pair_limit: float) -> None:
    """The two calibration tables: correct ports' error/floor (median, p99.9, max) and planted faults' error/floor
    where each starts, with how many runs named the right sublayer."""
    print(f"\nK = {limit_name} = {limit:g} (pairs of backends: {pair_limit:g})\n")
    print(f"{'correct port (error / floor)':52s} {'rows':>7s} {'median':>8s} {'p99.9':>8s} {'max':>8s}")
    for key, values in sorted(ratios.items()):
        v = np.asarray(values)
        print(f"{key:52s} {v.size:7d} {np.median(v):8.3f} {np.quantile(v, 0.999):8.3f} {v.max():8.3f}")
    print(f"\n{'planted fault (error / floor where it starts)':52s} {'runs':>7s} {'min':>10s} {'median':>10s} "
          f"{'localized':>10s}")
    for key, values in sorted(results.items()):
        at = np.asarray([r for r, _ in values])
        hits = sum(ok for _, ok in values)
        print(f"{key:52s} {len(values):7d} {at.min():10.3g} {np.median(at):10.3g} {hits:>5d}/{len(values):<4d}")


def print_lowp(ratios, results) -> None:
    from transformer_parity.verify import lowp

    print_ratio_tables(ratios, results, "lowp.RATIO_LIMIT", lowp.RATIO_LIMIT, lowp.PAIR_RATIO_LIMIT)
    judged = [max(v) for k, v in ratios.items() if "numpy-f64" in k]
    print(f"\nlargest correct-port ratio against the judge {max(judged):.3f}; K = {lowp.RATIO_LIMIT:g}")


# --- sensitivity: the smallest single-element change an output comparison sees -------------------------------------

# Kinds of weight and the canonical names they cover (every layer, encoder and decoder).
KINDS = {
    "q kernel": r"\.(self_attn|cross_attn)\.q\.kernel$",
    "k kernel": r"\.(self_attn|cross_attn)\.k\.kernel$",
    "v kernel": r"\.(self_attn|cross_attn)\.v\.kernel$",
    "o kernel": r"\.(self_attn|cross_attn)\.o\.kernel$",
    "ffn kernels": r"\.ffn\.linear[12]\.kernel$",
    "norms (gamma, beta)": r"\.norm\d\.(gamma|beta)$",
    "embeddings (rows in use)": r"^(src|tgt)_embed\.embedding$",
    "k bias": r"\.(self_attn|cross_attn)\.k\.bias$",
}
SENSITIVITY_SHAPE = {"batch": 2, "src_len": 12, "tgt_len": 10}
LARGEST_NUDGE = 1.0  # relative; a change not seen at +100% is reported as not seen


def _detected(reference, backend: str, config, weights, name: str, flat: int, relative: float, dtype: str,
              seed: int) -> bool:
    nudged = dict(weights)
    value = nudged[name].copy()
    value.flat[flat] = value.flat[flat] * (1 + relative)
    nudged[name] = value
    report = verify.judge_subjects(reference, [verify.Subject(backend, backend, config, nudged)], dtype=dtype,
                                   seed=seed, **SENSITIVITY_SHAPE)
    return not report.passed


def smallest_detected(reference, backend, config, weights, name, flat, dtype, seed, steps: int = 15) -> float:
    """Bisection (in log space, between 1e-17 and LARGEST_NUDGE, to a factor of ~1.3) for the smallest relative
    change of one element that makes verify's output comparison fail; inf if even LARGEST_NUDGE passes. Assumes the
    failure is monotonic in the size of the change, which holds near the threshold (the error grows linearly with
    it)."""
    if not _detected(reference, backend, config, weights, name, flat, LARGEST_NUDGE, dtype, seed):
        return float("inf")
    low, high = -17.0, float(np.log10(LARGEST_NUDGE))
    for _ in range(steps):
        mid = (low + high) / 2
        if _detected(reference, backend, config, weights, name, flat, 10 ** mid, dtype, seed):
            high = mid
        else:
            low = mid
    return 10 ** high


def sensitivity(backend: str, trials: int, config=TINY, seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """Per kind of weight and dtype, the smallest detected relative nudge of `trials` random single elements (random
    tensor of that kind, random element; embeddings: an element of a row whose token the batch uses)."""
    import re

    src, tgt = rn.sample_batch(config, SENSITIVITY_SHAPE["batch"], SENSITIVITY_SHAPE["src_len"],
                               SENSITIVITY_SHAPE["tgt_len"], seed)
    used = {"src_embed.embedding": np.unique(src), "tgt_embed.embedding": np.unique(tgt)}
    results: dict[str, dict[str, list[float]]] = {}
    for dtype in ("float32", "float64"):
        weights = verify.seeded_weights(config, seed, np.dtype(dtype))
        reference = verify.Subject("reference", "numpy", config, weights)
        rng = np.random.default_rng([seed, 1234])
        for kind, pattern in KINDS.items():
            names = sorted(n for n in weights if re.search(pattern, n))
            found = []
            for _ in range(trials):
                name = names[int(rng.integers(len(names)))]
                shape = weights[name].shape
                if name in used:
                    row = int(rng.choice(used[name]))
                    flat = int(np.ravel_multi_index((row, int(rng.integers(shape[1]))), shape))
                else:
                    flat = int(rng.integers(weights[name].size))
                found.append(smallest_detected(reference, backend, config, weights, name, flat, dtype, seed))
            results.setdefault(kind, {})[dtype] = found
            print(f"  {kind} {dtype}: done", flush=True)
    return results


def print_sensitivity(results, backend: str, trials: int) -> None:
    print(f"\nsmallest single-element relative change the output comparison detects ({backend} against the judge, "
          f"tiny preset, batch {SENSITIVITY_SHAPE['batch']}, source {SENSITIVITY_SHAPE['src_len']}, target "
          f"{SENSITIVITY_SHAPE['tgt_len']}; {trials} random elements per row; 'not seen': not detected even at "
          f"+{LARGEST_NUDGE:.0%})")
    print(f"{'kind of weight':26s} {'dtype':8s} {'min':>9s} {'median':>9s} {'max':>9s} {'not seen':>9s}")
    for kind, by_dtype in results.items():
        for dtype, values in by_dtype.items():
            v = np.asarray(values)
            seen = v[np.isfinite(v)]
            cells = [f"{x:9.1e}" for x in (seen.min(), np.median(v), seen.max())] if seen.size else ["-"] * 3
            if seen.size and not np.isfinite(np.median(v)):
                cells[1] = f"{'not seen':>9s}"
            print(f"{kind:26s} {dtype:8s} {cells[0]:>9s} {cells[1]:>9s} {cells[2]:>9s} "
                  f"{int(np.sum(~np.isfinite(v))):>5d}/{v.size:<3d}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="seeds per config for correct ports (default 10)")
    parser.add_argument("--fault-seeds", type=int, default=3, help="seeds per config for planted faults")
    parser.add_argument("--backends", default=",".join(verify.available_backends()),
                        help="comma-separated: torch,keras (default: installed)")
    parser.add_argument("--base", action="store_true",
                        help="also plant every fault in the base preset (one seed, adds minutes)")
    parser.add_argument("--json", help="write the raw figures here")
    parser.add_argument("--sensitivity", type=int, metavar="TRIALS", default=0,
                        help="instead: the smallest single-element nudge the output comparison detects, per kind of "
                             "weight, TRIALS random elements each, against the first backend")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"),
                        help="instead: calibrate reduced-precision verify in this dtype, plain and --autocast, on "
                             "LOWP_CONFIGS (a decoder-only model among them)")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    start = time.perf_counter()
    if args.dtype:
        print(f"{args.dtype}: {len(LOWP_CONFIGS)} configs x {args.seeds} seeds (faults: {args.fault_seeds} seeds), "
              f"plain and autocast, backends {backends}")
        ratios, results = calibrate_lowp(args.dtype, args.seeds, args.fault_seeds, backends)
        print_lowp(ratios, results)
        print(f"\n{time.perf_counter() - start:.0f} s")
        if args.json:
            Path(args.json).write_text(json.dumps({"dtype": args.dtype, "correct": ratios, "faults": results}))
        return 0
    if args.sensitivity:
        results = sensitivity(backends[0], args.sensitivity)
        print_sensitivity(results, backends[0], args.sensitivity)
        print(f"\n{time.perf_counter() - start:.0f} s")
        if args.json:
            Path(args.json).write_text(json.dumps({"sensitivity": results}))
        return 0
    print(f"correct ports: {len(CONFIGS)} configs x {args.seeds} seeds x float32/float64, backends {backends}")
    ratios = correct_ports(args.seeds, backends)
    print(f"planted faults: {len(FAULT_CONFIGS)} configs x {args.fault_seeds} seeds")
    fault_results = planted(args.fault_seeds, backends)
    if args.base:
        CONFIGS["base"] = rn.TransformerConfig.preset("base", dropout=0.0)
        print("planted faults: base preset x 1 seed")
        for key, values in planted(1, backends, ("base",)).items():
            fault_results.setdefault(key.replace(" (", " (base, "), []).extend(values)

    print_ratio_tables(ratios, fault_results, "verify.RATIO_LIMIT", verify.RATIO_LIMIT, verify.PAIR_RATIO_LIMIT)
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
