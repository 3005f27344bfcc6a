"""The whole-model benchmark (`transformer-parity bench model`): forward, a training step and greedy generation of
one Transformer in every framework and mode, from the same canonical weights, checked against the float64 NumPy
reference while timed.

Method, per problem (a model config, a shape, a task and a dtype) — the attention benchmark's, on the shared
`harness`, `timing` and `machine`:
1. the float64 reference answers the problem once (logits, the loss at the initial weights, or the greedy tokens
   and the last step's logits), and the NumPy float32 run of the same problem gives the **rounding floor**;
2. each implementation is built from the canonical weights; its **first call** is timed on its own (tracing, XLA
   or `torch.compile` compilation land here) and its output is checked: **max abs difference** from the float64
   answer. A float32 row beyond the project's float32 rule (max(5e-5, 10 x floor), `verify`'s rule) is **flagged**,
   not silently timed; bfloat16 rows report their difference (their rule is the reduced-precision `verify`'s job);
3. one warm-up call measures the **memory** (peak RSS growth);
4. the implementations of a framework are timed in interleaved rounds of device-synchronised blocks
   (`harness.timing_rounds`), frameworks taking turns; median and IQR over blocks, and the median block of each
   round (`round_ms`): a goal's verdict pairs two rows round by round (`model_report._noise`).
Training rows keep training: each timed call is one more Adam update (dropout 0 by default, so the first call's loss
is comparable across frameworks).

FLOP convention (analytic, matmuls only, 2 per multiply-add): per layer, the attention projections (q and o
`2 d h dh` each, k and v `2 d kv dh` each per token: `8 d^2` without grouped heads; cross-attention's k and v on the
source tokens), the scores and the weighted sum (`4 h dh` per query per key, the full square also under a causal
mask: the dense kernels compute it), the feed-forward (`4 d d_ff` per token, `6 d d_ff` gated; a mixture of experts:
the k experts each token runs, the router and a shared expert); the output projection (`2 d V` per position that is projected). A training step counts 3x its forward
(backward = 2x); Adam, softmax, LayerNorm and embeddings are not counted. Generation counts the encoder once and per
step the decoder over the positions it actually runs (the new one with a cache, the whole prefix without), cached
cross-attention keys and values once, and the logits of the last position only (useful work: an implementation
that projects every position does more than it is credited with). tokens/s: source + target tokens per second for
forward and training, generated tokens per second for generation.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the pyproject dependency `tomli; python_version < "3.11"`
    import tomli as tomllib

import numpy as np

from . import harness, machine, timing
from .model_impls import OURS, REGISTRY, TASKS, greedy, select

DTYPES = ("float32", "bfloat16")
FLOP_CONVENTION = ("matmuls only: projections 4d(h+kv)dh/token, scores+context 4h*dh per query-key pair (full "
                   "square), FFN 4d*d_ff/token (6 gated; experts: k of them + router), logits 2dV per projected "
                   "position; train = 3x forward; generation: encoder once + decoder per step over the positions "
                   "run, logits of the last position only")


# --- models and problems ------------------------------------------------------------------------------------------

def _config(**fields):
    from reference_numpy import TransformerConfig
    return TransformerConfig(**fields)


def _catalogue() -> tuple[dict[str, dict[str, Any]], dict[str, list[tuple]]]:
    """The shapes and presets of `models.toml`: name -> {"config": fields, "shape": default input}, and preset name
    -> entries of (models, tasks, dtypes, implementation patterns or None for all)."""
    data = tomllib.loads((Path(__file__).with_name("models.toml")).read_text())
    presets = {name: [(entry["models"], list(TASKS) if entry["tasks"] == "all" else entry["tasks"], entry["dtypes"],
                       entry.get("impls")) for entry in entries] for name, entries in data["presets"].items()}
    return data["models"], presets


# Whole-model shapes (name -> config fields and default shape) and the presets over them.
MODELS, PRESETS = _catalogue()


@dataclass(frozen=True)
class Problem:
    """One row group: a model, its input shape, a task and a dtype."""

    model: str
    config: Any  # reference_numpy.TransformerConfig
    batch: int
    src_len: int
    tgt_len: int
    new_tokens: int
    task: str  # forward | train | generate | generate-nocache
    dtype: str  # float32 | bfloat16

    def key(self) -> tuple:
        """What the problem computes, whatever the dtype: the reference answers it once."""
        return (self.model, self.config, self.batch, self.src_len, self.tgt_len, self.new_tokens, self.task)

    @property
    def tokens(self) -> int:
        if self.task.startswith("generate"):
            return self.batch * self.new_tokens
        if self.config.is_decoder_only:
            return self.batch * self.tgt_len
        return self.batch * (self.src_len + self.tgt_len)

    @property
    def flops(self) -> float:
        return model_flops(self.config, self.batch, self.src_len, self.tgt_len, self.new_tokens, self.task)


def _attention_flops(c) -> float:
    """Per token: the q and o projections (2 d x heads*head_dim each, 2 FLOPs per multiply-add) and the k and v
    projections (2 d x kv_heads*head_dim each: grouped-query attention projects fewer)."""
    d, inner = c.d_model, c.num_heads * c.head_dim
    return 4.0 * d * inner + 4.0 * d * c.kv_heads * c.head_dim


def _ffn_flops(c, layer: int | None) -> float:
    """Per token: the feed-forward's matrices (2 of d x d_ff, 3 when gated); a decoder layer with experts
    (`layer`) runs `experts_per_token` experts of `expert_width`, the router (d x num_experts) and a shared
    expert with its gate where the model has one."""
    d, matrices = c.d_model, 3 if c.ffn_gated else 2
    if layer is None or not c.layer_experts(layer):
        return 2.0 * matrices * d * c.d_ff
    flops = 2.0 * matrices * d * c.expert_width * c.experts_per_token + 2.0 * d * c.num_experts
    if c.shared_expert_d_ff:
        flops += 2.0 * matrices * d * c.shared_expert_d_ff + 2.0 * d
    return flops


def _encoder_flops(c, b: int, s: int) -> float:
    per_layer = b * s * (_attention_flops(c) + _ffn_flops(c, None)) + 4.0 * b * s * s * c.num_heads * c.head_dim
    return c.num_encoder_layers * per_layer


def _decoder_flops(c, b: int, s: int, t_new: int, t_keys: int, cross_kv: bool) -> float:
    """`t_new` query positions against `t_keys` self-attention keys and `s` source positions; `cross_kv`: the
    cross-attention keys and values of the source are computed in this call. A decoder-only model has no
    cross-attention (`s` is ignored)."""
    d, inner = c.d_model, c.num_heads * c.head_dim
    total = 0.0
    for i in range(c.num_decoder_layers):
        per_token = _attention_flops(c) + _ffn_flops(c, i)
        if c.is_decoder_only:
            total += b * t_new * per_token + 4.0 * b * t_new * t_keys * inner
            continue
        total += b * t_new * (per_token + 4.0 * d * inner) + 4.0 * b * t_new * (t_keys + s) * inner
        if cross_kv:
            total += 4.0 * b * s * d * inner
    return total


def model_flops(c, b: int, s: int, t: int, new_tokens: int, task: str) -> float:
    """Counted FLOPs of one call (see the module docstring)."""
    logits = 2.0 * c.d_model * c.tgt_vocab_size
    if task in ("forward", "train"):
        fwd = _decoder_flops(c, b, s, t, t, True) + b * t * logits
        if c.has_encoder:
            fwd += _encoder_flops(c, b, s)
        return 3 * fwd if task == "train" else fwd
    # An encoder-decoder starts from one start token after encoding the source; a decoder-only model from the
    # prompt (`s` tokens), which the first cached step runs whole.
    total, start = (_encoder_flops(c, b, s), 1) if c.has_encoder else (0.0, s)
    for step in range(new_tokens):  # step k runs with start + k decoder inputs
        length = start + step
        if task == "generate":
            new = length if step == 0 else 1
            total += _decoder_flops(c, b, s, new, length, step == 0)
        else:
            total += _decoder_flops(c, b, s, length, length, True)
        total += b * logits
    return total


@dataclass
class Inputs:
    src: np.ndarray | None  # (B, S) int64, padded; None for a decoder-only model
    tgt: np.ndarray  # (B, T) int64, padded: the decoder's teacher-forced inputs (decoder-only: the sequence)
    labels: np.ndarray  # (B, T) int64: tgt shifted left, pad at the end and where tgt is padding
    start: np.ndarray  # (B, P) int64: where generation starts (the start token; a decoder-only model's prompt)


def make_inputs(problem: Problem, seed: int = 0) -> Inputs:
    import reference_numpy as rn
    c = problem.config
    tgt = rn.sample_ids(c, problem.batch, problem.tgt_len, c.tgt_vocab_size, seed + 1)
    labels = np.full_like(tgt, c.pad_id)
    labels[:, :-1] = tgt[:, 1:]  # (B, T): the next token
    if c.is_decoder_only:
        prompt = rn.sample_ids(c, problem.batch, problem.src_len, c.tgt_vocab_size, seed)
        prompt[prompt == c.pad_id] = (c.pad_id + 1) % c.tgt_vocab_size  # a prompt has no padding
        return Inputs(None, tgt, labels, prompt)
    src = rn.sample_ids(c, problem.batch, problem.src_len, c.src_vocab_size, seed)
    start = rn.BOS_ID if rn.BOS_ID != c.pad_id and rn.BOS_ID < c.tgt_vocab_size else 1
    return Inputs(src, tgt, labels, np.full((problem.batch, 1), start, dtype=np.int64))


# --- rows and reports -------------------------------------------------------------------------------------------------

@dataclass
class ModelRow:
    """One measured (or skipped) implementation on one problem; every field lands in the JSON and CSV files."""

    impl: str
    framework: str
    status: str  # ok | oom | error | unsupported | not installed
    model: str
    task: str
    dtype: str
    batch: int
    src_len: int
    tgt_len: int
    new_tokens: int
    d_model: int
    layers: str  # "encoder+decoder"
    vocab: int
    device: str = "cpu"
    device_name: str = ""
    threads: int | None = None
    median_ms: float | None = None
    iqr_ms: float | None = None
    runs: int | None = None
    # ms per call, the median block of each timing round, in round order: rounds interleave the implementations of
    # one framework, so two rows of one problem and framework pair round by round (the ratios' noise, model_report)
    round_ms: list[float] | None = None
    tokens: int | None = None  # tokens per call (see tokens/s in the module docstring)
    tokens_per_s: float | None = None
    gflop: float | None = None  # counted GFLOP per call
    gflops: float | None = None
    peak_gflops: float | None = None  # the measured GEMM peak of this dtype
    pct_peak: float | None = None
    peak_mem_mib: float | None = None
    mem_method: str = ""
    build_ms: float | None = None  # building the model from canonical weights
    first_call_ms: float | None = None  # includes tracing / compilation
    compile_s: float | None = None  # first call - median, for the compiled modes
    max_abs_err: float | None = None  # against the float64 reference
    err_output: str = ""  # logits | loss | last_logits
    tolerance: float | None = None  # the float32 rule for this problem (max(5e-5, 10 x NumPy float32 floor))
    check: str = ""  # ok | FLAGGED | "" (not judged: bfloat16)
    note: str = ""


@dataclass
class ModelReport:
    meta: dict[str, Any]
    peaks: list[dict[str, Any]]
    rows: list[ModelRow]

    def to_json_dict(self) -> dict[str, Any]:
        return {"kind": "model-bench", "meta": self.meta, "peaks": self.peaks,
                "rows": [dataclasses.asdict(r) for r in self.rows]}

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> "ModelReport":
        if not isinstance(data, dict) or data.get("kind") != "model-bench" \
                or not {"meta", "peaks", "rows"} <= set(data):
            raise ValueError("not a model benchmark result: expected a JSON object with kind 'model-bench', meta, "
                             "peaks and rows")
        return cls(*harness.result_from_json(ModelRow, data))


@dataclass
class Options:
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    # The default grid's rows are timed for 1.5-2 s in 5 rounds: 23 runs of a 75 ms forward pass (0.3 s in 3 rounds
    # gave 6, too few for a verdict); the whole default grid took 763 s in the run committed in the docs.
    min_time: float = 1.5  # seconds of steady-state timing per row, at least
    max_time: float = 2.0  # ... and at most (a row still gets min_runs calls)
    min_runs: int = 3
    rounds: int = 5
    seed: int = 0
    peak_n: int | None = None
    peak_time: float = 1.0
    progress: Any = None


def blank_row(impl, problem: Problem, status: str, note: str = "") -> ModelRow:
    c = problem.config
    return ModelRow(impl=impl.name, framework=impl.framework, status=status, model=problem.model, task=problem.task,
                    dtype=problem.dtype, batch=problem.batch, src_len=problem.src_len, tgt_len=problem.tgt_len,
                    new_tokens=problem.new_tokens, d_model=c.d_model,
                    layers=f"{c.num_encoder_layers}+{c.num_decoder_layers}", vocab=c.tgt_vocab_size,
                    device_name=machine.cpu_name(), tokens=problem.tokens, gflop=problem.flops / 1e9, note=note)


# --- planning -------------------------------------------------------------------------------------------------------

def plan(preset: str = "default", models: list[str] | None = None, tasks: list[str] | None = None,
         dtypes: list[str] | None = None, impl_patterns: list[str] | None = None, overrides: dict | None = None,
         shape: dict | None = None) -> list[tuple[Problem, list]]:
    """(problem, implementations) pairs: the preset's entries, with models / tasks / dtypes replaced where given,
    config fields overridden by `overrides` (`--set`) and shape fields by `shape`."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    for name in models or []:
        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    chosen = select(impl_patterns)
    out: dict[Problem, list] = {}
    for entry_models, entry_tasks, entry_dtypes, patterns in PRESETS[preset]:
        allowed = {i.name for i in select(patterns)} if patterns and impl_patterns is None else None
        for name in models or entry_models:
            spec = MODELS[name]
            config = _config(**{**spec["config"], **(overrides or {})})
            dims = {**spec["shape"], **(shape or {})}
            generated = dims["new_tokens"] + (dims["src_len"] if config.is_decoder_only else 1)
            if max(dims["src_len"], dims["tgt_len"], generated) > config.max_len:
                raise ValueError(f"model {name}: lengths {dims['src_len']}/{dims['tgt_len']} and "
                                 f"{dims['new_tokens']} new tokens do not fit max_len={config.max_len} "
                                 "(raise it with --set max_len=N)")
            for task in tasks or entry_tasks:
                for dtype in dtypes or entry_dtypes:
                    problem = Problem(name, config, dims["batch"], dims["src_len"], dims["tgt_len"],
                                      dims["new_tokens"], task, dtype)
                    have = out.setdefault(problem, [])
                    have += [i for i in chosen if (allowed is None or i.name in allowed) and i not in have]
    pairs = [(problem, sorted(impls, key=list(REGISTRY.values()).index)) for problem, impls in out.items() if impls]
    if not pairs:
        raise ValueError("the chosen implementations have nothing to run on this grid")
    return pairs


