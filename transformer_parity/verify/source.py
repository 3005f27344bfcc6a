"""`verify`'s source oracle: the model the weights came from, run on verify's inputs, its outputs compared with our
float64 reference and every backend (docs/verify.md, "What a verdict proves").

Three kinds of source, one contract (`Source.run(batch)` -> `SourceRun`s of canonical-named arrays):

- **a user's file**, `--source FILE.py:NAME` (`from_file`): `NAME(batch)` with `batch` a dict of NumPy int64 arrays,
  `src_ids` `(B, S)`, `tgt_ids` `(B, T)` for an encoder-decoder model and `src_type_ids` `(B, S)` for a model with
  segment embeddings; it returns the model's output `(B, len, V)` (logits, or final hidden states for a bare backbone),
  or a dict with that under `"output"` plus intermediate outputs under canonical trace names;
- **a probe's answer**, `--expect FILE.npz` (`probes.from_expect`): the inputs `--write-probe` wrote
  (`probes.write_probe`) plus `output` (and intermediates) computed elsewhere;
- **a built-in source** (`builtin`), used by default for a checkpoint whose library is installed: a Hugging Face
  directory run by transformers, a KerasHub preset by keras_hub, an `nn-transformer` file by torch.nn, each loading the
  checkpoint's own files. transformers and torch.nn run in float32 and float64, keras_hub in float32.

What a source returns is checked here (`check_outputs`: names, shapes, dtype, finiteness); the comparison rows and
their tolerances are built by `verify`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import reference_numpy as rn

from transformer_parity.errors import UsageError
from transformer_parity.layouts import HF_LAYOUTS, KERASHUB_PRESETS, hf_layout, hf_tasks

Batch = dict[str, np.ndarray]
OUTPUT = "output"  # the key of the model's output in a source's dict or an --expect file
INPUT_KEYS = ("src_ids", "tgt_ids", "src_type_ids")
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class SourceRun:
    """One run of a source: what the report calls it, and its outputs under canonical names."""

    label: str  # "source", "transformers-f32", "expected", ...
    raw: Any  # what the source returned, before `check_outputs`
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # canonical name -> array, after `check_outputs`


@dataclass
class Source:
    """A model to judge our port against (see the module docstring)."""

    name: str  # how the verdict names it: "model.py:forward", "transformers GPT2LMHeadModel", "probe.npz"
    kind: str  # file | builtin | expect
    run: Callable[[Batch], list[SourceRun]]
    notes: list[str] = field(default_factory=list)
    inputs: Batch | None = None  # --expect: the inputs the outputs were computed on

    @property
    def where(self) -> str:
        """How an error names the source."""
        return {"file": f"--source {self.name}", "expect": f"--expect {self.name}"}.get(
            self.kind, f"the built-in source ({self.name})")


def batch_of(config: rn.TransformerConfig, src: np.ndarray, tgt: np.ndarray | None,
             types: np.ndarray | None) -> Batch:
    """The dict a source receives: `src_ids`, and `tgt_ids` / `src_type_ids` where the model takes them."""
    batch = {"src_ids": np.ascontiguousarray(src, dtype=np.int64)}
    if config.is_encoder_decoder:
        batch["tgt_ids"] = np.ascontiguousarray(tgt, dtype=np.int64)
    if types is not None:
        batch["src_type_ids"] = np.ascontiguousarray(types, dtype=np.int64)
    return batch


# --- checking what a source returned ----------------------------------------------------------------------------------

def to_numpy(value: Any, where: str, key: str) -> np.ndarray:
    """A returned value as a NumPy array (a torch tensor detached and moved to the CPU; anything `np.asarray` takes)."""
    try:
        if hasattr(value, "detach"):
            value = value.detach()
            if hasattr(value, "cpu"):
                value = value.cpu()
        if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
            value = value.numpy()
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:  # a bfloat16 tensor, a ragged list, an object
        raise UsageError(f"{where} returned {key} as a {type(value).__name__} that is not an array "
                         f"({type(exc).__name__}: {exc}); return float32 or float64 (a torch tensor: .float())"
                         ) from None


def check_outputs(run: SourceRun, shapes: Mapping[str, tuple[int, ...]], output_name: str, where: str) -> None:
    """Fill `run.outputs` from `run.raw`: the output (an array, or a dict's "output") under `output_name`, each
    intermediate under its canonical name, each float32 or float64, of the judge's shape and finite. Anything else is
    a `UsageError` naming the source and what it returned."""
    raw = run.raw
    if isinstance(raw, Mapping):
        if OUTPUT not in raw:
            raise UsageError(f"{where} returned a dict without the key {OUTPUT!r} (the model's output), received keys "
                             f"{sorted(map(str, raw))[:8]}")
        items = [(OUTPUT, raw[OUTPUT])] + [(k, v) for k, v in raw.items() if k != OUTPUT]
    else:
        items = [(OUTPUT, raw)]
    outputs = {}
    for key, value in items:
        if not isinstance(key, str):
            raise UsageError(f"{where} returned a dict key {key!r}; keys are {OUTPUT!r} and canonical sublayer names")
        name = output_name if key == OUTPUT else key
        if key != OUTPUT and (name not in shapes or name == output_name):
            valid = [n for n in shapes if n != output_name]
            hint = (f"the output goes under {OUTPUT!r}" if name == output_name else
                    f"canonical names: {', '.join(valid[:4])}{', ...' if len(valid) > 4 else ''}")
            raise UsageError(f"{where} returned {key!r}, which is not a sublayer of this model ({hint})")
        array = to_numpy(value, where, key)
        if array.dtype not in FLOAT_DTYPES:
            raise UsageError(f"{where} returned {key} as {array.dtype}; return float32 or float64 (a torch tensor: "
                             ".float() or .double())")
        if array.shape != tuple(shapes[name]):
            raise UsageError(f"{where} returned {key} of shape {array.shape}; expected {tuple(shapes[name])}"
                             + (" (batch, length, vocabulary or d_model)" if key == OUTPUT else ""))
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        if bad:
            raise UsageError(f"{where} returned {key} with {bad} NaN or inf value(s) of {array.size}")
        outputs[name] = array
    run.outputs = outputs


def level(array: np.ndarray) -> str:
    """The precision a source's array carries: float64 or float32."""
    return "float64" if array.dtype == np.float64 else "float32"


# --- a user's file: --source FILE.py:NAME -----------------------------------------------------------------------------

def parse_spec(spec: str) -> tuple[Path, str]:
    """`FILE.py:NAME` -> (path, name), checked: the file exists and NAME is an identifier."""
    path_text, sep, name = str(spec).rpartition(":")
    if not sep or not path_text or not name:
        raise UsageError(f"--source needs FILE.py:NAME (the function to call), received {spec!r}")
    if not name.isidentifier():
        raise UsageError(f"--source {spec}: {name!r} is not a Python name")
    path = Path(path_text)
    if not path.is_file():
        raise UsageError(f"--source {spec}: no such file: {path}")
    return path, name


@contextlib.contextmanager
def _on_sys_path(folder: Path):
    """The source file's folder first on sys.path while it is imported (its own helper modules), then removed."""
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def load_callable(spec: str) -> Callable[[Batch], Any]:
    """Import FILE.py under a name of its own (importlib, no package needed) and return its NAME, callable."""
    path, name = parse_spec(spec)
    resolved = path.resolve()
    module_name = "_transformer_parity_source_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"--source {spec}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up there
    try:
        with _on_sys_path(resolved.parent):
            module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(module_name, None)
        raise UsageError(f"--source {spec}: importing {path} raised {type(exc).__name__}: {_one_line(exc)}") from None
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                         and getattr(v, "__module__", None) == module_name)
        raise UsageError(f"--source {spec}: {path} defines no {name!r} (its functions and classes: "
                         f"{', '.join(defined[:8]) or 'none'})")
    if not callable(fn):
        raise UsageError(f"--source {spec}: {name} is a {type(fn).__name__}, not callable")
    return fn


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def from_file(spec: str) -> Source:
    """`--source FILE.py:NAME`: the user's function, called once on verify's inputs."""
    fn = load_callable(spec)

    def run(batch: Batch) -> list[SourceRun]:
        try:
            raw = fn({k: v.copy() for k, v in batch.items()})  # a source that writes into its inputs harms nothing
        except (Exception, SystemExit) as exc:
            raise UsageError(f"--source {spec}: calling it on batch {_shapes(batch)} raised {type(exc).__name__}: "
                             f"{_one_line(exc)}") from None
        return [SourceRun("source", raw)]

    return Source(spec, "file", run)


