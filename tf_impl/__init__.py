"""The Keras 3 (TensorFlow backend) twin of `reference_numpy`: same classes, same canonical weights, same function.

The names below load Keras and TensorFlow on first use (PEP 562), so that `tf_impl.saved_names` (the names Keras gives
the model's variables in a `.weights.h5`, NumPy only) serves the file's reader and writer
(`transformer_parity.formats.keras_file`) without the ~3 s and ~0.5 GB a TensorFlow import costs.
"""

import importlib
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # before the first `import keras`, which fixes the backend

_EXPORTS = {"scaled_dot_product_attention": "attention", "weight_table": "model", "Decoder": "model",
            "DecoderLayer": "model", "Embedding": "model", "Encoder": "model", "EncoderLayer": "model",
            "FeedForward": "model", "MultiHeadAttention": "model", "OutputProjection": "model",
            "Transformer": "model", "attention_mask": "model"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
