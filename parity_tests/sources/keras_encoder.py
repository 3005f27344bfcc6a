"""A Keras 3 encoder written after TensorFlow's Transformer tutorials: the older "Transformer model for language
understanding" attention (`Dense` `wq`/`wk`/`wv`/`dense`, an ADDITIVE mask `scores + (1 - mask) * -1e9`,
`LayerNormalization(epsilon=1e-6)`, a `keras.Sequential` feed-forward block) with the newer tutorial's
`positional_encoding` (concatenated `[sin | cos]`, computed in NumPy), embeddings scaled by sqrt(d_model), and a
`final_layer` Dense to the vocabulary. Pad id 0: keys equal to 0 are masked.

The checkpoint is `model.save_weights(path)` (`.weights.h5`); loading builds the model and calls `load_weights`.
The source contract is in `parity_tests/sources`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from parity_tests.sources import batch_dtype, batch_ids, checkpoint_path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
from keras import layers, ops  # noqa: E402

PAD_ID = 0
ENCODER_DECODER = False
SRC_VOCAB = TGT_VOCAB = 29
NUM_HEADS = 3
MAX_LEN = 64
CHECKPOINT_SUFFIX = ".weights.h5"
SIZES = dict(num_layers=2, d_model=36, num_heads=NUM_HEADS, dff=50, vocab_size=SRC_VOCAB, max_len=MAX_LEN)


def positional_encoding(length, depth):
    depth = depth / 2
    positions = np.arange(length)[:, np.newaxis]  # (seq, 1)
    depths = np.arange(depth)[np.newaxis, :] / depth  # (1, depth)
    angle_rates = 1 / (10000 ** depths)  # (1, depth)
    angle_rads = positions * angle_rates  # (pos, depth)
    return np.concatenate([np.sin(angle_rads), np.cos(angle_rads)], axis=-1)  # (pos, 2 * depth)


class MultiHeadAttention(layers.Layer):
    def __init__(self, d_model, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.depth = num_heads, d_model // num_heads
        self.wq = layers.Dense(d_model)
        self.wk = layers.Dense(d_model)
        self.wv = layers.Dense(d_model)
        self.dense = layers.Dense(d_model)

    def split_heads(self, x):
        x = ops.reshape(x, (ops.shape(x)[0], -1, self.num_heads, self.depth))  # (B, S, H, depth)
        return ops.transpose(x, (0, 2, 1, 3))  # (B, H, S, depth)

    def call(self, v, k, q, mask):  # mask (B, 1, 1, S): 1 = a real token, 0 = padding
        q, k, v = self.split_heads(self.wq(q)), self.split_heads(self.wk(k)), self.split_heads(self.wv(v))
        logits = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / np.sqrt(self.depth)  # (B, H, S, S)
        logits = logits + (1.0 - mask) * -1e9
        out = ops.matmul(ops.softmax(logits, axis=-1), v)  # (B, H, S, depth)
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (ops.shape(out)[0], -1, self.num_heads * self.depth))
        return self.dense(out)  # (B, S, D)


class EncoderLayer(layers.Layer):
    def __init__(self, d_model, num_heads, dff, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.mha = MultiHeadAttention(d_model, num_heads)
        self.ffn = keras.Sequential([layers.Dense(dff, activation="relu"), layers.Dense(d_model)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1, self.dropout2 = layers.Dropout(rate), layers.Dropout(rate)

    def call(self, x, mask, training=False):
        out1 = self.layernorm1(x + self.dropout1(self.mha(x, x, x, mask), training=training))
        return self.layernorm2(out1 + self.dropout2(self.ffn(out1), training=training))


class Encoder(keras.Model):
    def __init__(self, num_layers, d_model, num_heads, dff, vocab_size, max_len, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.embedding = layers.Embedding(vocab_size, d_model)
        self.pos_encoding = positional_encoding(max_len, d_model)  # NumPy float64, not a weight
        self.enc_layers = [EncoderLayer(d_model, num_heads, dff, rate) for _ in range(num_layers)]
        self.dropout = layers.Dropout(rate)
        self.final_layer = layers.Dense(vocab_size)

    def call(self, ids, training=False):
        mask = ops.cast(ops.not_equal(ids, PAD_ID), self.compute_dtype)[:, None, None, :]  # (B, 1, 1, S)
        x = self.embedding(ids) * ops.sqrt(ops.cast(self.d_model, self.compute_dtype))
        x = x + ops.cast(self.pos_encoding[None, :ops.shape(ids)[1]], self.compute_dtype)
        x = self.dropout(x, training=training)
        for layer in self.enc_layers:
            x = layer(x, mask, training=training)
        return self.final_layer(x)  # (B, S, vocab)


@contextlib.contextmanager
def dtype_policy(name: str) -> Iterator[None]:
    """Build layers under Keras's `name` dtype policy (float64: the model as a float64 program builds it)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _built(dtype: str) -> Encoder:
    with dtype_policy(dtype):
        model = Encoder(**SIZES)
        model(np.zeros((1, 2), np.int64))  # creates the weights
    return model


