"""`verify`: run the same seeded, padded inputs through every backend and compare every sublayer output against the
float64 NumPy reference, each with a tolerance derived from that sublayer's measured float32 rounding floor.

The tolerance rule (docs/verify.md; with two or more checkpoints the weights are compared first, `weight_diff`):

1. The **judge** is the NumPy reference in float64 on the reference weights (the first checkpoint's, or the seeded
   preset's).
2. The **floor** of a sublayer is how far the same NumPy reference drifts from the judge when it computes in float32
   on the same weights and inputs: `floor = max(max|f32 - f64|, eps32 * max|f64|)`. The second term (one float32
   rounding at the output's largest magnitude) keeps a sublayer that float32 happens to compute exactly (an
   embedding lookup) from getting a zero floor. With `--dtype float64` the floor is scaled by eps64 / eps32 = 2**-29.
3. A backend **passes** a sublayer when `max|backend - judge| <= K * floor`, K = `RATIO_LIMIT`. Two backends
   compared with each other get `2 * K` (each may sit K floors from the judge, on opposite sides).
4. The **first divergent sublayer** is the first, in execution order, that fails against the judge. Errors flow
   downstream, so everything after it usually fails too; the first one is where to look.

K was chosen from measurements (`benchmarks/verify_calibration.py`): correct ports stay below ~3 floors over
hundreds of seeds, configs and shapes, while the planted porting faults sit at hundreds of floors and more. The rule
and both K live in `tolerances`, which the tests read too.

With `--dtype bfloat16|float16` (and `--autocast`) the ports run in that precision and the floor comes from the NumPy
reference rounding as they do, with its own K: `lowp`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import reference_numpy as rn

from transformer_parity.errors import UsageError
from transformer_parity.streaming.lazy import is_lazy
from transformer_parity.tolerances import (EPS32, EPS64, PAIR_RATIO_LIMIT, RATIO_LIMIT, compare,  # noqa: F401
                                           floors, max_abs)  # the rule, re-exported
from transformer_parity.verify import coverage

from .request import STREAM_MODES, Request  # noqa: F401 (the verify API)
from .results import (JUDGE, Report, Row, Subject, nonfinite_problems, output_name,  # noqa: F401 (the verify API)
                      port_rows, recorded_inputs, row)
DEFAULT_SHAPE = {"batch": 2, "src_len": 37, "tgt_len": 29}

Progress = Callable[[str], None]


# --- weights and backends -------------------------------------------------------------------------------------------

def seeded_weights(config: rn.TransformerConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """`init_weights` plus non-trivial biases, attention sinks and LayerNorm parameters (0.1 N(0, 1) biases, sinks
    and betas, gammas 1 + 0.1 N(0, 1)): initial zeros and ones would hide a port that mixes up a bias, a beta or a
    gamma."""
    weights = rn.init_weights(config, seed, dtype)
    rng = np.random.default_rng([seed, 7919])
    for name, value in weights.items():
        if name.endswith((".bias", ".beta", ".sinks")):
            weights[name] = (0.1 * rng.standard_normal(value.shape)).astype(dtype)
        elif name.endswith(".gamma"):
            weights[name] = (1 + 0.1 * rng.standard_normal(value.shape)).astype(dtype)
    return weights


def available_backends() -> list[str]:
    """The framework backends whose packages are installed (`backends.available`)."""
    from transformer_parity import backends

    return backends.available()


def trace(backend: str, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], dtype: str,
          src: np.ndarray, tgt: np.ndarray | None, src_type_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every sublayer output of `backend` on these inputs, as NumPy arrays, under canonical names (`src` alone for a
    one-sequence model; `src_type_ids` for a model with segment embeddings)."""
    from transformer_parity import backends

    return backends.get(backend).trace(config, weights, dtype, src, tgt, src_type_ids)


# --- the comparison -------------------------------------------------------------------------------------------------