def _shapes(batch: Mapping[str, np.ndarray]) -> str:
    return "{" + ", ".join(f"{k}: {tuple(v.shape)}" for k, v in batch.items()) + "}"


# --- built-in sources -------------------------------------------------------------------------------------------------

KERASHUB_DIRS = KERASHUB_PRESETS[1:]


def builtin(loaded) -> tuple[Source | None, str | None]:
    """The built-in source for a loaded checkpoint (`formats.Loaded`), or `(None, why there is none)`."""
    fmt, path = loaded.format, Path(loaded.path)
    if fmt in HF_LAYOUTS:
        from transformer_parity.layouts import hf_dir

        legacy = hf_dir.legacy_weights(path)
        if legacy:
            return None, (f"transformers 5 cannot load {legacy}; judge it with --expect FILE.npz, the outputs of "
                          "the library that wrote it (docs/wild.md)")
        missing = _missing("torch", "transformers")
        return (None, f"{missing} not installed") if missing else (_hf_source(path, fmt, loaded.config), None)
    if fmt in KERASHUB_DIRS and path.is_dir():
        missing = _missing("keras_hub")
        return (None, f"{missing} not installed") if missing else (_kerashub_source(path, loaded.config), None)
    if fmt == "nn-transformer":
        missing = _missing("torch")
        if missing:
            return None, f"{missing} not installed"
        return _nn_source(path, loaded.config)
    return None, "no source given"


