"""The canonical-model settings that hand-written models need: `pad_id=None` (no pad token), `attention_scale`,
`embed_bias` and `head_order`. Each is checked three ways: the config (validation, JSON, `--set`), the float64
reference against an independent PyTorch computation of the same thing, and both twins against the reference in
float32 and float64, every sublayer, on odd sizes with perturbed biases and norms and token id 0 in the input."""

import math

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import cli, formats
from transformer_parity.config_fields import parse_fields

from .conftest import weights_for
from .test_model_parity import assert_traces_match, floor_trace, reference_trace
from .tolerances import atol

# Odd sizes: 3 heads of 12, vocabularies 53 and 41, d_ff 50.
BASE = rn.TransformerConfig(src_vocab_size=53, tgt_vocab_size=41, d_model=36, num_heads=3, num_encoder_layers=2,
                            num_decoder_layers=2, d_ff=50, max_len=23, dropout=0.0)
HEAD = dict(head_transform=True, head_order="dense-norm-activation")

# Every family with all four settings together (and the neighbours they touch: shared and tied tables, a pad id
# other than 0, learned positions, pre-LN).
FEATURES = {
    "encoder-decoder": BASE.replace(pad_id=None, attention_scale="model", embed_bias=True, **HEAD),
    "decoder-only": BASE.replace(num_encoder_layers=0, norm_first=True, final_norm=True, positional="learned",
                                 activation="gelu", pad_id=None, attention_scale=0.21, embed_bias=True, **HEAD),
    "encoder-only": BASE.replace(num_decoder_layers=0, tgt_vocab_size=7, scale_embedding=False, pad_id=5,
                                 attention_scale="none", embed_bias=True, **HEAD),
    "shared-tied": BASE.replace(tgt_vocab_size=53, share_embeddings=True, tie_embeddings=True, pad_id=2,
                                attention_scale="model", embed_bias=True, **HEAD),
}


def _inputs(config, batch=3, src_len=11, tgt_len=8, seed=4):
    src, tgt = rn.sample_batch(config, batch, src_len, tgt_len, seed=seed)
    if config.pad_id != 0:
        assert (src == 0).any(axis=1).all()  # id 0 in every row, as an ordinary token
    return src, tgt


# --- config ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"attention_scale": "sqrt"}, r"attention_scale must be one of head, model, none \(1/sqrt\(d_head\), "
                                  r"1/sqrt\(d_model\), 1\) or a positive finite number, received 'sqrt'"),
    ({"attention_scale": 0}, r"attention_scale .* received 0"),
    ({"attention_scale": -0.5}, r"attention_scale .* received -0.5"),
    ({"attention_scale": float("nan")}, r"attention_scale .* received nan"),
    ({"attention_scale": float("inf")}, r"attention_scale .* received inf"),
    ({"attention_scale": True}, r"attention_scale .* received True"),
    ({"attention_scale": "0.125"}, r"attention_scale .* received '0.125'"),
    ({"embed_bias": 1}, r"embed_bias must be a bool, received 1"),
    ({"head_order": "norm-dense"}, r"head_order must be one of dense-activation-norm, dense-norm-activation, "
                                   r"received 'norm-dense'"),
    ({"head_order": "dense-norm-activation"}, r"head_order='dense-norm-activation' needs head_transform=True"),
    ({"pad_id": -1}, r"pad_id must be an integer >= 0 or None, received -1"),
    ({"pad_id": "0"}, r"pad_id must be an integer >= 0 or None, received '0'"),
    ({"pad_id": 53}, r"pad_id=53 is outside the source vocabulary"),
], ids=lambda v: "+".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "")
def test_config_rejects_bad_values_naming_them(changes, message):
    with pytest.raises(ValueError, match=message):
        BASE.replace(**changes)


@pytest.mark.parametrize("scale, factor", [("head", 1 / math.sqrt(12)), ("model", 1 / 6), ("none", 1.0),
                                           (0.21, 0.21), (2, 2.0)])
def test_attention_scale_factor(scale, factor):
    config = BASE.replace(attention_scale=scale)
    assert config.attention_scale_factor == pytest.approx(factor, rel=1e-15)
    assert type(config.attention_scale) is (str if isinstance(scale, str) else float)


