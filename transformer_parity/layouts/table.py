"""The product's side of the mapping language (`reference_numpy.mapping`, the one table language and engine): what
a user sees when a table is applied to a real file.

- the layer counts and sizes a config states are checked against the tensors before anything of the config's size is
  listed or allocated (`check_layers`, `size_mismatches`), with messages naming where each field came from;
- the optional kinds are checked: a `tied` copy must equal its canonical array, a `sinusoid` buffer must be the table
  the model computes (in any of the usual layouts, `sinusoid_rows`, and within the float32 rounding of a table a
  tutorial builds in float32, `sinusoid_error`; the pad's zero row of a table read over non-pad tokens), a
  `causal_mask` must be the layer's (causal, and within its window on a sliding layer);
- an `ignore` entry may drop integer or boolean buffers and all-zero tensors; a float tensor with a nonzero value is a
  trained parameter or a constant the model uses, so dropping it is refused unless the user names it (`Drops`, the
  CLI's `--allow-drop`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

import reference_numpy as rn
from reference_numpy.mapping import (CHECKED, Entry, ShapeMismatch, canonical_shape, hits, index, plan, preview,
                                     quoted, regex)

from transformer_parity.io import limits
from transformer_parity.streaming.lazy import deferred

# --- what the weights hold, against what a config says --------------------------------------------------------------

_LAYER = re.compile(r"(encoder|decoder)\.layers\.(\{i\}|0|[1-9][0-9]{0,17})\.")


def layer_indices(table: Sequence[Entry], keys: Iterable[str]) -> dict[str, set[int]]:
    """`{"encoder": {0, 1, ...}, "decoder": {...}}`: the layer indices the keys hold, read through the entries whose
    canonical name is a layer's (`encoder.layers.{i}.` or an explicit `encoder.layers.3.`)."""
    entries = []
    for canonical, external, _ in table:
        m = _LAYER.match(canonical)
        if m:
            entries.append((external, (m[1], None if m[2] == "{i}" else int(m[2]))))
    literal, patterned = index(entries)
    found: dict[str, set[int]] = {"encoder": set(), "decoder": set()}
    for key in keys:
        for groups, (stack, number) in hits(key, literal, patterned):
            number = number if number is not None else groups.get("i")
            if number is not None:
                found[stack].add(int(number))
    return found


def _held(stack: str, indices: set[int]) -> str:
    """`2 decoder layers (0, 1)`, `no encoder layers`, `decoder layers 0, 999999999 (index 1 missing)`."""
    ordered = sorted(indices)
    if not ordered:
        return f"no {stack} layers"
    if ordered[-1] == len(ordered) - 1:
        shown = ", ".join(map(str, ordered)) if len(ordered) <= 3 else f"0 to {ordered[-1]}"
        return f"{len(ordered)} {stack} layer{'s' if len(ordered) > 1 else ''} ({shown})"
    shown = ", ".join(map(str, ordered[:4])) + (f", ... {ordered[-1]}" if len(ordered) > 4 else "")
    missing = next(i for i in range(len(ordered) + 1) if i not in indices)
    return f"{stack} layers {shown} (index {missing} missing)"


def check_layers(config: rn.TransformerConfig, table: Sequence[Entry], keys: Iterable[str], source: str,
                 origins: Mapping[str, str] | None = None) -> None:
    """Refuse a config whose layer counts are not the layers the weights hold (indices 0 to N-1 through the table),
    before a parameter list of the config's size exists: a config.json saying `n_layer: 10**9` next to two layers
    ends here. `origins` says where a field came from (`config.json n_layer`), for the message."""
    found = layer_indices(table, keys)
    for stack in ("encoder", "decoder"):
        name = f"num_{stack}_layers"
        value, have = getattr(config, name), found[stack]
        weighted = config.encoder_weight_layers if stack == "encoder" else value  # 1 under shared_layers
        if len(have) != weighted or (have and (min(have) != 0 or max(have) != weighted - 1)):  # not 0 .. weighted-1
            shared = " with shared_layers (one set of layer weights)" if weighted != value else ""
            raise ValueError(f"{source}: config field {name}={value}{_origin(origins, name)}{shared} does not match "
                             f"the weights, which hold {_held(stack, have)}; refusing before allocating anything")


