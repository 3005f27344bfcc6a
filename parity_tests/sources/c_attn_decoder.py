"""A decoder-only model as a well-known minimal GPT writes it: `transformer.wte`, `wpe`, blocks `h` of `ln_1`,
`attn` (one fused `c_attn` Linear for q, k and v, concatenated, then `c_proj`), `ln_2`, `mlp` (`c_fc`, exact GELU,
`c_proj`), a final `ln_f` and an untied `lm_head` without bias, the embeddings initialized N(0, 0.02);
causal attention, no padding mask (every id is a token: no pad id).

With `RENAMED` (the `c_attn_decoder_renamed` fixture) every module attribute is `m0`, `m1`, ...
The checkpoint is `torch.save(model.state_dict(), path)`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from parity_tests.sources import _torch, batch_ids
from parity_tests.sources._named import Names

PAD_ID = None
ENCODER_DECODER = False
SRC_VOCAB = TGT_VOCAB = 37
NUM_HEADS = 6
MAX_LEN = 32
CHECKPOINT_SUFFIX = ".pt"
N_EMBD, N_LAYER = 42, 2
RENAMED = False
ROLES = ("c_attn", "c_proj", "c_fc", "ln_1", "attn", "ln_2", "mlp", "wte", "wpe", "h", "ln_f", "transformer",
         "lm_head")


class CausalSelfAttention(nn.Module):
    def __init__(self, n: Names):
        super().__init__()
        self.n = n
        n.put(self, "c_attn", nn.Linear(N_EMBD, 3 * N_EMBD))
        n.put(self, "c_proj", nn.Linear(N_EMBD, N_EMBD))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.n.get(self, "c_attn")(x).split(N_EMBD, dim=2)
        q, k, v = (z.view(b, t, NUM_HEADS, c // NUM_HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.n.get(self, "c_proj")(y)


class MLP(nn.Module):
    def __init__(self, n: Names):
        super().__init__()
        self.n = n
        n.put(self, "c_fc", nn.Linear(N_EMBD, 4 * N_EMBD - 5))
        n.put(self, "c_proj", nn.Linear(4 * N_EMBD - 5, N_EMBD))

    def forward(self, x):
        return self.n.get(self, "c_proj")(nn.functional.gelu(self.n.get(self, "c_fc")(x)))


class Block(nn.Module):
    def __init__(self, n: Names):
        super().__init__()
        self.n = n
        n.put(self, "ln_1", nn.LayerNorm(N_EMBD))
        n.put(self, "attn", CausalSelfAttention(n))
        n.put(self, "ln_2", nn.LayerNorm(N_EMBD))
        n.put(self, "mlp", MLP(n))

    def forward(self, x):
        n = self.n
        x = x + n.get(self, "attn")(n.get(self, "ln_1")(x))
        return x + n.get(self, "mlp")(n.get(self, "ln_2")(x))


class GPT(nn.Module):
    def __init__(self, renamed: bool = RENAMED):
        super().__init__()
        self.n = n = Names(ROLES, renamed)
        body = nn.Module()
        n.put(body, "wte", nn.Embedding(SRC_VOCAB, N_EMBD))
        n.put(body, "wpe", nn.Embedding(MAX_LEN, N_EMBD))
        n.put(body, "h", nn.ModuleList(Block(n) for _ in range(N_LAYER)))
        n.put(body, "ln_f", nn.LayerNorm(N_EMBD))
        n.put(self, "transformer", body)
        n.put(self, "lm_head", nn.Linear(N_EMBD, SRC_VOCAB, bias=False))
        for module in self.modules():  # its own initialization: the embeddings N(0, 0.02)
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids):
        n, body = self.n, self.n.get(self, "transformer")
        x = n.get(body, "wte")(ids) + n.get(body, "wpe")(torch.arange(ids.shape[1]))
        for block in n.get(body, "h"):
            x = block(x)
        return n.get(self, "lm_head")(n.get(body, "ln_f")(x))


def _run(model: GPT, batch) -> torch.Tensor:
    """Logits `(B, T, SRC_VOCAB)`."""
    return model(torch.from_numpy(batch_ids(batch, "src_ids", SRC_VOCAB)))


# build, save_checkpoint, make_source, forward, forward_f64 (`renamed`: every module `m0`, `m1`, ...)
globals().update(_torch.fixture(GPT, _run))