@pytest.mark.parametrize("name", list(FEATURES))
def test_config_json_round_trip(name):
    config = FEATURES[name]
    assert rn.TransformerConfig.from_json(config.to_json()) == config
    assert rn.TransformerConfig.from_dict({**BASE.to_dict(), "attention_scale": 1}).attention_scale == 1.0


def test_set_gives_each_field_its_type():
    fields = parse_fields(None, ["attention_scale=model", "embed_bias=true", "head_order=dense-norm-activation",
                                     "pad_id=none"])
    assert fields == {"attention_scale": "model", "embed_bias": True, "head_order": "dense-norm-activation",
                      "pad_id": None}
    assert parse_fields(None, ["attention_scale=0.125", "pad_id=3"]) == {"attention_scale": 0.125, "pad_id": 3}
    assert parse_fields(None, ["output_bias=none"]) == {"output_bias": None}  # the optional field before these
    with pytest.raises(cli.UsageError, match=r"--set pad_id=x: expected int or none"):
        parse_fields(None, ["pad_id=x"])


def test_schema_has_a_bias_per_embedding_side():
    shapes = rn.parameter_shapes(FEATURES["shared-tied"])
    assert shapes["src_embed.bias"] == shapes["tgt_embed.bias"] == (36,)
    assert "tgt_embed.embedding" not in shapes  # the table stays shared
    assert [n for n in rn.parameter_shapes(FEATURES["decoder-only"]) if n.endswith("_embed.bias")] == \
        ["tgt_embed.bias"]
    assert not any(n.endswith("_embed.bias") for n in rn.parameter_shapes(BASE))
    init = rn.init_weights(FEATURES["encoder-only"])
    assert not init["src_embed.bias"].any()  # an initial bias is zero, like every other


# --- inputs ---------------------------------------------------------------------------------------------------------

def test_sample_ids_put_id_0_in_every_row_unless_it_is_the_pad_id():
    for pad in (3, None):
        config = BASE.replace(pad_id=pad)
        ids = rn.sample_ids(config, batch=6, length=9, vocab_size=53, seed=2)
        real = rn.padding_mask(ids, pad)
        assert ((ids == 0) & real).any(axis=1).all()
        assert ids.min() >= 0 and ids.max() < 53
        if pad is None:
            assert real.all()  # no pad token: no padding
        else:
            assert not (ids[real] == pad).any() and not real[1:].all(axis=1).any()  # rows 1.. are padded
    zero_pad = rn.sample_ids(BASE, batch=6, length=9, vocab_size=53, seed=2)
    assert not (zero_pad[zero_pad != 0] == 0).any() and (zero_pad == 0).any()  # 0 is padding only
    assert rn.sample_ids(BASE.replace(pad_id=None), 2, 3, vocab_size=1, seed=0).tolist() == [[0, 0, 0]] * 2


# --- the reference against independent computations ------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("scale, expected", [("model", 1 / 6), ("none", 1.0), (0.21, 0.21)])
def test_attention_scale_matches_torch_sdpa_given_that_scale(scale, expected):
    """A decoder's cross-attention with the setting against `F.scaled_dot_product_attention(..., scale=...)` on the
    same projections, and not against the paper's 1/sqrt(d_head)."""
    torch = _torch()
    F = torch.nn.functional
    config = BASE.replace(attention_scale=scale)
    weights = weights_for(config, seed=1, dtype=np.float64)
    rng = np.random.default_rng(0)
    x_q, x_kv = rng.standard_normal((2, 5, 36)), rng.standard_normal((2, 7, 36))
    key_mask = np.ones((2, 7), bool)
    key_mask[1, 4:] = False
    name = "decoder.layers.0.cross_attn"
    actual, _ = rn.MultiHeadAttention(config, weights, name)(x_q, x_kv, key_mask[:, None, None, :])

    def project(x, proj):  # (B, T, 36) -> (B, 3, T, 12)
        y = torch.from_numpy(x) @ torch.from_numpy(weights[f"{name}.{proj}.kernel"]) \
            + torch.from_numpy(weights[f"{name}.{proj}.bias"])
        return y.view(2, -1, 3, 12).transpose(1, 2)

    def attend(factor):
        out = F.scaled_dot_product_attention(project(x_q, "q"), project(x_kv, "k"), project(x_kv, "v"),
                                             attn_mask=torch.from_numpy(key_mask)[:, None, None, :], scale=factor)
        out = out.transpose(1, 2).reshape(2, 5, 36)  # (B, H, Tq, 12) -> (B, Tq, 36)
        return (out @ torch.from_numpy(weights[f"{name}.o.kernel"]) + torch.from_numpy(weights[f"{name}.o.bias"])
                ).numpy()

    np.testing.assert_allclose(actual, attend(expected), rtol=0, atol=atol("float64"))
    assert np.abs(actual - attend(1 / math.sqrt(12))).max() > 1e-3  # the paper's scale is another model


