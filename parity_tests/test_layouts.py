"""User-written layout files (`layouts.user`, docs/layouts.md): three models written as a user would write them,
ported with the layout files in docs/examples/, and checked against the source model's own forward pass (float32
and float64) and the float64 reference; the format's errors; one built-in table equal to a TOML file."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

import reference_numpy as rn
from parity_tests.tolerances import atol, floor, property_atol
from transformer_parity import formats
from transformer_parity.cli import main
from transformer_parity.layouts import user

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


def reference_errors(config, weights, src, logits32, logits64, float64_exact: bool = True) -> dict[str, float]:
    """Max abs error of the source model's logits (float32, float64) against the float64 reference on the ported
    weights, asserted within the verify rule (float32: 10 floors, never below ATOL; float64: ATOL). A source that is
    not float64-exact itself (`float64_exact=False`: Keras's MultiHeadAttention, see docs/kerashub.md) must still be
    10x closer in float64 than the float32 floor, which no float32 computation is."""
    judge = rn.Transformer(config, weights, np.float64)(src)
    floor32 = floor(rn.Transformer(config, weights, np.float32)(src), judge)
    assert_allclose(logits32, judge, rtol=0, atol=property_atol("float32", floor32))
    assert_allclose(logits64, judge, rtol=0, atol=atol("float64") if float64_exact else floor32 / 10)
    return {"float32": float(np.max(np.abs(logits32 - judge))), "float64": float(np.max(np.abs(logits64 - judge)))}


def fill_scaffold(text: str, **values) -> str:
    """What the user does with `layout --scaffold`'s [config]: each "?" replaced by the value in the model's code
    (every "?" must be named here, and each name must be a "?" line)."""
    for name, value in values.items():
        literal = ("true" if value else "false") if isinstance(value, bool) else \
            f'"{value}"' if isinstance(value, str) else repr(value)
        text, count = re.subn(rf'^{name} = "\?"', f"{name} = {literal}", text, flags=re.M)
        assert count == 1, (name, text)
    assert not re.search(r'^\w+ = "\?"', text, flags=re.M), text
    return text


def convert(tmp_path, source: Path, layout: Path, *extra: str) -> formats.Loaded:
    out = tmp_path / "ported.safetensors"
    assert main(["--quiet", "convert", "--layout", str(layout), str(source), str(out), *extra]) == 0
    return formats.load(out)


# --- example 1: a plain PyTorch encoder with W_Q/W_K/W_V/W_O ---------------------------------------------------------

def torch_encoder_classes():
    """The user's model, as a tutorial writes it: post-LN encoder, separate q/k/v/o nn.Linear, sinusoid buffer; its
    code is docs/examples/torch_encoder.py (example 1 of docs/layouts.md)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("torch_encoder_example", EXAMPLES / "torch_encoder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Encoder


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


def test_torch_encoder_exported_back_loads_into_the_users_model(torch_encoder_file, tmp_path):
    """canonical -> the user's own names (--to-layout): load_state_dict takes it, every tensor bit-identical."""
    torch = pytest.importorskip("torch")
    model, build, path = torch_encoder_file
    layout = str(EXAMPLES / "torch_encoder.toml")
    convert(tmp_path, path, EXAMPLES / "torch_encoder.toml")
    back = tmp_path / "back.pt"
    assert main(["--quiet", "convert", str(tmp_path / "ported.safetensors"), str(back), "--to-layout", layout]) == 0
    fresh = build()
    result = fresh.load_state_dict(torch.load(back, weights_only=True), strict=False)
    assert result.missing_keys == ["pos.pe"] and not result.unexpected_keys  # the sinusoid buffer is recomputed
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_torch_encoder_verify_cli(torch_encoder_file, capsys):
    *_, path = torch_encoder_file
    code = main(["verify", "--layout", str(EXAMPLES / "torch_encoder.toml"), str(path), "--backends", "torch",
                 "--src-len", "16"])
    assert code == 0, capsys.readouterr()


# --- example 2: one fused qkv_proj, q/k/v interleaved per head (the Lightning tutorial's encoder) -------------------

def lightning_encoder_classes():
    """The UvA DL / Lightning tutorial's encoder (a LightningModule's weights are its nn.Module's), with an
    nn.Embedding for the tutorial's one-hot input_net and one Linear as the output net."""
    import torch
    from torch import nn

    def scaled_dot_product(q, k, v, mask=None):
        attn_logits = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            attn_logits = attn_logits.masked_fill(mask == 0, -9e15)
        return torch.softmax(attn_logits, dim=-1) @ v

    class MultiheadAttention(nn.Module):
        def __init__(self, input_dim, embed_dim, num_heads):
            super().__init__()
            self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
            self.qkv_proj = nn.Linear(input_dim, 3 * embed_dim)
            self.o_proj = nn.Linear(embed_dim, embed_dim)

        def forward(self, x, mask=None):
            batch_size, seq_length, _ = x.size()
            qkv = self.qkv_proj(x).reshape(batch_size, seq_length, self.num_heads, 3 * self.head_dim)
            q, k, v = qkv.permute(0, 2, 1, 3).chunk(3, dim=-1)
            values = scaled_dot_product(q, k, v, mask=mask)
            return self.o_proj(values.permute(0, 2, 1, 3).reshape(batch_size, seq_length, self.embed_dim))

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
            # the tutorial writes dtype=torch.float and .float() here: the default dtype instead, so that a copy built
            # in float64 has a float64 table (a float32 one moves its float64 logits by ~1e-7)
            position = torch.arange(0, max_len, dtype=torch.get_default_dtype()).unsqueeze(1)
            div_term = torch.exp(torch.arange(0, d_model, 2).to(position.dtype) * (-math.log(10000.0) / d_model))
            pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div_term), torch.cos(position * div_term)
            self.register_buffer("pe", pe.unsqueeze(0), persistent=False)

        def forward(self, x):
            return x + self.pe[:, : x.size(1)]

    class TransformerPredictor(nn.Module):
        def __init__(self, vocab, model_dim, num_classes, num_heads, num_layers, dropout=0.0):
            super().__init__()
            self.embed = nn.Embedding(vocab, model_dim)
            self.positional_encoding = PositionalEncoding(d_model=model_dim, max_len=128)
            self.transformer = TransformerEncoder(num_layers=num_layers, input_dim=model_dim,
                                                  dim_feedforward=2 * model_dim, num_heads=num_heads,
                                                  dropout=dropout)
            self.output_net = nn.Linear(model_dim, num_classes)

        def forward(self, ids, pad_id=0):
            mask = (ids != pad_id)[:, None, None, :]
            x = self.positional_encoding(self.embed(ids))
            return self.output_net(self.transformer(x, mask=mask))

    return TransformerPredictor


def test_lightning_fused_qkv_example(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    build = lambda: lightning_encoder_classes()(vocab=40, model_dim=32, num_classes=5, num_heads=4,  # noqa: E731
                                                num_layers=2, dropout=0.1)
    model = train_a_little(build(), vocab=40, n_classes=5)
    path = tmp_path / "lightning.pt"
    torch.save(model.state_dict(), path)
    loaded = convert(tmp_path, path, EXAMPLES / "lightning_encoder.toml")
    assert (loaded.config.num_encoder_layers, loaded.config.d_ff, loaded.config.scale_embedding) == (2, 64, False)
    src = rn.sample_ids(loaded.config, batch=3, length=20, vocab_size=40, seed=2)
    reference_errors(loaded.config, loaded.weights, src, *torch_logits(model, src, build))


def test_lightning_layout_with_concatenated_split_fails_the_check(tmp_path):
    """The interleaving matters: read as concatenated q|k|v (fused_qkv_t), the same file gives other logits."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    build = lambda: lightning_encoder_classes()(vocab=40, model_dim=32, num_classes=5, num_heads=4,  # noqa: E731
                                                num_layers=1)
    model = build().eval()
    path = tmp_path / "lightning.pt"
    torch.save(model.state_dict(), path)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text((EXAMPLES / "lightning_encoder.toml").read_text().replace("fused_qkv_heads_t", "fused_qkv_t"))
    loaded = convert(tmp_path, path, wrong)
    src = rn.sample_ids(loaded.config, batch=2, length=12, vocab_size=40, seed=2)
    with pytest.raises(AssertionError):
        reference_errors(loaded.config, loaded.weights, src, *torch_logits(model, src, build))


# --- example 3: a Keras encoder with Dense wq/wk/wv/dense, epsilon 1e-6 and an additive mask * -1e9 ----------------

def keras_encoder_class():
    """The TensorFlow tutorial's encoder ("Transformer model for language understanding") plus a Dense
    classifier, written with keras.ops; casts follow the compute dtype so that a float64 copy computes in float64."""
    import keras
    from keras import layers, ops

    def positional_encoding(length, depth):
        angles = np.arange(length)[:, None] / np.power(10000, (2 * (np.arange(depth)[None, :] // 2)) / depth)
        angles[:, 0::2], angles[:, 1::2] = np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])
        return angles[None]  # (1, length, depth)

    class MultiHeadAttention(layers.Layer):
        def __init__(self, d_model, num_heads, **kwargs):
            super().__init__(**kwargs)
            self.num_heads, self.depth = num_heads, d_model // num_heads
            self.wq, self.wk, self.wv = layers.Dense(d_model), layers.Dense(d_model), layers.Dense(d_model)
            self.dense = layers.Dense(d_model)

        def split_heads(self, x):
            x = ops.reshape(x, (ops.shape(x)[0], -1, self.num_heads, self.depth))  # (B, S, H, depth)
            return ops.transpose(x, (0, 2, 1, 3))  # (B, H, S, depth)

        def call(self, v, k, q, mask):
            q, k, v = self.split_heads(self.wq(q)), self.split_heads(self.wk(k)), self.split_heads(self.wv(v))
            logits = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / np.sqrt(self.depth)
            logits += mask * -1e9
            out = ops.matmul(ops.softmax(logits, axis=-1), v)  # (B, H, S, depth)
            out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (ops.shape(out)[0], -1, self.num_heads * self.depth))
            return self.dense(out)

    class EncoderLayer(layers.Layer):
        def __init__(self, d_model, num_heads, dff, rate=0.1, **kwargs):
            super().__init__(**kwargs)
            self.mha = MultiHeadAttention(d_model, num_heads)
            self.ffn = keras.Sequential([layers.Dense(dff, activation="relu"), layers.Dense(d_model)])
            self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
            self.dropout1, self.dropout2 = layers.Dropout(rate), layers.Dropout(rate)

        def call(self, x, mask, training=False):
            out1 = self.layernorm1(x + self.dropout1(self.mha(x, x, x, mask), training=training))
            return self.layernorm2(out1 + self.dropout2(self.ffn(out1), training=training))

    class Encoder(keras.Model):
        def __init__(self, num_layers, d_model, num_heads, dff, vocab_size, n_classes, max_len=64, rate=0.1,
                     **kwargs):
            super().__init__(**kwargs)
            self.d_model = d_model
            self.embedding = layers.Embedding(vocab_size, d_model)
            self.pos_encoding = positional_encoding(max_len, d_model)
            self.enc_layers = [EncoderLayer(d_model, num_heads, dff, rate) for _ in range(num_layers)]
            self.dropout = layers.Dropout(rate)
            self.classifier = layers.Dense(n_classes)

        def call(self, ids, training=False):
            mask = ops.cast(ops.equal(ids, 0), self.compute_dtype)[:, None, None, :]  # 1 = padding
            x = self.embedding(ids) * np.sqrt(self.d_model)
            x += ops.cast(self.pos_encoding[:, : ops.shape(ids)[1]], self.compute_dtype)
            x = self.dropout(x, training=training)
            for layer in self.enc_layers:
                x = layer(x, mask, training=training)
            return self.classifier(x)

    return Encoder


def test_keras_encoder_example(tmp_path):
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    Encoder = keras_encoder_class()
    kwargs = dict(num_layers=2, d_model=32, num_heads=4, dff=64, vocab_size=50, n_classes=6)
    keras.utils.set_random_seed(3)
    model = Encoder(**kwargs)
    rng = np.random.default_rng(0)
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True)
    # model.fit also saves the optimizer's state (an int64 iteration count) in the .weights.h5: skipped, never read
    model.fit(rng.integers(1, 50, size=(8, 12)), rng.integers(0, 6, size=(8, 12)), epochs=2, batch_size=4, verbose=0)
    path = tmp_path / "model.weights.h5"
    model.save_weights(path)

    loaded = convert(tmp_path, path, EXAMPLES / "keras_encoder.toml")
    assert (loaded.config.layer_norm_eps, loaded.config.num_encoder_layers, loaded.config.tgt_vocab_size) == (
        1e-6, 2, 6)
    src = rn.sample_ids(loaded.config, batch=3, length=20, vocab_size=50, seed=3)
    logits32 = np.asarray(model(src))
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        model64 = Encoder(**kwargs)
        model64(src)
        model64.set_weights([w.astype(np.float64) for w in model.get_weights()])
        logits64 = np.asarray(model64(src))
    finally:
        keras.config.set_dtype_policy(previous)
    assert logits64.dtype == np.float64
    reference_errors(loaded.config, loaded.weights, src, logits32, logits64)

    back = tmp_path / "back.weights.h5"  # canonical -> the model's own .weights.h5 (--to-layout)
    assert main(["--quiet", "convert", str(tmp_path / "ported.safetensors"), str(back), "--to-layout",
                 str(EXAMPLES / "keras_encoder.toml")]) == 0
    fresh = Encoder(**kwargs)
    fresh(src)
    fresh.load_weights(back)
    assert all(np.array_equal(a, b) for a, b in zip(fresh.get_weights(), model.get_weights()))


# --- bad layout files: exit 2, one line naming the problem, nothing written ------------------------------------------

TORCH_LAYOUT = (EXAMPLES / "torch_encoder.toml").read_text()
W_Q = '"layers.{i}.attn.W_Q.weight"   = "encoder.layers.{i}.self_attn.q.kernel transpose"'
FFN1 = '"layers.{i}.ffn.0.weight"      = "encoder.layers.{i}.ffn.linear1.kernel transpose"'
BAD_LAYOUTS = {
    "syntax-error": (TORCH_LAYOUT.replace('"src_embed.embedding"', '"src_embed.embedding'),
                     "line 12, column"),
    "unknown-transform": (TORCH_LAYOUT.replace(W_Q, W_Q.replace("transpose", "transposed")),
                          "unknown transform 'transposed'"),
    "pattern-matches-nothing": (TORCH_LAYOUT + '"blocks.{i}.attn.W_Q.weight" = "decoder.layers.{i}.norm1.gamma"\n',
                                "pattern 'blocks.{i}.attn.W_Q.weight' matches no key"),
    "key-matched-twice": (TORCH_LAYOUT + '"layers.0.attn.W_Q.weight" = "encoder.layers.0.self_attn.q.kernel"\n',
                          "'encoder.layers.0.self_attn.q.kernel' is targeted twice, by line 14 "
                          "('layers.{i}.attn.W_Q.weight') and line 32 ('layers.0.attn.W_Q.weight')"),
    "unmapped-key": (TORCH_LAYOUT.replace(W_Q + "\n", ""), "not in the layout: 'layers.0.attn.W_Q.weight'"),
    "shape-mismatch": (TORCH_LAYOUT.replace(FFN1, FFN1.replace(" transpose", "")),
                       "layers.0.ffn.0.weight has shape (64, 32), the config implies (32, 64)"),
    "no-num-heads": (TORCH_LAYOUT.replace("num_heads = 4", ""), "the weights do not tell num_heads: state them"),
    "unstated-settings": (TORCH_LAYOUT.replace('activation = "relu"', "").replace("layer_norm_eps = 1e-5", ""),
                          "the weights do not tell activation, layer_norm_eps: state them in the layout's [config]"),
    "unfilled-config": (TORCH_LAYOUT.replace("num_heads = 4", 'num_heads = "?"').replace("pad_id = 0", 'pad_id = "?"'),
                        ':3: [config] num_heads, pad_id still "?" (from the scaffold)'),
    "ignore-a-trained-bias": (TORCH_LAYOUT.replace('"output.bias"', '"- ignore"'),
                              "1 tensor(s) marked ignore hold nonzero values, so dropping them would change the "
                              "model: classifier.bias (shape (7,), max |x|"),
    "sinusoid-in-the-wrong-layout": (TORCH_LAYOUT.replace("pad_id = 0", 'pad_id = 0\nsinusoid_layout = "concatenated"'),
                                     "pos.pe (64, 32) is not the sinusoid table the model computes: against the "
                                     "concatenated table (read as (L, D) = (64, 32)), row 0 differs by 1"),
    "unknown-field": (TORCH_LAYOUT.replace("num_heads = 4", "num_head = 4"), "unknown field(s) ['num_head']"),
    "unfinished-scaffold": (TORCH_LAYOUT.replace('"src_embed.embedding"', '"?"'), "'embed.weight' is not mapped"),
}


@pytest.mark.parametrize("case", list(BAD_LAYOUTS), ids=list(BAD_LAYOUTS))
def test_bad_layout_exits_2_with_one_line(case, torch_encoder_file, tmp_path, capsys):
    *_, path = torch_encoder_file
    text, expected = BAD_LAYOUTS[case]
    layout = tmp_path / "bad.toml"
    layout.write_text(text)
    out = tmp_path / "out.safetensors"
    assert main(["convert", "--layout", str(layout), str(path), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == [layout]


def test_fused_split_that_does_not_divide(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    state = lightning_encoder_classes()(vocab=40, model_dim=32, num_classes=5, num_heads=4, num_layers=1).state_dict()
    state["transformer.layers.0.self_attn.qkv_proj.weight"] = torch.zeros(95, 32)
    path = tmp_path / "odd.pt"
    torch.save(state, path)
    out = tmp_path / "out.safetensors"
    assert main(["convert", "--layout", str(EXAMPLES / "lightning_encoder.toml"), str(path), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fused q/k/v axis of 95 does not divide by 3" in err, err
    assert not out.exists()


def test_scaffold_guesses_the_plain_pytorch_encoder(torch_encoder_file, tmp_path, capsys):
    """The scaffold lists every key; for the plain encoder every guess is right: adding num_heads is all it takes."""
    model, build, path = torch_encoder_file
    assert main(["layout", "--scaffold", str(path)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith('"')]
    assert len(rows) == 20 and not any('= "?"' in row for row in rows), text
    layout = tmp_path / "scaffold.toml"
    layout.write_text(fill_scaffold(text, num_heads=4, attention_scale="head", activation="relu", norm_first=False,
                                    layer_norm_eps=1e-5,
                                    scale_embedding=True, pad_id=0))
    loaded = convert(tmp_path, path, layout)
    src = rn.sample_ids(loaded.config, batch=2, length=10, vocab_size=50, seed=4)
    reference_errors(loaded.config, loaded.weights, src, *torch_logits(model, src, build))


def test_a_builtin_table_is_a_layout_file(tmp_path):
    """The Hugging Face GPT2Model table, written as a layout file, is the same table; and reads a GPT2Model's
    tensors (saved under their own names) to the same canonical weights."""
    from safetensors.numpy import save_file

    from transformer_parity.layouts import hf_gpt2, table

    layout = user.load(EXAMPLES / "hf_gpt2.toml")
    assert layout.table == hf_gpt2.BACKBONE
    config = rn.TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, num_heads=2,
                                  num_encoder_layers=0, num_decoder_layers=2, d_ff=64, max_len=24,
                                  activation="gelu_tanh", norm_first=True, final_norm=True, positional="learned",
                                  scale_embedding=False, output_projection=False, pad_id=0, output_bias=False)
    weights = rn.init_weights(config, seed=5)
    state = table.export_state(config, weights, hf_gpt2.table(config, ""))
    path = tmp_path / "gpt2.safetensors"
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(path))
    got, imported, _ = user.import_with_layout(path, EXAMPLES / "hf_gpt2.toml")
    assert got == config
    assert all(np.array_equal(imported[k], weights[k]) for k in weights)


def test_qkv_placeholder_in_a_key_pattern(tmp_path):
    """`{qkv}` in a key pattern covers q_proj/k_proj/v_proj in one line; a safetensors file round-trips exactly."""
    from safetensors.numpy import save_file

    from transformer_parity.layouts import table

    config = rn.TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=8, num_heads=2, num_encoder_layers=0,
                                  num_decoder_layers=2, d_ff=16, max_len=12, positional="learned", norm_first=True,
                                  final_norm=True, tie_embeddings=True, output_bias=False)
    text = """[config]
num_heads = 2
attention_scale = "head"
activation = "relu"
norm_first = true
layer_norm_eps = 1e-5
scale_embedding = true
pad_id = 0
position_offset = 0
tie_embeddings = true
[weights]
"tok.weight" = "tgt_embed.embedding"
"pos.weight" = "tgt_pos.embedding"
"blocks.{i}.{qkv}_proj.weight" = "decoder.layers.{i}.self_attn.{qkv}.kernel transpose"
"blocks.{i}.{qkv}_proj.bias" = "decoder.layers.{i}.self_attn.{qkv}.bias"
"blocks.{i}.o_proj.weight" = "decoder.layers.{i}.self_attn.o.kernel transpose"
"blocks.{i}.o_proj.bias" = "decoder.layers.{i}.self_attn.o.bias"
"blocks.{i}.ln1.weight" = "decoder.layers.{i}.norm1.gamma"
"blocks.{i}.ln1.bias" = "decoder.layers.{i}.norm1.beta"
"blocks.{i}.up.weight" = "decoder.layers.{i}.ffn.linear1.kernel transpose"
"blocks.{i}.up.bias" = "decoder.layers.{i}.ffn.linear1.bias"
"blocks.{i}.down.weight" = "decoder.layers.{i}.ffn.linear2.kernel transpose"
"blocks.{i}.down.bias" = "decoder.layers.{i}.ffn.linear2.bias"
"blocks.{i}.ln2.weight" = "decoder.layers.{i}.norm3.gamma"
"blocks.{i}.ln2.bias" = "decoder.layers.{i}.norm3.beta"
"ln_f.weight" = "decoder.final_norm.gamma"
"ln_f.bias" = "decoder.final_norm.beta"
"""
    layout = tmp_path / "decoder.toml"
    layout.write_text(text)
    weights = rn.init_weights(config, seed=6)
    save_file(table.export_state(config, weights, user.load(layout).table), str(tmp_path / "model.safetensors"))
    got, imported, notes = user.import_with_layout(tmp_path / "model.safetensors", layout)
    assert got == config and all(np.array_equal(imported[k], weights[k]) for k in weights)
