"""Keras checkpoint files (`.weights.h5`) and Keras's own `MultiHeadAttention` layout, mapped to canonical weights.

This module needs h5py and NumPy only: a `.weights.h5` is an HDF5 file whose layout Keras derives from the model's
structure, so it is written and read here directly, without building a model or importing TensorFlow (which
alone costs ~0.5 GB and ~3 s). `weights_h5_table(config)` is that layout as a declarative table over
`tf_impl.Transformer`'s structure; the tests check it against files `model.save_weights()` writes and that
`model.load_weights()` reads ours, for every variant. Two Keras quirks the table encodes:

- layers reached through a Python list are named by class, not by attribute: the i-th encoder layer is
  `encoder/layers/encoder_layer_{i}` (the first one without `_0`), and layers reached only through the model's
  own `layers` list are `layers/embedding` (source), `layers/embedding_1` (target), `layers/output_projection`;
- a layer's variables are numbered in creation order (`vars/0` kernel, `vars/1` bias; a tied output layer's bias
  is `vars/0`).

The config travels as the root attribute `transformer_parity_config` (Keras ignores it). A `.weights.h5` written by
`tf_impl.Transformer.save_weights()` has none; pass the config explicitly then.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import reference_numpy as rn
from reference_numpy import TransformerConfig, mapping

FORMAT_TAG = "transformer-parity/keras"
FORMAT_VERSION = "1"
CONFIG_ATTR = "transformer_parity_config"
ORIGIN_ATTR = "transformer_parity_origin"  # the external family the weights came from (`hf-phi3`), when known
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"

_LIST_ITEM = re.compile(r"(encoder|decoder)_layer_(\d+)/")
_LAYER_ITEM = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.")


def weights_h5_table(config: TransformerConfig) -> list[tuple[str, str, str]]:
    """canonical name -> dataset path in the `.weights.h5` of a `tf_impl.Transformer` with this config, in the
    mapping language (`reference_numpy.mapping`). A layer's variables are `vars/0`, `vars/1`, ... in creation order
    (kernel before bias, gamma before beta); the paths use `{stack}_layer_{i}` for every list item, and
    `keras_path` drops the `_0` as Keras does."""
    src, tgt = _embedding_paths(config)
    groups = {"src_embed": f"{src}/token", "tgt_embed": f"{tgt}/token", "src_pos": f"{src}/position",
              "tgt_pos": f"{tgt}/position", "src_type": f"{src}/segment", "src_embed_norm": f"{src}/norm",
              "tgt_embed_norm": f"{tgt}/norm", "pooler": "layers/pooler/dense", "output": "layers/output_projection",
              "src_embed_proj": f"{src}/proj"}
    variables: dict[str, list[str]] = {}  # Keras layer path -> its canonical variables, in creation order
    for name in rn.parameter_shapes(config):
        module, leaf = name.rsplit(".", 1)
        if name in ("src_embed.bias", "tgt_embed.bias"):
            group = src if name.startswith("src") else tgt  # the Embedding layer's own variable
        else:
            group = groups.get(module) or _LAYER_ITEM.sub(r"\1/layers/\1_layer_\2/", module).replace(".", "/")
        variables.setdefault(group, []).append(name)
    return [(name, f"{group}/vars/{k}", "identity") for group, names in variables.items()
            for k, name in enumerate(names)]


def _embedding_paths(config: TransformerConfig) -> tuple[str, str]:
    """Where Keras files the source and target Embedding layers: numbered in creation order, so a decoder-only
    model's one embedding (the target's) is `layers/embedding`."""
    return "layers/embedding", "layers/embedding_1" if config.has_encoder else "layers/embedding"


def keras_path(table_path: str) -> str:
    """`encoder/layers/encoder_layer_0/...` -> `encoder/layers/encoder_layer/...` (Keras leaves the first unnumbered)."""
    return _LIST_ITEM.sub(lambda m: f"{m[1]}_layer/" if m[2] == "0" else m[0], table_path)


def table_path(keras_path_: str) -> str:
    """The inverse of `keras_path`."""
    return re.sub(r"(encoder|decoder)_layer/", r"\1_layer_0/", keras_path_)


def layer_groups(config: TransformerConfig) -> dict[str, str]:
    """Every layer group Keras writes (group path -> layer name), variables or not: the file's skeleton."""
    groups = {"": "transformer"}

    def embed(path: str, name: str, side: str) -> None:
        groups.update({path: name, f"{path}/dropout": "dropout"})
        if side == "src" or not config.share_embeddings:
            groups[f"{path}/token"] = "token"
        if config.positional == "learned":
            groups[f"{path}/position"] = "position"
        if side == "src" and config.type_vocab_size:
            groups[f"{path}/segment"] = "segment"
        if config.embed_norm:
            groups[f"{path}/norm"] = "norm"
        if config.embedding_size is not None:
            groups[f"{path}/proj"] = "proj"

    def attention(path: str, name: str) -> None:
        groups[path] = name
        parts = ("q", "k", "v", "o") + (("q_norm", "k_norm") if config.qk_norm else ())
        groups.update({f"{path}/{p}": p for p in parts})

    src, tgt = _embedding_paths(config)
    if config.has_encoder:
        embed(src, "src_embed", "src")
    if config.has_decoder:
        embed(tgt, "tgt_embed", "tgt")
    if config.pooler:
        groups.update({"layers/pooler": "pooler", "layers/pooler/dense": "dense"})
    if config.head_transform:
        groups.update({"head": "head", "head/dense": "dense", "head/norm": "norm"})
    if config.output_projection:
        groups["layers/output_projection"] = "output"
    for stack, depth in (("encoder", config.encoder_weight_layers), ("decoder", config.num_decoder_layers)):
        if depth == 0:
            continue
        groups[stack] = stack
        if config.final_norm:
            groups[f"{stack}/final_norm"] = "final_norm"
        for i in range(depth):
            path = keras_path(f"{stack}/layers/{stack}_layer_{i}/")[:-1]
            groups.update({path: f"layers_{i}", f"{path}/dropout": "dropout", f"{path}/ffn": "ffn",
                           f"{path}/ffn/dropout": "dropout", f"{path}/ffn/linear1": "linear1",
                           f"{path}/ffn/linear2": "linear2", f"{path}/norm1": "norm1"})
            if config.ffn_gated:
                groups[f"{path}/ffn/gate"] = "gate"
            attention(f"{path}/self_attn", "self_attn")
            if stack == "encoder":
                groups[f"{path}/norm2"] = "norm2"
            else:
                groups[f"{path}/norm3"] = "norm3"
                if config.has_encoder:
                    attention(f"{path}/cross_attn", "cross_attn")
                    groups[f"{path}/norm2"] = "norm2"
    return groups


