"""The NumPy reference checked against the paper's formulas written out element by element, and its contract
(config, schema, seeded init, safetensors files) checked for the properties the other backends rely on."""

import hashlib
import json
import math
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

import reference_numpy as rn
from reference_numpy import ops

from .conftest import TINY, VARIANTS, weights_for

RNG = np.random.default_rng(1234)


# --- config ----------------------------------------------------------------------------------------------------------

def test_presets_match_the_paper():
    base, big = rn.TransformerConfig.preset("base"), rn.TransformerConfig.preset("big")
    assert (base.d_model, base.num_heads, base.num_encoder_layers, base.num_decoder_layers, base.d_ff, base.dropout) \
        == (512, 8, 6, 6, 2048, 0.1)
    assert (big.d_model, big.num_heads, big.num_encoder_layers, big.num_decoder_layers, big.d_ff, big.dropout) \
        == (1024, 16, 6, 6, 4096, 0.3)
    assert base.head_dim == big.head_dim == 64


@pytest.mark.parametrize("name", list(VARIANTS))
def test_config_json_round_trip(name):
    config = VARIANTS[name]
    assert rn.TransformerConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("changes, message", [
    ({"d_model": 30, "num_heads": 4}, r"d_model=30 is not divisible by num_heads=4"),
    ({"num_heads": 0}, r"num_heads must be an integer >= 1, received 0"),
    ({"d_ff": 2.5}, r"d_ff must be an integer >= 1, received 2.5"),
    ({"num_decoder_layers": -1}, r"num_decoder_layers must be an integer >= 0, received -1"),
    ({"dropout": 1.0}, r"dropout must be a number in \[0, 1\), received 1.0"),
    ({"layer_norm_eps": 0}, r"layer_norm_eps must be a positive finite number, received 0"),
    ({"layer_norm_eps": float("inf")}, r"layer_norm_eps must be a positive finite number, received inf"),
    ({"num_encoder_layers": 0, "num_decoder_layers": 0}, r"at least one layer"),
    ({"share_embeddings": True}, r"share_embeddings needs an encoder-decoder model with src_vocab_size == "),
    ({"position_offset": 2}, r"position_offset=2 needs positional='learned'"),
    ({"num_encoder_layers": 0, "type_vocab_size": 2}, r"type_vocab_size and pooler belong to an encoder"),
    ({"output_projection": False, "tie_embeddings": True}, r"output_projection=False \(a bare backbone\)"),
    ({"output_bias": 1}, r"output_bias must be a bool or None \(= same as bias\), received 1"),
    ({"activation": "swish"}, r"activation must be one of relu, gelu, gelu_tanh, silu, received 'swish'"),
    ({"positional": "relative"}, r"positional must be one of sinusoidal, learned, rope, none, received 'relative'"),
    ({"sinusoid_layout": "paired"}, r"sinusoid_layout must be one of interleaved, concatenated, received 'paired'"),
    ({"d_model": 15, "num_heads": 5}, r"sinusoidal positions need an even d_model, received d_model=15"),
    ({"pad_id": 48}, r"pad_id=48 is outside the source vocabulary"),
    ({"norm_first": 1}, r"norm_first must be a bool, received 1"),
    ({"num_decoder_layers": 0, "tie_embeddings": True}, r"encoder-only model can tie its head .* 40 and 48"),
], ids=lambda v: "+".join(v) if isinstance(v, dict) else "")
def test_config_rejects_bad_values_naming_them(changes, message):
    with pytest.raises(ValueError, match=message):
        TINY.replace(**changes)


def test_config_rejects_unknown_fields_and_presets():
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['heads'\]"):
        rn.TransformerConfig.from_dict({"heads": 8})
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['heads'\]"):
        TINY.replace(heads=8)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        rn.TransformerConfig.preset("huge")
    with pytest.raises(ValueError, match="not valid JSON"):
        rn.TransformerConfig.from_json("{d_model: 3")


# --- schema and init ---------------------------------------------------------------------------------------------

def test_schema_names_and_shapes_for_base():
    shapes = rn.parameter_shapes(rn.TransformerConfig.preset("base"))
    assert shapes["encoder.layers.0.self_attn.q.kernel"] == (512, 512)
    assert shapes["decoder.layers.5.cross_attn.o.bias"] == (512,)
    assert shapes["decoder.layers.0.ffn.linear1.kernel"] == (512, 2048)
    assert shapes["decoder.layers.0.ffn.linear2.kernel"] == (2048, 512)
    assert shapes["output.kernel"] == (512, 37000)
    assert len(shapes) == 2 + 6 * 16 + 6 * 26 + 2
    attention, ffn, norm = 4 * (512 * 512 + 512), 512 * 2048 + 2048 + 2048 * 512 + 512, 2 * 512
    encoder_layer, decoder_layer = attention + ffn + 2 * norm, 2 * attention + ffn + 3 * norm
    # three 37000 x 512 tables (the paper shares one, ~65M parameters in all) and the output bias
    expected = 3 * 37000 * 512 + 37000 + 6 * encoder_layer + 6 * decoder_layer
    assert sum(math.prod(s) for s in shapes.values()) == expected == 101_007_496


