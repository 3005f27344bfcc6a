"""The one mapping language: how canonical weights are named and shaped in another layout, as a table of
`(canonical, external, transform)` string triples, and the one engine that applies a table in both directions.

Every external layout uses it: the twins' own state dicts and `.weights.h5` files, `torch.nn.Transformer`, every
Hugging Face and KerasHub family, and a user's layout file (which is this table, read from TOML).

- `canonical`: a canonical parameter name (`parameter_shapes`), in which `{i}` stands for a layer index, `{e}` for
  an expert's index in a mixture of experts, `{qkv}` for one of the attention projections q, k, v (`{kv}`: k or v,
  fused apart from q), and `{gate_up}` for one of a gated feed-forward's input projections (`gate`, `linear1`);
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
  | `fused_qvk_blocks_t` | q, v, k in 4 model-parallel blocks: features `(4, [q, v, k], D/4)`, stored `(3D, in)` | required | written |
  | `fused_qkv_groups` | per key/value head its query heads, then k, then v: features `(G, [q * H/G, k, v], dk)` | required | written |
  | `fused_qkv_groups_t` | the same stored `(q+k+v, in)` (Falcon's `query_key_value`) | required | written |
  | `expert_bank` | every expert's array of one layer stacked, `(experts, ...)`: canonical `{e}`, not external | required | written |
  | `expert_bank_interleaved` | the same, gate and linear1 interleaved in the last axis, `(experts, ..., 2 * out)`: gate at the even features, linear1 at the odd (GPT-OSS's `gate_up_proj`) | required | written |
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

Names are patterns: literal text with five placeholders, written exactly so: `{i}`, a layer index, and `{e}`, an
expert's, each written as Python writes an int (no sign, no leading zeros, so that filling a name back gives the key
it was read from), `{qkv}`, one of `q`, `k`, `v`, `{kv}`, one of `k`, `v`, and `{gate_up}`, one of `gate`,
`linear1`. Anything else in braces is
refused when the pattern is parsed. A placeholder used twice matches the same text both times. Patterns are matched and filled by the small parser here, never by `str.format`.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

TRANSFORMS = ("identity", "transpose", "fused_qkv", "row", "tied", "sinusoid", "causal_mask", "ignore",
              "fused_qkv_t", "fused_qkv_heads", "fused_qkv_heads_t", "heads_out", "heads_in", "seq_first",
              "heads_first", "position_ids", "zero_type_ids", "mask_fill", "rope_inv_freq", "fused_qvk_blocks_t",
              "fused_qkv_groups", "fused_qkv_groups_t", "expert_bank", "expert_bank_interleaved")
FUSED = ("fused_qkv", "fused_qkv_t", "fused_qkv_heads", "fused_qkv_heads_t",
         "fused_qvk_blocks_t", "fused_qkv_groups", "fused_qkv_groups_t")  # one external array holds q, k, v
# one external array holds a layer's experts (`{e}` in the canonical name only), each at its index on the first axis;
# `_interleaved`: gate and linear1 of each, feature j of either at 2j and 2j + 1 of the last axis
BANKS = ("expert_bank", "expert_bank_interleaved")
GROUPED = FUSED + BANKS  # the transforms whose external array holds several canonical ones
# fused_qvk_blocks_t: a checkpoint trained over 4 model-parallel shards keeps each shard's q | v | k side by side, each
# a quarter of the heads (head h in shard h // (H / 4)); where q, k and v sit in a shard
BLOCKS, BLOCK_SLOTS = 4, (0, 2, 1)
HEADS = ("heads_out", "heads_in", "heads_first")  # einsum kernels (Keras MultiHeadAttention, KerasHub Gemma)
# optional on reading, never written: a copy, or a buffer the model recomputes, checked against what it must hold
CHECKED = ("tied", "sinusoid", "causal_mask", "ignore", "position_ids", "zero_type_ids", "mask_fill", "rope_inv_freq")
RESHAPES = ("identity", "row", "seq_first", "heads_out", "heads_in")  # the same bytes in C order, only reshaped
Entry = tuple[str, str, str]  # (canonical, external, transform)
# canonical name -> (external name, transform, (part, parts)): which of how many parts of a fused external array
Plan = dict[str, tuple[str, str, tuple[int, int]]]


# --- name patterns -------------------------------------------------------------------------------------------------

PLACEHOLDERS = {"i": "the layer index", "e": "an expert's index (a mixture of experts)", "qkv": "q, k or v",
                "kv": "k or v (k and v fused, q apart: `to_kv`)",
                "gate_up": "gate or linear1 (a gated feed-forward's two input projections)"}
_INDEX = "0|[1-9][0-9]{0,17}"  # an index as Python writes an int
_GROUPS = {"i": _INDEX, "e": _INDEX, "qkv": "[qkv]", "kv": "[kv]", "gate_up": "gate|linear1"}
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
                             "layer index), {e} (an expert's), {qkv} (q, k or v), {kv} (k or v) and {gate_up} (gate "
                             "or linear1) only, "
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
        if entry[2] in BANKS and ("e" not in placeholders(entry[0]) or "e" in placeholders(entry[1]) or (
                placeholders(entry[0]) & set(PARTS) != ({"gate_up"} if entry[2].endswith("interleaved") else set()))):
            raise ValueError(f"{entry[2]} stacks a layer's experts: {{e}} in its canonical pattern and not in its "
                             f"external one{' and {gate_up} in the canonical' if 'inter' in entry[2] else ''}, "
                             f"received {entry!r}")
        if entry[2] in FUSED and any(w in entry[2] for w in ("heads", "blocks", "groups")) \
                and "qkv" not in placeholders(entry[0]):
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
        if previous is not None and not (transform in GROUPED and previous[1] == entry) and not (
                shared and same and transform not in GROUPED):
            raise ValueError(f"{external!r} would hold both {previous[0]!r} ({where(previous[1])}) and {name!r} "
                             f"({where(entry)}); one name holds one tensor (a fused entry: q, k and v of one layer)")
        writers[external] = (name, entry)
        part = (0, 1)
        if transform in FUSED:
            kind = next(k for k in PARTS if k in groups)
            part = (PARTS[kind].index(groups[kind]), len(PARTS[kind]))
        elif transform in BANKS:  # expert e's place; the count, the layer's experts, once all are planned
            per = 2 if transform.endswith("interleaved") else 1
            part = (int(groups["e"]) * per + (PARTS["gate_up"].index(groups["gate_up"]) if per == 2 else 0), 0)
        out[name] = (external, transform, part)
    banked: dict[str, int] = {}
    for external, transform, _ in out.values():
        if transform in BANKS:
            banked[external] = banked.get(external, 0) + 1
    for name, (external, transform, (part, _)) in out.items():
        if transform in BANKS:
            out[name] = (external, transform, (part, banked[external]))
    return out


def fused_groups(mapping: Plan) -> dict[str, list[str]]:
    """external name -> its canonical parts' names, in the order the external array holds them (q, k, v; gate,
    linear1), for every fused entry of a plan."""
    groups: dict[str, list[str | None]] = {}
    for name, (external, transform, (part, count)) in mapping.items():
        if transform in GROUPED:
            if part >= count:
                raise ValueError(f"{external!r} holds {count} experts' parts, not one at {part}: a layer's experts "
                                 "are numbered from 0 without gaps")
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
    if transform == "expert_bank":  # (experts, ...)
        return (len(fused),) + shape
    if transform == "expert_bank_interleaved":  # (experts, ..., 2 * out): two parts per expert
        return (len(fused) // 2,) + shape[:-1] + (2 * shape[-1],)
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
    if transform == "expert_bank":
        return shape[1:] if len(shape) >= 2 else None  # (E, ...) -> (...)
    if transform == "expert_bank_interleaved":  # (E, ..., 2 * out) -> (..., out)
        return shape[1:-1] + (shape[-1] // 2,) if len(shape) >= 2 and shape[-1] % 2 == 0 else None
    if transform in FUSED:
        shape = shape[::-1] if transform.endswith("_t") else shape
        return shape[:-1] + (shape[-1] // parts,) if shape and shape[-1] % parts == 0 else None  # (.., 3D) -> (.., D)
    return shape


def transposed(array: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-ordered transpose of a 2-D array (any other rank, or a small one: `.T` copied), in a fresh array or in
    `out` (C-ordered, the transposed shape, the same dtype). A large one is copied on the bits in blocks of 8 rows by
    at most 512 columns, which keeps both sides in the cache (`transformer_parity.streaming.transpose` has the
    compiled tiles a streamed conversion uses; docs/formats.md has both speeds). A column slice of a larger matrix
    (`m[:, a:b]`) is copied the same way."""
    if out is not None and (out.shape != array.shape[::-1] or out.dtype != array.dtype
                            or not out.flags.c_contiguous or not out.flags.writeable):
        raise ValueError(f"transposed: out must be a writable C-ordered {array.dtype} array of shape "
                         f"{array.shape[::-1]}, got {out.dtype} {out.shape}")
    if not is_tileable(array):
        if out is None:
            return np.array(array.T, order="C")
        out[...] = array.T
        return out
    bits = array.view(f"u{array.dtype.itemsize}")
    out = np.empty(bits.shape[::-1], bits.dtype) if out is None else out.view(bits.dtype)
    for first in range(0, bits.shape[1], 512):
        source, target = bits[:, first:first + 512], out[first:first + 512]
        for start in range(0, bits.shape[0], 8):
            target[:, start:start + 8] = source[start:start + 8].T
    return out.view(array.dtype)


