"""A training run on a synthetic task, in either framework: the loop, periodic evaluation, checkpoints in the
canonical format, a JSON log of the loss curve, resume, and Ctrl-C handling.

A run directory holds three files, each written atomically (temporary file, fsync, rename):
- `checkpoint.safetensors`: canonical weights with the model config in the metadata (`reference_numpy.load_weights`
  reads it; so do `verify`, `convert` and `generate`);
- `train_state.safetensors`: Adam's moments in canonical names (`m.<name>`, `v.<name>`), the step, the settings
  and the SHA-256 of the checkpoint it belongs to (safetensors: tensors and JSON text only, nothing executable);
- `log.json`: settings, the loss curve `[[step, loss, lr], ...]` and the evaluations.
They are written together at every checkpoint, weights first, so a crash between two writes is detected by the
digest instead of resuming from mismatched files. Ctrl-C stops at the next step boundary and saves there; a
second Ctrl-C stops at once, leaving the last checkpoint as it was.

Frameworks are imported only when a run starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

import reference_numpy as rn
from reference_numpy.io import atomic_write_bytes, read_safetensors

from .errors import UsageError

FRAMEWORKS = ("torch", "tf")
CHECKPOINT, STATE, LOG = "checkpoint.safetensors", "train_state.safetensors", "log.json"
STATE_FORMAT, LOG_FORMAT = "transformer-parity/train-state", "transformer-parity/train-log"
FORMAT_VERSION = "1"


@dataclass(frozen=True)
class TrainSettings:
    """Everything that determines a run besides the framework: task, model, optimisation and bookkeeping."""

    task: rn.TaskSpec = field(default_factory=rn.TaskSpec)
    model: dict = field(default_factory=dict)  # TransformerConfig overrides on top of `task.model_config()`
    steps: int = 2000
    batch_size: int = 64
    seed: int = 0
    dtype: str = "float32"
    schedule: rn.Schedule = field(default_factory=lambda: rn.Schedule("cosine", peak_lr=1e-3, warmup_steps=100,
                                                                       total_steps=2000))
    adam: rn.AdamSettings = field(default_factory=rn.AdamSettings)
    label_smoothing: float = 0.0
    eval_every: int = 200
    checkpoint_every: int = 500
    eval_size: int = 512

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "checkpoint_every", "eval_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name.replace('_', '-')} must be a positive integer, received {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise UsageError(f"seed must be a non-negative integer, received {self.seed!r}")
        if self.dtype not in ("float32", "float64"):
            raise UsageError(f"dtype must be float32 or float64, received {self.dtype!r}")
        rn.training.check_label_smoothing(self.label_smoothing)
        self.model_config()  # validates the model overrides against the task

    def model_config(self) -> rn.TransformerConfig:
        try:
            return self.task.model_config(**self.model)
        except TypeError as exc:  # an unknown field name
            raise UsageError(f"invalid model setting: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task.to_dict(), "model": dict(self.model), "steps": self.steps,
                "batch_size": self.batch_size, "seed": self.seed, "dtype": self.dtype,
                "schedule": self.schedule.to_dict(), "adam": self.adam.to_dict(),
                "label_smoothing": self.label_smoothing, "eval_every": self.eval_every,
                "checkpoint_every": self.checkpoint_every, "eval_size": self.eval_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainSettings":
        data = dict(data)
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown training setting(s) {unknown}")
        data["task"] = rn.TaskSpec.from_dict(data["task"])
        data["schedule"] = rn.Schedule(**data["schedule"])
        data["adam"] = rn.AdamSettings(**data["adam"])
        return cls(**data)


def trainer_class(framework: str):
    """The framework's `Trainer` (imported on demand)."""
    if framework == "torch":
        from torch_impl.training import Trainer
    elif framework == "tf":
        from tf_impl.training import Trainer
    else:
        raise UsageError(f"framework must be one of {', '.join(FRAMEWORKS)}, received {framework!r}")
    return Trainer


def evaluate(trainer, task: rn.TaskSpec, batch: rn.Batch) -> dict[str, float]:
    """Teacher-forced token and sequence accuracy on a fixed batch."""
    predictions = trainer.logits(batch.src, batch.tgt_in).argmax(axis=-1)
    token, sequence = rn.accuracy(predictions, batch.labels)
    return {"token_accuracy": token, "sequence_accuracy": sequence}


