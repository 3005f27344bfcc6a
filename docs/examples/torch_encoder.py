"""Example 1 of docs/layouts.md: a plain PyTorch encoder as a tutorial writes it (post-LN, separate W_Q/W_K/W_V/W_O
`nn.Linear` projections, a sinusoid buffer, a classifier head), the model `torch_encoder.toml` describes.

    python docs/examples/torch_encoder.py      # writes model.pt (seeded) and torch_encoder.toml here

It needs PyTorch and nothing of this repository; `parity_tests/test_layouts.py` builds its models from this file.
"""

import math
import shutil
import sys
from pathlib import Path

import torch
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads, self.d_k = num_heads, d_model // num_heads
        self.W_Q = nn.Linear(d_model, d_model)
        self.W_K = nn.Linear(d_model, d_model)
        self.W_V = nn.Linear(d_model, d_model)
        self.W_O = nn.Linear(d_model, d_model)

    def forward(self, x, mask):  # mask (B, 1, 1, S), True = a real token
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, self.num_heads, self.d_k).transpose(1, 2) for w in (self.W_Q, self.W_K,
                                                                                         self.W_V))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.W_O(out.transpose(1, 2).reshape(b, s, -1))

class EncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask):
        x = self.norm1(x + self.dropout(self.attn(x, mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))

class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[: x.size(1)]

class Encoder(nn.Module):
    def __init__(self, vocab, n_classes, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=64,
                 dropout=0.1):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = PositionalEncoding(d_model, max_len)
        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers))
        self.classifier = nn.Linear(d_model, n_classes)

    def forward(self, ids, pad_id=0):
        mask = (ids != pad_id)[:, None, None, :]
        x = self.pos(self.embed(ids) * math.sqrt(self.d_model))
        for layer in self.layers:
            x = layer(x, mask)
        return self.classifier(x)


def main() -> int:
    torch.manual_seed(0)
    torch.save(Encoder(vocab=50, n_classes=7).state_dict(), "model.pt")
    shutil.copy(Path(__file__).with_name("torch_encoder.toml"), ".")
    print("wrote model.pt and torch_encoder.toml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