def combine(found: Sequence[Source]) -> Source:
    """Several libraries as one source (`verify HF_DIR KERASHUB_PRESET`): every run of each, judged alike and against
    each other, so the report names the first sublayer where the libraries part."""
    if len(found) == 1:
        return found[0]

    def run(batch: Batch) -> list[SourceRun]:
        return [r for s in found for r in s.run(batch)]

    return Source(" and ".join(s.name for s in found), "builtin", run, [n for s in found for n in s.notes])


def _missing(*packages: str) -> str | None:
    return next((p for p in packages if importlib.util.find_spec(p) is None), None)


def _hook_outputs(modules: Mapping[str, Any], record: dict[str, Any], transpose: bool = False) -> list[Any]:
    """Forward hooks that store each module's output (the first element of a tuple) under its canonical name. A
    module under several names (ALBERT's one layer, run once per layer) stores its k-th call under the k-th name."""
    names: dict[int, tuple[Any, list[str]]] = {}  # id(module) -> (module, its canonical names in order)
    for name, module in modules.items():
        names.setdefault(id(module), (module, []))[1].append(name)

    def hook(calls):
        def store(module, inputs, output):
            name = next(calls, None)
            if name is None:  # called more often than it has names: the first calls are the ones recorded
                return
            out = output[0] if isinstance(output, tuple) else output
            record[name] = out.transpose(0, 1) if transpose else out  # (len, B, D) -> (B, len, D)
        return store

    return [module.register_forward_hook(hook(iter(order))) for module, order in names.values()]


def _expand(hooks: Mapping[str, str], layers: Mapping[str, int]) -> dict[str, str]:
    """Canonical name -> module path for every layer (`{i}`), the encoder's and the decoder's counts."""
    out = {}
    for canonical, module in hooks.items():
        if "{i}" not in canonical:
            out[canonical] = module
            continue
        for i in range(layers[canonical.split(".")[0]]):
            out[canonical.format(i=i)] = module.format(i=i)
    return out


