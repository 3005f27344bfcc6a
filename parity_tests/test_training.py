"""Training runs: the synthetic tasks, a few steps in each framework through the CLI, resume, Ctrl-C, the files a
run writes, bad input (nothing lost), and the plots. The 10-minute accuracy runs are programs
(benchmarks/train_reversal.py), not tests."""

import json
import os
import signal

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity.train import run as training_run
from transformer_parity.cli import main

from .torch_threads import one_torch_thread  # noqa: F401 (autouse)

SMALL = ["--steps", "6", "--warmup", "2", "--batch-size", "8", "--eval-every", "3", "--checkpoint-every", "2",
         "--eval-size", "16", "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--max-len", "6",
         "--num-symbols", "5"]


def small_settings(steps=6, **changes):
    task = rn.TaskSpec(num_symbols=5, max_len=6)
    fields = dict(task=task, model=dict(d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32),
                  steps=steps, batch_size=8, eval_every=3, checkpoint_every=2, eval_size=16)
    fields.update(changes)
    fields.setdefault("schedule", rn.Schedule("cosine", peak_lr=1e-2, warmup_steps=2, total_steps=6))
    return training_run.TrainSettings(**fields)


def run_files(out):
    """Every file of a run directory (top level, manifest, the current save) by relative path."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def current_save(out):
    return out / training_run.read_manifest(out)["save"]


# --- tasks ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["reverse", "copy"])
def test_task_batches(name):
    task = rn.TaskSpec(name, num_symbols=7, min_len=2, max_len=9)
    batch = task.batch_for_step(32, seed=3, step=5)
    assert batch.src.shape == (32, 9) and batch.tgt_in.shape == batch.labels.shape == (32, 10)
    for src, tgt_in, labels in zip(*batch):
        symbols = src[src != rn.PAD_ID]
        assert 2 <= len(symbols) <= 9 and (src[len(symbols):] == rn.PAD_ID).all()
        assert symbols.min() >= 3 and symbols.max() < task.vocab_size
        answer = symbols[::-1] if name == "reverse" else symbols
        np.testing.assert_array_equal(labels[:len(symbols) + 1], [*answer, rn.EOS_ID])
        np.testing.assert_array_equal(tgt_in[:len(symbols) + 1], [rn.BOS_ID, *answer])
        assert (labels[len(symbols) + 1:] == rn.PAD_ID).all()
    again = task.batch_for_step(32, seed=3, step=5)
    assert all((a == b).all() for a, b in zip(batch, again))
    assert not (task.batch_for_step(32, seed=3, step=6).src == batch.src).all()


def test_accuracy_and_config_checks():
    labels = np.array([[5, 6, 2, 0], [7, 2, 0, 0]])
    assert rn.accuracy(np.array([[5, 6, 2, 9], [7, 3, 0, 0]]), labels) == (0.8, 0.5)
    task = rn.TaskSpec()
    with pytest.raises(ValueError, match="vocabulary sizes"):
        rn.check_config(task, rn.TransformerConfig.preset("tiny"))
    with pytest.raises(ValueError, match="min_len"):
        rn.TaskSpec(min_len=5, max_len=4)


# --- runs ----------------------------------------------------------------------------------------------------------

def test_resume_equals_an_uninterrupted_run(tmp_path):
    """3 steps, stop, resume to 6 == 6 steps straight: bit-identical weights, moments and loss curve (torch)."""
    straight = training_run.train(tmp_path / "straight", "torch", small_settings())
    training_run.train(tmp_path / "split", "torch", small_settings(steps=3))
    resumed = training_run.train(tmp_path / "split", "torch", small_settings(), resume=True)
    assert resumed["loss"] == straight["loss"] and len(resumed["loss"]) == 6
    a, b = training_run.load_run(tmp_path / "straight"), training_run.load_run(tmp_path / "split")
    assert a.step == b.step == 6
    for name in a.weights:
        np.testing.assert_array_equal(a.weights[name], b.weights[name])
        np.testing.assert_array_equal(a.moments["v"][name], b.moments["v"][name])
    assert [e["step"] for e in resumed["eval"]] == [3, 6]


def test_keyboard_interrupt_leaves_the_last_checkpoint(tmp_path, monkeypatch):
    """A KeyboardInterrupt in the middle of step 4 writes nothing; the step-2 checkpoint resumes to the same end."""
    from torch_impl.training import Trainer

    original = Trainer.train_step

    def interrupted(self, *batch):
        if self.step == 3:
            raise KeyboardInterrupt
        return original(self, *batch)

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        training_run.train(tmp_path / "run", "torch", small_settings())
    before = run_files(tmp_path / "run")
    assert training_run.load_run(tmp_path / "run").step == 2
    monkeypatch.setattr(Trainer, "train_step", original)
    resumed = training_run.train(tmp_path / "run", "torch", small_settings(), resume=True)
    straight = training_run.train(tmp_path / "straight", "torch", small_settings())
    assert resumed["loss"] == straight["loss"]
    assert before[training_run.CHECKPOINT] != run_files(tmp_path / "run")[training_run.CHECKPOINT]


def test_ctrl_c_saves_at_the_step_boundary(tmp_path):
    """SIGINT during step 3 lets the step finish, saves it, then stops; a second SIGINT is not needed."""
    def progress(step, latest):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    handler = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a shell's `&`
    with pytest.raises(KeyboardInterrupt):
        training_run.train(tmp_path / "run", "torch", small_settings(), progress=progress)
    state = training_run.load_run(tmp_path / "run")
    assert state.step == 3 and len(state.log["loss"]) == 3 and not state.log["finished"]
    assert signal.getsignal(signal.SIGINT) is handler


def test_cli_train_writes_a_canonical_run_in_both_frameworks(tmp_path, capsys):
    """The CLI trains a few steps in torch and in Keras; the same seed gives the same float32 losses."""
    for framework in ("torch", "tf"):
        assert main(["train", "--framework", framework, "--out", str(tmp_path / framework), *SMALL, "-q"]) == 0
    logs = {f: training_run.read_log(tmp_path / f / training_run.LOG) for f in ("torch", "tf")}
    for framework, log in logs.items():
        assert log["framework"] == framework and log["finished"] and len(log["loss"]) == 6
        config, weights = rn.load_weights(tmp_path / framework / training_run.CHECKPOINT)
        assert config.d_model == 16 and config.src_vocab_size == 8
    torch_loss = np.array([row[1] for row in logs["torch"]["loss"]])
    tf_loss = np.array([row[1] for row in logs["tf"]["loss"]])
    np.testing.assert_allclose(tf_loss, torch_loss, rtol=1e-4)
    assert [row[2] for row in logs["torch"]["loss"]] == [row[2] for row in logs["tf"]["loss"]]


# --- bad input -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    (["--steps", "0"], "steps must be a positive integer"),
    (["--lr", "-1"], "peak_lr must be a positive number"),
    (["--label-smoothing", "1.5"], "label_smoothing"),
    (["--warmup", "100", "--steps", "10"], "warmup_steps=100 must be smaller than total_steps=10"),
    (["--heads", "3"], "d_model=64 is not divisible by num_heads=3"),
    (["--beta2", "1.0"], "beta2"),
    (["--min-len", "9", "--max-len", "4"], "min_len=9 is longer than max_len=4"),
], ids=["steps", "lr", "smoothing", "warmup", "heads", "beta2", "lengths"])
def test_invalid_hyperparameters(tmp_path, capsys, options, message):
    assert main(["train", "--framework", "torch", "--out", str(tmp_path / "run"), *options]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_existing_runs_are_not_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    training_run.train(out, "torch", small_settings(steps=2, schedule=rn.Schedule("constant", warmup_steps=0)))
    before = run_files(out)
    args = ["train", "--framework", "torch", "--out", str(out), *SMALL]
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--framework", "tf", "--out", str(out), "--resume"]) == 2  # the other framework
    assert "resume it with that framework" in capsys.readouterr().err
    assert main(["train", "--framework", "torch", "--out", str(out), "--resume", "--lr", "0.5"]) == 2
    assert "--lr" in capsys.readouterr().err
    assert run_files(out) == before


def test_corrupt_truncated_or_mismatched_files(tmp_path, capsys):
    out = tmp_path / "run"
    training_run.train(out, "torch", small_settings(steps=2, schedule=rn.Schedule("constant", warmup_steps=0)))
    resume = ["train", "--framework", "torch", "--out", str(out), "--resume", "--steps", "4"]
    log = (out / training_run.LOG).read_bytes()
    (out / training_run.LOG).unlink()  # a hard link into the save: replace it, never write into it
    (out / training_run.LOG).write_bytes(log[:len(log) // 2])  # truncated
    assert main(["plot", "loss", str(out / training_run.LOG), "-o", str(tmp_path / "loss.png")]) == 2
    assert "log.json is not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "loss.png").exists()
    save = current_save(out)
    other = tmp_path / "other"
    training_run.train(other, "torch", small_settings(steps=2, seed=1,
                                                      schedule=rn.Schedule("constant", warmup_steps=0)))

    def flip(raw):  # 16 flipped bytes near the end: inside the last tensor's data
        raw = bytearray(raw)
        for i in range(16):
            raw[-1 - 3 * i] ^= 0x55
        return bytes(raw)

    def edit_step(raw):  # same length, another step
        return raw.replace(b'"step":"2"', b'"step":"1"')

    cases = {
        training_run.STATE: [lambda raw: raw[:100], flip, edit_step],
        training_run.CHECKPOINT: [lambda raw: (current_save(other) / training_run.CHECKPOINT).read_bytes(), flip],
        training_run.LOG: [lambda raw: raw[:len(raw) // 2]],
    }
    for name, corruptions in cases.items():
        original = (save / name).read_bytes()
        for corrupt in corruptions:
            damaged = corrupt(original)
            assert damaged != original
            (save / name).write_bytes(damaged)
            before = run_files(out)
            assert main(resume) == 2
            err = capsys.readouterr().err
            assert "does not match the SHA-256" in err and len(err.strip().splitlines()) == 1, err
            assert run_files(out) == before
        (save / name).write_bytes(original)
    manifest = json.loads((out / training_run.MANIFEST).read_text())
    edited = {**manifest, "step": 1}
    (out / training_run.MANIFEST).write_text(json.dumps(edited))
    assert main(resume) == 2
    assert "do not belong together" in capsys.readouterr().err
    for missing in ("settings", "sha256", "save"):
        (out / training_run.MANIFEST).write_text(json.dumps({k: v for k, v in manifest.items() if k != missing}))
        assert main(resume) == 2
        assert "not a transformer-parity run manifest" in capsys.readouterr().err
    (out / training_run.MANIFEST).write_text(json.dumps(manifest))
    assert main([*resume, "-q"]) == 0


def test_a_failed_save_keeps_the_previous_one(tmp_path, monkeypatch):
    """A full disk (or a crash) while saving step 4 leaves the step-2 save resumable and no temporary file."""
    out = tmp_path / "run"
    real = training_run._publish_manifest
    calls = []

    def full_disk(out_, manifest, mode):
        calls.append(manifest["step"])
        if manifest["step"] == 4:
            raise OSError(28, "No space left on device")
        real(out_, manifest, mode)

    monkeypatch.setattr(training_run, "_publish_manifest", full_disk)
    with pytest.raises(OSError, match="No space"):
        training_run.train(out, "torch", small_settings())
    assert calls == [2, 4]
    assert training_run.load_run(out).step == 2
    leftovers = [p.name for p in out.rglob("*") if "tmp" in p.name]
    assert leftovers == [] and len(list((out / training_run.SAVES).iterdir())) == 1
    monkeypatch.setattr(training_run, "_publish_manifest", real)
    resumed = training_run.train(out, "torch", small_settings(), resume=True)
    assert resumed["loss"] == training_run.train(tmp_path / "straight", "torch", small_settings())["loss"]


def test_sigterm_saves_at_the_step_boundary(tmp_path):
    def progress(step, latest):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        training_run.train(tmp_path / "run", "torch", small_settings(), progress=progress)
    assert training_run.load_run(tmp_path / "run").step == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_cosine_resume_past_the_end_needs_extend_schedule(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--framework", "torch", "--out", out, *SMALL, "-q"]) == 0
    before = run_files(tmp_path / "run")
    assert main(["train", "--framework", "torch", "--out", out, "--resume", "--steps", "8"]) == 2
    err = capsys.readouterr().err
    assert "goes past the end of the run's cosine schedule (total_steps=6)" in err and "--extend-schedule" in err
    assert run_files(tmp_path / "run") == before
    assert main(["train", "--framework", "torch", "--out", out, "--resume", "--steps", "8", "--extend-schedule"]) == 0
    assert "extending the cosine schedule from 6 to 8 steps" in capsys.readouterr().err
    log = training_run.read_log(tmp_path / "run" / training_run.LOG)
    assert log["schedule_extensions"] == [{"step": 6, "from_total_steps": 6, "to_total_steps": 8}]
    assert [row[0] for row in log["loss"]] == list(range(1, 9)) and log["loss"][6][2] > 0


def test_nonfinite_loss_says_whether_a_checkpoint_exists(tmp_path, monkeypatch):
    from torch_impl.training import Trainer

    monkeypatch.setattr(Trainer, "train_step", lambda self, *batch: float("nan"))
    with pytest.raises(training_run.UsageError, match="no checkpoint was written") as info:
        training_run.train(tmp_path / "run", "torch", small_settings())
    assert "intact" not in str(info.value)


def test_two_trainers_cannot_share_a_directory(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with training_run._RunLock(out):
        with pytest.raises(training_run.UsageError, match="in use by another training process"):
            training_run.train(out, "torch", small_settings())
    assert sorted(p.name for p in out.iterdir()) == [training_run.LOCK]


def test_checkpoint_that_does_not_match_the_task(tmp_path, capsys):
    checkpoint = tmp_path / "tiny.safetensors"
    config = rn.TransformerConfig.preset("tiny")
    rn.save_weights(checkpoint, config, rn.init_weights(config))
    assert main(["generate", str(checkpoint), "--framework", "numpy"]) == 2
    err = capsys.readouterr().err
    assert "vocabulary sizes src=48, tgt=40 do not match the task's 13" in err
    assert main(["train", "--framework", "torch", "--out", str(tmp_path / "ft"), "--init", str(checkpoint)]) == 2
    assert "vocabulary sizes" in capsys.readouterr().err
    assert not (tmp_path / "ft").exists()


# --- generate and plot ---------------------------------------------------------------------------------------------

def test_generate_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    training_run.train(out, "torch", small_settings(steps=2, schedule=rn.Schedule("constant", warmup_steps=0)))
    checkpoint = str(out / training_run.CHECKPOINT)
    assert main(["generate", checkpoint, "--framework", "numpy", "--src", "3 4 5"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("src: 3 4 5\nout: ")
    assert main(["generate", checkpoint, "--framework", "torch", "--examples", "2", "--sample", "--top-k", "3"]) == 0
    assert capsys.readouterr().out.count("src: ") == 2
    assert main(["generate", checkpoint, "--framework", "numpy", "--src", "3 99"]) == 2
    assert "--src must hold" in capsys.readouterr().err
    assert main(["generate", checkpoint, "--framework", "numpy", "--sample", "--temperature", "0"]) == 2
    pictures = {
        "pe.png": ["plot", "positional", "--d-model", "16", "--length", "20"],
        "attention.png": ["plot", "attention", checkpoint, "--framework", "numpy"],
        "difference.png": ["plot", "attention", checkpoint, "--framework", "torch", "--against", "numpy"],
        "loss.png": ["plot", "loss", str(out), str(out / training_run.LOG), "--labels", "a,b"],
    }
    for name, args in pictures.items():
        assert main([*args, "-o", str(tmp_path / name)]) == 0, name
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main([*pictures["pe.png"], "-o", str(tmp_path / "pe.png")]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main([*pictures["pe.png"], "-o", str(tmp_path / "pe.png"), "--force"]) == 0
    assert json.loads((out / training_run.LOG).read_text())["format"] == training_run.LOG_FORMAT
