"""Training math as pure NumPy functions: the padded token cross-entropy (with label smoothing), Adam's update rule
and the learning-rate schedules. The backends' training code is checked against these.

Conventions shared with `torch_impl.training` and `tf_impl.training`:
- steps count from 1: `schedule(step)` is the learning rate of the step-th optimizer update, and Adam's bias
  corrections use the same `step`;
- Adam places epsilon as Kingma & Ba's Algorithm 1 and PyTorch do, *after* bias-correcting the second moment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .ops import padding_mask


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def token_cross_entropy(logits: np.ndarray, targets: np.ndarray, pad_id: int | None, label_smoothing: float = 0.0
                        ) -> float:
    """Mean cross-entropy over the target positions that are not padding.

    With label smoothing `eps` the target distribution is `(1 - eps) * one_hot + eps / V` over all `V` classes,
    which is the definition of `torch.nn.functional.cross_entropy(label_smoothing=eps)` and of Keras's
    `CategoricalCrossentropy(label_smoothing=eps)`. Per token that is `(1 - eps) * nll + eps * mean_c(-log p_c)`.
    (The paper uses eps = 0.1 without saying how the padding class is treated; this is the frameworks' form.)

    Args:
        logits: `(..., V)` scores.
        targets: `(...)` integer class ids; positions equal to `pad_id` do not count.
        pad_id: the padding id; None (a model with no pad token): every position counts.
        label_smoothing: `eps` in [0, 1).

    Returns:
        The loss as a Python float (0.0 if every position is padding).
    """
    check_label_smoothing(label_smoothing)
    logits, targets = np.asarray(logits), np.asarray(targets)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {logits.shape} and targets {targets.shape} disagree on the leading dimensions")
    logp = log_softmax(logits)  # (..., V)
    keep = padding_mask(targets, pad_id)
    nll = -np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], axis=-1)[..., 0]  # (...)
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * -logp.mean(axis=-1)
    count = int(keep.sum())
    return float(np.where(keep, per_token, 0.0).sum() / max(count, 1))


def check_label_smoothing(value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"label_smoothing must be a number in [0, 1), received {value!r}")


# --- learning-rate schedules ---------------------------------------------------------------------------------------

SCHEDULES = ("noam", "cosine", "constant")


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule, evaluated at 1-based optimizer steps.

    `noam` (the paper, section 5.3): `scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)`;
        `peak_lr` is unused (the peak, at `step == warmup_steps`, is `scale * (d_model * warmup_steps)**-0.5`).
    `cosine`: linear warm-up from `peak_lr / warmup_steps` to `peak_lr` over `warmup_steps`, then a half cosine
        from `peak_lr` down to `min_lr` at `total_steps`, and `min_lr` after that.
    `constant`: `peak_lr` at every step.
    """

    kind: str = "noam"
    d_model: int = 512  # noam only
    warmup_steps: int = 4000
    scale: float = 1.0  # noam only: the multiplier many implementations (e.g. tensor2tensor) put in front
    peak_lr: float = 1e-3  # cosine and constant
    total_steps: int = 100_000  # cosine only
    min_lr: float = 0.0  # cosine only

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule kind must be one of {', '.join(SCHEDULES)}, received {self.kind!r}")
        for name in ("d_model", "warmup_steps", "total_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name != "warmup_steps" else 0):
                raise ValueError(f"{name} must be a positive integer, received {value!r}")
        for name in ("scale", "peak_lr", "min_lr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (value == 0 and name != "min_lr"):
                raise ValueError(f"{name} must be a positive number, received {value!r}")
        if self.kind == "noam" and self.warmup_steps < 1:
            raise ValueError("the noam schedule needs warmup_steps >= 1, received 0")
        if self.kind == "cosine":
            if self.warmup_steps >= self.total_steps:
                raise ValueError(f"warmup_steps={self.warmup_steps} must be smaller than total_steps="
                                 f"{self.total_steps}")
            if self.min_lr > self.peak_lr:
                raise ValueError(f"min_lr={self.min_lr} is above peak_lr={self.peak_lr}")

    def __call__(self, step: int) -> float:
        """The learning rate of the `step`-th update (`step >= 1`), in float64."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
            raise ValueError(f"schedule steps count from 1, received {step!r}")
        if self.kind == "noam":
            return noam_lr(int(step), self.d_model, self.warmup_steps, self.scale)
        if self.kind == "cosine":
            return cosine_lr(int(step), self.peak_lr, self.warmup_steps, self.total_steps, self.min_lr)
        return float(self.peak_lr)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def noam_lr(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """`scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)` (equation 3 of the paper)."""
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def cosine_lr(step: int, peak_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> float:
    """Linear warm-up to `peak_lr` over `warmup_steps`, then cosine decay to `min_lr` at `total_steps`."""
    if step <= warmup_steps:
        return peak_lr * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


# --- Adam ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AdamSettings:
    """Adam's hyperparameters; the defaults are the paper's (section 5.3), not any framework's.

    Framework defaults differ: PyTorch `betas=(0.9, 0.999), eps=1e-8`; Keras `beta_2=0.999, epsilon=1e-7` and
    epsilon added before the bias correction of the step. The backends pass every field explicitly.
    """

    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9

    def __post_init__(self) -> None:
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{name} must be a number in [0, 1), received {value!r}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not self.eps > 0:
            raise ValueError(f"eps must be a positive number, received {self.eps!r}")

    def to_dict(self) -> dict:
        return {"beta1": self.beta1, "beta2": self.beta2, "eps": self.eps}


def adam_update(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, step: int, lr: float,
                settings: AdamSettings = AdamSettings()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One Adam update (Kingma & Ba, Algorithm 1; PyTorch's `torch.optim.Adam` op for op), returning new arrays
    `(param, m, v)`; `step` is 1 for the first update.

        m <- m + (1 - beta1) (g - m)            v <- beta2 v + (1 - beta2) g^2
        param <- param - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
    """
    b1, b2 = settings.beta1, settings.beta2
    m = m + (grad - m) * (1 - b1)
    v = v * b2 + grad * grad * (1 - b2)
    bias_correction1 = 1 - b1 ** step
    bias_correction2_sqrt = math.sqrt(1 - b2 ** step)
    denom = np.sqrt(v) / bias_correction2_sqrt + settings.eps
    return param - (lr / bias_correction1) * (m / denom), m, v
