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
from typing import Iterable, Sequence

import numpy as np

import reference_numpy as rn
from reference_numpy.schema import preview

TRANSFORMS = ("identity", "transpose", "fused_qkv", "row", "tied", "sinusoid", "causal_mask", "ignore",
              "fused_qkv_t", "fused_qkv_heads", "fused_qkv_heads_t", "heads_out", "heads_in")
FUSED = ("fused_qkv", "fused_qkv_t", "fused_qkv_heads", "fused_qkv_heads_t")  # one external array holds q, k, v
HEADS = ("heads_out", "heads_in")  # einsum kernels of Keras MultiHeadAttention
CHECKED = ("tied", "sinusoid", "causal_mask", "ignore")  # optional on reading, never written
Entry = tuple[str, str, str]  # (canonical, external, transform)

_PLACEHOLDERS = {"i": r"(?P<i>\d+)", "qkv": r"(?P<qkv>[qkv])"}


def _regex(pattern: str) -> re.Pattern:
    """`encoder.layers.{i}.self_attn.{qkv}.kernel` -> a regex with named groups `i` and `qkv`."""
    parts = re.split(r"(\{\w+\})", pattern)
    out = []
    for part in parts:
        name = part[1:-1] if part.startswith("{") and part.endswith("}") else None
        if name is not None and name not in _PLACEHOLDERS:
            raise ValueError(f"unknown placeholder {part!r} in pattern {pattern!r}; known: "
                             f"{', '.join('{' + p + '}' for p in _PLACEHOLDERS)}")
        out.append(_PLACEHOLDERS[name] if name is not None else re.escape(part))
    return re.compile("".join(out))


def check_table(table: Sequence[Entry]) -> None:
    for entry in table:
        if len(entry) != 3 or not all(isinstance(x, str) for x in entry):
            raise ValueError(f"a table entry is (canonical, external, transform), received {entry!r}")
        if entry[2] not in TRANSFORMS:
            raise ValueError(f"unknown transform {entry[2]!r} in {entry!r}; choose one of {', '.join(TRANSFORMS)}")
        if entry[2] in FUSED and "{qkv}" not in entry[0]:
            raise ValueError(f"a fused_qkv entry needs {{qkv}} in its canonical pattern, received {entry!r}")


def plan(config: rn.TransformerConfig, table: Sequence[Entry]) -> dict[str, tuple[str, str, int]]:
    """canonical name -> (external name, transform, part), `part` being 0/1/2 for q/k/v of a fused entry."""
    check_table(table)
    compiled = [(_regex(c), e, t) for c, e, t in table if t not in CHECKED]
    out = {}
    for name in rn.parameter_shapes(config):
        for pattern, external, transform in compiled:
            match = pattern.fullmatch(name)
            if match:
                groups = match.groupdict()
                fused = transform in FUSED
                out[name] = (external.format(**{k: v for k, v in groups.items() if v is not None}),
                             transform, "qkv".index(groups["qkv"]) if fused else 0)
                break
        else:
            raise ValueError(f"no table entry covers canonical parameter {name!r}")
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
        pattern = _regex(external)
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

    def allows(self, key: str) -> bool:
        return any(name == key or _regex(name).fullmatch(key) for name in self.allowed)

    def unused(self) -> list[str]:
        """The allowed names that matched no dropped tensor (a typo, or a name for another file)."""
        return [name for name in self.allowed if not any(key == name or _regex(name).fullmatch(key)
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
                 source: str = "<state dict>", consume: bool = False, drops: Drops | None = None
                 ) -> dict[str, np.ndarray]:
    """{external name: array} -> canonical weights. `consume=True` empties `state` as it goes. A float tensor
    with a nonzero value under an `ignore` entry is refused unless `drops` allows it (and then recorded there)."""
    shapes = rn.parameter_shapes(config)
    mapping = plan(config, table)
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
                 consume: bool = False) -> dict[str, np.ndarray]:
    """Canonical weights -> {external name: array}, in table order. `consume=True` empties `weights` as it goes."""
    rn.validate_weights(config, weights)
    mapping = plan(config, table)
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
