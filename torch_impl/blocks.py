"""One block of the model at a time (`reference_numpy.blocks`), in PyTorch: each block's modules are built on the
meta device, take that block's canonical weights through `weight_table` and run on the hidden states the previous
block left in `state` (NumPy arrays, which float32 and float64 tensors round-trip exactly)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import nn

import reference_numpy as rn
from reference_numpy.blocks import Block, weight_layer
from reference_numpy.schema import tied_output_embedding

from .layers import relative_position_bias
from .model import (Classifier, DecoderLayer, Embedding, EncoderLayer, HeadTransform, OutputProjection, Pooler,
                    attention_mask, encoder_attention_masks, last_positions, norm_layer, padding_mask,
                    weight_table)

# The module a block's weights sit under in the whole model's state dict (`weight_table`).
_PREFIX = {"embed": "{side}_embed.", "layer": "{stack}.layers.{index}.", "final_norm": "{stack}.final_norm.",
           "pooler": "pooler.", "head": "head.", "output": "output.", "next_sentence": "next_sentence.",
           "choice_head": "choice_head.",
           "classifier": "classifier."}


def _module(config, block: Block) -> nn.Module:
    if block.kind == "embed":
        return Embedding(config, block.side)
    if block.kind == "layer":
        name = f"{block.stack}.layers.{weight_layer(config, block)}"
        return EncoderLayer(config, name, block.index) if block.stack == "encoder" else \
            DecoderLayer(config, name, block.index)
    if block.kind == "final_norm":
        return norm_layer(config, config.d_model)
    if block.kind == "next_sentence":
        return nn.Linear(config.d_model, 2)
    if block.kind == "choice_head":
        return nn.Linear(config.d_model, 1)
    return {"pooler": Pooler, "head": HeadTransform, "output": OutputProjection,
            "classifier": Classifier}[block.kind](config)


def build_block(config: rn.TransformerConfig, block: Block, weights: Mapping[str, np.ndarray], dtype: torch.dtype
                ) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The block's module on its weights (strictly: every parameter filled, none left over), and the whole model's
    state entries the block reads but does not own (a tied output table, a shared token table)."""
    state = rn.mapping.write(rn.mapping.plan(list(weights), weight_table(config)), dict(weights), config.head_dim)
    prefix = _PREFIX[block.kind].format(side=block.side, stack=block.stack, index=weight_layer(config, block))
    numpy_dtype = np.dtype(str(dtype).removeprefix("torch."))  # cast in NumPy: torch takes no ml_dtypes bfloat16
    own = {k[len(prefix):]: torch.from_numpy(np.ascontiguousarray(v, dtype=numpy_dtype))
           for k, v in state.items() if k.startswith(prefix)}
    other = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=numpy_dtype)) for k, v in state.items()
             if not k.startswith(prefix)}
    with torch.device("meta"):
        module = _module(config, block).to(dtype)
    module = module.to_empty(device="cpu")
    module.load_state_dict(own, strict=True, assign=True)
    if isinstance(module, Embedding):
        module.reset_buffers()
    return module.eval(), other


def _relative_table(config: rn.TransformerConfig, other: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """DeBERTa's relative positions' table (normed) from the whole model's state entries a layer reads, or None."""
    if config.relative_terms is None:
        return None
    table = other["encoder.rel_embed.weight"]
    if not config.relative_embed_norm:
        return table
    return torch.nn.functional.layer_norm(table, table.shape[-1:], other.get("encoder.rel_embed_norm.weight"),
                                          other.get("encoder.rel_embed_norm.bias"), config.layer_norm_eps)


def run_block(config: rn.TransformerConfig, block: Block, weights: Mapping[str, np.ndarray], dtype, state: dict
              ) -> dict[str, np.ndarray]:
    """`reference_numpy.blocks.run_block` in PyTorch at `dtype` (float32 or float64)."""
    dtype = getattr(torch, np.dtype(dtype).name)
    module, other = build_block(config, block, weights, dtype)
    record: dict[str, torch.Tensor] = {}
    ids = {side: torch.as_tensor(state[f"{side}_ids"]) for side in ("src", "tgt") if f"{side}_ids" in state}
    x = None if state.get("x") is None else torch.from_numpy(state["x"])
    with torch.no_grad():
        if block.kind == "embed":
            types = state.get("src_type_ids") if block.side == "src" else None
            shared = other.get("src_embed.token.weight") if config.share_embeddings and block.side == "tgt" else None
            x = record[f"{block.stack}.embed"] = module(
                ids[block.side], type_ids=None if types is None else torch.as_tensor(types), token_table=shared,
                mask=padding_mask(ids[block.side], config.pad_id))
        elif block.kind == "layer":
            t = x.shape[1]
            table = other.get(f"{block.stack}.relative_bias.weight")  # T5: the stack's table, read by every layer
            bias = None if table is None else relative_position_bias(table, config, block.stack == "encoder", t, t)
            if block.stack == "encoder":
                mask = encoder_attention_masks(config, padding_mask(ids["src"], config.pad_id))[module.kind]
                x = module(x, mask, record, name=block.name, relative=_relative_table(config, other), position_bias=bias)
            else:
                self_mask = attention_mask(padding_mask(ids["tgt"], config.pad_id), t, causal=True,
                                           window=config.layer_window(block.index))
                memory = state.get("memory")
                cross = None if memory is None else attention_mask(padding_mask(ids["src"], config.pad_id), t)
                x = module(x, None if memory is None else torch.from_numpy(memory), self_mask, cross, record,
                           position_bias=bias)
        elif block.kind == "pooler":
            record["pooler"] = module(x)
            state["pooled"] = record["pooler"].numpy()
        elif block.kind == "next_sentence":
            record["next_sentence"] = module(torch.from_numpy(state["pooled"]))
        elif block.kind == "choice_head":
            last = last_positions(padding_mask(ids[block.side], config.pad_id))
            record["choice"] = module(x[torch.arange(x.shape[0]), last])
        elif block.kind == "classifier":
            pooled = None if state.get("pooled") is None else torch.from_numpy(state["pooled"])
            reads = padding_mask(ids[block.side], config.pad_id) if config.classifier_input != "eos" else \
                torch.as_tensor(rn.eos_mask(config, state["src_ids"], x.shape[1]))
            x = record["logits"] = module(x, reads, pooled, record)
        elif block.kind == "output":
            tied = None
            if config.tie_embeddings:
                side = tied_output_embedding(config).split("_", 1)[0]
                tied = other[f"{side}_embed.token.weight"]
            x = record["logits"] = module(x, tied)
        else:
            x = record[block.name] = module(x)
    state["x"] = x.numpy()
    return {name: value.numpy() for name, value in record.items()}
