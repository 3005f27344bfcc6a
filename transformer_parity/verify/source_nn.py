"""The built-in source for an `nn-transformer` checkpoint: a model around `torch.nn.Transformer` rebuilt from the
config (its stated settings named in the verdict) with the checkpoint's own state dict, in float32 and float64."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import reference_numpy as rn

from transformer_parity.errors import UsageError
from .source_contract import OUTPUT, Batch, Source, SourceRun, _hook_outputs, _one_line


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

    from transformer_parity.io import torch_files as tc

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
