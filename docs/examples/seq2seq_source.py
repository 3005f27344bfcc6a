"""An example `--source` file (docs/verify.md, "The source-file contract"): the model a checkpoint came from, in its
author's own code, for `transformer-parity verify CHECKPOINT --source seq2seq_source.py:forward`.

The model is PyTorch's translation tutorial (`Seq2SeqTransformer`, sequence-first, around `torch.nn.Transformer`) at a
tiny size. Its hyperparameters are stated here, in the code, as in any training script; the weights come from the
checkpoint named by the SOURCE_CHECKPOINT environment variable (default `seq2seq.pt` in the current directory, else
beside this file). `python seq2seq_source.py OUT.pt` saves the model as its training script would (seeded, every
LayerNorm and bias moved away from its initial value) to try the commands on.

`verify` calls `forward(batch)` once, with `batch["src_ids"]` `(B, S)` and `batch["tgt_ids"]` `(B, T)` int64 NumPy
arrays, and compares what it returns with its own reference and every backend. `forward` returns the logits
`(B, T, V)`; `forward_with_sublayers` also returns intermediate outputs under canonical names, so that a mismatch is
located at the first sublayer that differs. `forward64` runs the same model in float64, where verify demands ~1e-10.
"""

import math
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

SRC_VOCAB, TGT_VOCAB = 53, 47
EMB_SIZE, NHEAD, FFN_HID_DIM = 32, 4, 48
NUM_ENCODER_LAYERS, NUM_DECODER_LAYERS = 2, 2
PAD_IDX = 1  # the tutorial's padding token


def checkpoint() -> Path:
    here = Path("seq2seq.pt")
    return Path(os.environ.get("SOURCE_CHECKPOINT", here if here.is_file() else Path(__file__).with_name(here.name)))


def sinusoids(emb_size, maxlen, dtype=torch.float32):
    """The tutorial's table, `(maxlen, 1, emb_size)` (sequence-first), computed in `dtype`."""
    den = torch.exp(- torch.arange(0, emb_size, 2, dtype=dtype) * math.log(10000) / emb_size)
    pos = torch.arange(0, maxlen, dtype=dtype).reshape(maxlen, 1)
    pos_embedding = torch.zeros((maxlen, emb_size), dtype=dtype)
    pos_embedding[:, 0::2] = torch.sin(pos * den)
    pos_embedding[:, 1::2] = torch.cos(pos * den)
    return pos_embedding.unsqueeze(-2)


class PositionalEncoding(nn.Module):
    def __init__(self, emb_size, dropout, maxlen=5000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", sinusoids(emb_size, maxlen))

    def forward(self, token_embedding):
        return self.dropout(token_embedding + self.pos_embedding[:token_embedding.size(0), :])


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size, emb_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens):
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, dropout=0.1):
        super().__init__()
        self.transformer = nn.Transformer(d_model=EMB_SIZE, nhead=NHEAD, num_encoder_layers=NUM_ENCODER_LAYERS,
                                          num_decoder_layers=NUM_DECODER_LAYERS, dim_feedforward=FFN_HID_DIM,
                                          dropout=dropout)
        self.generator = nn.Linear(EMB_SIZE, TGT_VOCAB)
        self.src_tok_emb = TokenEmbedding(SRC_VOCAB, EMB_SIZE)
        self.tgt_tok_emb = TokenEmbedding(TGT_VOCAB, EMB_SIZE)
        self.positional_encoding = PositionalEncoding(EMB_SIZE, dropout=dropout)

    def forward(self, src, trg, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, memory_key_padding_mask):
        src_emb = self.positional_encoding(self.src_tok_emb(src))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(trg))
        outs = self.transformer(src_emb, tgt_emb, src_mask, tgt_mask, None, src_padding_mask, tgt_padding_mask,
                                memory_key_padding_mask)
        return self.generator(outs)


def load(dtype=torch.float32) -> Seq2SeqTransformer:
    model = Seq2SeqTransformer()
    model.load_state_dict(torch.load(checkpoint(), weights_only=True), strict=True)
    model = model.to(dtype).eval()
    if dtype == torch.float64:  # the fixed table too: float32 angles are ~1e-6 off at position 30
        table = model.positional_encoding.pos_embedding
        model.positional_encoding.pos_embedding = sinusoids(EMB_SIZE, table.shape[0], dtype)
    return model


def logits(model: Seq2SeqTransformer, batch) -> torch.Tensor:
    """The tutorial's masks and forward on batch-first ids; `(B, T, V)`."""
    src = torch.as_tensor(batch["src_ids"]).T  # (B, S) -> (S, B): the tutorial is sequence-first
    tgt = torch.as_tensor(batch["tgt_ids"]).T  # (B, T) -> (T, B)
    t = tgt.shape[0]
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(t, dtype=model.generator.weight.dtype)
    src_mask = torch.zeros((src.shape[0], src.shape[0]), dtype=torch.bool)
    src_padding_mask, tgt_padding_mask = (src == PAD_IDX).T, (tgt == PAD_IDX).T  # (B, len), True = padding
    with torch.no_grad():
        out = model(src, tgt, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, src_padding_mask)
    return out.transpose(0, 1)  # (T, B, V) -> (B, T, V)


def forward(batch):
    """The contract's simplest form: the logits, float32."""
    return logits(load(), batch).numpy()


def forward64(batch):
    """The same model in float64: verify then requires agreement to ~1e-10 (its float64 floor)."""
    return logits(load(torch.float64), batch).numpy()


def forward_with_sublayers(batch):
    """The logits under "output", plus each layer's output under its canonical name (forward hooks)."""
    model = load()
    found = {}
    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(model.transformer, stack).layers):
            layer.register_forward_hook(
                lambda module, args, out, name=f"{stack}.layers.{i}": found.__setitem__(name, out.transpose(0, 1)))
    out = logits(model, batch)
    return {"output": out.numpy(), **{name: value.numpy() for name, value in found.items()}}


def save(path: str) -> None:
    """The model, seeded, its LayerNorms and biases moved off their initial values (as training would), saved with
    `torch.save(model.state_dict(), path)`."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:  # LayerNorm weights and biases, Linear biases
                param.add_(0.1 * torch.randn_like(param))
    torch.save(model.state_dict(), path)


if __name__ == "__main__":  # python seq2seq_source.py OUT.pt: save one; with no argument, a quick look at seq2seq.pt
    import sys

    if len(sys.argv) > 1:
        save(sys.argv[1])
    else:
        rng = np.random.default_rng(0)
        print(forward({"src_ids": rng.integers(2, SRC_VOCAB, (2, 7)),
                       "tgt_ids": rng.integers(2, TGT_VOCAB, (2, 5))}).shape)