@pytest.mark.parametrize("scale_embedding", [True, False], ids=["scaled", "unscaled"])
def test_embed_bias_is_a_linear_layer_on_one_hot_ids(scale_embedding):
    """`(E[id] + b) (* sqrt(d_model)) + position` is what `nn.Linear(vocab, d_model, bias=True)` computes on one-hot
    vectors (its weight the table transposed), before the scale and the positions."""
    torch = _torch()
    config = BASE.replace(embed_bias=True, positional="learned", scale_embedding=scale_embedding, pad_id=None)
    weights = weights_for(config, seed=2, dtype=np.float64)
    src, tgt = _inputs(config)
    trace = rn.Transformer(config, weights).trace(src, tgt)
    for side, ids, vocab in (("src", src, 53), ("tgt", tgt, 41)):
        linear = torch.nn.Linear(vocab, 36, bias=True).double()
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weights[f"{side}_embed.embedding"].T))  # (36, vocab)
            linear.bias.copy_(torch.from_numpy(weights[f"{side}_embed.bias"]))
            x = linear(torch.nn.functional.one_hot(torch.from_numpy(ids), vocab).double()).numpy()  # (B, T, 36)
        x = x * (math.sqrt(36) if scale_embedding else 1.0) + weights[f"{side}_pos.embedding"][:ids.shape[1]]
        stack = "encoder" if side == "src" else "decoder"
        np.testing.assert_allclose(trace[f"{stack}.embed"], x, rtol=0, atol=1e-12)
    unbiased = rn.Transformer(config.replace(embed_bias=False),
                              {k: v for k, v in weights.items() if not k.endswith("_embed.bias")}).trace(src, tgt)
    assert np.abs(unbiased["encoder.embed"] - trace["encoder.embed"]).max() > 1e-2


def test_dense_norm_activation_head_is_a_sequential_of_torch_layers():
    """An encoder-only model's head `Linear -> LayerNorm -> ReLU -> Linear(out)` on the encoder's output, as
    `nn.Sequential` computes it; BERT's order (the default) on the same weights is another function."""
    torch = _torch()
    nn = torch.nn
    config = BASE.replace(num_decoder_layers=0, tgt_vocab_size=7, head_transform=True,
                          head_order="dense-norm-activation", head_layer_norm_eps=1e-6)
    weights = weights_for(config, seed=3, dtype=np.float64)
    src, _ = _inputs(config)
    trace = rn.Transformer(config, weights).trace(src)
    head = nn.Sequential(nn.Linear(36, 36), nn.LayerNorm(36, eps=1e-6), nn.ReLU(), nn.Linear(36, 7)).double()
    values = {"0.weight": weights["head.dense.kernel"].T, "0.bias": weights["head.dense.bias"],
              "1.weight": weights["head.norm.gamma"], "1.bias": weights["head.norm.beta"],
              "3.weight": weights["output.kernel"].T, "3.bias": weights["output.bias"]}
    head.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in values.items()})
    with torch.no_grad():
        encoded = torch.from_numpy(trace["encoder.layers.1"])
        np.testing.assert_allclose(trace["head"], head[:3](encoded).numpy(), rtol=0, atol=atol("float64"))
        np.testing.assert_allclose(trace["logits"], head(encoded).numpy(), rtol=0, atol=atol("float64"))
    bert = rn.Transformer(config.replace(head_order="dense-activation-norm"), weights).trace(src)
    assert np.abs(bert["logits"] - trace["logits"]).max() > 1e-2


