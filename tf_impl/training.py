"""Training in Keras 3 / TensorFlow with the reference's numbers: the padded, label-smoothed cross-entropy, Adam with
PyTorch's (and Algorithm 1's) epsilon placement, the schedules of `reference_numpy.training`, and gradients and
optimizer moments in canonical names. Class for class the twin of `torch_impl.training`.

Framework defaults we override (see docs/training.md):
- `keras.optimizers.Adam` defaults to `beta_2=0.999, epsilon=1e-7`; every field of `AdamSettings` is passed.
- Keras's Adam adds epsilon to `sqrt(v)` *before* bias-correcting the step (`lr * sqrt(1 - b2^t) / (1 - b1^t) *
  m / (sqrt(v) + eps)`, the "epsilon hat" of Kingma & Ba section 2), which equals PyTorch's update only with
  `eps / sqrt(1 - b2^t)` in place of `eps`. `Adam` below overrides `update_step` with PyTorch's order of operations.
- A float learning rate becomes a float32 variable (`keras.backend.floatx()`); `LearningRate` evaluates the
  schedule in float64 instead.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
from .startup import tf  # noqa: I001 (before keras: its import loads TensorFlow)
import keras  # noqa: E402
from keras import ops

import reference_numpy as rn
from reference_numpy.training import AdamSettings, Schedule, check_label_smoothing

from .model import Transformer, padding_mask, weight_table


def token_cross_entropy(logits: tf.Tensor, targets, pad_id: int | None, label_smoothing: float = 0.0) -> tf.Tensor:
    """Mean cross-entropy over non-padding targets (all of them when `pad_id` is None); Keras's own
    `categorical_crossentropy(label_smoothing=...)` per token (the same definition as
    `reference_numpy.token_cross_entropy` and PyTorch's), masked and averaged."""
    check_label_smoothing(label_smoothing)
    targets = tf.convert_to_tensor(targets)
    one_hot = tf.one_hot(targets, tf.shape(logits)[-1], dtype=logits.dtype)  # (B, T, V)
    per_token = keras.losses.categorical_crossentropy(one_hot, logits, from_logits=True,
                                                      label_smoothing=label_smoothing)  # (B, T)
    keep = padding_mask(targets, pad_id)
    total = tf.reduce_sum(tf.where(keep, per_token, tf.zeros_like(per_token)))
    return total / tf.maximum(tf.reduce_sum(tf.cast(keep, logits.dtype)), 1)


def _named_variables(model: Transformer) -> dict[str, keras.Variable]:
    """The model's weights under their Keras paths below the model, the names `weight_table` maps."""
    if not model.built:
        model.build()
    return model._variables()


def loss_and_gradients(model: Transformer, src_ids, tgt_in, labels, label_smoothing: float = 0.0
                       ) -> tuple[float, dict[str, np.ndarray]]:
    """One forward pass under `GradientTape`; returns the loss and its gradient w.r.t. every canonical parameter."""
    variables = _named_variables(model)
    with tf.GradientTape() as tape:
        logits = model(src_ids, tgt_in, training=True)
        loss = token_cross_entropy(logits, labels, model.config.pad_id, label_smoothing)
    grads = tape.gradient(loss, list(variables.values()))
    state = {name: (np.zeros(v.shape, v.dtype) if g is None else np.asarray(tf.convert_to_tensor(g)))
             for (name, v), g in zip(variables.items(), grads)}  # embedding gradients arrive as IndexedSlices
    return float(loss), rn.from_framework_state(model.config, state, weight_table(model.config))


class LearningRate(keras.optimizers.schedules.LearningRateSchedule):
    """A `reference_numpy.Schedule` as a Keras schedule, computed in float64. Keras passes the 0-based number of
    updates done; the reference's schedules count from 1."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule

    def __call__(self, iterations):
        s = self.schedule
        step = ops.cast(iterations, "float64") + 1.0
        if s.kind == "noam":
            return s.scale * s.d_model ** -0.5 * ops.minimum(ops.power(step, -0.5), step * s.warmup_steps ** -1.5)
        if s.kind == "cosine":
            warm = s.peak_lr * step / s.warmup_steps
            progress = ops.minimum(1.0, (step - s.warmup_steps) / (s.total_steps - s.warmup_steps))
            decay = s.min_lr + 0.5 * (s.peak_lr - s.min_lr) * (1.0 + ops.cos(math.pi * progress))
            return ops.where(step <= s.warmup_steps, warm, decay)
        return ops.convert_to_tensor(float(s.peak_lr), "float64")

    def get_config(self):
        return self.schedule.to_dict()


class Adam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` with epsilon added after the bias correction, as in Kingma & Ba's Algorithm 1 and
    `torch.optim.Adam`, op for op:

        m <- m + (1 - b1) (g - m);  v <- b2 v + (1 - b2) g g
        var <- var - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    The scalar factors are computed in float64 and rounded once to the variable's dtype (PyTorch computes them as
    Python floats). Construct it with `Adam.from_settings(adam, schedule)`.
    """

    @classmethod
    def from_settings(cls, adam: AdamSettings, schedule: Schedule) -> "Adam":
        return cls(learning_rate=LearningRate(schedule), beta_1=adam.beta1, beta_2=adam.beta2, epsilon=adam.eps,
                   amsgrad=False, weight_decay=None, clipnorm=None, clipvalue=None, global_clipnorm=None,
                   use_ema=False)

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        step = ops.cast(self.iterations + 1, "float64")
        bias_correction1 = 1.0 - ops.power(_constant(self.beta_1, "float64"), step)
        bias_correction2_sqrt = ops.sqrt(1.0 - ops.power(_constant(self.beta_2, "float64"), step))
        step_size = ops.cast(ops.cast(learning_rate, "float64") / bias_correction1, dtype)
        bias_correction2_sqrt = ops.cast(bias_correction2_sqrt, dtype)
        g = ops.cast(gradient, dtype)
        m, v = self.moments(variable)
        self.assign(m, m + _constant(1.0 - self.beta_1, dtype) * (g - m))  # torch: exp_avg.lerp_(grad, 1 - beta1)
        # torch: exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        self.assign(v, v * _constant(self.beta_2, dtype) + _constant(1.0 - self.beta_2, dtype) * g * g)
        denom = ops.sqrt(v) / bias_correction2_sqrt + _constant(self.epsilon, dtype)
        self.assign_sub(variable, step_size * (m / denom))

    def moments(self, variable) -> tuple[keras.Variable, keras.Variable]:
        """`(m, v)`, the first and second moment estimates kept for `variable`."""
        index = self._get_variable_index(variable)
        return self._momentums[index], self._velocities[index]


def _constant(value: float, dtype) -> tf.Tensor:
    """A Python float as a tensor of `dtype`, rounded once. (`keras.ops.cast(0.9, "float64")` goes through a
    float32 tensor first: 0.9 would become 0.8999999761581421.)"""
    return tf.constant(value, dtype=dtype)


class Trainer:
    """A Keras model with its optimizer and schedule, seen through canonical weights (the twin of
    `torch_impl.training.Trainer`, same methods).

    Args:
        config: the model's hyperparameters (dropout comes from here).
        weights: canonical initial weights.
        dtype: "float32" or "float64".
        adam, schedule, label_smoothing: the optimisation settings.
        seed: seeds the dropout masks of step `s` with `(seed, s)`, so a resumed run draws the same masks.
        compiled: run each training step as one `tf.function` (traced on the first step, a few seconds); False
            runs eagerly, quicker for a handful of steps.
        jit_compile: compile that step with XLA (`tf.function(jit_compile=True)`; needs `compiled`). Each step
            runs faster (on gpt2-256 about as fast as KerasHub's GPT-2 under XLA), at the price of compiling on the
            first step (several seconds there) and again for every new batch shape. float64 results then agree
            with the eager step to float64 rounding, not bit for bit (XLA fuses and reorders).

    A decoder-only model (`num_encoder_layers=0`) takes its one sequence as `src_ids`, with `tgt_in=None`.
    """

    framework = "tf"

    def __init__(self, config: rn.TransformerConfig, weights: Mapping[str, np.ndarray], *, dtype: str = "float32",
                 adam: AdamSettings = AdamSettings(), schedule: Schedule = Schedule(), label_smoothing: float = 0.0,
                 seed: int = 0, compiled: bool = True, jit_compile: bool = False):
        check_label_smoothing(label_smoothing)
        if jit_compile and not compiled:
            raise ValueError("jit_compile=True compiles the tf.function step, which compiled=False does not make; "
                             "received compiled=False, jit_compile=True")
        self.config, self.label_smoothing, self.seed = config, label_smoothing, seed
        self.adam, self.schedule = adam, schedule
        self.model = Transformer.from_reference(config, weights, dtype=dtype)
        self.variables = _named_variables(self.model)
        self.optimizer = Adam.from_settings(adam, schedule)
        self.optimizer.build(list(self.variables.values()))
        self._seed_states = [v for v in self.model.variables if v.path.endswith("seed_generator_state")]
        self._train_step = (tf.function(self._train_step_eager, reduce_retracing=True, jit_compile=jit_compile)
                            if compiled else self._train_step_eager)

    @property
    def step(self) -> int:
        """Optimizer updates done."""
        return int(self.optimizer.iterations.numpy())

    def _train_step_eager(self, src_ids, tgt_in, labels):
        variables = list(self.variables.values())
        with tf.GradientTape() as tape:
            logits = self.model(src_ids, tgt_in, training=True)
            loss = token_cross_entropy(logits, labels, self.config.pad_id, self.label_smoothing)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]  # IndexedSlices -> dense
        self.optimizer.apply(grads, variables)
        return loss

    def train_step(self, src_ids: np.ndarray, tgt_in: np.ndarray | None, labels: np.ndarray) -> float:
        """One update on one batch (decoder-only: the sequence in `src_ids`, `tgt_in=None`); returns the batch
        loss before the update."""
        for i, state in enumerate(self._seed_states):  # dropout masks of step s depend on (seed, s) only
            state.assign(np.array([self.seed * 1_000_003 + self.step, i], dtype=state.dtype))
        tgt_in = None if tgt_in is None else tf.convert_to_tensor(tgt_in)
        return float(self._train_step(tf.convert_to_tensor(src_ids), tgt_in, tf.convert_to_tensor(labels)))

    def learning_rate(self) -> float:
        """The learning rate the next update will use."""
        return float(self.optimizer.learning_rate)

    def logits(self, src_ids: np.ndarray, tgt_in: np.ndarray) -> np.ndarray:
        """Teacher-forced logits in inference mode (no dropout)."""
        return np.asarray(self.model(src_ids, tgt_in, training=False))  # eager: rare, and tracing costs seconds

    def weights(self) -> dict[str, np.ndarray]:
        return self.model.to_reference()

    def optimizer_state(self) -> dict[str, dict[str, np.ndarray]]:
        """Adam's moments in canonical names and layout: `{"m": {...}, "v": {...}}` (zeros before the first step)."""
        moments = {"m": {}, "v": {}}
        for name, variable in self.variables.items():
            m, v = self.optimizer.moments(variable)
            moments["m"][name], moments["v"][name] = np.asarray(m.numpy()), np.asarray(v.numpy())
        table = weight_table(self.config)
        return {key: rn.from_framework_state(self.config, state, table) for key, state in moments.items()}

    def load_optimizer_state(self, step: int, moments: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Resume after `step` updates with canonical moments `{"m": ..., "v": ...}` (from any framework)."""
        table = weight_table(self.config)
        framework = {key: rn.to_framework_state(self.config, moments[key], table) for key in ("m", "v")}
        for name, variable in self.variables.items():
            m, v = self.optimizer.moments(variable)
            m.assign(np.asarray(framework["m"][name], dtype=m.dtype))
            v.assign(np.asarray(framework["v"][name], dtype=v.dtype))
        self.optimizer.iterations.assign(step)