def save_weights_h5(path: str | os.PathLike, config: TransformerConfig, weights: Mapping[str, np.ndarray],
                    on_tensor: Callable[[str, int], None] | None = None, consume: bool = False,
                    origin: str | None = None) -> None:
    """Write a `.weights.h5` that `tf_impl.Transformer(config).load_weights(path)` accepts, with the config as a root
    attribute (the caller makes it atomic: pass a temporary path ending in `.weights.h5`, then rename).
    `consume=True` deletes each entry of `weights` (a dict) once written; `origin` (the external family the weights
    came from) is kept as the root attribute `ORIGIN_ATTR`."""
    import h5py

    rn.validate_weights(config, weights)
    plan = mapping.plan(rn.parameter_shapes(config), weights_h5_table(config))
    with h5py.File(path, "w") as f:
        f.attrs[CONFIG_ATTR] = config.to_json()
        f.attrs["format"] = FORMAT_TAG
        f.attrs["format_version"] = FORMAT_VERSION
        if origin is not None:
            f.attrs[ORIGIN_ATTR] = origin
        for group, name in layer_groups(config).items():
            vars_group = f.require_group(f"{group}/vars" if group else "vars")
            vars_group.attrs["name"] = name
        deferred: list = []
        for name, (fw_name, _, _) in plan.items():  # every transform is the identity
            write_dataset(f, keras_path(fw_name), weights.pop(name) if consume else weights[name], deferred=deferred)
    canonical = {keras_path(fw_name): name for name, (fw_name, _, _) in plan.items()}
    write_deferred(path, deferred, None if on_tensor is None else lambda name, n: on_tensor(canonical[name], n))