@pytest.mark.parametrize("name", list(VARIANTS))
def test_schema_follows_the_variant(name):
    config = VARIANTS[name]
    names = set(rn.parameter_shapes(config))
    assert ("src_pos.embedding" in names) == (config.positional == "learned")
    assert ("output.kernel" in names) == (not config.tie_embeddings)
    assert ("encoder.final_norm.gamma" in names) == config.final_norm
    assert any(n.startswith("decoder.") for n in names) == config.is_encoder_decoder
    assert any(n.endswith(".bias") and "_embed." not in n for n in names) == config.bias
    assert ("src_embed.bias" in names) == config.embed_bias


def test_init_is_seeded_and_per_parameter():
    a, b = rn.init_weights(TINY, 0), rn.init_weights(TINY, 0)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    c = rn.init_weights(TINY, 1)
    assert not np.array_equal(a["encoder.layers.0.self_attn.q.kernel"], c["encoder.layers.0.self_attn.q.kernel"])
    # adding a decoder layer leaves every existing parameter's values unchanged
    deeper = rn.init_weights(TINY.replace(num_decoder_layers=3), 0)
    assert all(np.array_equal(a[k], deeper[k]) for k in a)


def test_init_is_bit_identical_across_machines():
    """A golden digest: PCG64 uniform draws and IEEE-exact scaling are platform-independent, so any machine with
    the locked NumPy produces these exact bytes for seed 0."""
    weights = rn.init_weights(TINY, 0)
    digest = hashlib.sha256(b"".join(weights[k].tobytes() for k in sorted(weights))).hexdigest()
    assert digest == GOLDEN_TINY_SEED0_SHA256


GOLDEN_TINY_SEED0_SHA256 = "c095b9619e92fef70e36a55978d04d557dfacbef4f91346673556125e1302757"


def test_init_statistics():
    config = rn.TransformerConfig.preset("base")
    w = rn.init_weights(config, 0)
    kernel = w["encoder.layers.0.ffn.linear1.kernel"]
    assert abs(kernel.std() - math.sqrt(2 / (512 + 2048))) < 1e-3  # Glorot-uniform
    assert abs(w["src_embed.embedding"].std() * math.sqrt(512) - 1) < 1e-2  # unit variance after sqrt(d) scale
    assert not w["encoder.layers.0.self_attn.q.bias"].any() and (w["encoder.layers.0.norm1.gamma"] == 1).all()


def test_validate_weights_names_every_problem():
    weights = rn.init_weights(TINY, 0)
    del weights["encoder.layers.0.self_attn.q.kernel"]
    weights["encoder.layers.0.self_attn.qq.kernel"] = np.zeros((32, 32), np.float32)
    weights["decoder.layers.1.ffn.linear1.kernel"] = np.zeros((64, 32), np.float32)
    with pytest.raises(ValueError) as err:
        rn.validate_weights(TINY, weights)
    text = str(err.value)
    assert "missing 1 parameter(s): encoder.layers.0.self_attn.q.kernel" in text
    assert "unexpected 1 parameter(s): encoder.layers.0.self_attn.qq.kernel" in text
    assert "decoder.layers.1.ffn.linear1.kernel has shape (64, 32), expected (32, 64)" in text


def test_a_config_that_misshapes_every_tensor_gets_one_short_line():
    """`--set d_model=...` against a file misshapes nearly every tensor; the message names the first few and counts
    the rest, as it does for missing and unexpected names (it had listed all of them, kilobytes on one line)."""
    with pytest.raises(ValueError) as err:
        rn.validate_weights(TINY.replace(d_model=64, num_heads=4), rn.init_weights(TINY, 0))
    text = str(err.value)
    count = len([name for name, shape in rn.parameter_shapes(TINY.replace(d_model=64, num_heads=4)).items()
                 if rn.init_weights(TINY, 0)[name].shape != shape])
    assert f"{count} with the wrong shape: src_embed.embedding has shape (48, 32), expected (48, 64); " in text
    assert text.endswith(f"; ... ({count - 6} more)") and "\n" not in text and len(text) < 600


