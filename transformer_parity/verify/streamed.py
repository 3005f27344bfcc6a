"""Layer-streamed verify: the judge, the floor and every backend run one block at a time (`reference_numpy.blocks`),
so that a model larger than memory can be judged.

For each block (an embedding, one layer, a final norm, the head, the output projection) its weights are read from
the checkpoint (lazily, where the format allows: canonical safetensors, Hugging Face safetensors), the float64
reference, the float32 floor and each backend run it on the hidden states *they* produced from the previous block,
the block's sublayers are compared by the same rule as a whole-model verify (`tolerances`), and everything of the
block is freed before the next is read. What crosses from block to block is one `(B, T, D)` array per run; so
the peak is one block's weights in a few copies, never the model.

This is the same computation as the whole model, cut at the layer boundaries: each run carries its own rounding
through, and the rows (names, errors, floors) are those `verify` reports in one piece; `parity_tests/
test_streamed_verify.py` checks both that the rows agree and that a planted fault is found in the same place.
The source library (transformers, keras_hub) loads a whole model, so a layer-streamed run is judged by our
reference alone and its verdict says so.
"""

from __future__ import annotations

import gc
import time
from typing import Mapping, Sequence

import numpy as np

import reference_numpy as rn
from reference_numpy import blocks as rb

from transformer_parity.errors import UsageError
from transformer_parity.io.limits import human_bytes
from . import coverage
from .results import JUDGE, Report, Subject, nonfinite_problems, port_rows, recorded_inputs
from transformer_parity.tolerances import PAIR_RATIO_LIMIT, RATIO_LIMIT, floors

MODE = "layer-streamed"
# A block whose weights take this much is freed by a full collection as soon as it is judged (a Keras layer holds its
# variables in reference cycles, which wait for the next automatic full collection otherwise). A full collection
# costs about 0.5 s in a process that holds PyTorch and TensorFlow: a small block's weights are left to the collector.
COLLECT_BYTES = 32 * 2**20
FLOOR = "numpy-f32 (floor)"


def _stored_bytes(weights: Mapping[str, np.ndarray], names: Sequence[str]) -> int:
    return sum(int(np.prod(weights[n].shape)) * np.dtype(weights[n].dtype).itemsize for n in names)


def block_bytes(config: rn.TransformerConfig, weights: Mapping[str, np.ndarray]) -> tuple[rb.Block, int]:
    """The block with the most weight bytes as stored, and that figure."""
    sizes = [(block, _stored_bytes(weights, rb.block_parameters(config, block))) for block in rb.blocks(config)]
    return max(sizes, key=lambda item: item[1])


def peak_bytes(config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], dtype: str) -> int:
    """Rough peak of a layer-streamed run: the largest block as stored, in float64 for the judge, and one more copy
    at the run's precision for the run being built (the runs of a block go one after another); activations are
    small beside them."""
    block, stored = block_bytes(config, weights)
    elements = sum(int(np.prod(weights[n].shape)) for n in rb.block_parameters(config, block))
    return stored + elements * (8 + 2 * np.dtype(dtype).itemsize)


