"""A Keras 3 encoder whose layers keep Keras's default names: each block holds its projections in a list (`Dense`
layers named `dense`, `dense_1`, `dense_2`, `dense_3` in the order they are made: q, k, v, then the output), its
norms in another (`layer_normalization`, `layer_normalization_1`) and its feed-forward in a third (`dense`,
`dense_1`); the blocks themselves are `block`, `block_1`. Nothing in a path says which tensor is q, k or v. With
`RENAMED` (the `keras_dense_n_renamed` fixture) the lists are attributes `m0`, `m1`, ... too.

Pre-LN (`x + f(norm(x))`), ReLU (TensorFlow's float64 GELU is 5e-9 off the exact one, which a float64 check
at 1e-10 would see), scores over sqrt(head width), learned positions, a final norm and a Dense to
the vocabulary; LayerNorm epsilon 1e-6; pad id 2 masked as keys (id 0 is a token). The checkpoint is
`model.save_weights(path)` (`.weights.h5`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from parity_tests.sources import batch_dtype, batch_ids, checkpoint_path
from parity_tests.sources._named import Names

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from keras import layers, ops  # noqa: E402

from parity_tests.sources.keras_encoder import dtype_policy, seed_weights  # noqa: E402

PAD_ID = 2
ENCODER_DECODER = False
SRC_VOCAB = TGT_VOCAB = 31
NUM_HEADS = 4
MAX_LEN = 40
CHECKPOINT_SUFFIX = ".weights.h5"
D, DFF, DEPTH = 36, 52, 2
RENAMED = False
ROLES = ("projections", "norms", "ffn", "embeddings", "blocks", "final_norm", "to_vocab")


class Block(layers.Layer):
    def __init__(self, n: Names, **kwargs):
        super().__init__(**kwargs)
        self.n = n
        n.put(self, "projections", [layers.Dense(D) for _ in range(4)])  # q, k, v, out: dense .. dense_3
        n.put(self, "norms", [layers.LayerNormalization(epsilon=1e-6) for _ in range(2)])
        n.put(self, "ffn", [layers.Dense(DFF, activation="relu"), layers.Dense(D)])

    def call(self, x, mask):  # mask (B, 1, 1, S): True = a real token
        wq, wk, wv, wo = self.n.get(self, "projections")
        norms, ffn = self.n.get(self, "norms"), self.n.get(self, "ffn")
        h = norms[0](x)
        b, s = ops.shape(h)[0], ops.shape(h)[1]

        def heads(t):
            return ops.transpose(ops.reshape(t, (b, s, NUM_HEADS, D // NUM_HEADS)), (0, 2, 1, 3))

        q, k, v = heads(wq(h)), heads(wk(h)), heads(wv(h))
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / np.sqrt(D // NUM_HEADS)
        scores = ops.where(mask, scores, ops.full_like(scores, -1e9))
        out = ops.reshape(ops.transpose(ops.matmul(ops.softmax(scores, axis=-1), v), (0, 2, 1, 3)), (b, s, D))
        x = x + wo(out)
        return x + ffn[1](ffn[0](norms[1](x)))


class Encoder(keras.Model):
    def __init__(self, renamed: bool = RENAMED, **kwargs):
        super().__init__(**kwargs)
        self.n = n = Names(ROLES, renamed)
        n.put(self, "embeddings", [layers.Embedding(SRC_VOCAB, D), layers.Embedding(MAX_LEN, D)])
        n.put(self, "blocks", [Block(n) for _ in range(DEPTH)])
        n.put(self, "final_norm", layers.LayerNormalization(epsilon=1e-6))
        n.put(self, "to_vocab", layers.Dense(SRC_VOCAB))

    def call(self, ids):
        n = self.n
        mask = ops.not_equal(ids, PAD_ID)[:, None, None, :]
        token, position = n.get(self, "embeddings")
        x = token(ids) + position(ops.arange(ops.shape(ids)[1]))[None]
        for block in n.get(self, "blocks"):
            x = block(x, mask)
        return n.get(self, "to_vocab")(n.get(self, "final_norm")(x))


def _built(dtype: str, renamed: bool = RENAMED) -> Encoder:
    with dtype_policy(dtype):
        model = Encoder(renamed)
        model(np.zeros((1, 2), np.int64))
    return model


def build(seed: int = 0, renamed: bool = RENAMED) -> Encoder:
    """The model, float32, every weight drawn from `seed`: kernels Glorot-uniform, embeddings N(0, 0.3), LayerNorm
    gammas 1 + 0.1 N(0, 1), betas and biases 0.1 N(0, 1)."""
    return seed_weights(_built("float32", renamed), np.random.default_rng([seed, 7717]),
                        lambda rng, shape: 0.3 * rng.standard_normal(shape))


def save_checkpoint(path: str | Path, seed: int = 0, renamed: bool = RENAMED) -> Path:
    build(seed, renamed).save_weights(str(path))
    return Path(path)


@functools.lru_cache(maxsize=4)
def _cached(path: str, mtime_ns: int, dtype: str, renamed: bool) -> Encoder:
    model = _built(dtype, renamed)
    model.load_weights(path)
    return model


def make_source(path: str | Path, renamed: bool = RENAMED):
    """The source function of the checkpoint at `path`: `batch -> logits (B, S, vocab)`."""
    path = Path(path)

    def source(batch) -> np.ndarray:
        dtype = batch_dtype(batch)
        ids = batch_ids(batch, "src_ids", SRC_VOCAB)
        model = _cached(str(path.resolve()), path.stat().st_mtime_ns, dtype, renamed)
        return np.asarray(model(ids))
    return source


def forward(batch) -> np.ndarray:
    return make_source(checkpoint_path())(batch)


def forward_f64(batch) -> np.ndarray:
    return forward({**batch, "dtype": "float64"})