def test_no_pad_id_treats_every_id_as_a_token():
    """`pad_id=None`: the default masks are all True, so id 0 is attended like any other; with `pad_id=0` the same
    ids lose their zeros to the mask."""
    config = BASE.replace(pad_id=None)
    weights = weights_for(config, dtype=np.float64)
    src, tgt = _inputs(config)
    model = rn.Transformer(config, weights)
    everything = np.ones(src.shape, bool), np.ones(tgt.shape, bool)
    np.testing.assert_array_equal(model(src, tgt), model(src, tgt, src_mask=everything[0], tgt_mask=everything[1]))
    masked = rn.Transformer(config.replace(pad_id=0), weights)(src, tgt)
    assert np.abs(masked - model(src, tgt)).max() > 1e-3


@pytest.mark.parametrize("framework", ["numpy", "torch", "tf"])
def test_loss_counts_every_target_without_a_pad_id(framework):
    rng = np.random.default_rng(5)
    logits, targets = rng.standard_normal((2, 6, 9)), rng.integers(0, 9, size=(2, 6))
    targets[:, 0] = 0
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]  # (2, 6)
    if framework == "numpy":
        loss = rn.token_cross_entropy
    elif framework == "torch":
        torch = _torch()
        from torch_impl.training import token_cross_entropy

        def loss(x, y, pad):
            return float(token_cross_entropy(torch.from_numpy(x), torch.from_numpy(y), pad))
    else:
        from tf_impl.training import token_cross_entropy

        def loss(x, y, pad):
            return float(token_cross_entropy(x, y, pad))
    assert loss(logits, targets, None) == pytest.approx(nll.mean(), rel=1e-12)
    assert loss(logits, targets, 0) == pytest.approx(nll[targets != 0].mean(), rel=1e-12)


# --- both twins against the reference -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FEATURES))
def test_twins_match_the_reference_every_sublayer(backend, name, dtype):
    config = FEATURES[name]
    weights = weights_for(config, seed=6, dtype=dtype)
    src, tgt = _inputs(config)
    if config.is_decoder_only or config.is_encoder_only:
        tgt = None
    model = backend.build(config, weights, dtype)
    traced = backend.trace(model, src, tgt)
    assert_traces_match(traced, reference_trace(config, weights, src, tgt), dtype,
                        floor_trace(config, weights, src, tgt))
    np.testing.assert_array_equal(backend.logits(model, src, tgt), traced["logits"])
    back = backend.to_reference(model)
    assert back.keys() == weights.keys() and all(back[k].tobytes() == weights[k].tobytes() for k in weights)


TORCH_PATHS, TF_PATHS = ("fused", "explicit"), ("explicit", "keras", "blockwise")


@pytest.mark.parametrize("framework, path", [("torch", p) for p in TORCH_PATHS] + [("tf", p) for p in TF_PATHS])
@pytest.mark.parametrize("name", ["encoder-decoder", "decoder-only"])
def test_every_attention_path_takes_the_scale(framework, path, name, dtype):
    """The fused kernels (torch's SDPA, Keras's dot_product_attention) and tf_impl's blockwise path are given the
    scale too, not only the explicit softmax."""
    config = FEATURES[name]
    weights = weights_for(config, seed=7, dtype=dtype)
    src, tgt = _inputs(config, batch=2, src_len=13, tgt_len=9)
    tgt = None if config.is_decoder_only else tgt
    desired = rn.Transformer(config, weights)(src, tgt)
    if framework == "torch":
        import torch

        import torch_impl
        model = torch_impl.Transformer.from_reference(config, weights, dtype=getattr(torch, dtype))
        for module in model.modules():
            if isinstance(module, torch_impl.model.MultiHeadAttention):
                module.impl = path
        with torch.no_grad():
            actual = model(src, tgt).numpy()
    else:
        import tf_impl
        actual = np.asarray(tf_impl.Transformer.from_reference(config, weights, dtype=dtype, attention_impl=path)(
            src, tgt))
    np.testing.assert_allclose(actual, desired, rtol=0, atol=atol(dtype))


