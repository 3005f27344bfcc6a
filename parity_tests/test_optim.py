"""Optimizer and schedule parity: Adam with the paper's settings and the schedules of `reference_numpy.training`
in torch and Keras, checked update by update against the NumPy reference, then N full training steps of both
frameworks from the same weights and batches."""

import numpy as np
import pytest

import reference_numpy as rn

from parity_tests.support.training_parity import (SCHEDULES, gradient_stream, reference_adam, relative_error,
                                                run_adam, train_both)

from .torch_threads import one_torch_thread  # noqa: F401 (autouse)
from .conftest import FAMILIES, TINY, weights_for
from .training_tolerances import (ADAM_UPDATE_RTOL, OPTIMIZER_STEP_ATOL, OPTIMIZER_STEPS, SCHEDULE_RTOL,
                                  weight_differences, zero_gradient_parameter)


def test_schedule_formulas():
    noam = SCHEDULES["noam-paper"]
    assert noam(4000) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)  # the peak
    assert noam(1) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert noam(16000) == pytest.approx(512 ** -0.5 * 16000 ** -0.5)
    cosine = SCHEDULES["cosine"]
    assert [cosine(s) for s in (1, 5)] == pytest.approx([2e-3, 1e-2])
    assert cosine(20) == pytest.approx(1e-4) and cosine(100) == pytest.approx(1e-4)
    assert cosine(12) == pytest.approx(1e-4 + 0.5 * (1e-2 - 1e-4) * (1 + np.cos(np.pi * 7 / 15)))
    with pytest.raises(ValueError, match="count from 1"):
        noam(0)


@pytest.mark.parametrize("fields, message", [
    (dict(kind="linear"), "schedule kind"), (dict(kind="noam", warmup_steps=0), "warmup_steps >= 1"),
    (dict(kind="cosine", warmup_steps=10, total_steps=10), "smaller than total_steps"),
    (dict(kind="cosine", peak_lr=-1.0), "peak_lr"), (dict(kind="cosine", min_lr=1.0, peak_lr=0.1), "min_lr"),
], ids=["kind", "noam-warmup", "cosine-warmup", "negative-lr", "min-above-peak"])
def test_invalid_schedules(fields, message):
    with pytest.raises(ValueError, match=message):
        rn.Schedule(**fields)