def write_dataset(group: Any, name: str, array: Any, max_bytes: int = mapping.BAND_BYTES,
                  deferred: list | None = None) -> None:
    """Dataset `name` of `group` holding `array` (an array, or a `mapping.LazyArray` read a band of rows at a time:
    the peak is a band, never a second copy of the tensor), in its dtype. bfloat16 is stored as Keras stores it: a
    2-byte opaque type with the attribute `dtype="bfloat16"`.

    With a `deferred` list, a dataset with values is only laid out now (contiguous, its space allocated, no fill
    written) and `(file offset, name, array)` is appended: `write_deferred` writes the bytes once the HDF5 file is
    closed, through `reference_numpy.io.BandWriter` (a background thread; a file's bytes copied by the
    kernel)."""
    import h5py

    dtype = np.dtype(array.dtype)
    later = deferred is not None and len(array.shape) > 0 and int(np.prod(array.shape, dtype=np.int64)) > 0
    plist = None
    if later:
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        plist.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    dataset = group.create_dataset(name, shape=tuple(array.shape), dtype=dtype, dcpl=plist)
    if dtype.name == "bfloat16":
        dataset.attrs["dtype"] = "bfloat16"
    if later:
        deferred.append((dataset.id.get_offset(), name, array))
        return
    for start, stop, band in mapping.row_bands(array, max_bytes):
        if dataset.ndim == 0:
            dataset[()] = band
        else:
            dataset[start:stop] = np.ascontiguousarray(band)


def write_deferred(path: str | os.PathLike, deferred: list, on_dataset: Callable[[str, int], None] | None = None
                   ) -> None:
    """The bytes of the datasets `write_dataset` laid out in the closed HDF5 file `path`, in file order;
    `on_dataset(name given to write_dataset, bytes)` after each."""
    with open(path, "r+b") as f, rn.io.BandWriter(f) as writer:
        ordered = sorted(deferred, key=lambda item: item[0])
        writer.read_ahead([array for _, _, array in ordered])  # their sources read while the ones before are written
        for offset, name, array in ordered:
            writer.seek(offset)
            nbytes = writer.put(array)
            if on_dataset is not None:
                on_dataset(name, nbytes)
        writer.wait()
        f.flush()


def read_dataset(dataset: Any, lazy: bool = False) -> Any:
    """The values of a checked dataset (`_check_h5_layout`); Keras's bfloat16 (2-byte opaque, `dtype="bfloat16"`)
    read as float32, exactly. `lazy=True`: a `mapping.LazyArray` in the stored dtype (bfloat16 kept, as ml_dtypes'
    bfloat16), read when asked; a dataset stored in one piece (what Keras and h5py write by default) is read from the
    file's bytes, so a streaming conversion maps, copies and transposes it a band at a time, as it does a safetensors
    tensor."""
    if lazy:
        return _lazy_dataset(dataset)
    value = dataset[()]
    if _is_bfloat16(dataset):
        return mapping.widen_bfloat16(value)
    return value


def _lazy_dataset(dataset: Any) -> mapping.LazyArray:
    file, name, shape = dataset.file.filename, dataset.name, tuple(dataset.shape)
    if _is_bfloat16(dataset):
        import ml_dtypes
        dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        dtype = dataset.dtype
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    offset = dataset.id.get_offset() if dataset.chunks is None else None
    if offset is not None and nbytes and (dtype.kind == "V" or dtype.str[0] in "<|"):  # a span is little-endian
        array = mapping.LazyArray(shape, dtype, lambda: np.array(mapping.mapped(array)), (file, offset, nbytes))
        return array

    def read() -> np.ndarray:  # chunked (or empty): through HDF5
        import h5py
        with h5py.File(file, "r") as f:
            value = f[name][()]
        return value.view(dtype) if dtype.kind == "V" else value

    return mapping.LazyArray(shape, dtype, read)