def test_weights_of_another_config_are_rejected():
    with pytest.raises(ValueError, match=r"src_embed.embedding has shape \(48, 32\), expected \(50, 32\)"):
        rn.Transformer(TINY.replace(src_vocab_size=50), rn.init_weights(TINY, 0))
    with pytest.raises(ValueError, match=r"missing .* src_pos.embedding"):
        rn.Transformer(TINY.replace(positional="learned"), rn.init_weights(TINY, 0))


# --- safetensors files ---------------------------------------------------------------------------------------------

def test_save_load_round_trip_is_bit_identical(tmp_path):
    config = VARIANTS["learned-pos"]
    weights = weights_for(config)
    path = rn.save_weights(tmp_path / "m.safetensors", config, weights)
    loaded_config, loaded = rn.load_weights(path)
    assert loaded_config == config
    assert loaded.keys() == weights.keys()
    assert all(loaded[k].dtype == weights[k].dtype and np.array_equal(loaded[k], weights[k]) for k in weights)
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temporary file left behind


def test_save_refuses_to_overwrite(tmp_path):
    path = rn.save_weights(tmp_path / "m.safetensors", TINY, rn.init_weights(TINY, 0))
    with pytest.raises(FileExistsError, match="exists; pass overwrite=True"):
        rn.save_weights(path, TINY, rn.init_weights(TINY, 1))
    rn.save_weights(path, TINY, rn.init_weights(TINY, 1), overwrite=True)


@pytest.mark.parametrize("damage, message", [
    (lambda raw: b"", "only 0 bytes"),
    (lambda raw: raw[: len(raw) // 2], "not a valid safetensors file"),
    (lambda raw: (10 ** 9).to_bytes(8, "little") + raw[8:], "header length 1000000000 exceeds the file size"),
    (lambda raw: raw[:8] + b"[" + raw[9:], "not a valid safetensors file"),
], ids=["empty", "truncated", "huge-header-length", "bad-header-json"])
def test_load_rejects_damaged_files(tmp_path, damage, message):
    path = rn.save_weights(tmp_path / "m.safetensors", TINY, rn.init_weights(TINY, 0))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=message):
        rn.load_weights(path)


def test_load_checks_the_config(tmp_path):
    path = rn.save_weights(tmp_path / "m.safetensors", TINY, rn.init_weights(TINY, 0))
    with pytest.raises(ValueError, match=r"does not match the one stored .*'num_heads': \(4, 2\)"):
        rn.load_weights(path, TINY.replace(num_heads=2))
    with pytest.raises(FileNotFoundError, match="no such file"):
        rn.load_weights(tmp_path / "absent.safetensors")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        rn.load_weights(tmp_path)


def test_reference_import_pulls_in_numpy_only():
    code = ("import sys, reference_numpy; heavy = {'torch', 'tensorflow', 'keras', 'safetensors', 'jax'}; "
            "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the math against the paper, element by element ------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
def test_sinusoidal_positions_follow_section_3_5(layout):
    length, d = 17, 12
    table = rn.sinusoidal_positions(length, d, layout)
    for pos in range(length):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            sin_col, cos_col = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, d // 2 + i)
            assert table[pos, sin_col] == pytest.approx(math.sin(angle), abs=1e-12)
            assert table[pos, cos_col] == pytest.approx(math.cos(angle), abs=1e-12)


def _loop_attention(q, k, v, mask):
    """Equation (1) one query row at a time, with the documented rule for rows that may attend to nothing."""
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for idx in np.ndindex(*q.shape[:-1]):
        *bh, i = idx
        allowed = [j for j in range(k.shape[-2]) if mask is None or mask[tuple(bh) + (i, j)]]
        if not allowed:
            continue
        scores = np.array([q[idx] @ k[tuple(bh) + (j,)] / math.sqrt(q.shape[-1]) for j in allowed])
        p = np.exp(scores - scores.max())
        out[idx] = sum(pj / p.sum() * v[tuple(bh) + (j,)] for pj, j in zip(p, allowed))
    return out


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "padding+causal", "fully-masked-rows"])
def test_attention_matches_equation_1(mask_kind):
    b, h, tq, tk, dk = 2, 3, 5, 5, 4
    q, k, v = (RNG.standard_normal((b, h, t, dk)) for t in (tq, tk, tk))
    key_mask = np.array([[True] * 5, [True, True, True, False, False]])
    mask = {
        "none": None,
        "padding": rn.attention_mask(key_mask, tq),
        "causal": rn.causal_mask(tq, tk)[None, None],
        "padding+causal": rn.attention_mask(key_mask, tq, causal=True),
        "fully-masked-rows": rn.attention_mask(np.array([[False] * 5, [True, False, False, False, False]]), tq),
    }[mask_kind]
    out, weights = rn.scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(out, _loop_attention(q, k, v, None if mask is None else np.broadcast_to(
        mask, (b, h, tq, tk))), rtol=0, atol=1e-13)
    if mask is not None:
        assert not weights[~np.broadcast_to(mask, weights.shape)].any()  # masked keys get exactly zero weight
    if mask_kind == "fully-masked-rows":
        assert not out[0].any() and not weights[0].any()  # no NaN, no uniform average over padding