def _origin(origins: Mapping[str, str] | None, name: str) -> str:
    return f" ({origins[name]})" if origins and name in origins else ""


# (canonical name, axis of its canonical shape, config field): the sizes a tensor's shape tells
_SIZES = [
    (r"(src|tgt)_embed\.embedding", 1, "d_model"),
    (r"(.*\.)?[a-z_]*norm[0-9]?\.gamma", 0, "d_model"),
    (r"src_embed\.embedding", 0, "src_vocab_size"),
    (r"tgt_embed\.embedding", 0, "tgt_vocab_size"),
    (r"output\.kernel", 1, "tgt_vocab_size"),
    (r"output\.bias", 0, "tgt_vocab_size"),
    (r"src_type\.embedding", 0, "type_vocab_size"),
    (r".*\.ffn\.linear1\.bias", 0, "d_ff"),
    (r".*\.ffn\.linear1\.kernel", 1, "d_ff"),
    (r"(src|tgt)_pos\.embedding", 0, "max_len"),
]


def size_mismatches(config: rn.TransformerConfig, mapping: Mapping[str, tuple[str, str, int]],
                    state: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> list[str]:
    """`"d_model=1000000000 (config.json n_embd), the weights hold 16 (wte.weight ...)"` for each size field of
    `config` that every tensor telling it contradicts with one value (empty if none: a tensor stored in the wrong
    orientation disagrees with its siblings, not with the config)."""
    expected = rn.parameter_shapes(config)
    held: dict[str, dict[int, str]] = {}  # field -> {value the weights hold: an external name holding it}
    for name, (external, transform, _) in mapping.items():
        actual = canonical_shape(transform, np.shape(state[external]))
        for pattern, axis, field in _SIZES:
            # a tensor tells a field where the config sizes that axis by it (not ALBERT's embedding_size-wide tables)
            if actual is not None and re.fullmatch(pattern, name) and len(actual) > axis \
                    and len(expected[name]) > axis and expected[name][axis] == _wanted(config, field):
                held.setdefault(field, {}).setdefault(actual[axis], external)
    out = []
    for field, values in held.items():
        wanted = _wanted(config, field)
        if len(values) != 1 or wanted in values:
            continue
        (value, external), = values.items()
        offset = f" rows with position_offset={config.position_offset}" if field == "max_len" and \
            config.position_offset else ""
        out.append(f"{field}={getattr(config, field)}{_origin(origins, field)}, the weights hold {value}{offset} "
                   f"({external} has shape {tuple(np.shape(state[external]))})")
    return out


def _wanted(config: rn.TransformerConfig, field: str) -> int:
    """The size a field gives a tensor's axis (`max_len`: the position table's rows)."""
    return config.position_rows if field == "max_len" else getattr(config, field)


def _optional(config: rn.TransformerConfig, table: Sequence[Entry], state_keys: Iterable[str],
              wanted: set[str]) -> dict[str, tuple[str, str, int | None]]:
    """external name -> (transform, canonical, layer) for the tied / sinusoid / ignored entries present in the state;
    layer: the `{i}` the name holds (a layer's causal mask is that layer's), else None."""
    shapes = rn.parameter_shapes(config)
    out = {}
    for canonical, external, transform in table:
        if transform not in CHECKED:
            continue
        if transform == "tied" and canonical not in shapes:
            continue
        if transform == "sinusoid" and config.positional != "sinusoidal":
            continue
        pattern = regex(external)
        for key in state_keys:
            found = pattern.fullmatch(key) if key not in wanted else None
            if found:
                layer = found.groupdict().get("i")
                out[key] = (transform, canonical, None if layer is None else int(layer))
    return out


@dataclass
class Drops:
    """Which nonzero float tensors `ignore` entries may drop, and what they dropped.

    `allowed` holds the names the user gave (`--allow-drop NAME`): a key, or a pattern with `{i}` for every layer.
    """

    allowed: tuple[str, ...] = ()
    dropped: list[str] = field(default_factory=list)  # the nonzero tensors dropped because the user allowed it
    notes: list[str] = field(default_factory=list)  # "dropped (--allow-drop): NAME (shape, max |x|)"

    def __post_init__(self) -> None:
        for name in self.allowed:
            try:
                regex(name)
            except ValueError as exc:
                raise ValueError(f"--allow-drop {exc}") from None

    def allows(self, key: str) -> bool:
        return any(name == key or regex(name).fullmatch(key) for name in self.allowed)

    def unused(self) -> list[str]:
        """The allowed names that matched no dropped tensor (a typo, or a name for another file)."""
        return [name for name in self.allowed if not any(key == name or regex(name).fullmatch(key)
                                                         for key in self.dropped)]


def needs_consent(array) -> bool:
    """A tensor that `ignore` may not drop silently: floating point with a nonzero (or NaN) value."""
    array = np.asarray(array)
    return np.issubdtype(array.dtype, np.floating) and bool(np.any(array != 0))


def describe(key: str, array) -> str:
    """`name (shape (2, 64), max |x| 0.53)` for messages about a dropped tensor."""
    array = np.asarray(array)
    peak = float(np.max(np.abs(array))) if array.size else 0.0
    return f"{key} (shape {tuple(array.shape)}, max |x| {peak:.3g})"


def check_drops(state: dict[str, np.ndarray], ignored: Iterable[str], drops: Drops | None, source: str) -> None:
    """Refuse, in one line, to drop any float tensor with a nonzero value that the user did not name; record those
    the user named in `drops`."""
    drops = drops if drops is not None else Drops()
    refused = []
    for key in ignored:
        if not needs_consent(state[key]):
            continue  # an integer or boolean buffer (position ids, a causal mask) or an all-zero tensor
        if drops.allows(key):
            drops.dropped.append(key)
            drops.notes.append("dropped (--allow-drop): " + describe(key, state[key]))
        else:
            refused.append(describe(key, state[key]))
    if refused:
        raise ValueError(f"{source}: {len(refused)} tensor(s) marked ignore hold nonzero values, so dropping them "
                         f"would change the model: {preview(refused, sep='; ')}; map each to a canonical name, or "
                         f"drop it knowingly with --allow-drop NAME (a key, or a pattern with {{i}})")


def import_state(config: rn.TransformerConfig, state: dict[str, np.ndarray], table: Sequence[Entry],
                 source: str = "<state dict>", consume: bool = False, drops: Drops | None = None,
                 where: Callable[[Entry], str] = quoted, origins: Mapping[str, str] | None = None,
                 lazy: bool = False, skipped: list[str] | None = None) -> dict[str, np.ndarray]:
    """{external name: array} -> canonical weights. `consume=True` empties `state` as it goes. A float tensor
    with a nonzero value under an `ignore` entry is refused unless `drops` allows it (and then recorded there).
    The config's layer counts and sizes are checked against the tensors before anything of the config's size is
    listed or allocated; `origins` names where a field came from (`config.json n_layer`), `where` a table entry.
    `skipped` receives a description of each buffer left out because it holds what the model recomputes."""
    check_layers(config, table, state, source, origins)
    limits.check_positions(config, source, (origins or {}).get("max_len", ""))
    shapes = rn.parameter_shapes(config)
    try:
        mapping = plan(shapes, table, where)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    wanted = {external for external, _, _ in mapping.values()}
    optional = _optional(config, table, list(state), wanted)
    try:
        rn.mapping.check_keys(mapping, state, optional)
        rn.mapping.check_shapes(mapping, state, shapes, config.head_dim)
    except ShapeMismatch as exc:  # a config that contradicts the file misshapes nearly every tensor: one line
        sizes = size_mismatches(config, mapping, state, origins)
        raise ValueError(f"{source}: " + (f"the config does not match the weights: {'; '.join(sizes)}" if sizes
                                          else str(exc))) from None
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    check_floating(state, wanted, source)
    check_drops(state, [k for k, (t, *_) in optional.items() if t == "ignore"], drops, source)
    weights = rn.mapping.read(mapping, state, shapes, config.head_dim, consume=consume,
                              defer=deferred if lazy else None)
    for external, (transform, canonical, layer) in optional.items():
        _check_optional(config, weights, state[external], external, transform, canonical, source, layer)
        if skipped is not None and transform in (*BUFFERS, "causal_mask", "sinusoid"):
            skipped.append(describe_buffer(transform, external, state[external]))
        if consume:
            del state[external]
    try:
        rn.validate_weights(config, weights)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return weights


def check_floating(state: Mapping[str, Any], parameters: Iterable[str], source: str) -> None:
    """Refuse a parameter stored as integers or booleans (files may hold such buffers, never such parameters)."""
    for key in parameters:
        dtype = np.dtype(getattr(state[key], "dtype", np.float32))
        if dtype.kind not in "fV":  # V: bfloat16 as some readers hold it
            raise ValueError(f"{source}: tensor {key!r} has dtype {dtype}, expected a floating dtype")


def _check_optional(config, weights, array, external: str, transform: str, canonical: str, source: str,
                    layer: int | None = None) -> None:
    array = np.asarray(array)
    if transform == "tied":
        if array.shape != weights[canonical].shape or not np.array_equal(array, weights[canonical]):
            raise ValueError(f"{source}: {external} should repeat {canonical} (a tied output layer) but differs; "
                             "an untied head needs tie_word_embeddings=false in config.json")
    elif transform == "sinusoid":
        rows = sinusoid_rows(array, config.d_model)
        if rows is None:
            raise ValueError(f"{source}: {external} has shape {array.shape}; a sinusoid table of d_model="
                             f"{config.d_model} is (max_len, {config.d_model}), (max_len, 1, {config.d_model}) or "
                             f"(1, max_len, {config.d_model})")
        problem = sinusoid_mismatch(_pad_row_as_read(config, rows), config.sinusoid_layout,
                                    config.sinusoid_frequencies)
        if problem:
            other = classify_sinusoid(rows)
            hint = (f"; it is the {other} table: sinusoid_layout = \"{other}\"" if other else
                    "; a learned or altered table is a parameter: map it to src_pos.embedding / tgt_pos.embedding")
            raise ValueError(f"{source}: {external} {array.shape} is not the sinusoid table the model computes: "
                             f"{problem}{hint}")
    elif transform in BUFFERS:
        problem = BUFFERS[transform](config, array)
        if problem:
            raise ValueError(f"{source}: {external} {array.shape} {array.dtype} is mapped {transform} but {problem}; "
                             "a buffer holding anything else changes the model, so it is not skipped")
    elif transform == "causal_mask":
        _check_causal_mask(config, array, external, source, layer)


def _check_causal_mask(config, array: np.ndarray, external: str, source: str, layer: int | None) -> None:
    """A layer's stored attention mask must be the one it computes: causal, and on a layer that attends within a
    sliding window (`layer_window`) also zero at `i - j >= window` (GPT-Neo's local layers store such a band)."""
    square = array.reshape(array.shape[-2:]) if array.ndim >= 2 and array.size == np.prod(array.shape[-2:]) \
        else None  # (1, 1, n, n) -> (n, n)
    window = config.layer_window(layer) if layer is not None and layer < config.num_decoder_layers else None
    if square is None or square.shape[0] != square.shape[1]:
        raise ValueError(f"{source}: {external} {array.shape} is mapped causal_mask but is not a square mask; a "
                         "buffer holding anything else changes the model")
    n = square.shape[0]
    wanted = np.tri(n, dtype=bool) if window is None else np.tri(n, dtype=bool) & ~np.tri(n, k=-window, dtype=bool)
    if not np.array_equal(square != 0, wanted):
        what = "a causal mask (ones on and below the diagonal, zeros above)" if window is None else (
            f"layer {layer}'s causal mask within its sliding window of {window} (ones where 0 <= i - j < {window})")
        raise ValueError(f"{source}: {external} {array.shape} is mapped causal_mask but is not {what}; a buffer "
                         "holding anything else changes the model")


# --- buffers a family's forward recomputes, as older files store them -------------------------------------------------

def _ids_row(array: np.ndarray) -> np.ndarray | None:
    """An id buffer as one row: `(1, n)` or `(n,)` integers; None for any other shape or dtype."""
    if array.dtype.kind not in "iu" or array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[0] != 1):
        return None
    return array.reshape(-1)


