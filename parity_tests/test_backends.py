"""The backend registry (`transformer_parity.backends`): one name per backend, `tf` accepted for `keras` everywhere a
backend is named, and every backend tracing the same function from the same canonical weights."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose

import reference_numpy as rn
from parity_tests.tolerances import atol
from transformer_parity import backends
from transformer_parity.cli import main
from transformer_parity.errors import UsageError
from transformer_parity.verify import seeded_weights


@pytest.mark.parametrize("name, expected", [("numpy", "numpy"), ("torch", "torch"), ("keras", "keras"),
                                            ("tf", "keras"), ("TensorFlow", "keras"), ("pytorch", "torch")])
def test_names_and_aliases(name, expected):
    assert backends.get(name).name == expected


def test_an_unknown_backend_names_the_choices():
    with pytest.raises(UsageError, match=r"unknown backend 'jax'; choose one of numpy, torch, keras \(tf = keras\)"):
        backends.get("jax")


@pytest.mark.parametrize("name", ["torch", "tf"])
def test_every_backend_traces_the_reference_function(name):
    config = rn.TransformerConfig.preset("tiny", d_model=36, num_heads=3, d_ff=50, attention_scale="model",
                                         pad_id=None)
    weights = seeded_weights(config, seed=3)
    src, tgt = rn.sample_batch(config, batch=2, src_len=9, tgt_len=7, seed=1)
    assert (src == 0).any()  # no pad token: id 0 is an ordinary token
    desired = backends.get("numpy").trace(config, weights, "float64", src, tgt)
    actual = backends.get(name).trace(config, weights, "float64", src, tgt)
    assert list(actual) == list(desired)
    for sublayer, value in desired.items():
        assert_allclose(actual[sublayer], value, rtol=0, atol=atol("float64"), err_msg=sublayer)


def test_verify_takes_tf_for_keras(capsys):
    assert main(["--quiet", "verify", "--preset", "tiny", "--backends", "numpy,tf", "--batch", "1", "--src-len", "5",
                 "--tgt-len", "4"]) == 0
    assert main(["verify", "--preset", "tiny", "--backends", "jax"]) == 2
    assert "unknown backend 'jax'" in capsys.readouterr().err