@pytest.mark.parametrize("name", list(SCHEDULES), ids=list(SCHEDULES))
def test_schedules_match_reference(name):
    """torch's LambdaLR and Keras's LearningRate give the reference's learning rate at every step."""
    import torch

    from tf_impl.training import Adam
    from torch_impl.training import make_optimizer

    schedule = SCHEDULES[name]
    steps = np.arange(1, 41)
    desired = np.array([schedule(int(s)) for s in steps])
    optimizer, scheduler = make_optimizer(torch.nn.Linear(2, 2), rn.AdamSettings(), schedule)
    torch_lrs = []
    for _ in steps:
        torch_lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    np.testing.assert_allclose(torch_lrs, desired, rtol=SCHEDULE_RTOL, atol=0)
    keras_optimizer = Adam.from_settings(rn.AdamSettings(), schedule)
    keras_lrs = []
    for s in steps:
        keras_optimizer.iterations.assign(int(s) - 1)  # Keras passes the 0-based count of updates done
        keras_lrs.append(float(keras_optimizer.learning_rate))
    np.testing.assert_allclose(keras_lrs, desired, rtol=SCHEDULE_RTOL, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adam_updates_match_reference(dtype):
    """The same gradients through torch.optim.Adam and our Keras Adam equal the reference's update rule."""
    schedule, adam = SCHEDULES["noam"], rn.AdamSettings()
    params, grads = gradient_stream(dtype)
    desired = reference_adam(params, grads, schedule, adam)
    for framework in ("torch", "keras"):
        actual = run_adam(framework, params, grads, schedule, adam)
        assert all(a.dtype == np.dtype(dtype) for a in actual), framework
        error = relative_error(actual, desired)
        assert error <= ADAM_UPDATE_RTOL[dtype], f"{framework}: {error:.3g}"


def test_framework_defaults_that_we_override():
    """The defaults docs/training.md names, and that Keras's stock Adam (epsilon before the bias correction) does not
    compute the paper's update even with the paper's numbers: the reason `tf_impl.training.Adam` exists."""
    import inspect

    import keras
    import torch

    torch_defaults = inspect.signature(torch.optim.Adam).parameters
    assert torch_defaults["betas"].default == (0.9, 0.999) and torch_defaults["eps"].default == 1e-8
    stock = keras.optimizers.Adam()
    assert (stock.beta_1, stock.beta_2, stock.epsilon) == (0.9, 0.999, 1e-7)

    schedule, adam = SCHEDULES["constant"], rn.AdamSettings()
    params, grads = gradient_stream("float64")
    desired = reference_adam(params, grads, schedule, adam)
    error = relative_error(run_adam("keras-stock", params, grads, schedule, adam), desired)
    assert error > 1e4 * ADAM_UPDATE_RTOL["float64"]


@pytest.mark.parametrize("dtype, schedule", [("float64", "noam"), ("float32", "cosine")],
                         ids=["float64-noam", "float32-cosine"])
def test_training_steps_torch_vs_keras(dtype, schedule):
    """Same weights, same batches, dropout off: after N Adam steps the weights agree (key biases: see
    training_tolerances.py; in float32 they random-walk on rounding noise and are left out)."""
    steps = OPTIMIZER_STEPS[dtype]
    (torch_trainer, keras_trainer), losses = train_both(TINY, weights_for(TINY, dtype=dtype), dtype,
                                                        SCHEDULES[schedule], steps)
    assert torch_trainer.step == keras_trainer.step == steps
    differences = weight_differences(keras_trainer.weights(), torch_trainer.weights())
    if dtype == "float32":
        differences = {k: v for k, v in differences.items() if not zero_gradient_parameter(k)}
    worst = max(differences, key=differences.get)
    assert differences[worst] <= OPTIMIZER_STEP_ATOL[dtype], f"{worst}: {differences[worst]:.3g}"
    np.testing.assert_allclose(losses[:, 1], losses[:, 0], rtol=1e-12 if dtype == "float64" else 1e-5)


def test_moments_are_canonical_and_resume_across_frameworks():
    """Adam's moments leave each framework in canonical names, so torch can stop and Keras carry on: 3 torch
    steps + 3 Keras steps equal 6 torch steps (float64)."""
    from tf_impl.training import Trainer as KerasTrainer
    from torch_impl.training import Trainer as TorchTrainer

    schedule = SCHEDULES["noam"]
    weights = weights_for(TINY, dtype="float64")
    batches = [rn.sample_batch(TINY, batch=4, src_len=9, tgt_len=8, seed=100 + s) for s in range(6)]
    straight = TorchTrainer(TINY, weights, dtype="float64", schedule=schedule)
    first = TorchTrainer(TINY, weights, dtype="float64", schedule=schedule)
    for step, (src, tgt) in enumerate(batches):
        straight.train_step(src, tgt[:, :-1], tgt[:, 1:])
        if step < 3:
            first.train_step(src, tgt[:, :-1], tgt[:, 1:])
    moments = first.optimizer_state()
    assert sorted(moments["m"]) == sorted(rn.parameter_shapes(TINY))
    second = KerasTrainer(TINY, first.weights(), dtype="float64", schedule=schedule, compiled=False)
    second.load_optimizer_state(3, moments)
    assert second.learning_rate() == pytest.approx(first.learning_rate(), rel=SCHEDULE_RTOL)
    for src, tgt in batches[3:]:
        second.train_step(src, tgt[:, :-1], tgt[:, 1:])
    differences = weight_differences(second.weights(), straight.weights())
    assert max(differences.values()) <= OPTIMIZER_STEP_ATOL["float64"]


def _decoder_only_batches(config: rn.TransformerConfig, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`(inputs, labels)` per step: a decoder-only model's one sequence, and the same shifted left by one."""
    batches = [rn.sample_batch(config, batch=4, src_len=9, seed=100 + s)[0] for s in range(steps)]
    return [(seq[:, :-1], seq[:, 1:]) for seq in batches]


def test_decoder_only_training_steps_torch_vs_keras():
    """A decoder-only batch (`tgt_in=None`) through both Trainers, float64: the same losses and weights after two
    Adam steps."""
    from tf_impl.training import Trainer as KerasTrainer
    from torch_impl.training import Trainer as TorchTrainer

    config = FAMILIES["gpt2-like"]
    weights = weights_for(config, dtype="float64")
    trainers = [TorchTrainer(config, weights, dtype="float64", schedule=SCHEDULES["noam"]),
                KerasTrainer(config, weights, dtype="float64", schedule=SCHEDULES["noam"], compiled=False)]
    losses = np.array([[t.train_step(ids, None, labels) for t in trainers]
                       for ids, labels in _decoder_only_batches(config, 2)])  # (steps, 2)
    np.testing.assert_allclose(losses[:, 1], losses[:, 0], rtol=1e-12)
    differences = weight_differences(trainers[1].weights(), trainers[0].weights())
    worst = max(differences, key=differences.get)
    assert differences[worst] <= OPTIMIZER_STEP_ATOL["float64"], f"{worst}: {differences[worst]:.3g}"


def test_jit_compiled_training_steps_match_tf_function():
    """`Trainer(jit_compile=True)` (XLA) takes the steps the plain `tf.function` step takes, to float32 rounding
    (key biases left out, as in test_training_steps_torch_vs_keras)."""
    from tf_impl.training import Trainer

    config = FAMILIES["gpt2-like"]
    weights = weights_for(config, dtype="float32")
    trainers = [Trainer(config, weights, schedule=SCHEDULES["cosine"], jit_compile=jit) for jit in (False, True)]
    losses = np.array([[t.train_step(ids, None, labels) for t in trainers]
                       for ids, labels in _decoder_only_batches(config, 2)])  # (steps, 2)
    np.testing.assert_allclose(losses[:, 1], losses[:, 0], rtol=1e-5)
    differences = weight_differences(trainers[1].weights(), trainers[0].weights())
    differences = {k: v for k, v in differences.items() if not zero_gradient_parameter(k)}
    worst = max(differences, key=differences.get)
    assert differences[worst] <= OPTIMIZER_STEP_ATOL["float32"], f"{worst}: {differences[worst]:.3g}"
    with pytest.raises(ValueError, match="compiled=False, jit_compile=True"):
        Trainer(config, weights, compiled=False, jit_compile=True)
