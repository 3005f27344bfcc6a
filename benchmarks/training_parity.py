"""Measure the training-parity figures docs/training.md and parity_tests/training_tolerances.py quote.

- gradients: torch and Keras (float64, float32) against float64 torch, every variant of `VARIANTS` below,
  label smoothing 0 and 0.1, as `gradient_error` (max|a - d| / max|d| per parameter; key biases relative to the
  model's largest gradient entry);
- Adam: the same gradients through torch.optim.Adam and tf_impl's Keras Adam against `reference_numpy.adam_update`;
- schedules: torch's LambdaLR and Keras's LearningRate against the reference, in ulps;
- 20 training steps, torch vs Keras, same weights and batches, dropout off: max |w_torch - w_keras|.

    python -m benchmarks.training_parity

What it runs is `parity_tests.support.training_parity`, the same functions the tests assert on (the test package is
not imported: a benchmark is a program of the product).
"""

from __future__ import annotations

import os
import sys

import numpy as np

import reference_numpy as rn
from parity_tests.support.training_parity import (SCHEDULES, batch_for, gradient_errors, gradient_stream,
                                                reference_adam, relative_error, run_adam, split_key_biases,
                                                train_both, weight_differences)
from parity_tests.support.variants import TINY, VARIANTS
from transformer_parity.verify import seeded_weights


def main() -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import torch

    import tf_impl
    import torch_impl
    from tf_impl.training import LearningRate, loss_and_gradients as keras_grads
    from torch_impl.training import loss_and_gradients as torch_grads, make_optimizer

    torch.set_num_threads(1)  # torch's OpenMP threads and TensorFlow's pools fight on 2 cores

    worst = {}
    for name, config in VARIANTS.items():
        weights = seeded_weights(config, 0, np.float64)
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
                ordinary, key_bias = split_key_biases(gradient_errors(actual, desired))
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
    for dtype in ("float64", "float32"):
        schedule, adam = SCHEDULES["noam"], rn.AdamSettings()
        params, grads = gradient_stream(dtype)
        desired = reference_adam(params, grads, schedule, adam)
        errors = [relative_error(run_adam(o, params, grads, schedule, adam), desired)
                  for o in ("torch", "keras", "keras-stock")]
        print(f"| {dtype} | " + " | ".join(f"{e:.1e}" for e in errors) + " |")

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
        trainers, losses = train_both(TINY, seeded_weights(TINY, 0, np.dtype(dtype)), dtype, SCHEDULES[name], 20)
        ordinary, key_bias = split_key_biases(weight_differences(trainers[1].weights(), trainers[0].weights()))
        losses = losses[-1]
        print(f"| {dtype} | {name} | {ordinary:.1e} | {key_bias:.1e} | {losses[0]:.6f} / {losses[1]:.6f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