def _is_bfloat16(dataset: Any) -> bool:
    return dataset.dtype.kind == "V" and dataset.dtype.itemsize == 2 and dataset.attrs.get("dtype") in (
        "bfloat16", b"bfloat16")


def read_h5_file(path: str | os.PathLike, fields: Mapping[str, Any] | None = None, lazy: bool = False
                 ) -> tuple[TransformerConfig | None, dict[str, np.ndarray]]:
    """`(config or None, {table path: array})` of a `.weights.h5`; `ValueError` for anything else.

    The file is treated as hostile: every link is checked before anything is read (no soft or external links, no
    virtual datasets, no external storage, no filters: neither this module nor Keras writes any), every dataset must
    be floating-point and stored in full in this file (so no fill-value expansion), and, when the config is known
    (stored, or `fields` applied to it or given alone), each dataset must be one the config expects, with its shape,
    before it is read. What is read is therefore bounded by the file's own size. `lazy=True`: each dataset a
    `mapping.LazyArray` in its stored dtype (`read_dataset`).
    """
    import h5py

    path = Path(path)
    size = path.stat().st_size
    try:
        with h5py.File(path, "r") as f:
            config = _h5_config(path, f.attrs.get(CONFIG_ATTR), fields)
            checked = _check_h5_layout(path, f, size)
            expected = _expected_h5_shapes(path, config, len(checked)) if config is not None else None
            datasets: dict[str, np.ndarray] = {}
            for name, shape in checked.items():
                if expected is not None:
                    if name not in expected:
                        raise ValueError(f"{path}: dataset {name!r} is not a weight of this config")
                    if shape != expected[name]:
                        raise ValueError(f"{path}: dataset {name!r} has shape {shape}, the config expects "
                                         f"{expected[name]}")
                datasets[table_path(name)] = read_dataset(f[name], lazy)
    except (OSError, KeyError, RuntimeError) as exc:
        raise ValueError(f"{path} is not a readable HDF5 file (truncated or corrupt?): {exc}") from None
    return config, datasets


def _h5_config(path: Path, text: Any, fields: Mapping[str, Any] | None) -> TransformerConfig | None:
    """The stored config (with `fields` applied), the config `fields` alone give, or None."""
    stored = None
    if text is not None:
        try:
            stored = TransformerConfig.from_json(text.decode() if isinstance(text, bytes) else str(text))
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"{path}: the config stored in its attributes is invalid: {exc}") from None
    if not fields:
        return stored
    try:
        return stored.replace(**fields) if stored is not None else TransformerConfig.from_dict(dict(fields))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: invalid config: {exc}") from None