def judge_subjects(reference: Subject, subjects: Sequence[Subject], dtype: str = "float32", batch: int = 2,
                   src_len: int = 37, tgt_len: int = 29, seed: int = 0, progress: Progress | None = None,
                   notes: Sequence[str] = (), autocast: bool = False, source=None,
                   self_consistent: str | None = "no source given", approximated: Sequence[Any] = ()) -> Report:
    """Run the judge and the floor on `reference`'s weights, then every subject, and compare.

    The subjects must share the reference's architecture (parameter shapes); other config differences (epsilon,
    heads, mask or position conventions) are exactly what verify exists to catch, so they run and are reported.
    `source` (a `source.Source`) is run once on the same inputs (an --expect file's own inputs, if it has them) and
    compared with the judge and every subject; `self_consistent` says why there is none. `approximated`
    (`approximation.find`): subjects that compute the reference's model with a recorded, accepted approximation,
    each also judged against the reference run with its config (`approximation.judge`).
    """
    from transformer_parity.verify import lowp

    if dtype not in ("float32", "float64") + lowp.DTYPES:
        raise UsageError(f"--dtype must be float32, float64, bfloat16 or float16, received {dtype!r}")
    lowp.check(dtype, autocast)
    reduced = lowp.is_reduced(dtype)
    for name, value in (("batch", batch), ("src-len", src_len), ("tgt-len", tgt_len)):
        if value < 1:
            raise UsageError(f"--{name} must be >= 1, received {value}")
    config = reference.config
    differences = _differences(reference, subjects)
    given = source.inputs if source is not None and source.inputs is not None else None
    if given is not None:  # --expect: the inputs the expected outputs were computed on
        batch, src_len = given["src_ids"].shape
        tgt_len = given["tgt_ids"].shape[1] if "tgt_ids" in given else tgt_len
    src, tgt, types = _probe_inputs(config, given, batch, src_len, tgt_len, seed,
                                    3 + (2 if dtype == "float64" else 1) * len(subjects))

    seconds: dict[str, float] = {}
    run = _timed(seconds, progress, autocast, src, tgt, types)

    judge = run(JUDGE, "numpy", config, reference.weights, "float64")
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below, not as a warning
        floor_run = run(f"numpy-{lowp.label(dtype, autocast)} (floor)" if reduced else "numpy-f32 (floor)",
                        "numpy", config, reference.weights, dtype if reduced else "float32")
    problems = nonfinite_problems(judge, floor_run, reference.weights)
    floor = floors(judge, floor_run, dtype)
    floor32 = None
    if source is not None:  # the source's own rounding is judged at the float32 floor (times eps64/eps32 in float64)
        floor32 = (floors(judge, run("numpy-f32 (floor of the source)", "numpy", config, reference.weights, "float32"),
                          "float32") if reduced else
                   floor if dtype == "float32" else {k: v * (EPS32 / EPS64) for k, v in floor.items()})
    del floor_run
    outputs = {s.label: run(s.label, s.backend, s.config, s.weights, dtype) for s in subjects}

    limit, pair_limit = (lowp.RATIO_LIMIT, lowp.PAIR_RATIO_LIMIT) if reduced else (RATIO_LIMIT, PAIR_RATIO_LIMIT)
    labels = [s.label for s in subjects]
    rows = [r for name in judge for r in port_rows(name, labels, outputs, judge[name], floor[name], limit, pair_limit)]
    runs = []
    if source is not None:
        runs = _run_source(source, config, judge, (src, tgt, types), seconds, progress)
        unseen = _rows_seeing_no_key(config, src, tgt)
        rows += _source_rows(judge, floor32, floor, dtype, runs, subjects, outputs,
                             lambda name, value: _without_unseen(name, value, unseen, config))
        if any(m.any() for m in unseen.values()):
            notes = [*notes, f"{sum(int(m.sum()) for m in unseen.values())} padded positions whose queries see no key "
                     "in some layer are not compared with the source: the contract gives them zeros, libraries "
                     "differ, and no real position reads them"]
    findings = []
    if approximated:  # each run with its recorded setting, judged against the reference run so
        from transformer_parity.verify import approximation

        more, findings = approximation.judge(approximated, reference.source or reference.label,
                                             lambda label, cfg: run(label, "numpy", cfg, reference.weights, "float64"),
                                             judge, floor, floor32 or floor, outputs, runs, limit)
        rows += more
    inputs = recorded_inputs(config, batch, src_len, tgt_len, None if given is not None else seed)
    return Report(sublayers=list(judge), floors=floor, rows=rows,
                  subjects=[{"label": s.label, "backend": s.backend, "source": s.source} for s in subjects],
                  judge=f"{JUDGE} on {reference.source or reference.label}", dtype=lowp.label(dtype, autocast),
                  inputs=inputs, config_differences=differences,
                  notes=list(notes) + [f"source: {n}" for n in (source.notes if source is not None else [])],
                  seconds=seconds, problems=problems,
                  sources=[{"label": r.label, "name": source.name, "kind": source.kind,
                            "dtype": str(r.outputs[output_name(judge)].dtype)} for r in runs],
                  self_consistent=None if source is not None else self_consistent, approximations=findings,
                  not_exercised=coverage.not_exercised(config, src, tgt, types))


