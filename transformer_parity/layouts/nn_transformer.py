"""Models built around `torch.nn.Transformer` (or a lone `nn.TransformerEncoder`): the `nn-transformer` layout.

The state dict sits under any prefix, next to token embeddings, an output `Linear` and optionally a positional
table, such as PyTorch's translation tutorial (`Seq2SeqTransformer`: `transformer.*`, `src_tok_emb.embedding.weight`,
`tgt_tok_emb.embedding.weight`, `generator.*`, `positional_encoding.pos_embedding`) or its language-model tutorial
(`transformer_encoder.*`, `embedding.weight`, `linear.*`, `pos_encoder.pe`). Detection (`looks_like_nn_transformer`,
`detect_layout`) finds the parts; `nn_transformer_table(layout)` is the mapping (a table per layout, since the
prefixes are the model author's choice); beyond transposes, `nn.MultiheadAttention` packs q, k and v into one
`in_proj_weight` of shape `(3 * D, D)`: a `fused_qkv_t` entry.

What such weights cannot tell (heads, activation, norm placement, epsilon, embedding scale, padding id, and without
a positional table its kind and length: `UNSTATED`) must be stated: by `fields` (the CLI's `--set` / `--config`), by
a config this module stored in the file, or by a key of a Lightning checkpoint's `hyper_parameters` spelled exactly
as the field (`layouts.hparams`); otherwise the import is refused, naming every missing setting. A file this module
exports carries its config in the state dict's `_metadata`, which `load_state_dict` ignores, so it loads into the
tutorial's model as it is and re-imports losslessly. Reading the `.pt` file itself (`torch.load(weights_only=True)`)
is `transformer_parity.io.torch_files`; PyTorch is imported only when tensors are converted or a file is written.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

import reference_numpy as rn
from reference_numpy import TransformerConfig

from . import hparams as hp
from .table import classify_sinusoid, sinusoid_mismatch

if TYPE_CHECKING:
    import torch

NAME = "nn-transformer"

NN_METADATA_KEY = "transformer_parity_config"  # in state_dict._metadata[""] of files we export
TUTORIAL_MAX_LEN = 5000  # the tutorials' PositionalEncoding default `maxlen`

# What the weights of such a model cannot tell; each must be stated (dropout need not: it does not change the
# function in eval). Without a positional table, its kind and length (and the sinusoid layout) are unstated too.
UNSTATED = ("num_heads", "activation", "norm_first", "layer_norm_eps", "scale_embedding", "pad_id")
UNSTATED_WITHOUT_TABLE = ("positional", "sinusoid_layout", "max_len")
EXAMPLES = {"num_heads": 8, "activation": "relu", "norm_first": "false", "layer_norm_eps": 1e-5,
            "scale_embedding": "true", "pad_id": 1, "positional": "sinusoidal", "sinusoid_layout": "interleaved",
            "max_len": 5000, "tie_embeddings": "true"}

@dataclass(frozen=True)
class NNLayout:
    """Where the parts of a model built around `torch.nn.Transformer` sit in its state dict."""

    encoder: str  # prefix of the nn.TransformerEncoder, e.g. "transformer.encoder."
    decoder: str | None  # prefix of the nn.TransformerDecoder; None for an encoder-only model
    src_embed: str
    tgt_embed: str | None  # may equal src_embed (one shared table)
    output_weight: str | None  # None: the output reuses the target (encoder-only: source) embedding
    output_bias: str | None
    positions: str | None  # a positional table (sinusoidal buffer or learned), shape (L, D), (L, 1, D) or (1, L, D)


# PyTorch's "Language Translation with nn.Transformer and torchtext" tutorial (Seq2SeqTransformer).
TRANSLATION_TUTORIAL = NNLayout("transformer.encoder.", "transformer.decoder.", "src_tok_emb.embedding.weight",
                                "tgt_tok_emb.embedding.weight", "generator.weight", "generator.bias",
                                "positional_encoding.pos_embedding")
# PyTorch's "Language Modeling with nn.TransformerEncoder" tutorial (TransformerModel): encoder-only.
LANGUAGE_MODEL_TUTORIAL = NNLayout("transformer_encoder.", None, "embedding.weight", None, "linear.weight",
                                   "linear.bias", "pos_encoder.pe")

def _layer_entries(stack: str, prefix: str) -> list[tuple[str, str, str]]:
    canonical, external = f"{stack}.layers.{{i}}", f"{prefix}layers.{{i}}"
    entries = []
    for attn, module in (("self_attn", "self_attn"), ("cross_attn", "multihead_attn")):
        entries += [
            # nn.MultiheadAttention packs q, k and v into one in_proj_weight (3D, D) and in_proj_bias (3D,)
            (f"{canonical}.{attn}.{{qkv}}.kernel", f"{external}.{module}.in_proj_weight", "fused_qkv_t"),
            (f"{canonical}.{attn}.{{qkv}}.bias", f"{external}.{module}.in_proj_bias", "fused_qkv"),
            (f"{canonical}.{attn}.o.kernel", f"{external}.{module}.out_proj.weight", "transpose"),
            (f"{canonical}.{attn}.o.bias", f"{external}.{module}.out_proj.bias", "identity"),
        ]
    for linear in ("linear1", "linear2"):
        entries += [(f"{canonical}.ffn.{linear}.kernel", f"{external}.{linear}.weight", "transpose"),
                    (f"{canonical}.ffn.{linear}.bias", f"{external}.{linear}.bias", "identity")]
    for norm in ("norm1", "norm2", "norm3"):
        entries += [(f"{canonical}.{norm}.gamma", f"{external}.{norm}.weight", "identity"),
                    (f"{canonical}.{norm}.beta", f"{external}.{norm}.bias", "identity")]
    return entries + [(f"{stack}.final_norm.gamma", f"{prefix}norm.weight", "identity"),
                      (f"{stack}.final_norm.beta", f"{prefix}norm.bias", "identity")]


_POSITION_TRANSFORM = {2: "identity", 3: "seq_first"}  # a (L, D) or (L, 1, D) table; (1, L, D) is a `row`


def nn_transformer_table(layout: NNLayout, position_shape: tuple[int, ...] | None = None
                         ) -> list[tuple[str, str, str]]:
    """The mapping-language table between canonical weights and one layout's state dict (a table per layout,
    since the prefixes are the model author's choice)."""
    tgt = layout.tgt_embed or layout.src_embed
    table = [("src_embed.embedding", layout.src_embed, "identity"), ("tgt_embed.embedding", tgt, "identity")]
    if layout.positions is not None:
        shape = position_shape or (0, 0)
        transform = "row" if len(shape) == 3 and shape[0] == 1 else _POSITION_TRANSFORM[len(shape)]
        # one table shared by both sides
        table += [(f"{side}_pos.embedding", layout.positions, transform) for side in ("src", "tgt")]
    table += _layer_entries("encoder", layout.encoder)
    if layout.decoder is not None:
        table += _layer_entries("decoder", layout.decoder)
    if layout.output_weight is not None:
        table.append(("output.kernel", layout.output_weight, "transpose"))
    if layout.output_bias is not None:
        table.append(("output.bias", layout.output_bias, "identity"))
    return table


