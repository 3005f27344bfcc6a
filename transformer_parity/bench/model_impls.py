"""Every whole-model implementation `transformer-parity bench model` can time, by name (`bench model --list`).

An implementation turns a `Problem` (config, shapes, task, dtype), the canonical weights and the inputs into a
`Runner` (see `harness`): `fn` does one timed call of the task (a forward pass, one training step, or one greedy
generation from the source), `to_numpy` turns its result into what is checked (logits, the loss before the update,
or the generated ids and the last step's logits). Every implementation of a problem starts from
the same canonical weights: torch_impl and tf_impl load them through their `weight_table`s, `torch.nn.Transformer`
through the project's nn.Transformer layout export.

Frameworks are imported inside the builders, so `--list` needs neither PyTorch nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .harness import NotInstalled, Runner, Unsupported, select_from

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
            why = self.why_not or "tasks: " + ", ".join(self.tasks)
            raise Unsupported(f"{self.name} has no {problem.task} form ({why})")
        if problem.dtype not in self.dtypes:
            raise Unsupported(f"{self.name} does not run in {problem.dtype} ({self.why_not})")
        return self.builder(problem, weights, inputs)


def greedy(next_logits, start: np.ndarray, steps: int):
    """`steps` greedy tokens after `start` (`(B, P)`: the start token, or a prompt), no early stop, so that every
    call does the same work; returns the ids `(B, P + steps)` and the last step's logits `(B, V)`."""
    ids = np.asarray(start, dtype=np.int64)
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
    tgt, labels = torch.as_tensor(inputs.tgt), torch.as_tensor(inputs.labels)
    # a decoder-only model takes its one sequence as the first argument
    args = (tgt,) if problem.config.is_decoder_only else (torch.as_tensor(inputs.src), tgt)
    if problem.task == "train":
        trainer = Trainer(problem.config, weights, dtype=problem.dtype)
        if compiled:
            trainer.model = torch.compile(trainer.model)  # shares the parameters the optimizer updates
        train_args = (tgt, None) if problem.config.is_decoder_only else args
        return Runner(fn=lambda: trainer.train_step(*train_args, labels),
                      to_numpy=lambda loss: {"loss": np.float64(loss)})
    model = Transformer.from_reference(problem.config, weights, dtype=dtype).eval()
    if problem.task == "forward":
        run = torch.compile(model) if compiled else model
        return Runner(fn=lambda: run(*args), context=torch.no_grad,
                      to_numpy=lambda out: {"logits": out.float().numpy().astype(np.float64)})
    if compiled:
        raise Unsupported("torch.compile of a step whose cache grows every call recompiles per length")
    _float_decode(model)
    stepper = decoding.cached_stepper if problem.task == "generate" else decoding.recompute_stepper
    return Runner(fn=lambda: greedy(stepper(model, inputs.src), inputs.start, problem.new_tokens),
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
    """The project's canonical -> nn.Transformer export."""
    from transformer_parity.layouts.nn_transformer import export_nn_transformer

    return export_nn_transformer


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

    return Runner(fn=lambda: greedy(recompute_stepper(inputs.src), inputs.start, problem.new_tokens),
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
    from tf_impl.startup import tf
    return tf


def _build_tf_impl(problem, weights, inputs, mode: str) -> Runner:
    """mode: eager | function | xla."""
    tf = _tf()
    from tf_impl import model as tf_model
    accepted = tuple(tf_model.DTYPES) + tuple(getattr(tf_model, "LOW_PRECISION", ()))
    if problem.dtype not in accepted:
        raise Unsupported(f"tf_impl.Transformer takes dtype {', '.join(accepted)} (tf_impl/model.py), "
                          f"not {problem.dtype}")
    from tf_impl import Transformer
    decoder_only = problem.config.is_decoder_only
    tgt, labels = tf.constant(inputs.tgt), tf.constant(inputs.labels)
    args = (tgt, None) if decoder_only else (tf.constant(inputs.src), tgt)
    if problem.task == "train":
        from tf_impl.training import Trainer
        trainer = Trainer(problem.config, weights, dtype=problem.dtype, compiled=mode != "eager",
                          jit_compile=mode == "xla")
        return Runner(fn=lambda: trainer.train_step(*args, labels), to_numpy=lambda loss: {"loss": np.float64(loss)})
    model = Transformer.from_reference(problem.config, weights, dtype=problem.dtype)
    if problem.task == "forward":
        def call(s, t):
            return model(s, t, training=False)
        run = call if mode == "eager" else tf.function(call, jit_compile=mode == "xla")
        return Runner(fn=lambda: run(*args), to_numpy=lambda out: {"logits": np.asarray(out, dtype=np.float64)})
    from tf_impl import decoding
    if problem.task == "generate" and mode != "eager":
        # the whole greedy loop as one tf.function over a fixed-size cache, compiled by XLA for .xla (without XLA
        # still 2.3x faster than a Python loop over cached_stepper's compiled step on gpt2-256)
        return Runner(fn=lambda: decoding.greedy(model, inputs.start, problem.new_tokens, inputs.src,
                                                 jit_compile=mode == "xla"), to_numpy=_generation_output)
    stepper = decoding.cached_stepper if problem.task == "generate" else decoding.recompute_stepper
    compiled = mode == "function"
    return Runner(fn=lambda: greedy(stepper(model, inputs.src, compiled=compiled), inputs.start, problem.new_tokens),
                  to_numpy=_generation_output)


# --- Hugging Face transformers and KerasHub ----------------------------------------------------------------------

def _hf_directory(config, weights, tmp: str) -> tuple[str, dict]:
    """Write the canonical weights as a Hugging Face model directory (the project's layout export); returns its path
    and config.json. A config no Hugging Face family expresses is `Unsupported`."""
    from transformer_parity.layouts import hf
    try:
        hf.family_for_export(config)
    except ValueError as exc:
        raise Unsupported(str(exc)) from None
    path = os.path.join(tmp, "model")
    hf.save_dir(path, config, weights)
    with open(os.path.join(path, "config.json")) as f:
        return path, json.load(f)


def _build_transformers(problem, weights, inputs) -> Runner:
    torch = _torch()
    if importlib.util.find_spec("transformers") is None:
        raise NotInstalled("transformers is not installed")
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    c = problem.config
    with tempfile.TemporaryDirectory() as tmp:
        path, hf_config = _hf_directory(c, weights, tmp)
        arch = hf_config["architectures"][0]
        model = getattr(transformers, arch).from_pretrained(path, dtype=getattr(torch, problem.dtype)).eval()
    tgt, labels = torch.as_tensor(inputs.tgt), torch.as_tensor(inputs.labels)
    if c.is_decoder_only:
        kwargs = dict(input_ids=tgt, attention_mask=tgt != c.pad_id)
    else:
        src = torch.as_tensor(inputs.src)
        kwargs = dict(input_ids=src, attention_mask=src != c.pad_id, decoder_input_ids=tgt,
                      decoder_attention_mask=tgt != c.pad_id)
    if problem.task == "forward":
        return Runner(fn=lambda: model(**kwargs).logits, context=_no_grad_quiet,
                      to_numpy=lambda out: {"logits": out.float().numpy().astype(np.float64)})
    if problem.task == "train":
        from reference_numpy.training import AdamSettings, Schedule
        from torch_impl.training import make_optimizer, token_cross_entropy
        optimizer, scheduler = make_optimizer(model, AdamSettings(), Schedule())

        def step():  # torch_impl.training.Trainer.train_step, on this model
            model.train()
            optimizer.zero_grad(set_to_none=True)
            loss = token_cross_entropy(model(**kwargs).logits, labels, c.pad_id)
            loss.backward()
            optimizer.step()
            scheduler.step()
            return float(loss.detach())

        return Runner(fn=step, to_numpy=lambda loss: {"loss": np.float64(loss)}, context=_quiet)
    start = torch.as_tensor(inputs.start)
    if c.is_decoder_only:
        gen_kwargs = dict(input_ids=start, attention_mask=torch.ones_like(start, dtype=torch.bool))
    else:
        gen_kwargs = dict(input_ids=kwargs["input_ids"], attention_mask=kwargs["attention_mask"],
                          decoder_start_token_id=int(inputs.start[0, 0]))

    def generate():  # model.generate, greedy, exactly new_tokens tokens (no end token)
        out = model.generate(**gen_kwargs, max_new_tokens=problem.new_tokens, do_sample=False, num_beams=1,
                             use_cache=problem.task == "generate", output_logits=True, return_dict_in_generate=True,
                             pad_token_id=c.pad_id, eos_token_id=None)
        return out.sequences.numpy(), out.logits[-1].float().numpy()

    return Runner(fn=generate, context=_no_grad_quiet, to_numpy=_generation_output)


def _tf_adam():
    from reference_numpy.training import AdamSettings, Schedule
    from tf_impl.training import Adam
    return Adam.from_settings(AdamSettings(), Schedule())


def _keras_hub_lm(problem, weights):
    """KerasHub's causal LM of the model's family: the project's KerasHub preset export
    (`kerashub_preset.save_preset`, which picks the family that expresses the model), loaded by keras_hub's own
    `CausalLM.from_preset`. A model no KerasHub family holds is `Unsupported`."""
    import tf_impl.startup  # noqa: F401 (TensorFlow's start-up notices kept off the terminal)
    import keras_hub
    from transformer_parity.layouts import kerashub_preset
    with tempfile.TemporaryDirectory() as tmp:
        preset = os.path.join(tmp, "preset")
        try:
            kerashub_preset.save_preset(preset, problem.config, dict(weights), "kerashub")
        except ValueError as exc:
            raise Unsupported(f"no KerasHub family holds this model: {exc}") from None
        return keras_hub.models.CausalLM.from_preset(preset, dtype=problem.dtype)


def _build_keras_hub(problem, weights, inputs, mode: str) -> Runner:
    """KerasHub's causal LM of the model's family (`_keras_hub_lm`): forward, a training step, `generate()`."""
    tf = _tf()
    if importlib.util.find_spec("keras_hub") is None:
        raise NotInstalled("keras-hub is not installed")
    c = problem.config
    if not c.is_decoder_only:
        raise Unsupported("only KerasHub's causal LMs are wired here (decoder-only models)")
    lm = _keras_hub_lm(problem, weights)
    batch = {"token_ids": tf.constant(inputs.tgt), "padding_mask": tf.constant(inputs.tgt != c.pad_id)}
    labels = tf.constant(inputs.labels)

    def compiled(fn):
        return fn if mode == "eager" else tf.function(fn, jit_compile=mode == "xla")

    if problem.task == "forward":
        run = compiled(lambda x: lm(x, training=False))
        return Runner(fn=lambda: run(batch),
                      to_numpy=lambda out: {"logits": np.asarray(tf.cast(out, tf.float32), dtype=np.float64)})
    if problem.task == "train":
        from tf_impl.training import token_cross_entropy
        optimizer = _tf_adam()
        variables = lm.trainable_variables
        optimizer.build(variables)

        def step(x, y):  # tf_impl.training.Trainer's step, on this model
            with tf.GradientTape() as tape:
                loss = token_cross_entropy(tf.cast(lm(x, training=True), tf.float32), y, c.pad_id)
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
            optimizer.apply(grads, variables)
            return loss

        run = compiled(step)
        return Runner(fn=lambda: float(run(batch, labels)), to_numpy=lambda loss: {"loss": np.float64(loss)})
    if problem.task == "generate-nocache" or mode == "eager":
        raise Unsupported("KerasHub's CausalLM.generate always uses its cache and compiles its loop")
    lm.compile(sampler="greedy", jit_compile=mode == "xla")
    p, n = inputs.start.shape[1], problem.new_tokens
    ids = np.concatenate([inputs.start, np.zeros((inputs.start.shape[0], n), np.int64)], axis=1)  # (B, P + N)
    prompt = {"token_ids": ids, "padding_mask": np.arange(p + n)[None, :].repeat(len(ids), 0) < p}

    def generate():
        out = lm.generate(prompt, stop_token_ids=None)
        return np.asarray(out["token_ids"]), None

    return Runner(fn=generate, to_numpy=lambda out: {"ids": out[0]})


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
          "generation: tf_impl.decoding.greedy, the whole loop as one tf.function; without cache: its compiled "
          "steps)", TASKS, ALL_DTYPES, _build_tf_impl, mode="function"),
    _impl("tf_impl.xla", "tf", "tf_impl.Transformer under tf.function(jit_compile=True) (training: "
          "Trainer(jit_compile=True); generation: tf_impl.decoding.greedy, the whole loop compiled by XLA)",
          ("forward", "train", "generate"), ALL_DTYPES, _build_tf_impl,
          why_not="generation without a cache recompiles per length (dynamic shapes)", mode="xla"),
]}