# --- the reference ------------------------------------------------------------------------------------------------

@dataclass
class Desired:
    outputs: dict[str, np.ndarray]  # float64 answers
    floor: float  # NumPy float32 vs float64 on the same problem
    tolerance: float  # the float32 rule


def reference(problem: Problem, weights, inputs: Inputs) -> Desired:
    """The float64 answer and the float32 rounding floor of one problem (any dtype: the answer is the same)."""
    import reference_numpy as rn
    from transformer_parity import tolerances

    answers = {}
    for dtype in (np.float64, np.float32):
        model = rn.Transformer(problem.config, weights, dtype=dtype)
        if problem.task in ("forward", "train"):
            logits = model(inputs.tgt) if problem.config.is_decoder_only else model(inputs.src, inputs.tgt)
            if problem.task == "forward":
                answers[dtype] = {"logits": np.asarray(logits, dtype=np.float64)}
            else:
                loss = rn.token_cross_entropy(np.asarray(logits, dtype=np.float64) if dtype == np.float64
                                              else logits, inputs.labels, problem.config.pad_id)
                answers[dtype] = {"loss": np.float64(loss)}
        else:
            ids, last = greedy(rn.reference_stepper(model, inputs.src), inputs.start, problem.new_tokens)
            answers[dtype] = {"ids": ids, "last_logits": np.asarray(last, dtype=np.float64)}
    desired, single = answers[np.float64], answers[np.float32]
    floor = _difference(single, desired)[0] or 0.0
    return Desired(desired, floor, tolerances.property_atol("float32", floor))


