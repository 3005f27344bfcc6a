"""The building blocks of Gemma 2, Gemma 3 and SmolLM3 in the canonical model: attention-logit and final-logit
soft-capping (`attn_logit_softcap`, `final_logit_softcap`), a norm after each sublayer too (`post_norms`), sliding and
full layers by a pattern (`layer_kinds`), each kind with its own rotary base (`local_rope_theta`), a query scale of
query_pre_attn_scalar**-0.5 (`attention_scale`) and layers without positions (`rope_layers`).

Each is checked four ways: the config refuses what is invalid, naming the field and the value; both twins equal the
float64 reference at every sublayer within K measured floors, on odd sizes (6 query over 2 key/value heads of 16, a
window shorter than the input, both layer kinds, id 0 in the inputs, every norm gamma away from its init), whole and
block by block; the float64 reference equals transformers' Gemma2ForCausalLM, Gemma3ForCausalLM and SmolLM3ForCausalLM
in float64 (their state dicts mapped by a table here: the family modules that read them for users are not this
file's); and greedy decoding with the key/value cache equals decoding without it in both twins, 32 tokens past the
window."""

from __future__ import annotations

import copy
import json
import types

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity.verify import seeded_weights

from .test_model_parity import assert_traces_match, floor_trace, reference_trace
from .test_streamed_verify import assert_blocks_are_the_whole_model
from .tolerances import atol

VOCAB, WINDOW = 53, 4
SCALAR = 24  # query_pre_attn_scalar: not head_dim (16), so 1/sqrt(head_dim) would be another model
# soft caps near the largest scaled scores (about 11 here) and logits (about 8): tanh bends them without flattening
ATTN_CAP, FINAL_CAP = 8.0, 6.0
# Gemma's decoder-only stack: pre-norms plus post norms, RMSNorm times (1 + gamma), GeGLU, tied and scaled embeddings
GEMMA = rn.TransformerConfig(
    src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=48, num_heads=6, num_kv_heads=2, head_size=16,
    num_encoder_layers=0, num_decoder_layers=3, d_ff=37, max_len=64, dropout=0.0, activation="gelu_tanh",
    norm_first=True, final_norm=True, layer_norm_eps=1e-6, positional="rope", bias=False, tie_embeddings=True,
    pad_id=None, norm="rms", norm_weight_offset=1.0, ffn_gated=True, attention_scale=SCALAR ** -0.5,
    sliding_window=WINDOW, layer_kinds=("sliding", "full", "sliding"), post_norms=True)
LINEAR8 = {"rope_type": "linear", "factor": 8.0}
CONFIGS = {
    "gemma2-like": GEMMA.replace(attn_logit_softcap=ATTN_CAP, final_logit_softcap=FINAL_CAP),
    "gemma3-like": GEMMA.replace(qk_norm=True, rope_theta=1e6, rope_scaling=LINEAR8, local_rope_theta=10000.0,
                                 final_logit_softcap=FINAL_CAP),
    # SmolLM3 with use_sliding_window: every second layer without positions, and those layers sliding
    "smollm3-like": GEMMA.replace(num_decoder_layers=4, norm_weight_offset=0.0, activation="silu", post_norms=False,
                                  scale_embedding=False, attention_scale="head", rope_theta=2e6,
                                  layer_kinds=("full", "sliding", "full", "sliding"),
                                  rope_layers=(True, False, True, False)),
    # the same blocks in the other stacks, with LayerNorm, a pad token and cross-attention's post norm
    "encoder-decoder": rn.TransformerConfig(
        src_vocab_size=VOCAB, tgt_vocab_size=41, d_model=48, num_heads=6, num_kv_heads=2, head_size=16,
        num_encoder_layers=2, num_decoder_layers=2, d_ff=37, max_len=23, dropout=0.0, norm_first=True,
        post_norms=True, attn_logit_softcap=4.0, final_logit_softcap=FINAL_CAP, positional="rope",
        sliding_window=WINDOW, layer_kinds=("full", "sliding"), local_rope_theta=100.0, rope_layers=(False, True),
        pad_id=0),
    "encoder-only": rn.TransformerConfig(
        src_vocab_size=VOCAB, tgt_vocab_size=7, d_model=48, num_heads=6, num_kv_heads=2, head_size=16,
        num_encoder_layers=2, num_decoder_layers=0, d_ff=37, max_len=23, dropout=0.0, norm_first=True,
        final_norm=True, post_norms=True, attn_logit_softcap=4.0, final_logit_softcap=3.0, positional="learned",
        attention_scale=SCALAR ** -0.5, pad_id=3),
}