def judge(reference: Subject, subjects: Sequence[Subject], dtype: str, src: np.ndarray, tgt: np.ndarray | None,
          types: np.ndarray | None, progress=None) -> tuple[list[str], dict[str, float], list, dict[str, float],
                                                            list[str]]:
    """Run every block in the judge, the floor and each subject; returns `(sublayers, floors, rows, seconds,
    problems)` as `verify.judge_subjects` computes them for the whole model."""
    from transformer_parity import backends

    if dtype not in ("float32", "float64"):
        raise UsageError(f"a layer-streamed verify runs float32 or float64, received --dtype {dtype}")
    config = reference.config
    for s in subjects:
        if s.config != config or s.weights is not reference.weights:
            raise UsageError("a layer-streamed verify runs one checkpoint in every backend; several checkpoints are "
                             "compared whole (drop --stream on)")
    inputs = _inputs(config, src, tgt, types)
    runs = [(JUDGE, "numpy", "float64"), (FLOOR, "numpy", "float32")] + [(s.label, s.backend, dtype) for s in subjects]
    states = {label: dict(inputs) for label, _, _ in runs}
    seconds = {label: 0.0 for label, _, _ in runs}
    sublayers, floor, rows, problems = [], {}, [], []
    every = rb.blocks(config)
    sizes = [_stored_bytes(reference.weights, rb.block_parameters(config, block)) for block in every]
    labels = [s.label for s in subjects]
    for n, block in enumerate(every):
        if progress:
            progress(f"{block.name}: block {n + 1} of {len(every)}, {human_bytes(sum(sizes[:n]))} of "
                     f"{human_bytes(sum(sizes))} of weights done ({MODE})")
        weights = {name: np.asarray(reference.weights[name]) for name in rb.block_parameters(config, block)}
        records = {}
        for label, backend, run_dtype in runs:
            state = states[label]
            rb.begin(block, state)
            start = time.perf_counter()
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported, not warned about
                records[label] = backends.get(backend).run_block(config, block, weights, run_dtype, state)
            seconds[label] += time.perf_counter() - start
            if block == every[-1]:
                records[label].update(rb.final_record(config, state))
        problems = problems or nonfinite_problems(records[JUDGE], records[FLOOR], weights)
        block_floor = floors(records[JUDGE], records[FLOOR], dtype)
        for name, desired in records[JUDGE].items():
            sublayers.append(name)
            floor[name] = block_floor[name]
            rows += port_rows(name, labels, records, desired, floor[name], RATIO_LIMIT, PAIR_RATIO_LIMIT)
        del weights, records
        if sizes[n] >= COLLECT_BYTES:  # a Keras layer sits in reference cycles: free a big block's weights now
            gc.collect()
    return sublayers, floor, rows, seconds, problems


def _inputs(config: rn.TransformerConfig, src: np.ndarray, tgt: np.ndarray | None, types: np.ndarray | None
            ) -> dict[str, np.ndarray]:
    """What the first block reads: a decoder-only model's one sequence is its target side."""
    if config.is_decoder_only:
        return {"tgt_ids": src}
    inputs = {"src_ids": src}
    if types is not None:
        inputs["src_type_ids"] = types
    if config.has_decoder:
        inputs["tgt_ids"] = tgt
    return inputs


def report(reference: Subject, subjects: Sequence[Subject], dtype: str, batch: int, src_len: int, tgt_len: int,
           seed: int, progress=None, notes: Sequence[str] = (), self_consistent: str | None = None) -> Report:
    """The layer-streamed counterpart of `verify.judge_subjects` (float32 or float64, no source run)."""
    from transformer_parity.io import limits

    config = reference.config
    for name, value in (("batch", batch), ("src-len", src_len), ("tgt-len", tgt_len)):
        if value < 1:
            raise UsageError(f"--{name} must be >= 1, received {value}")
    block, stored = block_bytes(config, reference.weights)
    limits.check_memory(peak_bytes(config, reference.weights, dtype),
                        f"a layer-streamed verify (its largest block, {block.name}, holds "
                        f"{limits.human_bytes(stored)} of weights)")
    try:
        src, tgt = rn.sample_batch(config, batch, src_len, tgt_len, seed)
        types = rn.sample_type_ids(config, src, seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    sublayers, floor, rows, seconds, problems = judge(reference, subjects, dtype, src, tgt, types, progress)
    return Report(sublayers=sublayers, floors=floor, rows=rows,
                  subjects=[{"label": s.label, "backend": s.backend, "source": s.source} for s in subjects],
                  judge=f"{JUDGE} on {reference.source or reference.label}", dtype=dtype,
                  inputs=recorded_inputs(config, batch, src_len, tgt_len, seed),
                  notes=[f"{MODE}: {len(rb.blocks(config))} blocks run one at a time (largest {block.name}, "
                         f"{limits.human_bytes(stored)} of weights)"] + list(notes),
                  seconds=seconds, problems=problems, mode=MODE,
                  not_exercised=coverage.not_exercised(config, src, tgt, types),
                  self_consistent=self_consistent or "a layer-streamed run does not load the source library, which "
                                                     "would hold the whole model")
