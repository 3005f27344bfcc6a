"""How far an approximation (`layouts.approximations`) takes a model: measured, never assumed.

`measure` runs the float64 NumPy reference twice on verify's seeded probe batch, with the source's config and with the
config the target computes, on the same weights, one block at a time (`reference_numpy.blocks`: the peak is one
block's weights, so a model larger than memory is measured too), and says where the two first differ, by how much
the output (logits, or a bare backbone's last hidden states) differs, and for logits how many top-1 predictions
change. `convert` prints it when it refuses and records it when the approximation is accepted.

`find` and `judge` serve `verify`: a checkpoint that records an accepted approximation, compared with one that
computes the source's function (`verify HF_DIR PRESET`), is also judged against the reference run with the config it
records (`numpy-f64 (NAME)`); where it matches that one, the difference from the source is the approximation, reported
as such (`Report.approximations`, the verdict APPROXIMATE) and never as PASS.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

import reference_numpy as rn
from reference_numpy import blocks as rb

from .results import JUDGE, Row, output_name, row
from transformer_parity.tolerances import RATIO_LIMIT, max_abs


@dataclass
class Gap:
    """What an approximation changes on one model, on verify's probe batch (float64, exact)."""

    output: str  # logits | last_hidden_state
    max_abs: float  # max |target - source| of the output
    largest: float  # max |source output|
    first: str | None  # the first sublayer where the two differ at all (None: nowhere)
    site: str | None  # where in `first` the approximation acts, in words ("its q/k norms"; `approximations.located`)
    top1_changed: int | None  # positions (a sequence classifier: sequences) whose top-1 prediction changes
    positions: int  # real (non-pad) positions compared
    inputs: dict[str, int]  # batch, src_len (and tgt_len), seed

    def phrase(self) -> str:
        """`the logits differ by up to 4.1e-05 (largest |value| 3.2), the top-1 prediction changes at 0 of 22
        positions, first at decoder.layers.0.self_attn, in its q/k norms (verify's probe batch: ...)`; a bare
        backbone's last hidden states say that there is no prediction to change."""
        what = "logits" if self.output == "logits" else "last hidden states"
        text = f"the {what} differ by up to {self.max_abs:.2e} (largest |value| {self.largest:.3g}"
        if self.top1_changed is not None:
            text += f"), the top-1 prediction changes at {self.top1_changed} of {self.positions} positions"
        else:
            text += "; no logits, so no top-1 prediction to change)"
        if self.first:
            text += f", first at {self.first}" + (f", in {self.site}" if self.site else "")
        shape = " x ".join(str(self.inputs[k]) for k in ("batch", "src_len", "tgt_len") if k in self.inputs)
        return text + f" (verify's probe batch: {shape} ids, seed {self.inputs['seed']})"

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "max_abs": self.max_abs, "largest": self.largest, "first_sublayer": self.first,
                "site": self.site, "top1_changed": self.top1_changed, "positions": self.positions,
                "inputs": self.inputs, "phrase": self.phrase()}


def probe(config: rn.TransformerConfig, batch: int, src_len: int, tgt_len: int, seed: int):
    """verify's seeded, padded probe batch: `(src, tgt, src_type_ids)`."""
    src, tgt = rn.sample_batch(config, batch, src_len, tgt_len, seed)
    return src, tgt, rn.sample_type_ids(config, src, seed)


def _state(config: rn.TransformerConfig, src, tgt, types) -> dict[str, np.ndarray]:
    """What the first block reads (a decoder-only model's one sequence is its target side)."""
    if config.is_decoder_only:
        return {"tgt_ids": src}
    state = {"src_ids": src} if types is None else {"src_ids": src, "src_type_ids": types}
    return {**state, "tgt_ids": tgt} if config.has_decoder else state


def measure(source: rn.TransformerConfig, target: rn.TransformerConfig, weights: Mapping[str, Any],
            batch: int, src_len: int, tgt_len: int, seed: int = 0, needed: Sequence[Any] = ()) -> Gap:
    """The gap between `source` and `target` (the same architecture, other settings) on `weights`, measured by the
    float64 reference one block at a time on verify's probe batch; `needed` (the `layouts.approximations`
    that make `target`) say where in the first differing sublayer they act."""
    from transformer_parity.io import limits
    from transformer_parity.layouts.approximations import located

    from .streamed import COLLECT_BYTES, peak_bytes

    limits.check_memory(peak_bytes(source, weights, "float64"), "measuring an approximation (one block at a time)")
    src, tgt, types = probe(source, batch, src_len, tgt_len, seed)
    states = [_state(source, src, tgt, types), _state(source, src, tgt, types)]
    every, first, out = rb.blocks(source), None, [{}, {}]
    for block in every:
        block_weights = {n: np.asarray(weights[n]) for n in rb.block_parameters(source, block)}
        records = []
        for config, state, last in zip((source, target), states, out):
            rb.begin(block, state)
            records.append(rb.run_block(config, block, block_weights, np.float64, state))
            if block == every[-1]:
                records[-1].update(rb.final_record(config, state))
            last.update(records[-1])
        for name, value in records[0].items():
            if first is None and max_abs(records[1][name] - value) > 0:
                first = name
        size = sum(v.nbytes for v in block_weights.values())
        del block_weights, records
        if size >= COLLECT_BYTES:
            gc.collect()
    name = output_name(out[0])
    ids = src if not source.is_encoder_decoder else tgt
    real = np.ones(ids.shape, bool) if source.pad_id is None else ids != source.pad_id
    if source.pooled_classifier:  # one prediction per sequence
        real = np.ones(ids.shape[:1], bool)
    changed = None
    if name == "logits":
        changed = int(np.sum((out[0][name].argmax(-1) != out[1][name].argmax(-1)) & real))
    inputs = {"batch": batch, "src_len": src_len, **({"tgt_len": tgt_len} if source.is_encoder_decoder else {}),
              "seed": seed}
    return Gap(name, max_abs(out[1][name] - out[0][name]), max_abs(out[0][name]), first, located(first, needed),
               changed, int(real.sum()), inputs)