def ids(seed: int = 0, length: int = 11) -> np.ndarray:
    """`(2, length)` ids with 0 among them, every one a real token (these models have no pad token)."""
    out = np.random.default_rng(seed).integers(0, VOCAB, size=(2, length))
    out[0, 3] = out[1, 0] = 0
    return out


def inputs(config) -> tuple[np.ndarray, np.ndarray | None]:
    """A decoder-only model's ids, or padded source (and target) ids with 0 as an ordinary token where the pad id
    is another."""
    if config.is_decoder_only:
        return ids(), None
    src, tgt = rn.sample_batch(config, 3, 11, 9, seed=4)
    return src, (tgt if config.is_encoder_decoder else None)


# --- config ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"attn_logit_softcap": 0}, r"attn_logit_softcap must be a positive finite number, received 0"),
    ({"attn_logit_softcap": -50.0}, r"attn_logit_softcap must be a positive finite number, received -50.0"),
    ({"attn_logit_softcap": float("inf")}, r"attn_logit_softcap must be .* received inf"),
    ({"attn_logit_softcap": "50"}, r"attn_logit_softcap must be .* received '50'"),
    ({"final_logit_softcap": True}, r"final_logit_softcap must be .* received True"),
    ({"final_logit_softcap": float("nan")}, r"final_logit_softcap must be .* received nan"),
    ({"final_logit_softcap": 30.0, "output_projection": False, "tie_embeddings": False},
     r"final_logit_softcap=30.0 caps the output projection's logits; this model has output_projection=False"),
    ({"post_norms": 1}, r"post_norms must be a bool, received 1"),
    ({"post_norms": True, "norm_first": False}, r"post_norms=True .* needs norm_first=True, received norm_first=False"),
    ({"layer_kinds": ("sliding", "full")}, r"layer_kinds must name one of sliding, full per decoder layer "
                                           r"\(num_decoder_layers=3\), received \('sliding', 'full'\)"),
    ({"layer_kinds": ("sliding", "global", "full")}, r"layer_kinds must name .* received \('sliding', 'global'"),
    ({"layer_kinds": "sliding"}, r"layer_kinds must name .* received 'sliding'"),
    ({"sliding_window": None}, r"layer_kinds=\['sliding', 'full', 'sliding'\] says which decoder layers attend "
                               r"within the sliding window; this model has sliding_window=None"),
    ({"layer_kinds": ("full", "full", "full")}, r"layer_kinds=\['full', 'full', 'full'\] has no sliding layer, so "
                                                r"sliding_window=4 would be unused"),
    ({"local_rope_theta": 0.0}, r"local_rope_theta must be a positive finite number, received 0.0"),
    ({"local_rope_theta": 1e4, "layer_kinds": None}, r"local_rope_theta=10000.0 is the rotary base of the sliding "
                                                     r"layers beside full ones: it needs positional='rope' and "
                                                     r"layer_kinds naming both kinds, received .*layer_kinds=None"),
    ({"local_rope_theta": 1e4, "positional": "learned"}, r"local_rope_theta=10000.0 .* received positional='learned'"),
    ({"rope_layers": (True, False)}, r"rope_layers must be one bool per decoder layer \(num_decoder_layers=3; True = "
                                     r"rotary positions there\), received \(True, False\)"),
    ({"rope_layers": (1, 0, 1)}, r"rope_layers must be one bool .* received \(1, 0, 1\)"),
    ({"rope_layers": (True, False, True), "positional": "learned"},
     r"rope_layers=\[True, False, True\] says which decoder layers take rotary positions; it needs "
     r"positional='rope', received positional='learned'"),
], ids=lambda v: "+".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "")
def test_config_refuses_each_invalid_value_naming_it(changes, message):
    with pytest.raises(ValueError, match=message):
        GEMMA.replace(**changes)