# --- run files -----------------------------------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_run(out: Path, trainer, settings: TrainSettings, log: dict) -> None:
    """Checkpoint, training state and log, each atomically, weights first (see the module docstring)."""
    from safetensors.numpy import save

    config = settings.model_config()
    rn.save_weights(out / CHECKPOINT, config, trainer.weights(), overwrite=True)
    moments = trainer.optimizer_state()
    tensors = {f"{key}.{name}": np.ascontiguousarray(value) for key in ("m", "v") for name, value in
               moments[key].items()}
    metadata = {"format": STATE_FORMAT, "format_version": FORMAT_VERSION, "step": str(trainer.step),
                "framework": trainer.framework, "settings": json.dumps(settings.to_dict()),
                "checkpoint_sha256": _sha256(out / CHECKPOINT)}
    atomic_write_bytes(out / STATE, save(tensors, metadata=metadata))
    atomic_write_bytes(out / LOG, (json.dumps(log, indent=1) + "\n").encode())


def read_log(path: str | Path) -> dict:
    """A run's JSON log, checked; `ValueError` naming the file if it is truncated, corrupt or not a log."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such log file: {path}")
    try:
        log = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON (truncated or corrupt?): {exc}") from None
    if not isinstance(log, dict) or log.get("format") != LOG_FORMAT:
        raise ValueError(f"{path} is not a transformer-parity training log (no \"format\": \"{LOG_FORMAT}\")")
    loss = log.get("loss")
    if not isinstance(loss, list) or not all(
            isinstance(row, list) and len(row) == 3 and all(isinstance(x, (int, float)) for x in row) for row in loss):
        raise ValueError(f"{path}: \"loss\" must be a list of [step, loss, lr] rows")
    if not isinstance(log.get("eval"), list):
        raise ValueError(f"{path}: \"eval\" must be a list")
    return log


@dataclass
class RunState:
    """What `load_run` found in a run directory."""

    settings: TrainSettings
    framework: str
    step: int
    weights: dict[str, np.ndarray]
    moments: dict[str, dict[str, np.ndarray]]
    log: dict


def load_run(out: Path) -> RunState:
    """Read a run directory for resuming, checking that its three files belong together."""
    for name in (CHECKPOINT, STATE, LOG):
        if not (out / name).is_file():
            raise UsageError(f"cannot resume: {out / name} is missing")
    tensors, metadata = read_safetensors(out / STATE)
    if metadata.get("format") != STATE_FORMAT:
        raise UsageError(f"{out / STATE} is not a training state file (format {metadata.get('format')!r})")
    if metadata.get("checkpoint_sha256") != _sha256(out / CHECKPOINT):
        raise UsageError(f"{out / CHECKPOINT} and {out / STATE} do not belong together (the run stopped between "
                         f"writing them?); restore both from a backup or start over with --force")
    settings = TrainSettings.from_dict(json.loads(metadata["settings"]))
    config, weights = rn.load_weights(out / CHECKPOINT)
    rn.check_config(settings.task, config)
    moments = {key: {name[len(key) + 1:]: value for name, value in tensors.items() if name.startswith(key + ".")}
               for key in ("m", "v")}
    for key in ("m", "v"):
        try:
            rn.validate_weights(config, moments[key])
        except ValueError as exc:
            raise UsageError(f"{out / STATE}: Adam moments {key!r}: {exc}") from None
    log = read_log(out / LOG)
    step = int(metadata["step"])
    log["loss"] = [row for row in log["loss"] if row[0] <= step]
    log["eval"] = [row for row in log["eval"] if row["step"] <= step]
    return RunState(settings, metadata["framework"], step, weights, moments, log)


# --- the loop ------------------------------------------------------------------------------------------------------

class _StopAtStepBoundary:
    """SIGINT sets a flag the loop checks between steps; a second SIGINT raises KeyboardInterrupt at once, except
    while a checkpoint is being written (`saving`), which is never cut short. Only installed on the main thread."""

    def __init__(self):
        self.requested = self.saving = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested and not self.saving:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


Progress = Callable[[int, dict], None]  # (step, latest numbers) -> None


def train(out: str | Path, framework: str, settings: TrainSettings | None = None, *, resume: bool = False,
          force: bool = False, init_weights: dict[str, np.ndarray] | None = None, progress: Progress | None = None,
          on_event: Callable[[str], None] | None = None) -> dict:
    """Train (or resume) a run in directory `out`; returns the final log.

    Args:
        out: the run directory (created if needed).
        framework: "torch" or "tf".
        settings: the run's settings (new runs; with `resume` they must be None or equal the stored ones, except
            for `steps`, which may be raised).
        resume: continue the run stored in `out`.
        force: start over in a directory that already holds a run.
        init_weights: canonical initial weights (fine-tuning); default: seeded from `settings.seed`.
        progress: called after every step with the step and the latest numbers (loss, lr, accuracies).
        on_event: called with one-line notes (checkpoint saved, interrupted, ...).
    """
    out = Path(out)
    note = on_event or (lambda message: None)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    existing = (out / CHECKPOINT).exists() or (out / STATE).exists()
    if resume:
        state = load_run(out)
        if state.framework != framework:
            raise UsageError(f"{out} was trained with --framework {state.framework}; resume it with that framework")
        if settings is not None:
            stored = dataclasses.replace(state.settings, steps=settings.steps)
            if stored != settings:
                changed = [k for k, v in settings.to_dict().items() if stored.to_dict()[k] != v]
                raise UsageError(f"--resume continues the stored run; these settings differ from it: {changed}")
            state.settings = settings
        settings = state.settings
        if state.step >= settings.steps:
            raise UsageError(f"{out} has already run {state.step} of {settings.steps} steps; raise --steps to "
                             f"continue")
    else:
        if existing and not force:
            raise UsageError(f"{out} already holds a run; pass --resume to continue it or --force to start over")
        settings = settings or TrainSettings()
    config = settings.model_config()
    Trainer = trainer_class(framework)
    if resume:
        weights = state.weights
    elif init_weights is not None:
        rn.check_config(settings.task, config)
        weights = init_weights
    else:
        weights = rn.init_weights(config, settings.seed, np.float32)
    trainer = Trainer(config, weights, dtype=settings.dtype, adam=settings.adam, schedule=settings.schedule,
                      label_smoothing=settings.label_smoothing, seed=settings.seed)
    if resume:
        trainer.load_optimizer_state(state.step, state.moments)
        log = state.log
        log["settings"] = settings.to_dict()
        note(f"resuming {out} at step {state.step} of {settings.steps}")
    else:
        out.mkdir(parents=True, exist_ok=True)
        log = {"format": LOG_FORMAT, "format_version": FORMAT_VERSION, "framework": framework,
               "settings": settings.to_dict(), "config": config.to_dict(), "loss": [], "eval": [],
               "train_seconds": 0.0, "finished": False}
    eval_batch = settings.task.eval_batch(settings.eval_size, settings.seed)
    latest: dict[str, float] = {}
    started, seconds_before = time.perf_counter(), log["train_seconds"]
    last_saved = trainer.step

    with _StopAtStepBoundary() as stop:

        def checkpoint() -> None:
            nonlocal last_saved
            log["train_seconds"] = seconds_before + time.perf_counter() - started
            stop.saving = True
            try:
                save_run(out, trainer, settings, log)
            finally:
                stop.saving = False
            last_saved = trainer.step

        try:
            while trainer.step < settings.steps:
                step = trainer.step
                batch = settings.task.batch_for_step(settings.batch_size, settings.seed, step)
                lr = trainer.learning_rate()
                loss = trainer.train_step(batch.src, batch.tgt_in, batch.labels)
                if not math.isfinite(loss):
                    raise UsageError(f"the loss became {loss} at step {step + 1} (learning rate {lr:.3g}); the last "
                                     f"checkpoint (step {last_saved}) is intact")
                log["loss"].append([step + 1, loss, lr])
                latest.update(loss=loss, lr=lr)
                done = trainer.step
                if done % settings.eval_every == 0 or done == settings.steps:
                    metrics = evaluate(trainer, settings.task, eval_batch)
                    log["eval"].append({"step": done, **metrics,
                                        "elapsed_s": seconds_before + time.perf_counter() - started})
                    latest.update(metrics)
                if done % settings.checkpoint_every == 0 or done == settings.steps:
                    checkpoint()
                if progress is not None:
                    progress(done, dict(latest))
                if stop.requested and trainer.step < settings.steps:
                    if last_saved != trainer.step:
                        checkpoint()
                    note(f"interrupted: saved step {trainer.step} to {out}; continue with --resume")
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            if not stop.requested:
                note(f"interrupted: the last checkpoint in {out} (step {last_saved}) is intact; continue with "
                     f"--resume")
            raise
    log["finished"] = True
    log["train_seconds"] = seconds_before + time.perf_counter() - started
    atomic_write_bytes(out / LOG, (json.dumps(log, indent=1) + "\n").encode())
    return log
