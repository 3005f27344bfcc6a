"""A training run on a synthetic task, in either framework: the loop, periodic evaluation, checkpoints in the
canonical format, a JSON log of the loss curve, resume, and Ctrl-C/SIGTERM handling.

A run directory holds:
- `run.json`, the manifest: the step of the current save, the directory holding it and the SHA-256 of each of its
  files, and the settings;
- `saves/<step>.<id>/`: one save, three files written together:
  `checkpoint.safetensors` (canonical weights, the config in the metadata), `train_state.safetensors` (Adam's
  moments as `m.<name>`, `v.<name>`, the step, the settings; tensors and JSON text only, nothing executable) and
  `log.json` (settings, the loss curve `[[step, loss, lr], ...]`, the evaluations);
- `checkpoint.safetensors` and `log.json`: the current save's, at the top for `generate`, `verify`, `plot` (hard
  links where the file system has them; replaced atomically).

A save is published in one atomic step: its directory is written completely (fsync'd), then the manifest is
renamed into place; only then are the top-level files updated and the previous save removed. A crash, a full disk
or a signal at any moment therefore leaves the previous save and manifest intact, and a resume checks every hash
(flipped bytes in the moments, an edited step, files from another run are refused). Ctrl-C or SIGTERM stops at the
next step boundary and saves there; a second one stops at once, except during a save, which is never cut short.
Two processes cannot train in one directory at once (an advisory lock).

Frameworks are imported only when a run starts, after the signal handlers are in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

import reference_numpy as rn

from transformer_parity.errors import UsageError
from transformer_parity.io.outputs import sweep, temp_prefix

FRAMEWORKS = ("torch", "tf")
CHECKPOINT, STATE, LOG = "checkpoint.safetensors", "train_state.safetensors", "log.json"
MANIFEST, SAVES, LOCK = "run.json", "saves", ".lock"
STATE_FORMAT, LOG_FORMAT = "transformer-parity/train-state", "transformer-parity/train-log"
MANIFEST_FORMAT = "transformer-parity/train-run"
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

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_file(path: Path, data: bytes, mode: int) -> None:
    """Create `path` (a new name in a directory being built) with `data`, fsync'd."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _replace_with(source: Path, path: Path, data: bytes, mode: int) -> None:
    """Make `path` hold `data` atomically: a hard link to `source` (which holds it) where possible, else a copy."""
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        tmp.unlink()
        try:
            os.link(source, tmp)
        except OSError:
            _write_file(tmp, data, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _file_mode() -> int:
    from transformer_parity.io.guards import umask as _umask

    return 0o666 & ~_umask()


def save_run(out: Path, trainer, settings: TrainSettings, log: dict) -> None:
    """Publish checkpoint, training state and log together (see the module docstring): a new save directory, then
    the manifest renamed into place, then the top-level files; the previous save is removed last."""
    from safetensors.numpy import save

    config = settings.model_config()
    weights = trainer.weights()
    rn.validate_weights(config, weights)
    checkpoint = save({k: np.ascontiguousarray(v) for k, v in weights.items()},
                      metadata={"format": rn.io.FORMAT_TAG, "format_version": rn.io.FORMAT_VERSION,
                                "config": config.to_json()})
    moments = trainer.optimizer_state()
    tensors = {f"{key}.{name}": np.ascontiguousarray(value) for key in ("m", "v") for name, value in
               moments[key].items()}
    state = save(tensors, metadata={"format": STATE_FORMAT, "format_version": FORMAT_VERSION,
                                    "step": str(trainer.step), "framework": trainer.framework,
                                    "settings": json.dumps(settings.to_dict()),
                                    "checkpoint_sha256": _sha256(checkpoint)})
    log_bytes = (json.dumps(log, indent=1) + "\n").encode()
    files = {CHECKPOINT: checkpoint, STATE: state, LOG: log_bytes}
    mode = _file_mode()
    saves = out / SAVES
    saves.mkdir(exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{trainer.step:08d}.", suffix=".tmp", dir=saves))
    final = saves / building.name[1:-len(".tmp")]
    try:
        os.chmod(building, mode | (mode & 0o444) >> 2)  # r -> r-x: what mkdir gives under the umask
        for name, data in files.items():
            _write_file(building / name, data, mode)
        _fsync_dir(building)
        os.rename(building, final)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    _fsync_dir(saves)
    manifest = {"format": MANIFEST_FORMAT, "format_version": FORMAT_VERSION, "step": trainer.step,
                "framework": trainer.framework, "save": f"{SAVES}/{final.name}",
                "sha256": {name: _sha256(data) for name, data in files.items()},
                "settings": settings.to_dict()}
    try:
        _publish_manifest(out, manifest, mode)  # the commit point
    except BaseException:
        try:
            published = json.loads((out / MANIFEST).read_text()).get("save") == manifest["save"]
        except (OSError, ValueError, AttributeError):
            published = False
        if not published:  # the previous save stays current; this one never was
            shutil.rmtree(final, ignore_errors=True)
        raise
    _replace_with(final / CHECKPOINT, out / CHECKPOINT, checkpoint, mode)
    _replace_with(final / LOG, out / LOG, log_bytes, mode)
    _remove_stale(out, keep=final.name)


def _publish_manifest(out: Path, manifest: dict, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(out / MANIFEST), dir=out)
    os.close(fd)
    tmp = Path(tmp)
    try:
        tmp.unlink()
        _write_file(tmp, (json.dumps(manifest, indent=1) + "\n").encode(), mode)
        os.replace(tmp, out / MANIFEST)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(out)


def _remove_stale(out: Path, keep: str | None) -> None:
    """Saves other than `keep`, half-built ones, and temporary files a killed process (SIGKILL) left behind."""
    saves = out / SAVES
    if saves.is_dir():
        for item in saves.iterdir():
            if item.name == keep:
                continue
            if item.is_dir():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)
    for name in (MANIFEST, CHECKPOINT, LOG):  # only our own names: a user's `.notes.tmp` is theirs
        sweep(out / name)  # the run lock is held: any writer of these is gone
        for item in out.glob(f".{name}.*.tmp"):  # named so before temporaries carried their pid
            item.unlink(missing_ok=True)


def write_log(out: Path, log: dict) -> None:
    """The top-level log.json alone (the final one of a finished run), atomically; never written in place, since it
    may be a hard link into the current save."""
    data = (json.dumps(log, indent=1) + "\n").encode()
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(out / LOG), dir=out)
    os.close(fd)
    tmp = Path(tmp)
    try:
        tmp.unlink()
        _write_file(tmp, data, _file_mode())
        os.replace(tmp, out / LOG)
    finally:
        tmp.unlink(missing_ok=True)


