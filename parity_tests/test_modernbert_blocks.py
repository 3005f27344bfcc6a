"""The blocks of ModernBERT and Cohere: LayerNorms with a weight and no bias (`norm_bias=False`), an encoder whose
first layer's attention has no norm (`first_attn_norm=False`), and an encoder-only model's sliding and full layers
(`layer_kinds` per encoder layer, a window both ways, `local_rope_theta` for the sliding ones): each refused when
invalid naming the field and the value, round-tripping through JSON, named by the schema, and refused by a family
that lacks it. The twins in float32 and float64, the streamed blocks, the caches and the formats run them in two
`VARIANTS` ("post-norms+soft-caps", "encoder-local-layers+head-norm-first"); the families against transformers are
in test_llm_families.py (Cohere) and test_bert_family.py (ModernBERT)."""

from __future__ import annotations

import numpy as np
import pytest

import reference_numpy as rn
from parity_tests.support.variants import VARIANTS
from transformer_parity import verify
from transformer_parity.verify import Subject, seeded_weights

NO_BIAS = VARIANTS["post-norms+soft-caps"]  # every LayerNorm without a bias
LOCAL = VARIANTS["encoder-local-layers+head-norm-first"]  # ModernBERT's encoder blocks


@pytest.mark.parametrize("changes, message", [
    ({"norm_bias": 0}, r"norm_bias must be a bool, received 0"),
    ({"norm": "rms"}, r"norm_bias=False \(LayerNorms with gamma and no beta\) needs norm='layer' and "
                      r"norm_affine=True, received norm='rms', norm_affine=True"),
    ({"norm_affine": False}, r"norm_bias=False .* received norm='layer', norm_affine=False"),
], ids=lambda v: "+".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "")
def test_config_refuses_each_invalid_value_naming_it(changes, message):
    with pytest.raises(ValueError, match=message):
        NO_BIAS.replace(**changes)


@pytest.mark.parametrize("changes, message", [
    ({"first_attn_norm": "no"}, r"first_attn_norm must be a bool, received 'no'"),
    ({"num_decoder_layers": 2, "layer_kinds": None, "local_rope_theta": None, "sliding_window": None},
     r"first_attn_norm=False .* received num_decoder_layers=2, norm_first=True, pre_norms=True, shared_layers=False"),
    ({"norm_first": False}, r"first_attn_norm=False .* norm_first=False"),
    ({"layer_kinds": ("full", "sliding", "full")}, r"layer_kinds must name one of sliding, full per encoder layer "
                                                  r"\(num_encoder_layers=2\), received \('full', 'sliding', 'full'\)"),
    ({"first_attn_norm": True, "shared_layers": True}, r"layer_kinds=\['full', 'sliding'\] gives layers kinds of "
                                                       r"their own; this model has shared_layers=True"),
], ids=lambda v: "+".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "")
def test_encoder_blocks_refuse_each_invalid_value_naming_it(changes, message):
    with pytest.raises(ValueError, match=message):
        LOCAL.replace(**changes)


def test_encoder_blocks_round_trip_and_the_first_layer_has_no_attention_norm():
    assert rn.TransformerConfig.from_json(LOCAL.to_json()) == LOCAL
    assert (LOCAL.encoder_kinds, LOCAL.encoder_layer_kind(1), LOCAL.encoder_local_rope(1)) == (
        ("sliding", "full"), "sliding", True)
    shapes = rn.parameter_shapes(LOCAL)
    assert "encoder.layers.0.norm1.gamma" not in shapes and "encoder.layers.1.norm1.gamma" in shapes
    assert "encoder.layers.0.norm2.gamma" in shapes


def test_an_encoder_window_reaches_both_ways():
    """Not causal, a window of 3 lets position i see j with |i - j| < 3 (transformers' ModernBERT: `abs(q_idx -
    kv_idx) <= local_attention // 2`), padding still hidden; the twins' masks are the same."""
    import torch

    import torch_impl.model

    keys = np.array([[True] * 6 + [False]])
    mask = rn.ops.attention_mask(keys, 7, window=3)[0, 0]
    i, j = np.indices((7, 7))
    np.testing.assert_array_equal(mask, (np.abs(i - j) < 3) & (j < 6))
    twin = torch_impl.model.attention_mask(torch.as_tensor(keys), 7, window=3)[0, 0].numpy()
    np.testing.assert_array_equal(twin, mask)


def test_each_encoder_block_changes_the_logits():
    weights = seeded_weights(LOCAL, 2)
    src, _ = rn.sample_batch(LOCAL, batch=2, src_len=9, tgt_len=2, seed=1)
    logits = rn.Transformer(LOCAL, weights)(src)
    for changes in ({"layer_kinds": None, "local_rope_theta": None, "sliding_window": None},
                    {"local_rope_theta": None}):
        other = rn.Transformer(LOCAL.replace(**changes), weights)(src)
        assert np.max(np.abs(other - logits)) > 1e-3, changes
    with_norm = LOCAL.replace(first_attn_norm=True)
    unit = {**weights, "encoder.layers.0.norm1.gamma": np.full(LOCAL.d_model, 2.0, np.float32),
            "encoder.layers.0.norm1.beta": np.zeros(LOCAL.d_model, np.float32)}
    assert np.max(np.abs(rn.Transformer(with_norm, unit)(src) - logits)) > 1e-3