def test_config_fields_round_trip_and_say_one_thing_one_way():
    for name, config in CONFIGS.items():
        text = config.to_json()
        assert rn.TransformerConfig.from_json(text) == config, name
        assert hash(rn.TransformerConfig.from_json(text)) == hash(config)
    data = json.loads(CONFIGS["gemma2-like"].to_json())
    assert data["layer_kinds"] == ["sliding", "full", "sliding"] and data["post_norms"] is True
    assert data["attn_logit_softcap"] == ATTN_CAP and data["final_logit_softcap"] == FINAL_CAP
    assert GEMMA.replace(attn_logit_softcap=50).attn_logit_softcap == 50.0  # JSON's 50 is the number 50.0
    assert GEMMA.replace(layer_kinds=["sliding", "full", "full"]).layer_kinds == ("sliding", "full", "full")
    # a list that says what None says is None: every layer sliding, every layer rotating
    assert GEMMA.replace(layer_kinds=("sliding",) * 3).layer_kinds is None
    assert GEMMA.replace(rope_layers=[True] * 3).rope_layers is None
    assert rn.config.field_type_problem("layer_kinds", ["sliding", "full"]) is None
    assert rn.config.field_type_problem("rope_layers", "true") == "rope_layers must be a list or none, received 'true'"


def test_query_pre_attn_scalar_is_an_attention_scale():
    """Gemma's query_pre_attn_scalar: scores times scalar**-0.5, whatever head_dim is."""
    assert GEMMA.attention_scale_factor == SCALAR ** -0.5 != GEMMA.head_dim ** -0.5
    assert GEMMA.replace(attention_scale=256 ** -0.5).attention_scale_factor == 1 / 16


def test_per_layer_answers():
    gemma3, smol = CONFIGS["gemma3-like"], CONFIGS["smollm3-like"]
    assert [gemma3.layer_window(i) for i in range(3)] == [WINDOW, None, WINDOW]
    assert [gemma3.layer_local_rope(i) for i in range(3)] == [True, False, True]
    assert gemma3.decoder_kinds == ("sliding", "full")
    assert [smol.layer_rotary(i) for i in range(4)] == [True, False, True, False]
    assert GEMMA.replace(layer_kinds=None).decoder_kinds == ("sliding",)  # one window for every layer, as before
    assert GEMMA.replace(layer_kinds=None, sliding_window=None).decoder_kinds == ("full",)


def test_schema_names_the_post_norms():
    shapes = rn.parameter_shapes(CONFIGS["encoder-decoder"])
    posts = sorted(name for name in shapes if ".post_" in name)
    assert posts == sorted(f"{stack}.layers.{i}.{norm}.{leaf}" for stack, norms in (
        ("encoder", ("post_attn_norm", "post_ffn_norm")),
        ("decoder", ("post_attn_norm", "post_cross_attn_norm", "post_ffn_norm"))) for i in range(2)
        for norm in norms for leaf in ("gamma", "beta"))
    assert shapes["decoder.layers.1.post_ffn_norm.gamma"] == (48,)
    gemma = rn.parameter_shapes(CONFIGS["gemma2-like"])
    assert [n for n in gemma if n.startswith("decoder.layers.0.")][4:] == [
        "decoder.layers.0.norm1.gamma", "decoder.layers.0.post_attn_norm.gamma", "decoder.layers.0.ffn.gate.kernel",
        "decoder.layers.0.ffn.linear1.kernel", "decoder.layers.0.ffn.linear2.kernel", "decoder.layers.0.norm3.gamma",
        "decoder.layers.0.post_ffn_norm.gamma"]
    assert not any(".post_" in n for n in rn.parameter_shapes(CONFIGS["smollm3-like"]))
    init = rn.init_weights(CONFIGS["gemma2-like"])
    assert not init["decoder.layers.2.post_ffn_norm.gamma"].any()  # 1 + 0: the norm multiplies by 1 at init


def test_the_trace_names_each_post_norm_after_its_sublayer():
    config = CONFIGS["encoder-decoder"]
    src, tgt = inputs(config)
    names = list(rn.Transformer(config, seeded_weights(config, 1)).trace(src, tgt))
    layer = [n for n in names if n.startswith("decoder.layers.1")]
    assert layer == ["decoder.layers.1.self_attn", "decoder.layers.1.post_attn_norm", "decoder.layers.1.cross_attn",
                     "decoder.layers.1.post_cross_attn_norm", "decoder.layers.1.ffn", "decoder.layers.1.post_ffn_norm",
                     "decoder.layers.1"]


# --- each switch changes the model these tests run ------------------------------------------------------------------

