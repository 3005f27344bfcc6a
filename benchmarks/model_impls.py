"""Every whole-model implementation `transformer-parity bench model` can time, by name (`bench model --list`).

An implementation turns a `Problem` (config, shapes, task, dtype), the canonical weights and the inputs into a
`Runner` (see `benchmarks.implementations`): `fn` does one timed call of the task (a forward pass, one training
step, or one greedy generation from the source), `to_numpy` turns its result into what is checked (logits, the loss
before the update, or the generated ids and the last step's logits). Every implementation of a problem starts from
the same canonical weights: torch_impl and tf_impl load them through their `WEIGHT_TABLE`s, `torch.nn.Transformer`
through the project's nn.Transformer layout export.

Frameworks are imported inside the builders, so `--list` needs neither PyTorch nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .implementations import NotInstalled, Runner, Unsupported

TASKS = ("forward", "train", "generate", "generate-nocache")


@dataclass(frozen=True)
class ModelImpl:
    name: str
    framework: str  # torch | tf
    summary: str
    tasks: tuple[str, ...]
    dtypes: tuple[str, ...]
    builder: Callable[..., Runner]
    why_not: str = ""  # why some tasks or dtypes are missing (the note of an `unsupported` row)

    def build(self, problem, weights, inputs) -> Runner:
        if problem.task not in self.tasks:
            raise Unsupported(f"{self.name} has no {problem.task} form ({self.why_not or 'tasks: ' + ', '.join(self.tasks)})")
        if problem.dtype not in self.dtypes:
            raise Unsupported(f"{self.name} does not run in {problem.dtype} ({self.why_not})")
        return self.builder(problem, weights, inputs)


def greedy(next_logits, src_ids: np.ndarray, start_id: int, steps: int):
    """`steps` greedy tokens after `start_id` (no early stop, so every call does the same work); returns the ids
    `(B, 1 + steps)` and the last step's logits `(B, V)`."""
    ids = np.full((src_ids.shape[0], 1), start_id, dtype=np.int64)
    logits = None
    for _ in range(steps):
        logits = np.asarray(next_logits(ids), dtype=np.float32)
        ids = np.concatenate([ids, logits.argmax(-1)[:, None].astype(np.int64)], axis=1)  # (B, t + 1)
    return ids, logits


def _generation_output(out):
    ids, logits = out
    return {"ids": np.asarray(ids), "last_logits": np.asarray(logits, dtype=np.float64)}


# --- PyTorch ----------------------------------------------------------------------------------------------------------

def _torch():
    if importlib.util.find_spec("torch") is None:
        raise NotInstalled("PyTorch is not installed")
    import torch
    return torch


def _float_decode(model):
    """numpy has no bfloat16, and torch_impl.decoding's steppers call `.numpy()` on the logits: hand them float32
    logits by shadowing this one model's `decode` (torch_impl itself is not changed)."""
    torch = _torch()
    if next(model.parameters()).dtype == torch.bfloat16:
        decode = model.decode
        model.decode = lambda *args, **kwargs: decode(*args, **kwargs).float()
    return model


def _build_torch_impl(problem, weights, inputs, compiled: bool = False) -> Runner:
    torch = _torch()
    from torch_impl import Transformer
    from torch_impl import decoding
    from torch_impl.training import Trainer

    dtype = getattr(torch, problem.dtype)
    src, tgt, labels = (torch.as_tensor(a) for a in (inputs.src, inputs.tgt, inputs.labels))
    if problem.task == "train":
        trainer = Trainer(problem.config, weights, dtype=problem.dtype)
        if compiled:
            trainer.model = torch.compile(trainer.model)  # shares the parameters the optimizer updates
        return Runner(fn=lambda: trainer.train_step(src, tgt, labels),
                      to_numpy=lambda loss: {"loss": np.float64(loss)})
    model = Transformer.from_reference(problem.config, weights, dtype=dtype).eval()
    if problem.task == "forward":
        run = torch.compile(model) if compiled else model
        return Runner(fn=lambda: run(src, tgt), context=torch.no_grad,
                      to_numpy=lambda out: {"logits": out.float().numpy().astype(np.float64)})
    if compiled:
        raise Unsupported("torch.compile of a step whose cache grows every call recompiles per length")
    _float_decode(model)
    stepper = decoding.cached_stepper if problem.task == "generate" else decoding.recompute_stepper
    src_np = inputs.src
    return Runner(fn=lambda: greedy(stepper(model, src_np), src_np, inputs.start_id, problem.new_tokens),
                  to_numpy=_generation_output)