REGISTRY.update({impl.name: impl for impl in [
    _impl("transformers", "torch", "the transformers class of the model's family (the causal LM, the translation "
          "model or the masked LM that the project's Hugging Face export names), from that export",
          TASKS, ALL_DTYPES, _build_transformers),
    _impl("keras_hub.eager", "tf", "KerasHub's causal LM of the model's family (decoder-only models; from the project's "
          "preset export), eager",
          ("forward", "train"), ALL_DTYPES, _build_keras_hub, why_not="generate() compiles its loop", mode="eager"),
    _impl("keras_hub.function", "tf", "KerasHub's causal LM under tf.function (generation: generate(), greedy)",
          ("forward", "train", "generate"), ALL_DTYPES, _build_keras_hub,
          why_not="KerasHub's CausalLM.generate always uses its cache", mode="function"),
    _impl("keras_hub.xla", "tf", "KerasHub's causal LM under tf.function(jit_compile=True)",
          ("forward", "train", "generate"), ALL_DTYPES, _build_keras_hub,
          why_not="KerasHub's CausalLM.generate always uses its cache", mode="xla"),
]})

OURS = ("torch_impl.", "tf_impl.")


def select(patterns: list[str] | None) -> list[ModelImpl]:
    """Implementations by exact name or glob (`torch*`, `*.xla`), in registry order; all when `patterns` is None."""

    return select_from(REGISTRY, patterns, "transformer-parity bench model --list")
