"""The UvA deep-learning / Lightning tutorial's `TransformerPredictor` ("Tutorial 6: Transformers and Multi-Head
Attention"), in plain torch, inside a LightningModule-style wrapper that holds it as `self.model`.

The input is the one-hot encoding of the ids through `input_net = Sequential(Dropout, Linear(vocab, d))` (a bias
that no embedding table has), the tutorial's sinusoidal `PositionalEncoding` added unscaled, post-LN encoder blocks
whose attention has ONE fused `qkv_proj = Linear(d, 3d)` with q, k, v interleaved per head
(`reshape(B, L, heads, 3 * head_dim)`, then `chunk(3)`), and the output head `output_net = Sequential(Linear(d, d),
LayerNorm(d), ReLU, Dropout, Linear(d, classes))`. No pad token, no mask.

The checkpoint is what Lightning's `trainer.save_checkpoint` writes: `{"state_dict": {"model." + name: tensor},
"hyper_parameters": {...}, "epoch", "global_step", "pytorch-lightning_version", "optimizer_states", ...}`; loading
builds the model from `hyper_parameters`, as `load_from_checkpoint` does. The source contract is in
`parity_tests/sources`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from parity_tests.sources import _torch, batch_dtype, batch_ids, checkpoint_path

PAD_ID = None  # no pad token
ENCODER_DECODER = False
SRC_VOCAB = TGT_VOCAB = 29
NUM_HEADS = 3
MAX_LEN = 5000  # the tutorial's PositionalEncoding default
CHECKPOINT_SUFFIX = ".ckpt"
HPARAMS = dict(input_dim=SRC_VOCAB, model_dim=36, num_classes=TGT_VOCAB, num_heads=NUM_HEADS, num_layers=2,
               lr=5e-4, warmup=50, max_iters=1000, dropout=0.0, input_dropout=0.0)
PREFIX = "model."  # the LightningModule holds the network as self.model


def scaled_dot_product(q, k, v, mask=None):
    d_k = q.size()[-1]
    attn_logits = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        attn_logits = attn_logits.masked_fill(mask == 0, -9e15)
    attention = F.softmax(attn_logits, dim=-1)
    return torch.matmul(attention, v), attention


class MultiheadAttention(nn.Module):
    def __init__(self, input_dim, embed_dim, num_heads):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.qkv_proj = nn.Linear(input_dim, 3 * embed_dim)
        self.o_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, mask=None):
        batch_size, seq_length, _ = x.size()
        qkv = self.qkv_proj(x).reshape(batch_size, seq_length, self.num_heads, 3 * self.head_dim)  # (B, L, H, 3hd)
        q, k, v = qkv.permute(0, 2, 1, 3).chunk(3, dim=-1)  # 3 x (B, H, L, hd)
        values, _ = scaled_dot_product(q, k, v, mask=mask)
        values = values.permute(0, 2, 1, 3).reshape(batch_size, seq_length, self.embed_dim)  # (B, L, D)
        return self.o_proj(values)


class EncoderBlock(nn.Module):
    def __init__(self, input_dim, num_heads, dim_feedforward, dropout=0.0):
        super().__init__()
        self.self_attn = MultiheadAttention(input_dim, input_dim, num_heads)
        self.linear_net = nn.Sequential(nn.Linear(input_dim, dim_feedforward), nn.Dropout(dropout),
                                        nn.ReLU(inplace=True), nn.Linear(dim_feedforward, input_dim))
        self.norm1, self.norm2 = nn.LayerNorm(input_dim), nn.LayerNorm(input_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)))
        return self.norm2(x + self.dropout(self.linear_net(x)))


class TransformerEncoder(nn.Module):
    def __init__(self, num_layers, **block_args):
        super().__init__()
        self.layers = nn.ModuleList([EncoderBlock(**block_args) for _ in range(num_layers)])

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask=mask)
        return x


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        # the tutorial writes dtype=torch.float and .float() here; the default dtype instead, so that the model built
        # in a float64 program has a float64 table (a float32 one moves float64 logits by ~1e-7)
        position = torch.arange(0, max_len, dtype=torch.get_default_dtype()).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).to(position.dtype) * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0), persistent=False)  # (1, max_len, D), not in the state dict

    def forward(self, x):
        return x + self.pe[:, :x.size(1)]


class TransformerPredictor(nn.Module):
    def __init__(self, input_dim, model_dim, num_classes, num_heads, num_layers, lr=None, warmup=None,
                 max_iters=None, dropout=0.0, input_dropout=0.0):
        super().__init__()
        self.input_net = nn.Sequential(nn.Dropout(input_dropout), nn.Linear(input_dim, model_dim))
        self.positional_encoding = PositionalEncoding(d_model=model_dim)
        self.transformer = TransformerEncoder(num_layers=num_layers, input_dim=model_dim,
                                              dim_feedforward=2 * model_dim, num_heads=num_heads, dropout=dropout)
        self.output_net = nn.Sequential(nn.Linear(model_dim, model_dim), nn.LayerNorm(model_dim),
                                        nn.ReLU(inplace=True), nn.Dropout(dropout),
                                        nn.Linear(model_dim, num_classes))

    def forward(self, x, mask=None, add_positional_encoding=True):  # x: (B, L, input_dim), one-hot
        x = self.input_net(x)
        if add_positional_encoding:
            x = self.positional_encoding(x)
        x = self.transformer(x, mask=mask)
        return self.output_net(x)  # (B, L, num_classes)


def build(seed: int = 0) -> TransformerPredictor:
    """The model, float32, eval mode, LayerNorms and biases perturbed away from init."""
    return _torch.seeded(lambda: TransformerPredictor(**HPARAMS), seed)


def save_checkpoint(path: str | Path, seed: int = 0) -> Path:
    """A Lightning-style `.ckpt`: the wrapped model's state dict under "model.", the hyperparameters, the loop
    counters and Adam's state, as `trainer.save_checkpoint` leaves them."""
    model = build(seed)
    params = list(model.parameters())
    adam = {"state": {n: {"step": torch.tensor(120.0), "exp_avg": torch.zeros_like(p),
                          "exp_avg_sq": torch.zeros_like(p)} for n, p in enumerate(params)},
            "param_groups": [{"lr": HPARAMS["lr"], "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0,
                              "amsgrad": False, "params": list(range(len(params)))}]}
    torch.save({"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.5.0",
                "state_dict": {PREFIX + k: v for k, v in model.state_dict().items()},
                "loops": {}, "callbacks": {}, "optimizer_states": [adam], "lr_schedulers": [],
                "hparams_name": "kwargs", "hyper_parameters": dict(HPARAMS)}, path)
    return Path(path)


def _load(path: str, dtype: str) -> TransformerPredictor:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    state = {k[len(PREFIX):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(PREFIX)}
    return _torch.load(lambda: TransformerPredictor(**hparams), state, dtype)


def make_source(path: str | Path):
    """The source function of the checkpoint at `path`: `batch -> logits (B, S, num_classes)`."""
    def source(batch) -> np.ndarray:
        dtype = batch_dtype(batch)
        ids = torch.from_numpy(batch_ids(batch, "src_ids", SRC_VOCAB))
        with torch.no_grad():
            x = F.one_hot(ids, num_classes=SRC_VOCAB).to(getattr(torch, dtype))  # (B, S, vocab)
            return _torch.numpy(_torch.model_for(_load, path, dtype)(x))
    return source


def forward(batch) -> np.ndarray:
    return make_source(checkpoint_path())(batch)


def forward_f64(batch) -> np.ndarray:
    return forward({**batch, "dtype": "float64"})
