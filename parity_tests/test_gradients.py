"""Gradient parity: the padded, label-smoothed token cross-entropy and its gradient with respect to every canonical
parameter, in torch (autograd) and Keras (GradientTape), float64 and float32. The NumPy reference's loss is the
`desired` value of the loss and, by central finite differences, pins the float64 gradients."""

import numpy as np
import pytest

import reference_numpy as rn

from .torch_threads import one_torch_thread  # noqa: F401 (autouse)
from .conftest import FAMILIES, TINY, VARIANTS, weights_for
from .tolerances import atol
from parity_tests.support.training_parity import batch_for

from .training_tolerances import FINITE_DIFFERENCE_ATOL, GRADIENT_RTOL, gradient_errors, zero_gradient_parameter

FRAMEWORKS = ["torch", "tf"]


def loss_and_gradients(framework, config, weights, batch, label_smoothing):
    if framework == "torch":
        import torch_impl
        from torch_impl.training import loss_and_gradients as run
        model = torch_impl.Transformer.from_reference(config, weights)
    else:
        import tf_impl
        from tf_impl.training import loss_and_gradients as run
        model = tf_impl.Transformer.from_reference(config, weights)
    return run(model, *batch, label_smoothing=label_smoothing)


def reference_loss(config, weights, batch, label_smoothing) -> float:
    src, tgt_in, labels = batch
    return rn.token_cross_entropy(rn.Transformer(config, weights)(src, tgt_in), labels, config.pad_id,
                                  label_smoothing)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1], ids=["no-smoothing", "smoothing-0.1"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_loss_matches_reference(framework, dtype, label_smoothing):
    weights = weights_for(TINY, dtype=dtype)
    batch = batch_for(TINY)
    loss, _ = loss_and_gradients(framework, TINY, weights, batch, label_smoothing)
    np.testing.assert_allclose(loss, reference_loss(TINY, weights, batch, label_smoothing), rtol=0, atol=atol(dtype))


def test_loss_definition():
    """Padding does not count, and smoothing is (1 - eps) * nll + eps * mean over all classes of -log p."""
    logits = np.log(np.array([[[0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]]))  # (1, 2, 3)
    assert rn.token_cross_entropy(logits, np.array([[1, 0]]), pad_id=0) == pytest.approx(-np.log(0.25))
    smoothed = 0.9 * -np.log(0.25) + 0.1 * -np.log([0.5, 0.25, 0.25]).mean()
    assert rn.token_cross_entropy(logits, np.array([[1, 0]]), 0, 0.1) == pytest.approx(smoothed)
    assert rn.token_cross_entropy(logits, np.array([[0, 0]]), 0) == 0.0
    for bad in (-0.1, 1.0, True):
        with pytest.raises(ValueError, match="label_smoothing"):
            rn.token_cross_entropy(logits, np.array([[1, 0]]), 0, bad)


# float64: every variant, and GPT-2's family for its gelu_tanh (whose derivative tf_impl writes out), torch and Keras
# against each other (the float64 torch gradient is `desired`, pinned to the reference below by finite differences).
FLOAT64_CONFIGS = {**VARIANTS, "gpt2-like": FAMILIES["gpt2-like"]}


@pytest.mark.parametrize("name", list(FLOAT64_CONFIGS), ids=list(FLOAT64_CONFIGS))
def test_float64_gradients_torch_vs_keras(name):
    config = FLOAT64_CONFIGS[name]
    weights = weights_for(config, dtype=np.float64)
    batch = batch_for(config)
    desired_loss, desired = loss_and_gradients("torch", config, weights, batch, 0.1)
    loss, actual = loss_and_gradients("tf", config, weights, batch, 0.1)
    assert sorted(actual) == sorted(rn.parameter_shapes(config))
    errors = gradient_errors(actual, desired)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRADIENT_RTOL["float64"], f"{worst}: {errors[worst]:.3g}"
    np.testing.assert_allclose(loss, desired_loss, rtol=0, atol=atol("float64"))


FLOAT32_VARIANTS = ["post-ln", "pre-ln+final-norm", "tied", "encoder-only", "pad-id-3"]


@pytest.mark.parametrize("name", FLOAT32_VARIANTS, ids=FLOAT32_VARIANTS)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_float32_gradients_against_float64(framework, name):
    config = VARIANTS[name]
    weights = weights_for(config, dtype=np.float64)
    batch = batch_for(config)
    _, desired = loss_and_gradients("torch", config, weights, batch, 0.1)
    weights32 = {k: v.astype(np.float32) for k, v in weights.items()}
    _, actual = loss_and_gradients(framework, config, weights32, batch, 0.1)
    assert all(g.dtype == np.float32 for g in actual.values())
    errors = gradient_errors(actual, desired)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRADIENT_RTOL["float32"], f"{worst}: {errors[worst]:.3g}"


@pytest.mark.parametrize("name", ["post-ln", "gelu"], ids=["post-ln", "gelu"])
def test_reference_loss_finite_differences(name):
    """The reference loss, perturbed at the largest-gradient entry of every parameter (h = 1e-5, central
    differences, truncation + rounding error ~5e-11), against the float64 autograd gradient."""
    config = VARIANTS[name]
    weights = weights_for(config, dtype=np.float64)
    batch = batch_for(config)
    _, grads = loss_and_gradients("torch", config, weights, batch, 0.1)
    h = 1e-5
    checked = 0
    for name, grad in grads.items():
        if zero_gradient_parameter(name):
            continue  # zero in exact arithmetic: nothing to difference
        index = np.unravel_index(np.argmax(np.abs(grad)), grad.shape)
        values = []
        for delta in (h, -h):
            perturbed = dict(weights)
            perturbed[name] = weights[name].copy()
            perturbed[name][index] += delta
            values.append(reference_loss(config, perturbed, batch, 0.1))
        finite_difference = (values[0] - values[1]) / (2 * h)
        assert abs(finite_difference - grad[index]) <= FINITE_DIFFERENCE_ATOL, (name, finite_difference,
                                                                                 grad[index])
        checked += 1
    assert checked == sum(not zero_gradient_parameter(n) for n in rn.parameter_shapes(config))


def test_key_bias_gradient_is_rounding_noise():
    """Why key biases are judged on an absolute scale: their exact gradient is zero."""
    weights = weights_for(TINY, dtype=np.float64)
    _, grads = loss_and_gradients("torch", TINY, weights, batch_for(TINY), 0.1)
    scale = max(np.abs(g).max() for g in grads.values())
    for name, grad in grads.items():
        if zero_gradient_parameter(name):
            assert np.abs(grad).max() <= 1e-14 * scale, name


def test_planted_bugs_exceed_the_float32_tolerance():
    """The float32 tolerance still catches the mistakes it exists for, by a wide margin (torch, float64)."""
    import torch

    import torch_impl
    from torch_impl.training import canonical_gradients

    weights = weights_for(TINY, dtype=np.float64)
    src, tgt_in, labels = batch_for(TINY)
    _, desired = loss_and_gradients("torch", TINY, weights, (src, tgt_in, labels), 0.1)

    def worst(actual):
        return max(gradient_errors(actual, desired).values())

    # padding counted in the loss
    model = torch_impl.Transformer.from_reference(TINY, weights)
    logits = model(src, tgt_in)
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(labels).reshape(-1),
                                      label_smoothing=0.1).backward()
    assert worst(canonical_gradients(model)) > 100 * GRADIENT_RTOL["float32"]
    # Keras's LayerNormalization default epsilon (1e-3) instead of the config's 1e-5
    _, grads = loss_and_gradients("torch", TINY.replace(layer_norm_eps=1e-3), weights, (src, tgt_in, labels), 0.1)
    assert worst(grads) > 10 * GRADIENT_RTOL["float32"]
    # no label smoothing
    _, grads = loss_and_gradients("torch", TINY, weights, (src, tgt_in, labels), 0.0)
    assert worst(grads) > 100 * GRADIENT_RTOL["float32"]
