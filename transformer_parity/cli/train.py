"""The `train`, `generate` and `plot` subcommands (registered into `transformer_parity.cli`).

Frameworks and matplotlib are imported inside the handlers, so `transformer-parity --help` stays instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from transformer_parity.errors import UsageError

TRAIN_EXAMPLES = """\
examples:
  transformer-parity train --framework torch --out runs/torch-reverse            # reverse 1-16 symbols
  transformer-parity train --framework tf --out runs/tf-reverse --steps 3000
  transformer-parity train --framework torch --out runs/torch-reverse --resume                # after Ctrl-C
  transformer-parity train --framework torch --out runs/torch-reverse --resume --steps 4000 --extend-schedule
  transformer-parity train --framework torch --out runs/copy --task copy --schedule noam --warmup 400
  transformer-parity train --framework tf --out runs/ft --init base-port.safetensors   # fine-tune a checkpoint
"""

GENERATE_EXAMPLES = """\
examples:
  transformer-parity generate runs/torch-reverse/checkpoint.safetensors --framework torch
  transformer-parity generate runs/tf-reverse/checkpoint.safetensors --framework numpy --src "5 6 7 8"
  transformer-parity generate CKPT --framework tf --sample --temperature 0.8 --top-k 3 --sample-seed 1
"""

PLOT_EXAMPLES = """\
examples:
  transformer-parity plot positional --d-model 64 --length 64 -o pe.png
  transformer-parity plot attention runs/torch-reverse/checkpoint.safetensors --framework torch -o attn.png
  transformer-parity plot attention CKPT --framework torch --against tf -o attn-diff.png
  transformer-parity plot loss runs/torch-reverse/log.json runs/tf-reverse/log.json -o loss.png
