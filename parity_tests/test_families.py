"""The three model families (decoder-only, BERT-style encoder, Marian/BART encoder-decoder): the reference's math,
then torch_impl and tf_impl against it (every trace entry, float32 and float64, padded inputs), bit-identical round
trips, and greedy decoding with and without a cache."""

import math

import numpy as np
import pytest

import reference_numpy as rn

from .conftest import TINY, weights_for
from .tolerances import atol

# One small model per family; the HF helper's tests build the real layouts on the same switches.
FAMILIES = {
    "gpt2-like": TINY.replace(num_encoder_layers=0, norm_first=True, final_norm=True, positional="learned",
                              tie_embeddings=True, activation="gelu_tanh", scale_embedding=False,
                              output_bias=False),
    "bert-mlm-like": TINY.replace(num_decoder_layers=0, tgt_vocab_size=48, positional="learned",
                                  type_vocab_size=2, embed_norm=True, head_transform=True, pooler=True,
                                  tie_embeddings=True, scale_embedding=False, activation="gelu", layer_norm_eps=1e-12),
    "bare-backbone": TINY.replace(num_decoder_layers=0, positional="learned", type_vocab_size=3, embed_norm=True,
                                  pooler=True, output_projection=False, scale_embedding=False),
    "marian-like": TINY.replace(tgt_vocab_size=48, activation="silu", sinusoid_layout="concatenated",
                                share_embeddings=True, tie_embeddings=True, output_bias=True),
    "bart-like": TINY.replace(tgt_vocab_size=48, positional="learned", position_offset=2, embed_norm=True,
                              activation="gelu", share_embeddings=True, tie_embeddings=True, scale_embedding=False),
}


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
