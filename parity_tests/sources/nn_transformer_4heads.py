"""PyTorch's "Language Translation with nn.Transformer" tutorial model, verbatim but for its sizes:
`Seq2SeqTransformer` around `torch.nn.Transformer(nhead=4)` (seq-first), `TokenEmbedding` scaled by sqrt(d),
the tutorial's `PositionalEncoding` buffer `pos_embedding` `(maxlen, 1, d)`, a `generator` Linear, and the masks
its `create_mask` builds: a causal float mask on the target and padding masks from `PAD_IDX = 1` on both sides (the
source's also masks the cross-attention). Id 0 (the tutorial's UNK_IDX) is an ordinary token.

Nothing in the weights says 4 heads; d_model 40 is divisible by nn.Transformer's default of 8 as well, so a tool
that assumes 8 gets a model that runs. The checkpoint is
`torch.save(model.state_dict(), path)`. The source contract is in `parity_tests/sources`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import Transformer

from parity_tests.sources import _torch, batch_dtype, batch_ids, checkpoint_path

PAD_IDX = 1
PAD_ID = PAD_IDX
ENCODER_DECODER = True
SRC_VOCAB, TGT_VOCAB = 29, 31
NUM_HEADS = 4
MAX_LEN = 5000  # the tutorial's PositionalEncoding default maxlen
CHECKPOINT_SUFFIX = ".pt"
SIZES = dict(num_encoder_layers=3, num_decoder_layers=2, emb_size=40, nhead=NUM_HEADS, src_vocab_size=SRC_VOCAB,
             tgt_vocab_size=TGT_VOCAB, dim_feedforward=50)


class PositionalEncoding(nn.Module):
    def __init__(self, emb_size: int, dropout: float, maxlen: int = 5000):
        super().__init__()
        den = torch.exp(- torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        pos_embedding = pos_embedding.unsqueeze(-2)  # (maxlen, 1, emb_size)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", pos_embedding)

    def forward(self, token_embedding: Tensor):
        return self.dropout(token_embedding + self.pos_embedding[:token_embedding.size(0), :])


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, emb_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens: Tensor):
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, num_encoder_layers: int, num_decoder_layers: int, emb_size: int, nhead: int,
                 src_vocab_size: int, tgt_vocab_size: int, dim_feedforward: int = 512, dropout: float = 0.1):
        super().__init__()
        self.transformer = Transformer(d_model=emb_size, nhead=nhead, num_encoder_layers=num_encoder_layers,
                                       num_decoder_layers=num_decoder_layers, dim_feedforward=dim_feedforward,
                                       dropout=dropout)
        self.generator = nn.Linear(emb_size, tgt_vocab_size)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size)
        self.positional_encoding = PositionalEncoding(emb_size, dropout=dropout)

    def forward(self, src: Tensor, trg: Tensor, src_mask: Tensor, tgt_mask: Tensor, src_padding_mask: Tensor,
                tgt_padding_mask: Tensor, memory_key_padding_mask: Tensor):
        src_emb = self.positional_encoding(self.src_tok_emb(src))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(trg))
        outs = self.transformer(src_emb, tgt_emb, src_mask, tgt_mask, None, src_padding_mask, tgt_padding_mask,
                                memory_key_padding_mask)
        return self.generator(outs)


def generate_square_subsequent_mask(sz):
    mask = (torch.triu(torch.ones((sz, sz))) == 1).transpose(0, 1)
    return mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, float(0.0))


def create_mask(src, tgt):
    src_seq_len, tgt_seq_len = src.shape[0], tgt.shape[0]
    tgt_mask = generate_square_subsequent_mask(tgt_seq_len)
    src_mask = torch.zeros((src_seq_len, src_seq_len)).type(torch.bool)
    src_padding_mask = (src == PAD_IDX).transpose(0, 1)
    tgt_padding_mask = (tgt == PAD_IDX).transpose(0, 1)
    return src_mask, tgt_mask, src_padding_mask, tgt_padding_mask


def build(seed: int = 0) -> Seq2SeqTransformer:
    """The model, float32, eval mode, LayerNorms and biases (in_proj_bias too) perturbed away from init."""
    return _torch.seeded(lambda: Seq2SeqTransformer(**SIZES), seed)


def save_checkpoint(path: str | Path, seed: int = 0) -> Path:
    torch.save(build(seed).state_dict(), path)
    return Path(path)


def _load(path: str, dtype: str) -> Seq2SeqTransformer:
    return _torch.load(lambda: Seq2SeqTransformer(**SIZES), _torch.read_state(path), dtype)


def make_source(path: str | Path):
    """The source function of the checkpoint at `path`: `batch -> logits (B, T, tgt_vocab)`."""
    def source(batch) -> np.ndarray:
        dtype = batch_dtype(batch)
        src = torch.from_numpy(batch_ids(batch, "src_ids", SRC_VOCAB)).T  # (S, B): the tutorial is seq-first
        tgt = torch.from_numpy(batch_ids(batch, "tgt_ids", TGT_VOCAB)).T  # (T, B)
        src_mask, tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt)
        with torch.no_grad():
            logits = _torch.model_for(_load, path, dtype)(src, tgt, src_mask, tgt_mask, src_padding_mask,
                                                          tgt_padding_mask, src_padding_mask)  # (T, B, V)
        return _torch.numpy(logits.transpose(0, 1))  # (B, T, V)
    return source


def forward(batch) -> np.ndarray:
    return make_source(checkpoint_path())(batch)


def forward_f64(batch) -> np.ndarray:
    return forward({**batch, "dtype": "float64"})