SWITCHES = {  # config -> the same model without one switch (the weights it no longer reads dropped)
    "attn_logit_softcap": ("gemma2-like", {"attn_logit_softcap": None}),
    "final_logit_softcap": ("gemma2-like", {"final_logit_softcap": None}),
    "post_norms": ("gemma2-like", {"post_norms": False}),
    "layer_kinds": ("gemma2-like", {"layer_kinds": None}),
    "window": ("gemma2-like", {"layer_kinds": None, "sliding_window": None}),
    "local_rope_theta": ("gemma3-like", {"local_rope_theta": None}),
    "rope_layers": ("smollm3-like", {"rope_layers": None}),
    "attention_scale": ("gemma2-like", {"attention_scale": "head"}),
}


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_each_switch_changes_the_logits(switch):
    """On these weights and inputs each switch moves the logits far beyond any tolerance: the parity tests below
    would see a twin that dropped it."""
    name, changes = SWITCHES[switch]
    config = CONFIGS[name]
    other = config.replace(**changes)
    weights = seeded_weights(config, 2, np.float64)
    kept = {k: v for k, v in weights.items() if k in rn.parameter_shapes(other)}
    src, _ = inputs(config)
    gap = np.abs(rn.Transformer(config, weights)(src) - rn.Transformer(other, kept)(src)).max()
    assert gap > 1e-2, f"{switch}: {gap:.2e}"


def test_soft_cap_is_cap_tanh_x_over_cap():
    x = np.linspace(-200, 200, 9)
    np.testing.assert_allclose(rn.ops.soft_cap(x, 50.0), 50.0 * np.tanh(x / 50.0), rtol=0, atol=0)
    assert np.abs(rn.ops.soft_cap(x, 50.0)).max() < 50.0
    q, k, v = (np.random.default_rng(i).standard_normal((1, 2, 5, 4)) * 3 for i in range(3))
    capped, weights = rn.scaled_dot_product_attention(q, k, v, scale=0.5, softcap=2.0)
    scores = 2.0 * np.tanh(q @ np.swapaxes(k, -1, -2) * 0.5 / 2.0)  # capped after the scale, before the softmax
    np.testing.assert_allclose(weights, rn.ops.softmax(scores), rtol=0, atol=1e-15)
    np.testing.assert_allclose(capped, rn.ops.softmax(scores) @ v, rtol=0, atol=1e-14)


# --- both twins against the reference -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
def test_twins_equal_the_reference_every_sublayer(backend, name, dtype):
    config = CONFIGS[name]
    weights = seeded_weights(config, 6, dtype)
    src, tgt = inputs(config)
    kwargs = {"attention_weights": True} if name == "gemma2-like" else {}  # the capped scores' softmax, traced
    model = backend.build(config, weights, dtype)
    traced = backend.trace(model, src, tgt, **kwargs)
    assert_traces_match(traced, reference_trace(config, weights, src, tgt, **kwargs), dtype,
                        floor_trace(config, weights, src, tgt, **kwargs))
    assert all(v.dtype == np.dtype(dtype) for v in traced.values())
    back = backend.to_reference(model)
    assert back.keys() == weights.keys() and all(back[k].tobytes() == weights[k].tobytes() for k in weights)


@pytest.mark.parametrize("name", ["gemma2-like", "gemma3-like", "smollm3-like", "encoder-decoder"])
def test_blocks_compute_what_the_whole_model_computes(name):
    """Layer-streamed verify's blocks (each decoder layer with its own kind, rotary base and post norms; the capped
    output block) are the whole model, bit for bit, in the reference and both twins."""
    config = CONFIGS[name]
    src, tgt = inputs(config)
    assert_blocks_are_the_whole_model(config, seeded_weights(config, 3),
                                      [(b, d) for b in ("numpy", "torch", "keras") for d in ("float32", "float64")],
                                      src, tgt)


def test_a_forgotten_post_norm_is_named_at_its_sublayer():
    """A torch port whose layer 1 skips its post-attention norm fails first at `decoder.layers.1.post_attn_norm`
    (everything before it equal): the trace names the norm a port forgot."""
    import torch

    import torch_impl

    from .tolerances import floor_atol, floors

    config = CONFIGS["gemma2-like"]
    weights = seeded_weights(config, 6, np.float32)
    src, _ = inputs(config)
    model = torch_impl.Transformer.from_reference(config, weights)
    model.decoder.layers[1].post_attn_norm = torch.nn.Identity()
    with torch.no_grad():
        traced = {k: v.numpy() for k, v in model.trace(src).items()}
    desired = reference_trace(config, weights, src, None)
    measured = floors(desired, floor_trace(config, weights, src, None), "float32")
    failing = [n for n in desired if np.abs(traced[n] - desired[n]).max() > floor_atol(measured[n])]
    assert failing[0] == "decoder.layers.1.post_attn_norm", failing