def _timed(seconds: dict[str, float], progress, autocast: bool, src, tgt, types):
    """`run(label, backend, config, weights, dtype)`: that backend's trace on the inputs, its time in `seconds`."""
    from transformer_parity.verify import lowp

    def run(label: str, backend: str, cfg, weights, run_dtype: str) -> dict[str, np.ndarray]:
        if progress:
            progress(label)
        start = time.perf_counter()
        if lowp.is_reduced(run_dtype):
            out = lowp.trace(backend, cfg, weights, run_dtype, autocast, src, tgt, types)
        else:
            out = trace(backend, cfg, weights, run_dtype, src, tgt, types)
        seconds[label] = time.perf_counter() - start
        return out

    return run


def _differences(reference: Subject, subjects: Sequence[Subject]) -> list[str]:
    """The config fields on which each subject differs from the reference (reported, then run as they are); a
    subject of another architecture (other parameter shapes) is refused."""
    config, differences = reference.config, []
    for s in subjects:
        if rn.parameter_shapes(s.config) != rn.parameter_shapes(config):
            changed = {k: (getattr(config, k), v) for k, v in s.config.to_dict().items() if getattr(config, k) != v}
            raise UsageError(f"{s.label} is not the same architecture as {reference.label}: (reference, this) = "
                             f"{changed}")
        name, ref = s.source or s.label, reference.source or reference.label
        differences += [f"{name} ({s.label}): {k}={v!r} (reference {ref}: {getattr(config, k)!r})"
                        for k, v in s.config.to_dict().items() if getattr(config, k) != v]
    return differences


def _probe_inputs(config: rn.TransformerConfig, given, batch: int, src_len: int, tgt_len: int, seed: int,
                  copies: int) -> tuple:
    """`(src, tgt, types)`: an --expect file's inputs (`given`) or seeded ones, after checking that the run fits in
    memory (`copies` of the weights and traces, in float32 units: the judge is float64, the floor float32)."""
    from transformer_parity.io import limits

    limits.check_run(config, "verify", batch=batch, src_len=src_len, tgt_len=tgt_len, itemsize=4,
                     weight_copies=copies, traces=copies)
    if given is not None:
        return given["src_ids"], given.get("tgt_ids"), given.get("src_type_ids")
    try:
        src, tgt = rn.sample_batch(config, batch, src_len, tgt_len, seed)
        return src, tgt, rn.sample_type_ids(config, src, seed)  # segments 0 and 1 (and more), where it has them
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run_source(source, config, judge, inputs, seconds: dict[str, float], progress: Progress | None) -> list:
    """Run `source` once on the judge's inputs; its outputs checked against the judge's names and shapes."""
    from transformer_parity.verify import source_contract as contract

    if progress:
        progress(f"source {source.name}")
    start = time.perf_counter()
    try:
        runs = source.run(contract.batch_of(config, *inputs))
    except UsageError:
        raise
    except Exception as exc:  # a built-in library's own failure (a user's file already says its own)
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UsageError(f"{source.where} failed: {type(exc).__name__}: {message}; pass --no-source to verify "
                         "without it") from None
    seconds[f"source {source.name}"] = time.perf_counter() - start
    shapes = {name: value.shape for name, value in judge.items()}
    for r in runs:
        contract.check_outputs(r, shapes, output_name(judge), source.where)
    return runs