def build(seed: int = 0) -> Encoder:
    """The model, float32, with every weight drawn from `seed` (no global Keras seed is touched): kernels
    Glorot-uniform, embeddings uniform(-0.05, 0.05), LayerNorm gammas 1 + 0.1 N(0, 1), betas and biases 0.1 N(0, 1)."""
    return seed_weights(_built("float32"), np.random.default_rng([seed, 7919]),
                        lambda rng, shape: rng.uniform(-0.05, 0.05, shape))


def seed_weights(model, rng: np.random.Generator, embeddings) -> keras.Model:
    """Every weight of `model` drawn from `rng`: kernels Glorot-uniform, embeddings `embeddings(rng, shape)`,
    LayerNorm gammas 1 + 0.1 N(0, 1), betas and biases 0.1 N(0, 1)."""
    values = []
    for variable in model.weights:
        shape, leaf = tuple(variable.shape), variable.path.rsplit("/", 1)[-1]
        if leaf == "kernel":
            limit = np.sqrt(6.0 / (shape[0] + shape[1]))
            value = rng.uniform(-limit, limit, shape)
        elif leaf == "embeddings":
            value = embeddings(rng, shape)
        elif leaf == "gamma":
            value = 1 + 0.1 * rng.standard_normal(shape)
        elif leaf in ("beta", "bias"):
            value = 0.1 * rng.standard_normal(shape)
        else:
            raise ValueError(f"unexpected weight {variable.path!r} of shape {shape}")
        values.append(value.astype(np.float32))
    model.set_weights(values)
    return model


def save_checkpoint(path: str | Path, seed: int = 0) -> Path:
    if not str(path).endswith(".weights.h5"):
        raise ValueError(f"Keras saves weights to a file ending in .weights.h5, received {str(path)!r}")
    build(seed).save_weights(str(path))
    return Path(path)


def _load(path: str, dtype: str) -> Encoder:
    model = _built(dtype)
    model.load_weights(path)
    return model


@functools.lru_cache(maxsize=4)
def _cached(path: str, mtime_ns: int, dtype: str) -> Encoder:
    return _load(path, dtype)


def make_source(path: str | Path):
    """The source function of the checkpoint at `path`: `batch -> logits (B, S, vocab)`."""
    path = Path(path)

    def source(batch) -> np.ndarray:
        dtype = batch_dtype(batch)
        ids = batch_ids(batch, "src_ids", SRC_VOCAB)
        model = _cached(str(path.resolve()), path.stat().st_mtime_ns, dtype)
        return np.asarray(model(ids, training=False))
    return source


def forward(batch) -> np.ndarray:
    return make_source(checkpoint_path())(batch)


def forward_f64(batch) -> np.ndarray:
    return forward({**batch, "dtype": "float64"})
