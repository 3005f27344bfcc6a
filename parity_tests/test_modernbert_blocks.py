"""The blocks of ModernBERT and Cohere: LayerNorms with a weight and no bias (`norm_bias=False`), refused when
invalid naming the field and the value, round-tripping through JSON, named by the schema (gamma alone), and refused
by a family that lacks them. The twins in float32 and float64, the streamed blocks, the caches and the formats run
`norm_bias=False` in the "post-norms+soft-caps" variant (`support/variants.py`); the families against transformers
are in test_llm_families.py (Cohere)."""

from __future__ import annotations

import numpy as np
import pytest

import reference_numpy as rn
from parity_tests.support.variants import VARIANTS
from transformer_parity.verify import seeded_weights

NO_BIAS = VARIANTS["post-norms+soft-caps"]  # every LayerNorm without a bias


@pytest.mark.parametrize("changes, message", [
    ({"norm_bias": 0}, r"norm_bias must be a bool, received 0"),
    ({"norm": "rms"}, r"norm_bias=False \(LayerNorms with gamma and no beta\) needs norm='layer' and "
                      r"norm_affine=True, received norm='rms', norm_affine=True"),
    ({"norm_affine": False}, r"norm_bias=False .* received norm='layer', norm_affine=False"),
], ids=lambda v: "+".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "")
def test_config_refuses_each_invalid_value_naming_it(changes, message):
    with pytest.raises(ValueError, match=message):
        NO_BIAS.replace(**changes)


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