def _rows_seeing_no_key(config: rn.TransformerConfig, src, tgt) -> dict[str, np.ndarray]:
    """`rn.rows_seeing_no_key` on the probe: its padding is the pad id's."""
    def real(ids):
        if ids is None:
            return None
        return ids != config.pad_id if config.pad_id is not None else np.ones(ids.shape, bool)

    return (rn.rows_seeing_no_key(config, None, real(src)) if config.is_decoder_only
            else rn.rows_seeing_no_key(config, real(src), real(tgt)))


def _without_unseen(name: str, value, unseen: Mapping[str, np.ndarray], config: rn.TransformerConfig):
    """`value` (a record of sublayer `name`) with zeros at its stack's positions that see no key."""
    stack = name.split(".")[0] if name.startswith(("encoder.", "decoder.")) else (
        "decoder" if config.has_decoder else "encoder")
    rows = unseen.get(stack)
    if value is None or rows is None or not rows.any() or value.ndim < 2 or value.shape[:2] != rows.shape:
        return value
    return np.where(rows.reshape(rows.shape + (1,) * (value.ndim - 2)), 0, value)


def _source_rows(judge, floor32, floor, dtype: str, runs, subjects: Sequence[Subject], outputs,
                 blank=lambda name, value: value) -> list[Row]:
    """The source against the judge, and every subject against the source, at each sublayer the source gave, each
    record as `blank(name, record)` leaves it (`_without_unseen`).

    A source that returned float32 sits about one float32 floor from exact, so it is judged at `RATIO_LIMIT` float32
    floors; one that returned float64, at the floor times eps64/eps32. A subject against the source: both of one
    precision may each sit K floors off (`PAIR_RATIO_LIMIT`); of two precisions, the coarser one's floor and K.
    """
    from transformer_parity.verify import lowp

    rows = []
    for name in judge:
        for r in runs:
            if name not in r.outputs:
                continue
            actual = blank(name, r.outputs[name])
            wide = actual.dtype == np.float64
            own = floor32[name] * (EPS64 / EPS32 if wide else 1.0)
            rows.append(row(name, (r.label, JUDGE), actual, blank(name, judge[name]), own, RATIO_LIMIT, "source"))
            for other in runs:  # two libraries: each float32 run against the other's, as two ports are
                library, other_library = r.label.split("-")[0], other.label.split("-")[0]
                if library < other_library and name in other.outputs and not wide \
                        and other.outputs[name].dtype != np.float64:
                    rows.append(row(name, (r.label, other.label), actual, blank(name, other.outputs[name]),
                                    floor32[name], PAIR_RATIO_LIMIT, "source"))
            for s in subjects:
                if lowp.is_reduced(dtype):
                    tolerance = floor[name], lowp.RATIO_LIMIT
                elif (dtype == "float64") == wide:
                    tolerance = own, PAIR_RATIO_LIMIT
                else:
                    tolerance = max(own, floor[name]), RATIO_LIMIT
                rows.append(row(name, (s.label, r.label), blank(name, outputs[s.label].get(name)), actual, *tolerance,
                                "source"))
    return rows


# --- entry point: checkpoints or a preset ---------------------------------------------------------------------------