def _position_ids(config: rn.TransformerConfig, array: np.ndarray) -> str | None:
    row = _ids_row(array)
    if row is None:
        return "is not a (1, n) integer row"
    if not np.array_equal(row, np.arange(row.size)):
        first = int(np.argmax(row != np.arange(row.size)))
        return f"is not arange({row.size}): position {first} holds {int(row[first])}"
    return None


def _zero_type_ids(config: rn.TransformerConfig, array: np.ndarray) -> str | None:
    row = _ids_row(array)
    if row is None:
        return "is not a (1, n) integer row"
    return None if not np.any(row) else f"is not all zeros: it holds {sorted(set(row.tolist()))[:4]}"


MASK_FILL_MAX = -1e4  # exp(-1e4) underflows in float32 and float64 alike: such a fill masks exactly, as -inf does


def _mask_fill(config: rn.TransformerConfig, array: np.ndarray) -> str | None:
    if array.size != 1 or array.dtype.kind != "f":
        return "is not one floating-point number"
    value = float(array.reshape(()))
    return None if value <= MASK_FILL_MAX else f"holds {value:g}, which does not mask (at most {MASK_FILL_MAX:g})"


def _rope_inv_freq(config: rn.TransformerConfig, array: np.ndarray) -> str | None:
    if config.positional != "rope":
        return "the model has no rotary positions"
    exact, _ = rn.ops.rope_frequencies(config, config.max_len)
    if array.shape != exact.shape or array.dtype.kind != "f":
        return f"is not the ({exact.size},) frequencies of rotary_dim={config.rotary_dim}"
    diff = float(np.max(np.abs(array.astype(np.float64) - exact) / exact))
    allowed = 4 * EPS32  # the frequencies computed in float32: a pow and a division
    return None if diff <= allowed else (f"is not the frequencies of rope_theta={config.rope_theta:g}: relative "
                                         f"difference {diff:.3g} (float32 rounding allows {allowed:.2g})")


