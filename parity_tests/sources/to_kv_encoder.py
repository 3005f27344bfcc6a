"""A pre-LN encoder in the style of a popular attention library: `Attention` with `to_q`, a fused `to_kv` (k and v
in one Linear) and `to_out` (a Linear inside a Sequential with dropout), each sublayer wrapped in `PreNorm` (`norm`,
`fn`), a `FeedForward` whose `net` is Linear -> GELU -> Dropout -> Linear -> Dropout, the layers a `ModuleList` of
`ModuleList([PreNorm(Attention), PreNorm(FeedForward)])`, a final LayerNorm and `to_logits`. Scores are scaled by
dim_head ** -0.5; learned positions; pad id 3 masked as keys (id 0 is a token).

With `RENAMED` (the `to_kv_encoder_renamed` fixture) every module attribute is `m0`, `m1`, ...
The checkpoint is `torch.save(model.state_dict(), path)`.
"""

from __future__ import annotations


import torch
from torch import nn

from parity_tests.sources import _torch, batch_ids
from parity_tests.sources._named import Names

PAD_ID = 3
ENCODER_DECODER = False
SRC_VOCAB = TGT_VOCAB = 33
NUM_HEADS = 4
MAX_LEN = 48
CHECKPOINT_SUFFIX = ".pt"
DIM, DEPTH, MLP = 40, 2, 56
RENAMED = False
ROLES = ("to_q", "to_kv", "to_out", "norm", "fn", "net", "layers", "token_emb", "pos_emb", "final_norm", "to_logits")


class Attention(nn.Module):
    def __init__(self, n: Names, dim, heads):
        super().__init__()
        self.n, self.heads, self.scale = n, heads, (dim // heads) ** -0.5
        n.put(self, "to_q", nn.Linear(dim, dim))
        n.put(self, "to_kv", nn.Linear(dim, 2 * dim))
        n.put(self, "to_out", nn.Sequential(nn.Linear(dim, dim), nn.Dropout(0.1)))

    def forward(self, x, mask):  # mask (B, 1, 1, S), True = may attend
        b, s, _ = x.shape
        q = self.n.get(self, "to_q")(x)
        k, v = self.n.get(self, "to_kv")(x).chunk(2, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        dots = (q @ k.transpose(-1, -2)) * self.scale
        attn = dots.masked_fill(~mask, torch.finfo(dots.dtype).min).softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, s, -1)
        return self.n.get(self, "to_out")(out)


class PreNorm(nn.Module):
    def __init__(self, n: Names, dim, fn):
        super().__init__()
        self.n = n
        n.put(self, "norm", nn.LayerNorm(dim))
        n.put(self, "fn", fn)

    def forward(self, x, **kwargs):
        return self.n.get(self, "fn")(self.n.get(self, "norm")(x), **kwargs)


class FeedForward(nn.Module):
    def __init__(self, n: Names, dim, hidden):
        super().__init__()
        self.n = n
        n.put(self, "net", nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.1), nn.Linear(hidden, dim),
                                         nn.Dropout(0.1)))

    def forward(self, x):
        return self.n.get(self, "net")(x)


class Encoder(nn.Module):
    def __init__(self, renamed: bool = RENAMED):
        super().__init__()
        self.n = n = Names(ROLES, renamed)
        n.put(self, "token_emb", nn.Embedding(SRC_VOCAB, DIM))
        n.put(self, "pos_emb", nn.Embedding(MAX_LEN, DIM))
        n.put(self, "layers", nn.ModuleList(nn.ModuleList([PreNorm(n, DIM, Attention(n, DIM, NUM_HEADS)),
                                                           PreNorm(n, DIM, FeedForward(n, DIM, MLP))])
                                            for _ in range(DEPTH)))
        n.put(self, "final_norm", nn.LayerNorm(DIM))
        n.put(self, "to_logits", nn.Linear(DIM, SRC_VOCAB))

    def forward(self, ids):
        n = self.n
        mask = (ids != PAD_ID)[:, None, None, :]
        x = n.get(self, "token_emb")(ids) + n.get(self, "pos_emb")(torch.arange(ids.shape[1]))
        for attn, ff in n.get(self, "layers"):
            x = attn(x, mask=mask) + x
            x = ff(x) + x
        return n.get(self, "to_logits")(n.get(self, "final_norm")(x))


def _run(model: Encoder, batch) -> torch.Tensor:
    """Logits `(B, S, SRC_VOCAB)`."""
    return model(torch.from_numpy(batch_ids(batch, "src_ids", SRC_VOCAB)))


# build, save_checkpoint, make_source, forward, forward_f64 (`renamed`: every module `m0`, `m1`, ...)
globals().update(_torch.fixture(Encoder, _run))