@pytest.mark.parametrize("framework, path", [("torch", "fused"), ("torch", "explicit"), ("tf", "explicit"),
                                             ("tf", "keras"), ("tf", "blockwise")])
def test_attention_functions_take_the_scale(framework, path):
    """The backends' attention functions on their own, causal (torch's `is_causal` kernel when there is no mask;
    tf_impl's blockwise path in blocks of 4 queries, skipping the keys a block cannot see) and with a key mask."""
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((2, 3, 11, 12)) for _ in range(3))  # (B, H, T, d_k)
    key_mask = np.ones((2, 1, 1, 11), bool)
    key_mask[1, ..., 7:] = False
    causal = rn.causal_mask(11, 11)
    for mask in (None, key_mask):
        desired, _ = rn.scaled_dot_product_attention(q, k, v, causal if mask is None else mask & causal, scale=0.3)
        if framework == "torch":
            import torch

            from torch_impl.attention import scaled_dot_product_attention
            tensors = [torch.from_numpy(a) for a in (q, k, v)]
            actual, _ = scaled_dot_product_attention(*tensors, None if mask is None else torch.from_numpy(mask),
                                                     causal=True, impl=path, scale=0.3)
            actual = actual.numpy()
        elif path == "blockwise":
            from tf_impl.blockwise_attention import blockwise_attention
            actual = np.asarray(blockwise_attention(q, k, v, mask, causal=True, block_size=4, scale=0.3))
        else:
            from tf_impl.attention import scaled_dot_product_attention
            actual = np.asarray(scaled_dot_product_attention(q, k, v, mask, causal=True, impl=path, scale=0.3)[0])
        np.testing.assert_allclose(actual, desired, rtol=0, atol=atol("float64"))


# --- files and the command line -------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["safetensors", "pt", "weights.h5"])
@pytest.mark.parametrize("name", ["encoder-decoder", "decoder-only", "shared-tied"])
def test_checkpoint_formats_carry_the_settings_and_the_bias(tmp_path, name, suffix):
    config = FEATURES[name]
    weights = weights_for(config, seed=8, dtype=np.float64 if suffix == "pt" else np.float32)
    formats.save(tmp_path / f"m.{suffix}", config, weights)
    loaded = formats.load(tmp_path / f"m.{suffix}")
    assert loaded.config == config
    assert loaded.weights.keys() == weights.keys()
    assert all(loaded.weights[k].tobytes() == weights[k].tobytes() for k in weights)


def test_verify_passes_with_the_settings_on_the_command_line(capsys):
    code = cli.main(["verify", "--preset", "tiny", "--set", "attention_scale=model", "--set", "embed_bias=true",
                     "--set", "pad_id=none", "--batch", "2", "--src-len", "7", "--tgt-len", "5"])
    out = capsys.readouterr().out
    assert code == 0 and "PASS" in out, out
    code = cli.main(["verify", "--preset", "tiny", "--set", "attention_scale=0.125", "--set", "num_decoder_layers=0",
                     "--set", "head_transform=true", "--set", "head_order=dense-norm-activation", "--backends",
                     "torch", "--batch", "2", "--src-len", "7"])
    out = capsys.readouterr().out
    assert code == 0 and "PASS" in out, out


@pytest.mark.parametrize("setting, named", [("attention_scale=model", "attention_scale='model'"),
                                            ("embed_bias=true", "embed_bias=True")])
def test_exports_refuse_what_the_target_cannot_express(tmp_path, capsys, setting, named):
    gpt = rn.TransformerConfig.preset("tiny").replace(num_encoder_layers=0, norm_first=True, final_norm=True,
                                                       positional="learned", scale_embedding=False,
                                                       output_bias=False)
    config = gpt.replace(**parse_fields(None, [setting]))
    formats.save(tmp_path / "m.safetensors", config, weights_for(config))
    for target in ("hf", "kerashub"):
        capsys.readouterr()
        assert cli.main(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / target), "--to", target]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and named in err, err
        assert not (tmp_path / target).exists()
