"""Hand-written models as users write them, the "source" that a port is proven against (`verify --source`).

One module per model kind, each at odd sizes with every LayerNorm and every bias perturbed away from its init value:

- `w_qkvo_encoder`: a torch encoder with `W_Q..W_O` Linears and a seq-first float32 `pe` buffer `(max_len, 1, d)`;
  `.pt` state dict; pad id 1 (id 0 is a token).
- `dmodel_scale_seq2seq`: a torch encoder-decoder whose scores are divided by sqrt(d_model), learned positions;
  `.pt` state dict; no pad token.
- `lightning_encoder`: one-hot ids through a Linear with bias, fused interleaved qkv, a Linear -> LayerNorm -> ReLU
  -> Linear head; a Lightning `.ckpt`; no pad token.
- `keras_encoder`: a Keras 3 encoder, Dense wq/wk/wv/dense, additive mask, epsilon 1e-6; `.weights.h5`; pad id 0.
- `nn_transformer_4heads`: PyTorch's translation tutorial around `torch.nn.Transformer(nhead=4)`; `.pt` state dict;
  pad id 1 (the tutorial's PAD_IDX).
- `tutorial_seq2seq`: a video tutorial's encoder-decoder, `values`/`keys`/`queries`/`fc_out`, a decoder block holding
  its own `norm` and a `transformer_block`, scores over sqrt(d_model); pad id 1.
- `to_kv_encoder`: an attention library's pre-LN encoder, `to_q`, a fused `to_kv`, `to_out`, `PreNorm` wrappers;
  pad id 3.
- `c_attn_decoder`: a minimal GPT, one fused `c_attn`, `c_proj`, `ln_1`/`ln_2`/`ln_f`, untied `lm_head`; no pad id.
- `keras_dense_n`: a Keras 3 pre-LN encoder whose layers keep Keras's default names (`dense`, `dense_1`, ... in the
  order they are made), in lists; `.weights.h5`; pad id 2.
- `*_renamed`: the four above with every module attribute renamed `m0`, `m1`, ...: names that say nothing, so
  that only what the source does can place each tensor (`layouts/roles.py`).

Each module has:

- `build(seed)`: the model, float32, eval mode, seeded and perturbed;
- `save_checkpoint(path, seed)`: writes the file a user of that model has (`CHECKPOINT_SUFFIX` is its extension);
- `make_source(path)`: the source function of that checkpoint, `source(batch) -> np.ndarray`;
- `forward(batch)` / `forward_f64(batch)`: the source function of the checkpoint named by the environment variable
  `TP_SOURCE_CKPT` (`CHECKPOINT_ENV`), which is what `verify CKPT --source parity_tests/sources/NAME.py:forward`
  imports and calls; `forward_f64` always computes in float64;
- `PAD_ID` (None: no pad token, every id is a token), `ENCODER_DECODER`, `SRC_VOCAB`, `TGT_VOCAB`, `NUM_HEADS`,
  `MAX_LEN`: what a test needs to draw inputs and check a port.

The source contract: `batch` is a dict of NumPy int64 arrays, `src_ids` `(B, S)` and, for an encoder-decoder,
`tgt_ids` `(B, T)`; with `batch["dtype"] == "float64"` the model computes in float64, else in float32. The result is
the model's logits as a float NumPy array `(B, S or T, vocab)`.

Float64 means the model as its own code builds it in a float64 program (`torch.set_default_dtype(torch.float64)`,
Keras's `float64` dtype policy), with the checkpoint's parameters upcast: constant buffers such as a sinusoid table
are recomputed in float64 by the model's code rather than read from the file. `.double()` on the float32 model would
keep the float32-rounded table, which moves float64 logits by ~1e-7: no float64 comparison could then tell a
correct port from a wrong one below that.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import numpy as np

CHECKPOINT_ENV = "TP_SOURCE_CKPT"
MODELS = ("w_qkvo_encoder", "dmodel_scale_seq2seq", "lightning_encoder", "keras_encoder", "nn_transformer_4heads",
          "tutorial_seq2seq", "tutorial_seq2seq_renamed", "to_kv_encoder", "to_kv_encoder_renamed", "c_attn_decoder",
          "c_attn_decoder_renamed", "keras_dense_n", "keras_dense_n_renamed")
DTYPES = ("float32", "float64")
LAYOUTS = Path(__file__).resolve().parent / "layouts"


def module(name: str) -> ModuleType:
    """The fixture module `name` (one of `MODELS`)."""
    if name not in MODELS:
        raise ValueError(f"unknown source model {name!r}; choose one of {', '.join(MODELS)}")
    return importlib.import_module(f"{__name__}.{name}")


def checkpoint_path() -> Path:
    """The checkpoint named by `TP_SOURCE_CKPT`; a ValueError naming the variable when it is unset or no file."""
    value = os.environ.get(CHECKPOINT_ENV)
    if not value:
        raise ValueError(f"set {CHECKPOINT_ENV} to the checkpoint this source should load, received {value!r}")
    path = Path(value)
    if not path.is_file():
        raise ValueError(f"{CHECKPOINT_ENV}={value!r} is not a file")
    return path


def batch_dtype(batch) -> str:
    """`"float64"` or `"float32"` (the default) from `batch["dtype"]`; a ValueError on anything else."""
    dtype = batch.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ValueError(f"batch['dtype'] must be one of {', '.join(DTYPES)}, received {dtype!r}")
    return dtype


def batch_ids(batch, key: str, vocab: int) -> np.ndarray:
    """`batch[key]` checked as `(B, L)` int64 ids inside `[0, vocab)`."""
    if key not in batch:
        raise ValueError(f"the batch has no {key!r}; it has {sorted(batch)}")
    ids = np.asarray(batch[key])
    if ids.ndim != 2 or ids.dtype != np.int64:
        raise ValueError(f"batch[{key!r}] must be (batch, length) int64 ids, received shape {ids.shape}, dtype "
                         f"{ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"batch[{key!r}] holds ids outside [0, {vocab}): min {ids.min()}, max {ids.max()}")
    return ids


def sample_batch(model: ModuleType, seed: int = 0, batch: int = 3, src_len: int = 13, tgt_len: int = 11
                 ) -> dict[str, np.ndarray]:
    """Inputs for a fixture model: uniform ids over the whole vocabulary with id 0 in every row wherever 0 is a
    token; where the model has a pad token, rows after the first are right-padded with it (and real tokens never
    equal it)."""
    rng = np.random.default_rng([seed, 4421])
    out = {"src_ids": _ids(rng, model.PAD_ID, batch, src_len, model.SRC_VOCAB)}
    if model.ENCODER_DECODER:
        out["tgt_ids"] = _ids(rng, model.PAD_ID, batch, tgt_len, model.TGT_VOCAB)
    return out


def _ids(rng: np.random.Generator, pad_id: int | None, batch: int, length: int, vocab: int) -> np.ndarray:
    tokens = np.array([t for t in range(vocab) if t != pad_id])
    ids = tokens[rng.integers(0, len(tokens), size=(batch, length))]  # (B, L)
    keep = np.full(batch, length)
    if pad_id is not None and length > 1:  # rows 1.. keep between half and all but one of their tokens
        keep = rng.integers(max(1, (length + 1) // 2), length, size=batch)
        keep[0] = length
    if pad_id != 0:  # 0 is a token: one in every row, among its real tokens
        ids[np.arange(batch), rng.integers(0, keep)] = 0
    if pad_id is not None:
        ids[np.arange(length)[None, :] >= keep[:, None]] = pad_id
    return ids.astype(np.int64)
