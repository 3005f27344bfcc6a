"""Settling a layout by probing the source model (`layout --scaffold WEIGHTS --source FILE.py:NAME`).

The scaffold reads names and shapes; what they cannot tell (the head count, the attention scale, the norm
placement, the activation, epsilon, the embedding scale, the head's layer order, the padding id, which of two fused
q/k/v orders a tensor holds, an input projection or a head stack that no name gives away) is settled here by
measurement: every candidate layout is imported, run by the float64 NumPy reference on probe inputs, and compared
with the source's own output on the same inputs. A candidate is accepted when it is within the verify rule (K floors
of the reference's own float32 rounding, scaled to float64 when the source computes in float64). When several
candidates that disagree on a setting all pass, that setting is named as not settled, never picked silently.

The search is staged so that it stays small: the structure (mapping alternatives x heads x the switches in
`SWITCHES`) on inputs that hold no candidate pad id, then epsilon on the survivors, then the pad id on inputs padded
with each candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import reference_numpy as rn

from transformer_parity import tolerances
from transformer_parity.tolerances import RATIO_LIMIT  # K of verify
from transformer_parity.layouts import roles, user

Source = Callable[[dict[str, np.ndarray]], Any]

SWITCHES: dict[str, tuple] = {  # fields the weights cannot tell, with the values models use
    "attention_scale": ("head", "model", "none"),
    "norm_first": (False, True),
    "activation": ("relu", "gelu", "gelu_tanh", "silu"),
    "scale_embedding": (True, False),
}
HEAD_SWITCHES: dict[str, tuple] = {  # only when the weights hold a head transform
    "head_order": ("dense-activation-norm", "dense-norm-activation"),
    "head_activation": ("relu", "gelu", "gelu_tanh", "silu"),
}
SEARCHED: dict[str, tuple] = {  # fields needed only for some weights
    "position_offset": (0, 1, 2),  # a learned table read at row p + offset (2 in some encoder-decoders)
    "sinusoid_layout": ("interleaved", "concatenated"),  # no table in the weights to tell it
}
STAGED_START: dict[str, Any] = {  # where the later stages (or a verified match) start
    "pad_id": None, "layer_norm_eps": 1e-5, "head_layer_norm_eps": None, "positional": "sinusoidal",
    "output_projection": False, "max_len": 512,
}
MAX_LEN_CAP = 8192  # the longest input probed when the weights hold no position table
EPSILONS = (1e-5, 1e-6, 1e-12, 1e-3, 1e-8)
# the relative error above which the names' layout is taken to have a role wrong (a wrong epsilon or pad id is
# below 1e-3; a swapped projection or norm is of order 1), so the roles the source's calls give are tried
NAMES_MISS = 1e-2  # PyTorch, many hand-written models, post-LN encoders, Keras, rare
_FUSED_ALTERNATIVE = {"fused_qkv": "fused_qkv_heads", "fused_qkv_heads": "fused_qkv",
                      "fused_qkv_t": "fused_qkv_heads_t", "fused_qkv_heads_t": "fused_qkv_t"}


@dataclass
class Candidate:
    mapping: dict[str, str]  # external pattern -> "canonical [transform]"
    fields: dict[str, Any]
    error: float = math.inf  # max |reference f64 - source| / max |source|
    config: rn.TransformerConfig | None = None
    weights: dict[str, np.ndarray] | None = None


@dataclass
class Settled:
    """What probing found: the layout text and the evidence."""

    text: str
    error: float  # max |ours - source| of the chosen layout, absolute
    floor: float  # the float32 (or float64) rounding floor of the output
    ratio: float
    tried: int
    unsettled: list[str] = field(default_factory=list)  # one line per setting that could not be settled
    source_dtype: str = "float32"
    fields: dict[str, Any] = field(default_factory=dict)  # the settled config values
    # field -> (its error against the source, the runner-up value, the runner-up's error), absolute: the best
    # candidate that differs in that field alone is the runner-up (None where no candidate differed)
    evidence: dict[str, tuple[float, Any, float]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.unsettled and self.ratio <= RATIO_LIMIT


def call_source(source: Source, batch: Mapping[str, np.ndarray], where: str = "the source") -> np.ndarray:
    """The source's output on `batch` as a float array (a dict return gives its "output"); anything the source
    raises, or a return that is no float array, is one `ValueError` line naming `where`."""
    try:
        out = source({k: v.copy() for k, v in batch.items()})
    except Exception as exc:  # the user's code: whatever it raises is reported, not a traceback
        shapes = ", ".join(f"{k} {v.shape}" for k, v in batch.items())
        raise ValueError(f"{where} raised {type(exc).__name__} on a probe batch ({shapes}): "
                         f"{' '.join(str(exc).split())[:300]}") from None
    if isinstance(out, Mapping):
        out = out.get("output")
    if hasattr(out, "detach"):
        out = out.detach().cpu().numpy()
    out = np.asarray(out)
    if not np.issubdtype(out.dtype, np.floating) or not np.all(np.isfinite(out)):
        raise ValueError(f"{where} returned {out.dtype} values of shape {out.shape}, expected finite floating-point "
                         "logits or hidden states")
    return out


# --- candidates -------------------------------------------------------------------------------------------------------

def _width(guesses: Mapping[str, str], rows) -> int | None:
    """d_model: the width of any LayerNorm or embedding the guesses name."""
    for pattern, guess in guesses.items():
        if guess.split()[0].endswith((".gamma", ".beta")):
            return rows[pattern][0][-1]
    return None


def _module(pattern: str) -> tuple[str, str]:
    """`output_net.3.weight` -> (`output_net.3`, `weight`)."""
    head, _, leaf = pattern.rpartition(".")
    return head, leaf


def _unlayered_alternatives(rows, guesses: dict[str, str], torch_style: bool, d: int | None
                            ) -> dict[str, list[str]]:
    """Candidates for the top-level tensors that names alone did not place: an input projection (a `Linear` from
    the vocabulary to d_model over one-hot ids: its weight is the embedding, its bias an input bias) and an output
    stack (`Linear -> LayerNorm -> activation -> Linear`), told apart by shape and by order inside their module."""
    if d is None:
        return {}
    out: dict[str, list[str]] = {}
    unplaced = {p for p, g in guesses.items() if g == user.UNMAPPED and rows[p][1] == {None}}
    decoder_only = not any(g.startswith("encoder.layers") for g in guesses.values())
    side = "tgt" if decoder_only else "src"
    t = " transpose" if torch_style else ""

    def kernel_shape(pattern):  # (in, out) whatever the framework stores
        shape = rows[pattern][0]
        return shape[::-1] if torch_style and len(shape) == 2 else shape

    def place(weight: str, canonical: str) -> None:
        bias = weight[: -len("weight")] + "bias" if weight.endswith("weight") else None
        if canonical.endswith("norm"):
            out[weight] = [f"{canonical}.gamma"]
            if bias in rows:
                out[bias] = [f"{canonical}.beta"]
            return
        out[weight] = [f"{canonical}.{'embedding' if canonical.endswith('_embed') else 'kernel'}{t}"]
        if bias in rows:
            out[bias] = [f"{canonical}.bias"]

    modules: dict[str, list[tuple[int, str]]] = {}  # parent module -> [(child index, weight pattern)]
    for pattern in sorted(unplaced):
        if not pattern.endswith(("weight", "kernel", "vars/0")):
            continue
        module = pattern.rsplit("." if torch_style else "/", 2 if not torch_style else 1)[0]
        parent, _, child = module.rpartition(".")
        key = parent if child.isdigit() else module
        modules.setdefault(key, []).append((int(child) if child.isdigit() else 0, pattern))
    for parent, members in modules.items():
        members.sort()
        linears = [p for _, p in members if len(rows[p][0]) == 2]
        norms = [p for _, p in members if rows[p][0] == (d,)]
        if len(linears) == 1 and not norms:
            d_in, d_out = kernel_shape(linears[0])
            if d_out == d and d_in != d:
                place(linears[0], f"{side}_embed")  # one-hot ids -> d_model
            elif d_in == d:
                place(linears[0], "output")
        elif len(linears) == 2 and len(norms) <= 1 and kernel_shape(linears[0]) == (d, d) \
                and kernel_shape(linears[1])[0] == d:
            place(linears[0], "head.dense")
            place(linears[1], "output")
            if norms:
                place(norms[0], "head.norm")
    return out


def alternatives(path: Path, state: Mapping[str, np.ndarray], torch_style: bool
                 ) -> tuple[dict[str, list[str]], dict]:
    """external pattern -> the candidate mappings to try (the scaffold's guess first)."""
    rows = user.group_keys(state, torch_style)
    guesses = user.guess_all(rows, torch_style)
    out = {p: [g] for p, g in guesses.items()}
    for pattern, guess in guesses.items():
        words = guess.split()
        if len(words) == 2 and words[1] in _FUSED_ALTERNATIVE:
            out[pattern].append(f"{words[0]} {_FUSED_ALTERNATIVE[words[1]]}")
    out.update(_unlayered_alternatives(rows, guesses, torch_style, _width(guesses, rows)))
    return out, rows


# --- importing and running one candidate --------------------------------------------------------------------------------

def _layout(mapping: Mapping[str, str], fields: Mapping[str, Any], path: Path) -> user.Layout:
    table = []
    for external, value in mapping.items():
        canonical, transform = (value.split() + ["identity"])[:2]
        table.append((canonical, external, transform))
    return user.Layout(path, dict(fields), table, {})


def _import(layout: user.Layout, checkpoint: user.Checkpoint, fields: Mapping[str, Any]):
    """(config, weights) of the checkpoint through `layout`, as `convert --layout` reads it."""
    copy = user.Checkpoint(dict(checkpoint.state), checkpoint.hparams)
    config, weights, _ = user.import_layout(layout, copy, fields, path=layout.path)
    return config, weights


def _relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    if ours.shape != theirs.shape or not np.all(np.isfinite(ours)):
        return math.inf
    scale = float(np.max(np.abs(theirs))) or 1.0
    return float(np.max(np.abs(ours - theirs))) / scale


def _forward(config, weights, batch, dtype=np.float64) -> np.ndarray:
    model = rn.Transformer(config, weights, dtype)
    if config.is_encoder_decoder:
        return model(batch["src_ids"], batch["tgt_ids"])
    return model(batch["src_ids"])


def _probe_batch(config: rn.TransformerConfig, avoid: Sequence[int], seed: int, length: int = 11,
                 pad: int | None = None) -> dict[str, np.ndarray]:
    """Two rows of ids that avoid every candidate pad id (`pad`: the second row ends in three of it)."""
    rng = np.random.default_rng(seed)

    def ids(vocab: int) -> np.ndarray:
        allowed = np.setdiff1d(np.arange(vocab), np.asarray(avoid))
        if allowed.size == 0:
            allowed = np.arange(vocab)
        out = rng.choice(allowed, size=(2, min(length, config.max_len)))
        if pad is not None:
            out[1, -3:] = pad
        return out.astype(np.int64)

    if config.is_decoder_only:
        return {"src_ids": ids(config.tgt_vocab_size)}
    batch = {"src_ids": ids(config.src_vocab_size)}
    if config.is_encoder_decoder:
        batch["tgt_ids"] = ids(config.tgt_vocab_size)
    return batch


# --- the search ---------------------------------------------------------------------------------------------------------

@dataclass
class _Search:
    """What every stage of `settle` reads: the checkpoint, the probe inputs and the source's output on them."""

    path: Path
    checkpoint: Any
    batch: dict[str, np.ndarray]
    theirs: np.ndarray
    base_fields: dict[str, Any]
    switches: dict[str, tuple]
    progress: Callable[[str], None] | None
    candidates: list[Candidate] = field(default_factory=list)
    tried: int = 0


def settle(path: str | Path, source: Source, fields: Mapping[str, Any] | None = None,
           progress: Callable[[str], None] | None = None, where: str = "the source") -> Settled:
    """Probe `source` to settle the layout of the checkpoint at `path` (see the module docstring)."""
    user_source = source
    source = lambda batch: call_source(user_source, batch, where)  # noqa: E731
    from transformer_parity.io.sniff import sniff

    path = Path(path)
    fields = dict(fields or {})
    checkpoint = user.read_checkpoint(path)
    torch_style = sniff(path) != "hdf5"
    found = _mappings(path, checkpoint, user_source, torch_style)
    if isinstance(found, Settled):
        return found
    mappings, roles_of_calls, rows = found
    search, base, _, notes, pads = _stage0(path, checkpoint, mappings, source, fields, progress)
    _search_mappings(search, mappings)
    if roles_of_calls is not None and not any(c.config is not None and c.error <= NAMES_MISS
                                              for c in search.candidates):
        traced = roles_of_calls()  # the names' layout is far off the source: what the source does settles the roles
        _search_mappings(search, traced)
        mappings = mappings + traced
    candidates = sorted((c for c in search.candidates if c.config is not None), key=lambda c: c.error)
    if not candidates:
        error = _first_error(mappings, path, checkpoint, search.base_fields)
        raise ValueError(f"{path}: no candidate layout reads these weights: {error}")
    survivors = candidates[:24]
    if "layer_norm_eps" not in fields:  # stage 2: epsilon, on the survivors
        survivors = _refine_epsilon(search, survivors)
    return _conclude(search, survivors, candidates, base, source, fields, rows, notes, pads)


def _mappings(path: Path, checkpoint, user_source: Source, torch_style: bool):
    """`(mappings, roles_of_calls, rows)`: the names' layouts to try (the scaffold's guesses; a fused q/k/v's other
    order) and a function giving the roles the source's calls give (`layouts.roles`: one traced source call), for
    when the names' layout is far off; the roles alone (and None) when names leave a tensor unplaced. A `Settled`
    that says why when neither places every tensor."""
    state = checkpoint.state
    options, rows = alternatives(path, state, torch_style)
    unplaced = sorted(p for p, opts in options.items() if opts == [user.UNMAPPED])
    fixed = {p: o[0] for p, o in options.items()}

    def roles_of_calls() -> list[dict[str, str]]:
        return roles.candidates(_trace(user_source, state, torch_style), state, torch_style, fixed)[0]

    if unplaced:
        traced, why = roles.candidates(_trace(user_source, state, torch_style), state, torch_style, fixed)
        if traced:
            return traced, None, rows
        text = _render(path, fixed, {}, rows, None)
        return Settled(text, math.inf, math.inf, math.inf, 0,
                       [f"no candidate for {len(unplaced)} tensor(s) whose name says nothing: "
                        f"{', '.join(unplaced[:6])}, and the source's calls do not place them ({why}); map them by "
                        "hand (docs/layouts.md)"])
    # the alternatives are the fused q/k/v orders: one model uses one attention class, so one choice for all
    mappings = [fixed] + ([{p: o[-1] for p, o in options.items()}] if any(len(o) > 1 for o in options.values())
                          else [])
    return mappings, roles_of_calls, rows


def _stage0(path: Path, checkpoint, mappings, source, fields: dict[str, Any], progress) -> tuple:
    """Stage 0: what the shapes say, from the first mapping that imports at all; every setting a layout must state
    (`user.scaffold_fields`) is searched, measured (`max_len`), or (the pad id, epsilon) settled in a later stage.
    Returns `(search, base config, needed fields, notes, candidate pad ids)`."""
    needed = [n for n in user.scaffold_fields(list(mappings[0].values())) if n not in fields]
    base_fields = {"dropout": 0.0, **{n: STAGED_START[n] for n in needed if n in STAGED_START}, **fields}
    base_fields.update({n: options[0] for n, options in {**SWITCHES, **HEAD_SWITCHES, **SEARCHED}.items()
                        if n in needed})
    if "num_heads" in needed:
        base_fields["num_heads"] = 1
    base = None
    for mapping in mappings:
        try:
            base = _import(_layout(mapping, base_fields, path), checkpoint, base_fields)[0]
            break
        except ValueError:
            continue
    if base is None:
        error = _first_error(mappings, path, checkpoint, base_fields)
        raise ValueError(f"{path}: no candidate layout reads these weights: {error}")
    notes = []
    if "max_len" in needed:  # no position table: the longest input the source takes, measured
        base_fields["max_len"], note = _settle_max_len(source, base)
        base = base.replace(max_len=base_fields["max_len"])
        notes.append(note)
    vocab = min(base.src_vocab_size, base.tgt_vocab_size)
    pads = tuple(dict.fromkeys(p for p in (0, 1, 2, 3, vocab - 1) if 0 <= p < vocab))
    batch = _probe_batch(base, pads, seed=0)
    everything = {**SWITCHES, **HEAD_SWITCHES, **SEARCHED}
    switches = {n: everything[n] for n in needed if n in everything}
    if "num_heads" in needed:
        switches["num_heads"] = tuple(h for h in range(1, base.d_model + 1) if base.d_model % h == 0
                                      and base.d_model // h >= 2)
    search = _Search(path, checkpoint, batch, source(batch), base_fields, switches, progress)
    return search, base, needed, notes, pads


def _search_mappings(search: _Search, mappings: list[dict[str, str]]) -> None:
    """Stage 1, for each mapping: every head count with every attention scale (they interact), and from each pair
    the other switches by coordinate descent; every candidate run is kept in `search.candidates`."""
    switches = search.switches
    outer = [n for n in ("num_heads", "attention_scale") if n in switches]
    inner = [n for n in switches if n not in outer]
    for mapping in mappings:
        for heads in switches.get("num_heads", (search.base_fields.get("num_heads"),)):
            trial = {**search.base_fields, "num_heads": heads}
            try:
                config0, weights = _import(_layout(mapping, trial, search.path), search.checkpoint, trial)
            except ValueError:
                continue
            for scale in switches.get("attention_scale", (None,)):
                if scale == "model" and heads == 1:
                    continue  # the same function as "head" with one head
                start = {n: switches[n][0] for n in inner}
                if scale is not None:
                    start["attention_scale"] = scale
                _descend(search, mapping, trial, config0, weights, start, inner)


def _descend(search: _Search, mapping, trial, config0, weights, current: dict[str, Any], inner: list[str]) -> None:
    """Coordinate descent over the `inner` switches from `current`, each candidate run once."""
    seen: dict[tuple, float] = {}

    def error_of(values: Mapping[str, Any]) -> float:
        key = tuple(sorted(values.items()))
        if key not in seen:
            try:
                seen[key] = _relative(_forward(_with(config0, values), weights, search.batch), search.theirs)
            except ValueError:
                seen[key] = math.inf
            search.candidates.append(Candidate(mapping, {**trial, **values}, seen[key],
                                               _with(config0, values) if math.isfinite(seen[key]) else None,
                                               weights))
        return seen[key]

    best = error_of(current)
    for _ in range(4):  # passes until nothing improves
        improved = False
        for name in inner:
            for value in search.switches[name]:
                error = error_of({**current, name: value})
                if error < best:
                    best, current, improved = error, {**current, name: value}, True
        if not improved:
            break
    search.tried += len(seen)
    if search.progress:
        search.progress(f"tried {search.tried} candidate layouts")


def _refine_epsilon(search: _Search, survivors: list[Candidate]) -> list[Candidate]:
    """Stage 2: each survivor at every epsilon of `EPSILONS`; the best 24."""
    refined = []
    for c in survivors:
        for eps in EPSILONS:
            search.tried += 1
            config = c.config.replace(layer_norm_eps=eps)
            refined.append(Candidate(c.mapping, {**c.fields, "layer_norm_eps": eps},
                                     _relative(_forward(config, c.weights, search.batch), search.theirs),
                                     config, c.weights))
    return sorted(refined, key=lambda c: c.error)[:24]


def _conclude(search: _Search, survivors, candidates, base, source, fields, rows, notes, pads) -> Settled:
    """The verify rule on the best candidate, the settings matching candidates disagree on, stage 3 (the pad id),
    and the layout text with its evidence."""
    best = survivors[0]
    source_dtype = "float64" if search.theirs.dtype == np.float64 else "float32"
    floor = _floor(best.config, best.weights, search.batch, source_dtype)
    scale = float(np.max(np.abs(search.theirs))) or 1.0
    tolerance = RATIO_LIMIT * floor / scale  # relative, as the candidates' errors are
    passing = [c for c in survivors if c.error <= tolerance]
    unsettled = []
    if not passing:
        unsettled.append(f"no candidate matches the source: the closest is {best.error * scale:.3g} off "
                         f"({best.error * scale / floor:.1f} floors; {_describe(best)}); the model may use something "
                         "this tool does not express")
    else:
        unsettled += _disagreements(passing, list(search.switches) + ["layer_norm_eps"], source, base)
    chosen = dict(best.fields)
    pad_evidence: dict[str, tuple[float, Any, float]] = {}
    if "pad_id" not in fields and not unsettled:  # stage 3: the pad id
        chosen["pad_id"], pad_note, pad_evidence = _settle_pad(best, pads, source)
        if pad_note:
            unsettled.append(pad_note)
    ours = _forward(best.config.replace(pad_id=chosen["pad_id"]) if "pad_id" in chosen else best.config,
                    best.weights, search.batch)
    error = float(np.max(np.abs(ours - search.theirs)))
    chosen.pop("dropout", None)
    settled = {k: v for k, v in chosen.items() if k not in fields}
    text = _render(search.path, best.mapping, settled, rows, (error, floor, source_dtype, search.tried, unsettled))
    head, _, rest = text.partition("\n")
    text = "\n".join([head] + [f"# {note}" for note in notes] + [rest])
    evidence = {**_evidence(best, candidates + survivors, settled, scale), **pad_evidence}
    return Settled(text, error, floor, error / floor, search.tried, unsettled, source_dtype, settled, evidence)


def _evidence(best: Candidate, tried: Sequence[Candidate], settled: Mapping[str, Any], scale: float
              ) -> dict[str, tuple[float, Any, float]]:
    """For each settled field the search varied: the chosen candidate's error and that of the best candidate with
    the same mapping and another value of that field (absolute, as the source's output is)."""
    out = {}
    for name, value in settled.items():
        if name == "pad_id":  # the structure ran on inputs without padding: `_settle_pad` has its evidence
            continue
        others = [c for c in tried if c.mapping == best.mapping and name in c.fields and c.fields[name] != value
                  and math.isfinite(c.error)]
        if others:
            runner = min(others, key=lambda c: c.error)
            out[name] = (best.error * scale, runner.fields[name], runner.error * scale)
    return out


def _trace(source: Source, state: Mapping[str, np.ndarray], torch_style: bool) -> roles.Trace:
    """The source's module calls (`roles.trace`) on a small batch of ids 2..4 (any vocabulary has them): the
    source ids alone, or with target ids when the source needs them (an encoder-decoder); [] if it takes neither."""
    src = np.array([[2, 3, 4, 2, 3], [3, 4, 2, 4, 4]], np.int64)
    tgt = np.array([[4, 2, 3, 3], [2, 2, 4, 3]], np.int64)
    for batch in ({"src_ids": src}, {"src_ids": src, "tgt_ids": tgt}):
        try:
            return roles.trace(source, batch, state, torch_style)
        except Exception:  # noqa: BLE001 (the user's code: a batch it does not take is tried the other way)
            continue
    return roles.Trace([], [])


def _with(config: rn.TransformerConfig, values: Mapping[str, Any]) -> rn.TransformerConfig:
    """`config` with switch values; a learned table keeps its rows when the position offset changes."""
    values = dict(values)
    if "position_offset" in values:
        values["max_len"] = config.position_rows - values["position_offset"]
    return config.replace(**values)


def _settle_max_len(source: Source, base: rn.TransformerConfig) -> tuple[int, str]:
    """The longest input the source accepts (no position table tells it): doubling from 64, then bisecting, up to
    `MAX_LEN_CAP`. Any error from the source at a length counts as 'too long'. One row a probe: a length is taken or
    refused whatever the batch, and the longest probes are most of the time a scaffold's probing takes."""
    def accepts(length: int) -> bool:
        config = base.replace(max_len=max(length, base.max_len))
        batch = {name: ids[:1] for name, ids in _probe_batch(config, (), seed=3, length=length).items()}
        try:
            source(batch)
            return True
        except ValueError:
            return False

    good, bad = 0, None
    length = 64
    while length <= MAX_LEN_CAP:
        if not accepts(length):
            bad = length
            break
        good, length = length, length * 2
    if bad is None:
        if good < MAX_LEN_CAP and accepts(MAX_LEN_CAP):
            good = MAX_LEN_CAP
        return good, f"max_len={good}: the source took every length probed, up to {good}"
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if accepts(mid) else (good, mid)
    if good == 0:
        raise ValueError(f"the source refuses every input length probed (even {bad}): cannot measure max_len")
    return good, f"max_len={good}: the longest input the source took (it refused {bad})"


def _first_error(mappings, path, checkpoint, fields) -> str:
    """Why the scaffold's own mapping does not read the weights (for the message when no candidate does)."""
    try:
        _import(_layout(mappings[0], fields, path), checkpoint, fields)
    except ValueError as exc:
        return str(exc)
    return "every candidate failed to import"


def _floor(config, weights, batch, source_dtype: str) -> float:
    """The verify floor of the output: the reference's own float32 rounding (scaled to float64 for a float64
    source), never below one float32 rounding of the output's largest value."""
    judge = _forward(config, weights, batch)
    return tolerances.floor(_forward(config, weights, batch, np.float32), judge, source_dtype)


def _describe(c: Candidate) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in c.fields.items() if k != "dropout")


def _disagreements(passing: Sequence[Candidate], names, source, base) -> list[str]:
    """Settings on which candidates that all match the source disagree, after a second, longer probe (two settings
    that agree on one probe may not on another). Candidates that compute the same function are not a problem."""
    if len(passing) == 1:
        return []
    batch = _probe_batch(base, (), seed=1, length=min(17, base.max_len))
    theirs = source(batch)
    scale = float(np.max(np.abs(theirs))) or 1.0
    errors = [_relative(_forward(c.config, c.weights, batch), theirs) for c in passing]
    best = min(errors)
    floor = _floor(passing[0].config, passing[0].weights, batch,
                   "float64" if theirs.dtype == np.float64 else "float32") / scale
    still = [c for c, e in zip(passing, errors) if e <= RATIO_LIMIT * floor or e <= best]
    out = []
    for name in names:
        values = sorted({repr(c.fields.get(name)) for c in still})
        if len(values) > 1:
            out.append(f"{name}: {', '.join(values)} all match the source within rounding; state it in [config]")
    if len({tuple(sorted(c.mapping.items())) for c in still}) > 1:
        differing = sorted({p for c in still for p, v in c.mapping.items() if v != still[0].mapping[p]})
        out.append(f"the mapping of {', '.join(differing)}: several candidates match the source; state it")
    return out


def _settle_pad(best: Candidate, pads, source) -> tuple[int | None, str | None, dict]:
    """The pad id: for each candidate id, inputs whose second row ends in three of it. The id is padding when the
    source's output matches the chosen layout with that id masked, within the verify rule, and does not match it
    unmasked; no id behaving so means no pad token. Returns (pad id, what could not be settled or None, evidence:
    {"pad_id": (its error, the runner-up, the runner-up's error)}: masked against unmasked on its padded probe)."""
    masked, off, errors = [], [], {}
    for pad in pads:
        batch = _probe_batch(best.config, [p for p in pads if p != pad], seed=2, pad=pad)
        theirs = source(batch)
        config = best.config.replace(pad_id=pad)
        tolerance = RATIO_LIMIT * _floor(config, best.weights, batch, "float64" if theirs.dtype == np.float64
                                         else "float32") / (float(np.max(np.abs(theirs))) or 1.0)
        as_pad = _relative(_forward(config, best.weights, batch), theirs)
        as_token = _relative(_forward(best.config.replace(pad_id=None), best.weights, batch), theirs)
        errors[pad] = (as_pad, as_token, float(np.max(np.abs(theirs))) or 1.0)
        if as_pad <= tolerance < as_token:
            masked.append(pad)
        elif as_pad > tolerance and as_token > tolerance:
            off.append(pad)
    if off:
        return None, (f"padding: inputs padded with id {off[0]} match the source neither masked nor unmasked; the "
                      "model treats padding in a way this tool does not express, or pads with another id"), {}
    if len(masked) > 1:
        return masked[0], (f"pad_id: ids {', '.join(map(str, masked))} are all masked by the source; state pad_id "
                           "in [config]"), {}
    pad = masked[0] if masked else None
    first = pad if pad is not None else pads[0]
    as_pad, as_token, scale = errors[first]
    evidence = (as_pad * scale, None, as_token * scale) if pad is not None else (as_token * scale, first,
                                                                                   as_pad * scale)
    return pad, None, {"pad_id": evidence}


def _render(path: Path, mapping: Mapping[str, str], settled: Mapping[str, Any], rows,
            evidence: tuple | None) -> str:
    lines = [f"# Layout for {path.name}, settled by probing the source model."]
    if evidence is not None:
        error, floor, source_dtype, tried, unsettled = evidence
        lines.append(f"# {tried} candidates tried; the chosen layout is {error:.3g} off the source's {source_dtype} "
                     f"output ({error / floor:.2f} floors; verify's limit is {RATIO_LIMIT:g}).")
        lines += [f"# NOT SETTLED: {u}" for u in unsettled]
    lines.append("[config]")
    for key, value in settled.items():
        lines.append(f"{key} = {_toml_value(value)}")
    lines += ["", "[weights]"]
    width = max(len(user._toml_key(p)) for p in mapping) + 1
    for pattern, value in mapping.items():
        shape, indices, _ = rows[pattern]
        count = f" x{len(indices)}" if indices != {None} else ""
        lines.append(f"{user._toml_key(pattern):<{width}} = \"{value}\"  # {shape}{count}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def load_settled(load: Callable[[Mapping[str, Any]], Any], path: str | Path, fields: Mapping[str, Any],
                 spec: str | None, notes: list[str]) -> tuple[Any, dict[str, Any]]:
    """`(load(fields), {})`, and where the checkpoint does not tell some settings (`hparams.Unstated`) and a source is
    given (`spec`, FILE.py:NAME), those settings settled by probing it, as `layout --scaffold --source` does: each
    settled value goes into `notes` with its error against the source and that of the runner-up, and the settled
    values are returned beside. Without a source, or when probing cannot settle them, the refusal stands (naming what
    probing found)."""
    from transformer_parity.layouts.hparams import Unstated
    from transformer_parity.io.user_code import load_callable

    try:
        return load(fields), {}
    except Unstated as exc:
        if spec is None:
            raise
        missing = exc.missing
    settled = settle(path, load_callable(spec), fields, where=f"--source {spec}")
    found = {name: settled.fields[name] for name in missing if name in settled.fields}
    if not settled.passed or len(found) != len(missing):
        why = settled.unsettled[0] if settled.unsettled else f"the closest layout is {settled.ratio:.1f} floors off"
        raise Unstated(f"{Path(path).name} does not say {', '.join(missing)}, and probing --source {spec} did not "
                       f"settle them ({why}); give them with --set FIELD=VALUE", missing)
    for name, value in found.items():
        shown = "none" if value is None else repr(value)
        if name in settled.evidence:
            error, other, other_error = settled.evidence[name]
            why = (f"{error:.2g} off the source; the runner-up {name}={'none' if other is None else repr(other)}: "
                   f"{other_error:.2g}")
        else:
            why = f"{settled.error:.2g} off the source"
        notes.append(f"settled by probing --source: {name}={shown} ({why})")
    notes.append(f"probing --source: {settled.tried} candidate layouts tried; the chosen one {settled.error:.2g} off "
                 f"the source's {settled.source_dtype} output ({settled.ratio:.2f} floors)")
    return load({**fields, **found}), found