def _check_h5_layout(path: Path, f: Any, file_size: int) -> dict[str, tuple[int, ...]]:
    """{dataset path: shape} of every dataset, after refusing anything that could read outside this file or expand
    beyond it (soft/external links, virtual datasets, external storage, filters, non-float or partly stored data)."""
    import h5py

    found: dict[str, tuple[int, ...]] = {}
    total = 0

    def check(name: str, link: Any) -> None:
        nonlocal total
        if isinstance(link, h5py.ExternalLink):
            raise ValueError(f"{path}: {name!r} is an external link (to {link.filename}:{link.path}); refusing to "
                             "read another file")
        if isinstance(link, h5py.SoftLink):
            raise ValueError(f"{path}: {name!r} is a soft link (to {link.path}); weights files have none")
        if not isinstance(link, h5py.HardLink):
            raise ValueError(f"{path}: {name!r} is a {type(link).__name__}, expected a group or dataset")
        obj = f[name]
        if isinstance(obj, h5py.Group):
            return
        if not isinstance(obj, h5py.Dataset):
            raise ValueError(f"{path}: {name!r} is a {type(obj).__name__}, expected a group or dataset")
        if obj.is_virtual:
            raise ValueError(f"{path}: dataset {name!r} is a virtual dataset (data mapped from other datasets or "
                             "files); refusing it")
        plist = obj.id.get_create_plist()
        if plist.get_external_count() > 0:
            raise ValueError(f"{path}: dataset {name!r} keeps its data in an external file "
                             f"({plist.get_external(0)[0].decode(errors='replace')}); refusing to read it")
        if plist.get_nfilters() > 0:
            filters = [plist.get_filter(i)[3].decode(errors="replace") or str(plist.get_filter(i)[0])
                       for i in range(plist.get_nfilters())]
            raise ValueError(f"{path}: dataset {name!r} uses HDF5 filters {filters}; weights files are written "
                             "without compression or filters")
        if (obj.dtype.kind != "f" or obj.dtype.itemsize not in (2, 4, 8)) and not _is_bfloat16(obj):
            raise ValueError(f"{path}: dataset {name!r} has dtype {obj.dtype}, expected bfloat16 or float16/32/64 "
                             "weights")
        if obj.shape is None:
            raise ValueError(f"{path}: dataset {name!r} has no dataspace (an empty dataset)")
        nbytes = int(np.prod(obj.shape, dtype=object)) * obj.dtype.itemsize
        stored = obj.id.get_storage_size()
        if stored < nbytes:
            raise ValueError(f"{path}: dataset {name!r} of shape {obj.shape} needs {nbytes} bytes but stores "
                             f"{stored} (the rest would be fill values); refusing a partly stored dataset")
        total += nbytes
        if total > file_size:
            raise ValueError(f"{path}: its datasets declare {total} bytes, more than the file's {file_size}")
        found[name] = tuple(int(n) for n in obj.shape)

    links: list[tuple[str, Any]] = []
    f.visititems_links(lambda name, link: links.append((name, link)))  # raising inside the visit confuses h5py
    for name, link in links:
        check(name, link)
    return found


def _expected_h5_shapes(path: Path, config: TransformerConfig, n_datasets: int) -> dict[str, tuple[int, ...]]:
    """{Keras dataset path: shape} for `config`, after checking the config is not larger than the file can hold."""
    try:
        rn.schema.check_config_against_file(config, n_datasets, source=str(path))
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    shapes = rn.parameter_shapes(config)
    plan = mapping.plan(shapes, weights_h5_table(config))
    return {keras_path(fw_name): shapes[name] for name, (fw_name, _, _) in plan.items()}


class NoStoredConfig(ValueError):
    """A `.weights.h5` without a transformer-parity config and without `fields` to make one; `names` are its
    datasets, which tell the caller what the file is (a plain Keras model's, a KerasHub model's, ours)."""

    def __init__(self, path, names: list[str]):
        super().__init__(f"{path} carries no transformer-parity config (a plain Keras save_weights file?); give the "
                         "config's fields")
        self.path, self.names = Path(path), names