def nn_transformer_model(config, weights, dtype):
    """A model around `torch.nn.Transformer` (batch-first) with the layout of PyTorch's translation tutorial
    (`transformer.*`, `src_tok_emb.embedding`, `tgt_tok_emb.embedding`, `generator`, `positional_encoding`), its
    weights the canonical ones through the project's nn.Transformer export, loaded with `strict=True`."""
    torch = _torch()
    nn = torch.nn
    export = _nn_export()

    class TokenEmbedding(nn.Module):
        def __init__(self, vocab_size, d_model):
            super().__init__()
            self.embedding = nn.Embedding(vocab_size, d_model)
            self.scale = math.sqrt(d_model) if config.scale_embedding else 1.0

        def forward(self, ids):
            return self.embedding(ids) * self.scale

    class NNTransformerModel(nn.Module):
        def __init__(self):
            super().__init__()
            c = config
            self.transformer = nn.Transformer(
                d_model=c.d_model, nhead=c.num_heads, num_encoder_layers=c.num_encoder_layers,
                num_decoder_layers=c.num_decoder_layers, dim_feedforward=c.d_ff, dropout=c.dropout,
                activation=c.activation, layer_norm_eps=c.layer_norm_eps, batch_first=True, norm_first=c.norm_first)
            self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
            self.src_tok_emb = TokenEmbedding(c.src_vocab_size, c.d_model)
            self.tgt_tok_emb = TokenEmbedding(c.tgt_vocab_size, c.d_model)
            self.positional_encoding = nn.Module()
            rows = state["positional_encoding.pos_embedding"].shape[0]
            self.positional_encoding.register_buffer("pos_embedding", torch.zeros(rows, 1, c.d_model))  # (L, 1, D)

        def embed(self, ids, tok):
            return tok(ids) + self.positional_encoding.pos_embedding[:ids.shape[1], 0]  # (B, T, D)

        def encode(self, src, src_pad):
            return self.transformer.encoder(self.embed(src, self.src_tok_emb), src_key_padding_mask=src_pad)

        def decode(self, tgt, memory, src_pad, tgt_pad=None):
            t = tgt.shape[1]
            causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # (T, T), True = may not attend (the future)
            return self.transformer.decoder(self.embed(tgt, self.tgt_tok_emb), memory, tgt_mask=causal,
                                            tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad,
                                            tgt_is_causal=True)

        def forward(self, src, tgt, src_pad, tgt_pad):
            return self.generator(self.decode(tgt, self.encode(src, src_pad), src_pad, tgt_pad))

    state = export(config, weights)
    model = NNTransformerModel()
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def _nn_export():
    """The project's canonical -> nn.Transformer export (moving into transformer_parity.layouts)."""
    for module, name in (("transformer_parity.layouts.nn_transformer", "export_nn_transformer"),
                         ("torch_impl.checkpoints", "export_nn_transformer")):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise Unsupported("the nn.Transformer layout export (export_nn_transformer) was not found")


def _build_nn_transformer(problem, weights, inputs) -> Runner:
    torch = _torch()
    c = problem.config
    if not c.is_encoder_decoder:
        raise Unsupported("torch.nn.Transformer is an encoder-decoder")
    try:
        model = nn_transformer_model(c, weights, getattr(torch, problem.dtype))
    except ValueError as exc:  # a config the nn.Transformer layout cannot express (final_norm=False, ...)
        raise Unsupported(str(exc)) from None
    src, tgt, labels = (torch.as_tensor(a) for a in (inputs.src, inputs.tgt, inputs.labels))
    src_pad, tgt_pad = src == c.pad_id, tgt == c.pad_id  # True = padding, nn.Transformer's convention
    if problem.task == "forward":
        return Runner(fn=lambda: model(src, tgt, src_pad, tgt_pad), context=_no_grad_quiet,
                      to_numpy=lambda out: {"logits": out.float().numpy().astype(np.float64)})
    if problem.task == "train":
        from reference_numpy.training import AdamSettings, Schedule
        from torch_impl.training import make_optimizer, token_cross_entropy
        optimizer, scheduler = make_optimizer(model, AdamSettings(), Schedule())

        def step():  # torch_impl.training.Trainer.train_step, on this model
            model.train()
            optimizer.zero_grad(set_to_none=True)
            loss = token_cross_entropy(model(src, tgt, src_pad, tgt_pad), labels, c.pad_id)
            loss.backward()
            optimizer.step()
            scheduler.step()
            return float(loss.detach())

        return Runner(fn=step, to_numpy=lambda loss: {"loss": np.float64(loss)}, context=_quiet)
    if problem.task == "generate":
        raise Unsupported("nn.TransformerDecoder has no key/value cache")

    def recompute_stepper(src_np):  # the tutorial's greedy_decode: the decoder over the whole prefix every step
        with torch.no_grad():
            memory = model.encode(src, src_pad)

        def next_logits(ids):
            with torch.no_grad():
                out = model.decode(torch.as_tensor(ids), memory, src_pad)
                return model.generator(out[:, -1]).float().numpy()  # (B, V), the last position only
        return next_logits

    return Runner(fn=lambda: greedy(recompute_stepper(inputs.src), inputs.src, inputs.start_id, problem.new_tokens),
                  to_numpy=_generation_output, context=_quiet)