def test_norm_bias_round_trips_and_the_schema_has_no_beta():
    assert rn.TransformerConfig.from_json(NO_BIAS.to_json()) == NO_BIAS
    shapes = rn.parameter_shapes(NO_BIAS)
    assert not [n for n in shapes if n.endswith(".beta")]
    assert "decoder.layers.0.post_ffn_norm.gamma" in shapes and "encoder.final_norm.gamma" not in shapes
    with_bias = rn.parameter_shapes(NO_BIAS.replace(norm_bias=True))
    assert sorted(set(with_bias) - set(shapes)) == sorted(n[:-len("gamma")] + "beta" for n in shapes
                                                          if n.endswith(".gamma"))


def test_a_layer_norm_without_bias_is_the_one_with_a_zero_bias():
    weights = seeded_weights(NO_BIAS, 2)
    src, tgt = rn.sample_batch(NO_BIAS, batch=2, src_len=7, tgt_len=6, seed=1)
    with_bias = NO_BIAS.replace(norm_bias=True)
    zero = {n: weights[n] if n in weights else np.zeros(s, np.float32)
            for n, s in rn.parameter_shapes(with_bias).items()}
    np.testing.assert_array_equal(rn.Transformer(NO_BIAS, weights)(src, tgt),
                                  rn.Transformer(with_bias, zero)(src, tgt))


@pytest.mark.parametrize("target", ["hf-phi", "hf-gpt-neox", "nn-transformer.pt"])
def test_no_family_without_bias_free_norms_takes_them_silently(target, tmp_path):
    """Writing LayerNorms without a bias to a family whose LayerNorms have one is refused, naming the field."""
    from transformer_parity import formats
    from transformer_parity.errors import UsageError

    config = rn.TransformerConfig.preset("tiny", num_encoder_layers=0, norm_first=True, final_norm=True,
                                         positional="rope", pad_id=None, norm_bias=False, parallel_residual=True,
                                         ffn_shares_norm=True, scale_embedding=False)
    out = tmp_path / target
    with pytest.raises((UsageError, ValueError)) as refused:
        formats.save(out, config, rn.init_weights(config, 0), "nn-transformer" if target.endswith(".pt") else target)
    assert "norm_bias=False" in str(refused.value), str(refused.value)
    assert not out.exists()


@pytest.mark.parametrize("target", ["hf-bert", "nn-transformer.pt"])
def test_no_family_without_the_encoder_blocks_takes_them_silently(target, tmp_path):
    from transformer_parity import formats
    from transformer_parity.errors import UsageError

    out = tmp_path / target
    with pytest.raises((UsageError, ValueError)) as refused:
        formats.save(out, LOCAL, rn.init_weights(LOCAL, 0), "nn-transformer" if target.endswith(".pt") else target)
    assert "first_attn_norm=False" in str(refused.value) and "layer_kinds" in str(refused.value), str(refused.value)
    assert not out.exists()


@pytest.mark.parametrize("classifier", ["sequence"])  # token scores: test_task_heads (ModernBertForTokenClassification)
def test_a_head_transform_before_a_classifier_in_every_implementation(classifier):
    """ModernBERT's task heads: the head transform, then the classifier (position 0's scores, or every position's);
    both twins and the streamed blocks compute what the reference does, recording `head` before `logits`."""
    import torch

    import tf_impl
    import torch_impl
    from reference_numpy import blocks

    fields = {"classifier_input": "first"} if classifier == "sequence" else {}
    config = LOCAL.replace(output_projection=False, classifier=classifier, num_labels=3, **fields)
    weights = seeded_weights(config, 4)
    src, _ = rn.sample_batch(config, batch=2, src_len=9, tgt_len=2, seed=2)
    desired = rn.Transformer(config, weights).trace(src)
    assert list(desired)[-2:] == ["head", "logits"]
    with torch.no_grad():
        twin = torch_impl.Transformer.from_reference(config, weights, dtype=torch.float64).trace(src)
    keras = tf_impl.Transformer.from_reference(config, weights, dtype="float64").trace(src)
    state, streamed = {"src_ids": src}, {}
    for block in blocks.blocks(config):
        blocks.begin(block, state)
        own = {n: weights[n] for n in blocks.block_parameters(config, block)}
        streamed.update(blocks.run_block(config, block, own, np.float64, state))
    for name, value in desired.items():
        np.testing.assert_allclose(twin[name].numpy(), value, rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(np.asarray(keras[name]), value, rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(streamed[name], value, err_msg=name)
    if classifier == "sequence":  # a pooler's output is not the head's
        with pytest.raises(ValueError, match=r"head_transform before classifier='sequence' .* "
                                             r"classifier_input='pooler'"):
            config.replace(classifier_input="pooler", pooler=True)


@pytest.mark.parametrize("backend", ["torch", "keras"])
@pytest.mark.parametrize("name", ["encoder-local-layers+head-norm-first", "post-norms+soft-caps"])
def test_twins_pass_in_bfloat16(backend, name):
    """The reduced-precision reference (`lowp`) holds the new blocks too: a first attention without a norm rounds
    its residual sum like any other, a LayerNorm without a bias like one with."""
    pytest.importorskip(backend)
    config = VARIANTS[name]
    weights = seeded_weights(config, 3)
    report = verify.judge_subjects(Subject("reference", "numpy", config, weights),
                                   [Subject(backend, backend, config, weights)], dtype="bfloat16", seed=3, batch=2,
                                   src_len=9, tgt_len=7)
    assert report.passed, report.first_divergence