def read_log(path: str | Path) -> dict:
    """A run's JSON log, checked; `ValueError` naming the file if it is truncated, corrupt or not a log."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such log file: {path}")
    try:
        log = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON (truncated or corrupt?): {exc}") from None
    except RecursionError:
        raise ValueError(f"{path} nests JSON too deeply to be a training log") from None
    if not isinstance(log, dict) or log.get("format") != LOG_FORMAT:
        raise ValueError(f"{path} is not a transformer-parity training log (no \"format\": \"{LOG_FORMAT}\")")
    loss = log.get("loss")
    if not isinstance(loss, list) or not all(
            isinstance(row, list) and len(row) == 3 and all(isinstance(x, (int, float)) for x in row) for row in loss):
        raise ValueError(f"{path}: \"loss\" must be a list of [step, loss, lr] rows")
    if not isinstance(log.get("eval"), list) or not all(
            isinstance(row, dict) and isinstance(row.get("step"), int) for row in log["eval"]):
        raise ValueError(f"{path}: \"eval\" must be a list of objects with a \"step\"")
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


def read_manifest(out: Path) -> dict:
    """The run's manifest, checked for shape (not yet against the files); `UsageError` naming what is wrong."""
    path = out / MANIFEST
    if not path.is_file():
        if (out / STATE).is_file():
            raise UsageError(f"cannot resume: {out} was written by an older version (no {MANIFEST}); start over "
                             "with --force")
        raise UsageError(f"cannot resume: {path} is missing (no checkpoint was saved in {out})")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise UsageError(f"{path} is not valid JSON (truncated or corrupt?): {exc}") from None
    ok = (isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT
          and isinstance(manifest.get("step"), int) and isinstance(manifest.get("sha256"), dict)
          and isinstance(manifest.get("save"), str) and re.fullmatch(rf"{SAVES}/[0-9]+\.[A-Za-z0-9_]+",
                                                                     manifest["save"])
          and isinstance(manifest.get("settings"), dict) and isinstance(manifest.get("framework"), str)
          and all(isinstance(manifest["sha256"].get(n), str) for n in (CHECKPOINT, STATE, LOG)))
    if not ok:
        raise UsageError(f"{path} is not a transformer-parity run manifest (missing or malformed fields)")
    return manifest


