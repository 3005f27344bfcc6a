"""The TensorFlow and Flax era of Hugging Face model directories: `tf_model.h5` and `flax_model.msgpack`, read as
the PyTorch state dict transformers 4 loaded from them, so that each family's one table reads them too.

transformers 4's TF classes saved `tf_model.h5` with Keras 2's `save_weights` (HDF5: the root's `layer_names`
attribute lists the top-level layers, each layer's group lists its `weight_names`, and each weight is a dataset at
`layer/weight_name`); its Flax classes saved `flax_model.msgpack` with `flax.serialization.to_bytes` (a msgpack map
of maps whose leaves are arrays as msgpack extension 1: `(shape, dtype name, raw bytes)`). transformers 5 reads
neither. Both are read here as data (h5py, msgpack): nothing in the file is executed, and every array's declared
size is checked against the bytes that hold it before anything is allocated.

Names follow the rules transformers 4 applied when it cross-loaded these files into its PyTorch classes
(`convert_tf_weight_name_to_pt_weight_name`, `load_flax_weights_in_pytorch_model`):

| file | name | becomes |
|---|---|---|
| TF | `tf_bert_for_masked_lm/bert/encoder/layer_._0/attention/self/query/kernel:0` | `bert.encoder.layer.0.attention.self.query.weight`, transposed |
| TF | `.../mlm___cls/predictions/bias:0` (`A___B`: the level is named `B`) | `cls.predictions.bias` |
| TF | `kernel` (2-D) / `gamma` / `beta` / `embeddings` | `weight` (transposed) / `weight` / `bias` / `weight` |
| Flax | `bert/encoder/layer/0/attention/self/query/kernel` | `bert.encoder.layer.0.attention.self.query.weight`, transposed |
| Flax | `kernel` (2-D) / `scale` / `embedding` | `weight` (transposed) / `weight` / `weight` |

The first level of a TF name is the model's own name scope and is dropped, as transformers dropped it. GPT-2's
`TFConv1D` names its kernel `weight` (stored `(in, out)`, as PyTorch's `Conv1D`) and its bias is `(1, out)`, read as
`(out,)`; Flax stores its `kernel` `(out, in)`, which the transpose turns into `(in, out)`. Keras 2 writes a weight
that two top-level layers share under each of them: it is read once, its copies checked equal bit for bit.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

TF_WEIGHTS = "tf_model.h5"
FLAX_WEIGHTS = "flax_model.msgpack"
SHARD_SCOPE = "model_scope"  # stands for the scope a sharded tf_model.h5 leaves out (the first level, dropped anyway)
# Array types a Flax checkpoint holds, by the names flax writes them under.
_DTYPES = {"float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool"}


# --- names ------------------------------------------------------------------------------------------------------------

def tf_to_pt_name(tf_name: str, ndim: int) -> tuple[str, bool]:
    """`(PyTorch name, transpose)` of a weight named `tf_name` in a transformers 4 TF model."""
    name = tf_name.replace(":0", "")
    name = re.sub(r"/[^/]*___([^/]*)/", r"/\1/", name)  # `mlm___cls`: the PyTorch level is `cls`
    name = name.replace("_._", "/")  # `layer_._0`: a list item, `layer.0`
    name = re.sub(r"//+", "/", name)
    parts = name.split("/")
    if len(parts) > 1:
        parts = parts[1:]  # the model's own name scope
    transpose = parts[-1] == "kernel" and ndim == 2
    if parts[-1] in ("kernel", "embeddings", "gamma"):
        parts[-1] = "weight"
    elif parts[-1] == "beta":
        parts[-1] = "bias"
    return ".".join(parts), transpose


def flax_to_pt_name(path: tuple[str, ...], ndim: int) -> tuple[str, bool]:
    """`(PyTorch name, transpose)` of the Flax parameter at `path` in a transformers 4 Flax model."""
    parts = list(path)
    transpose = parts[-1] == "kernel" and ndim == 2
    if parts[-1] in ("kernel", "scale", "embedding"):
        parts[-1] = "weight"
    return ".".join(parts), transpose


def _add(state: dict[str, np.ndarray], origin: dict[str, str], name: str, array: np.ndarray, transpose: bool,
         source: str, file: Path) -> None:
    if name in state:
        raise ValueError(f"{file}: {source!r} and {origin[name]!r} both become {name!r}; the file is not a "
                         "transformers 4 checkpoint of one model")
    state[name] = np.ascontiguousarray(array.T) if transpose else array
    origin[name] = source


# --- tf_model.h5 ------------------------------------------------------------------------------------------------------

def _strings(values: Any) -> list[str]:
    return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in np.asarray(values).reshape(-1)]


def is_keras2_h5(file: str | Path) -> bool:
    """Whether an HDF5 file is Keras 2's `save_weights` layout (a `layer_names` attribute at the root)."""
    import h5py

    try:
        with h5py.File(file, "r") as f:
            return "layer_names" in f.attrs
    except OSError:
        return False