# --- verify: a checkpoint recording an accepted approximation --------------------------------------------------------

@dataclass
class Approximated:
    """A subject that computes the reference's model with a recorded approximation (or the reverse)."""

    label: str  # the subject, as the report names it
    source: str  # its checkpoint
    library: str | None  # its built-in source library (keras_hub), whose runs compute what it computes
    record: Any  # layouts.approximations.Record
    config: rn.TransformerConfig  # what it computes: the reference's config with the recorded settings
    known: Sequence[Any] = ()  # the record's `layouts.approximations.Approximation`s, as this tool defines them
    reverse: bool = False  # the reference records the approximation; this subject computes the source's function

    @property
    def judge(self) -> str:
        return f"{JUDGE} ({'without ' if self.reverse else ''}{'+'.join(self.record.names)})"

    def says(self, reference: str) -> str:
        """What the subject computes, in words."""
        if self.reverse:
            return (f"{self.label} ({self.source}) computes the source's function, of which the reference "
                    f"({reference}) records the accepted approximation {'; '.join(self.record.says)}")
        return (f"{self.label} ({self.source}) computes the accepted approximation {'; '.join(self.record.says)}, as "
                "its checkpoint records")

    def party(self, label: str) -> bool:
        """Whether a row's side (a subject or a source run) computes this approximated function."""
        return label == self.label or (self.library is not None and label.startswith(f"{self.library}-"))


def find(loaded: Sequence[Any], labels: Sequence[str]) -> list[Approximated]:
    """The checkpoints (`formats.Loaded`, the first the reference; `labels` as the report names them) that compute
    the reference's function with an accepted approximation one of them records: either one records it."""
    from transformer_parity.formats import home
    from transformer_parity.layouts import hf
    from transformer_parity.layouts.kerashub_preset import approximations_named, read_record
    from . import source as sources

    records = [(hf.read_record if home(item.format) == "hf" else read_record)(item.path) for item in loaded]
    reference, found = loaded[0].config, []
    for item, label, own in zip(loaded[1:], labels[1:], records[1:]):
        for record, theirs, ours in ((own, "target", "source"), (records[0], "source", "target")):
            if record is not None and record.holds(item.config, theirs) and record.holds(reference, ours):
                settings = record.target_settings if theirs == "target" else record.source_settings
                builtin = sources.builtin(item)[0]
                library = builtin.name.split()[0] if builtin is not None else None
                found.append(Approximated(label, item.path.name, library, record, reference.replace(**settings),
                                          approximations_named(record.names), reverse=theirs == "source"))
                break
    return found


def judge(found: Sequence[Approximated], reference: str, trace, judge_out: Mapping[str, np.ndarray],
          floor: Mapping[str, float], floor32: Mapping[str, float], outputs: Mapping[str, Mapping[str, np.ndarray]],
          runs: Sequence[Any], limit: float = RATIO_LIMIT) -> tuple[list[Row], list[dict]]:
    """For each approximated subject (`reference` names the reference checkpoint): the reference run with its
    config (`trace(label, config)`, float64); the subject (at `floor`) and each source run that computes what it
    computes (at the float32 `floor32`) compared with that run; and what the approximation is on these inputs: the
    first sublayer where it shows beyond `limit` floors, by how much there and at the output. Returns
    `(rows, findings)`."""
    from transformer_parity.layouts.approximations import located

    rows, findings = [], []
    for a in found:
        own = trace(a.judge, a.config)
        for name, desired in own.items():
            rows.append(row(name, (a.label, a.judge), outputs[a.label].get(name), desired, floor[name], limit))
            rows += [row(name, (r.label, a.judge), r.outputs[name], desired, floor32[name], RATIO_LIMIT, "source")
                     for r in runs if a.party(r.label) and name in r.outputs]
        gaps = {name: max_abs(own[name] - judge_out[name]) for name in judge_out}
        shows = next((n for n in judge_out if gaps[n] > limit * floor[n]), None)
        output = output_name(judge_out)
        findings.append({"subject": a.label, "checkpoint": a.source, "judge": a.judge, "names": a.record.names,
                         "computes": a.says(reference),
                         "says": a.record.says, "source_settings": a.record.source_settings,
                         "target_settings": a.record.target_settings, "first_sublayer": shows,
                         "site": located(shows, a.known), "gap_there": gaps[shows] if shows else None,
                         "floor_there": floor[shows] if shows else None,
                         "output": output, "output_gap": gaps[output], "recorded": a.record.gap,
                         "parties": [a.label] + [r.label for r in runs if a.party(r.label)]})
        del own
    return rows, findings