def run(request: Request, progress: Progress | None = None) -> Report:
    """Verify what `request` names (`verify.Request`: the checkpoints or a preset, where they run, the inputs, the
    source that judges them); `progress(step)` hears each step."""
    notes: list[str] = []
    loaded, approximated = [], []
    if len(request.checkpoints) >= 2:
        loaded, subjects, approximated = _several(request, progress, notes)
        reference, first = subjects[0], loaded[0]
        if request.outputs_only:
            notes.append("weights not compared (--outputs-only)")
    else:
        one = _one(request, progress, notes)
        if isinstance(one, Report):  # layer-streamed
            return one
        reference, subjects, first = one
    oracle, self_consistent = _choose_source(first, request.source, request.expect, request.builtin_source,
                                             loaded[1:])
    if oracle is None or oracle.inputs is None:
        src_len, tgt_len = _lengths(reference.config, request.src_len, request.tgt_len, notes, request.cover)
    else:  # --expect: the file's own inputs, whatever the lengths say
        src_len, tgt_len = DEFAULT_SHAPE["src_len"], DEFAULT_SHAPE["tgt_len"]
    weight_rows = None
    if len(request.checkpoints) >= 2 and not request.outputs_only:  # weights first: before any output is computed
        weight_rows = _weights_first(subjects, progress, notes)
    try:
        report = judge_subjects(reference, subjects, dtype=request.dtype, batch=request.batch, src_len=src_len,
                                tgt_len=tgt_len, seed=request.seed, progress=progress, notes=notes,
                                autocast=request.autocast, source=oracle, self_consistent=self_consistent,
                                approximated=approximated)
    except UsageError as exc:  # e.g. other architectures: the weight rows already say what differs
        if not weight_rows or all(w.passed for w in weight_rows):
            raise
        inputs = recorded_inputs(reference.config, request.batch, src_len, tgt_len, request.seed)
        report = _weights_only(reference, subjects, request.dtype, inputs, notes + [f"outputs not compared: {exc}"])
    if weight_rows is not None:
        report.weights, report.weights_compared = weight_rows, True
    items = loaded if len(request.checkpoints) >= 2 else [first] if first is not None else []
    report.dropped = [f"{item.path.name}: {name}" for item in items for name in item.dropped]
    return report


def _weights_first(subjects: Sequence[Subject], progress: Progress | None, notes: list[str]) -> list[Any]:
    """Every checkpoint's weights against the first's, but for the rows the model never reads (noted)."""
    from reference_numpy.schema import unread_rows

    if progress:
        progress("comparing weights")
    config = subjects[0].config
    unread = unread_rows(config)
    notes += [f"{name}: rows 0..{k - 1} never read by the model (position_offset={config.position_offset}): not "
              "compared" for name, k in unread.items()]
    return _compare_weights(subjects, unread)


def _weights_only(reference: Subject, subjects, dtype: str, inputs, notes: list[str]) -> Report:
    """The report of checkpoints whose outputs could not be compared (the weight rows say why)."""
    return Report(sublayers=[], floors={}, rows=[],
                  subjects=[{"label": s.label, "backend": s.backend, "source": s.source} for s in subjects],
                  judge=f"{JUDGE} on {reference.source or reference.label}", dtype=dtype, inputs=inputs, notes=notes)


def _several(request: Request, progress: Progress | None, notes: list[str]) -> tuple:
    """`(loaded, subjects, approximated)` of two or more checkpoints, each in its own framework, the first the
    reference; their read notes go into `notes`."""
    from transformer_parity import formats as fmt
    from transformer_parity.verify import approximation

    loaded = []
    for i, path in enumerate(request.checkpoints):
        if progress:
            progress(f"reading {Path(path).name}")
        loaded.append(fmt.load(path, request.format_of(i), request.fields, allow_drop=request.allow_drop))
    labels = _labels([item.framework for item in loaded])
    sources = _sources(loaded)
    subjects = [Subject(label, item.framework, item.config, item.weights, source)
                for label, item, source in zip(labels, loaded, sources)]
    for name, item in zip(sources, loaded):
        notes += [f"{name}: {n}" for n in item.notes]
    return loaded, subjects, approximation.find(loaded, labels)  # a preset recording an accepted approximation