# transform -> check: None when the buffer holds what the model recomputes, else what it holds instead
BUFFERS: dict[str, Callable[[rn.TransformerConfig, np.ndarray], str | None]] = {
    "position_ids": _position_ids, "zero_type_ids": _zero_type_ids, "mask_fill": _mask_fill,
    "rope_inv_freq": _rope_inv_freq}


def describe_buffer(transform: str, key: str, array) -> str:
    """`embeddings.position_ids (arange(512))` for the note naming a skipped buffer."""
    array = np.asarray(array)
    what = {"position_ids": f"arange({array.size})", "zero_type_ids": f"{array.size} zeros",
            "mask_fill": f"{float(array.reshape(())) if array.size == 1 else 0:g}",
            "rope_inv_freq": "the config's rotary frequencies", "causal_mask": "a causal mask",
            "sinusoid": "the sinusoid table"}.get(transform, transform)
    return f"{key} ({what})"


# --- fixed sinusoid tables, as models store them ----------------------------------------------------------------------

EPS32 = float(np.finfo(np.float32).eps)
# A table built in float32, as the tutorials build it, differs from the exact one by the float32 rounding of its
# angles: the angle p * w is off by about p * w * (the relative error of w, a few eps: rounding of the exponent
# amplified by exp or pow, at most ln(10000) * w * eps <= eps / e, plus the product's rounding), and sin/cos add one
# ulp of their result. So row p may differ by up to c * eps32 * (p + 1); over the PyTorch, TensorFlow and
# float32-NumPy tutorial formulas (d_model 8..1024, 5000 rows) the worst measured c is 1.16. A learned table, or one
# trained on from a sinusoid start, is far outside it already in its first rows.
SINUSOID_F32_SLACK = 4


