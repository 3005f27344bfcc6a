"""The one mapping language: how canonical weights are named and shaped in another layout, as a table of
`(canonical, external, transform)` string triples, and the one engine that applies a table in both directions.

Every external layout uses it: the twins' own state dicts and `.weights.h5` files, `torch.nn.Transformer`, every
Hugging Face and KerasHub family, and a user's layout file (which is this table, read from TOML).

- `canonical`: a canonical parameter name (`parameter_shapes`), in which `{i}` stands for a layer index, `{qkv}`
  for one of the attention projections q, k, v (`{kv}`: k or v, fused apart from q), and `{gate_up}` for one of a
  gated feed-forward's input projections
  (`gate`, `linear1`);
- `external`: the name in the other layout, with the same placeholders (`{qkv}` / `{gate_up}` left out for a fused
  entry: one external array holds all the parts);
- `transform`, one of `TRANSFORMS`, each a named function pair below:

  | transform   | external array                                       | reading          | writing   |
  |-------------|------------------------------------------------------|------------------|-----------|
  | `identity`  | the canonical array                                  | required         | written   |
  | `transpose` | its 2-D transpose (`nn.Linear` weight `(out, in)`)   | required         | written   |
  | `fused_qkv` | q, k, v (or gate, up) concatenated along the last axis (`c_attn`; k and v may be narrower, as in grouped-query attention) | required | written |
  | `fused_qkv_t` | the same stored `(q+k+v, in)`, as an `nn.Linear` holds it (Phi-3's `qkv_proj`, `gate_up_proj`) | required | written |
  | `fused_qkv_heads` | q, k, v interleaved per head: last axis `(H, 3, dk)` | required     | written   |
  | `fused_qkv_heads_t` | the same stored `(3D, in)` (a Lightning `qkv_proj`) | required    | written   |
  | `heads_out` | output features split per head: `(in, H, dk)`, bias `(H, dk)` (Keras MHA q/k/v) | required | written |
  | `heads_in`  | input features split per head: `(H, dk, out)` (Keras MHA output kernel) | required | written |
  | `heads_first` | heads leading: `(H, in, dk)`, bias `(H, dk)` (KerasHub Gemma q/k/v) | required | written |
  | `row`       | a leading unit axis: `(1, n)` for a canonical `(n,)`, `(1, L, D)` for `(L, D)` | required | written |
  | `seq_first` | a unit middle axis: `(L, 1, D)` for a canonical `(L, D)` (PyTorch tutorials' buffers) | required | written |
  | `tied`      | a second copy of the canonical array (a tied head)   | optional, equal  | left out  |
  | `sinusoid`  | a fixed sinusoid table the model recomputes          | optional, equal  | left out  |
  | `causal_mask` | a causal-mask buffer: lower-triangular ones        | optional, equal  | left out  |
  | `position_ids` | a position-id buffer: `arange(n)`, `(1, n)` or `(n,)` (transformers < 4.31) | optional, equal | left out |
  | `zero_type_ids` | a token-type-id buffer: all zeros, `(1, n)` or `(n,)` | optional, equal | left out |
  | `mask_fill` | the number masked logits are set to (GPT-2's old `masked_bias`): a scalar <= -1e4 | optional | left out |
  | `rope_inv_freq` | rotary frequencies (`rotary_emb.inv_freq`): the ones the config gives | optional, equal | left out |
  | `ignore`    | a tensor that is not a parameter (integer, boolean or all zeros) | optional  | left out  |

The first entry whose `canonical` pattern matches a name maps it; a canonical name two entries target, or an
external name two canonical names would be written to, is refused. Reading fails on any external entry that is
missing, unused or of the wrong shape; writing produces exactly the entries a reader of that layout expects. What
the optional kinds check (`tied`, `sinusoid`, ...) and the messages a user sees are the product's
(`transformer_parity.layouts.table`); this module is the language and the loop.

Names are patterns: literal text with four placeholders, written exactly so: `{i}`, a layer index, written as Python
writes an int (no sign, no leading zeros, so that filling a name back gives the key it was read from), `{qkv}`, one
of `q`, `k`, `v`, `{kv}`, one of `k`, `v`, and `{gate_up}`, one of `gate`, `linear1`. Anything else in braces is
refused when the pattern is parsed. A placeholder used twice matches the same text both times. Patterns are matched and filled by the small parser here, never by `str.format`.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

TRANSFORMS = ("identity", "transpose", "fused_qkv", "row", "tied", "sinusoid", "causal_mask", "ignore",
              "fused_qkv_t", "fused_qkv_heads", "fused_qkv_heads_t", "heads_out", "heads_in", "seq_first",
              "heads_first", "position_ids", "zero_type_ids", "mask_fill", "rope_inv_freq")
FUSED = ("fused_qkv", "fused_qkv_t", "fused_qkv_heads", "fused_qkv_heads_t")  # one external array holds q, k, v
HEADS = ("heads_out", "heads_in", "heads_first")  # einsum kernels (Keras MultiHeadAttention, KerasHub Gemma)
# optional on reading, never written: a copy, or a buffer the model recomputes, checked against what it must hold
CHECKED = ("tied", "sinusoid", "causal_mask", "ignore", "position_ids", "zero_type_ids", "mask_fill", "rope_inv_freq")
RESHAPES = ("identity", "row", "seq_first", "heads_out", "heads_in")  # the same bytes in C order, only reshaped
Entry = tuple[str, str, str]  # (canonical, external, transform)
# canonical name -> (external name, transform, (part, parts)): which of how many parts of a fused external array
Plan = dict[str, tuple[str, str, tuple[int, int]]]


# --- name patterns -------------------------------------------------------------------------------------------------

PLACEHOLDERS = {"i": "the layer index", "qkv": "q, k or v", "kv": "k or v (k and v fused, q apart: `to_kv`)",
                "gate_up": "gate or linear1 (a gated feed-forward's two input projections)"}
_GROUPS = {"i": "0|[1-9][0-9]{0,17}", "qkv": "[qkv]", "kv": "[kv]", "gate_up": "gate|linear1"}
# The placeholders a fused entry packs, and their parts in the order the external array holds them.
PARTS = {"qkv": ("q", "k", "v"), "kv": ("k", "v"), "gate_up": ("gate", "linear1")}
_BRACES = re.compile(r"\{[^{}]*\}|[{}]")
Part = str | tuple[str]  # literal text, or (placeholder name,)


@functools.lru_cache(maxsize=4096)
def parse_pattern(pattern: str) -> tuple[Part, ...]:
    """A name pattern as its parts: literal text, and `("i",)` / `("qkv",)` for the placeholders. Anything else in
    braces (`{}`, `{x}`, a format spec such as `{i:>3}`, a lone brace) is refused: `ValueError` naming it."""
    if not isinstance(pattern, str):
        raise ValueError(f"a name must be a string, received {pattern!r}")
    parts: list[Part] = []
    position = 0
    for m in _BRACES.finditer(pattern):
        name = m.group()[1:-1]
        if name not in PLACEHOLDERS:
            raise ValueError(f"{pattern!r}: {m.group()!r} is not a placeholder; a name holds literal text, {{i}} (the "
                             "layer index), {qkv} (q, k or v), {kv} (k or v) and {gate_up} (gate or linear1) only, "
                             "written exactly so "
                             "(no format specs)")
        if m.start() > position:
            parts.append(pattern[position:m.start()])
        parts.append((name,))
        position = m.end()
    if position < len(pattern):
        parts.append(pattern[position:])
    return tuple(parts)


def placeholders(pattern: str) -> set[str]:
    """The placeholder names `pattern` uses: `{"i", "qkv"}`, ..."""
    return {p[0] for p in parse_pattern(pattern) if isinstance(p, tuple)}


@functools.lru_cache(maxsize=4096)
def regex(pattern: str) -> re.Pattern:
    """`encoder.layers.{i}.self_attn.{qkv}.kernel` -> a regex with named groups `i` and `qkv`; a placeholder used
    twice must match the same text both times (a backreference)."""
    out, seen = [], set()
    for part in parse_pattern(pattern):
        if isinstance(part, str):
            out.append(re.escape(part))
        elif part[0] in seen:
            out.append(f"(?P={part[0]})")
        else:
            seen.add(part[0])
            out.append(f"(?P<{part[0]}>{_GROUPS[part[0]]})")
    return re.compile("".join(out))


def fill(pattern: str, **values) -> str:
    """`pattern` with its placeholders replaced by `values` (plain substitution, never `str.format`)."""
    out = []
    for part in parse_pattern(pattern):
        if isinstance(part, str):
            out.append(part)
        elif values.get(part[0]) is None:
            raise ValueError(f"{pattern!r} needs a value for {{{part[0]}}}")
        else:
            out.append(str(values[part[0]]))
    return "".join(out)


def index(entries: Iterable[tuple[str, Any]]) -> tuple[dict[str, list], list]:
    """Entries by their literal pattern (looked up in a dict) and the patterned ones (matched one by one), for
    `(pattern, entry)` pairs."""
    literal: dict[str, list] = {}
    patterned = []
    for pattern, entry in entries:
        if placeholders(pattern):
            patterned.append((regex(pattern), entry))
        else:
            literal.setdefault(pattern, []).append(entry)
    return literal, patterned


def hits(name: str, literal: dict[str, list], patterned: list) -> list[tuple[dict[str, str], Any]]:
    """`(placeholder values, entry)` for every entry of an `index` whose pattern matches `name`."""
    found = [({}, entry) for entry in literal.get(name, ())]
    for compiled, entry in patterned:
        m = compiled.fullmatch(name)
        if m:
            found.append((m.groupdict(), entry))
    return found


# --- the table -----------------------------------------------------------------------------------------------------

def check_table(table: Sequence[Entry]) -> None:
    for entry in table:
        if len(entry) != 3 or not all(isinstance(x, str) for x in entry):
            raise ValueError(f"a table entry is (canonical, external, transform), received {entry!r}")
        if entry[2] not in TRANSFORMS:
            raise ValueError(f"unknown transform {entry[2]!r} in {entry!r}; choose one of {', '.join(TRANSFORMS)}")
        if entry[2] in FUSED and len(placeholders(entry[0]) & set(PARTS)) != 1:
            raise ValueError(f"a fused entry needs {{qkv}}, {{kv}} or {{gate_up}} (one of them) in its canonical pattern, "
                             f"received {entry!r}")
        if entry[2] in FUSED and "heads" in entry[2] and "qkv" not in placeholders(entry[0]):
            raise ValueError(f"{entry[2]} interleaves q, k and v per head: its canonical pattern needs {{qkv}}, "
                             f"received {entry!r}")


def quoted(entry: Entry) -> str:
    """An entry as messages name it: its external pattern."""
    return repr(entry[1])


def plan(names: Iterable[str], table: Sequence[Entry], where: Callable[[Entry], str] = quoted,
         shared: bool = False) -> Plan:
    """canonical name -> (external name, transform, part) for every name in `names` (the canonical parameters of a
    config, or of one block), `part` being `(index, count)` in a fused entry (q, k, v: 0..2 of 3; gate, linear1:
    0..1 of 2) and `(0, 1)` otherwise. A canonical name two entries target,
    or an external name two canonical names would be written to, is refused (`where` describes an entry in the
    message: its pattern, or a layout file's line), unless `shared`: then canonical names may read one external
    array through the same transform (one position table both sides read), and writing checks they are equal."""
    check_table(table)
    literal, patterned = index((c, (c, e, t)) for c, e, t in table if t not in CHECKED)
    out: Plan = {}
    writers: dict[str, tuple[str, Entry]] = {}  # external name -> (canonical name, entry) that fills it
    for name in names:
        found = hits(name, literal, patterned)
        if not found:
            raise ValueError(f"no table entry covers canonical parameter {name!r}")
        if len(found) > 1:
            raise ValueError(f"canonical parameter {name!r} is targeted twice, by {where(found[0][1])} and "
                             f"{where(found[1][1])}; a tensor is read from, and written to, one name: keep one")
        groups, entry = found[0]
        external, transform = fill(entry[1], **groups), entry[2]
        previous = writers.get(external)
        same = previous is not None and out[previous[0]][1] == transform
        if previous is not None and not (transform in FUSED and previous[1] == entry) and not (
                shared and same and transform not in FUSED):
            raise ValueError(f"{external!r} would hold both {previous[0]!r} ({where(previous[1])}) and {name!r} "
                             f"({where(entry)}); one name holds one tensor (a fused entry: q, k and v of one layer)")
        writers[external] = (name, entry)
        part = (0, 1)
        if transform in FUSED:
            kind = next(k for k in PARTS if k in groups)
            part = (PARTS[kind].index(groups[kind]), len(PARTS[kind]))
        out[name] = (external, transform, part)
    return out


def fused_groups(mapping: Plan) -> dict[str, list[str]]:
    """external name -> its canonical parts' names, in the order the external array holds them (q, k, v; gate,
    linear1), for every fused entry of a plan."""
    groups: dict[str, list[str | None]] = {}
    for name, (external, transform, (part, count)) in mapping.items():
        if transform in FUSED:
            groups.setdefault(external, [None] * count)[part] = name
    missing = sorted(external for external, names in groups.items() if None in names)
    if missing:
        raise ValueError(f"fused entries missing a part (q, k and v, or gate and linear1, of one layer): {missing}")
    return groups  # type: ignore[return-value]


# --- the transforms: canonical shape <-> external shape, canonical array <-> external array --------------------------

def external_shape(transform: str, shape: tuple[int, ...], head_dim: int = 1,
                   fused: Sequence[tuple[int, ...]] = ()) -> tuple[int, ...]:
    """The external shape of a canonical array of `shape` under `transform`; a fused entry's is that of the whole
    external array, from its parts' canonical shapes `fused` (q, k, v)."""
    shape = tuple(shape)
    if transform == "transpose":
        return shape[::-1]
    if transform in FUSED:
        parts = list(fused) or [shape] * 3  # (canonical_shape's guess: three equal parts)
        whole = shape[:-1] + (sum(p[-1] for p in parts),)
        return whole[::-1] if transform.endswith("_t") else whole
    if transform == "heads_out":
        return shape[:-1] + (shape[-1] // head_dim, head_dim)
    if transform == "heads_in":
        return (shape[0] // head_dim, head_dim) + shape[1:]
    if transform == "heads_first":
        return (shape[-1] // head_dim,) + shape[:-1] + (head_dim,)
    if transform == "row":
        return (1,) + shape
    if transform == "seq_first":
        return shape[:1] + (1,) + shape[1:]
    return shape


def canonical_shape(transform: str, shape: tuple[int, ...], parts: int = 3) -> tuple[int, ...] | None:
    """The canonical shape an external array of `shape` stands for under `transform` (one part of a fused array of
    `parts` equal parts); None when an array of that rank cannot be one (a 1-D `heads_in`, a fused axis not
    divisible by `parts`)."""
    shape = tuple(shape)
    if transform == "transpose":
        return shape[::-1]
    if transform == "row":
        return shape[1:] if len(shape) >= 2 and shape[0] == 1 else None
    if transform == "seq_first":
        return shape[:1] + shape[2:] if len(shape) >= 3 and shape[1] == 1 else None
    if transform == "heads_out":
        return shape[:-2] + (shape[-2] * shape[-1],) if len(shape) >= 2 else None  # (.., H, dk) -> (.., D)
    if transform == "heads_in":
        return (shape[0] * shape[1],) + shape[2:] if len(shape) >= 2 else None  # (H, dk, ..) -> (D, ..)
    if transform == "heads_first":
        return shape[1:-1] + (shape[0] * shape[-1],) if len(shape) >= 2 else None  # (H, .., dk) -> (.., D)
    if transform in FUSED:
        shape = shape[::-1] if transform.endswith("_t") else shape
        return shape[:-1] + (shape[-1] // parts,) if shape and shape[-1] % parts == 0 else None  # (.., 3D) -> (.., D)
    return shape


def transposed(array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-ordered transpose of a 2-D array (any other rank, or a small one: `.T` copied), in a fresh array or in
    `out` (C-ordered, the transposed shape, the same dtype). Copied on the bits in cache-sized tiles by the compiled
    `reference_numpy._transpose` where it was built (the package's one C file, optional; vector blocks as wide as the
    CPU has), else by NumPy in blocks of 8 rows by at most 512 columns (docs/formats.md has both speeds). A column
    slice of a larger matrix (`m[:, a:b]`) is copied the same way."""
    if out is not None and (out.shape != array.shape[::-1] or out.dtype != array.dtype
                            or not out.flags.c_contiguous or not out.flags.writeable):
        raise ValueError(f"transposed: out must be a writable C-ordered {array.dtype} array of shape "
                         f"{array.shape[::-1]}, got {out.dtype} {out.shape}")
    if (array.ndim != 2 or array.dtype.itemsize not in (1, 2, 4, 8) or array.strides[1] != array.dtype.itemsize
            or array.strides[0] < 0 or array.nbytes <= 1 << 16):
        if out is None:
            return np.array(array.T, order="C")
        out[...] = array.T
        return out
    bits = array.view(f"u{array.dtype.itemsize}")
    out = np.empty(bits.shape[::-1], bits.dtype) if out is None else out.view(bits.dtype)
    if _tiles is not None:
        _tiles.transpose(bits, out)
        return out.view(array.dtype)
    for first in range(0, bits.shape[1], 512):
        source, target = bits[:, first:first + 512], out[first:first + 512]
        for start in range(0, bits.shape[0], 8):
            target[:, start:start + 8] = source[start:start + 8].T
    return out.view(array.dtype)


try:  # the compiled tiles; set TRANSFORMER_PARITY_NO_C=1 to time or test the NumPy path alone
    from reference_numpy import _transpose as _tiles
except ImportError:
    _tiles = None
if os.environ.get("TRANSFORMER_PARITY_NO_C"):
    _tiles = None


def to_canonical(array: np.ndarray, transform: str, shape: tuple[int, ...]) -> np.ndarray:
    """An external array (not fused) -> the canonical array of `shape`, as a fresh array."""
    array = np.asarray(array)
    if transform == "transpose":
        return transposed(array)  # (out, in) -> (in, out), always a copy
    if transform == "heads_first":  # (H, .., dk) -> (.., H, dk) -> (.., D), heads-major
        return np.array(np.moveaxis(array, 0, -2).reshape(shape), order="C")
    if transform in HEADS or transform in ("row", "seq_first"):
        return np.array(array.reshape(shape))  # per-head or unit axes merged: a C-order reshape, heads-major
    return np.array(array)


def to_external(array: np.ndarray, transform: str, head_dim: int = 1) -> np.ndarray:
    """A canonical array -> its external array (not fused), as a fresh array."""
    array = np.asarray(array)
    if transform == "transpose":
        return transposed(array)  # (in, out) -> (out, in), always a copy
    if transform == "heads_first":  # (.., D) -> (.., H, dk) -> (H, .., dk)
        split = array.reshape(array.shape[:-1] + (array.shape[-1] // head_dim, head_dim))
        return np.array(np.moveaxis(split, -2, 0), order="C")
    if transform in HEADS or transform in ("row", "seq_first"):
        return np.array(array.reshape(external_shape(transform, array.shape, head_dim)))
    return np.array(array)


def fused_part(array: np.ndarray, transform: str, part: int, widths: Sequence[int], head_dim: int = 1) -> np.ndarray:
    """Part `part` (q, k, v: 0/1/2; gate, linear1: 0/1) of a fused projection, in canonical orientation; `widths`
    are the parts' feature counts (k and v narrower under grouped-query attention). `_t`: stored `(q+k+v, in)` as
    an `nn.Linear` holds it; `_heads`: the features are `(H, 3, dk)`, q/k/v interleaved per head (equal widths)."""
    a = np.asarray(array)
    a = transposed(a) if transform.endswith("_t") and a.ndim == 2 else a  # (3D, in) -> (in, 3D); a bias (3D,) stays
    if a.shape[-1] != sum(widths):
        raise ValueError(f"a fused array has {a.shape[-1]} features; its parts need {'+'.join(map(str, widths))}")
    if "heads" in transform:
        width = widths[0]
        if len(widths) != 3 or len(set(widths)) != 1 or width % head_dim:
            raise ValueError(f"a per-head fused q/k/v array of {sum(widths)} features does not split into heads of "
                             f"{head_dim} for q, k and v")
        a = a.reshape(a.shape[:-1] + (width // head_dim, 3, head_dim))  # (..., 3D) -> (..., H, 3, dk)
        return np.ascontiguousarray(a[..., part, :]).reshape(a.shape[:-3] + (width,))  # (..., H, dk) -> (..., D)
    start = sum(widths[:part])
    return np.ascontiguousarray(a[..., start:start + widths[part]])  # (..., q+k+v) -> (..., part)


def fuse(parts: Sequence[np.ndarray], transform: str, head_dim: int = 1) -> np.ndarray:
    """The inverse of `fused_part`: q, k, v (canonical orientation) -> the fused external array."""
    if "heads" in transform:
        width = parts[0].shape[-1]
        heads = [p.reshape(p.shape[:-1] + (width // head_dim, head_dim)) for p in parts]  # (..., D) -> (..., H, dk)
        fused = np.stack(heads, axis=-2).reshape(parts[0].shape[:-1] + (3 * width,))  # (..., H, 3, dk) -> (..., 3D)
    else:
        fused = np.concatenate(parts, axis=-1)  # (..., q), (..., k), (..., v) -> (..., q+k+v); gate | up alike
    return transposed(fused) if transform.endswith("_t") else fused  # (in, 3D) -> (3D, in)


# --- lazy arrays: a model streamed tensor by tensor ------------------------------------------------------------------

# A streamed tensor is rearranged, cast and written this many bytes at a time, at most: a few bands stay in the
# core's share of the cache, and a writer keeps a few of them as reused buffers (`row_bands(..., out=)`).
BAND_BYTES = 8 << 20

# (rows per band, out=None) -> (start, stop, rows[start:stop]) for each band; `out(shape, dtype)`, where given, is the
# array a band that is made afresh (a transpose) is written into: a writer's recycled buffer, since an array
# allocated afresh for every band costs a page fault and a zeroed page for every 4 KiB of it.
Bands = Callable[..., Iterator[tuple[int, int, np.ndarray]]]


class LazyArray:
    """An array not yet in memory: its shape and dtype now, its values when `np.asarray` asks (each time, nothing
    kept). A checkpoint read lazily is a dict of these; the engine below maps them to more of them, so a writer that
    takes one entry at a time holds a few tensors, never the model. `row_bands` gives the values a band of rows at a
    time: from the file's bytes (`span`), or from `bands`, which a transpose or a cast defines over its source."""

    __slots__ = ("shape", "dtype", "_compute", "span", "bands", "source")

    def __init__(self, shape: tuple[int, ...], dtype, compute: Callable[[], np.ndarray],
                 span: tuple[str, int, int] | None = None, bands: Bands | None = None, source: Any = None):
        self.shape, self.dtype, self._compute = tuple(shape), np.dtype(dtype), compute
        self.span = span  # (file, offset, nbytes) when the values are those bytes of a file, C order, little-endian
        self.bands = bands  # rows per band -> its bands, without the whole array where the source allows
        self.source = source  # the one array the values are made from (a transpose's, a cast's), where there is one

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self._compute()
        return array if dtype is None else array.astype(dtype, copy=False)

    def astype(self, dtype) -> "LazyArray":
        """The same array cast to `dtype` when it is read (a band at a time by `row_bands`)."""
        if np.dtype(dtype) == self.dtype:
            return self
        return LazyArray(self.shape, dtype, lambda: cast(np.asarray(self), dtype),
                         bands=lambda rows, out=None: ((a, b, cast(x, dtype)) for a, b, x in _bands(self, rows)),
                         source=self)  # a cast makes its own array: `out` is not for its source

    def __repr__(self) -> str:
        return f"LazyArray(shape={self.shape}, dtype={self.dtype})"


def widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values (ml_dtypes' bfloat16, or their 2-byte bits: uint16, an opaque HDF5 type) as float32, on the
    bits: a bfloat16 is the top half of a float32, so this is exact, and several times faster than the element-wise
    conversion."""
    bits = np.asarray(bits)
    wide = (bits if bits.dtype.kind == "u" else bits.view(np.uint16)).astype(np.uint32)  # "<u2" read from a file
    wide <<= 16  # in place: one buffer
    return wide.view(np.float32)


def cast(array: np.ndarray, dtype) -> np.ndarray:
    """`array.astype(dtype)`; bfloat16 -> float32 on the bits (`widen_bfloat16`)."""
    dtype = np.dtype(dtype)
    if array.dtype.name == "bfloat16" and dtype == np.float32:
        return widen_bfloat16(array)
    return array.astype(dtype)


def row_bands(array, max_bytes: int = BAND_BYTES, itemsize: int = 0,
              out: Callable[[tuple[int, ...], np.dtype], np.ndarray] | None = None,
              ) -> Iterator[tuple[int, int, np.ndarray]]:
    """`(start, stop, array[start:stop])` along axis 0, in order, each band at most `max_bytes` (counted at the wider
    of the array's itemsize and `itemsize`, the dtype the caller makes of it; at least one row). A `LazyArray` is
    read a band at a time where it can be (a file's bytes, a transpose, a cast of either); otherwise it is read
    whole and sliced. A 0-d array is one band. With `out(shape, dtype)`, a band made afresh (a transpose) is written
    into the array it returns, which the caller may reuse once it is done with the band (`Bands`)."""
    shape = tuple(array.shape)
    if not shape:
        yield 0, 1, np.asarray(array)
        return
    row = int(np.prod(shape[1:], dtype=np.int64)) * max(itemsize, array.dtype.itemsize)
    yield from _bands(array, max(1, max_bytes // max(row, 1)), out)


def _bands(array, rows: int, out=None) -> Iterator[tuple[int, int, np.ndarray]]:
    """`row_bands` with the rows per band given."""
    shape = tuple(array.shape)
    if getattr(array, "bands", None) is not None:
        yield from array.bands(rows, out)
        return
    span = getattr(array, "span", None)
    if span is not None and shape:
        file, offset, _ = span
        row = int(np.prod(shape[1:], dtype=np.int64)) * array.dtype.itemsize
        with open(file, "rb") as f:
            f.seek(offset)
            for a in range(0, shape[0], rows):
                b = min(a + rows, shape[0])
                raw = np.fromfile(f, dtype=np.uint8, count=(b - a) * row)  # the next rows, in order
                if raw.size != (b - a) * row:
                    raise ValueError(f"{file} ended inside a tensor (truncated while being read?)")
                yield a, b, raw.view(_little(array.dtype)).reshape((b - a,) + shape[1:]).astype(array.dtype,
                                                                                                  copy=False)
        return
    whole = np.asarray(array)
    for a in range(0, shape[0], rows):
        yield a, min(a + rows, shape[0]), whole[a:a + rows]


def _little(dtype: np.dtype) -> np.dtype:
    return dtype if dtype.byteorder in ("|", "<") or dtype.kind == "V" else dtype.newbyteorder("<")


def _transposed_bands(source) -> Bands:
    """The bands of a 2-D `source`'s transpose: the source read once (in its own dtype), the transpose copied a band
    of its rows (the source's columns) at a time, so a transposed tensor is never held twice."""
    def bands(rows: int, out=None):
        whole = mapped(source)  # (out, in)
        for a in range(0, whole.shape[1], rows):
            b = min(a + rows, whole.shape[1])
            target = None if out is None else out((b - a, whole.shape[0]), whole.dtype)
            yield a, b, transposed(whole[:, a:b], target)  # (in[a:b], out)
    return bands


def mapped(array) -> np.ndarray:
    """The values of `array`: for a `LazyArray` whose values are a file's bytes (`span`), a read-only view of the
    file mapped into memory (the pages the page cache already holds, with no copy into a fresh buffer, which for a
    large tensor costs a page fault per page); otherwise `np.asarray`. The mapping closes with the last view."""
    span = getattr(array, "span", None)
    dtype = getattr(array, "dtype", None)
    if span is None or dtype is None or dtype.hasobject:
        return np.asarray(array)
    import mmap
    file, offset, nbytes = span
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(file, "rb") as f:
        if os.fstat(f.fileno()).st_size < offset + nbytes:
            raise ValueError(f"{file} ended inside a tensor (truncated while being read?)")
        if nbytes == 0:
            return np.asarray(array)
        region = mmap.mmap(f.fileno(), offset + nbytes - start, access=mmap.ACCESS_READ, offset=start)
    flat = np.frombuffer(region, dtype=np.uint8, count=nbytes, offset=offset - start)
    return flat.view(_little(np.dtype(dtype))).reshape(array.shape)


def _reshaped_bands(source, shape: tuple[int, ...]) -> Bands | None:
    """The bands of `source` reshaped (C order) to `shape`, where a row of `shape` is whole rows of the source
    (identity, a split last axis, a leading unit axis, heads split off the first axis); else None."""
    if not shape or not source.shape:
        return None
    inner, source_inner = int(np.prod(shape[1:], dtype=np.int64)), int(np.prod(source.shape[1:], dtype=np.int64))
    if source_inner == 0 or inner % source_inner:
        return None
    k = inner // source_inner  # source rows per row of `shape`

    def bands(rows: int, out=None):
        for a, b, band in _bands(source, rows * k, out):
            yield a // k, -(-b // k), band.reshape((-1,) + shape[1:])
    return bands


def is_lazy(array: Any) -> bool:
    return isinstance(array, LazyArray)


def file_span(array: Any) -> tuple[str, int, int] | None:
    """The bytes of a file that `array`'s values are made from, through any transposes and casts (`source`); None
    when they are not one file's bytes (an array in memory, a fused tensor's several sources)."""
    while array is not None:
        span = getattr(array, "span", None)
        if span is not None:
            return span
        array = getattr(array, "source", None)
    return None


# --- the engine: a whole table, both directions --------------------------------------------------------------------

class ShapeMismatch(ValueError):
    """Arrays that are not the shape the canonical shapes imply; `problems` lists them, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = list(dict.fromkeys(problems))
        super().__init__(f"the weights do not match the config: {len(self.problems)} with the wrong shape: "
                         + preview(self.problems, sep="; "))


def expected_shapes(mapping: Plan, shapes: Mapping[str, tuple[int, ...]], head_dim: int = 1) -> dict[str, tuple]:
    """external name -> the shape the canonical `shapes` imply for it."""
    groups = fused_groups(mapping)
    out = {}
    for name, (external, transform, _) in mapping.items():
        parts = [shapes[n] for n in groups[external]] if transform in FUSED else ()
        out[external] = external_shape(transform, shapes[name], head_dim, parts)
    return out


def check_keys(mapping: Plan, keys: Iterable[str], optional: Iterable[str] = ()) -> None:
    """Refuse, in one line, a state whose keys are not the plan's (`optional` keys may be there unused)."""
    wanted = {external for external, _, _ in mapping.values()}
    keys = set(keys)
    missing = sorted(wanted - keys)
    unused = sorted(keys - wanted - set(optional))
    if missing or unused:
        parts = [f"missing {len(missing)}: {preview(missing)}"] if missing else []
        parts += [f"unexpected {len(unused)}: {preview(unused)}"] if unused else []
        raise ValueError("the weights do not match the config: " + "; ".join(parts))


def check_shapes(mapping: Plan, state: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], head_dim: int = 1
                 ) -> None:
    """`ShapeMismatch` listing every external array that is not the shape the canonical `shapes` imply."""
    expected = expected_shapes(mapping, shapes, head_dim)
    problems = [f"{external} has shape {tuple(np.shape(state[external]))}, the config implies {shape}"
                for external, shape in expected.items() if tuple(np.shape(state[external])) != shape]
    if problems:
        raise ShapeMismatch(problems)


def read(mapping: Plan, state: dict[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], head_dim: int = 1,
         consume: bool = False, lazy: bool = False) -> dict[str, np.ndarray]:
    """{external name: array} -> canonical weights, after checking every array's shape (`ShapeMismatch`).
    `consume=True` deletes each external entry once its last canonical part is read. `lazy=True` gives
    `LazyArray`s that read their external array when asked (and leaves `state` whole: it is read from)."""
    check_shapes(mapping, state, shapes, head_dim)
    groups = fused_groups(mapping)
    if lazy:
        return {name: _lazy_canonical(state, external, transform, part, shapes[name],
                                      [shapes[n][-1] for n in groups.get(external, ())], head_dim)
                for name, (external, transform, (part, _)) in mapping.items()}
    uses: dict[str, int] = {}
    for external, _, _ in mapping.values():
        uses[external] = uses.get(external, 0) + 1
    weights = {}
    for name, (external, transform, (part, _)) in mapping.items():
        if transform in FUSED:
            widths = [shapes[n][-1] for n in groups[external]]
            weights[name] = fused_part(state[external], transform, part, widths, head_dim)
        else:
            weights[name] = to_canonical(state[external], transform, shapes[name])
        uses[external] -= 1
        if consume and uses[external] == 0:
            del state[external]
    return weights


def _lazy_canonical(state, external: str, transform: str, part: int, shape: tuple[int, ...], widths: list[int],
                    head_dim: int) -> LazyArray:
    source = state[external]
    if transform in FUSED:
        return LazyArray(shape, source.dtype, lambda: fused_part(state[external], transform, part, widths, head_dim))
    return LazyArray(shape, source.dtype, lambda: to_canonical(state[external], transform, shape),
                     getattr(source, "span", None) if transform in RESHAPES else None,
                     _lazy_bands(source, transform, shape), source)


def _lazy_bands(source, transform: str, shape: tuple[int, ...]) -> Bands | None:
    """The bands of `source` under `transform` (to `shape`), where they can be made band by band."""
    if transform == "transpose" and len(source.shape) == 2:
        return _transposed_bands(source)
    if transform in RESHAPES:
        return _reshaped_bands(source, shape)
    return None


def write(mapping: Plan, weights: dict[str, np.ndarray], head_dim: int = 1, consume: bool = False,
          lazy: bool = False) -> dict[str, np.ndarray]:
    """Canonical weights -> {external name: array}, in plan order. `consume=True` empties `weights` as it goes.
    `lazy=True` gives `LazyArray`s that read their canonical arrays when asked (a shared external array is then
    the first canonical copy's: the twins never share one on writing)."""
    groups = fused_groups(mapping)
    if lazy:
        out = {}
        for name, (external, transform, _) in mapping.items():
            if external in out:
                continue
            names = groups[external] if transform in FUSED else [name]
            shape = external_shape(transform, tuple(weights[name].shape), head_dim,
                                   tuple(tuple(weights[n].shape) for n in names) if transform in FUSED else ())
            out[external] = LazyArray(shape, weights[name].dtype, functools.partial(
                _external_of, weights, names, transform, head_dim),
                getattr(weights[name], "span", None) if transform in RESHAPES else None,
                None if transform in FUSED else _lazy_bands(weights[name], transform, shape),
                None if transform in FUSED else weights[name])
        return out
    fused: dict[str, dict[str, np.ndarray]] = {}
    out = {}
    for name, (external, transform, _) in mapping.items():
        array = np.asarray(weights.pop(name) if consume else weights[name])
        if transform in FUSED:
            parts = fused.setdefault(external, {})
            parts[name] = array
            if len(parts) == len(groups[external]):
                out[external] = fuse([parts[n] for n in groups[external]], transform, head_dim)
                del fused[external]
        elif external in out:  # a shared external array: every canonical copy must be the same
            if not np.array_equal(to_external(array, transform, head_dim), out[external]):
                raise ValueError(f"{name!r} and another canonical parameter share {external!r} but differ")
        else:
            out[external] = to_external(array, transform, head_dim)
    return out


def _external_of(weights, names: list[str], transform: str, head_dim: int) -> np.ndarray:
    if transform in FUSED:
        return fuse([np.asarray(weights[n]) for n in names], transform, head_dim)
    return to_external(weights[names[0]], transform, head_dim)


def preview(names: list[str], limit: int = 6, sep: str = ", ") -> str:
    """The first `limit` names, then how many more: error messages stay one readable line."""
    shown = sep.join(names[:limit])
    return shown + (f"{sep}... ({len(names) - limit} more)" if len(names) > limit else "")
