"""Measure the training-parity figures README.md and parity_tests/training_tolerances.py quote.

- gradients: torch and Keras (float64, float32) against float64 torch, every variant of parity_tests.conftest,
  label smoothing 0 and 0.1, as `gradient_error` (max|a - d| / max|d| per parameter; key biases relative to the
  model's largest gradient entry);
- Adam: the same gradients through torch.optim.Adam and tf_impl's Keras Adam against `reference_numpy.adam_update`;
- schedules: torch's LambdaLR and Keras's LearningRate against the reference, in ulps;
- 20 training steps, torch vs Keras, same weights and batches, dropout off: max |w_torch - w_keras|.

    python -m benchmarks.training_parity
"""

from __future__ import annotations

import os
import sys

import numpy as np

import reference_numpy as rn


def main() -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import torch

    import tf_impl
    import torch_impl
    from parity_tests.conftest import TINY, VARIANTS, weights_for
    from parity_tests.test_gradients import batch_for
    from parity_tests.test_optim import SCHEDULES, _gradient_stream, _reference_adam
    from parity_tests.training_tolerances import gradient_errors, weight_differences, zero_gradient_parameter
    from tf_impl.training import Adam, LearningRate, Trainer as KerasTrainer, loss_and_gradients as keras_grads
    from torch_impl.training import Trainer as TorchTrainer, loss_and_gradients as torch_grads, make_optimizer

    torch.set_num_threads(1)  # torch's OpenMP threads and TensorFlow's pools fight on 2 cores

    def split(errors):
        ordinary = max(v for k, v in errors.items() if not zero_gradient_parameter(k))
        key_bias = max([v for k, v in errors.items() if zero_gradient_parameter(k)] or [0.0])
        return ordinary, key_bias

    worst = {}
    for name, config in VARIANTS.items():
        weights = weights_for(config, dtype=np.float64)
        batch = batch_for(config)
        weights32 = {k: v.astype(np.float32) for k, v in weights.items()}
        for smoothing in (0.0, 0.1):
            _, desired = torch_grads(torch_impl.Transformer.from_reference(config, weights), *batch, smoothing)
            runs = {"keras float64": keras_grads(tf_impl.Transformer.from_reference(config, weights), *batch,
                                                 smoothing)[1],
                    "torch float32": torch_grads(torch_impl.Transformer.from_reference(config, weights32), *batch,
                                                 smoothing)[1],
                    "keras float32": keras_grads(tf_impl.Transformer.from_reference(config, weights32), *batch,
                                                 smoothing)[1]}
            for label, actual in runs.items():
                ordinary, key_bias = split(gradient_errors(actual, desired))
                previous = worst.get(label, (0.0, 0.0, ""))
                worst[label] = (max(previous[0], ordinary), max(previous[1], key_bias),
                                name if ordinary > previous[0] else previous[2])
    print(f"gradients vs float64 torch, {len(VARIANTS)} variants x label smoothing 0 / 0.1 (gradient_error)\n")
    print("| gradients | worst, ordinary parameters | worst variant | key biases (vs largest gradient) |")
    print("|---|---|---|---|")
    for label, (ordinary, key_bias, name) in worst.items():
        print(f"| {label} | {ordinary:.1e} | {name} | {key_bias:.1e} |")

    print("\nAdam, 8 updates of the same gradients (1e-9 .. 1), noam schedule, vs reference_numpy.adam_update\n")
    print("| dtype | torch.optim.Adam | tf_impl Adam (Keras) | stock keras.optimizers.Adam, same numbers |")
    print("|---|---|---|---|")
    import keras
    import tensorflow as tf
    for dtype in ("float64", "float32"):
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
        ours = [keras.Variable(p) for p in params]
        stock = [keras.Variable(p) for p in params]
        ours_opt = Adam.from_settings(adam, schedule)
        stock_opt = keras.optimizers.Adam(learning_rate=LearningRate(schedule), beta_1=adam.beta1,
                                          beta_2=adam.beta2, epsilon=adam.eps)
        for step_grads in grads:
            ours_opt.apply([tf.constant(g) for g in step_grads], ours)
            stock_opt.apply([tf.constant(g) for g in step_grads], stock)

        def error(values):
            return max(np.abs(np.asarray(v) - d).max() / np.abs(d).max() for v, d in zip(values, desired))

        print(f"| {dtype} | {error([p.detach().numpy() for p in torch_params]):.1e} | "
              f"{error([v.numpy() for v in ours]):.1e} | {error([v.numpy() for v in stock]):.1e} |")

    print("\nlearning rates, steps 1..2000, vs the reference's Schedule (ulps of float64)\n")
    print("| schedule | torch LambdaLR | Keras LearningRate |")
    print("|---|---|---|")
    for name, schedule in SCHEDULES.items():
        steps = np.arange(1, 2001)
        desired = np.array([schedule(int(s)) for s in steps])
        optimizer, scheduler = make_optimizer(torch.nn.Linear(1, 1), rn.AdamSettings(), schedule)
        torch_lrs = []
        for _ in steps:
            torch_lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()  # no gradients: a no-op, but the order LambdaLR expects
            scheduler.step()
        keras_lrs = np.asarray(LearningRate(schedule)(steps - 1))
        ulp = np.spacing(desired)
        print(f"| {name} | {np.max(np.abs(np.array(torch_lrs) - desired) / ulp):.0f} | "
              f"{np.max(np.abs(keras_lrs - desired) / ulp):.0f} |")

    print("\n20 training steps on the tiny preset, same weights and batches, label smoothing 0.1, dropout off:")
    print("max |w_keras - w_torch| after the steps\n")
    print("| dtype | schedule | ordinary parameters | key biases | final loss torch / Keras |")
    print("|---|---|---|---|---|")
    for dtype, name in (("float64", "noam"), ("float64", "cosine"), ("float32", "noam"), ("float32", "cosine")):
        weights = weights_for(TINY, dtype=dtype)
        trainers = [cls(TINY, weights, dtype=dtype, schedule=SCHEDULES[name], label_smoothing=0.1)
                    for cls in (TorchTrainer, KerasTrainer)]
        for step in range(20):
            src, tgt = rn.sample_batch(TINY, batch=4, src_len=9, tgt_len=8, seed=100 + step)
            losses = [t.train_step(src, tgt[:, :-1], tgt[:, 1:]) for t in trainers]
        ordinary, key_bias = split(weight_differences(trainers[1].weights(), trainers[0].weights()))
        print(f"| {dtype} | {name} | {ordinary:.1e} | {key_bias:.1e} | {losses[0]:.6f} / {losses[1]:.6f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
