"""The source contract of `verify` (docs/verify.md, "What a verdict proves"): what every source of truth returns and
how it is checked, whichever adapter runs it.

One contract for every kind of source (`Source.run(batch)` -> `SourceRun`s of canonical-named arrays): a user's
file (`source_file`), a probe's answer (`probes`), or a library run on the checkpoint's own files (`source_hf`,
`source_kerashub`, `source_nn`); `source` picks one. What a source returns is checked here (`check_outputs`:
names, shapes, dtype, finiteness); the comparison rows and their tolerances are built by `verify`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

import reference_numpy as rn

from transformer_parity.errors import UsageError

Batch = dict[str, np.ndarray]
OUTPUT = "output"  # the key of the model's output in a source's dict or an --expect file
INPUT_KEYS = ("src_ids", "tgt_ids", "src_type_ids")
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class SourceRun:
    """One run of a source: what the report calls it, and its outputs under canonical names."""

    label: str  # "source", "transformers-f32", "expected", ...
    raw: Any  # what the source returned, before `check_outputs`
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # canonical name -> array, after `check_outputs`


@dataclass
class Source:
    """A model to judge our port against (see the module docstring)."""

    name: str  # how the verdict names it: "model.py:forward", "transformers <Stem>ForCausalLM", "probe.npz"
    kind: str  # file | builtin | expect
    run: Callable[[Batch], list[SourceRun]]
    notes: list[str] = field(default_factory=list)
    inputs: Batch | None = None  # --expect: the inputs the outputs were computed on

    @property
    def where(self) -> str:
        """How an error names the source."""
        return {"file": f"--source {self.name}", "expect": f"--expect {self.name}"}.get(
            self.kind, f"the built-in source ({self.name})")


def batch_of(config: rn.TransformerConfig, src: np.ndarray, tgt: np.ndarray | None,
             types: np.ndarray | None) -> Batch:
    """The dict a source receives: `src_ids`, and `tgt_ids` / `src_type_ids` where the model takes them."""
    batch = {"src_ids": np.ascontiguousarray(src, dtype=np.int64)}
    if config.is_encoder_decoder:
        batch["tgt_ids"] = np.ascontiguousarray(tgt, dtype=np.int64)
    if types is not None:
        batch["src_type_ids"] = np.ascontiguousarray(types, dtype=np.int64)
    return batch


# --- checking what a source returned ----------------------------------------------------------------------------------

def to_numpy(value: Any, where: str, key: str) -> np.ndarray:
    """A returned value as a NumPy array (a torch tensor detached and moved to the CPU; anything `np.asarray` takes)."""
    try:
        if hasattr(value, "detach"):
            value = value.detach()
            if hasattr(value, "cpu"):
                value = value.cpu()
        if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
            value = value.numpy()
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:  # a bfloat16 tensor, a ragged list, an object
        raise UsageError(f"{where} returned {key} as a {type(value).__name__} that is not an array "
                         f"({type(exc).__name__}: {exc}); return float32 or float64 (a torch tensor: .float())"
                         ) from None


def check_outputs(run: SourceRun, shapes: Mapping[str, tuple[int, ...]], output_name: str, where: str) -> None:
    """Fill `run.outputs` from `run.raw`: the output (an array, or a dict's "output") under `output_name`, each
    intermediate under its canonical name, each float32 or float64, of the judge's shape and finite. Anything else is
    a `UsageError` naming the source and what it returned."""
    raw = run.raw
    if isinstance(raw, Mapping):
        if OUTPUT not in raw:
            raise UsageError(f"{where} returned a dict without the key {OUTPUT!r} (the model's output), received keys "
                             f"{sorted(map(str, raw))[:8]}")
        items = [(OUTPUT, raw[OUTPUT])] + [(k, v) for k, v in raw.items() if k != OUTPUT]
    else:
        items = [(OUTPUT, raw)]
    outputs = {}
    for key, value in items:
        if not isinstance(key, str):
            raise UsageError(f"{where} returned a dict key {key!r}; keys are {OUTPUT!r} and canonical sublayer names")
        name = output_name if key == OUTPUT else key
        if key != OUTPUT and (name not in shapes or name == output_name):
            valid = [n for n in shapes if n != output_name]
            hint = (f"the output goes under {OUTPUT!r}" if name == output_name else
                    f"canonical names: {', '.join(valid[:4])}{', ...' if len(valid) > 4 else ''}")
            raise UsageError(f"{where} returned {key!r}, which is not a sublayer of this model ({hint})")
        array = to_numpy(value, where, key)
        if array.dtype not in FLOAT_DTYPES:
            raise UsageError(f"{where} returned {key} as {array.dtype}; return float32 or float64 (a torch tensor: "
                             ".float() or .double())")
        if array.shape != tuple(shapes[name]):
            raise UsageError(f"{where} returned {key} of shape {array.shape}; expected {tuple(shapes[name])}"
                             + (" (batch, length, vocabulary or d_model)" if key == OUTPUT else ""))
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        if bad:
            raise UsageError(f"{where} returned {key} with {bad} NaN or inf value(s) of {array.size}")
        outputs[name] = array
    run.outputs = outputs


def level(array: np.ndarray) -> str:
    """The precision a source's array carries: float64 or float32."""
    return "float64" if array.dtype == np.float64 else "float32"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _hook_outputs(modules: Mapping[str, Any], record: dict[str, Any], transpose: bool = False) -> list[Any]:
    """Forward hooks that store each module's output (the first element of a tuple; a `routing` record's router gives
    `(scores, weights, chosen experts)`, as transformers' routers do: the last) under its canonical name, as a copy (a
    layer may add another sublayer's output to a tensor in place after its module returned it). A module
    under several names (one layer's weights run by every layer) stores its k-th call under the k-th name."""
    names: dict[int, tuple[Any, list[str]]] = {}  # id(module) -> (module, its canonical names in order)
    for name, module in modules.items():
        names.setdefault(id(module), (module, []))[1].append(name)

    def hook(calls):
        def store(module, inputs, output):
            name = next(calls, None)
            if name is None:  # called more often than it has names: the first calls are the ones recorded
                return
            out = output[-1 if name.endswith(".routing") else 0] if isinstance(output, tuple) else output
            out = out.detach().clone() if hasattr(out, "clone") else out  # a copy: its caller may add to it in place
            record[name] = out.transpose(0, 1) if transpose else out  # (len, B, D) -> (B, len, D)
        return store

    return [module.register_forward_hook(hook(iter(order))) for module, order in names.values()]


def _expand(hooks: Mapping[str, str], layers: Mapping[str, int]) -> dict[str, str]:
    """Canonical name -> module path for every layer (`{i}`), the encoder's and the decoder's counts."""
    out = {}
    for canonical, module in hooks.items():
        if "{i}" not in canonical:
            out[canonical] = module
            continue
        for i in range(layers[canonical.split(".")[0]]):
            out[canonical.format(i=i)] = module.format(i=i)
    return out