def _difference(actual: dict, desired: dict) -> tuple[float | None, str, str]:
    """(max abs difference, which output, a note); generation compares the last logits only when every token
    agrees (otherwise the prefixes differ and so do the logits): None when the tokens are all there is."""
    if "ids" in desired:
        ids, want = np.asarray(actual["ids"]), desired["ids"]
        if ids.shape != want.shape or np.any(ids != want):
            wrong = int(np.sum(ids != want)) if ids.shape == want.shape else ids.size
            return float("inf"), "ids", f"greedy tokens differ from the float64 reference at {wrong} of {want.size}"
        if "last_logits" not in actual:
            return None, "ids", "tokens checked (no logits returned)"
        key = "last_logits"
    else:
        key = next(iter(desired))
    diff = np.max(np.abs(np.asarray(actual[key], dtype=np.float64) - desired[key]))
    return float(diff), key, ""


# --- the run ------------------------------------------------------------------------------------------------------

def run(pairs: list[tuple[Problem, list]], options: Options) -> ModelReport:
    """Time every (problem, implementations) pair; returns the report with the header, peaks and rows."""
    from transformer_parity.verify import seeded_weights

    started = time.perf_counter()
    progress = options.progress or (lambda message: None)

    def say(message: str) -> None:
        progress(f"[{time.perf_counter() - started:6.1f}s] {message}")

    frameworks = {impl.framework for _, impls in pairs for impl in impls}
    thread_info = machine.configure_threads(options.threads, frameworks)
    tf32 = machine.disable_tf32(frameworks)
    uptime_before = _uptime()

    peaks = {}
    for dtype in sorted({p.dtype for p, _ in pairs}):
        say(f"peak: {dtype} GEMM")
        peaks[dtype] = machine.measure_peak("cpu", dtype, machine.peak_frameworks(frameworks), options.threads,
                                           options.peak_n, options.peak_time)

    rows: list[ModelRow] = []
    weights_cache, desired_cache = {}, {}
    try:
        for problem, impls in pairs:
            if problem.config not in weights_cache:
                weights_cache[problem.config] = seeded_weights(problem.config, options.seed)
            weights = weights_cache[problem.config]
            inputs = make_inputs(problem, options.seed)
            if problem.key() not in desired_cache:
                say(f"{_label(problem)}: float64 reference")
                desired_cache[problem.key()] = reference(problem, weights, inputs)
            desired = desired_cache[problem.key()]
            for row in _run_problem(problem, impls, weights, inputs, desired, options, say):
                peak = peaks.get(problem.dtype, {}).get("gflops")
                if row.gflops is not None and peak:
                    row.peak_gflops, row.pct_peak = peak, 100 * row.gflops / peak
                rows.append(row)
            machine.free_memory()
    finally:
        import gc
        gc.unfreeze()
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "versions": _versions(),
        "cpu": machine.cpu_name(),
        "cpu_flags": _cpu_flags(),
        "cpu_count": os.cpu_count(),
        "threads": options.threads,
        "thread_settings": thread_info,
        "tf32": tf32,
        "models": {p.model: p.config.to_dict() for p, _ in pairs},
        "flop_convention": FLOP_CONVENTION,
        "timing": (f"blocks of >= 1 ms, {options.rounds} interleaved rounds over a problem's implementations of one "
                   "framework in orders balancing position and predecessor (frameworks take turns), "
                   f">= {options.min_time}s and >= {options.min_runs} runs per row (capped at {options.max_time}s) "
                   "after a timed first call and one warm-up call; garbage collector off inside blocks; median and "
                   "IQR over blocks, and each round's median block (round_ms); a ratio's 95% interval from the "
                   "rounds its two rows shared (Student's t on per-round log ratios)"),
        "check": ("max |output - float64 NumPy reference|: logits (forward), the loss at the initial weights "
                  "(train), the greedy tokens and the last step's logits (generation); float32 rows beyond "
                  "max(5e-5, 10 x the NumPy float32 floor) are FLAGGED; bfloat16 rows are reported, not judged"),
        "memory": machine.RSSPeak.method if machine.RSSPeak.available() else "not measured",
        "load_before": uptime_before,
        "load_after": _uptime(),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return ModelReport(meta, list(peaks.values()), rows)