_STACK = re.compile(r"^(?P<root>.*?)layers\.0\.self_attn\.in_proj_weight$")
_SRC_HINT = re.compile(r"src|source|enc|input|inp", re.IGNORECASE)
_TGT_HINT = re.compile(r"tgt|trg|target|dec", re.IGNORECASE)
_POS_HINT = re.compile(r"pos|(^|[._])pe($|[._])", re.IGNORECASE)


def looks_like_nn_transformer(state: Mapping[str, Any]) -> bool:
    return isinstance(state, Mapping) and any(_STACK.match(str(k)) for k in state)


def detect_layout(state: Mapping[str, np.ndarray], path: str | os.PathLike = "<state dict>") -> tuple[NNLayout, list[str]]:
    """Find the encoder / decoder stacks, embeddings, output projection and positional table. Returns the layout
    and notes on any guess made."""
    notes: list[str] = []
    roots = sorted({m["root"] for k in state if (m := _STACK.match(k))})
    decoders = [r for r in roots if f"{r}layers.0.multihead_attn.in_proj_weight" in state]
    encoders = [r for r in roots if r not in decoders]
    if len(encoders) != 1 or len(decoders) > 1:
        raise ValueError(f"{path}: expected one nn.TransformerEncoder (and at most one nn.TransformerDecoder), found "
                         f"encoder stacks {encoders or 'none'} and decoder stacks {decoders or 'none'}")
    encoder, decoder = encoders[0], (decoders[0] if decoders else None)
    d_model = state[f"{encoder}layers.0.self_attn.in_proj_weight"].shape[1]
    rest = [k for k in state if not k.startswith(encoder) and not (decoder and k.startswith(decoder))]

    positions = [k for k in rest if _POS_HINT.search(k) and state[k].ndim in (2, 3) and state[k].shape[-1] == d_model
                 and (state[k].ndim == 2 or 1 in state[k].shape[:2])]
    embeds = [k for k in rest if k not in positions and "emb" in k.lower() and k.endswith("weight")
              and state[k].ndim == 2 and state[k].shape[1] == d_model]
    outputs = [k for k in rest if k not in positions + embeds and k.endswith("weight") and state[k].ndim == 2
               and state[k].shape[1] == d_model]
    if len(positions) > 1 or len(outputs) > 1:
        raise ValueError(f"{path}: cannot tell the model's parts apart: positional tables {positions}, output "
                         f"projections {outputs}")
    output = outputs[0] if outputs else None
    bias = output[: -len("weight")] + "bias" if output and output[: -len("weight")] + "bias" in state else None
    known = set(positions + embeds + ([output] if output else []) + ([bias] if bias else []))
    unknown = [k for k in rest if k not in known]
    if unknown:
        raise ValueError(f"{path}: entries outside the nn.Transformer that are neither an embedding, an output "
                         f"projection nor a positional table: {unknown[:6]}")
    if not embeds:
        raise ValueError(f"{path}: no token embedding found (a 2-D '...emb...weight' of width d_model={d_model})")
    if decoder is None:
        if len(embeds) != 1:
            raise ValueError(f"{path}: an encoder-only model needs one token embedding, found {embeds}")
        src, tgt = embeds[0], None
    elif len(embeds) == 1:
        src = tgt = embeds[0]
        notes.append(f"one embedding {src} serves source and target")
    elif len(embeds) == 2:
        src_hint = [k for k in embeds if _SRC_HINT.search(k) and not _TGT_HINT.search(k)]
        tgt_hint = [k for k in embeds if _TGT_HINT.search(k) and not _SRC_HINT.search(k)]
        if len(src_hint) == 1 and len(tgt_hint) == 1 and src_hint != tgt_hint:
            src, tgt = src_hint[0], tgt_hint[0]
        else:
            src, tgt = embeds
            notes.append(f"took {src} as the source and {tgt} as the target embedding (state-dict order)")
    else:
        raise ValueError(f"{path}: more than two token embeddings: {embeds}")
    layout = NNLayout(encoder, decoder, src, tgt, output, bias, positions[0] if positions else None)
    return layout, notes


