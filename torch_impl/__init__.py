"""The PyTorch twin of `reference_numpy`: same classes, same canonical weights, same function."""

from .attention import scaled_dot_product_attention
from .model import (WEIGHT_TABLE, Decoder, DecoderLayer, Embedding, Encoder, EncoderLayer, FeedForward,
                    MultiHeadAttention, OutputProjection, Transformer, attention_mask)

__all__ = ["scaled_dot_product_attention", "WEIGHT_TABLE", "Decoder", "DecoderLayer", "Embedding", "Encoder",
           "EncoderLayer", "FeedForward", "MultiHeadAttention", "OutputProjection", "Transformer", "attention_mask"]