def _label(problem: Problem) -> str:
    return (f"{problem.model} B{problem.batch} {'P' if problem.config.is_decoder_only else 'S'}{problem.src_len} "
            f"T{problem.tgt_len}"
            + (f" +{problem.new_tokens}" if problem.task.startswith("generate") else "")
            + f" {problem.task} {problem.dtype}")


def _run_problem(problem, impls, weights, inputs, desired, options, say) -> list[ModelRow]:
    rows, live = [], []
    for impl in impls:
        say(f"{_label(problem)}: {impl.name}")
        row, item = _prepare(impl, problem, weights, inputs, desired, options)
        rows.append(row)
        if item is not None:
            live.append(item)
    groups: dict[str, list] = {}
    for item in live:
        groups.setdefault(item.impl.framework, []).append(item)
    if live:
        say(f"{_label(problem)}: timing {len(live)} implementations")
    for group in groups.values():
        time.sleep(harness.SETTLE_S)
        harness.timing_rounds(group, _CPU, options)
    for item in live:
        if item.runner is None or not item.times:
            continue
        summary = timing.summarize(item.times, item.number)
        row = item.row
        row.median_ms, row.iqr_ms, row.runs = 1e3 * summary.median, 1e3 * summary.iqr, summary.runs
        row.round_ms = [1e3 * t for t in item.round_medians()]
        row.tokens_per_s = problem.tokens / summary.median
        row.gflops = problem.flops / summary.median / 1e9
        if item.impl.name.endswith((".compile", ".function", ".xla")) and row.first_call_ms is not None:
            row.compile_s = max(0.0, (row.first_call_ms - row.median_ms) / 1e3)
    del live
    return rows