def test_torch_takes_the_explicit_path_only_under_a_cap(monkeypatch):
    """SDPA cannot soft-cap: a capped model never calls it, an uncapped one keeps the fused kernel."""
    import torch
    import torch.nn.functional as F

    import torch_impl

    calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    for cap, expected in ((1.5, 0), (None, 3)):
        config = CONFIGS["gemma2-like"].replace(attn_logit_softcap=cap)
        model = torch_impl.Transformer.from_reference(config, seeded_weights(config, 1))
        calls.clear()
        with torch.no_grad():
            model(ids())
        assert len(calls) == expected, cap


@pytest.mark.parametrize("name", ["gemma2-like", "encoder-decoder"])
def test_keras_weights_h5_holds_the_post_norms_where_keras_puts_them(tmp_path, name):
    from transformer_parity.formats import keras_file as kc
    from tf_impl.model import Transformer

    from .test_formats import _h5_structure, assert_same_weights

    config = CONFIGS[name]
    weights = seeded_weights(config, 4)
    Transformer.from_reference(config, weights).save_weights(tmp_path / "keras.weights.h5")
    kc.save_weights_h5(tmp_path / "ours.weights.h5", config, weights)
    structure = _h5_structure(tmp_path / "keras.weights.h5")
    assert structure == _h5_structure(tmp_path / "ours.weights.h5")
    assert any("post_ffn_norm" in str(entry) for entry in structure)
    _, back = kc.load_weights_h5(tmp_path / "keras.weights.h5", config.to_dict())
    assert_same_weights(back, weights)


# --- greedy decoding with and without the cache ---------------------------------------------------------------------

def _recording(stepper, seen: list):
    def next_logits(prefix):
        out = stepper(prefix)
        seen.append(np.asarray(out, np.float64))
        return out
    return next_logits


@pytest.mark.parametrize("name", ["gemma2-like", "gemma3-like", "smollm3-like"])
def test_greedy_decoding_with_the_cache_equals_decoding_without_it(name):
    """32 tokens after a prompt of 4, a window of 4: the cached steppers of both twins (and Keras's compiled
    fixed-size greedy loop) choose the tokens the recomputing ones choose, and every step's logits agree with the
    reference's recomputation in float64."""
    import tf_impl
    import torch_impl
    from tf_impl import decoding as tf_decoding
    from torch_impl import decoding as torch_decoding

    config = CONFIGS[name]
    weights = seeded_weights(config, 5, np.float64)
    prompt = ids(2, length=4)
    desired: list = []
    expected = rn.generate(_recording(rn.reference_stepper(rn.Transformer(config, weights)), desired), 2,
                           prompt=prompt, eos_id=VOCAB, pad_id=None, max_new_tokens=32)  # no end token
    assert len(set(expected[:, 4:].ravel().tolist())) > 3  # the tokens vary: a step that attends wrongly would show
    tm = torch_impl.Transformer.from_reference(config, weights)
    km = tf_impl.Transformer.from_reference(config, weights)
    steppers = {"torch cached": torch_decoding.cached_stepper(tm),
                "torch recompute": torch_decoding.recompute_stepper(tm),
                "tf cached": tf_decoding.cached_stepper(km), "tf recompute": tf_decoding.recompute_stepper(km)}
    for label, stepper in steppers.items():
        seen: list = []
        ours = rn.generate(_recording(stepper, seen), 2, prompt=prompt, eos_id=VOCAB, pad_id=None, max_new_tokens=32)
        np.testing.assert_array_equal(ours, expected, err_msg=label)
        np.testing.assert_allclose(np.stack(seen), np.stack(desired), rtol=0, atol=atol("float64"), err_msg=label)
    tokens, _ = tf_decoding.greedy(km, prompt, 32, jit_compile=False)
    np.testing.assert_array_equal(tokens, expected, err_msg="tf greedy (fixed-size cache)")


# --- the reference against transformers -----------------------------------------------------------------------------

