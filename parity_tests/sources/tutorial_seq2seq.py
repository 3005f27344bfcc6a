"""A from-scratch encoder-decoder as a widespread video tutorial writes it: attention projections named `values`,
`keys`, `queries` and `fc_out`, a `TransformerBlock` (`attention`, `norm1`, `norm2`, `feed_forward`) reused as the
second half of each `DecoderBlock`, which holds its own `norm` and self-`attention` beside it (so the block's
`norm1`/`norm2` are the decoder layer's second and third norms), scores divided by sqrt(embed_size) (the model width,
not the head width), learned word and position embeddings added unscaled, post-LN.

Unlike the tutorial, both sides mask their padding (pad id 1; id 0 is a token), as the canonical model does. With
`RENAMED` (the `tutorial_seq2seq_renamed` fixture) every module attribute is `m0`, `m1`, ...: the names say nothing.
The checkpoint is `torch.save(model.state_dict(), path)`.
"""

from __future__ import annotations


import torch
from torch import nn

from parity_tests.sources import _torch, batch_ids
from parity_tests.sources._named import Names

PAD_ID = 1
ENCODER_DECODER = True
SRC_VOCAB, TGT_VOCAB = 31, 27
NUM_HEADS = 3
MAX_LEN = 40
CHECKPOINT_SUFFIX = ".pt"
SIZES = dict(embed_size=36, heads=NUM_HEADS, forward_expansion=50, num_layers=2, max_length=MAX_LEN)
RENAMED = False
ROLES = ("values", "keys", "queries", "fc_out", "attention", "norm1", "norm2", "feed_forward", "norm",
         "transformer_block", "word_embedding", "position_embedding", "layers", "encoder", "decoder")


class SelfAttention(nn.Module):
    def __init__(self, n: Names, embed_size, heads):
        super().__init__()
        self.n, self.embed_size, self.heads, self.head_dim = n, embed_size, heads, embed_size // heads
        for role in ("values", "keys", "queries", "fc_out"):
            n.put(self, role, nn.Linear(embed_size, embed_size))

    def forward(self, values, keys, query, mask):  # mask (N, 1, q or 1, k), True = may attend
        n, b = self.n, query.shape[0]
        values = n.get(self, "values")(values).reshape(b, -1, self.heads, self.head_dim)
        keys = n.get(self, "keys")(keys).reshape(b, -1, self.heads, self.head_dim)
        queries = n.get(self, "queries")(query).reshape(b, -1, self.heads, self.head_dim)
        energy = torch.einsum("nqhd,nkhd->nhqk", queries, keys)
        energy = energy.masked_fill(~mask, float("-1e20"))
        attention = torch.softmax(energy / (self.embed_size ** 0.5), dim=3)
        out = torch.einsum("nhql,nlhd->nqhd", attention, values).reshape(b, -1, self.heads * self.head_dim)
        return n.get(self, "fc_out")(out)


class TransformerBlock(nn.Module):
    def __init__(self, n: Names, embed_size, heads, forward_expansion):
        super().__init__()
        self.n = n
        n.put(self, "attention", SelfAttention(n, embed_size, heads))
        n.put(self, "norm1", nn.LayerNorm(embed_size))
        n.put(self, "norm2", nn.LayerNorm(embed_size))
        n.put(self, "feed_forward", nn.Sequential(nn.Linear(embed_size, forward_expansion), nn.ReLU(),
                                                  nn.Linear(forward_expansion, embed_size)))

    def forward(self, value, key, query, mask):
        n = self.n
        x = n.get(self, "norm1")(n.get(self, "attention")(value, key, query, mask) + query)
        return n.get(self, "norm2")(n.get(self, "feed_forward")(x) + x)


class DecoderBlock(nn.Module):
    def __init__(self, n: Names, embed_size, heads, forward_expansion):
        super().__init__()
        self.n = n
        n.put(self, "norm", nn.LayerNorm(embed_size))
        n.put(self, "attention", SelfAttention(n, embed_size, heads))
        n.put(self, "transformer_block", TransformerBlock(n, embed_size, heads, forward_expansion))

    def forward(self, x, value, key, src_mask, trg_mask):
        n = self.n
        query = n.get(self, "norm")(n.get(self, "attention")(x, x, x, trg_mask) + x)
        return n.get(self, "transformer_block")(value, key, query, src_mask)


class Stack(nn.Module):
    """The tutorial's Encoder (`decoder=False`) or Decoder (with its `fc_out` to the target vocabulary)."""

    def __init__(self, n: Names, vocab, embed_size, heads, forward_expansion, num_layers, max_length, decoder):
        super().__init__()
        self.n = n
        n.put(self, "word_embedding", nn.Embedding(vocab, embed_size))
        n.put(self, "position_embedding", nn.Embedding(max_length, embed_size))
        block = DecoderBlock if decoder else TransformerBlock
        n.put(self, "layers", nn.ModuleList(block(n, embed_size, heads, forward_expansion) for _ in range(num_layers)))
        if decoder:
            n.put(self, "fc_out", nn.Linear(embed_size, vocab))

    def embed(self, ids):
        positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        return self.n.get(self, "word_embedding")(ids) + self.n.get(self, "position_embedding")(positions)


class Transformer(nn.Module):
    def __init__(self, renamed: bool = RENAMED):
        super().__init__()
        self.n = n = Names(ROLES, renamed)
        sizes = {k: v for k, v in SIZES.items()}
        n.put(self, "encoder", Stack(n, SRC_VOCAB, decoder=False, **sizes))
        n.put(self, "decoder", Stack(n, TGT_VOCAB, decoder=True, **sizes))

    def forward(self, src, trg):
        n = self.n
        encoder, decoder = n.get(self, "encoder"), n.get(self, "decoder")
        src_mask = (src != PAD_ID)[:, None, None, :]  # (N, 1, 1, S)
        t = trg.shape[1]
        trg_mask = torch.tril(torch.ones(t, t, dtype=torch.bool))[None, None] & (trg != PAD_ID)[:, None, None, :]
        enc = encoder.embed(src)
        for layer in n.get(encoder, "layers"):
            enc = layer(enc, enc, enc, src_mask)
        x = decoder.embed(trg)
        for layer in n.get(decoder, "layers"):
            x = layer(x, enc, enc, src_mask, trg_mask)
        return n.get(decoder, "fc_out")(x)


def _run(model: Transformer, batch) -> torch.Tensor:
    """Logits `(B, T, TGT_VOCAB)`."""
    src, tgt = batch_ids(batch, "src_ids", SRC_VOCAB), batch_ids(batch, "tgt_ids", TGT_VOCAB)
    return model(torch.from_numpy(src), torch.from_numpy(tgt))


# build, save_checkpoint, make_source, forward, forward_f64 (`renamed`: every module `m0`, `m1`, ...)
globals().update(_torch.fixture(Transformer, _run))