def read_keras2_h5(file: str | Path) -> list[tuple[str, np.ndarray]]:
    """`(weight name, array)` for every weight of a Keras 2 (`tf.keras`) `save_weights` HDF5 file, in the order the
    layers list them, under the names Keras 2 gave the variables (`dense_1/kernel:0`). A shard of a sharded
    `tf_model.h5` (transformers 4 wrote those itself: `layer_names` lists the weights, each a dataset at its name)
    gives the names as listed."""
    return _read_h5(file)[0]


def _read_h5(file: str | Path) -> tuple[list[tuple[str, np.ndarray]], bool]:
    """`(read_keras2_h5's list, whether the file is a transformers shard)`. The whole file is checked first by the
    hardened HDF5 reader's checks (`streaming.hdf5.check_layout`: no links, external storage, virtual
    datasets or filters, float data stored in full, no more bytes declared than the file holds)."""
    import h5py

    from transformer_parity.streaming import hdf5

    file = Path(file)
    try:
        f = h5py.File(file, "r")
    except OSError as exc:
        raise ValueError(f"{file} is not a readable HDF5 file ({exc})") from None
    out = []
    with f:
        if "layer_names" not in f.attrs:
            raise ValueError(f"{file} has no layer_names attribute, so it is not a Keras 2 save_weights file "
                             "(transformers 4's TF classes wrote tf_model.h5 so)")
        stored = hdf5.check_layout(file, f, file.stat().st_size)  # every dataset: {path: shape}
        listed = _strings(f.attrs["layer_names"])
        shard = bool(listed) and listed[0] in stored  # transformers' own shard: the weights listed at the root
        for layer in listed:
            group = f if shard else f.get(layer)
            if not isinstance(group, h5py.Group):
                raise ValueError(f"{file}: layer {layer!r} is listed in layer_names but has no group")
            for weight in [layer] if shard else _strings(group.attrs.get("weight_names", [])):
                path = weight if shard else f"{layer}/{weight}"
                if path not in stored:
                    raise ValueError(f"{file}: weight {weight!r} of layer {layer!r} is listed but not stored")
                out.append((weight, np.asarray(hdf5.read_dataset(f[path]))))
    if not out:
        raise ValueError(f"{file} holds no weights")
    return out, shard


def read_tf_h5(file: str | Path) -> dict[str, np.ndarray]:
    """Every weight of a transformers 4 `tf_model.h5`, under the PyTorch class's names and in its orientation.

    Keras 2 writes a layer's weights under every top-level layer that uses it, so a weight shared by two of them
    (BERT's word embeddings, which its masked-LM head reuses) is stored once per layer under the same variable name:
    it is read once, after checking that the copies hold the same bits. `TFConv1D` (GPT-2) stores its bias `(1, n)`
    beside a `(in, n)` `weight`; PyTorch's `Conv1D` holds it `(n,)`, as transformers 4 reshaped it on loading."""
    file = Path(file)
    weights, shard = _read_h5(file)
    if shard:  # transformers' shards store a name without the model's scope, except "model." names and one-part ones
        weights = [(w if "model." in w or "/" not in w else f"{SHARD_SCOPE}/{w}", a) for w, a in weights]
    names = {weight for weight, _ in weights}
    state: dict[str, np.ndarray] = {}
    origin: dict[str, str] = {}
    for weight, array in weights:
        name, transpose = tf_to_pt_name(weight, array.ndim)
        if origin.get(name) == weight:  # the same variable, written again under another layer
            if state[name].dtype != array.dtype or not np.array_equal(state[name], array, equal_nan=True):
                raise ValueError(f"{file}: weight {weight!r} is stored twice with different values; the file is not "
                                 "one model's save_weights")
            continue
        if _conv1d_bias(weight, array, names):
            array = array.reshape(-1)
        _add(state, origin, name, array, transpose, weight, file)
    return state


def _conv1d_bias(weight: str, array: np.ndarray, names: set[str]) -> bool:
    """Whether `weight` is a `TFConv1D` bias: `(1, n)`, named `bias` beside a `weight` of the same layer."""
    layer, _, leaf = weight.rpartition("/")
    return leaf == "bias:0" and array.ndim == 2 and array.shape[0] == 1 and f"{layer}/weight:0" in names