@contextlib.contextmanager
def _quiet():
    """nn.Transformer warns on every call that its encoder's nested-tensor fast path is (or is not) taken."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@contextlib.contextmanager
def _no_grad_quiet():
    import torch
    with _quiet(), torch.no_grad():
        yield


# --- TensorFlow / Keras -------------------------------------------------------------------------------------------

def _tf():
    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        raise NotInstalled("TensorFlow or Keras is not installed")
    import tensorflow as tf
    return tf


def _build_tf_impl(problem, weights, inputs, mode: str) -> Runner:
    """mode: eager | function | xla."""
    tf = _tf()
    from tf_impl.model import DTYPES
    if problem.dtype not in DTYPES:
        raise Unsupported(f"tf_impl.Transformer takes dtype {' or '.join(DTYPES)} (tf_impl/model.py DTYPES), "
                          f"not {problem.dtype}")
    from tf_impl import Transformer
    src, tgt, labels = (tf.constant(a) for a in (inputs.src, inputs.tgt, inputs.labels))
    if problem.task == "train":
        from tf_impl.training import Trainer
        trainer = Trainer(problem.config, weights, dtype=problem.dtype, compiled=mode != "eager")
        if mode == "xla":  # Trainer has no jit switch; its step function, recompiled with XLA
            trainer._train_step = tf.function(trainer._train_step_eager, jit_compile=True)
        return Runner(fn=lambda: trainer.train_step(src, tgt, labels),
                      to_numpy=lambda loss: {"loss": np.float64(loss)})
    model = Transformer.from_reference(problem.config, weights, dtype=problem.dtype)
    if problem.task == "forward":
        def call(s, t):
            return model(s, t, training=False)
        run = call if mode == "eager" else tf.function(call, jit_compile=mode == "xla")
        return Runner(fn=lambda: run(src, tgt), to_numpy=lambda out: {"logits": np.asarray(out, dtype=np.float64)})
    if mode == "xla":
        raise Unsupported("tf_impl.decoding compiles its steps with tf.function only (dynamic lengths)")
    from tf_impl import decoding
    stepper = decoding.cached_stepper if problem.task == "generate" else decoding.recompute_stepper
    compiled = mode == "function"
    return Runner(fn=lambda: greedy(stepper(model, inputs.src, compiled=compiled), inputs.src, inputs.start_id,
                                    problem.new_tokens),
                  to_numpy=_generation_output)


# --- the registry -------------------------------------------------------------------------------------------------

def _impl(name, framework, summary, tasks, dtypes, builder, why_not="", **kwargs) -> ModelImpl:
    if kwargs:
        inner = builder

        def builder(problem, weights, inputs, _inner=inner, _kw=tuple(kwargs.items())):
            return _inner(problem, weights, inputs, **dict(_kw))
    return ModelImpl(name, framework, summary, tuple(tasks), tuple(dtypes), builder, why_not)


ALL_DTYPES = ("float32", "bfloat16")
REGISTRY: dict[str, ModelImpl] = {impl.name: impl for impl in [
    _impl("torch_impl.eager", "torch", "torch_impl.Transformer, eager; training via torch_impl.training.Trainer",
          TASKS, ALL_DTYPES, _build_torch_impl),
    _impl("torch_impl.compile", "torch", "torch_impl.Transformer under torch.compile (default mode); first call "
          "includes compilation", ("forward", "train"), ALL_DTYPES, _build_torch_impl,
          why_not="generation with a growing cache recompiles per length", compiled=True),
    _impl("torch.nn.Transformer", "torch", "a batch-first model around torch.nn.Transformer (the translation "
          "tutorial's layout), same weights via the nn.Transformer export", ("forward", "train", "generate-nocache"),
          ALL_DTYPES, _build_nn_transformer, why_not="nn.TransformerDecoder has no key/value cache"),
    _impl("tf_impl.eager", "tf", "tf_impl.Transformer (Keras 3, TensorFlow backend), eager", TASKS, ALL_DTYPES,
          _build_tf_impl, mode="eager"),
    _impl("tf_impl.function", "tf", "tf_impl.Transformer under tf.function (training: Trainer(compiled=True); "
          "generation: tf_impl.decoding's compiled steps)", TASKS, ALL_DTYPES, _build_tf_impl, mode="function"),
    _impl("tf_impl.xla", "tf", "tf_impl.Transformer under tf.function(jit_compile=True)", ("forward", "train"),
          ALL_DTYPES, _build_tf_impl, why_not="tf_impl.decoding compiles with tf.function only", mode="xla"),
]}

OURS = ("torch_impl.", "tf_impl.")


def select(patterns: list[str] | None) -> list[ModelImpl]:
    """Implementations by exact name or glob (`torch*`, `*.xla`), in registry order; all when `patterns` is None."""
    if not patterns:
        return list(REGISTRY.values())
    chosen: list[str] = []
    for pattern in patterns:
        matches = [name for name in REGISTRY if fnmatch.fnmatchcase(name, pattern)]
        if not matches:
            raise ValueError(f"unknown implementation {pattern!r}; `transformer-parity bench model --list` shows "
                             f"the names ({', '.join(REGISTRY)})")
        chosen += [m for m in matches if m not in chosen]
    return [REGISTRY[name] for name in REGISTRY if name in chosen]