def test_causal_mask_with_fewer_queries_than_keys():
    """Incremental decoding: 2 new queries at positions 3 and 4 over 5 keys."""
    assert rn.causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True] * 5]


def test_layer_norm_and_activations():
    x = RNG.standard_normal((3, 7))
    gamma, beta = RNG.standard_normal(7), RNG.standard_normal(7)
    expected = [(row - row.mean()) / math.sqrt(row.var() + 1e-5) * gamma + beta for row in x]
    np.testing.assert_allclose(ops.layer_norm(x, gamma, beta, 1e-5), expected, rtol=0, atol=1e-14)
    np.testing.assert_allclose(ops.gelu(x), [[v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in row] for row in x],
                               rtol=0, atol=1e-15)
    assert ops.gelu(x.astype(np.float32)).dtype == np.float32


def test_multi_head_attention_is_per_head_attention_concatenated():
    """Section 3.2.2 written out: head h uses columns h*d_k:(h+1)*d_k of each projection."""
    config = TINY
    weights = weights_for(config, dtype=np.float64)
    name = "decoder.layers.0.cross_attn"
    x_q, x_kv = RNG.standard_normal((2, 3, 32)), RNG.standard_normal((2, 6, 32))
    out, _ = rn.MultiHeadAttention(config, weights, name)(x_q, x_kv)
    w = {p: (weights[f"{name}.{p}.kernel"], weights[f"{name}.{p}.bias"]) for p in "qkvo"}
    heads = []
    for h in range(config.num_heads):
        cols = slice(h * config.head_dim, (h + 1) * config.head_dim)
        q, k, v = ((x @ w[p][0][:, cols] + w[p][1][cols])[:, None] for p, x in zip("qkv", (x_q, x_kv, x_kv)))
        heads.append(_loop_attention(q, k, v, None)[:, 0])
    expected = np.concatenate(heads, axis=-1) @ w["o"][0] + w["o"][1]
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
def test_encoder_layer_residual_wiring(norm_first):
    config = TINY.replace(norm_first=norm_first)
    weights = weights_for(config, dtype=np.float64)
    layer = rn.EncoderLayer(config, weights, "encoder.layers.1")
    x = RNG.standard_normal((2, 4, 32))
    mask = rn.attention_mask(np.ones((2, 4), bool), 4)
    attn = lambda y: layer.self_attn(y, y, mask)[0]
    if norm_first:
        h = x + attn(layer.norm1(x))
        expected = h + layer.ffn(layer.norm2(h))
    else:
        h = layer.norm1(x + attn(x))
        expected = layer.norm2(h + layer.ffn(h))
    np.testing.assert_allclose(layer(x, mask), expected, rtol=0, atol=1e-14)


def test_trace_names_follow_execution_order():
    config = TINY.replace(final_norm=True)
    src, tgt = rn.sample_batch(config, 2, 5, 4)
    names = list(rn.Transformer(config, weights_for(config)).trace(src, tgt, attention_weights=True))
    assert names[:5] == ["encoder.embed", "encoder.layers.0.self_attn.weights", "encoder.layers.0.self_attn",
                         "encoder.layers.0.ffn", "encoder.layers.0"]
    assert names[names.index("decoder.embed"):][:7] == [
        "decoder.embed", "decoder.layers.0.self_attn.weights", "decoder.layers.0.self_attn",
        "decoder.layers.0.cross_attn.weights", "decoder.layers.0.cross_attn", "decoder.layers.0.ffn",
        "decoder.layers.0"]
    assert names[-3:] == ["decoder.layers.1", "decoder.final_norm", "logits"]


def test_decoder_is_causal():
    """Changing a later target token never changes an earlier position's logits."""
    config = TINY
    model = rn.Transformer(config, weights_for(config))
    src, tgt = rn.sample_batch(config, 2, 6, 5)
    changed = tgt.copy()
    changed[:, 3] = (changed[:, 3] % (config.tgt_vocab_size - 1)) + 1
    a, b = model(src, tgt), model(src, changed)
    np.testing.assert_array_equal(a[:, :3], b[:, :3])
    assert not np.allclose(a[:, 3:], b[:, 3:])


