"""Synthetic sequence-to-sequence tasks generated on the fly from a seed: reverse or copy a random symbol string.

Vocabulary: 0 = PAD, 1 = BOS, 2 = EOS, then `num_symbols` symbols. A source is a string of `min_len..max_len`
symbols, right-padded to `max_len`. The target is `BOS y EOS` (y = the source reversed, or copied); the decoder
reads `BOS y` and learns to predict `y EOS`, both right-padded to `max_len + 1`. The batch of training step `s`
is a pure function of `(seed, s)`, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .config import TransformerConfig

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
NUM_SPECIAL = 3
TASKS = ("reverse", "copy")


class Batch(NamedTuple):
    src: np.ndarray  # (B, max_len) int64, PAD-padded
    tgt_in: np.ndarray  # (B, max_len + 1): BOS y, PAD-padded (the decoder's input)
    labels: np.ndarray  # (B, max_len + 1): y EOS, PAD-padded (what it must predict)


@dataclass(frozen=True)
class TaskSpec:
    """Which task, over how many symbols, with sources of which lengths."""

    name: str = "reverse"
    num_symbols: int = 10
    min_len: int = 1
    max_len: int = 16

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, received {self.name!r}")
        for field in ("num_symbols", "min_len", "max_len"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive integer, received {value!r}")
        if self.min_len > self.max_len:
            raise ValueError(f"min_len={self.min_len} is longer than max_len={self.max_len}")

    @property
    def vocab_size(self) -> int:
        return self.num_symbols + NUM_SPECIAL

    @property
    def target_len(self) -> int:
        """Length of `tgt_in` and `labels` (one longer than the source: BOS / EOS)."""
        return self.max_len + 1

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict) -> "TaskSpec":
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown task field(s) {unknown}")
        return cls(**data)

    def model_config(self, **overrides) -> TransformerConfig:
        """A small Transformer sized for this task (vocabularies, `max_len`, `pad_id` filled in)."""
        fields = dict(src_vocab_size=self.vocab_size, tgt_vocab_size=self.vocab_size, d_model=64, num_heads=4,
                      num_encoder_layers=2, num_decoder_layers=2, d_ff=256, max_len=self.target_len, dropout=0.0,
                      pad_id=PAD_ID)
        fields.update(overrides)
        config = TransformerConfig(**fields)
        check_config(self, config)
        return config

    def make_batch(self, batch_size: int, rng: np.random.Generator) -> Batch:
        """`batch_size` random examples drawn from `rng`."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, received {batch_size!r}")
        b, n = batch_size, self.max_len
        lengths = rng.integers(self.min_len, self.max_len + 1, size=b)  # (B,)
        symbols = rng.integers(NUM_SPECIAL, self.vocab_size, size=(b, n))  # (B, n)
        real = np.arange(n)[None, :] < lengths[:, None]  # (B, n)
        src = np.where(real, symbols, PAD_ID)
        if self.name == "reverse":
            # position j of the answer is source position length - 1 - j
            index = np.clip(lengths[:, None] - 1 - np.arange(n)[None, :], 0, n - 1)  # (B, n)
            answer = np.where(real, np.take_along_axis(src, index, axis=1), PAD_ID)
        else:
            answer = src
        tgt_in = np.full((b, n + 1), PAD_ID)
        tgt_in[:, 0] = BOS_ID
        tgt_in[:, 1:] = answer
        labels = np.full((b, n + 1), PAD_ID)
        labels[:, :n] = answer
        labels[np.arange(b), lengths] = EOS_ID
        return Batch(src.astype(np.int64), tgt_in.astype(np.int64), labels.astype(np.int64))

    def batch_for_step(self, batch_size: int, seed: int, step: int) -> Batch:
        """The training batch of (0-based) step `step` of a run seeded with `seed`."""
        return self.make_batch(batch_size, np.random.default_rng([seed, step]))

    def eval_batch(self, batch_size: int, seed: int) -> Batch:
        """A fixed evaluation set, drawn from a stream no training step uses."""
        return self.make_batch(batch_size, np.random.default_rng([seed, 2**32 - 1]))


def check_config(task: TaskSpec, config: TransformerConfig) -> None:
    """Raise `ValueError` if a model config cannot serve this task (vocabulary, length, padding id)."""
    problems = []
    if not config.is_encoder_decoder:
        problems.append(f"the model is not an encoder-decoder (num_encoder_layers={config.num_encoder_layers}, "
                        f"num_decoder_layers={config.num_decoder_layers}); these tasks need both stacks")
    if config.src_vocab_size != task.vocab_size or config.tgt_vocab_size != task.vocab_size:
        problems.append(f"vocabulary sizes src={config.src_vocab_size}, tgt={config.tgt_vocab_size} do not match "
                        f"the task's {task.vocab_size} ({task.num_symbols} symbols + PAD, BOS, EOS)")
    if config.max_len < task.target_len:
        problems.append(f"max_len={config.max_len} is shorter than the task's target length {task.target_len}")
    if config.pad_id != PAD_ID:
        problems.append(f"pad_id={config.pad_id}, the task pads with {PAD_ID}")
    if problems:
        raise ValueError(f"model config does not fit task {task.name!r}: " + "; ".join(problems))


def accuracy(predictions: np.ndarray, labels: np.ndarray, pad_id: int = PAD_ID) -> tuple[float, float]:
    """`(token_accuracy, sequence_accuracy)` over the non-padding label positions.

    A sequence counts as correct when every one of its non-padding positions is.
    """
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions {predictions.shape} and labels {labels.shape} differ in shape")
    keep = labels != pad_id
    correct = (predictions == labels) & keep
    token = correct.sum() / max(int(keep.sum()), 1)
    sequence = np.all(correct | ~keep, axis=-1).mean()
    return float(token), float(sequence)