def _one(request: Request, progress: Progress | None, notes: list[str]):
    """One checkpoint (or a preset's seeded weights) in every chosen backend: `(reference, subjects, first loaded
    or None)`, or the layer-streamed `Report` when the whole model is not run (`--stream`)."""
    first, fields = _read_first(request, progress, notes) if request.checkpoints else (None, request.fields)
    config = first.config if first is not None else _preset_config(request.preset, fields)
    chosen = _chosen_backends(request.backends, notes)
    streaming = request.stream == "on" or (request.stream == "auto" and first is not None and _too_large_whole(
        first, request.dtype, request.batch, request.src_len, request.tgt_len, len(chosen), notes))
    if streaming and (request.source or request.expect):
        raise UsageError("a layer-streamed verify does not run a source; give --source/--expect with --stream off "
                         "on a machine where the whole model fits")
    if first is not None:
        if not streaming and any(is_lazy(v) for v in first.weights.values()):  # read it whole
            from transformer_parity import formats as fmt

            first = fmt.load(request.checkpoints[0], request.format_of(0), fields, allow_drop=request.allow_drop)
        notes += [f"{first.path.name}: {n}" for n in first.notes]
        config, weights, label = first.config, first.weights, first.path.name
    else:
        if progress:
            progress(f"seeding {request.preset} weights")
        weights, label = seeded_weights(config, request.seed), f"{request.preset} preset, seed {request.seed}"
    reference = Subject(label, "numpy", config, weights, label)
    numpy_label = {"bfloat16": "numpy-bf16", "float16": "numpy-f16"}.get(request.dtype, f"numpy-f{request.dtype[5:]}")
    subjects = [Subject(b if b != "numpy" else numpy_label, b, config, weights, label) for b in chosen]
    if not streaming:
        return reference, subjects, first
    from transformer_parity.verify import streamed

    src_len, tgt_len = _lengths(config, request.src_len, request.tgt_len, notes, request.cover)
    why = ("no source given (seeded weights have none)" if first is None else
           "--no-source" if not request.builtin_source else None)
    report = streamed.report(reference, subjects, request.dtype, request.batch, src_len, tgt_len, request.seed,
                             progress, notes, why)
    report.dropped = [f"{label}: {name}" for name in first.dropped] if first is not None else []
    return report


def _read_first(request: Request, progress: Progress | None, notes: list[str]) -> tuple[Any, dict[str, Any]]:
    """`(the first checkpoint read, the fields every later read of it takes)`: read lazily where its format streams,
    what it does not say settled by probing its source (`probe.load_settled`)."""
    from transformer_parity import formats as fmt
    from transformer_parity.layouts.probe import load_settled

    path = request.checkpoints[0]
    if progress:
        progress(f"reading {Path(path).name}")
    first, found = load_settled(lambda given: fmt.load(path, request.format_of(0), given,
                                                       allow_drop=request.allow_drop, lazy=request.stream != "off"),
                                path, dict(request.fields or {}), request.source, notes)
    return first, {**dict(request.fields or {}), **found}  # what probing settled holds for every later read


def _preset_config(preset: str, fields) -> rn.TransformerConfig:
    try:
        config = rn.TransformerConfig.preset(preset, **dict(fields or {}))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid config: {exc}") from None
    from transformer_parity.io import limits
    limits.check_run(config, f"verify --preset {preset}" + "".join(f" --set {k}={v}" for k, v in
                                                                 dict(fields or {}).items()),
                     itemsize=4, weight_copies=1)
    return config


