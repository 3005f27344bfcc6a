"""Optimizer and schedule parity: Adam with the paper's settings and the schedules of `reference_numpy.training`
in torch and Keras, checked update by update against the NumPy reference, then N full training steps of both
frameworks from the same weights and batches."""

import numpy as np
import pytest

import reference_numpy as rn

from .torch_threads import one_torch_thread  # noqa: F401 (autouse)
from .conftest import TINY, weights_for
from .training_tolerances import (ADAM_UPDATE_RTOL, OPTIMIZER_STEP_ATOL, OPTIMIZER_STEPS, SCHEDULE_RTOL,
                                  weight_differences, zero_gradient_parameter)

SCHEDULES = {
    "noam": rn.Schedule("noam", d_model=32, warmup_steps=10),
    "noam-paper": rn.Schedule("noam", d_model=512, warmup_steps=4000),
    "cosine": rn.Schedule("cosine", peak_lr=1e-2, warmup_steps=5, total_steps=20, min_lr=1e-4),
    "constant": rn.Schedule("constant", peak_lr=3e-4, warmup_steps=0),
}



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


def _gradient_stream(dtype, steps=8, seed=0):
    """Parameters and per-step gradients spanning nine decades (1e-9 .. 1), the regime where epsilon matters."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 4), (5,)]
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[(rng.standard_normal(s) * 10.0 ** rng.uniform(-9, 0, size=s)).astype(dtype) for s in shapes]
             for _ in range(steps)]
    return params, grads


def _reference_adam(params, grads, schedule, adam):
    params = [p.astype(np.float64) for p in params]
    m, v = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            params[i], m[i], v[i] = rn.adam_update(params[i], g.astype(np.float64), m[i], v[i], t, schedule(t), adam)
    return params


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adam_updates_match_reference(dtype):
    """The same gradients through torch.optim.Adam and our Keras Adam equal the reference's update rule."""
    import keras
    import tensorflow as tf
    import torch

    from tf_impl.training import Adam
    from torch_impl.training import make_optimizer

    schedule, adam = SCHEDULES["noam"], rn.AdamSettings()
    params, grads = _gradient_stream(dtype)
    desired = _reference_adam(params, grads, schedule, adam)

    torch_params = torch.nn.ParameterList([torch.nn.Parameter(torch.tensor(p)) for p in params])
    optimizer, scheduler = make_optimizer(torch_params, adam, schedule)
    for step_grads in grads:
        for p, g in zip(torch_params, step_grads):
            p.grad = torch.tensor(g)
        optimizer.step()
        scheduler.step()
    keras_params = [keras.Variable(p) for p in params]
    keras_optimizer = Adam.from_settings(adam, schedule)
    for step_grads in grads:
        keras_optimizer.apply([tf.constant(g) for g in step_grads], keras_params)
    for i, d in enumerate(desired):
        for framework, actual in (("torch", torch_params[i].detach().numpy()), ("keras", keras_params[i].numpy())):
            assert actual.dtype == np.dtype(dtype)
            error = np.abs(actual - d).max() / np.abs(d).max()
            assert error <= ADAM_UPDATE_RTOL[dtype], f"{framework} parameter {i}: {error:.3g}"


def test_framework_defaults_that_we_override():
    """The defaults README.md names, and that Keras's stock Adam (epsilon before the bias correction) does not
    compute the paper's update even with the paper's numbers: the reason `tf_impl.training.Adam` exists."""
    import inspect

    import keras
    import tensorflow as tf
    import torch

    torch_defaults = inspect.signature(torch.optim.Adam).parameters
    assert torch_defaults["betas"].default == (0.9, 0.999) and torch_defaults["eps"].default == 1e-8
    stock = keras.optimizers.Adam()
    assert (stock.beta_1, stock.beta_2, stock.epsilon) == (0.9, 0.999, 1e-7)

    schedule, adam = SCHEDULES["constant"], rn.AdamSettings()
    params, grads = _gradient_stream("float64")
    desired = _reference_adam(params, grads, schedule, adam)
    variables = [keras.Variable(p) for p in params]
    stock = keras.optimizers.Adam(learning_rate=schedule(1), beta_1=adam.beta1, beta_2=adam.beta2, epsilon=adam.eps)
    for step_grads in grads:
        stock.apply([tf.constant(g) for g in step_grads], variables)
    error = max(np.abs(v.numpy() - d).max() / np.abs(d).max() for v, d in zip(variables, desired))
    assert error > 1e4 * ADAM_UPDATE_RTOL["float64"]


def _train_both(dtype, schedule, steps, seed=0):
    from tf_impl.training import Trainer as KerasTrainer
    from torch_impl.training import Trainer as TorchTrainer

    weights = weights_for(TINY, seed=seed, dtype=dtype)
    trainers = [cls(TINY, weights, dtype=dtype, schedule=schedule, label_smoothing=0.1)
                for cls in (TorchTrainer, KerasTrainer)]
    losses = []
    for step in range(steps):
        src, tgt = rn.sample_batch(TINY, batch=4, src_len=9, tgt_len=8, seed=100 + step)
        losses.append([t.train_step(src, tgt[:, :-1], tgt[:, 1:]) for t in trainers])
    return trainers, np.array(losses)


@pytest.mark.parametrize("dtype, schedule", [("float64", "noam"), ("float32", "cosine")],
                         ids=["float64-noam", "float32-cosine"])
def test_training_steps_torch_vs_keras(dtype, schedule):
    """Same weights, same batches, dropout off: after N Adam steps the weights agree (key biases: see
    training_tolerances.py; in float32 they random-walk on rounding noise and are left out)."""
    steps = OPTIMIZER_STEPS[dtype]
    (torch_trainer, keras_trainer), losses = _train_both(dtype, SCHEDULES[schedule], steps)
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
