"""A PyTorch encoder-decoder written after the popular "Attention is All You Need" seq2seq tutorial (`fc_q`, `fc_k`,
`fc_v`, `fc_o`, `positionwise_feedforward.fc_1/fc_2`, `self_attn_layer_norm`, ...), whose attention divides the
scores by sqrt(d_model) instead of sqrt(d_head): a variant people write, and one the weights cannot show.

Learned positions (`nn.Embedding(max_len, d)`, one per side), token embeddings scaled by sqrt(d_model), post-LN,
separate source and target vocabularies, causal decoder self-attention, cross-attention, a final Linear. No pad
token: every id, 0 included, is a token, and the only mask is the causal one. The checkpoint is
`torch.save(model.state_dict(), path)`. The source contract is in `parity_tests/sources`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from parity_tests.sources import _torch, batch_dtype, batch_ids, checkpoint_path

PAD_ID = None  # no pad token
ENCODER_DECODER = True
SRC_VOCAB, TGT_VOCAB = 29, 23
NUM_HEADS = 3
MAX_LEN = 64
CHECKPOINT_SUFFIX = ".pt"
SIZES = dict(src_vocab=SRC_VOCAB, tgt_vocab=TGT_VOCAB, hid_dim=36, n_heads=NUM_HEADS, pf_dim=50, enc_layers=2,
             dec_layers=3, max_length=MAX_LEN)


class MultiHeadAttentionLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, dropout):
        super().__init__()
        self.hid_dim, self.n_heads, self.head_dim = hid_dim, n_heads, hid_dim // n_heads
        self.fc_q = nn.Linear(hid_dim, hid_dim)
        self.fc_k = nn.Linear(hid_dim, hid_dim)
        self.fc_v = nn.Linear(hid_dim, hid_dim)
        self.fc_o = nn.Linear(hid_dim, hid_dim)
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(hid_dim)  # d_model, not head_dim

    def forward(self, query, key, value, mask=None):
        batch_size = query.shape[0]
        Q = self.fc_q(query).view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)  # (B, H, Tq, hd)
        K = self.fc_k(key).view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)  # (B, H, Tk, hd)
        V = self.fc_v(value).view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)  # (B, H, Tk, hd)
        energy = torch.matmul(Q, K.permute(0, 1, 3, 2)) / self.scale  # (B, H, Tq, Tk)
        if mask is not None:
            energy = energy.masked_fill(mask == 0, -1e10)
        attention = torch.softmax(energy, dim=-1)
        x = torch.matmul(self.dropout(attention), V).permute(0, 2, 1, 3).contiguous()  # (B, Tq, H, hd)
        return self.fc_o(x.view(batch_size, -1, self.hid_dim))  # (B, Tq, D)


class PositionwiseFeedforwardLayer(nn.Module):
    def __init__(self, hid_dim, pf_dim, dropout):
        super().__init__()
        self.fc_1 = nn.Linear(hid_dim, pf_dim)
        self.fc_2 = nn.Linear(pf_dim, hid_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.fc_2(self.dropout(torch.relu(self.fc_1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, dropout):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.ff_layer_norm = nn.LayerNorm(hid_dim)
        self.self_attention = MultiHeadAttentionLayer(hid_dim, n_heads, dropout)
        self.positionwise_feedforward = PositionwiseFeedforwardLayer(hid_dim, pf_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src):
        src = self.self_attn_layer_norm(src + self.dropout(self.self_attention(src, src, src)))
        return self.ff_layer_norm(src + self.dropout(self.positionwise_feedforward(src)))


class DecoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, dropout):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.enc_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.ff_layer_norm = nn.LayerNorm(hid_dim)
        self.self_attention = MultiHeadAttentionLayer(hid_dim, n_heads, dropout)
        self.encoder_attention = MultiHeadAttentionLayer(hid_dim, n_heads, dropout)
        self.positionwise_feedforward = PositionwiseFeedforwardLayer(hid_dim, pf_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, trg, enc_src, trg_mask):
        trg = self.self_attn_layer_norm(trg + self.dropout(self.self_attention(trg, trg, trg, trg_mask)))
        trg = self.enc_attn_layer_norm(trg + self.dropout(self.encoder_attention(trg, enc_src, enc_src)))
        return self.ff_layer_norm(trg + self.dropout(self.positionwise_feedforward(trg)))


class Encoder(nn.Module):
    def __init__(self, input_dim, hid_dim, n_layers, n_heads, pf_dim, dropout, max_length):
        super().__init__()
        self.tok_embedding = nn.Embedding(input_dim, hid_dim)
        self.pos_embedding = nn.Embedding(max_length, hid_dim)
        self.layers = nn.ModuleList([EncoderLayer(hid_dim, n_heads, pf_dim, dropout) for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(hid_dim)

    def forward(self, src):
        pos = torch.arange(0, src.shape[1]).unsqueeze(0).repeat(src.shape[0], 1)  # (B, S)
        src = self.dropout(self.tok_embedding(src) * self.scale + self.pos_embedding(pos))
        for layer in self.layers:
            src = layer(src)
        return src


class Decoder(nn.Module):
    def __init__(self, output_dim, hid_dim, n_layers, n_heads, pf_dim, dropout, max_length):
        super().__init__()
        self.tok_embedding = nn.Embedding(output_dim, hid_dim)
        self.pos_embedding = nn.Embedding(max_length, hid_dim)
        self.layers = nn.ModuleList([DecoderLayer(hid_dim, n_heads, pf_dim, dropout) for _ in range(n_layers)])
        self.fc_out = nn.Linear(hid_dim, output_dim)
        self.dropout = nn.Dropout(dropout)
        self.scale = math.sqrt(hid_dim)

    def forward(self, trg, enc_src, trg_mask):
        pos = torch.arange(0, trg.shape[1]).unsqueeze(0).repeat(trg.shape[0], 1)  # (B, T)
        trg = self.dropout(self.tok_embedding(trg) * self.scale + self.pos_embedding(pos))
        for layer in self.layers:
            trg = layer(trg, enc_src, trg_mask)
        return self.fc_out(trg)


class Seq2Seq(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, hid_dim, n_heads, pf_dim, enc_layers, dec_layers, max_length,
                 dropout=0.1):
        super().__init__()
        self.encoder = Encoder(src_vocab, hid_dim, enc_layers, n_heads, pf_dim, dropout, max_length)
        self.decoder = Decoder(tgt_vocab, hid_dim, dec_layers, n_heads, pf_dim, dropout, max_length)

    def forward(self, src, trg):
        trg_len = trg.shape[1]
        trg_mask = torch.tril(torch.ones((trg_len, trg_len))).bool()[None, None]  # (1, 1, T, T), True = may attend
        return self.decoder(trg, self.encoder(src), trg_mask)  # (B, T, tgt_vocab)


def build(seed: int = 0) -> Seq2Seq:
    """The model, float32, eval mode, LayerNorms and biases perturbed away from init."""
    return _torch.seeded(lambda: Seq2Seq(**SIZES), seed)


def save_checkpoint(path: str | Path, seed: int = 0) -> Path:
    torch.save(build(seed).state_dict(), path)
    return Path(path)


def _load(path: str, dtype: str) -> Seq2Seq:
    return _torch.load(lambda: Seq2Seq(**SIZES), _torch.read_state(path), dtype)


def make_source(path: str | Path):
    """The source function of the checkpoint at `path`: `batch -> logits (B, T, tgt_vocab)`."""
    def source(batch) -> np.ndarray:
        dtype = batch_dtype(batch)
        src, tgt = batch_ids(batch, "src_ids", SRC_VOCAB), batch_ids(batch, "tgt_ids", TGT_VOCAB)
        with torch.no_grad():
            model = _torch.model_for(_load, path, dtype)
            return _torch.numpy(model(torch.from_numpy(src), torch.from_numpy(tgt)))
    return source


def forward(batch) -> np.ndarray:
    return make_source(checkpoint_path())(batch)


def forward_f64(batch) -> np.ndarray:
    return forward({**batch, "dtype": "float64"})