def sinusoid_rows(array, d_model: int | None = None) -> np.ndarray | None:
    """A positional buffer as `(max_len, d)` rows: stored `(L, D)`, sequence-first `(L, 1, D)` (PyTorch's language
    model tutorial) or batch-first `(1, L, D)`; None for any other shape (or a width other than `d_model`)."""
    array = np.asarray(array)
    if array.ndim == 3 and array.shape[1] == 1:
        array = array[:, 0, :]  # (L, 1, D) -> (L, D)
    elif array.ndim == 3 and array.shape[0] == 1:
        array = array[0]  # (1, L, D) -> (L, D)
    if array.ndim != 2 or (d_model is not None and array.shape[1] != d_model):
        return None
    return array


def _pad_row_as_read(config: rn.TransformerConfig, rows: np.ndarray) -> np.ndarray:
    """`rows` with the pad id's row, where it is zeros and the model reads a zero row for a pad token (positions
    counted over the non-pad tokens: fairseq's tables, M2M100's `embed_positions.weights`), set to the exact one, so
    that the rest is compared with the table."""
    pad = config.pad_id
    if not config.positions_skip_pad or pad is None or not 0 <= pad < rows.shape[0] or np.any(rows[pad]):
        return rows
    rows = rows.astype(np.float64)
    rows[pad] = rn.sinusoidal_positions(pad + 1, rows.shape[1], config.sinusoid_layout,
                                        config.sinusoid_frequencies)[pad]
    return rows