def _chosen_backends(backends, notes: list[str]) -> list[str]:
    """The backends to run: those asked for, all installed ones by default (a note names each one skipped)."""
    installed = available_backends()
    chosen = list(backends) if backends is not None else installed
    missing = [b for b in chosen if b != "numpy" and b not in installed]
    if missing:
        raise UsageError(f"backend(s) {missing} not installed (pip install 'transformer-parity[torch,tf]')")
    if backends is None:
        notes += [f"{b} not installed: skipped" for b in ("torch", "keras") if b not in installed]
    if not chosen:
        raise UsageError("no backend to compare with the reference: install torch and/or tensorflow+keras")
    return chosen


WHOLE_SHARE = 0.5  # `--stream auto` runs the whole model only when its estimate is at most this share of free memory


def _too_large_whole(item, dtype: str, batch: int, src_len: int | None, tgt_len: int | None, backends: int,
                     notes: list[str]) -> bool:
    """`--stream auto`: whether a lazily read checkpoint's whole-model run would take more than half of the memory
    available now, by the estimate `judge_subjects` checks (the judge, the floor, every backend's model and the
    source library's at once); a note says which mode runs and why. Half, not all: the estimate leaves out what the
    frameworks keep besides the weights and activations, and the rest of the machine keeps running (a 1.5 GB
    bfloat16 Llama-shaped directory took 17 GB whole)."""
    if not any(is_lazy(v) for v in item.weights.values()):
        return False
    from transformer_parity.io import limits

    s, t = default_lengths(item.config, src_len, tgt_len, [])
    copies = 3 + (2 if dtype == "float64" else 1) * backends
    need = limits.estimate_bytes(item.config, batch, s, t, itemsize=4, weight_copies=copies, traces=copies)
    free = limits.available_bytes()
    streamed = need > WHOLE_SHARE * free
    notes.append(f"--stream auto: the whole-model run would take about {limits.human_bytes(need)}, "
                 f"{'more than' if streamed else 'at most'} half of the {limits.human_bytes(free)} available now: "
                 + ("run one block at a time (--stream off runs it whole, with the source)" if streamed else
                    "run whole"))
    return streamed


def _lengths(config: rn.TransformerConfig, src_len: int | None, tgt_len: int | None, notes: list[str],
             cover: bool) -> tuple[int, int]:
    """`default_lengths`, lengthened by `--cover` to what runs every length-dependent path (a note says so)."""
    given = default_lengths(config, src_len, tgt_len, notes)
    covered = coverage.cover_lengths(config, *given) if cover else given
    if covered != given:
        def shown(lengths):  # the one sequence's length, or both of an encoder-decoder
            return " and ".join(map(str, lengths if config.is_encoder_decoder else lengths[:1]))

        notes.append(f"--cover: lengths {shown(covered)} (from {shown(given)}), to run every length-dependent path "
                     "the config declares")
    return covered


def default_lengths(config: rn.TransformerConfig, src_len: int | None, tgt_len: int | None,
                    notes: list[str]) -> tuple[int, int]:
    """The lengths given, or the defaults (37, 29) clipped to the model's `max_len`, with a note saying so; a
    `--tgt-len` given to a one-sequence model is noted as unused."""
    lengths = []
    for flag, given, default, used in (("--src-len", src_len, DEFAULT_SHAPE["src_len"], True),
                                       ("--tgt-len", tgt_len, DEFAULT_SHAPE["tgt_len"], config.is_encoder_decoder)):
        if given is not None:
            if not used:
                notes.append(f"{flag} {given} not used: a {_kind(config)} model reads one sequence (--src-len)")
            lengths.append(given)
        elif default > config.max_len:
            if used:
                notes.append(f"{flag} {config.max_len}: the default {default} is longer than the model's "
                             f"max_len={config.max_len}")
            lengths.append(config.max_len)
        else:
            lengths.append(default)
    if config.classifier_input == "eos" and lengths[1] != lengths[0]:  # `rn.sample_batch` makes them equal
        if tgt_len is not None:
            notes.append(f"--tgt-len {tgt_len} not used: the classifier reads the decoder at the source's eos "
                         f"position, so the decoder input is as long as the source ({lengths[0]})")
        lengths[1] = lengths[0]
    return lengths[0], lengths[1]