def _hf_source(path: Path, fmt: str, config: rn.TransformerConfig) -> Source:
    """transformers' own model class on the directory, in float32 and float64. Its attention mask marks the probe's
    padding, as a tokenizer's would: the probe pads with the port's pad id only (none when the port has no pad token;
    GPT-2 derives no padding from ids even when config.json names a pad_token_id)."""
    from transformer_parity.layouts import hf_dir

    hf_dir.read_config(path)  # the directory's config.json is checked as the port read it
    family = hf_layout(fmt)
    head = hf_tasks.head_for(family, config)  # a task class (BertForSequenceClassification, ...), else the family's
    cls_name = head.arch if head is not None else family.TRANSFORMERS_CLASSES[0 if config.output_projection else 1]
    pad = config.pad_id
    notes = [f"transformers {cls_name}: attention mask " + (f"0 where the probe pads (pad id {pad})"
                                                            if pad is not None else "all ones (no pad token)")]
    state: dict[str, Any] = {}

    def model32():
        if "model" not in state:
            import torch
            import transformers

            from transformers.utils import logging as hf_logging

            cls = getattr(transformers, cls_name)
            verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
            hf_logging.set_verbosity_error()  # its load report: the keys are checked below
            hf_logging.disable_progress_bar()  # its "Loading weights" bar: the verdict says what was loaded
            try:
                model, info = cls.from_pretrained(str(path), output_loading_info=True, dtype=torch.float32)
            finally:
                hf_logging.set_verbosity(verbosity)
                if bars:
                    hf_logging.enable_progress_bar()
            missing = [k for k in info.get("missing_keys", ()) if not (k.startswith("pooler.") and not config.pooler)]
            if missing or info.get("mismatched_keys"):
                raise UsageError(f"transformers cannot load {path} as {cls_name}: missing "
                                 f"{missing[:4] or 'nothing'}, mismatched {list(info.get('mismatched_keys', ()))[:4]}"
                                 "; pass --no-source to verify without it")
            state["model"] = model.eval()
        return state["model"]

    def run(batch: Batch) -> list[SourceRun]:
        import torch

        model = model32()
        model64 = copy.deepcopy(model).double()
        if fmt == "hf-marian":  # transformers builds the fixed sinusoids in float32, even for a float64 model
            with torch.no_grad():
                for stack in (model64.model.encoder, model64.model.decoder):
                    table = stack.embed_positions.weight
                    table.copy_(torch.as_tensor(rn.sinusoidal_positions(table.shape[0], table.shape[1],
                                                                        config.sinusoid_layout)))
        if config.positional == "rope" or config.norm == "rms":
            exact_float64(model64, config)
        return [SourceRun("transformers-f32", _hf_forward(model, fmt, config, batch, pad)),
                SourceRun("transformers-f64", _hf_forward(model64, fmt, config, batch, pad))]

    if fmt == "hf-marian":
        notes.append("transformers-f64: Marian's sinusoid tables, which transformers builds in float32, replaced by "
                     "the exact ones")
    if config.positional == "rope" or config.norm == "rms":
        notes.append("transformers-f64: the rotary angles and RMSNorms (and Gemma's embedding scale), which "
                     "transformers computes in float32 even in a float64 model, computed in float64; the float32 run "
                     "is transformers as it ships")
    return Source(f"transformers {cls_name}", "builtin", run, notes)


def exact_float64(model64, config: rn.TransformerConfig) -> None:
    """Make a float64 transformers model float64 throughout: its rotary embedding computes the angles in float32
    from float32 frequencies, its RMSNorms upcast to float32 only, and Gemma's embedding scale is a float32 constant,
    so the 'float64' model is float32 there. Each is replaced by the same formula in float64 (the frequencies by
    the reference's, `ops.rope_frequencies`, which the float32 run checks against transformers' own)."""
    import types

    import torch

    def rotary(self, x, position_ids, layer_type=None):
        inv_freq, scaling = rn.ops.rope_frequencies(config, int(position_ids.max()) + 1)
        freqs = position_ids[..., None].double() * torch.as_tensor(inv_freq)  # (B, T, r/2)
        angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * scaling).to(x.dtype), (angles.sin() * scaling).to(x.dtype)

    def rms(self, x):
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
        scale = self.weight + config.norm_weight_offset if config.norm_weight_offset else self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale

    for module in model64.modules():
        kind = type(module).__name__
        if kind.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(rotary, module)
        elif kind.endswith("RMSNorm"):
            module.forward = types.MethodType(rms, module)
        elif isinstance(getattr(module, "embed_scale", None), torch.Tensor):
            module.embed_scale = torch.tensor(float(module.scalar_embed_scale), dtype=torch.float64)