def stored_settings(out: Path) -> TrainSettings:
    """The settings of the run saved in `out` (from its manifest)."""
    try:
        return TrainSettings.from_dict(read_manifest(out)["settings"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{out / MANIFEST}: its settings are unreadable ({type(exc).__name__}: {exc})") from None


def load_run(out: Path) -> RunState:
    """Read a run directory for resuming: the manifest's save, every file checked against its SHA-256."""
    manifest = read_manifest(out)
    save_dir = out / manifest["save"]
    data = {}
    for name in (CHECKPOINT, STATE, LOG):
        try:
            data[name] = (save_dir / name).read_bytes()
        except FileNotFoundError:
            raise UsageError(f"cannot resume: {save_dir / name} is missing") from None
        if _sha256(data[name]) != manifest["sha256"][name]:
            raise UsageError(f"cannot resume: {save_dir / name} does not match the SHA-256 in {out / MANIFEST} "
                             "(corrupt or edited); start over with --force")
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        tensors = load(data[STATE])
        metadata = _metadata(data[STATE])
        if metadata.get("format") != STATE_FORMAT:
            raise UsageError(f"{save_dir / STATE} is not a training state file (format {metadata.get('format')!r})")
        step = int(metadata["step"])
        settings = TrainSettings.from_dict(json.loads(metadata["settings"]))
        framework = metadata["framework"]
    except (SafetensorError, KeyError, TypeError, ValueError, RecursionError) as exc:
        raise UsageError(f"{save_dir / STATE} is unreadable or misses fields ({type(exc).__name__}: {exc})") from None
    if step != manifest["step"] or framework != manifest["framework"]:
        raise UsageError(f"{save_dir / STATE} says step {step} ({framework}), {out / MANIFEST} step "
                         f"{manifest['step']} ({manifest['framework']}); they do not belong together")
    from transformer_parity.formats import load as load_checkpoint

    loaded = load_checkpoint(save_dir / CHECKPOINT, "canonical")
    config, weights = loaded.config, loaded.weights
    try:
        rn.check_config(settings.task, config)
    except ValueError as exc:
        raise UsageError(f"{save_dir / CHECKPOINT}: {exc}") from None
    moments = {key: {name[len(key) + 1:]: value for name, value in tensors.items() if name.startswith(key + ".")}
               for key in ("m", "v")}
    for key in ("m", "v"):
        try:
            rn.validate_weights(config, moments[key])
        except ValueError as exc:
            raise UsageError(f"{save_dir / STATE}: Adam moments {key!r}: {exc}") from None
    log = read_log(save_dir / LOG)
    log["loss"] = [row for row in log["loss"] if row[0] <= step]
    log["eval"] = [row for row in log["eval"] if row["step"] <= step]
    return RunState(settings, framework, step, weights, moments, log)


def _metadata(raw: bytes) -> dict[str, str]:
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise TypeError("__metadata__ is not an object")
    return metadata


class _RunLock:
    """An advisory lock on the run directory for the whole run, so two processes cannot train (and save) in one
    directory at once."""

    def __init__(self, out: Path):
        self.path, self.fd = out / LOCK, None

    def __enter__(self):
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise UsageError(f"{self.path.parent} is in use by another training process") from None
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


# --- the loop ------------------------------------------------------------------------------------------------------

class _StopAtStepBoundary:
    """SIGINT or SIGTERM sets a flag the loop checks between steps; a second one raises KeyboardInterrupt at once,
    except while a checkpoint is being written (`saving`) or a framework imported (`holding`), which are never cut
    short (an interrupt inside PyTorch's import aborts the process). Only installed on the main thread."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = self.saving = self.holding = False
        self.signal_name = "Ctrl-C"
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        if self.requested and not (self.saving or self.holding):
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"

    def __exit__(self, *exc):
        for s, previous in self._previous.items():
            signal.signal(s, previous)


Progress = Callable[[int, dict], None]  # (step, latest numbers) -> None


def train(out: str | Path, framework: str, settings: TrainSettings | None = None, *, resume: bool = False,
          force: bool = False, init_weights: dict[str, np.ndarray] | None = None, progress: Progress | None = None,
          on_event: Callable[[str], None] | None = None, extend_schedule: bool = False) -> dict:
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
        extend_schedule: on resume past the end of a cosine schedule, stretch it to the new `steps` (refused
            otherwise: the extra steps would train at `min_lr`).
    """
    out = Path(out)
    note = on_event or (lambda message: None)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    if extend_schedule and not resume:
        raise UsageError("--extend-schedule applies to --resume only")
    with _StopAtStepBoundary() as stop:  # handlers first: a signal during the imports below is held, not fatal
        if resume:
            if not out.is_dir():
                raise UsageError(f"cannot resume: {out} does not exist")
            with _RunLock(out):
                return _train(out, framework, settings, True, force, init_weights, progress, note, extend_schedule,
                              stop)
        out.mkdir(parents=True, exist_ok=True)
        with _RunLock(out):
            return _train(out, framework, settings, False, force, init_weights, progress, note, extend_schedule,
                          stop)


def _train(out: Path, framework: str, settings, resume: bool, force: bool, init_weights, progress, note,
           extend_schedule: bool, stop: _StopAtStepBoundary) -> dict:
    existing = (out / MANIFEST).exists() or (out / CHECKPOINT).exists() or (out / STATE).exists()
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
        settings = _check_schedule_end(settings, state.step, extend_schedule, note)
    else:
        if existing and not force:
            raise UsageError(f"{out} already holds a run; pass --resume to continue it or --force to start over")
        settings = settings or TrainSettings()
    config = settings.model_config()
    stop.holding = True
    try:
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
    finally:
        stop.holding = False
    if resume:
        trainer.load_optimizer_state(state.step, state.moments)
        log = state.log
        if settings.schedule != state.settings.schedule:
            log.setdefault("schedule_extensions", []).append(
                {"step": state.step, "from_total_steps": state.settings.schedule.total_steps,
                 "to_total_steps": settings.schedule.total_steps})
        log["settings"] = settings.to_dict()
        note(f"resuming {out} at step {state.step} of {settings.steps}")
    else:
        log = {"format": LOG_FORMAT, "format_version": FORMAT_VERSION, "framework": framework,
               "settings": settings.to_dict(), "config": config.to_dict(), "loss": [], "eval": [],
               "train_seconds": 0.0, "finished": False}
    eval_batch = settings.task.eval_batch(settings.eval_size, settings.seed)
    latest: dict[str, float] = {}
    started, seconds_before = time.perf_counter(), log["train_seconds"]
    last_saved = trainer.step if resume else None  # None: no checkpoint of this run exists yet

    def checkpoint() -> None:
        nonlocal last_saved
        log["train_seconds"] = seconds_before + time.perf_counter() - started
        stop.saving = True
        try:
            save_run(out, trainer, settings, log)
        finally:
            stop.saving = False
        last_saved = trainer.step

    def saved_text() -> str:
        if last_saved is None:
            return f"no checkpoint was written (the first was due at step {settings.checkpoint_every})"
        return f"the last checkpoint (step {last_saved}) is intact"

    try:
        while trainer.step < settings.steps and not stop.requested:
            step = trainer.step
            batch = settings.task.batch_for_step(settings.batch_size, settings.seed, step)
            lr = trainer.learning_rate()
            loss = trainer.train_step(batch.src, batch.tgt_in, batch.labels)
            if not math.isfinite(loss):
                raise UsageError(f"the loss became {loss} at step {step + 1} (learning rate {lr:.3g}); "
                                 f"{saved_text()}")
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
            if trainer.step > 0 and last_saved != trainer.step:
                checkpoint()
            if last_saved is None:
                note(f"interrupted ({stop.signal_name}) before the first step; nothing was saved")
            else:
                note(f"interrupted ({stop.signal_name}): saved step {trainer.step} to {out}; continue with --resume")
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        if not stop.requested:
            note(f"interrupted: {saved_text()} in {out}; continue with --resume")
        raise
    log["finished"] = True
    log["train_seconds"] = seconds_before + time.perf_counter() - started
    write_log(out, log)
    return log


def _check_schedule_end(settings: TrainSettings, step: int, extend: bool, note) -> TrainSettings:
    """A cosine schedule ends at `total_steps` (then `min_lr` for ever): resuming past it needs an explicit choice."""
    schedule = settings.schedule
    if schedule.kind != "cosine" or settings.steps <= schedule.total_steps:
        return settings
    if not extend:
        raise UsageError(f"--steps {settings.steps} goes past the end of the run's cosine schedule (total_steps="
                         f"{schedule.total_steps}): the extra steps would train at min_lr={schedule.min_lr:g}; pass "
                         f"--extend-schedule to stretch the cosine to {settings.steps} steps, or start a new run")
    extended = dataclasses.replace(schedule, total_steps=settings.steps)
    note(f"extending the cosine schedule from {schedule.total_steps} to {settings.steps} steps at step {step}: the "
         f"learning rate jumps from {schedule(step):.3g} to {extended(step):.3g} and decays to "
         f"{schedule.min_lr:g} at step {settings.steps}")
    return dataclasses.replace(settings, schedule=extended)