def _unstated(layout: NNLayout, inferred: Mapping[str, Any], fields: Mapping[str, Any]) -> list[str]:
    """The settings that neither the weights (`inferred`) nor the user (`fields`) give."""
    names = list(UNSTATED)
    if layout.positions is None:
        names += [n for n in UNSTATED_WITHOUT_TABLE
                  if not (n == "sinusoid_layout" and fields.get("positional") == "learned")]
    if layout.output_weight is None and "output_projection" not in fields:
        names.append("tie_embeddings")  # no output Linear: logits through the embedding, or none at all
    return [n for n in names if n not in inferred and n not in fields]


def _count_layers(state: Mapping[str, Any], prefix: str | None) -> int:
    if prefix is None:
        return 0
    found = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"layers\.(\d+)\.", k))}
    if found != set(range(len(found))):
        raise ValueError(f"layers under {prefix!r} are not numbered 0..n-1: {sorted(found)}")
    return len(found)


def _classify_positions(table: np.ndarray) -> str | None:
    """'interleaved' or 'concatenated' if `(L, D)` is that sinusoid table within float32 rounding (the tutorials
    build it in float32), else None (a learned table)."""
    return classify_sinusoid(table)


def import_nn_transformer(state: Mapping[str, Any], path: str | os.PathLike = "<state dict>",
                          fields: Mapping[str, Any] | None = None,
                          stored: TransformerConfig | None = None, consume: bool = False,
                          hparams: Mapping[str, Any] | None = None
                          ) -> tuple[TransformerConfig, dict[str, np.ndarray], list[str]]:
    """Canonical `(config, weights, notes)` from an nn.Transformer-based state dict (tensors or arrays).

    The config is, in increasing precedence: a config this module stored in the file (`stored`), the keys of a
    Lightning checkpoint's `hparams` named exactly as an unstated field, what the weights show (sizes, depths,
    biases, final norms, output layer, positional table), and `fields` given by the user. A setting the weights
    cannot tell (`UNSTATED`) that none of them gives is refused: one `ValueError` naming all of them.
    `consume=True` empties `state` (a dict) as it goes.
    """
    import torch

    fields = dict(fields or {})
    arrays = {}
    for k in list(state):
        v = state.pop(k) if consume else state[k]
        arrays[k] = (v.detach().cpu().float().numpy() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16
                     else v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
    layout, notes = detect_layout(arrays, path)
    enc, dec = layout.encoder, layout.decoder
    d_model = arrays[f"{enc}layers.0.self_attn.in_proj_weight"].shape[1]
    inferred: dict[str, Any] = {
        "d_model": d_model,
        "d_ff": arrays[f"{enc}layers.0.linear1.weight"].shape[0],
        "num_encoder_layers": _count_layers(arrays, enc),
        "num_decoder_layers": _count_layers(arrays, dec),
        "src_vocab_size": arrays[layout.src_embed].shape[0],
        "final_norm": f"{enc}norm.weight" in arrays,
        "bias": f"{enc}layers.0.self_attn.in_proj_bias" in arrays,
    }
    if layout.output_weight is not None:
        inferred["tie_embeddings"] = False
    if dec is not None and (f"{dec}norm.weight" in arrays) != inferred["final_norm"]:
        raise ValueError(f"{path}: the encoder and decoder disagree on a final LayerNorm ({enc}norm, {dec}norm)")
    head = layout.output_weight or (layout.tgt_embed if dec else layout.src_embed)
    inferred["tgt_vocab_size"] = arrays[head].shape[0]
    if layout.positions is not None:
        table = arrays[layout.positions].reshape(-1, d_model)  # (L, 1, D) / (1, L, D) -> (L, D)
        if stored is None:  # our exports pad the table to the tutorials' 5000 rows; the stored max_len is the truth
            inferred["max_len"] = table.shape[0]
        kind = _classify_positions(table)
        inferred.update(positional="sinusoidal", sinusoid_layout=kind) if kind else inferred.update(positional="learned")
    base = stored.to_dict() if stored is not None else rn.TransformerConfig().to_dict()
    if stored is None:
        unstated = _unstated(layout, inferred, fields)
        found, ambiguous = hp.by_field_name(hparams, unstated)
        for name, (value, key) in found.items():
            notes.append(f"{name}={value!r} read from the checkpoint's hyper_parameters[{key!r}]")
            base[name] = value
        missing = [name for name in unstated if name not in found]
        if missing:
            example = f"{missing[0]}={EXAMPLES[missing[0]]}"
            also = f"; hyper_parameters name some ambiguously: {', '.join(ambiguous)}" if ambiguous else ""
            raise hp.Unstated(f"{Path(path).name} (nn-transformer) does not say {', '.join(missing)}: give them with "
                              f"--set FIELD=VALUE (e.g. --set {example}) or --config FILE.json (the values of the "
                              f"model's constructor; pad_id: its padding token, or none), or --source FILE.py:NAME "
                              f"(the model's code settles them){also}", missing)
    config_dict = {**base, **inferred, **fields}
    try:
        config = TransformerConfig.from_dict(config_dict)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    for name in ("num_encoder_layers", "num_decoder_layers"):  # before a parameter table of the config's size exists
        if getattr(config, name) != inferred[name]:
            raise ValueError(f"{path}: config field {name}={getattr(config, name)} (--set/--config) does not match "
                             f"the weights, which hold {inferred[name]} {name.split('_')[1]} layers; refusing before "
                             "allocating anything")

    if not config.bias:  # nn.Transformer(bias=False) drops the LayerNorm biases too: canonical beta = 0
        for key in [k for k in arrays if re.search(r"(^|\.)norm\d?\.weight$", k)]:
            arrays.setdefault(key[: -len("weight")] + "bias", np.zeros_like(arrays[key]))
    elif layout.output_bias is None:
        notes.append("the output projection has no bias; imported as a zero bias")
        arrays["<zero output bias>"] = np.zeros(inferred["tgt_vocab_size"], arrays[head].dtype)
        layout = NNLayout(**{**layout.__dict__, "output_bias": "<zero output bias>"})
    if layout.positions is not None and config.positional == "sinusoidal":
        problem = sinusoid_mismatch(arrays[layout.positions].reshape(-1, d_model), config.sinusoid_layout)
        if problem:  # a learned table, or the other layout: dropping it would change the model
            raise ValueError(f"{path}: {layout.positions} is not the sinusoid table of positional=sinusoidal, "
                             f"sinusoid_layout={config.sinusoid_layout}: {problem}")
        arrays.pop(layout.positions)  # a fixed table: recomputed exactly, not a parameter
        layout = NNLayout(**{**layout.__dict__, "positions": None})
    shape = arrays[layout.positions].shape if layout.positions else None
    table = nn_transformer_table(layout, tuple(shape) if shape is not None else None)
    try:
        weights = rn.from_framework_state(config, arrays, table, consume=True, shared=True)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return config, weights, notes


def export_nn_transformer(config: TransformerConfig, weights: Mapping[str, np.ndarray],
                          layout: NNLayout | None = None, consume: bool = False) -> "OrderedDict[str, torch.Tensor]":
    """Canonical weights -> a state dict that `load_state_dict(strict=True)` accepts for the tutorial's model
    (`TRANSLATION_TUTORIAL`, or `LANGUAGE_MODEL_TUTORIAL` for an encoder-only config), config in `_metadata`."""
    import torch

    if layout is None:
        layout = TRANSLATION_TUTORIAL if config.is_encoder_decoder else LANGUAGE_MODEL_TUTORIAL
    from . import canonical_only

    problems = canonical_only(config)
    if config.is_encoder_decoder and not config.final_norm:
        problems.append("nn.Transformer always ends each stack with a LayerNorm, but final_norm=False")
    if config.positional != "sinusoidal":
        problems.append("the tutorial layout has one fixed sinusoidal table, but positional=learned")
    if not config.bias and any(np.any(weights[k]) for k in weights if k.endswith(".beta")):
        problems.append("nn.Transformer(bias=False) has no LayerNorm biases, but the betas are not all zero")
    if problems:
        raise ValueError("cannot export to the torch.nn.Transformer layout: " + "; ".join(problems))
    out_layout = layout if config.bias else NNLayout(**{**layout.__dict__, "output_bias": None})
    if config.tie_embeddings:
        weights = {**weights, "output.kernel": np.asarray(weights[rn.schema.tied_output_embedding(config)]).T}
        tied = config.replace(tie_embeddings=False)
    else:
        tied = config
    table = nn_transformer_table(out_layout)
    dtype = rn.weights_dtype(weights)
    state = rn.to_framework_state(tied, weights, [e for e in table if "_pos." not in e[0]], consume=consume)
    if not config.bias:
        state = {k: v for k, v in state.items() if not re.search(r"(^|\.)norm\d?\.bias$", k)}
    rows = max(config.max_len, TUTORIAL_MAX_LEN)
    positions = rn.sinusoidal_positions(rows, config.d_model, config.sinusoid_layout).astype(dtype)
    result: OrderedDict[str, torch.Tensor] = OrderedDict(
        (k, torch.from_numpy(np.ascontiguousarray(v))) for k, v in state.items())
    result[layout.positions] = torch.from_numpy(positions[:, None, :].copy())  # (L, D) -> (L, 1, D), as the tutorials
    result._metadata = OrderedDict({"": {"version": 1, NN_METADATA_KEY: config.to_json()}})  # type: ignore[attr-defined]
    return result


def stored_nn_config(state: Any) -> TransformerConfig | None:
    """The config a file exported by this module carries in `_metadata`, if any."""
    meta = getattr(state, "_metadata", None)
    text = meta.get("", {}).get(NN_METADATA_KEY) if isinstance(meta, Mapping) else None
    return TransformerConfig.from_json(text) if isinstance(text, str) else None


def save_nn_transformer(path: str | os.PathLike, config: TransformerConfig, weights: Mapping[str, np.ndarray],
                        consume: bool = False) -> None:
    """Write the tutorial-layout state dict to `path` (the caller makes it atomic)."""
    import torch

    torch.save(export_nn_transformer(config, weights, consume=consume), path)