def _hf_forward(model, fmt: str, config: rn.TransformerConfig, batch: Batch, pad: int | None) -> dict[str, Any]:
    import torch

    def mask(ids):
        return None if pad is None else torch.as_tensor(ids != pad).long()

    src = torch.as_tensor(batch["src_ids"])
    kwargs: dict[str, Any] = {"input_ids": src, "attention_mask": mask(batch["src_ids"]), "output_hidden_states": True}
    if "src_type_ids" in batch:
        kwargs["token_type_ids"] = torch.as_tensor(batch["src_type_ids"])
    if "tgt_ids" in batch:
        kwargs.update(decoder_input_ids=torch.as_tensor(batch["tgt_ids"]),
                      decoder_attention_mask=mask(batch["tgt_ids"]))
    if config.classifier == "choice":  # a multiple-choice class takes (batch, choices, length): each row one choice
        kwargs.update({k: v[:, None] for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
    if config.choice_head:  # GPT2DoubleHeadsModel: the score read where ours reads it, the last real position
        real = src != pad if pad is not None else torch.ones_like(src, dtype=torch.bool)
        kwargs["mc_token_ids"] = (torch.arange(src.shape[1]) * real.long()).argmax(-1)
    base = model.base_model
    layers = {"encoder": config.num_encoder_layers, "decoder": config.num_decoder_layers}
    wanted = _expand(hf_layout(fmt).HOOKS, layers)
    if not config.final_norm:
        wanted.pop("decoder.final_norm", None)
    modules = {name: base.get_submodule(module) for name, module in wanted.items()}
    head = getattr(hf_layout(fmt), "HEAD_HOOK", None)  # BertForMaskedLM's dense -> activation -> LayerNorm, ...
    if head and config.head_transform:
        modules["head"] = model.get_submodule(head)
    if config.pooler and hf_tasks.has_head(config):  # a task class returns no pooler_output: its pooler is hooked
        modules["pooler"] = getattr(base, "pooler_activation", None) or base.pooler  # ALBERT's tanh is its own
    record: dict[str, Any] = {}
    handles = _hook_outputs(modules, record)
    try:
        with torch.no_grad():
            out = model(**kwargs)
    finally:
        for handle in handles:
            handle.remove()
    if config.is_decoder_only:
        record["decoder.embed"] = out.hidden_states[0]  # the last has ln_f applied: the layers are hooked instead
    elif config.is_encoder_only:
        record["encoder.embed"] = out.hidden_states[0]
    else:
        record["encoder.embed"] = out.encoder_hidden_states[0]
        record["decoder.embed"] = out.decoder_hidden_states[0]
    if config.pooler and getattr(out, "pooler_output", None) is not None:
        record["pooler"] = out.pooler_output
    if config.classifier == "span":  # question answering: start and end scores, stacked as the canonical head's
        final = torch.stack([out.start_logits, out.end_logits], dim=-1)
    elif config.next_sentence:  # Bert/AlbertForPreTraining; BertForNextSentencePrediction beside its hidden states
        pair = getattr(out, "seq_relationship_logits", None)
        final, record["next_sentence"] = ((out.prediction_logits, out.sop_logits if pair is None else pair)
                                          if config.output_projection else (out.hidden_states[-1], out.logits))
    elif config.classifier == "choice":  # (batch, choices) scores: our rows are the choices, one score each
        final = out.logits.reshape(-1, 1)
    elif config.choice_head:  # its (batch,) multiple-choice scores beside the LM logits
        final, record["choice"] = out.logits, out.mc_logits.reshape(-1, 1)
    else:
        final = out.logits if config.output_projection or config.classifier else out.last_hidden_state
    return {OUTPUT: final, **record}


def _kerashub_source(path: Path, config: rn.TransformerConfig) -> Source:
    """keras_hub's own class (the task of task.json, else the backbone) from the preset, in float32; its padding
    mask is an input, given as ids != the config's pad_id (all ones without a pad id)."""
    import json

    task_file, config_file = path / "task.json", path / "config.json"
    cls_name = json.loads((task_file if task_file.is_file() else config_file).read_text()).get("class_name")
    pad = config.pad_id
    notes = [f"keras_hub {cls_name}: run in float32 only (its float64 forward computes a few constants in float32, "
             "docs/kerashub.md); padding_mask " + (f"ids != pad_id={pad}" if pad is not None else "all ones")]

    def run(batch: Batch) -> list[SourceRun]:
        import tf_impl.startup  # noqa: F401 (TensorFlow's start-up notices kept off the terminal)
        import keras_hub

        model = getattr(keras_hub.models, cls_name).from_preset(str(path))
        ids = batch["src_ids"]

        def padding(x):
            return x != pad if pad is not None else np.ones(x.shape, bool)

        inputs = {"token_ids": ids, "padding_mask": padding(ids)}
        if "tgt_ids" in batch:  # an encoder-decoder (BART)
            inputs = {"encoder_token_ids": ids, "encoder_padding_mask": padding(ids),
                      "decoder_token_ids": batch["tgt_ids"], "decoder_padding_mask": padding(batch["tgt_ids"])}
        if "src_type_ids" in batch:
            inputs["segment_ids"] = batch["src_type_ids"]
        if cls_name.endswith("MaskedLM"):  # its head predicts mask_positions: every position, as the canonical head
            inputs["mask_positions"] = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32)
        layers = _kerashub_layers(model, config)
        out = model(inputs)
        if cls_name.endswith("Backbone") and config.output_projection and hasattr(model, "token_embedding"):
            out = model.token_embedding(out, reverse=True)  # a backbone saved alone with its untied head
        if layers:
            import keras

            backbone = getattr(model, "backbone", model)
            probe = keras.Model(backbone.inputs, {name: layer.output for name, layer in layers.items()})
            values = probe({k: v for k, v in inputs.items() if k in ("token_ids", "padding_mask")})
            return [SourceRun("keras_hub-f32", {OUTPUT: np.asarray(out),
                                                **{k: np.asarray(v) for k, v in values.items()}})]
        if isinstance(out, Mapping):  # BertBackbone, BartBackbone
            raw = {OUTPUT: np.asarray(out["decoder_sequence_output" if "tgt_ids" in batch else "sequence_output"])}
            if config.pooler:
                raw["pooler"] = np.asarray(out["pooled_output"])
        else:
            raw = {OUTPUT: np.asarray(out)}
        return [SourceRun("keras_hub-f32", raw)]

    return Source(f"keras_hub {cls_name}", "builtin", run, notes)


def _kerashub_layers(model, config: rn.TransformerConfig) -> dict[str, Any]:
    """Canonical name -> the KerasHub layer whose output it is, for a decoder-only backbone with `transformer_layers`
    (each decoder layer, and the final norm): what names the first layer where keras_hub and another library part."""
    backbone = getattr(model, "backbone", model)
    stack = getattr(backbone, "transformer_layers", None)
    if not config.is_decoder_only or not stack or len(stack) != config.num_decoder_layers:
        return {}
    layers = {f"decoder.layers.{i}": layer for i, layer in enumerate(stack)}
    if config.final_norm and getattr(backbone, "layer_norm", None) is not None:
        layers["decoder.final_norm"] = backbone.layer_norm
    return layers


# What the torch.nn model takes from the config (the file cannot tell num_heads, activation, norm placement, eps, the
# embedding scale or the pad id); every other field must keep its default, which torch.nn.Transformer computes.
NN_FIELDS = ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "num_encoder_layers", "num_decoder_layers",
             "d_ff", "max_len", "dropout", "activation", "norm_first", "final_norm", "layer_norm_eps", "positional",
             "sinusoid_layout", "scale_embedding", "bias", "tie_embeddings", "pad_id", "output_bias",
             "share_embeddings")
