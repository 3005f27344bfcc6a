"""The three model families (decoder-only, BERT-style encoder, Marian/BART encoder-decoder): the reference's math,
then torch_impl and tf_impl against it (every trace entry, float32 and float64, padded inputs), bit-identical round
trips, and greedy decoding with and without a cache."""

import math
import re

import numpy as np
import pytest

import reference_numpy as rn

from .conftest import FAMILIES, TINY, weights_for
from .tolerances import atol



def family_inputs(config, batch=2, src_len=9, tgt_len=7, seed=3):
    """Padded ids (and segment ids where the model has them), as `trace(src, tgt, **kwargs)` takes them."""
    src, tgt = rn.sample_batch(config, batch, src_len, tgt_len, seed)
    kwargs = {}
    if config.type_vocab_size:
        kwargs["src_type_ids"] = rn.sample_type_ids(config, src, seed)
    return src, tgt, kwargs


# --- the reference ---------------------------------------------------------------------------------------------

def test_activations_match_their_formulas():
    x = np.linspace(-12, 12, 97)
    gelu_tanh = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x]
    silu = [v / (1 + math.exp(-v)) for v in x]
    np.testing.assert_allclose(rn.ops.gelu_tanh(x), gelu_tanh, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(rn.ops.silu(x), silu, rtol=1e-14, atol=1e-15)
    assert rn.ops.silu(np.array([-1000.0]))[0] == 0  # no NaN where exp overflows
    assert rn.ops.gelu_tanh(x.astype(np.float32)).dtype == np.float32


@pytest.mark.parametrize("family", list(FAMILIES))
def test_trace_names_follow_the_family(family):
    config = FAMILIES[family]
    src, tgt, kwargs = family_inputs(config)
    names = list(rn.Transformer(config, weights_for(config)).trace(src, tgt, **kwargs))
    assert ("decoder.embed" in names) == config.has_decoder and ("encoder.embed" in names) == config.has_encoder
    assert not any(".cross_attn" in n for n in names) or config.is_encoder_decoder
    assert names[-1] == ("logits" if config.output_projection else "last_hidden_state")
    assert ("pooler" in names) == config.pooler and ("head" in names) == config.head_transform


def test_decoder_only_is_causal_and_reads_the_target_side():
    config = FAMILIES["gpt2-like"]
    model = rn.Transformer(config, weights_for(config))
    ids, _, _ = family_inputs(config)
    assert "src_embed.embedding" not in rn.parameter_shapes(config)
    assert "decoder.layers.0.norm2.gamma" not in rn.parameter_shapes(config)
    logits = model(ids)
    assert logits.shape == (*ids.shape, config.tgt_vocab_size)
    changed = ids.copy()
    changed[:, 5:] = (changed[:, 5:] + 1) % config.tgt_vocab_size
    changed[changed == config.pad_id] = 1
    np.testing.assert_array_equal(model(changed)[:, :5], logits[:, :5])
    assert not np.allclose(model(changed)[0, 5:], logits[0, 5:])
    with pytest.raises(ValueError, match="decoder-only model .* takes one sequence"):
        model(ids, ids)
    with pytest.raises(ValueError, match="encode\\(\\) needs an encoder"):
        model.encode(ids)


def test_position_offset_skips_the_first_rows():
    config = FAMILIES["bart-like"]
    weights = weights_for(config, dtype=np.float64)
    src, tgt, _ = family_inputs(config)
    assert weights["src_pos.embedding"].shape == (config.max_len + 2, config.d_model)
    desired = rn.Transformer(config, weights)(src, tgt)
    unused = dict(weights, **{"src_pos.embedding": weights["src_pos.embedding"].copy()})
    unused["src_pos.embedding"][:2] = 7.0
    np.testing.assert_array_equal(rn.Transformer(config, unused)(src, tgt), desired)
    used = dict(weights, **{"src_pos.embedding": weights["src_pos.embedding"].copy()})
    used["src_pos.embedding"][2] += np.linspace(-1, 1, config.d_model)  # position 0 (not a constant: LayerNorm)
    assert not np.allclose(rn.Transformer(config, used)(src, tgt), desired)


def test_shared_embeddings_feed_both_sides_and_the_tied_output():
    config = FAMILIES["marian-like"]
    names = rn.parameter_shapes(config)
    assert "tgt_embed.embedding" not in names and "output.kernel" not in names and "output.bias" in names
    weights = weights_for(config, dtype=np.float64)
    model = rn.Transformer(config, weights)
    assert model.tgt_embed.token_table is model.src_embed.token_table
    np.testing.assert_array_equal(model.output_kernel, model.weights["src_embed.embedding"].T)


def test_segment_ids_default_to_zero_and_are_checked():
    config = FAMILIES["bert-mlm-like"]
    model = rn.Transformer(config, weights_for(config))
    src, _, kwargs = family_inputs(config)
    np.testing.assert_array_equal(model(src), model(src, src_type_ids=np.zeros_like(src)))
    assert kwargs["src_type_ids"].max() == 1 and kwargs["src_type_ids"].min() == 0
    assert not np.allclose(model(src, **kwargs), model(src))
    with pytest.raises(ValueError, match="src_type_ids holds token id 2, outside the vocabulary \\[0, 2\\)"):
        model(src, src_type_ids=np.full_like(src, 2))
    with pytest.raises(ValueError, match="src_type_ids must have the shape of src_ids"):
        model(src, src_type_ids=np.zeros((2, 3), np.int64))
    plain = FAMILIES["marian-like"]
    with pytest.raises(ValueError, match="type_vocab_size=0"):
        rn.Transformer(plain, weights_for(plain))(src, src[:, :4], src_type_ids=np.zeros_like(src))


def test_bert_head_pooler_and_embedding_norm_are_the_formulas():
    config = FAMILIES["bert-mlm-like"]
    w = weights_for(config, dtype=np.float64)
    model = rn.Transformer(config, w)
    src, _, kwargs = family_inputs(config)
    trace = model.trace(src, **kwargs)

    def norm(x, prefix):
        return rn.ops.layer_norm(x, w[f"{prefix}.gamma"], w[f"{prefix}.beta"], config.layer_norm_eps)

    t = src.shape[1]
    embed = w["src_embed.embedding"][src] + w["src_type.embedding"][kwargs["src_type_ids"]] \
        + w["src_pos.embedding"][:t]
    np.testing.assert_allclose(trace["encoder.embed"], norm(embed, "src_embed_norm"), rtol=0, atol=1e-12)
    hidden = trace["encoder.layers.1"]
    np.testing.assert_allclose(trace["pooler"], np.tanh(hidden[:, 0] @ w["pooler.kernel"] + w["pooler.bias"]),
                               rtol=0, atol=1e-12)
    head = norm(rn.ops.gelu(hidden @ w["head.dense.kernel"] + w["head.dense.bias"]), "head.norm")
    np.testing.assert_allclose(trace["head"], head, rtol=0, atol=1e-12)
    np.testing.assert_allclose(trace["logits"], head @ w["src_embed.embedding"].T + w["output.bias"], rtol=0,
                               atol=1e-12)


# KerasHub's BertMaskedLM: a tanh-GELU encoder at epsilon 1e-12 whose head uses the exact GELU and epsilon 1e-5.
OWN_HEAD = FAMILIES["bert-mlm-like"].replace(activation="gelu_tanh", head_activation="gelu", head_layer_norm_eps=1e-5)


def test_head_with_its_own_activation_and_epsilon_is_the_formula():
    config = OWN_HEAD
    w = weights_for(config, dtype=np.float64)
    src, _, kwargs = family_inputs(config)
    trace = rn.Transformer(config, w).trace(src, **kwargs)
    hidden = trace["encoder.layers.1"]
    x = hidden @ w["head.dense.kernel"] + w["head.dense.bias"]
    head = rn.ops.layer_norm(rn.ops.gelu(x), w["head.norm.gamma"], w["head.norm.beta"], 1e-5)
    np.testing.assert_allclose(trace["head"], head, rtol=0, atol=1e-12)
    for changed in ({"head_activation": None}, {"head_layer_norm_eps": None}):  # each field is used
        other = rn.Transformer(config.replace(**changed), w).trace(src, **kwargs)["head"]
        assert np.max(np.abs(other - head)) > 1e-6, changed
    plain = FAMILIES["bert-mlm-like"]
    assert plain.replace(head_activation=None, head_layer_norm_eps=None) == plain  # None: the old config
    for field, value in (("head_activation", "gelu"), ("head_layer_norm_eps", 1e-5)):
        with pytest.raises(ValueError, match=f"{field}=.* needs head_transform=True"):
            FAMILIES["bare-backbone"].replace(**{field: value})
    with pytest.raises(ValueError, match="head_activation must be one of .* received 'tanh'"):
        plain.replace(head_activation="tanh")
    with pytest.raises(ValueError, match="head_layer_norm_eps must be a positive finite number .* received 0"):
        plain.replace(head_layer_norm_eps=0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_head_with_its_own_activation_and_epsilon_in_every_backend(backend, dtype):
    config = OWN_HEAD
    weights = weights_for(config, dtype=dtype)
    src, _, kwargs = family_inputs(config)
    traced = backend.trace(backend.build(config, weights, dtype), src, **kwargs)
    desired = rn.Transformer(config, weights, np.float64).trace(src, **kwargs)
    for name in ("head", "logits"):
        np.testing.assert_allclose(traced[name], desired[name], rtol=0, atol=atol(dtype), err_msg=name)


def test_bare_backbone_returns_hidden_states():
    config = FAMILIES["bare-backbone"]
    model = rn.Transformer(config, weights_for(config))
    src, _, kwargs = family_inputs(config)
    trace = model.trace(src, **kwargs)
    assert not any(n.startswith("output.") for n in rn.parameter_shapes(config))
    np.testing.assert_array_equal(model(src, **kwargs), trace["last_hidden_state"])
    np.testing.assert_array_equal(trace["last_hidden_state"], trace["encoder.layers.1"])
    assert trace["pooler"].shape == (2, config.d_model)


def test_generate_from_a_prompt_matches_argmax_of_full_forward():
    config = FAMILIES["gpt2-like"]
    model = rn.Transformer(config, weights_for(config))
    prompt = np.array([[5, 6, 7], [9, 3, 2]])
    out = rn.generate(rn.reference_stepper(model), 2, prompt=prompt, eos_id=-1, pad_id=config.pad_id,
                      max_new_tokens=5)
    assert out.shape == (2, 8)
    np.testing.assert_array_equal(out[:, :3], prompt)
    for t in range(3, 8):
        full = model(out[:, :t], src_mask=np.ones((2, t), bool))
        np.testing.assert_array_equal(out[:, t], full[:, -1].argmax(-1))
    with pytest.raises(ValueError, match="exactly one of bos_id and prompt"):
        rn.generate(rn.reference_stepper(model), 2, bos_id=1, prompt=prompt, eos_id=-1, pad_id=0,
                    max_new_tokens=2)
    with pytest.raises(ValueError, match="decoder-only model has no source"):
        rn.reference_stepper(model, prompt)


def test_start_token_equal_to_pad_is_not_masked():
    """Marian starts decoding from its pad token: the first step must see it (all-True target mask)."""
    config = FAMILIES["marian-like"]
    model = rn.Transformer(config, weights_for(config))
    src, _, _ = family_inputs(config)
    start = np.full((2, 1), config.pad_id)
    step = rn.reference_stepper(model, src)(start)
    seen = model(src, start, tgt_mask=np.ones((2, 1), bool))[:, -1]
    np.testing.assert_array_equal(step, seen)
    assert not np.allclose(step, model(src, start)[:, -1])  # the default pad mask would hide it


# --- torch_impl and tf_impl against the reference -----------------------------------------------------------------

@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_every_sublayer(backend, family, dtype):
    config = FAMILIES[family]
    weights = weights_for(config, dtype=dtype)
    src, tgt, kwargs = family_inputs(config)
    model = backend.build(config, weights, dtype)
    traced = backend.trace(model, src, tgt, **kwargs)
    desired = rn.Transformer(config, weights, np.float64).trace(src, tgt, **kwargs)
    assert list(traced) == list(desired)
    for name, value in desired.items():
        np.testing.assert_allclose(traced[name], value, rtol=0, atol=atol(dtype), err_msg=f"sublayer {name}")
        assert traced[name].dtype == np.dtype(dtype), name
    np.testing.assert_array_equal(backend.logits(model, src, tgt, **kwargs), traced[list(traced)[-1]])
    round_trip = backend.to_reference(model)
    assert sorted(round_trip) == sorted(weights)
    for name, value in weights.items():  # bit-identical, dtype included
        assert round_trip[name].dtype == value.dtype and np.array_equal(round_trip[name], value), name


@pytest.mark.parametrize("family", ["gpt2-like", "bert-mlm-like"])
def test_family_checks_inputs_like_the_reference(backend, family):
    config = FAMILIES[family]
    model = backend.build(config, weights_for(config), "float32")
    src, tgt, kwargs = family_inputs(config)
    reference = rn.Transformer(config, weights_for(config))
    bad = [(src, {})]
    if config.type_vocab_size:
        bad += [(None, dict(src_type_ids=np.full_like(src, config.type_vocab_size))),
                (None, dict(src_type_ids=np.zeros((1, 2), np.int64)))]
    else:
        bad += [(None, dict(src_type_ids=np.zeros_like(src)))]
    for tgt, arguments in bad:
        with pytest.raises(ValueError) as desired:
            reference(src, tgt, **arguments)
        with pytest.raises(ValueError, match=re.escape(str(desired.value))):  # Keras adds context around it
            backend.logits(model, src, tgt, **arguments)


@pytest.mark.parametrize("name,x", [("gelu_tanh", np.linspace(-30, 30, 601)), ("silu", np.linspace(-750, 60, 811))])
def test_activations_in_float64(name, x):
    """The activations alone, float64, over a wide range: an op that rounds through float32 would be ~1e-8 off."""
    import tensorflow as tf
    import torch

    import tf_impl.model
    import torch_impl.model

    desired = rn.ops.ACTIVATIONS[name](x)
    torch_out = torch_impl.model.ACTIVATIONS[name](torch.from_numpy(x)).numpy()
    keras_out = tf_impl.model.ACTIVATIONS[name](tf.constant(x)).numpy()
    for actual in (torch_out, keras_out):
        assert actual.dtype == np.float64
        np.testing.assert_allclose(actual, desired, rtol=0, atol=atol("float64") * 1e-3)


def _steppers(family):
    """(config, generate() start arguments, {backend/path: next_logits}) for greedy decoding in all three
    backends, with and without a cache."""
    import tf_impl
    import torch_impl
    from tf_impl import decoding as tf_decoding
    from torch_impl import decoding as torch_decoding

    config = FAMILIES[family]
    weights = weights_for(config)
    if config.is_decoder_only:
        src, start = None, {"prompt": np.array([[5, 6, 7], [9, 3, 2], [1, 1, 4]])}
    else:  # Marian: decoding starts from the pad token
        src, start = family_inputs(config, batch=3)[0], {"bos_id": config.pad_id}
    torch_model = torch_impl.Transformer.from_reference(config, weights)
    keras_model = tf_impl.Transformer.from_reference(config, weights)
    return config, start, {
        "numpy": rn.reference_stepper(rn.Transformer(config, weights), src),
        "torch-cache": torch_decoding.cached_stepper(torch_model, src),
        "torch-recompute": torch_decoding.recompute_stepper(torch_model, src),
        "keras-cache": tf_decoding.cached_stepper(keras_model, src),  # compiled step after the first
        "keras-cache-eager": tf_decoding.cached_stepper(keras_model, src, compiled=False),
        "keras-recompute": tf_decoding.recompute_stepper(keras_model, src, compiled=False),  # no trace to wait for
    }


@pytest.mark.parametrize("family", ["gpt2-like", "marian-like"])
def test_greedy_decoding_same_tokens_everywhere(family):
    config, start, steppers = _steppers(family)
    outputs = {name: rn.generate(step, 3, eos_id=-1, pad_id=config.pad_id, max_new_tokens=10, **start)
               for name, step in steppers.items()}
    desired = outputs.pop("numpy")
    assert len(np.unique(desired[:, -10:])) > 1  # not a degenerate constant sequence
    for name, tokens in outputs.items():
        np.testing.assert_array_equal(tokens, desired, err_msg=name)


def test_cached_step_logits_match_a_full_forward():
    """The decoder-only cache path: prompt in one call, then single tokens; logits equal the full forward's."""
    config, start, steppers = _steppers("gpt2-like")
    ids = np.concatenate([start["prompt"], np.array([[8], [2], [6]]), np.array([[4], [4], [9]])], axis=1)
    desired = [rn.Transformer(config, weights_for(config))(ids[:, :t], src_mask=np.ones((3, t), bool))[:, -1]
               for t in (3, 4, 5)]
    for name in ("torch-cache", "keras-cache", "keras-cache-eager"):
        for t, want in zip((3, 4, 5), desired):
            np.testing.assert_allclose(steppers[name](ids[:, :t]), want, rtol=0, atol=atol("float32"),
                                       err_msg=f"{name}, step {t}")


def test_keras_layers_serialize_their_config():
    """The one get_config/from_config mixin: every config-built layer of every family comes back equal."""
    import tf_impl

    for family in ("gpt2-like", "bert-mlm-like", "marian-like"):
        config = FAMILIES[family]
        model = tf_impl.Transformer.from_reference(config, weights_for(config))
        rebuilt = tf_impl.Transformer.from_config(model.get_config())
        assert rebuilt.config == config
        for layer in model._flatten_layers():
            if hasattr(layer, "_CONFIG_ARGS") and layer is not model:
                again = type(layer).from_config(layer.get_config())
                assert again.config == config and again.name == layer.name
                assert all(getattr(again, arg) == getattr(layer, arg) for arg in layer._CONFIG_ARGS)


@pytest.mark.parametrize("family", ["gpt2-like", "bert-mlm-like", "marian-like"])
def test_float64_gradients_torch_vs_keras(family):
    """Training works on the families too: the loss equals the reference's, and every canonical gradient (the
    shared/tied table sums its three uses) agrees between autograd and GradientTape."""
    from .test_gradients import gradient_errors, loss_and_gradients
    from .training_tolerances import GRADIENT_RTOL

    config = FAMILIES[family]
    weights = weights_for(config, dtype=np.float64)
    src, tgt, _ = family_inputs(config, batch=2, src_len=7, tgt_len=6, seed=1)
    if config.is_encoder_decoder:
        batch = (src, tgt[:, :-1], tgt[:, 1:])
    elif config.is_decoder_only:
        batch = (src[:, :-1], None, src[:, 1:])
    else:
        batch = (src, None, rn.sample_ids(config, 2, 7, config.tgt_vocab_size, 2))
    desired_loss, desired = loss_and_gradients("torch", config, weights, batch, 0.1)
    loss, actual = loss_and_gradients("tf", config, weights, batch, 0.1)
    reference = rn.token_cross_entropy(rn.Transformer(config, weights)(batch[0], batch[1]), batch[2], config.pad_id,
                                       0.1)
    np.testing.assert_allclose(desired_loss, reference, rtol=0, atol=atol("float64"))
    np.testing.assert_allclose(loss, reference, rtol=0, atol=atol("float64"))
    assert sorted(actual) == sorted(desired) == sorted(rn.parameter_shapes(config))
    errors = gradient_errors(actual, desired)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRADIENT_RTOL["float64"], f"{worst}: {errors[worst]:.3g}"
