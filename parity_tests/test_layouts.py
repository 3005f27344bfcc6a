"""User-written layout files (`layouts.user`, docs/layouts.md): three models written as a user would write them,
ported with the layout files in docs/examples/, and checked against the source model's own forward pass (float32
and float64) and the float64 reference; the format's errors; one built-in table equal to a TOML file."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

import reference_numpy as rn
from parity_tests.tolerances import atol, property_atol
from transformer_parity import formats
from transformer_parity.cli import main
from transformer_parity.layouts import user

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
EPS32 = float(np.finfo(np.float32).eps)


def reference_errors(config, weights, src, logits32, logits64) -> dict[str, float]:
    """Max abs error of the source model's logits (float32, float64) against the float64 reference on the ported
    weights, asserted within the verify rule (float32: 10 floors, never below ATOL; float64: ATOL)."""
    judge = rn.Transformer(config, weights, np.float64)(src)
    floor32 = rn.Transformer(config, weights, np.float32)(src)
    floor = max(float(np.max(np.abs(floor32 - judge))), EPS32 * float(np.max(np.abs(judge))))
    assert_allclose(logits32, judge, rtol=0, atol=property_atol("float32", floor))
    assert_allclose(logits64, judge, rtol=0, atol=atol("float64"))
    return {"float32": float(np.max(np.abs(logits32 - judge))), "float64": float(np.max(np.abs(logits64 - judge)))}


def convert(tmp_path, source: Path, layout: Path, *extra: str) -> formats.Loaded:
    out = tmp_path / "ported.safetensors"
    assert main(["--quiet", "convert", "--layout", str(layout), str(source), str(out), *extra]) == 0
    return formats.load(out)


# --- example 1: a plain PyTorch encoder with W_Q/W_K/W_V/W_O ---------------------------------------------------------

def torch_encoder_classes():
    """The user's model, as a tutorial writes it: post-LN encoder, separate q/k/v/o nn.Linear, sinusoid buffer."""
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

    return Encoder


def train_a_little(model, vocab: int, n_classes: int, steps: int = 3, seed: int = 0):
    """A few Adam steps on random tokens, so that biases and LayerNorm parameters are no longer 0 and 1."""
    import torch

    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        ids = torch.randint(1, vocab, (4, 12))
        loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, n_classes),
                                                 torch.randint(0, n_classes, (48,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def torch_logits(model, src, build):
    """The source model's logits in float32, and in float64 from a copy built in float64 (`build()`, the same
    constructor) holding the same parameters: constant buffers such as a sinusoid table are recomputed in float64,
    as a float64 model computes them, not upcast from float32."""
    import torch

    with torch.no_grad():
        logits32 = model(torch.from_numpy(src)).numpy()
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            model64 = build()
        finally:
            torch.set_default_dtype(default)
        buffers = {name for name, _ in model64.named_buffers()}
        state = {k: v.double() for k, v in model.state_dict().items() if k not in buffers}
        model64.load_state_dict(state, strict=False)
        logits64 = model64.eval()(torch.from_numpy(src)).numpy()
    return logits32, logits64


@pytest.fixture(scope="module")
def torch_encoder_file(tmp_path_factory):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    build = lambda: torch_encoder_classes()(vocab=50, n_classes=7)  # noqa: E731
    model = train_a_little(build(), vocab=50, n_classes=7)
    path = tmp_path_factory.mktemp("torch_encoder") / "model.pt"
    torch.save(model.state_dict(), path)
    return model, build, path


def test_torch_encoder_example(torch_encoder_file, tmp_path):
    model, build, path = torch_encoder_file
    loaded = convert(tmp_path, path, EXAMPLES / "torch_encoder.toml")
    config = loaded.config
    assert (config.num_encoder_layers, config.num_decoder_layers, config.d_model, config.num_heads, config.d_ff,
            config.src_vocab_size, config.tgt_vocab_size) == (2, 0, 32, 4, 64, 50, 7)
    src = rn.sample_ids(config, batch=3, length=20, vocab_size=50, seed=1)
    errors = reference_errors(config, loaded.weights, src, *torch_logits(model, src, build))
    assert errors["float32"] > 0  # the comparison ran on real numbers


def test_torch_encoder_verify_cli(torch_encoder_file, capsys):
    *_, path = torch_encoder_file
    code = main(["verify", "--layout", str(EXAMPLES / "torch_encoder.toml"), str(path), "--backends", "torch",
                 "--src-len", "16"])
    assert code == 0, capsys.readouterr()