HF = {  # id -> (causal-LM class, config class, its settings, our config)
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(
        head_dim=16, query_pre_attn_scalar=SCALAR, sliding_window=WINDOW, attn_logit_softcapping=ATTN_CAP,
        final_logit_softcapping=FINAL_CAP), CONFIGS["gemma2-like"]),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        head_dim=16, query_pre_attn_scalar=SCALAR, sliding_window=WINDOW, final_logit_softcapping=FINAL_CAP,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}}),
        CONFIGS["gemma3-like"]),
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(
        head_dim=16, num_hidden_layers=4, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=WINDOW,
        hidden_act="silu", rope_parameters={"rope_type": "default", "rope_theta": 2e6}), CONFIGS["smollm3-like"]),
}
HF_COMMON = dict(vocab_size=VOCAB, hidden_size=48, num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=3,
                 intermediate_size=37, max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=None,
                 bos_token_id=None, eos_token_id=None, tie_word_embeddings=True, attn_implementation="eager")
# transformers' names -> canonical, in the mapping language; SmolLM3's post_attention_layernorm is its pre-FFN norm
HF_TABLE = [
    ("tgt_embed.embedding", "model.embed_tokens.weight", "identity"),
    ("decoder.layers.{i}.self_attn.{qkv}.kernel", "model.layers.{i}.self_attn.{qkv}_proj.weight", "transpose"),
    ("decoder.layers.{i}.self_attn.o.kernel", "model.layers.{i}.self_attn.o_proj.weight", "transpose"),
    ("decoder.layers.{i}.self_attn.q_norm.gamma", "model.layers.{i}.self_attn.q_norm.weight", "identity"),
    ("decoder.layers.{i}.self_attn.k_norm.gamma", "model.layers.{i}.self_attn.k_norm.weight", "identity"),
    ("decoder.layers.{i}.norm1.gamma", "model.layers.{i}.input_layernorm.weight", "identity"),
    ("decoder.layers.{i}.ffn.gate.kernel", "model.layers.{i}.mlp.gate_proj.weight", "transpose"),
    ("decoder.layers.{i}.ffn.linear1.kernel", "model.layers.{i}.mlp.up_proj.weight", "transpose"),
    ("decoder.layers.{i}.ffn.linear2.kernel", "model.layers.{i}.mlp.down_proj.weight", "transpose"),
    ("decoder.final_norm.gamma", "model.norm.weight", "identity"),
]
SANDWICH = [
    ("decoder.layers.{i}.post_attn_norm.gamma", "model.layers.{i}.post_attention_layernorm.weight", "identity"),
    ("decoder.layers.{i}.norm3.gamma", "model.layers.{i}.pre_feedforward_layernorm.weight", "identity"),
    ("decoder.layers.{i}.post_ffn_norm.gamma", "model.layers.{i}.post_feedforward_layernorm.weight", "identity"),
]
PRE_NORM = [("decoder.layers.{i}.norm3.gamma", "model.layers.{i}.post_attention_layernorm.weight", "identity")]
_hf_cache: dict = {}


def hf_model(name: str):
    """transformers' model of `name` in eval mode, every parameter perturbed (norm weights away from their init);
    built once per session."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    if name not in _hf_cache:
        cls_name, config_name, settings, _ = HF[name]
        torch.manual_seed(sum(map(ord, name)))
        config = getattr(transformers, config_name)(**{**HF_COMMON, **settings})
        model = getattr(transformers, cls_name)(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        _hf_cache[name] = model
    return _hf_cache[name]


def canonical_weights(name: str, model) -> dict[str, np.ndarray]:
    config = HF[name][3]
    state = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    np.testing.assert_array_equal(state.pop("lm_head.weight"), state["model.embed_tokens.weight"])  # tied
    table = HF_TABLE + (SANDWICH if config.post_norms else PRE_NORM)
    return rn.from_framework_state(config, state, table)


def float64_throughout(model) -> None:
    """transformers' float64 model is float32 in four places; each is replaced by its own formula in float64: the
    RMSNorms upcast to float32 (`x.float()`), the rotary tables are float32 angles from float32 frequencies, Gemma's
    embedding scale is a float32 buffer, and eager attention takes its softmax in float32 (`_eager64`, patched in
    by the test). The frequencies are recomputed here from the model's own rope parameters (default and linear)."""
    import torch

    def rms(self, x):
        eps = getattr(self, "eps", getattr(self, "variance_epsilon", None))
        scale = 1.0 + self.weight if type(self).__name__.startswith("Gemma") else self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale

    def rotary(self, x, position_ids, layer_type=None):
        c = self.config
        params = c.rope_parameters if layer_type is None else c.rope_parameters[layer_type]
        dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        inv_freq = 1.0 / params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        if params["rope_type"] == "linear":
            inv_freq = inv_freq / params["factor"]
        else:
            assert params["rope_type"] == "default", params
        freqs = position_ids[..., None].double() * inv_freq  # (B, T, dim / 2)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm"):
            module.forward = types.MethodType(rms, module)
        elif kind.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(rotary, module)
        elif kind.endswith("ScaledWordEmbedding"):
            module.embed_scale = torch.tensor(float(module.scalar_embed_scale), dtype=torch.float64)


