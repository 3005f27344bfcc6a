"""Layout files that users write: a TOML description of a model this tool has never seen.

A layout file is the declarative table of `layouts.table` read from a file, plus the config fields the weights
cannot tell::

    [config]                      # TransformerConfig fields the weights cannot tell: each must be stated
    num_heads = 4                 # or "hparam:model_kwargs.num_heads" (a Lightning .ckpt's hyper_parameters)
    activation = "relu"
    norm_first = false
    layer_norm_eps = 1e-6
    scale_embedding = true
    pad_id = 0                    # or "none": no padding token

    [weights]                     # "your name" = "canonical name [transform]"; {i} is the layer index
    "embed.weight"                  = "src_embed.embedding"
    "layers.{i}.attn.W_Q.weight"    = "encoder.layers.{i}.self_attn.q.kernel transpose"
    "layers.{i}.attn.qkv_proj.weight" = "encoder.layers.{i}.self_attn.{qkv}.kernel fused_qkv_heads_t"
    "pos.pe"                        = "- sinusoid"

The transform is one of `layouts.table.TRANSFORMS` (identity when left out). What the weights tell is read from
them: the layer counts from the `{i}` that occur, d_model, the vocabularies, d_ff, learned positions and their
length, a sinusoid table's layout and length, which norms, biases and heads exist. What they cannot tell
(`UNSTATED`, and `unstated` for the settings that depend on the weights) must be stated in `[config]` or on the
command line, or the import is refused with one line naming every missing field. Every key of the file must be
matched by exactly one pattern, every pattern must match some key (but the optional `tied`, `sinusoid`,
`causal_mask` and `ignore` entries, which describe what a file may or may not hold), and every shape must be the one
the config implies; each failure names the key. `ignore` drops a float tensor with a nonzero value only when the user
names it (`table.Drops`, `--allow-drop`).

`.weights.h5` files are read through the hardened HDF5 checks of `streaming.hdf5` (`read_keras_h5`); their
dataset paths are the names (`enc_layers/encoder_layer_1/mha/wq/vars/0`), with Keras's unnumbered first layer of a
kind renamed `_0` wherever a `_1` sibling exists (or a pattern says `name_{i}`), so `{i}` covers every layer.

`scaffold` writes a starting file for a checkpoint; `export_with_layout` writes canonical weights back under the
names a layout gives (`convert --to-layout`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

import reference_numpy as rn
from reference_numpy.mapping import (FUSED, PARTS, Entry, canonical_shape, fill, hits, index, placeholders, preview,
                                     regex)

from transformer_parity.io.safe_text import printable, toml_string
from . import hparams as hp
from .layout_file import (FOR_HDF5, NONE, OPTIONAL, UNMAPPED, Layout, check_hdf5_paths, check_name,  # noqa: F401
                          load, load_for_writing, output_kind, parse)
from .table import Drops, classify_sinusoid, import_state, sinusoid_mismatch, sinusoid_rows

# What no model's weights tell, so every layout states it ([config], --set or --config). `unstated` adds those that
# depend on what the weights hold (no positional table: its kind and length; ...).
UNSTATED = ("num_heads", "attention_scale", "activation", "norm_first", "layer_norm_eps", "scale_embedding",
            "pad_id")


# --- matching a file's keys -------------------------------------------------------------------------------------------

def match(layout: Layout, keys) -> dict[str, Entry]:
    """key -> the one table entry whose pattern matches it; errors name the unmatched or doubly matched key and
    the pattern that matches nothing."""
    literal, patterned = index((external, (canonical, external, transform))
                               for canonical, external, transform in layout.table)
    used = {external: 0 for _, external, _ in layout.table}
    out: dict[str, Entry] = {}
    unmatched = []
    for key in keys:
        found = [entry for _, entry in hits(key, literal, patterned)]
        if len(found) > 1:
            raise ValueError(f"{layout.path}: key {key!r} is matched by {len(found)} lines: "
                             + ", ".join(layout.where(e) for e in found))
        if not found:
            unmatched.append(key)
            continue
        out[key] = found[0]
        used[found[0][1]] += 1
    if unmatched:
        raise ValueError(f"{layout.path}: {len(unmatched)} key(s) of the weights are not in the layout: "
                         + _preview(unmatched) + " (add them to [weights]; '- ignore' skips a buffer)")
    optional = {external for _, external, transform in layout.table if transform in OPTIONAL}
    unused = [p for p, n in used.items() if n == 0 and p not in optional]  # an optional entry may be absent
    if unused:
        line = layout.lines.get(unused[0], 0)
        raise ValueError(f"{layout.path}{f':{line}' if line else ''}: pattern {unused[0]!r} matches no key of the "
                         f"weights" + (f" (nor do {_preview(unused[1:])})" if unused[1:] else ""))
    return out


def canonical_shapes(layout: Layout, state: Mapping[str, np.ndarray], matched: Mapping[str, Entry]
                     ) -> dict[str, tuple[int, ...]]:
    """canonical name -> shape, read off the external arrays (for inferring the config); a canonical name two
    keys fill is refused, naming both lines."""
    shapes: dict[str, tuple[int, ...]] = {}
    filled_by: dict[str, tuple[str, Entry]] = {}
    for key, entry in matched.items():
        canonical, external, transform = entry
        if transform in OPTIONAL:
            continue
        groups = regex(external).fullmatch(key).groupdict()
        kind = next((k for k in PARTS if k in placeholders(canonical)), None) if transform in FUSED else None
        parts = PARTS[kind] if kind else [groups.get("qkv")]  # a fused entry holds all its parts
        shape = canonical_shape(transform, np.shape(state[key]), len(parts))
        if shape is None and transform in FUSED:
            stored = tuple(np.shape(state[key]))
            axis = (stored[::-1] if transform.endswith("_t") else stored)[-1:] or ("none",)
            raise ValueError(f"{layout.path}: {key!r} has shape {stored}; its fused {'/'.join(parts)} axis of "
                             f"{axis[0]} does not divide by {len(parts)} ({transform})")
        if shape is None:
            raise ValueError(f"{layout.path}: {key!r} has shape {tuple(np.shape(state[key]))}, which a {transform} "
                             f"entry cannot hold (it takes {_TRANSFORM_SHAPES.get(transform, 'another rank')}); "
                             f"{layout.where(entry)}")
        for part in parts:
            name = fill(canonical, i=groups.get("i"), **{kind or "qkv": part})
            if name in filled_by and filled_by[name][0] != key:
                other_key, other = filled_by[name]
                raise ValueError(f"{layout.path}: canonical parameter {name!r} is filled twice, from {other_key!r} "
                                 f"({layout.where(other)}) and {key!r} ({layout.where(entry)}); keep one")
            filled_by[name] = (key, entry)
            shapes[name] = shape
    return shapes


_TRANSFORM_SHAPES = {"heads_out": "(in, H, dk), or (H, dk) for a bias", "heads_in": "(H, dk, out)",
                     "heads_first": "(H, in, dk), or (H, dk) for a bias", "row": "(1, n)"}


def heads_from(layout: Layout, state: Mapping[str, np.ndarray], matched: Mapping[str, Entry]) -> dict[str, int]:
    """`{"num_heads": H}` when the einsum kernels (`heads_out`: `(D, H, dk)`; `heads_first`: `(H, D, dk)`) agree on
    it, else `{}`."""
    heads = {tuple(np.shape(state[key]))[-2 if t == "heads_out" else 0] for key, (_, _, t) in matched.items()
             if t in ("heads_out", "heads_first") and np.ndim(state[key]) >= 2}
    return {"num_heads": heads.pop()} if len(heads) == 1 else {}


def infer_config(shapes: Mapping[str, tuple[int, ...]], fields: Mapping[str, Any], sinusoid_rows=(),
                 source: str = "<layout>", sinusoid_layout: str | None = None, refuse_unstated: bool = False
                 ) -> tuple[rn.TransformerConfig, list[str]]:
    """`(config, notes)`: the config the canonical shapes imply (and the rows and layout of any sinusoid table the
    file holds), with `fields` (the layout's [config], then --set) on top. `refuse_unstated=True`: a setting the
    weights cannot tell (`unstated`) that `fields` does not give is refused, one line naming all of them."""
    inferred: dict[str, Any] = {}
    notes = []

    def layers(stack: str) -> int:
        found = {int(m[1]) for n in shapes if (m := re.match(rf"{stack}\.layers\.(\d+)\.", n))}
        return max(found) + 1 if found else 0

    inferred["num_encoder_layers"], inferred["num_decoder_layers"] = layers("encoder"), layers("decoder")
    width = [s[-1] for n, s in shapes.items() if n.endswith((".gamma", ".embedding"))]
    if width:
        inferred["d_model"] = width[0]
    for name, key in (("src_embed.embedding", "src_vocab_size"), ("tgt_embed.embedding", "tgt_vocab_size"),
                      ("src_type.embedding", "type_vocab_size")):
        if name in shapes:
            inferred[key] = shapes[name][0]
    if "output.kernel" in shapes:
        inferred["tgt_vocab_size"] = shapes["output.kernel"][1]
    elif "output.bias" in shapes:
        inferred["tgt_vocab_size"] = shapes["output.bias"][0]
        inferred["tie_embeddings"] = True
    elif "tie_embeddings" not in fields or not fields["tie_embeddings"]:
        inferred["output_projection"] = False
    if not inferred["num_decoder_layers"] and "tgt_vocab_size" not in inferred and "src_vocab_size" in inferred:
        inferred["tgt_vocab_size"] = inferred["src_vocab_size"]
    if inferred["num_encoder_layers"] and inferred["num_decoder_layers"] and "tgt_embed.embedding" not in shapes:
        inferred["share_embeddings"] = True
    if not inferred["num_encoder_layers"] and "src_vocab_size" not in inferred and "tgt_vocab_size" in inferred:
        inferred["src_vocab_size"] = inferred["tgt_vocab_size"]
    d_ff = [s[0] for n, s in shapes.items() if n.endswith("ffn.linear1.bias")]  # orientation-free, if present
    d_ff += [s[1] for n, s in shapes.items() if n.endswith("ffn.linear1.kernel")]
    if d_ff:
        inferred["d_ff"] = d_ff[0]
    positions = [s[0] for n, s in shapes.items() if n.endswith("_pos.embedding")]
    if positions:
        inferred["positional"] = "learned"
        if "position_offset" in fields:
            inferred["max_len"] = positions[0] - _offset(fields, source)
    elif sinusoid_rows:
        inferred["positional"] = "sinusoidal"
        inferred["max_len"] = max(sinusoid_rows)  # the longest sinusoid table the file holds
        if sinusoid_layout is not None:
            inferred["sinusoid_layout"] = sinusoid_layout
    elif "max_len" not in fields and not refuse_unstated:
        notes.append(f"the weights do not tell max_len (no position table): {rn.TransformerConfig().max_len} "
                     "assumed; longer inputs need --set max_len=N")
    if inferred.get("output_projection") is False and "output_projection" not in fields and not refuse_unstated:
        notes.append("no output layer in the weights: read as a bare backbone returning hidden states")
    inferred["final_norm"] = any(n.endswith("final_norm.gamma") for n in shapes)
    inferred["bias"] = any(n.endswith("self_attn.q.bias") for n in shapes)
    inferred["output_bias"] = "output.bias" in shapes
    inferred["embed_norm"] = any(n.endswith("_embed_norm.gamma") for n in shapes)
    inferred["head_transform"] = "head.dense.kernel" in shapes
    inferred["pooler"] = "pooler.kernel" in shapes
    inferred["embed_bias"] = any(n.endswith("_embed.bias") for n in shapes)  # a Linear over one-hot ids
    if refuse_unstated:
        missing = unstated(inferred, fields)
        if missing:
            example = f"{missing[0]} = {_toml_value(EXAMPLES.get(missing[0], 0))}"
            raise hp.Unstated(f"{source}: the weights do not tell {', '.join(missing)}: state them in the layout's "
                              f"[config] (e.g. {example}) or give them with --set FIELD=VALUE, as the model's code "
                              "has them", missing)
    if "num_heads" not in fields:
        raise ValueError(f"{source}: num_heads is not in the layout's [config] (the weights cannot tell it); add "
                         "num_heads = N")
    if positions and "max_len" not in inferred:
        inferred["max_len"] = positions[0] - _offset(fields, source)
    values = {**inferred, **fields}
    if values.get("tie_embeddings") and "output_projection" not in fields:
        values["output_projection"] = True  # a tied head has no kernel of its own
    try:
        return rn.TransformerConfig.from_dict(values), notes
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: the layout and the weights give an invalid config: {exc}") from None


def _offset(fields: Mapping[str, Any], source: str) -> int:
    value = fields.get("position_offset") or 0
    problem = rn.config.field_type_problem("position_offset", value)
    if problem:
        raise ValueError(f"{source}: {problem}")
    return value


EXAMPLES = {"num_heads": 8, "activation": "relu", "norm_first": False, "layer_norm_eps": 1e-5,
            "scale_embedding": True, "pad_id": 0, "positional": "sinusoidal", "sinusoid_layout": "interleaved",
            "max_len": 512, "position_offset": 0, "output_projection": False, "head_activation": "gelu",
            "head_layer_norm_eps": 1e-5, "attention_scale": "head", "head_order": "dense-activation-norm"}


def unstated(inferred: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """The config fields that the weights (`inferred`) do not tell and `given` does not state.

    Always `UNSTATED` (but num_heads where einsum kernels give it); without a positional table, the positions'
    kind, length and sinusoid layout; with a learned table, `position_offset` (BART reads row p + 2); without an
    output layer, `output_projection` (a bare backbone, or a tied head without a bias?); with a head transform, its
    activation and epsilon."""
    names = list(UNSTATED)
    if "positional" not in inferred:
        names += ["positional", "max_len"]
        if given.get("positional") != "learned":
            names.append("sinusoid_layout")
    elif inferred["positional"] == "learned":
        names.append("position_offset")
    if inferred.get("output_projection") is False:
        names.append("output_projection")
    if inferred.get("head_transform"):
        names += ["head_order", "head_activation", "head_layer_norm_eps"]
    return [n for n in names if n not in given and n not in inferred]


def _toml_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else \
        f'"{value}"' if isinstance(value, str) else str(value)


# --- reading a checkpoint through a layout ----------------------------------------------------------------------------

@dataclass
class Checkpoint:
    """What a layout reads: the tensors by name, a Lightning checkpoint's `hyper_parameters`, notes on both."""

    state: dict[str, np.ndarray]
    hparams: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The tensors of a PyTorch state dict (`.pt`, `.pth`, `.bin`; a PyTorch Lightning `.ckpt`, whose
    `hyper_parameters` come along), a `.safetensors` file, a Keras `.weights.h5` (dataset paths, see the module
    docstring) or a Keras 2 `save_weights` `.h5` (the variables' names, `dense_1/kernel`). Integer and boolean
    buffers are kept (a layout may `ignore` them)."""
    path = Path(path)
    from transformer_parity.io.sniff import sniff

    kind = sniff(path)
    if kind in ("zip", "pickle"):
        from transformer_parity.io import torch_files as tc

        obj = tc.read_torch_file(path)
        hparams, notes = None, []
        if tc.is_lightning_checkpoint(obj):
            hparams, note = tc.lightning_parts(obj, path)
            notes.append(note)
        state, _ = tc.unwrap_state_dict(obj, path)
        return Checkpoint(tc.numpy_state(state, path, integers=True), hparams, notes)
    if kind == "safetensors":
        from transformer_parity.io.safetensors_io import read_header, read_tensors

        return Checkpoint(dict(read_tensors(read_header(path))))
    if kind == "hdf5":
        from .hf_legacy import is_keras2_h5, read_keras2_h5

        if is_keras2_h5(path):  # Keras 2's save_weights: the names tf.keras gave the variables, without ":0"
            return Checkpoint({name.removesuffix(":0"): array for name, array in read_keras2_h5(path)})
        return Checkpoint(read_keras_h5(path))
    raise ValueError(f"{path} is not a PyTorch state dict, safetensors or HDF5 (.weights.h5) file")


def read_state(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """{name: array} of a checkpoint (`read_checkpoint`)."""
    return read_checkpoint(path).state


def read_keras_h5(path: str | os.PathLike, lazy: bool = False) -> dict[str, np.ndarray]:
    """{dataset path: array} of a Keras `.weights.h5`, every group checked by the hardened reader's checks
    (`streaming.hdf5.check_layout`: no links, external storage, virtual datasets or filters, float data
    fully stored, sizes bounded by the file's) before anything is read. The optimizer's state, which `model.fit`
    leaves in the file (an int64 iteration count), is neither checked nor read. `lazy=True`: `LazyArray`s in the
    stored dtype, each read when asked (`streaming.hdf5.read_dataset`)."""
    import h5py

    from transformer_parity.streaming import hdf5

    path = Path(path)
    size = path.stat().st_size
    out: dict[str, np.ndarray] = {}
    try:
        with h5py.File(path, "r") as f:
            total = 0
            for top in list(f):
                if top == "optimizer":
                    continue
                link = f.get(top, getlink=True)
                if not isinstance(link, h5py.HardLink) or not isinstance(f[top], h5py.Group):
                    raise ValueError(f"{path}: {top!r} is not a group of weights ({type(link).__name__})")
                checked = hdf5.check_layout(path, f[top], size)
                total += sum(int(np.prod(shape, dtype=object)) * f[top][name].dtype.itemsize
                             for name, shape in checked.items())
                if total > size:
                    raise ValueError(f"{path}: its datasets declare {total} bytes, more than the file's {size}")
                out.update({f"{top}/{name}": hdf5.read_dataset(f[top][name], lazy) for name in checked})
    except (OSError, KeyError, RuntimeError) as exc:
        raise ValueError(f"{path} is not a readable HDF5 file (truncated or corrupt?): {exc}") from None
    return keras_names(out)


def keras_names(datasets: Mapping[str, np.ndarray], repeated=()) -> dict[str, np.ndarray]:
    """Dataset paths with Keras's unnumbered first list item named `_0` wherever a `_1` sibling exists, or where
    the name is one of `repeated` (a table's `transformer_decoder_{i}`: a one-layer model has no `_1`)."""
    prefixes = set()
    for p in datasets:
        parts = p.split("/")
        for depth in range(len(parts)):
            prefixes.add("/".join(parts[:depth + 1]))

    def rename(p: str) -> str:
        original = p.split("/")
        parts = list(original)
        for depth, part in enumerate(original[:-1]):
            parent = "/".join(original[:depth])  # siblings are looked up under the original names
            sibling = f"{parent}/{part}_1" if parent else f"{part}_1"
            if sibling in prefixes or part in repeated:
                parts[depth] = f"{part}_0"
        return "/".join(parts)

    return {rename(p): v for p, v in datasets.items()}


def import_with_layout(path: str | os.PathLike, layout_path: str | os.PathLike,
                       fields: Mapping[str, Any] | None = None, drops: Drops | None = None
                       ) -> tuple[rn.TransformerConfig, dict[str, np.ndarray], list[str]]:
    """`(config, canonical weights, notes)` of a checkpoint described by a layout file (`fields`: --set/--config,
    over the layout's [config]). Every setting the weights cannot tell must be stated; `drops` (`table.Drops`)
    names the nonzero tensors that `ignore` entries may leave out."""
    return import_layout(load(layout_path), read_checkpoint(path), fields, drops, path)


def import_layout(layout: Layout, checkpoint: Checkpoint, fields: Mapping[str, Any] | None = None,
                  drops: Drops | None = None, path: str | os.PathLike = "<checkpoint>"
                  ) -> tuple[rn.TransformerConfig, dict[str, np.ndarray], list[str]]:
    """`import_with_layout` on a parsed layout and a checkpoint already read (`checkpoint.state` is consumed)."""
    state, notes = checkpoint.state, list(checkpoint.notes)
    source = f"{Path(path).name} with {layout.path.name}"
    stated = {}
    for name, value in layout.config.items():
        if hp.is_reference(value):
            value = hp.lookup(checkpoint.hparams, value, f"{layout.path}: [config] {name}")
            problem = rn.config.field_type_problem(name, value)
            if problem:
                raise ValueError(f"{layout.path}: [config] {name} = {layout.config[name]!r}: {problem}")
            notes.append(f"{name}={value!r} from the checkpoint's {layout.config[name]!r}")
        stated[name] = value
    if repeated_layers(layout.table):
        state = keras_names(state, repeated_layers(layout.table))
    matched = match(layout, list(state))
    sinusoid_rows, kinds = [], {}
    for key, (_, _, transform) in matched.items():
        if transform == "sinusoid":
            rows = sinusoid_rows_of(state[key], key, source)
            state[key] = rows
            sinusoid_rows.append(rows.shape[0])
            kinds[key] = classify_sinusoid(rows)
            if kinds[key] is None and "sinusoid_layout" not in {**stated, **dict(fields or {})}:
                raise ValueError(f"{source}: {key} is mapped '- sinusoid' but is no sinusoid table the model "
                                 f"computes: {sinusoid_mismatch(rows, 'interleaved')}; "
                                 f"{sinusoid_mismatch(rows, 'concatenated')}; a learned table is a parameter "
                                 "(src_pos.embedding / tgt_pos.embedding)")
    found = sorted({k for k in kinds.values() if k is not None})
    if len(found) > 1:
        raise ValueError(f"{source}: the sinusoid tables differ in layout: "
                         + ", ".join(f"{key} is {kind}" for key, kind in kinds.items()))
    shapes = canonical_shapes(layout, state, matched)
    config, more = infer_config(shapes, {**heads_from(layout, state, matched), **stated, **dict(fields or {})},
                                sinusoid_rows, source, sinusoid_layout=found[0] if found else None,
                                refuse_unstated=True)
    notes += more
    origins = {"num_encoder_layers": "one more than the highest encoder layer index of the weights",
               "num_decoder_layers": "one more than the highest decoder layer index of the weights",
               **layout.origins(), **{name: "--set/--config" for name in fields or {}}}
    weights = import_state(config, state, layout.table, source=f"{path} (layout {layout.path})", consume=True,
                           drops=drops, where=layout.where, origins=origins)
    notes.insert(0, f"read {len(matched)} tensors through layout {layout.path}")
    return config, weights, notes


def sinusoid_rows_of(array, key: str, source: str) -> np.ndarray:
    """A `- sinusoid` buffer as `(max_len, d)` rows (`table.sinusoid_rows`), or a `ValueError` naming its shape."""
    rows = sinusoid_rows(array)
    if rows is None:
        raise ValueError(f"{source}: {key} has shape {np.shape(array)}; a sinusoid table is (max_len, d_model), "
                         "(max_len, 1, d_model) or (1, max_len, d_model)")
    return rows


def repeated_layers(table) -> list[str]:
    """Keras layer names that carry `{i}` in a table (`transformer_decoder` for `transformer_decoder_{i}`)."""
    return sorted({m for _, external, _ in table for m in re.findall(r"([\w.-]+)_\{i\}", external)})


def keras_path(name: str, repeated) -> str:
    """`layers/transformer_decoder_0/...` -> `layers/transformer_decoder/...`: Keras leaves the first unnumbered."""
    for base in repeated:
        name = re.sub(rf"(^|/){re.escape(base)}_0(/|$)", rf"\1{base}\2", name)
    return name


def keras_paths(names, repeated=()) -> dict[str, str]:
    """The inverse of `keras_names`: name -> the path Keras uses, `X_0` back to `X` wherever an `X_1` sibling exists
    or `X` is one of `repeated`."""
    prefixes = {"/".join(n.split("/")[:depth + 1]) for n in names for depth in range(n.count("/") + 1)}

    def rename(name: str) -> str:
        original = name.split("/")
        parts = list(original)
        for depth, part in enumerate(original[:-1]):
            m = re.fullmatch(r"(.+)_0", part)
            parent = "/".join(original[:depth])
            if m and (m[1] in repeated or (f"{parent}/{m[1]}_1" if parent else f"{m[1]}_1") in prefixes):
                parts[depth] = m[1]
        return "/".join(parts)

    return {n: rename(n) for n in names}


# --- writing a checkpoint through a layout ----------------------------------------------------------------------------

def export_with_layout(path: str | os.PathLike, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray],
                       layout: str | os.PathLike | Layout, force: bool = False) -> str:
    """Write canonical weights under the names a layout file describes, for the user's own model to load: a PyTorch
    state dict (`.pt`, `.pth`, `.bin`: `model.load_state_dict(torch.load(path))`), a `.safetensors`, or a Keras
    `.weights.h5` (`model.load_weights(path)`). The layout's [config] must agree with the model's config (a layout
    for epsilon 1e-6 describes another model than one with 1e-5). Returns a description of what was written."""
    from ..io import guards, outputs
    from .table import export_state

    path = Path(path)
    kind = output_kind(path)
    if not isinstance(layout, Layout):
        layout = load_for_writing(layout, path)
    conflicts = [f"{k}={v!r} (this model has {getattr(config, k)!r})" for k, v in layout.config.items()
                 if not hp.is_reference(v) and getattr(config, k) != v]
    if conflicts:
        raise ValueError(f"{layout.path} describes another model than this one: {', '.join(conflicts)}")
    guards.check_output(path, force)
    try:
        state = export_state(config, dict(weights), layout.table, where=layout.where)
    except ValueError as exc:
        raise ValueError(f"{layout.path}: {exc}") from None
    names = keras_paths(list(state), repeated_layers(layout.table)) if kind == "keras" else {}
    if kind == "keras":
        check_hdf5_paths(names, layout)
    if kind == "torch":
        import torch
    with outputs.atomic_path(path, force) as tmp:
        if kind == "torch":
            torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, tmp)
        elif kind == "safetensors":
            from safetensors.numpy import save_file
            save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(tmp))
        else:
            import h5py
            with h5py.File(tmp, "w") as f:
                for key, value in state.items():
                    f.create_dataset(names[key], data=np.ascontiguousarray(value))
    return f"{kind} under layout {layout.path.name}"


def _preview(names) -> str:
    return preview([repr(n) for n in names])


# --- a starting file: every key listed, the guessable ones guessed ----------------------------------------------------

_ROLES = [  # (words in the key's module path, canonical leaf under a layer); first hit wins
    (("qkv", "qkv_proj", "in_proj", "c_attn", "query_key_value"), "{attn}.{{qkv}}"),
    (("q", "q_proj", "query", "w_q", "wq", "q_lin", "query_dense", "fc_q"), "{attn}.q"),
    (("k", "k_proj", "key", "w_k", "wk", "k_lin", "key_dense", "fc_k"), "{attn}.k"),
    (("v", "v_proj", "value", "w_v", "wv", "v_lin", "value_dense", "fc_v"), "{attn}.v"),
    (("o", "o_proj", "out_proj", "w_o", "wo", "out_lin", "attention_output", "c_proj_attn", "output_dense", "fc_o"),
     "{attn}.o"),
    (("_cross_attention_layer_norm", "cross_attn_layer_norm", "encoder_attn_layer_norm", "enc_attn_layer_norm"),
     "cross_norm"),
    (("norm1", "ln_1", "ln1", "layernorm1", "layer_norm1", "norm_1", "attention_norm", "self_attn_layer_norm",
      "self_attention_layer_norm", "_self_attention_layer_norm"), "norm1"),
    (("norm2", "ln_2", "ln2", "layernorm2", "layer_norm2", "norm_2", "ffn_norm", "final_layer_norm",
      "feedforward_layer_norm", "_feedforward_layer_norm", "ff_layer_norm"), "norm2"),
    (("linear1", "fc1", "w_1", "w1", "c_fc", "lin1", "intermediate_dense", "_feedforward_intermediate_dense",
      "fc_1"), "ffn.linear1"),
    (("norm3",), "norm3"),  # torch.nn.TransformerDecoderLayer: norm1 self, norm2 cross, norm3 feed-forward
    (("linear2", "fc2", "w_2", "w2", "lin2", "_feedforward_output_dense", "fc_2"), "ffn.linear2"),
]


def _words(path: str) -> list[str]:
    return [w.lower() for w in re.split(r"[./]", path) if w]


def _numbered(part: str, torch_style: bool) -> tuple[str, int] | None:
    """`3` (torch) or `encoder_layer_3` (Keras) -> (the name with `{i}`, 3)."""
    if torch_style:
        return ("{i}", int(part)) if part.isdigit() else None
    m = re.fullmatch(r"(.+)_(\d+)", part)
    return (m[1] + "_{i}", int(m[2])) if m else None


def layer_stacks(keys_and_shapes: Mapping[str, tuple[int, ...]], torch_style: bool) -> set[str]:
    """The numbered segments that index repeated layers, as `prefix{i}` strings. A numbered segment is a stack of
    layers when every index holds the same tensors of the same shapes and there are two or more of them, or one
    holding four or more (a one-layer model); an `nn.Sequential`'s differing children (`Linear, LayerNorm, ReLU,
    Linear`) are not layers."""
    sep = "." if torch_style else "/"
    groups: dict[str, dict[int, dict[str, tuple[int, ...]]]] = {}
    for key, shape in keys_and_shapes.items():
        parts = key.split(sep)
        for n, part in enumerate(parts[:-1]):
            numbered = _numbered(part, torch_style)
            if numbered is None or (not torch_style and parts[n - 1:n] == ["vars"]):
                continue
            prefix = sep.join(parts[:n] + [numbered[0]])
            groups.setdefault(prefix, {}).setdefault(numbered[1], {})[sep.join(parts[n + 1:])] = tuple(shape)
    stacks = set()
    for prefix, members in groups.items():
        contents = list(members.values())
        if all(c == contents[0] for c in contents) and (len(contents) > 1 or len(contents[0]) >= 4):
            stacks.add(prefix)
    return stacks


def _generalize(key: str, torch_style: bool, stacks: set[str] | None = None) -> tuple[str, int | None]:
    """`layers.3.attn.q.weight` -> (`layers.{i}.attn.q.weight`, 3): the outermost numbered segment that indexes a
    stack of layers (`layer_stacks`; any numbered segment when `stacks` is None) is the layer."""
    sep = "." if torch_style else "/"
    parts = key.split(sep)
    for n, part in enumerate(parts[:-1]):
        numbered = _numbered(part, torch_style)
        if numbered is not None and not (not torch_style and parts[n - 1:n] == ["vars"]):
            general = parts[:n] + [numbered[0]]
            if stacks is None or sep.join(general) in stacks:
                return sep.join(general + parts[n + 1:]), numbered[1]
        if not torch_style and part in LAYER_CLASSES:  # a one-layer Keras model: its only layer is unnumbered
            return "/".join(parts[:n] + [part + "_{i}"] + parts[n + 1:]), 0
    return key, None


LAYER_CLASSES = ("transformer_encoder", "transformer_decoder", "encoder_layer", "decoder_layer", "transformer_layer",
                 "transformer_block", "encoder_block", "decoder_block")  # Keras names of repeated layers
HEAD_NAMES = ("dense", "classifier", "output", "out", "head", "lm_head", "fc", "fc_out", "logits", "generator",
         "final_layer", "output_net", "projection")


def _guess(pattern: str, shape: tuple[int, ...], torch_style: bool, layered: bool, ffn_index: dict) -> str:
    """A canonical name (with transform) for one generalized key, or UNMAPPED."""
    words = _words(pattern)
    leaf = words[-1]
    module = words[:-2] if (not torch_style and len(words) > 2 and words[-2] == "vars") else words[:-1]
    is_bias = leaf in ("bias", "beta", "1") and len(shape) == 1
    two_d = len(shape) == 2
    transpose = " transpose" if torch_style and two_d else ""
    if not layered:
        last = module[-1] if module else leaf
        side = "tgt" if any(w.startswith(("dec", "tgt", "trg")) or w == "functional" for w in module) else "src"
        if leaf in ("pe", "pos_table") or last in ("pe", "pos_encoding") or (
                len(shape) == 3 and 1 in shape[:2] and "pos" in leaf):  # the tutorials' (L, 1, D) buffer
            return "- sinusoid"  # a fixed table the model computes (check: learned positions are trained)
        if two_d and ("pos" in last or last == "wpe"):
            return f"{side}_pos.embedding"
        if two_d and ("embed" in last or last in ("wte", "tok", "tokens")):
            return f"{side}_embed.embedding"
        if len(shape) == 1 and ("norm" in last or last in ("ln_f", "layernorm")):
            stack = "decoder" if any(w.startswith("dec") for w in module) else "encoder"
            return f"{stack}.final_norm." + ("beta" if is_bias else "gamma")
        if re.sub(r"_\d+$", "", last) in HEAD_NAMES or "classifier" in last or "head" in last:
            return "output." + ("bias" if is_bias else "kernel" + transpose)
        return UNMAPPED
    stack = "decoder" if any(w.startswith("dec") or "decoder" in w for w in module) else "encoder"
    attn = "cross_attn" if any(w in ("cross_attn", "src_attn", "encoder_attn", "enc_dec_attn", "encoder_attention",
                                     "multihead_attn", "_cross_attention_layer") for w in module) else "self_attn"
    if leaf in ("in_proj_weight", "in_proj_bias"):  # nn.MultiheadAttention packs q, k, v into one (3D, D) array
        return (f"{stack}.layers.{{i}}.{attn}.{{qkv}}.{'bias' if leaf.endswith('bias') else 'kernel'} "
                "fused_qkv_t")
    for names, role in _ROLES:
        if module and module[-1] in names:
            break
    else:
        role = None
        if module and module[-1].isdigit() or (module and re.fullmatch(r"dense(_\d+)?", module[-1])
                                                and len(module) > 1 and module[-2] in ("layers", "ffn")):
            parent = ".".join(module[:-1])  # the Linears of an nn.Sequential / keras.Sequential feed-forward block
            order = ffn_index.setdefault(parent, [])
            if module[-1] not in order:
                order.append(module[-1])
            role = "ffn.linear1" if order.index(module[-1]) == 0 else "ffn.linear2"
        elif module and module[-1] == "dense" and any("att" in w or w == "mha" for w in module):
            role = "{attn}.o"
    if role is None:
        return UNMAPPED
    name = f"{stack}.layers.{{i}}." + role.format(attn=attn)
    if role.startswith(("norm", "cross_norm")):
        if role == "cross_norm":
            name = name.replace("cross_norm", "norm2")  # the norm of the cross-attention block
        elif stack == "decoder" and role == "norm2":
            name = name[:-1] + "3"  # a decoder layer's feed-forward norm is norm3 (norm2 follows cross-attention)
        return f"{name}.{'beta' if is_bias else 'gamma'}"
    if len(shape) == 3 or (is_bias is False and leaf == "1" and len(shape) == 2):  # Keras einsum kernels
        heads = "heads_in" if role.endswith(".o") and not leaf == "1" else "heads_out"
        return f"{name}.{'bias' if leaf == '1' else 'kernel'} {heads}"
    fused = "{qkv}" in name
    if fused:
        return f"{name}.{'bias' if is_bias else 'kernel'} " + ("fused_qkv_t" if torch_style else "fused_qkv")
    return f"{name}.{'bias' if is_bias else 'kernel'}" + transpose


def group_keys(state: Mapping[str, np.ndarray], torch_style: bool) -> dict[str, tuple[tuple[int, ...], set, bool]]:
    """pattern -> (shape, layer indices, floating) for a checkpoint's keys, each generalized over its layer stack
    (`layer_stacks`, `_generalize`); `floating` is False for an integer or boolean buffer."""
    patterns: dict[str, list] = {}
    stacks = layer_stacks({k: np.shape(v) for k, v in state.items()}, torch_style)
    for key, value in state.items():
        pattern, index = _generalize(key, torch_style, stacks)
        floating = np.issubdtype(np.asarray(value).dtype, np.floating)
        patterns.setdefault(pattern, [tuple(np.shape(value)), set(), floating])[1].add(index)
    return {p: (shape, indices, floating) for p, (shape, indices, floating) in patterns.items()}


def guess_all(rows: Mapping[str, tuple[tuple[int, ...], set, bool]], torch_style: bool) -> dict[str, str]:
    """pattern -> its guessed canonical name (with transform) or UNMAPPED, for every generalized key (`rows`:
    `group_keys`); an integer or boolean buffer is `- ignore` (no parameter), a float tensor never is."""
    ffn_index: dict = {}
    guesses = {pattern: _guess(pattern, shape, torch_style, indices != {None}, ffn_index) if floating
               else "- ignore" for pattern, (shape, indices, floating) in rows.items()}
    stacks = {g.split(".layers.")[0] for g in guesses.values() if ".layers." in g}
    if stacks == {"decoder"}:
        guesses = {k: g.replace("src_", "tgt_").replace("encoder.final_norm", "decoder.final_norm")
                   for k, g in guesses.items()}  # a decoder-only model: embeddings and final norm are the decoder's
    if any(".norm3" in g and re.search(r"(^|[./])norm3([./]|$)", p) for p, g in guesses.items()):
        # norm1, norm2, norm3 by name (torch.nn.TransformerDecoderLayer): norm2 is the cross-attention's
        guesses = {p: re.sub(r"\.norm3\.", ".norm2.", g) if re.search(r"(^|[./])norm2([./]|$)", p) else g
                   for p, g in guesses.items()}
    return guesses


SCAFFOLD_CONFIG = {  # field -> what to write in its comment
    "num_heads": "attention heads (the weights cannot tell them)",
    "attention_scale": "what scores are multiplied by: \"head\" 1/sqrt(d_head), \"model\" 1/sqrt(d_model), \"none\", "
                       "or a number",
    "activation": "the feed-forward activation: \"relu\", \"gelu\" (erf), \"gelu_tanh\" or \"silu\"",
    "norm_first": "false: post-LN, norm(x + f(x)); true: pre-LN, x + f(norm(x))",
    "layer_norm_eps": "the LayerNorm epsilon (PyTorch's default 1e-5, Keras's 1e-3)",
    "scale_embedding": "true when token embeddings are multiplied by sqrt(d_model)",
    "pad_id": "the padding token id whose positions attention masks, or \"none\" (no padding token)",
    "positional": "no position table in the weights: \"sinusoidal\" (computed)",
    "sinusoid_layout": "\"interleaved\" (sin, cos, sin, ...: the paper) or \"concatenated\" ([sin | cos])",
    "max_len": "the longest input the model takes",
    "position_offset": "position p reads row p + offset of the position table (0; 2 where a table reserves two rows)",
    "output_projection": "no output layer in the weights: false (hidden states out) or true with tie_embeddings",
    "head_order": "the head transform's order: \"dense-activation-norm\" (the usual masked-LM head) or "
                  "\"dense-norm-activation\"",
    "head_activation": "the head transform's activation: \"relu\", \"gelu\", \"gelu_tanh\" or \"silu\"",
    "head_layer_norm_eps": "the head transform's LayerNorm epsilon (\"none\": the same as layer_norm_eps)",
}


def scaffold(path: str | os.PathLike) -> str:
    """A layout file for `path` listing every key (as `{i}` patterns), the guessable ones filled in and the rest
    marked `"?"`, with each key's shape; `[config]` lists every setting these weights cannot tell as `"?"` (or, for
    a Lightning checkpoint whose hyper_parameters have a key of that name, as `"hparam:KEY"`). Integer and boolean
    buffers are `- ignore`; a float tensor is never guessed `ignore` (it may be a trained parameter)."""
    path = Path(path)
    checkpoint = read_checkpoint(path)
    state = checkpoint.state
    from transformer_parity.io.sniff import sniff

    torch_style = sniff(path) != "hdf5"
    patterns = group_keys(state, torch_style)
    guesses = guess_all(patterns, torch_style)
    rows = []
    for pattern, (shape, indices, floating) in patterns.items():
        layered = indices != {None}
        guess = guesses[pattern]
        count = f" x{len(indices)}" if layered else ""
        hint = " (q|k|v concatenated? if interleaved per head: fused_qkv_heads...)" if "fused" in guess else ""
        hint += "" if floating else " (an integer or boolean buffer: no parameter)"
        rows.append((pattern, guess, f"{shape}{count}{hint}"))
    width = max(len(p) for p, _, _ in rows) + 2
    guessed = sum(g != UNMAPPED for _, g, _ in rows)
    lines = [f"# Layout scaffold for {printable(path.name)}: {len(state)} tensors, {len(rows)} patterns, {guessed} "
             "guessed.",
             "# Check every line (a guess is a guess), replace each \"?\", and see docs/layouts.md for names and",
             "# transforms. Then: transformer-parity convert --layout THIS_FILE " + f"{printable(path.name)} "
             "out.safetensors",
             "[config]   # what the weights cannot tell: replace each \"?\" with the value in the model's code"]
    found, _ = hp.by_field_name(checkpoint.hparams, SCAFFOLD_CONFIG)
    for name in scaffold_fields(list(guesses.values())):
        value, comment = f'"{UNMAPPED}"', SCAFFOLD_CONFIG[name]
        if name in found:
            value = toml_string(f"{hp.PREFIX}{found[name][1]}")
            comment = f"= {printable(repr(found[name][0]), 80)} in hyper_parameters: {comment}"
        lines.append(f"{name + ' = ' + value:<24} # {comment}")
    lines += ["", "[weights]"]
    for pattern, guess, shape in rows:
        lines.append(f"{_toml_key(pattern):<{width}} = \"{guess}\"  # {shape}")
    return "\n".join(lines) + "\n"


def scaffold_fields(guesses: list[str]) -> list[str]:
    """The [config] fields a layout with these guesses must state (`unstated`, as far as the guesses tell)."""
    names = [n for n in UNSTATED if not (n == "num_heads" and any(g.endswith(" heads_out") for g in guesses))]
    if any(g.split()[0].endswith("_pos.embedding") for g in guesses):
        names.append("position_offset")
    elif not any(g.endswith(" sinusoid") for g in guesses):
        names += ["positional", "sinusoid_layout", "max_len"]
    if not any(g.startswith("output.") for g in guesses):
        names.append("output_projection")
    if any(g.startswith("head.dense.") for g in guesses):
        names += ["head_order", "head_activation", "head_layer_norm_eps"]
    return names


def _toml_key(key: str) -> str:
    return toml_string(key)
