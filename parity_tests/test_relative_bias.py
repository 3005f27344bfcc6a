"""T5's relative position bias (`relative_bias_buckets`, `relative_bias_max_distance`, `positional="none"`): the buckets against
transformers' own function, the fields refused when invalid (naming field and value), a bare `T5Model` read and
judged, and exports to families without the bias refused naming it. The whole models (T5 v1.0, v1.1, mT5) against
transformers are in `test_seq2seq_families.py`; the block in every backend, streamed and cached, is the
`relative-bias` variant (`support/variants.py`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn

from .support.variants import VARIANTS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T5 = VARIANTS["relative-bias"].replace(d_model=40, num_heads=6, head_size=8, d_ff=37, share_embeddings=True,
                                       tgt_vocab_size=48, bias=False, scale_embedding=False, ffn_gated=True,
                                       activation="gelu_tanh", layer_norm_eps=1e-6)


@pytest.mark.parametrize("buckets, distance", [(32, 128), (8, 20), (6, 7)], ids=["t5-default", "8-to-20", "6-to-7"])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_the_buckets_are_transformers_own(buckets, distance, bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = np.arange(-700, 700)
    theirs = T5Attention._relative_position_bucket(torch.as_tensor(relative), bidirectional, buckets, distance)
    ours = rn.ops.relative_position_buckets(relative, bidirectional, buckets, distance)
    np.testing.assert_array_equal(ours, theirs.numpy())
    config = T5.replace(max_len=700, relative_bias_buckets=buckets, relative_bias_max_distance=distance)
    np.testing.assert_array_equal(rn.ops.relative_bucket_table(config, bidirectional), ours[1:])  # -699 .. 699


@pytest.mark.parametrize("changes, says", [
    (dict(relative_bias_buckets=2), "relative_bias_buckets must be 0 (none) or >= 4"),
    (dict(relative_bias_buckets=-1), "relative_bias_buckets must be an integer >= 0, received -1"),
    (dict(relative_bias_max_distance=4), "relative_bias_max_distance=4 must exceed the exact distances"),
    (dict(relative_bias_buckets=0, relative_bias_max_distance=64, positional="sinusoidal"),
     "relative_bias_max_distance=64 needs a relative position bias"),
    (dict(positional="relative"), "positional"),
], ids=["too-few-buckets", "negative-buckets", "distance-within-exact", "distance-without-bias", "unknown-positional"])
def test_invalid_relative_bias_fields_are_refused_naming_them(changes, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        T5.replace(**changes)


def test_the_config_round_trips_through_json():
    assert rn.TransformerConfig.from_json(T5.to_json()) == T5


@pytest.mark.parametrize("target", ["hf-bart", "hf-llama", "hf-marian", "kerashub-bart", "nn-transformer"])
def test_an_export_to_a_family_without_the_bias_is_refused_naming_it(target, tmp_path):
    from transformer_parity import formats

    weights = rn.init_weights(T5, seed=0)
    with pytest.raises(ValueError) as refused:
        formats.save(tmp_path / "out", T5, weights, target)
    assert "relative_bias_buckets" in str(refused.value) or "positional" in str(refused.value), str(refused.value)


def test_mt5_refuses_a_rescaled_head():
    from transformer_parity.layouts import hf_family

    t5_v1 = T5.replace(tgt_vocab_size=T5.src_vocab_size, tie_embeddings=True, logit_divisor=40 ** 0.5,
                       attention_scale="none")
    assert hf_family("hf-t5").export_problems(t5_v1) == []
    assert any("logit_divisor" in p for p in hf_family("hf-mt5").export_problems(t5_v1))


def test_a_bare_t5_model_is_read_and_matches_its_last_hidden_state(tmp_path):
    from transformer_parity import formats

    torch.manual_seed(3)
    model = transformers.T5Model(transformers.T5Config(
        vocab_size=53, d_model=40, d_kv=8, num_heads=6, d_ff=37, num_layers=1, num_decoder_layers=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, feed_forward_proj="gated-silu")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "bare")
    loaded = formats.load(tmp_path / "bare")
    assert not loaded.config.output_projection and loaded.config.activation == "silu"
    src, tgt = rn.sample_batch(loaded.config, 2, 25, 22, 1)
    src[0, 4] = tgt[1, 3] = 0
    with torch.no_grad():
        theirs = model(input_ids=torch.as_tensor(src), attention_mask=torch.as_tensor(src != 0),
                       decoder_input_ids=torch.as_tensor(tgt),
                       decoder_attention_mask=torch.as_tensor(tgt != 0)).last_hidden_state.double().numpy()
    ours = rn.Transformer(loaded.config, loaded.weights)(src, tgt)
    assert np.max(np.abs(theirs - ours)) <= 1e-4
    formats.save(tmp_path / "again", loaded.config, dict(loaded.weights), "hf-t5")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["architectures"] == ["T5Model"]
