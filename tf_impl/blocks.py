"""One block of the model at a time (`reference_numpy.blocks`), in Keras: each block's layer is built alone, takes
that block's canonical weights through `weight_table` (the Keras variable paths below the model, less the stack's
own name) and runs on the hidden states the previous block left in `state` (NumPy arrays)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
from .startup import tf  # noqa: I001 (before keras: its import loads TensorFlow)
import keras  # noqa: E402

import reference_numpy as rn
from reference_numpy.blocks import Block, weight_layer
from reference_numpy.schema import tied_output_embedding

from .layers import relative_position_bias
from .model import (Classifier, DecoderLayer, Embedding, EncoderLayer, HeadTransform, OutputProjection, Pooler,
                    _zero_initializers, attention_mask, encoder_attention_masks, last_positions, norm_layer,
                    padding_mask, weight_table)


def _layer(config, block: Block, dtype: str) -> tuple[keras.layers.Layer, tuple, str]:
    """The block's Keras layer (not built), the shapes to build it with, and the part of the whole model's variable
    paths above it."""
    states = (None, None, config.d_model)
    if block.kind == "embed":
        return Embedding(config, block.side, dtype=dtype, name=f"{block.side}_embed"), ((None, None),), ""
    if block.kind == "layer":
        name = f"layers_{weight_layer(config, block)}"
        if block.stack == "encoder":
            return EncoderLayer(config, index=block.index, dtype=dtype, name=name), (states,), f"{block.stack}/"
        memory = states if config.has_encoder else None
        return DecoderLayer(config, index=block.index, dtype=dtype, name=name), (states, memory), f"{block.stack}/"
    if block.kind == "final_norm":
        return norm_layer(config, "final_norm", dtype), (states,), f"{block.stack}/"
    if block.kind in ("next_sentence", "choice_head"):
        width = 2 if block.kind == "next_sentence" else 1
        return keras.layers.Dense(width, dtype=dtype, name=block.kind), ((None, config.d_model),), ""
    layer = {"pooler": Pooler, "head": HeadTransform, "output": OutputProjection,
             "classifier": Classifier}[block.kind](config, dtype=dtype)
    return layer, ((None, None, config.embed_width if block.kind == "output" else config.d_model),), ""


def build_block(config: rn.TransformerConfig, block: Block, weights: Mapping[str, np.ndarray], dtype: str
                ) -> tuple[keras.layers.Layer, dict[str, np.ndarray]]:
    """The block's layer on its weights (strictly: every variable filled, none left over), and the whole model's
    variables the block reads but does not own (a tied output table, a shared token table), by path."""
    state = rn.mapping.write(rn.mapping.plan(list(weights), weight_table(config)), dict(weights), config.head_dim)
    layer, shapes, above = _layer(config, block, dtype)
    with _zero_initializers(layer):  # every weight is assigned below
        layer.build(*shapes)
    variables = {v.path: v for v in layer.weights}
    own = {path: value for path, value in state.items() if path.startswith(above) and path[len(above):] in variables}
    missing = sorted(set(variables) - {path[len(above):] for path in own})
    if missing:
        raise ValueError(f"block {block.name}: Keras variables without a weight {missing}")
    for path, value in own.items():
        variable = variables[path[len(above):]]
        variable.assign(np.asarray(value, dtype=variable.dtype))
    return layer, {path: value for path, value in state.items() if path not in own}


def _relative_table(config: rn.TransformerConfig, other: Mapping[str, np.ndarray], dtype: str):
    """DeBERTa's relative positions' table (normed) from the whole model's variables a layer reads, or None."""
    if config.relative_terms is None:
        return None
    table = other["encoder/rel_embed/embeddings"].astype(dtype)
    if config.relative_embed_norm:
        table = rn.ops.layer_norm(table, other["encoder/rel_embed_norm/gamma"].astype(dtype),
                                  other["encoder/rel_embed_norm/beta"].astype(dtype), config.layer_norm_eps)
    return tf.convert_to_tensor(table)


def run_block(config: rn.TransformerConfig, block: Block, weights: Mapping[str, np.ndarray], dtype, state: dict
              ) -> dict[str, np.ndarray]:
    """`reference_numpy.blocks.run_block` in Keras at `dtype` (float32 or float64)."""
    dtype = np.dtype(dtype).name
    layer, other = build_block(config, block, weights, dtype)
    record: dict = {}
    ids = {side: tf.convert_to_tensor(state[f"{side}_ids"]) for side in ("src", "tgt") if f"{side}_ids" in state}
    x = None if state.get("x") is None else tf.convert_to_tensor(state["x"])
    if block.kind == "embed":
        types = state.get("src_type_ids") if block.side == "src" else None
        shared = other.get("src_embed/token/embeddings") if config.share_embeddings and block.side == "tgt" else None
        x = record[f"{block.stack}.embed"] = layer(
            ids[block.side], type_ids=None if types is None else tf.convert_to_tensor(types),
            token_table=None if shared is None else tf.convert_to_tensor(shared.astype(dtype)),
            real=padding_mask(ids[block.side], config.pad_id))
    elif block.kind == "layer":
        t = tf.shape(x)[1]
        table = other.get(f"{block.stack}/relative_bias/embeddings")  # T5: the stack's table, read by every layer
        bias = None if table is None else relative_position_bias(table.astype(dtype), config,
                                                                 block.stack == "encoder", t, t)
        if block.stack == "encoder":
            mask = encoder_attention_masks(config, padding_mask(ids["src"], config.pad_id))[layer.kind]
            x, sublayers = layer(x, mask, relative=_relative_table(config, other, dtype), position_bias=bias)
        else:
            self_mask = attention_mask(padding_mask(ids["tgt"], config.pad_id), t, causal=True,
                                       window=config.layer_window(block.index))
            memory = state.get("memory")
            cross = None if memory is None else attention_mask(padding_mask(ids["src"], config.pad_id), t)
            x, sublayers = layer(x, None if memory is None else tf.convert_to_tensor(memory), self_mask, cross,
                                 position_bias=bias)
        record.update({f"{block.name}.{k}": v for k, v in sublayers.items()})
        record[block.name] = x
    elif block.kind == "pooler":
        record["pooler"] = layer(x)
        state["pooled"] = np.asarray(record["pooler"])
    elif block.kind == "next_sentence":
        record["next_sentence"] = layer(tf.convert_to_tensor(state["pooled"]))
    elif block.kind == "choice_head":
        last = last_positions(padding_mask(ids[block.side], config.pad_id))
        record["choice"] = layer(tf.gather(x, last, axis=1, batch_dims=1))
    elif block.kind == "classifier":
        pooled = None if state.get("pooled") is None else tf.convert_to_tensor(state["pooled"])
        reads = padding_mask(ids[block.side], config.pad_id) if config.classifier_input != "eos" else \
            tf.convert_to_tensor(rn.eos_mask(config, state["src_ids"], x.shape[1]))
        x, sublayers = layer(x, reads, pooled)
        record.update(sublayers)
        record["logits"] = x
    elif block.kind == "output":
        tied = None
        if config.tie_embeddings:
            side = tied_output_embedding(config).split("_", 1)[0]
            tied = tf.convert_to_tensor(other[f"{side}_embed/token/embeddings"].astype(dtype))
        x = record["logits"] = layer(x, tied)
    else:
        x = record[block.name] = layer(x)
    state["x"] = np.asarray(x)
    return {name: np.asarray(value) for name, value in record.items()}