# --- flax_model.msgpack -----------------------------------------------------------------------------------------------

_NDARRAY, _NPSCALAR = 1, 3  # flax.serialization's msgpack extension codes (2, complex numbers, is no weight)
_CHUNKED = "__msgpack_chunked_array__"  # flax splits an array over 2 GiB into chunks under this marker


def _ndarray(data: bytes, where: Path) -> np.ndarray:
    import msgpack

    try:
        shape, dtype_name, buffer = msgpack.unpackb(data, raw=False, max_bin_len=len(data), strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"{where}: an array entry is not (shape, dtype, bytes): {exc}") from None
    if dtype_name not in _DTYPES or not isinstance(shape, list) or not all(
            isinstance(n, int) and n >= 0 for n in shape) or not isinstance(buffer, bytes):
        raise ValueError(f"{where}: an array entry declares dtype {dtype_name!r} and shape {shape!r}, which no "
                         "checkpoint weight has")
    dtype = _dtype(dtype_name)
    if math.prod(shape) * dtype.itemsize != len(buffer):
        raise ValueError(f"{where}: an array declares shape {tuple(shape)} of {dtype_name} "
                         f"({math.prod(shape) * dtype.itemsize} bytes) but holds {len(buffer)} bytes")
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def read_flax_msgpack(file: str | Path) -> dict[str, np.ndarray]:
    """Every parameter of a transformers 4 `flax_model.msgpack`, under the PyTorch class's names and in its
    orientation (bfloat16 widened to float32, as `pytorch_model.bin` files are read)."""
    try:
        import msgpack
    except ImportError:
        raise ValueError(f"reading {Path(file).name} needs msgpack: pip install 'transformer-parity[flax]'") from None

    file = Path(file)
    data = file.read_bytes()

    def ext(code: int, payload: bytes):
        if code == _NDARRAY:
            return _ndarray(payload, file)
        if code == _NPSCALAR:
            raise ValueError(f"{file}: holds a NumPy scalar, which no transformers 4 Flax checkpoint holds")
        raise ValueError(f"{file}: holds msgpack extension type {code}, which flax's checkpoints do not use")

    try:
        tree = msgpack.unpackb(data, raw=False, ext_hook=ext, strict_map_key=True, max_bin_len=len(data),
                               max_str_len=1 << 20, max_array_len=1 << 20, max_map_len=1 << 20)
    except ValueError:
        raise
    except (TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise ValueError(f"{file} is not a flax msgpack checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(tree, dict):
        raise ValueError(f"{file} holds a {type(tree).__name__}, not flax's map of parameters")
    if set(tree) == {"params"} and isinstance(tree["params"], dict):
        tree = tree["params"]
    state: dict[str, np.ndarray] = {}
    origin: dict[str, str] = {}
    for path, array in _leaves(tree, (), file):
        if array.dtype.name == "bfloat16":
            array = array.astype(np.float32)
        name, transpose = flax_to_pt_name(path, array.ndim)
        _add(state, origin, name, array, transpose, "/".join(path), file)
    if not state:
        raise ValueError(f"{file} holds no parameters")
    return state


def _leaves(tree: dict, path: tuple[str, ...], file: Path):
    """`(path, array)` for every array in flax's nested maps; a chunked array is joined."""
    for key, value in tree.items():
        here = (*path, str(key))
        if isinstance(value, dict) and value.get(_CHUNKED):
            yield here, _joined(value, here, file)
        elif isinstance(value, dict):
            yield from _leaves(value, here, file)
        elif isinstance(value, np.ndarray):
            yield here, value
        else:
            raise ValueError(f"{file}: {'/'.join(here)} holds a {type(value).__name__}, not an array")


def _joined(entry: dict, path: tuple[str, ...], file: Path) -> np.ndarray:
    chunks = entry.get("chunks")
    shape = entry.get("shape")
    if isinstance(shape, dict):  # flax writes tuples as maps {"0": ..., "1": ...}
        shape = [shape[k] for k in sorted(shape, key=lambda k: int(k) if str(k).isdigit() else -1)]
    if not isinstance(chunks, dict) or not isinstance(shape, list) or not all(
            isinstance(c, np.ndarray) for c in chunks.values()):
        raise ValueError(f"{file}: {'/'.join(path)} is a chunked array without its shape and chunks")
    flat = np.concatenate([chunks[k].reshape(-1) for k in sorted(chunks, key=int)])
    if flat.size != math.prod(shape):
        raise ValueError(f"{file}: {'/'.join(path)} declares shape {tuple(shape)} but its chunks hold {flat.size} "
                         "values")
    return flat.reshape(shape)