class _CPU:
    device = "cpu"


def _prepare(impl, problem, weights, inputs, desired: Desired, options):
    row = blank_row(impl, problem, "ok")
    row.threads = options.threads
    try:
        start = time.perf_counter()
        runner = impl.build(problem, weights, inputs)
        row.build_ms = 1e3 * (time.perf_counter() - start)
    except harness.NotInstalled as exc:
        row.status, row.note = "not installed", str(exc)
        return row, None
    except harness.Unsupported as exc:
        row.status, row.note = "unsupported", str(exc)
        return row, None
    except Exception as exc:  # noqa: BLE001 - a broken implementation is a row, not a crashed run
        return harness.failed(row, exc), None
    try:
        with runner.context():
            start = time.perf_counter()
            first = runner.fn()  # the loss of a training step is the one at the initial weights
            row.first_call_ms = 1e3 * (time.perf_counter() - start)
            check_row(row, runner.to_numpy(first), desired, problem.dtype)
            del first
            _, per_call = machine.metered_call(runner.fn, row, "cpu", impl.framework)
            per_call = timing.sizing_call(runner.fn, per_call, options.max_time, "cpu", impl.framework)
    except Exception as exc:  # noqa: BLE001
        harness.failed(row, exc)
        return row, None
    number = timing.block_size(per_call)
    # at least min_time, and time for one block in each round where max_time allows (a 0.35 s training step gets
    # 5 rounds in 2 s, where min_time's 1.5 s held 4: too few for a verdict)
    budget = min(options.max_time, max(options.min_time, options.rounds * per_call * number))
    budget = max(budget, options.min_runs * per_call * number)  # at least min_runs calls, whatever max_time says
    return row, harness.Live(impl, runner, row, number, budget,
                             timing.rounds_that_fit(budget, per_call * number, options.rounds),
                             min_runs=options.min_runs)


