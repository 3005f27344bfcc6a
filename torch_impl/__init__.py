"""The PyTorch twin of `reference_numpy`: same classes, same canonical weights, same function."""

from .attention import scaled_dot_product_attention
from .model import (Decoder, DecoderLayer, Embedding, Encoder, EncoderLayer, FeedForward, MultiHeadAttention,
                    OutputProjection, Transformer, attention_mask, weight_table)

__all__ = ["scaled_dot_product_attention", "weight_table", "Decoder", "DecoderLayer", "Embedding", "Encoder",
           "EncoderLayer", "FeedForward", "MultiHeadAttention", "OutputProjection", "Transformer", "attention_mask"]