def _eager64(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    """transformers' eager attention (Gemma 2's, with its soft cap) with the softmax in the scores' dtype."""
    import torch

    groups = module.num_key_value_groups
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _patch_eager(monkeypatch, model) -> None:
    import importlib

    modeling = importlib.import_module(type(model).__module__)
    monkeypatch.setattr(modeling, "eager_attention_forward", _eager64)


def hf_logits(model, src: np.ndarray):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.as_tensor(src)).logits.double().numpy()


@pytest.mark.parametrize("name", list(HF))
def test_float64_reference_equals_transformers_in_float64(name, monkeypatch):
    """Within 1e-10 of the logits' size; measured 8e-16 to 2.4e-15 (relative). Without `float64_throughout` and
    `_eager64` the same float64 models sit 1.8e-7 to 4.6e-7 away: float32 inside."""
    model = hf_model(name)
    weights = canonical_weights(name, model)
    model64 = copy.deepcopy(model).double()
    float64_throughout(model64)
    _patch_eager(monkeypatch, model64)
    src = ids(length=11)
    desired = hf_logits(model64, src)
    actual = rn.Transformer(HF[name][3], weights, np.float64)(src)
    relative = np.abs(actual - desired).max() / np.abs(desired).max()
    assert relative <= 1e-10, f"{relative:.2e}"


@pytest.mark.parametrize("name", list(HF))
def test_float32_transformers_within_float32_floors_of_the_reference(name):
    """transformers as shipped (float32, its own rotary tables and softmax), judged like a port: K floors."""
    from .tolerances import property_atol

    model = hf_model(name)
    config = HF[name][3]
    weights = canonical_weights(name, model)
    src = ids(length=11)
    desired = rn.Transformer(config, weights, np.float64)(src)
    floor = np.abs(rn.Transformer(config, weights, np.float32)(src) - desired).max()
    np.testing.assert_allclose(hf_logits(model, src), desired, rtol=0, atol=property_atol("float32", floor))


def test_transformers_gemma3_ignores_attn_logit_softcapping():
    """Gemma3TextConfig takes attn_logit_softcapping, but Gemma3Attention does not pass it to its attention function:
    transformers' Gemma 3 never caps its scores. A config that names a cap there computes the uncapped model."""
    transformers = pytest.importorskip("transformers")
    model = hf_model("gemma3")
    config = transformers.Gemma3TextConfig(**{**HF_COMMON, **HF["gemma3"][2], "attn_logit_softcapping": 0.5})
    capped = transformers.Gemma3ForCausalLM(config).eval()
    capped.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(hf_logits(capped, ids()), hf_logits(model, ids()))


@pytest.mark.parametrize("name", ["gemma2-like", "gemma3-like", "smollm3-like"])
@pytest.mark.parametrize("target", ["hf-llama", "hf-gemma", "kerashub-mistral", "nn-transformer.pt"])
def test_no_family_without_these_blocks_takes_them_silently(name, target, tmp_path):
    """A soft cap, a post norm, a layer pattern or a NoPE layer has no equivalent in the families that lack them:
    writing one there is refused, naming the field, never dropped."""
    from transformer_parity import formats
    from transformer_parity.errors import UsageError

    config = CONFIGS[name]
    out = tmp_path / target
    with pytest.raises((UsageError, ValueError)) as refused:
        formats.save(out, config, rn.init_weights(config, 0), "nn-transformer" if target.endswith(".pt") else target)
    assert any(field in str(refused.value) for field in ("attn_logit_softcap", "final_logit_softcap", "post_norms",
                                                         "layer_kinds", "rope_layers")), str(refused.value)
    assert not out.exists()
