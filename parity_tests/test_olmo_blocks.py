"""The OLMo, OLMo 2 and Granite blocks (`norm_affine`, `clip_qkv`, `pre_norms`, `qk_norm_over`,
`embedding_multiplier`, `residual_multiplier`, `logit_divisor`): each refused when invalid, naming the field and the
value; JSON round trips; the schema's names; each switch changes the logits; both twins within reduced-precision
floors of the reference in bfloat16; and no family without the blocks takes them silently. The twins in float32
and float64, the streamed blocks, the caches and the formats run them as two `VARIANTS`
("plain-norms+clip+multipliers", "post-norms-only+qk-norm-all"); the families against transformers are in
test_llm_families.py."""

from __future__ import annotations

import numpy as np
import pytest

import reference_numpy as rn
from parity_tests.support.variants import VARIANTS
from transformer_parity import verify
from transformer_parity.verify import Subject, seeded_weights

PLAIN, POST_ONLY = VARIANTS["plain-norms+clip+multipliers"], VARIANTS["post-norms-only+qk-norm-all"]


@pytest.mark.parametrize("base, changes, message", [
    (PLAIN, {"norm_affine": 0}, r"norm_affine must be a bool, received 0"),
    (PLAIN, {"norm": "rms"}, r"norm_affine=False \(LayerNorms without gamma and beta\) needs norm='layer', received "
                             r"norm='rms'"),
    (PLAIN, {"clip_qkv": 0}, r"clip_qkv must be a positive finite number, received 0"),
    (PLAIN, {"clip_qkv": float("inf")}, r"clip_qkv must be a positive finite number, received inf"),
    (PLAIN, {"embedding_multiplier": -1.0}, r"embedding_multiplier must be a positive finite number, received -1.0"),
    (PLAIN, {"residual_multiplier": "2"}, r"residual_multiplier must be a positive finite number, received '2'"),
    (PLAIN, {"logit_divisor": float("nan")}, r"logit_divisor must be a positive finite number, received nan"),
    (PLAIN, {"output_projection": False}, r"logit_divisor=2.0 divides the output projection's logits; this model "
                                          r"has output_projection=False"),
    (POST_ONLY, {"pre_norms": "no"}, r"pre_norms must be a bool, received 'no'"),
    (POST_ONLY, {"post_norms": False}, r"pre_norms=False .* needs norm_first=True and post_norms=True, received "
                                       r"norm_first=True, post_norms=False"),
    (POST_ONLY, {"qk_norm_over": "heads"}, r"qk_norm_over must be one of head, all, received 'heads'"),
    (POST_ONLY, {"qk_norm": False}, r"qk_norm_over='all' says what the q/k norms cover; this model has "
                                    r"qk_norm=False"),
], ids=lambda v: "+".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "")
def test_config_refuses_each_invalid_value_naming_it(base, changes, message):
    with pytest.raises(ValueError, match=message):
        base.replace(**changes)


def test_config_fields_round_trip():
    for config in (PLAIN, POST_ONLY):
        assert rn.TransformerConfig.from_json(config.to_json()) == config
    assert PLAIN.replace(logit_divisor=2).logit_divisor == 2.0  # JSON's 2 is the number 2.0


def test_schema_names_the_norms_each_block_has():
    plain = rn.parameter_shapes(PLAIN)
    assert not [n for n in plain if n.endswith((".gamma", ".beta"))]  # no norm has parameters
    post = rn.parameter_shapes(POST_ONLY)
    layer = "decoder.layers.0."
    assert [n[len(layer):] for n in post if n.startswith(layer) and "norm" in n] == [
        "self_attn.q_norm.gamma", "self_attn.k_norm.gamma", "post_attn_norm.gamma", "cross_attn.q_norm.gamma",
        "cross_attn.k_norm.gamma", "post_cross_attn_norm.gamma", "post_ffn_norm.gamma"]
    d_k = POST_ONLY.head_dim
    assert post[layer + "self_attn.q_norm.gamma"] == (POST_ONLY.num_heads * d_k,)
    assert post[layer + "self_attn.k_norm.gamma"] == (POST_ONLY.kv_heads * d_k,)


SWITCHES = {  # one switch back at its default: another model, and the weights it reads still fit
    "clip_qkv": (PLAIN, {"clip_qkv": None}), "embedding_multiplier": (PLAIN, {"embedding_multiplier": 1.0}),
    "residual_multiplier": (PLAIN, {"residual_multiplier": 1.0}), "logit_divisor": (PLAIN, {"logit_divisor": 1.0}),
}


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_each_switch_changes_the_logits(switch):
    config, changes = SWITCHES[switch]
    weights = seeded_weights(config, 2)
    src, tgt = rn.sample_batch(config, batch=2, src_len=7, tgt_len=6, seed=1)
    with_it = rn.Transformer(config, weights)(src, tgt)
    without = rn.Transformer(config.replace(**changes), weights)(src, tgt)
    assert np.max(np.abs(with_it - without)) > 1e-3


def test_all_heads_q_norm_is_not_the_per_head_one():
    """One q (k) norm over all heads' features is another model than one per head, even at unit gammas."""
    weights = seeded_weights(POST_ONLY, 2)
    src, tgt = rn.sample_batch(POST_ONLY, batch=2, src_len=7, tgt_len=6, seed=1)

    def logits(config):
        w = {n: np.ones(shape) if n.endswith(("q_norm.gamma", "k_norm.gamma")) else weights[n]
             for n, shape in rn.parameter_shapes(config).items()}
        return rn.Transformer(config, w)(src, tgt)

    assert np.max(np.abs(logits(POST_ONLY) - logits(POST_ONLY.replace(qk_norm_over="head")))) > 1e-3


@pytest.mark.parametrize("backend", ["torch", "keras"])
@pytest.mark.parametrize("name", ["plain-norms+clip+multipliers", "post-norms-only+qk-norm-all"])
def test_twins_pass_in_bfloat16(backend, name):
    pytest.importorskip(backend)
    config = VARIANTS[name]
    weights = seeded_weights(config, 3)
    report = verify.judge_subjects(Subject("reference", "numpy", config, weights),
                                   [Subject(backend, backend, config, weights)], dtype="bfloat16", seed=3, batch=2,
                                   src_len=9, tgt_len=7)
    assert report.passed, report.first_divergence


@pytest.mark.parametrize("name", ["plain-norms+clip+multipliers", "post-norms-only+qk-norm-all"])
@pytest.mark.parametrize("target", ["hf-llama", "hf-gemma2", "nn-transformer.pt"])
def test_no_family_without_these_blocks_takes_them_silently(name, target, tmp_path):
    """Writing the blocks to a family that lacks them is refused, naming the field, never dropped."""
    from transformer_parity import formats
    from transformer_parity.errors import UsageError

    config = VARIANTS[name].replace(num_encoder_layers=0, final_norm=True, norm_first=True, positional="rope",
                                    pad_id=None, bias=False, ffn_gated=True, activation="silu")
    out = tmp_path / target
    with pytest.raises((UsageError, ValueError)) as refused:
        formats.save(out, config, rn.init_weights(config, 0), "nn-transformer" if target.endswith(".pt") else target)
    fields = ("norm_affine", "clip_qkv", "embedding_multiplier", "residual_multiplier", "logit_divisor", "pre_norms",
              "qk_norm_over")
    assert any(field in str(refused.value) for field in fields), str(refused.value)
    assert not out.exists()