def test_padding_is_invisible_to_real_tokens():
    """Appending padding to the source leaves every real position's output unchanged (up to rounding)."""
    config = TINY
    model = rn.Transformer(config, weights_for(config))
    src, tgt = rn.sample_batch(config, 1, 6, 5)
    padded = np.concatenate([src, np.full((1, 4), config.pad_id)], axis=1)
    np.testing.assert_allclose(model(padded, tgt), model(src, tgt), rtol=0, atol=1e-13)


def test_explicit_masks_equal_derived_ones():
    config = TINY
    model = rn.Transformer(config, weights_for(config))
    src, tgt = rn.sample_batch(config, 2, 6, 5)
    np.testing.assert_array_equal(
        model(src, tgt), model(src, tgt, src_mask=src != config.pad_id, tgt_mask=tgt != config.pad_id))


def test_float32_reference_stays_near_float64():
    config = TINY
    weights = weights_for(config)
    src, tgt = rn.sample_batch(config, 2, 9, 7)
    f64, f32 = rn.Transformer(config, weights).trace(src, tgt), rn.Transformer(config, weights, np.float32).trace(
        src, tgt)
    assert all(f32[k].dtype == np.float32 and f64[k].dtype == np.float64 for k in f64)
    assert max(np.abs(f32[k] - f64[k]).max() for k in f64) < 1e-5


# --- bad input ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("src, tgt, error, message", [
    (np.zeros((2, 3, 1), np.int64), np.ones((2, 3), np.int64), ValueError,
     r"src_ids must have shape \(batch, length\), received shape \(2, 3, 1\)"),
    (np.ones((2, 3), np.float32), np.ones((2, 3), np.int64), TypeError, "src_ids must hold integer token ids"),
    (np.ones((2, 3), np.int64), np.full((2, 3), 40), ValueError, r"tgt_ids holds token id 40, outside .*\[0, 40\)"),
    (np.full((2, 3), -1), np.ones((2, 3), np.int64), ValueError, r"src_ids holds token id -1"),
    (np.ones((2, 65), np.int64), np.ones((2, 3), np.int64), ValueError, r"length 65, longer than max_len=64"),
    (np.ones((2, 3), np.int64), np.ones((3, 3), np.int64), ValueError, r"different batch sizes: 2 and 3"),
    (np.ones((2, 0), np.int64), np.ones((2, 3), np.int64), ValueError, r"must be non-empty"),
    (np.ones((2, 3), np.int64), None, ValueError, r"needs tgt_ids, received None"),
], ids=["rank", "dtype", "vocab", "negative", "max-len", "batch", "empty", "no-target"])
def test_bad_ids_are_named(src, tgt, error, message):
    model = rn.Transformer(TINY, rn.init_weights(TINY, 0))
    with pytest.raises(error, match=message):
        model(src, tgt)


def test_bad_masks_are_named():
    model = rn.Transformer(TINY, rn.init_weights(TINY, 0))
    ids = np.ones((2, 3), np.int64)
    with pytest.raises(TypeError, match="src_mask must be a bool array .* received dtype int64"):
        model(ids, ids, src_mask=np.ones((2, 3), np.int64))
    with pytest.raises(ValueError, match=r"tgt_mask must have the shape of the ids \(2, 3\), received \(2, 1\)"):
        model(ids, ids, tgt_mask=np.ones((2, 1), bool))


def test_encoder_only_refuses_targets():
    config = VARIANTS["encoder-only"]
    model = rn.Transformer(config, rn.init_weights(config, 0))
    src, _ = rn.sample_batch(config, 2, 5)
    assert model(src).shape == (2, 5, 7)
    with pytest.raises(ValueError, match="encoder-only model .* takes source ids alone"):
        model(src, src)


def test_config_json_is_plain():
    assert json.loads(TINY.to_json())["d_model"] == 32


def test_save_weights_respects_the_umask_and_refuses_special_files(tmp_path):
    weights = rn.init_weights(rn.TransformerConfig.preset("tiny"), seed=0)
    config = rn.TransformerConfig.preset("tiny")
    old = os.umask(0o022)
    try:
        rn.save_weights(tmp_path / "w.safetensors", config, weights)
    finally:
        os.umask(old)
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == 0o644
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "w.safetensors")
    for name in ("fifo", "link"):
        with pytest.raises(ValueError, match="is not a regular file"):
            rn.save_weights(tmp_path / name, config, weights, overwrite=True)
    assert (tmp_path / "link").is_symlink() and stat.S_ISFIFO((tmp_path / "fifo").stat().st_mode)
