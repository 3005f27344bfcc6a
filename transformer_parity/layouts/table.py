"""The one loop that maps canonical weights to and from an external layout through a declarative table.

A table is plain data, a list of `(canonical, external, transform)` string triples, so that the same table could be
read from a file a user writes:

- `canonical`: a canonical parameter name (`reference_numpy.parameter_shapes`) in which `{i}` stands for a layer
  index and `{qkv}` for one of the attention projections q, k, v;
- `external`: the name in the other layout, with the same placeholders (`{qkv}` left out for a fused entry);
- `transform`, one of `TRANSFORMS`:

  | transform   | external array                                       | reading          | writing   |
  |-------------|------------------------------------------------------|------------------|-----------|
  | `identity`  | the canonical array                                  | required         | written   |
  | `transpose` | its 2-D transpose (`nn.Linear` weight `(out, in)`)   | required         | written   |
  | `fused_qkv` | q, k, v concatenated along the last axis (`c_attn`)  | required         | written   |
  | `fused_qkv_t` | the same stored `(3D, in)`, as an `nn.Linear` holds it | required       | written   |
  | `fused_qkv_heads` | q, k, v interleaved per head: last axis `(H, 3, dk)` | required     | written   |
  | `fused_qkv_heads_t` | the same stored `(3D, in)` (a Lightning `qkv_proj`) | required    | written   |
  | `heads_out` | output features split per head: `(in, H, dk)`, bias `(H, dk)` (Keras MHA q/k/v) | required | written |
  | `heads_in`  | input features split per head: `(H, dk, out)` (Keras MHA output kernel) | required | written |
  | `row`       | shape `(1, n)` for a canonical `(n,)`                | required         | written   |
  | `tied`      | a second copy of the canonical array (a tied head)   | optional, equal  | left out  |
  | `sinusoid`  | a fixed sinusoid table the model recomputes          | optional, equal  | left out  |
  | `causal_mask` | a causal-mask buffer: lower-triangular ones        | optional, equal  | left out  |
  | `ignore`    | a buffer that is not a parameter (position ids)      | optional         | left out  |

The first entry whose `canonical` pattern matches a name maps it. Reading fails on any external entry that is
missing, unused or of the wrong shape, naming the entry and the shape the config implies; writing produces exactly
the entries a reader of that layout expects.

A `sinusoid` entry is checked against the table the model computes, in any of the usual layouts (`sinusoid_rows`)
and within the float32 rounding of a table a tutorial builds in float32 (`sinusoid_error`). An `ignore` entry may
drop integer or boolean buffers and all-zero tensors; a float tensor with a nonzero value is a trained parameter or a
constant the model uses, so dropping it is refused unless the user names it (`Drops`, the CLI's `--allow-drop`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

import reference_numpy as rn
from reference_numpy.schema import preview

from .. import limits
from .names import fill, hits, index, placeholders, regex

TRANSFORMS = ("identity", "transpose", "fused_qkv", "row", "tied", "sinusoid", "causal_mask", "ignore",
              "fused_qkv_t", "fused_qkv_heads", "fused_qkv_heads_t", "heads_out", "heads_in")
FUSED = ("fused_qkv", "fused_qkv_t", "fused_qkv_heads", "fused_qkv_heads_t")  # one external array holds q, k, v
HEADS = ("heads_out", "heads_in")  # einsum kernels of Keras MultiHeadAttention
CHECKED = ("tied", "sinusoid", "causal_mask", "ignore")  # optional on reading, never written
Entry = tuple[str, str, str]  # (canonical, external, transform)


def check_table(table: Sequence[Entry]) -> None:
    for entry in table:
        if len(entry) != 3 or not all(isinstance(x, str) for x in entry):
            raise ValueError(f"a table entry is (canonical, external, transform), received {entry!r}")
        if entry[2] not in TRANSFORMS:
            raise ValueError(f"unknown transform {entry[2]!r} in {entry!r}; choose one of {', '.join(TRANSFORMS)}")
        if entry[2] in FUSED and "qkv" not in placeholders(entry[0]):
            raise ValueError(f"a fused_qkv entry needs {{qkv}} in its canonical pattern, received {entry!r}")


def _quoted(entry: Entry) -> str:
    return repr(entry[1])


def plan(config: rn.TransformerConfig, table: Sequence[Entry], where: Callable[[Entry], str] = _quoted
         ) -> dict[str, tuple[str, str, int]]:
    """canonical name -> (external name, transform, part), `part` being 0/1/2 for q/k/v of a fused entry. A
    canonical name two entries target, or an external name two canonical names would be written to, is refused
    (`where` describes an entry in the message: its pattern, or a layout file's line)."""
    check_table(table)
    literal, patterned = index((c, (c, e, t)) for c, e, t in table if t not in CHECKED)
    out: dict[str, tuple[str, str, int]] = {}
    writers: dict[str, tuple[str, Entry]] = {}  # external name -> (canonical name, entry) that fills it
    for name in rn.parameter_shapes(config):
        found = hits(name, literal, patterned)
        if not found:
            raise ValueError(f"no table entry covers canonical parameter {name!r}")
        if len(found) > 1:
            raise ValueError(f"canonical parameter {name!r} is targeted twice, by {where(found[0][1])} and "
                             f"{where(found[1][1])}; a tensor is read from, and written to, one name: keep one")
        groups, entry = found[0]
        external, transform = fill(entry[1], **groups), entry[2]
        previous = writers.get(external)
        if previous is not None and not (transform in FUSED and previous[1] == entry):
            raise ValueError(f"{external!r} would hold both {previous[0]!r} ({where(previous[1])}) and {name!r} "
                             f"({where(entry)}); one name holds one tensor (a fused entry: q, k and v of one layer)")
        writers[external] = (name, entry)
        out[name] = (external, transform, "qkv".index(groups["qkv"]) if transform in FUSED else 0)
    return out


def _external_shape(transform: str, shape: tuple[int, ...], num_heads: int = 1) -> tuple[int, ...]:
    if transform == "transpose":
        return shape[::-1]
    if transform in FUSED[1:]:
        fused = shape[:-1] + (3 * shape[-1],)
        return fused[::-1] if transform.endswith("_t") else fused
    if transform == "heads_out":
        return shape[:-1] + (num_heads, shape[-1] // num_heads)
    if transform == "heads_in":
        return (num_heads, shape[0] // num_heads) + shape[1:]
    if transform == "fused_qkv":
        return shape[:-1] + (3 * shape[-1],)
    if transform == "row":
        return (1,) + shape
    return shape


def canonical_shape(transform: str, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The canonical shape an external array of `shape` stands for under `transform` (one part of a fused array);
    None when an array of that rank cannot be one (a 1-D `heads_in`, a fused axis not divisible by 3)."""
    shape = tuple(shape)
    if transform == "transpose":
        return shape[::-1]
    if transform == "row":
        return shape[1:] if len(shape) == 2 and shape[0] == 1 else None
    if transform == "heads_out":
        return shape[:-2] + (shape[-2] * shape[-1],) if len(shape) >= 2 else None  # (.., H, dk) -> (.., D)
    if transform == "heads_in":
        return (shape[0] * shape[1],) + shape[2:] if len(shape) >= 2 else None  # (H, dk, ..) -> (D, ..)
    if transform in FUSED:
        shape = shape[::-1] if transform.endswith("_t") else shape
        return shape[:-1] + (shape[-1] // 3,) if shape and shape[-1] % 3 == 0 else None  # (.., 3D) -> (.., D)
    return shape


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
        if len(have) != value or (have and (min(have) != 0 or max(have) != value - 1)):  # not 0 .. value-1
            raise ValueError(f"{source}: config field {name}={value}{_origin(origins, name)} does not match the "
                             f"weights, which hold {_held(stack, have)}; refusing before allocating anything")


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
            if actual is not None and re.fullmatch(pattern, name) and len(actual) > axis \
                    and len(expected[name]) > axis:
                held.setdefault(field, {}).setdefault(actual[axis], external)
    out = []
    for field, values in held.items():
        wanted = config.position_rows if field == "max_len" else getattr(config, field)
        if len(values) != 1 or wanted in values:
            continue
        (value, external), = values.items()
        offset = f" rows with position_offset={config.position_offset}" if field == "max_len" and \
            config.position_offset else ""
        out.append(f"{field}={getattr(config, field)}{_origin(origins, field)}, the weights hold {value}{offset} "
                   f"({external} has shape {tuple(np.shape(state[external]))})")
    return out


def _optional(config: rn.TransformerConfig, table: Sequence[Entry], state_keys: Iterable[str],
              wanted: set[str]) -> dict[str, tuple[str, str]]:
    """external name -> (transform, canonical) for the tied / sinusoid / ignored entries present in the state."""
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
            if key not in wanted and pattern.fullmatch(key):
                out[key] = (transform, canonical)
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
                 where: Callable[[Entry], str] = _quoted, origins: Mapping[str, str] | None = None
                 ) -> dict[str, np.ndarray]:
    """{external name: array} -> canonical weights. `consume=True` empties `state` as it goes. A float tensor
    with a nonzero value under an `ignore` entry is refused unless `drops` allows it (and then recorded there).
    The config's layer counts and sizes are checked against the tensors before anything of the config's size is
    listed or allocated; `origins` names where a field came from (`config.json n_layer`), `where` a table entry."""
    check_layers(config, table, state, source, origins)
    limits.check_positions(config, source, (origins or {}).get("max_len", ""))
    shapes = rn.parameter_shapes(config)
    try:
        mapping = plan(config, table, where)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    wanted = {external for external, _, _ in mapping.values()}
    optional = _optional(config, table, list(state), wanted)
    missing = sorted(wanted - set(state))
    unused = sorted(set(state) - wanted - set(optional))
    if missing or unused:
        parts = [f"missing {len(missing)}: {preview(missing)}"] if missing else []
        parts += [f"unexpected {len(unused)}: {preview(unused)}"] if unused else []
        raise ValueError(f"{source}: the weights do not match the config: " + "; ".join(parts))
    problems = []
    for name, (external, transform, _) in mapping.items():
        expected = _external_shape(transform, shapes[name], config.num_heads)
        actual = tuple(np.shape(state[external]))
        if actual != expected:
            problems.append(f"{external} has shape {actual}, the config implies {expected}")
    if problems:  # a config that contradicts the file misshapes nearly every tensor: one line, not kilobytes
        sizes = size_mismatches(config, mapping, state, origins)
        if sizes:
            raise ValueError(f"{source}: the config does not match the weights: " + "; ".join(sizes))
        problems = list(dict.fromkeys(problems))
        raise ValueError(f"{source}: the weights do not match the config: {len(problems)} with the wrong shape: "
                         + preview(problems, sep="; "))
    check_drops(state, [k for k, (t, _) in optional.items() if t == "ignore"], drops, source)

    uses: dict[str, int] = {}
    for external, _, _ in mapping.values():
        uses[external] = uses.get(external, 0) + 1
    weights = {}
    for name, (external, transform, part) in mapping.items():
        array = np.asarray(state[external])
        if transform == "transpose":
            value = np.ascontiguousarray(array.T)  # (out, in) -> (in, out)
        elif transform == "fused_qkv":
            width = shapes[name][-1]
            value = np.array(array[..., part * width:(part + 1) * width])  # (..., 3D) -> (..., D)
        elif transform in FUSED:
            value = fused_part(array, transform, part, config.num_heads)
        elif transform in HEADS:
            value = np.array(array.reshape(shapes[name]))  # (.., H, dk, ..) -> (.., D, ..), heads-major
        elif transform == "row":
            value = np.array(array.reshape(shapes[name]))  # (1, n) -> (n,)
        else:
            value = np.array(array)
        weights[name] = value
        uses[external] -= 1
        if consume and uses[external] == 0:
            del state[external]
    for external, (transform, canonical) in optional.items():
        _check_optional(config, weights, state[external], external, transform, canonical, source)
        if consume:
            del state[external]
    try:
        rn.validate_weights(config, weights)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return weights


def _check_optional(config, weights, array, external: str, transform: str, canonical: str, source: str) -> None:
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
        problem = sinusoid_mismatch(rows, config.sinusoid_layout)
        if problem:
            other = classify_sinusoid(rows)
            hint = (f"; it is the {other} table: sinusoid_layout = \"{other}\"" if other else
                    "; a learned or altered table is a parameter: map it to src_pos.embedding / tgt_pos.embedding")
            raise ValueError(f"{source}: {external} {array.shape} is not the sinusoid table the model computes: "
                             f"{problem}{hint}")
    elif transform == "causal_mask":
        square = array.reshape(array.shape[-2:]) if array.ndim >= 2 and array.size == np.prod(array.shape[-2:]) \
            else None  # (1, 1, n, n) -> (n, n)
        if square is None or square.shape[0] != square.shape[1] or not np.array_equal(
                square != 0, np.tri(square.shape[0], dtype=bool)):
            raise ValueError(f"{source}: {external} {array.shape} is mapped causal_mask but is not a causal mask "
                             "(ones on and below the diagonal, zeros above); a buffer holding anything else changes "
                             "the model")


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


def sinusoid_error(rows: np.ndarray, layout: str) -> tuple[int, float, float]:
    """`(row, difference, allowed)` at the row farthest outside float32 rounding of the exact `layout` table: its
    largest |stored - exact| and the `SINUSOID_F32_SLACK * eps32 * (row + 1)` allowed there."""
    length, width = rows.shape
    if width % 2 or length == 0:
        return 0, float("inf"), 0.0
    exact = rn.sinusoidal_positions(length, width, layout)
    diff = np.max(np.abs(rows.astype(np.float64) - exact), axis=1)  # (L,)
    diff = np.where(np.isfinite(diff), diff, np.inf)
    allowed = SINUSOID_F32_SLACK * EPS32 * (np.arange(length) + 1.0)
    row = int(np.argmax(diff / allowed))
    return row, float(diff[row]), float(allowed[row])


def sinusoid_mismatch(rows: np.ndarray, layout: str) -> str | None:
    """None when `rows` is the `layout` sinusoid table within float32 rounding, else what differs and where."""
    row, diff, allowed = sinusoid_error(rows, layout)
    if diff <= allowed:
        return None
    if rows.shape[1] % 2:
        return f"its width {rows.shape[1]} is odd (a sinusoid table pairs sin and cos)"
    return (f"against the {layout} table (read as (L, D) = {rows.shape}), row {row} differs by {diff:.3g} (float32 "
            f"rounding allows {allowed:.2g} there)")


def classify_sinusoid(rows: np.ndarray) -> str | None:
    """The sinusoid layout (`interleaved` or `concatenated`) that `rows` holds within float32 rounding, else None."""
    return next((layout for layout in rn.config.SINUSOID_LAYOUTS if sinusoid_mismatch(rows, layout) is None), None)


def export_state(config: rn.TransformerConfig, weights: dict[str, np.ndarray], table: Sequence[Entry],
                 consume: bool = False, where: Callable[[Entry], str] = _quoted) -> dict[str, np.ndarray]:
    """Canonical weights -> {external name: array}, in table order. `consume=True` empties `weights` as it goes."""
    rn.validate_weights(config, weights)
    mapping = plan(config, table, where)
    fused: dict[str, list] = {}
    out = {}
    for name, (external, transform, part) in mapping.items():
        array = np.asarray(weights.pop(name) if consume else weights[name])
        if transform == "transpose":
            out[external] = np.ascontiguousarray(array.T)  # (in, out) -> (out, in)
        elif transform in FUSED:
            parts = fused.setdefault(external, [None, None, None])
            parts[part] = array
            if all(p is not None for p in parts):
                out[external] = fuse(parts, transform, config.num_heads)
                del fused[external]
        elif transform in HEADS:
            out[external] = np.array(array.reshape(_external_shape(transform, array.shape, config.num_heads)))
        elif transform == "row":
            out[external] = np.array(array.reshape((1,) + array.shape))  # (n,) -> (1, n)
        else:
            out[external] = np.array(array)
    if fused:
        raise ValueError(f"fused entries missing a part: {sorted(fused)}")
    return out


def fused_part(array: np.ndarray, transform: str, part: int, num_heads: int) -> np.ndarray:
    """q, k or v (`part` 0/1/2) of a fused projection in canonical orientation. `_t`: stored `(3D, in)` as an
    `nn.Linear` holds it; `_heads`: the 3D features are `(H, 3, dk)`, q/k/v interleaved per head."""
    a = np.asarray(array)
    a = a.T if transform.endswith("_t") else a  # (3D, in) -> (in, 3D); a bias (3D,) stays
    if a.shape[-1] % 3:
        raise ValueError(f"a fused q/k/v array has {a.shape[-1]} features, not divisible by 3")
    width = a.shape[-1] // 3
    if "heads" in transform:
        if width % num_heads:
            raise ValueError(f"a fused q/k/v array of {3 * width} features does not split into num_heads={num_heads} "
                             "heads of q, k and v")
        a = a.reshape(a.shape[:-1] + (num_heads, 3, width // num_heads))  # (..., 3D) -> (..., H, 3, dk)
        return np.ascontiguousarray(a[..., part, :]).reshape(a.shape[:-3] + (width,))  # (..., H, dk) -> (..., D)
    return np.ascontiguousarray(a[..., part * width:(part + 1) * width])  # (..., 3D) -> (..., D)


def fuse(parts: Sequence[np.ndarray], transform: str, num_heads: int) -> np.ndarray:
    """The inverse of `fused_part`: q, k, v (canonical orientation) -> the fused external array."""
    width = parts[0].shape[-1]
    if "heads" in transform:
        heads = [p.reshape(p.shape[:-1] + (num_heads, width // num_heads)) for p in parts]  # (..., D) -> (..., H, dk)
        fused = np.stack(heads, axis=-2).reshape(parts[0].shape[:-1] + (3 * width,))  # (..., H, 3, dk) -> (..., 3D)
    else:
        fused = np.concatenate(parts, axis=-1)  # 3 x (..., D) -> (..., 3D)
    return np.ascontiguousarray(fused.T) if transform.endswith("_t") else fused  # (in, 3D) -> (3D, in)