def check_row(row: ModelRow, actual: dict, desired: Desired, dtype: str) -> None:
    diff, output, note = _difference(actual, desired.outputs)
    row.max_abs_err, row.err_output = (None if diff == float("inf") else diff), output
    row.tolerance = desired.tolerance
    if dtype == "float32":
        row.check = "ok" if (diff or 0.0) <= desired.tolerance else "FLAGGED"
        if row.check == "FLAGGED":
            row.note = note or f"{output} differ from the float64 reference by {diff:.2e} > {desired.tolerance:.1e}"
    elif note:
        row.note = note


# --- the machine --------------------------------------------------------------------------------------------------

def _versions() -> dict[str, str]:
    from importlib import metadata
    out = machine.versions()
    for dist in ("transformers", "keras-hub"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _cpu_flags() -> str:
    """The CPU's matrix-math extensions: what decides whether bfloat16 has native arithmetic."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return platform.machine()
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "avx_vnni")
    present = [w for w in wanted if w in flags]
    return " ".join(present) + ("" if any(w in flags for w in ("avx512_bf16", "amx_bf16")) else
                                " (no native bfloat16 arithmetic: no AVX512-BF16, no AMX)")


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        try:
            return "loadavg " + open("/proc/loadavg").read().strip()
        except OSError:
            return ""


__all__ = ["MODELS", "PRESETS", "Problem", "ModelRow", "ModelReport", "Options", "plan", "run", "model_flops",
           "OURS", "TASKS", "DTYPES"]
