"""A PyTorch encoder written as tutorials write it: separate `W_Q`, `W_K`, `W_V`, `W_O` `nn.Linear`s, post-LN
blocks, a token `nn.Embedding` scaled by sqrt(d_model), the language-model tutorial's `PositionalEncoding` (a
seq-first float32 buffer `pe` of shape `(max_len, 1, d_model)`) and a Linear to the vocabulary.

Padding id is 1 (as in PyTorch's translation tutorial): keys equal to 1 are masked, id 0 is an ordinary token.
The checkpoint is `torch.save(model.state_dict(), path)`. The source contract is in `parity_tests/sources`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from parity_tests.sources import _torch, batch_dtype, batch_ids, checkpoint_path

PAD_ID = 1
ENCODER_DECODER = False
SRC_VOCAB = TGT_VOCAB = 29
NUM_HEADS = 4
MAX_LEN = 5000  # the tutorial's PositionalEncoding default
CHECKPOINT_SUFFIX = ".pt"
SIZES = dict(vocab=SRC_VOCAB, d_model=36, num_heads=NUM_HEADS, d_ff=50, num_layers=3, max_len=MAX_LEN)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads, self.d_k = num_heads, d_model // num_heads
        self.W_Q = nn.Linear(d_model, d_model)
        self.W_K = nn.Linear(d_model, d_model)
        self.W_V = nn.Linear(d_model, d_model)
        self.W_O = nn.Linear(d_model, d_model)

    def forward(self, x, pad_mask):  # pad_mask (B, 1, 1, S), True = padding
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.num_heads, self.d_k).transpose(1, 2)  # (B, H, S, d_k)
                   for w in (self.W_Q, self.W_K, self.W_V))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, S, S)
        scores = scores.masked_fill(pad_mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # (B, H, S, d_k)
        return self.W_O(out.transpose(1, 2).reshape(b, s, -1))  # (B, S, D)


class PositionalEncoding(nn.Module):
    """PyTorch's language-model tutorial, verbatim: the input is seq-first `(S, B, D)`."""

    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[:x.size(0)]
        return self.dropout(x)


class EncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, pad_mask):
        x = self.norm1(x + self.dropout(self.attn(x, pad_mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class Encoder(nn.Module):
    def __init__(self, vocab, d_model, num_heads, d_ff, num_layers, max_len, dropout=0.1):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.pos_encoder = PositionalEncoding(d_model, dropout, max_len)
        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers))
        self.out = nn.Linear(d_model, vocab)

    def forward(self, ids):  # (B, S)
        pad_mask = (ids == PAD_ID)[:, None, None, :]  # (B, 1, 1, S)
        x = self.embed(ids) * math.sqrt(self.d_model)
        x = self.pos_encoder(x.transpose(0, 1)).transpose(0, 1)  # the tutorial's encoding is seq-first
        for layer in self.layers:
            x = layer(x, pad_mask)
        return self.out(x)  # (B, S, vocab)


def build(seed: int = 0) -> Encoder:
    """The model, float32, eval mode, LayerNorms and biases perturbed away from init."""
    return _torch.seeded(lambda: Encoder(**SIZES), seed)


def save_checkpoint(path: str | Path, seed: int = 0) -> Path:
    torch.save(build(seed).state_dict(), path)
    return Path(path)


def _load(path: str, dtype: str) -> Encoder:
    return _torch.load(lambda: Encoder(**SIZES), _torch.read_state(path), dtype)


def make_source(path: str | Path):
    """The source function of the checkpoint at `path`: `batch -> logits (B, S, vocab)`."""
    def source(batch) -> np.ndarray:
        dtype = batch_dtype(batch)
        ids = batch_ids(batch, "src_ids", SRC_VOCAB)
        with torch.no_grad():
            return _torch.numpy(_torch.model_for(_load, path, dtype)(torch.from_numpy(ids)))
    return source


def forward(batch) -> np.ndarray:
    return make_source(checkpoint_path())(batch)


def forward_f64(batch) -> np.ndarray:
    return forward({**batch, "dtype": "float64"})