def _kind(config: rn.TransformerConfig) -> str:
    return "decoder-only" if config.is_decoder_only else "encoder-only"


def _choose_source(first, spec: str | None, expect, builtin: bool, others=()):
    """`(source.Source or None, why there is none)` for the reference checkpoint (`formats.Loaded`, None: a preset).
    The built-in source of every other checkpoint from another library joins it (`HF_DIR KERASHUB_PRESET`: transformers
    and keras_hub, judged against each other too)."""
    from transformer_parity.verify import source as sources, source_file

    if spec and expect:
        raise UsageError("give --source or --expect, not both: each is the source the outputs are judged against")
    if spec or expect:
        if first is None:
            raise UsageError(f"{'--source' if spec else '--expect'} judges a checkpoint's weights against the model "
                             "they came from; give the checkpoint")
        from transformer_parity.verify import probes

        return (source_file.from_file(spec) if spec else probes.from_expect(expect, first.config)), None
    if first is None:
        return None, "no source given (seeded weights have none)"
    if not builtin:
        return None, "--no-source"
    oracle, why = sources.builtin(first)
    more = [found for found, _ in map(sources.builtin, others) if found is not None]
    more = [s for s in more if oracle is None or s.name.split()[0] != oracle.name.split()[0]]  # one per library
    if not more:
        return oracle, why
    return sources.combine(([oracle] if oracle is not None else []) + more), None


def write_probe(path: str | os.PathLike, request: Request, force: bool = False) -> dict[str, np.ndarray]:
    """`verify --write-probe`: the inputs `request`'s run would feed the first checkpoint's model (or the preset's),
    written to an .npz that `--expect` reads back once `output` is added to it. Returns the arrays written."""
    from transformer_parity import formats as fmt
    from transformer_parity.verify import source_contract

    if request.checkpoints:
        config = fmt.load(request.checkpoints[0], request.format_of(0), request.fields,
                          allow_drop=request.allow_drop).config
    else:
        try:
            config = rn.TransformerConfig.preset(request.preset, **dict(request.fields or {}))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"invalid config: {exc}") from None
    batch, seed = request.batch, request.seed
    src_len, tgt_len = default_lengths(config, request.src_len, request.tgt_len, [])
    for name, value in (("batch", batch), ("src-len", src_len), ("tgt-len", tgt_len)):
        if value < 1:
            raise UsageError(f"--{name} must be >= 1, received {value}")
    from transformer_parity.io import limits
    limits.check_run(config, "verify --write-probe", batch=batch, src_len=src_len, tgt_len=tgt_len, itemsize=4,
                     weight_copies=0)
    try:
        src, tgt = rn.sample_batch(config, batch, src_len, tgt_len, seed)
        types = rn.sample_type_ids(config, src, seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    probe = source_contract.batch_of(config, src, tgt, types)
    from transformer_parity.verify import probes

    probes.write_probe(path, probe, force)
    return probe


def _compare_weights(subjects: Sequence[Subject], unread: Mapping[str, int]) -> list[Any]:
    """Weights first (`weight_diff`): every checkpoint's canonical tensors against the first checkpoint's, but for
    the rows the model never reads (`unread`)."""
    from transformer_parity.verify import weights as weight_diff

    return weight_diff.compare_checkpoints(subjects[0].weights, [s.weights for s in subjects[1:]],
                                           [s.source or s.label for s in subjects], unread)


def _labels(frameworks: Sequence[str]) -> list[str]:
    """Short report names: the framework, numbered where several checkpoints run in the same one."""
    return [f if frameworks.count(f) == 1 else f"{f}#{frameworks[:i + 1].count(f)}" for i, f in enumerate(frameworks)]


def _sources(loaded) -> list[str]:
    """File names, or paths where names repeat."""
    names = [item.path.name for item in loaded]
    return names if len(set(names)) == len(names) else [str(item.path) for item in loaded]
