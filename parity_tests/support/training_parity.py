"""What the training-parity tests and `benchmarks/training_parity.py` both run: the error measures, the gradient
batches, the Adam comparison (the same gradients through torch, tf_impl's Keras Adam and the NumPy reference) and N
training steps of both frameworks from the same weights. The tests assert on these; the benchmark prints them.

Tolerances and why they are what they are: `parity_tests/training_tolerances.py`. Frameworks are imported inside the
functions that need them.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

import reference_numpy as rn

# The schedules the tests and the benchmark use (small warm-ups so that 20 steps cover warm-up and decay).
SCHEDULES = {
    "noam": rn.Schedule("noam", d_model=32, warmup_steps=10),
    "noam-paper": rn.Schedule("noam", d_model=512, warmup_steps=4000),
    "cosine": rn.Schedule("cosine", peak_lr=1e-2, warmup_steps=5, total_steps=20, min_lr=1e-4),
    "constant": rn.Schedule("constant", peak_lr=3e-4, warmup_steps=0),
}
TRAINING_BATCH = {"batch": 4, "src_len": 9, "tgt_len": 8}  # the batches of train_both, seeds 100, 101, ...


# --- error measures (training_tolerances.py explains them) -----------------------------------------------------------

def zero_gradient_parameter(name: str) -> bool:
    """Parameters whose gradient is exactly zero in exact arithmetic: attention key biases."""
    return name.endswith(".k.bias")


def gradient_errors(actual: Mapping[str, np.ndarray], desired: Mapping[str, np.ndarray]) -> dict[str, float]:
    """`max|a - d| / max|d|` of every parameter's gradient, keyed by canonical name; key biases (whose exact
    gradient is zero) relative to the largest gradient entry of the whole model."""
    if sorted(actual) != sorted(desired):
        raise ValueError(f"gradients for different parameter sets: {sorted(set(actual) ^ set(desired))}")
    scale = max(float(np.abs(d).max()) for d in desired.values())
    errors = {}
    for name, d in desired.items():
        a = np.asarray(actual[name], dtype=np.float64)
        denominator = scale if zero_gradient_parameter(name) else float(np.abs(d).max())
        diff = float(np.abs(a - d).max())
        errors[name] = diff / denominator if denominator > 0 else diff
    return errors


def weight_differences(actual: Mapping[str, np.ndarray], desired: Mapping[str, np.ndarray]) -> dict[str, float]:
    """`max|a - d|` of every parameter, keyed by canonical name."""
    if sorted(actual) != sorted(desired):
        raise ValueError(f"weights for different parameter sets: {sorted(set(actual) ^ set(desired))}")
    return {name: float(np.abs(np.asarray(actual[name], np.float64) - desired[name]).max()) for name in desired}


def split_key_biases(errors: Mapping[str, float]) -> tuple[float, float]:
    """`(worst of the ordinary parameters, worst of the key biases)`."""
    ordinary = max(v for k, v in errors.items() if not zero_gradient_parameter(k))
    key_bias = max([v for k, v in errors.items() if zero_gradient_parameter(k)] or [0.0])
    return ordinary, key_bias


# --- gradients --------------------------------------------------------------------------------------------------------

def batch_for(config: rn.TransformerConfig, seed: int = 1):
    """`(src, tgt_in, labels)`; an encoder-only model gets `tgt_in=None` and per-position labels."""
    if config.is_encoder_decoder:
        src, tgt = rn.sample_batch(config, batch=3, src_len=9, tgt_len=8, seed=seed)
        return src, tgt[:, :-1], tgt[:, 1:]
    src, _ = rn.sample_batch(config, batch=3, src_len=9, seed=seed)
    return src, None, rn.sample_ids(config, 3, 9, config.tgt_vocab_size, seed + 1)


# --- Adam: the same gradients through every optimizer ----------------------------------------------------------------

def gradient_stream(dtype, steps: int = 8, seed: int = 0):
    """Parameters and per-step gradients spanning nine decades (1e-9 .. 1), the regime where epsilon matters."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 4), (5,)]
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[(rng.standard_normal(s) * 10.0 ** rng.uniform(-9, 0, size=s)).astype(dtype) for s in shapes]
             for _ in range(steps)]
    return params, grads


def reference_adam(params, grads, schedule: rn.Schedule, adam: rn.AdamSettings) -> list[np.ndarray]:
    """The parameters after `grads` through `reference_numpy.adam_update`, in float64."""
    params = [p.astype(np.float64) for p in params]
    m, v = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            params[i], m[i], v[i] = rn.adam_update(params[i], g.astype(np.float64), m[i], v[i], t, schedule(t), adam)
    return params


def run_adam(optimizer: str, params: Sequence[np.ndarray], grads, schedule: rn.Schedule,
             adam: rn.AdamSettings) -> list[np.ndarray]:
    """The parameters after `grads` through one optimizer, in the parameters' dtype: `torch` (torch.optim.Adam with
    explicit settings and LambdaLR), `keras` (tf_impl.training.Adam, epsilon after the bias correction) or
    `keras-stock` (keras.optimizers.Adam with the same numbers, epsilon before it)."""
    if optimizer == "torch":
        import torch

        from torch_impl.training import make_optimizer

        torch_params = torch.nn.ParameterList([torch.nn.Parameter(torch.tensor(p)) for p in params])
        opt, scheduler = make_optimizer(torch_params, adam, schedule)
        for step_grads in grads:
            for p, g in zip(torch_params, step_grads):
                p.grad = torch.tensor(g)
            opt.step()
            scheduler.step()
        return [p.detach().numpy() for p in torch_params]
    if optimizer in ("keras", "keras-stock"):
        from tf_impl.startup import tf  # before keras: its import loads TensorFlow
        import keras

        from tf_impl.training import Adam, LearningRate

        variables = [keras.Variable(p) for p in params]
        if optimizer == "keras":
            opt = Adam.from_settings(adam, schedule)
        else:
            opt = keras.optimizers.Adam(learning_rate=LearningRate(schedule), beta_1=adam.beta1, beta_2=adam.beta2,
                                        epsilon=adam.eps)
        for step_grads in grads:
            opt.apply([tf.constant(g) for g in step_grads], variables)
        return [v.numpy() for v in variables]
    raise ValueError(f"unknown optimizer {optimizer!r}; choose torch, keras or keras-stock")


def relative_error(actual: Sequence[np.ndarray], desired: Sequence[np.ndarray]) -> float:
    """The worst `max|a - d| / max|d|` over a list of parameters."""
    return max(float(np.abs(a - d).max() / np.abs(d).max()) for a, d in zip(actual, desired))


# --- N training steps of both frameworks --------------------------------------------------------------------------

def train_both(config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], dtype: str, schedule: rn.Schedule,
               steps: int, label_smoothing: float = 0.1):
    """torch and Keras `Trainer`s from the same weights over the same batches, dropout as in `config`:
    `([torch_trainer, keras_trainer], losses (steps, 2))`."""
    from tf_impl.training import Trainer as KerasTrainer
    from torch_impl.training import Trainer as TorchTrainer

    trainers = [cls(config, weights, dtype=dtype, schedule=schedule, label_smoothing=label_smoothing)
                for cls in (TorchTrainer, KerasTrainer)]
    losses = []
    for step in range(steps):
        src, tgt = rn.sample_batch(config, seed=100 + step, **TRAINING_BATCH)
        losses.append([t.train_step(src, tgt[:, :-1], tgt[:, 1:]) for t in trainers])
    return trainers, np.array(losses)