"""

# option name -> default for a new run; None in argparse means "not given" (so --resume can tell)
TRAIN_DEFAULTS = dict(task="reverse", num_symbols=10, min_len=1, max_len=16, steps=2000, batch_size=64, seed=0,
                      dtype="float32", d_model=64, heads=4, layers=2, d_ff=256, dropout=0.0, schedule="cosine",
                      lr=1e-3, warmup=100, lr_scale=1.0, min_lr=0.0, beta1=0.9, beta2=0.98, eps=1e-9,
                      label_smoothing=0.0, eval_every=200, checkpoint_every=500, eval_size=512)


def register(subparsers) -> None:
    """Add `train`, `generate` and `plot` to the CLI's subparsers."""
    p = subparsers.add_parser("train", help="train on a synthetic task (reverse or copy) in torch or Keras",
                              epilog=TRAIN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Train an encoder-decoder Transformer on sequences generated on the fly, "
                                          "with periodic evaluation, canonical checkpoints, a JSON loss log and "
                                          "resume. Ctrl-C saves at the next step boundary.")
    p.add_argument("--framework", required=True, choices=("torch", "keras", "tf"),
                   help="which framework trains (keras and tf are the same)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="run directory: checkpoint.safetensors, log.json, run.json (manifest), saves/")
    g = p.add_argument_group("task")
    g.add_argument("--task", choices=("reverse", "copy"), help="default reverse")
    g.add_argument("--num-symbols", type=int, help="symbols besides PAD/BOS/EOS (default 10)")
    g.add_argument("--min-len", type=int, help="shortest source (default 1)")
    g.add_argument("--max-len", type=int, help="longest source (default 16)")
    g = p.add_argument_group("model (a new run; --init takes the checkpoint's)")
    g.add_argument("--d-model", type=int, help="default 64")
    g.add_argument("--heads", type=int, help="default 4")
    g.add_argument("--layers", type=int, help="encoder and decoder layers each (default 2)")
    g.add_argument("--d-ff", type=int, help="default 256")
    g.add_argument("--dropout", type=float, help="default 0")
    g.add_argument("--init", metavar="CHECKPOINT", help="start from these canonical weights (fine-tuning)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, help="total optimizer steps (default 2000; may be raised on --resume)")
    g.add_argument("--batch-size", type=int, help="default 64")
    g.add_argument("--seed", type=int, help="weights, batches and dropout (default 0)")
    g.add_argument("--dtype", choices=("float32", "float64"), help="default float32")
    g.add_argument("--schedule", choices=("cosine", "noam", "constant"),
                   help="cosine: linear warm-up then cosine decay to --min-lr (default); noam: the paper's "
                        "d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), times --lr-scale")
    g.add_argument("--lr", type=float, help="peak learning rate of cosine/constant (default 1e-3)")
    g.add_argument("--warmup", type=int, help="warm-up steps (default 100)")
    g.add_argument("--lr-scale", type=float, help="noam multiplier (default 1)")
    g.add_argument("--min-lr", type=float, help="cosine floor (default 0)")
    g.add_argument("--beta1", type=float, help="Adam beta1 (default 0.9, the paper's)")
    g.add_argument("--beta2", type=float, help="Adam beta2 (default 0.98, the paper's)")
    g.add_argument("--eps", type=float, help="Adam epsilon (default 1e-9, the paper's)")
    g.add_argument("--label-smoothing", type=float, help="default 0 (the paper used 0.1)")
    g = p.add_argument_group("bookkeeping")
    g.add_argument("--eval-every", type=int, help="steps between evaluations (default 200)")
    g.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (default 500)")
    g.add_argument("--eval-size", type=int, help="held-out sequences per evaluation (default 512)")
    g.add_argument("--threads", type=int, help="CPU threads of the framework (default: its own choice; 1 is often "
                                               "fastest for these small models on a busy machine)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out")
    g.add_argument("--extend-schedule", action="store_true",
                   help="with --resume past the end of a cosine schedule: stretch it to the new --steps (without "
                        "it such a resume is refused, since the extra steps would train at --min-lr)")
    g.add_argument("--force", action="store_true", help="start over in a --out that already holds a run")
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser("generate", help="decode with a trained checkpoint (greedy or seeded sampling)",
                              epilog=GENERATE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Decode task inputs with a canonical checkpoint in any backend and print "
                                          "the tokens. The task comes from the run directory the checkpoint sits "
                                          "in, else from the --task options.")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="canonical .safetensors checkpoint")
    p.add_argument("--framework", required=True, choices=("numpy", "torch", "keras", "tf"),
                   help="backend that decodes (keras and tf are the same)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="compute dtype")
    _add_task_options(p)
    p.add_argument("--src", metavar="IDS", help='one source as space-separated symbol ids, e.g. "5 6 7"')
    p.add_argument("--examples", type=int, default=5, help="random task inputs to decode (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    p.add_argument("--top-k", type=int, help="sample among the k highest scores only")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the shared sampling generator")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole prefix every step")
    p.set_defaults(func=cmd_generate)

    p = subparsers.add_parser("plot", help="positional encodings, attention maps, loss curves (PNG)",
                              epilog=PLOT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Draw pictures with matplotlib.")
    kinds = p.add_subparsers(dest="plot_kind", metavar="KIND", required=True, parser_class=type(p))
    k = kinds.add_parser("positional", help="the sinusoidal table over position and dimension, both layouts")
    k.add_argument("--d-model", type=int, default=64)
    k.add_argument("--length", type=int, default=64)
    _add_plot_output(k)
    k = kinds.add_parser("attention", help="attention maps per layer and head (or the difference of two backends)")
    k.add_argument("checkpoint", metavar="CHECKPOINT")
    k.add_argument("--framework", choices=("numpy", "torch", "keras", "tf"), default="numpy")
    k.add_argument("--against", choices=("numpy", "torch", "keras", "tf"),
                   help="plot framework minus this backend")
    k.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    _add_task_options(k)
    k.add_argument("--src", metavar="IDS", help="source symbol ids (default: one random task input)")
    k.add_argument("--seed", type=int, default=0)
    _add_plot_output(k)
    k = kinds.add_parser("loss", help="loss curves of training runs on one chart")
    k.add_argument("logs", nargs="+", metavar="LOG", help="log.json files (or run directories)")
    k.add_argument("--labels", help="comma-separated legend labels (default: each run's framework)")
    _add_plot_output(k)
    p.set_defaults(func=cmd_plot)


def _add_task_options(p) -> None:
    p.add_argument("--task", choices=("reverse", "copy"), help="default: the run's task, else reverse")
    p.add_argument("--num-symbols", type=int, help="default: the run's, else 10")
    p.add_argument("--min-len", type=int, help="default: the run's, else 1")
    p.add_argument("--max-len", type=int, help="default: the run's, else 16")


def _add_plot_output(p) -> None:
    p.add_argument("-o", "--output", required=True, metavar="PNG", help="file to write")
    p.add_argument("--force", action="store_true", help="overwrite it if it exists")
    # the CLI adds --quiet/--debug to each subcommand; these nested ones need them too
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="print nothing")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")


def _quiet(args) -> bool:
    return bool(getattr(args, "quiet", False))


def _stderr(args, message: str) -> None:
    if not _quiet(args):
        print(message, file=sys.stderr, flush=True)


# --- train ---------------------------------------------------------------------------------------------------------

def _given(args) -> dict:
    return {name: getattr(args, name) for name in TRAIN_DEFAULTS if getattr(args, name, None) is not None}


def settings_from_options(options: dict, model_fields: dict | None = None):
    """`TrainSettings` from CLI option values (missing ones take `TRAIN_DEFAULTS`)."""
    import reference_numpy as rn

    from transformer_parity.train.run import TrainSettings

    o = {**TRAIN_DEFAULTS, **options}
    try:
        task = rn.TaskSpec(o["task"], o["num_symbols"], o["min_len"], o["max_len"])
        model = model_fields if model_fields is not None else dict(
            d_model=o["d_model"], num_heads=o["heads"], num_encoder_layers=o["layers"],
            num_decoder_layers=o["layers"], d_ff=o["d_ff"], dropout=o["dropout"])
        if o["schedule"] == "noam":
            schedule = rn.Schedule("noam", d_model=model.get("d_model", 64), warmup_steps=o["warmup"],
                                   scale=o["lr_scale"])
        elif o["schedule"] == "cosine":
            schedule = rn.Schedule("cosine", peak_lr=o["lr"], warmup_steps=o["warmup"], total_steps=o["steps"],
                                   min_lr=o["min_lr"])
        else:
            schedule = rn.Schedule("constant", peak_lr=o["lr"], warmup_steps=0)
        return TrainSettings(task=task, model=model, steps=o["steps"], batch_size=o["batch_size"], seed=o["seed"],
                             dtype=o["dtype"], schedule=schedule,
                             adam=rn.AdamSettings(o["beta1"], o["beta2"], o["eps"]),
                             label_smoothing=o["label_smoothing"], eval_every=o["eval_every"],
                             checkpoint_every=o["checkpoint_every"], eval_size=o["eval_size"])
    except ValueError as exc:
        raise UsageError(f"invalid training option: {exc}") from None


def _model_fields(config, task) -> dict:
    """The config fields of a checkpoint that differ from the task's default model (for `--init`)."""
    default = task.model_config().to_dict()
    return {k: v for k, v in config.to_dict().items() if default[k] != v}


class _TrainProgress:
    """A rich progress bar on a terminal; elsewhere one line per evaluation (none with --quiet)."""

    def __init__(self, args, total: int, start: int):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        self.args, self.total, self.last_eval = args, total, None
        self.console = Console(stderr=True, quiet=_quiet(args))
        self.live = self.console.is_terminal and not _quiet(args)
        self.progress = Progress(TextColumn(f"train {args.framework}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=self.console, disable=not self.live)
        self.task = self.progress.add_task("train", total=total, completed=start, info="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def __call__(self, step: int, latest: dict) -> None:
        info = f"loss {latest['loss']:.4f} lr {latest['lr']:.2e}"
        if "token_accuracy" in latest:
            info += f" token {100 * latest['token_accuracy']:.1f}% seq {100 * latest['sequence_accuracy']:.1f}%"
        self.progress.update(self.task, completed=step, info=info)
        evaluated = latest.get("token_accuracy") is not None and latest.get("token_accuracy") != self.last_eval
        if not self.live and not _quiet(self.args) and (evaluated or step == self.total):
            self.last_eval = latest.get("token_accuracy")
            print(f"step {step}/{self.total}  {info}", file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        if not _quiet(self.args):
            self.console.print(f"note: {message}", markup=False, highlight=False, soft_wrap=True)


def cmd_train(args) -> int:
    import reference_numpy as rn

    from transformer_parity.train import run as training_run

    args.framework = "tf" if args.framework == "keras" else args.framework  # one backend, two names

    out = Path(args.out)
    given = _given(args)
    init = None
    if args.resume:
        if args.init or args.force:
            raise UsageError("--resume continues the stored run; it cannot be combined with --init or --force")
        state_settings = training_run.stored_settings(out)
        stored = {**TRAIN_DEFAULTS, **_options_of(state_settings)}
        changed = sorted(k for k, v in given.items() if k != "steps" and stored.get(k) != v)
        if changed:
            raise UsageError(f"--resume continues the stored run; these options differ from it: "
                             f"{', '.join('--' + k.replace('_', '-') for k in changed)}")
        settings = dataclasses.replace(state_settings, steps=given.get("steps", state_settings.steps))
    else:
        model_fields = None
        if args.init:
            model_options = {"d_model", "heads", "layers", "d_ff"} & set(given)
            if model_options:
                raise UsageError(f"--init takes the model from the checkpoint; drop "
                                 f"{', '.join('--' + k.replace('_', '-') for k in sorted(model_options))}")
            config, init = _read_checkpoint(args.init)
            task = settings_from_options(given).task
            try:
                rn.check_config(task, config)
            except ValueError as exc:
                raise UsageError(f"--init {args.init}: {exc}") from None
            model_fields = _model_fields(config, task)
            if "dropout" in given:
                model_fields["dropout"] = given["dropout"]
        settings = settings_from_options(given, model_fields)
    _check_train_memory(settings, args.framework)
    if args.threads is not None:
        set_threads(args.framework, args.threads)
    with _TrainProgress(args, settings.steps, 0) as bar:
        log = training_run.train(out, args.framework, settings, resume=args.resume, force=args.force,
                                 init_weights=init, progress=bar, on_event=bar.note,
                                 extend_schedule=args.extend_schedule)
    last = log["eval"][-1] if log["eval"] else {}
    if not _quiet(args):
        print(f"trained {args.framework} for {settings.steps} steps in {log['train_seconds']:.0f} s: loss "
              f"{log['loss'][-1][1]:.4g}, token accuracy {100 * last.get('token_accuracy', float('nan')):.2f}%, "
              f"sequence accuracy {100 * last.get('sequence_accuracy', float('nan')):.2f}%  ->  {out}")
    return 0


def _check_train_memory(settings, framework: str) -> None:
    """Refuse sizes (--batch-size, --eval-size, --num-symbols, --max-len, the model's) that cannot fit in memory."""
    from transformer_parity.io import limits

    task = settings.task
    config = settings.model_config()
    what = (f"train --framework {framework} (--batch-size {settings.batch_size}, --eval-size {settings.eval_size}, "
            f"--num-symbols {task.num_symbols}, --max-len {task.max_len}, d_model {config.d_model}, "
            f"{config.num_encoder_layers}+{config.num_decoder_layers} layers)")
    limits.check_run(config, what,
                     batch=max(settings.batch_size, settings.eval_size), src_len=task.max_len,
                     tgt_len=task.target_len, itemsize=4 if settings.dtype == "float32" else 8, training=True)


def set_threads(framework: str, threads: int) -> None:
    """Intra-op CPU threads of the framework (TensorFlow: only before its first op runs)."""
    import os

    most = 4 * (os.cpu_count() or 1)
    if not 1 <= threads <= most:
        raise UsageError(f"--threads must be between 1 and {most} (4 x this machine's {os.cpu_count()} CPUs), "
                         f"received {threads}")
    if framework == "torch":
        import torch

        torch.set_num_threads(threads)
    else:
        from tf_impl.startup import tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError as exc:  # TensorFlow already initialised in this process
            raise UsageError(f"--threads {threads}: {exc}") from None


def _options_of(settings) -> dict:
    """CLI option values that reproduce `settings` (for comparing with what --resume was given)."""
    s, m = settings, settings.model
    options = dict(task=s.task.name, num_symbols=s.task.num_symbols, min_len=s.task.min_len,
                   max_len=s.task.max_len, steps=s.steps, batch_size=s.batch_size, seed=s.seed, dtype=s.dtype,
                   schedule=s.schedule.kind, warmup=s.schedule.warmup_steps, beta1=s.adam.beta1,
                   beta2=s.adam.beta2, eps=s.adam.eps, label_smoothing=s.label_smoothing,
                   eval_every=s.eval_every, checkpoint_every=s.checkpoint_every, eval_size=s.eval_size)
    if s.schedule.kind == "noam":
        options["lr_scale"] = s.schedule.scale
    else:
        options["lr"] = s.schedule.peak_lr
        options["min_lr"] = s.schedule.min_lr
    for option, name in (("d_model", "d_model"), ("heads", "num_heads"), ("layers", "num_encoder_layers"),
                         ("d_ff", "d_ff"), ("dropout", "dropout")):
        if name in m:
            options[option] = m[name]
    return options


# --- generate ------------------------------------------------------------------------------------------------------

def _read_checkpoint(path):
    """`(config, weights)` of a checkpoint, read as hostile (`formats.load`: config checked against the tensors)."""
    from transformer_parity import formats

    loaded = formats.load(path)
    return loaded.config, loaded.weights


def _task_for(args, checkpoint: Path):
    """The task: explicit options over the run directory's stored task over the defaults."""
    import reference_numpy as rn

    from transformer_parity.train import run as training_run

    stored = {}
    if checkpoint.name == training_run.CHECKPOINT and (checkpoint.parent / training_run.MANIFEST).is_file():
        stored = training_run.stored_settings(checkpoint.parent).task.to_dict()
    fields = {"name": "reverse", "num_symbols": 10, "min_len": 1, "max_len": 16, **stored}
    for option, field in (("task", "name"), ("num_symbols", "num_symbols"), ("min_len", "min_len"),
                          ("max_len", "max_len")):
        if getattr(args, option, None) is not None:
            fields[field] = getattr(args, option)
    try:
        return rn.TaskSpec(**fields)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid task: {exc}") from None


def _load_for_task(args):
    import reference_numpy as rn

    path = Path(args.checkpoint)
    config, weights = _read_checkpoint(path)
    task = _task_for(args, path)
    try:
        rn.check_config(task, config)
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return task, config, weights


def _sources(args, task):
    """`(src_ids, labels or None)` from --src or random task examples."""
    import numpy as np

    import reference_numpy as rn

    if args.src is not None:
        try:
            symbols = [int(t) for t in args.src.replace(",", " ").split()]
        except ValueError:
            raise UsageError(f"--src must be space-separated integer ids, received {args.src!r}") from None
        low, high = rn.tasks.NUM_SPECIAL, task.vocab_size - 1
        bad = [s for s in symbols if not low <= s <= high]
        if not symbols or len(symbols) > task.max_len or bad:
            raise UsageError(f"--src must hold 1 to {task.max_len} symbol ids in [{low}, {high}], received "
                             f"{args.src!r}")
        src = np.zeros((1, task.max_len), dtype=np.int64)
        src[0, :len(symbols)] = symbols
        answer = symbols[::-1] if task.name == "reverse" else symbols
        labels = np.zeros((1, task.target_len), dtype=np.int64)
        labels[0, :len(answer)] = answer
        labels[0, len(answer)] = rn.EOS_ID
        return src, labels
    if args.examples < 1:
        raise UsageError(f"--examples must be >= 1, received {args.examples}")
    from transformer_parity.io import limits
    limits.check_memory(16 * args.examples * (task.max_len + task.target_len), f"--examples {args.examples}")
    batch = task.make_batch(args.examples, np.random.default_rng([args.seed, 7]))
    return batch.src, batch.labels


def stepper(framework: str, config, weights, src, dtype: str = "float32", cache: bool = True):
    """A `next_logits` for `reference_numpy.generate` from canonical weights in any backend."""
    import reference_numpy as rn

    from transformer_parity import backends

    backend = backends.get(framework)
    if backend.name == "numpy":
        return rn.reference_stepper(backend.build(config, weights, dtype), src)
    if backend.name == "torch":
        from torch_impl.decoding import cached_stepper, recompute_stepper
    else:
        from tf_impl.decoding import cached_stepper, recompute_stepper
    model = backend.build(config, weights, dtype)
    return (cached_stepper if cache else recompute_stepper)(model, src)


def _show(ids) -> str:
    import reference_numpy as rn

    names = {rn.BOS_ID: "<bos>", rn.EOS_ID: "<eos>"}
    out = []
    for t in ids:
        if t == rn.PAD_ID:
            break
        out.append(names.get(int(t), str(int(t))))
    return " ".join(out)


def cmd_generate(args) -> int:
    import numpy as np

    import reference_numpy as rn

    task, config, weights = _load_for_task(args)
    if args.sample:
        try:
            rn.decoding.check_sampling(args.temperature, args.top_k, config.tgt_vocab_size)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    src, labels = _sources(args, task)
    from transformer_parity.io import limits
    limits.check_run(config, f"generate --examples {src.shape[0]}", batch=src.shape[0], src_len=src.shape[1],
                     tgt_len=task.target_len, itemsize=4 if args.dtype == "float32" else 8, weight_copies=2)
    next_logits = stepper(args.framework, config, weights, src, args.dtype, cache=not args.no_cache)
    started = time.perf_counter()
    generated = rn.generate(next_logits, src.shape[0], bos_id=rn.BOS_ID, eos_id=rn.EOS_ID, pad_id=rn.PAD_ID,
                            max_new_tokens=task.target_len, greedy=not args.sample, temperature=args.temperature,
                            top_k=args.top_k, rng=np.random.default_rng(args.sample_seed) if args.sample else None)
    seconds = time.perf_counter() - started
    answers = generated[:, 1:]
    exact = 0
    for i in range(src.shape[0]):
        correct = bool(np.array_equal(answers[i], labels[i]))
        exact += correct
        print(f"src: {_show(src[i])}")
        print(f"out: {_show(answers[i])}   [{'correct' if correct else 'expected ' + _show(labels[i])}]")
    token, _ = rn.accuracy(answers, labels)
    mode = "sampled" if args.sample else "greedy"
    _stderr(args, f"{mode} ({args.framework}, {'recompute' if args.no_cache else 'cache'}): {exact}/{src.shape[0]} "
                  f"sequences exact, token accuracy {100 * token:.1f}%, {seconds:.2f} s")
    return 0


# --- plot ----------------------------------------------------------------------------------------------------------

def cmd_plot(args) -> int:
    from transformer_parity import plots

    if args.plot_kind == "positional":
        path = plots.plot_positional(args.output, args.d_model, args.length, args.force)
    elif args.plot_kind == "attention":
        path = _plot_attention(args, plots)
    else:
        path = _plot_loss(args, plots)
    _stderr(args, f"wrote {path}")
    return 0


def _plot_attention(args, plots):
    import numpy as np

    import reference_numpy as rn

    plots.check_output(args.output, args.force)
    task, config, weights = _load_for_task(args)
    args.examples = 1
    src, labels = _sources(args, task)
    tgt_in = np.zeros_like(labels)
    tgt_in[:, 0] = rn.BOS_ID
    tgt_in[:, 1:] = np.where(labels[:, :-1] == rn.EOS_ID, rn.PAD_ID, labels[:, :-1])  # the teacher-forced input
    maps = plots.attention_maps(args.framework, config, weights, src, tgt_in, args.dtype)
    src_tokens = [_show([t]) or "pad" for t in src[0]]
    tgt_tokens = [_show([t]) or "pad" for t in tgt_in[0]]
    if args.against:
        other = plots.attention_maps(args.against, config, weights, src, tgt_in, args.dtype)
        maps = {name: maps[name] - other[name] for name in maps}
        title = f"attention weights, {args.framework} - {args.against} ({args.dtype})"
        return plots.plot_attention(args.output, maps, title, args.force, difference=True,
                                    src_tokens=src_tokens, tgt_tokens=tgt_tokens)
    return plots.plot_attention(args.output, maps, f"attention weights ({args.framework}, {args.dtype})", args.force,
                                src_tokens=src_tokens, tgt_tokens=tgt_tokens)


def _plot_loss(args, plots):
    from transformer_parity.train.run import LOG, read_log

    plots.check_output(args.output, args.force)
    logs = []
    for item in args.logs:
        path = Path(item)
        logs.append(read_log(path / LOG if path.is_dir() else path))
    labels = args.labels.split(",") if args.labels else [log.get("framework", f"run {i}") for i, log in
                                                         enumerate(logs)]
    if len(labels) != len(logs):
        raise UsageError(f"--labels gives {len(labels)} label(s) for {len(logs)} log(s)")
    return plots.plot_loss_curves(args.output, list(zip(labels, logs)), args.force)