NN_SETTINGS = ("num_heads", "activation", "norm_first", "layer_norm_eps", "scale_embedding", "pad_id")


def _nn_source(path: Path, config: rn.TransformerConfig) -> tuple[Source | None, str | None]:
    """torch.nn.TransformerEncoder / TransformerDecoder, embeddings, positional table and output Linear, built under
    the file's own key names and loaded with `load_state_dict(strict=True)` from the file's own state dict; run
    sequence-first, as the tutorials are, in float32 and float64."""
    default = rn.TransformerConfig()
    odd = [f"{k}={v!r}" for k, v in config.to_dict().items() if k not in NN_FIELDS and v != getattr(default, k)]
    if odd:
        return None, f"torch.nn has no equivalent of {', '.join(odd)}, so there is no built-in source"
    settings = ", ".join(f"{k}={getattr(config, k)}" for k in NN_SETTINGS)
    notes = [f"the torch.nn source is built with the config's {settings} (a state dict cannot tell them): it checks "
             "the weight mapping and the math, not those settings"]
    state: dict[str, Any] = {}

    def run(batch: Batch) -> list[SourceRun]:
        import torch

        if "model" not in state:
            state["model"] = _nn_model(path, config)
        model32 = state["model"]
        model64 = copy.deepcopy(model32).double()
        if model64.parts.file_sinusoids:  # the file's table was computed in float32; the exact one in float64
            table = model64.parts.positions()
            exact = rn.sinusoidal_positions(table.numel() // config.d_model, config.d_model, config.sinusoid_layout)
            with torch.no_grad():
                table.copy_(torch.as_tensor(exact).reshape(table.shape))
        return [SourceRun("torch.nn-f32", model32.trace(batch)), SourceRun("torch.nn-f64", model64.trace(batch))]

    if config.positional == "sinusoidal":
        notes.append("torch.nn-f64: the file's sinusoid table (float32) replaced by the exact one, as the import does")
    return Source(f"torch.nn with the config's {settings}", "builtin", run, notes), None


@dataclass
class _NNParts:
    """The torch.nn modules of an nn-transformer file, wherever the file's names put them (not a Module, so the root
    registers each once, under its file name)."""

    encoder: Any
    decoder: Any
    src_embed: Any
    tgt_embed: Any
    generator: Any  # None: the output reuses the target (encoder-only: source) table
    holder: Any  # the module holding the positional table
    table_name: str
    file_sinusoids: bool  # the table is the file's fixed sinusoid buffer

    def positions(self):
        return getattr(self.holder, self.table_name)


def _attach(root, dotted: str, module) -> None:
    """Register `module` at `dotted` ("transformer.encoder") below `root`, with empty containers in between."""
    from torch import nn

    *path, last = dotted.split(".")
    node = root
    for part in path:
        if not hasattr(node, part):
            node.add_module(part, nn.Module())
        node = getattr(node, part)
    node.add_module(last, module)


def _nn_model(path: Path, config: rn.TransformerConfig):
    """The torch.nn model for an nn-transformer file (see `_nn_source`), loaded and in eval mode."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from torch_impl import checkpoints as tc

    from transformer_parity.layouts import nn_transformer as nnt

    file_state, _ = tc.unwrap_state_dict(tc.read_torch_file(path), path)
    arrays = {k: v.detach().float().numpy() for k, v in file_state.items()}
    layout, _ = nnt.detect_layout(arrays, path)
    activation = {"relu": "relu", "gelu": "gelu", "silu": F.silu,
                  "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[config.activation]
    d, eps = config.d_model, config.layer_norm_eps
    common = dict(d_model=d, nhead=config.num_heads, dim_feedforward=config.d_ff, dropout=0.0, activation=activation,
                  layer_norm_eps=eps, batch_first=False, norm_first=config.norm_first, bias=config.bias)

    def final_norm(prefix):
        return nn.LayerNorm(d, eps=eps, bias=config.bias) if f"{prefix}norm.weight" in arrays else None

    def stack(prefix, layer, count):
        kind = nn.TransformerEncoder if layer is nn.TransformerEncoderLayer else nn.TransformerDecoder
        extra = {"enable_nested_tensor": False} if kind is nn.TransformerEncoder else {}
        return kind(layer(**common), count, norm=final_norm(prefix), **extra)

    class SourceModel(nn.Module):
        def trace(self, batch: Batch) -> dict[str, Any]:
            return _nn_trace(self.parts, config, batch)

    root = SourceModel()
    encoder = stack(layout.encoder, nn.TransformerEncoderLayer, config.num_encoder_layers)
    decoder = None if layout.decoder is None else \
        stack(layout.decoder, nn.TransformerDecoderLayer, config.num_decoder_layers)
    for prefix, module in ((layout.encoder, encoder), (layout.decoder, decoder)):
        if module is None:
            continue
        if prefix:
            _attach(root, prefix.rstrip("."), module)
        else:  # a bare nn.TransformerEncoder's state dict: its children at the top
            for name, child in module.named_children():
                root.add_module(name, child)
    src_embed = nn.Embedding(*arrays[layout.src_embed].shape)
    _attach(root, layout.src_embed[: -len(".weight")], src_embed)
    tgt_embed = None
    if decoder is not None:
        tgt_embed = src_embed
        if layout.tgt_embed not in (None, layout.src_embed):
            tgt_embed = nn.Embedding(*arrays[layout.tgt_embed].shape)
            _attach(root, layout.tgt_embed[: -len(".weight")], tgt_embed)
    generator = None
    if layout.output_weight is not None:
        generator = nn.Linear(d, arrays[layout.output_weight].shape[0], bias=layout.output_bias is not None)
        _attach(root, layout.output_weight[: -len(".weight")], generator)
    if layout.positions is not None:  # the file's own table, sinusoidal or learned, in the file's shape
        holder_path, _, table_name = layout.positions.rpartition(".")
        if holder_path:
            _attach(root, holder_path, nn.Module())
        holder = root.get_submodule(holder_path) if holder_path else root
        holder.register_buffer(table_name, torch.zeros(arrays[layout.positions].shape))
    else:  # none in the file: the config's sinusoids, exactly
        holder, table_name = root, "config_sinusoids"
        table = rn.sinusoidal_positions(config.max_len, d, config.sinusoid_layout)
        root.register_buffer(table_name, torch.as_tensor(table, dtype=torch.float32), persistent=False)
    root.parts = _NNParts(encoder, decoder, src_embed, tgt_embed, generator, holder, table_name,
                          file_sinusoids=layout.positions is not None and config.positional == "sinusoidal")
    try:
        root.load_state_dict({k: v.float() for k, v in file_state.items()}, strict=True)
    except RuntimeError as exc:
        raise UsageError(f"{path}: the torch.nn source does not fit the file's state dict ({_one_line(exc)}); pass "
                         "--no-source to verify without it") from None
    return root.eval()


def _nn_trace(parts: _NNParts, config: rn.TransformerConfig, batch: Batch) -> dict[str, Any]:
    """The tutorials' forward, sequence-first, with the canonical sublayer outputs hooked."""
    import torch

    d, pad = config.d_model, config.pad_id

    def embed(ids, table):
        x = table(torch.as_tensor(ids).T)  # (B, len) -> (len, B, D)
        if config.scale_embedding:
            x = x * math.sqrt(d)
        positions = parts.positions().reshape(-1, 1, d)  # (L, D), (L, 1, D) or (1, L, D) -> (L, 1, D)
        return x + positions[: x.shape[0]]

    def padding(ids):
        return None if pad is None else torch.as_tensor(ids == pad)  # (B, len), True = ignored

    record: dict[str, Any] = {}
    handles = _hook_outputs(_nn_hooks(parts, config), record, transpose=True)
    try:
        with torch.no_grad():
            src = batch["src_ids"]
            x = embed(src, parts.src_embed)
            record["encoder.embed"] = x.transpose(0, 1)
            x = parts.encoder(x, src_key_padding_mask=padding(src))
            if parts.decoder is not None:
                tgt = batch["tgt_ids"]
                t = tgt.shape[1]
                causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)  # True = not allowed
                y = embed(tgt, parts.tgt_embed)
                record["decoder.embed"] = y.transpose(0, 1)
                x = parts.decoder(y, x, tgt_mask=causal, tgt_key_padding_mask=padding(tgt),
                                  memory_key_padding_mask=padding(src))
            if parts.generator is not None:
                logits = parts.generator(x)
            else:  # tied: the target (encoder-only: source) table
                logits = x @ (parts.tgt_embed or parts.src_embed).weight.T
    finally:
        for handle in handles:
            handle.remove()
    return {OUTPUT: logits.transpose(0, 1), **record}  # (len, B, V) -> (B, len, V)


def _nn_hooks(parts: _NNParts, config: rn.TransformerConfig) -> dict[str, Any]:
    """Canonical sublayer name -> torch.nn module whose output it is."""
    out = {}
    for stack, module in (("encoder", parts.encoder), ("decoder", parts.decoder)):
        if module is None:
            continue
        for i, layer in enumerate(module.layers):
            name = f"{stack}.layers.{i}"
            out[f"{name}.self_attn"] = layer.self_attn
            if stack == "decoder":
                out[f"{name}.cross_attn"] = layer.multihead_attn
            out[f"{name}.ffn"] = layer.linear2
            out[name] = layer
        if module.norm is not None and config.final_norm:
            out[f"{stack}.final_norm"] = module.norm
    return out