def load_weights_h5(path: str | os.PathLike, fields: Mapping[str, Any] | None = None, lazy: bool = False
                    ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Canonical `(config, weights)` from a `.weights.h5`. The config is the stored one with `fields` applied; a file
    that stores none (one `model.save_weights()` wrote) needs the whole config in `fields`. `lazy=True`: the weights
    are `mapping.LazyArray`s in the stored dtype, each read when asked."""
    config, datasets = read_h5_file(path, fields, lazy)
    if config is None:
        raise NoStoredConfig(path, list(datasets))
    if not datasets:
        raise ValueError(f"{path} holds no weights")
    try:
        return config, rn.from_framework_state(config, datasets, weights_h5_table(config), consume=True,
                                               lazy=lazy)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# --- keras.layers.MultiHeadAttention <-> a canonical attention block ------------------------------------------------

KERAS_MHA_VARIABLES = ("query/kernel", "query/bias", "key/kernel", "key/bias", "value/kernel", "value/bias",
                       "attention_output/kernel", "attention_output/bias")  # layer.get_weights() order


# Canonical block names -> Keras MultiHeadAttention variable names, with the per-head reshapes Keras's einsum kernels
# need: q/k/v kernels `(D, H*dk)` <-> `(D, H, dk)`, their biases `(H*dk,)` <-> `(H, dk)`, the output kernel
# `(H*dk, D)` <-> `(H, dk, D)`. Canonical features are head-major (`h * dk + j`), exactly how a C-order reshape
# splits them.
KERAS_MHA_TABLE = [
    ("{qkv}.kernel", "{qkv}/kernel", "heads_out"),
    ("{qkv}.bias", "{qkv}/bias", "heads_out"),
    ("o.kernel", "o/kernel", "heads_in"),
    ("o.bias", "o/bias", "identity"),
]
_KERAS_NAMES = {"q": "query", "k": "key", "v": "value", "o": "attention_output"}


def _block_names(bias: bool) -> list[str]:
    return [f"{p}.{leaf}" for p in "qkvo" for leaf in (("kernel", "bias") if bias else ("kernel",))]


def _keras_name(table_name: str) -> str:
    proj, leaf = table_name.split("/")
    return f"{_KERAS_NAMES[proj]}/{leaf}"


def canonical_to_keras_mha(block: Mapping[str, np.ndarray], num_heads: int, prefix: str = "") -> list[np.ndarray]:
    """A canonical attention block (`{prefix}q.kernel`, ... `{prefix}o.bias`) -> the list
    `keras.layers.MultiHeadAttention(num_heads, key_dim=D // num_heads).set_weights()` takes."""
    bias = f"{prefix}q.bias" in block
    names = _block_names(bias)
    missing = [prefix + n for n in names if prefix + n not in block]
    if missing:
        raise ValueError(f"attention block is missing {missing}")
    d = np.shape(block[f"{prefix}q.kernel"])[0]
    if d % num_heads:
        raise ValueError(f"d_model={d} is not divisible by num_heads={num_heads}")
    weights = {}
    for name in names:
        weights[name] = np.asarray(block[prefix + name])
        expected = (d,) if name.endswith("bias") else (d, d)
        if weights[name].shape != expected:
            raise ValueError(f"{prefix}{name} has shape {weights[name].shape}, expected {expected}")
    out = mapping.write(mapping.plan(names, KERAS_MHA_TABLE), weights, head_dim=d // num_heads)
    out = {_keras_name(k): v for k, v in out.items()}
    return [out[k] for k in KERAS_MHA_VARIABLES if k in out]


def keras_mha_to_canonical(values: Sequence[np.ndarray], num_heads: int, prefix: str = "") -> dict[str, np.ndarray]:
    """The inverse: `keras.layers.MultiHeadAttention.get_weights()` (with `key_dim = value_dim = D // num_heads`
    and the default output width) -> canonical `{prefix}q.kernel`, ..., `{prefix}o.bias`."""
    if len(values) not in (4, 8):
        raise ValueError(f"expected the 8 (or, without biases, 4) arrays of MultiHeadAttention.get_weights(), "
                         f"received {len(values)}")
    bias = len(values) == 8
    keras_names = [k for k in KERAS_MHA_VARIABLES if bias or k.endswith("kernel")]
    by_name = dict(zip(keras_names, (np.asarray(v) for v in values)))
    q = by_name["query/kernel"]
    if q.ndim != 3 or q.shape[1] != num_heads or q.shape[0] != q.shape[1] * q.shape[2]:
        raise ValueError(f"query kernel has shape {q.shape}; expected (D, num_heads={num_heads}, D // num_heads)")
    d = q.shape[0]
    names = _block_names(bias)
    plan = mapping.plan(names, KERAS_MHA_TABLE)
    shapes = {name: (d,) if name.endswith("bias") else (d, d) for name in names}
    state = {table_name: by_name[_keras_name(table_name)] for table_name, _, _ in plan.values()}
    try:
        weights = mapping.read(plan, state, shapes, head_dim=d // num_heads)
    except mapping.ShapeMismatch as exc:
        raise ValueError(f"MultiHeadAttention weights that do not map to a canonical block of d_model={d}: "
                         + "; ".join(exc.problems)) from None
    return {prefix + name: value for name, value in weights.items()}
