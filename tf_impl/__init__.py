"""The Keras 3 (TensorFlow backend) twin of `reference_numpy`: same classes, same canonical weights, same function."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # before the first `import keras`, which fixes the backend

from .attention import scaled_dot_product_attention  # noqa: E402
from .model import (WEIGHT_TABLE, Decoder, DecoderLayer, Embedding, Encoder, EncoderLayer, FeedForward,  # noqa: E402
                    MultiHeadAttention, OutputProjection, Transformer, attention_mask)

__all__ = ["scaled_dot_product_attention", "WEIGHT_TABLE", "Decoder", "DecoderLayer", "Embedding", "Encoder",
           "EncoderLayer", "FeedForward", "MultiHeadAttention", "OutputProjection", "Transformer", "attention_mask"]