def sinusoid_error(rows: np.ndarray, layout: str, frequencies: str = "paper") -> tuple[int, float, float]:
    """`(row, difference, allowed)` at the row farthest outside float32 rounding of the exact `layout` table: its
    largest |stored - exact| and the `SINUSOID_F32_SLACK * eps32 * (row + 1)` allowed there."""
    length, width = rows.shape
    if width % 2 or length == 0:
        return 0, float("inf"), 0.0
    exact = rn.sinusoidal_positions(length, width, layout, frequencies)
    diff = np.max(np.abs(rows.astype(np.float64) - exact), axis=1)  # (L,)
    diff = np.where(np.isfinite(diff), diff, np.inf)
    allowed = SINUSOID_F32_SLACK * EPS32 * (np.arange(length) + 1.0)
    row = int(np.argmax(diff / allowed))
    return row, float(diff[row]), float(allowed[row])


def sinusoid_mismatch(rows: np.ndarray, layout: str, frequencies: str = "paper") -> str | None:
    """None when `rows` is the `layout` sinusoid table (at `frequencies`) within float32 rounding, else what differs
    and where."""
    row, diff, allowed = sinusoid_error(rows, layout, frequencies)
    if diff <= allowed:
        return None
    if rows.shape[1] % 2:
        return f"its width {rows.shape[1]} is odd (a sinusoid table pairs sin and cos)"
    return (f"against the {layout} table{'' if frequencies == 'paper' else f' at {frequencies} frequencies'} (read as (L, D) = {rows.shape}), row {row} differs by {diff:.3g} (float32 "
            f"rounding allows {allowed:.2g} there)")


def classify_sinusoid(rows: np.ndarray) -> str | None:
    """The sinusoid layout (`interleaved` or `concatenated`) that `rows` holds within float32 rounding, else None."""
    return next((layout for layout in rn.config.SINUSOID_LAYOUTS if sinusoid_mismatch(rows, layout) is None), None)


def export_state(config: rn.TransformerConfig, weights: dict[str, np.ndarray], table: Sequence[Entry],
                 consume: bool = False, where: Callable[[Entry], str] = quoted, lazy: bool = False
                 ) -> dict[str, np.ndarray]:
    """Canonical weights -> {external name: array}, in table order. `consume=True` empties `weights` as it goes;
    `lazy=True` gives `LazyArray`s made when asked (see `mapping.write`)."""
    rn.validate_weights(config, weights)
    mapping = plan(rn.parameter_shapes(config), table, where)
    return rn.mapping.write(mapping, weights if consume else dict(weights), config.head_dim,
                            consume=consume and not lazy, defer=deferred if lazy else None)