def is_tileable(array: np.ndarray) -> bool:
    """A 2-D array worth copying in tiles: large (over 64 KiB), of 1, 2, 4 or 8-byte items, rows contiguous."""
    return (array.ndim == 2 and array.dtype.itemsize in (1, 2, 4, 8) and array.strides[1] == array.dtype.itemsize
            and array.strides[0] >= 0 and array.nbytes > 1 << 16)


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
    an `nn.Linear` holds it; `_heads`: the features are `(H, 3, dk)`, q/k/v interleaved per head (equal widths);
    `_blocks`: `(4, 3, D/4)`, q, v and k side by side in each of 4 blocks (equal widths); `_groups`: `(G, g + 2, dk)`,
    each of the G key/value heads after its g = H / G query heads (k and v `G * dk` wide)."""
    a = np.asarray(array)
    if transform == "expert_bank":
        return np.array(a[part])  # (E, ...) -> expert `part`'s (...)
    if transform == "expert_bank_interleaved":
        expert, half = divmod(part, 2)
        return np.ascontiguousarray(a[expert, ..., half::2])  # (E, ..., 2 * out) -> (..., out): gate even, up odd
    a = transposed(a) if transform.endswith("_t") and a.ndim == 2 else a  # (3D, in) -> (in, 3D); a bias (3D,) stays
    if a.shape[-1] != sum(widths):
        raise ValueError(f"a fused array has {a.shape[-1]} features; its parts need {'+'.join(map(str, widths))}")
    if "blocks" in transform:
        width = widths[0]
        if len(widths) != 3 or len(set(widths)) != 1 or width % BLOCKS:
            raise ValueError(f"a q/v/k array of {sum(widths)} features does not split into {BLOCKS} blocks of equal "
                             "q, v and k")
        a = a.reshape(a.shape[:-1] + (BLOCKS, 3, width // BLOCKS))  # (..., 3D) -> (..., 4, 3, D/4)
        return np.ascontiguousarray(a[..., BLOCK_SLOTS[part], :]).reshape(a.shape[:-3] + (width,))  # -> (..., D)
    if "groups" in transform:
        groups, per = _groups(widths, head_dim)
        a = a.reshape(a.shape[:-1] + (groups, per + 2, head_dim))  # (..., q+k+v) -> (..., G, g + 2, dk)
        picked = a[..., :per, :] if part == 0 else a[..., per + part - 1:per + part, :]  # q: g heads; k, v: one
        return np.ascontiguousarray(picked).reshape(a.shape[:-3] + (widths[part],))  # -> (..., G * n * dk)
    if "heads" in transform:
        width = widths[0]
        if len(widths) != 3 or len(set(widths)) != 1 or width % head_dim:
            raise ValueError(f"a per-head fused q/k/v array of {sum(widths)} features does not split into heads of "
                             f"{head_dim} for q, k and v")
        a = a.reshape(a.shape[:-1] + (width // head_dim, 3, head_dim))  # (..., 3D) -> (..., H, 3, dk)
        return np.ascontiguousarray(a[..., part, :]).reshape(a.shape[:-3] + (width,))  # (..., H, dk) -> (..., D)
    start = sum(widths[:part])
    return np.ascontiguousarray(a[..., start:start + widths[part]])  # (..., q+k+v) -> (..., part)


def _groups(widths: Sequence[int], head_dim: int) -> tuple[int, int]:
    """`(G, g)` of a grouped fused q/k/v array: its key/value heads, and the query heads each one serves."""
    if len(widths) != 3 or widths[1] != widths[2] or widths[1] % head_dim or widths[0] % widths[1]:
        raise ValueError(f"a grouped q/k/v array of {'+'.join(map(str, widths))} features does not split into "
                         f"key/value heads of {head_dim}, each after a whole number of query heads")
    return widths[1] // head_dim, widths[0] // widths[1]


def fuse(parts: Sequence[np.ndarray], transform: str, head_dim: int = 1) -> np.ndarray:
    """The inverse of `fused_part`: q, k, v (canonical orientation) -> the fused external array."""
    if transform == "expert_bank":
        return np.stack(parts)  # (E, ...)
    if transform == "expert_bank_interleaved":  # expert by expert, gate and linear1: (E, ..., out, 2) -> (E, ..., 2out)
        pairs = [np.stack(parts[e:e + 2], axis=-1) for e in range(0, len(parts), 2)]
        return np.stack(pairs).reshape((len(pairs),) + parts[0].shape[:-1] + (2 * parts[0].shape[-1],))
    if "groups" in transform:
        groups, per = _groups([p.shape[-1] for p in parts], head_dim)
        lead = parts[0].shape[:-1]
        split = [p.reshape(lead + (groups, n, head_dim)) for p, n in zip(parts, (per, 1, 1))]  # (..., G, n, dk)
        fused = np.concatenate(split, axis=-2).reshape(lead + (sum(p.shape[-1] for p in parts),))  # (..., q+k+v)
    elif "blocks" in transform:
        width = parts[0].shape[-1]
        blocks = [p.reshape(p.shape[:-1] + (BLOCKS, width // BLOCKS)) for p in parts]  # (..., D) -> (..., 4, D/4)
        stacked = np.stack([blocks[BLOCK_SLOTS.index(slot)] for slot in range(3)], axis=-2)  # (..., 4, 3, D/4)
        fused = stacked.reshape(parts[0].shape[:-1] + (3 * width,))  # -> (..., 3D)
    elif "heads" in transform:
        width = parts[0].shape[-1]
        heads = [p.reshape(p.shape[:-1] + (width // head_dim, head_dim)) for p in parts]  # (..., D) -> (..., H, dk)
        fused = np.stack(heads, axis=-2).reshape(parts[0].shape[:-1] + (3 * width,))  # (..., H, 3, dk) -> (..., 3D)
    else:
        fused = np.concatenate(parts, axis=-1)  # (..., q), (..., k), (..., v) -> (..., q+k+v); gate | up alike
    return transposed(fused) if transform.endswith("_t") else fused  # (in, 3D) -> (3D, in)


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
        parts = [shapes[n] for n in groups[external]] if transform in GROUPED else ()
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


# How an array that is not read yet is made (`transformer_parity.streaming.lazy.deferred`): `defer(shape, dtype,
# compute, source, transform)` returns an object with that shape and dtype whose values are `compute()`, made from
# the one array `source` by `transform` (None: from several, a fused tensor's parts). The engine itself reads nothing.
Defer = Callable[[tuple[int, ...], Any, Callable[[], np.ndarray], Any, str], Any]


def read(mapping: Plan, state: dict[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], head_dim: int = 1,
         consume: bool = False, defer: Defer | None = None) -> dict[str, np.ndarray]:
    """{external name: array} -> canonical weights, after checking every array's shape (`ShapeMismatch`).
    `consume=True` deletes each external entry once its last canonical part is read. With `defer`, each canonical
    array is `defer(...)` of the external one, read when asked (and `state` is left whole: it is read from)."""
    check_shapes(mapping, state, shapes, head_dim)
    groups = fused_groups(mapping)
    if defer is not None:
        return {name: _deferred_canonical(defer, state, external, transform, part, shapes[name],
                                          [shapes[n][-1] for n in groups.get(external, ())], head_dim)
                for name, (external, transform, (part, _)) in mapping.items()}
    uses: dict[str, int] = {}
    for external, _, _ in mapping.values():
        uses[external] = uses.get(external, 0) + 1
    weights = {}
    for name, (external, transform, (part, _)) in mapping.items():
        if transform in GROUPED:
            widths = [shapes[n][-1] for n in groups[external]]
            weights[name] = fused_part(state[external], transform, part, widths, head_dim)
        else:
            weights[name] = to_canonical(state[external], transform, shapes[name])
        uses[external] -= 1
        if consume and uses[external] == 0:
            del state[external]
    return weights


def _deferred_canonical(defer: Defer, state, external: str, transform: str, part: int, shape: tuple[int, ...],
                        widths: list[int], head_dim: int):
    source = state[external]
    if transform in GROUPED:
        return defer(shape, source.dtype, lambda: fused_part(state[external], transform, part, widths, head_dim),
                     None, transform)
    return defer(shape, source.dtype, lambda: to_canonical(state[external], transform, shape), source, transform)


def write(mapping: Plan, weights: dict[str, np.ndarray], head_dim: int = 1, consume: bool = False,
          defer: Defer | None = None) -> dict[str, np.ndarray]:
    """Canonical weights -> {external name: array}, in plan order. `consume=True` empties `weights` as it goes.
    With `defer`, each external array is `defer(...)` of its canonical ones, read when asked (a shared external
    array is then the first canonical copy's: the twins never share one on writing)."""
    groups = fused_groups(mapping)
    if defer is not None:
        out = {}
        for name, (external, transform, _) in mapping.items():
            if external in out:
                continue
            names = groups[external] if transform in GROUPED else [name]
            shape = external_shape(transform, tuple(weights[name].shape), head_dim,
                                   tuple(tuple(weights[n].shape) for n in names) if transform in GROUPED else ())
            out[external] = defer(shape, weights[name].dtype,
                                  functools.partial(_external_of, weights, names, transform, head_dim),
                                  None if transform in GROUPED else weights[name], transform)
        return out
    fused: dict[str, dict[str, np.ndarray]] = {}
    out = {}
    for name, (external, transform, _) in mapping.items():
        array = np.asarray(weights.pop(name) if consume else weights[name])
        if transform in GROUPED:
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
    if transform in GROUPED:
        return fuse([np.asarray(weights[n]) for n in names], transform, head_dim)
    return to_external(weights[names[0]], transform, head_dim)


def preview(names: list[str], limit: int = 6, sep: str = ", ") -> str:
    """The first `limit` names, then how many more: error messages stay one readable line."""
    shown = sep.join(names[:limit])
    return shown + (f"{sep}... ({len(names) - limit} more)" if len(names) > limit else "")
