"""The model as a sequence of blocks, each run on its own weights: what a layer-streamed verify loads, runs and frees
one at a time, so that a model larger than memory can still be judged.

A block is an embedding, one encoder or decoder layer, a stack's final norm, the pooler (and BERT's next-sentence
scores on it), the head transform, the output projection or a classifier. `blocks(config)` lists them in execution
order, `block_parameters(config, block)` names the canonical weights each one reads, and `run_block` runs one in
NumPy on a `state` that carries the hidden states from block to block. Running every block in turn records exactly
what `Transformer.trace` records (the names and, in float64, the values:
`parity_tests/test_streamed_verify.py`). The twins have the same function
(`torch_impl.blocks`, `tf_impl.blocks`).

`state` holds the inputs (`src_ids`, `tgt_ids` and `src_type_ids` where the model reads them) and what the blocks
pass on: `x`, the hidden states `(B, T, D)`; `memory`, the encoder's output, once the decoder starts (`begin`,
called before each block); `pooled`, the pooler's output, which a classifier may read. After the last block,
`final_record` adds what a bare backbone returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from . import model as m
from . import ops
from .config import TransformerConfig
from .schema import parameter_shapes, tied_output_embedding, token_embedding

KINDS = ("embed", "layer", "final_norm", "pooler", "next_sentence", "choice_head", "head", "output", "classifier")


@dataclass(frozen=True)
class Block:
    """One block: `kind` (see `KINDS`), the `stack` it belongs to (`encoder` or `decoder`; the head and output
    follow the last stack) and, for a layer, its `index`."""

    kind: str
    stack: str
    index: int = 0

    @property
    def name(self) -> str:
        """How progress and reports name it: `decoder.layers.3`, `encoder.embed`, `output`, ..."""
        if self.kind == "layer":
            return f"{self.stack}.layers.{self.index}"
        if self.kind in ("embed", "final_norm"):
            return f"{self.stack}.{self.kind}"
        return self.kind

    @property
    def side(self) -> str:
        """The input side the block's stack reads: `src` (the encoder) or `tgt` (the decoder)."""
        return "src" if self.stack == "encoder" else "tgt"


def blocks(config: TransformerConfig) -> list[Block]:
    """Every block of `config`, in execution order."""
    out: list[Block] = []
    for stack, depth in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        if depth == 0:
            continue
        out.append(Block("embed", stack))
        out += [Block("layer", stack, i) for i in range(depth)]
        if config.final_norm:
            out.append(Block("final_norm", stack))
        if stack == "encoder" and config.pooler:
            out.append(Block("pooler", stack))
            if config.next_sentence:
                out.append(Block("next_sentence", stack))
    last = out[-1].stack
    if config.choice_head:
        out.append(Block("choice_head", last))
    if config.head_transform:
        out.append(Block("head", last))
    if config.output_projection:
        out.append(Block("output", last))
    if config.classifier:
        out.append(Block("classifier", last))
    return out


def weight_layer(config: TransformerConfig, block: Block) -> int:
    """The layer whose weights a layer block reads: its own, or layer 0's under `shared_layers` (ALBERT)."""
    return 0 if config.shared_layers and block.stack == "encoder" else block.index


def block_parameters(config: TransformerConfig, block: Block) -> list[str]:
    """The canonical weights `block` reads (a shared token table or a tied output table included)."""
    shapes = parameter_shapes(config)
    side = block.side
    if block.kind == "embed":
        own = (f"{side}_embed.", f"{side}_pos.", f"{side}_embed_norm.", f"{side}_embed_proj.") + (
            ("src_type.",) if side == "src" else ())
        names = [n for n in shapes if n.startswith(own)]
        token = token_embedding(config, side)
        return names + ([token] if token not in names else [])
    if block.kind == "layer":
        prefix = f"{block.stack}.layers.{weight_layer(config, block)}."
        if block.stack == "encoder" and config.relative_terms:  # DeBERTa: the relative positions' shared table
            return [n for n in shapes if n.startswith((prefix, "encoder.rel_embed"))]
    elif block.kind == "final_norm":
        prefix = f"{block.stack}.final_norm."
    else:
        prefix = f"{block.kind}."
    names = [n for n in shapes if n.startswith(prefix)]
    if block.kind == "layer" and config.relative_bias_buckets:  # the stack's one table, read by every layer
        names.append(f"{block.stack}.relative_bias.embedding")
    if block.kind == "output" and config.tie_embeddings:
        names.append(tied_output_embedding(config))
    return names


def begin(block: Block, state: dict) -> None:
    """Before `block` runs (in every backend alike): the decoder's embedding keeps what the encoder left in `x` as
    the memory its layers attend to."""
    if block.kind == "embed" and block.stack == "decoder" and "x" in state:
        state["memory"] = state["x"]


def final_record(config: TransformerConfig, state: dict) -> dict[str, np.ndarray]:
    """What the model records after its last block: a bare backbone's final hidden states (`last_hidden_state`)."""
    return {} if config.output_projection or config.classifier else {"last_hidden_state": state["x"]}


def key_mask(config: TransformerConfig, state: Mapping[str, np.ndarray], side: str) -> np.ndarray:
    """`(B, T)` bool, True = real token, of one side's ids."""
    return ops.padding_mask(state[f"{side}_ids"], config.pad_id)


def run_block(config: TransformerConfig, block: Block, weights: Mapping[str, np.ndarray], dtype, state: dict
              ) -> dict[str, np.ndarray]:
    """Run `block` in NumPy at `dtype` on `weights` (its `block_parameters`), updating `state`; returns what it
    records, under the names `Transformer.trace` uses."""
    dtype = np.dtype(dtype)
    w = {name: np.asarray(value, dtype=dtype) for name, value in weights.items()}
    record: dict[str, np.ndarray] = {}
    if block.kind == "embed":
        side = block.side
        types = state.get("src_type_ids") if side == "src" else None
        state["x"] = m.Embedding(config, w, side)(state[f"{side}_ids"], type_ids=types,
                                                  mask=key_mask(config, state, side))
        record[f"{block.stack}.embed"] = state["x"]
    elif block.kind == "layer":
        own = weight_layer(config, block)
        if own != block.index:  # shared layers: layer 0's arrays under this layer's name
            first, this = f"{block.stack}.layers.{own}.", f"{block.stack}.layers.{block.index}."
            w = {this + name[len(first):]: value for name, value in w.items()}
        x = state["x"]
        bias = m.stack_bias(config, w, block.stack, x.shape[1], x.shape[1])
        if block.stack == "encoder":
            layer = m.EncoderLayer(config, w, block.name, block.index)
            mask = m.encoder_attention_masks(config, key_mask(config, state, "src"))[layer.kind]
            state["x"] = layer(x, mask, record, position_bias=bias)
        else:
            self_mask = ops.attention_mask(key_mask(config, state, "tgt"), x.shape[1], causal=True,
                                           window=config.layer_window(block.index))
            memory = state.get("memory")
            cross = None if memory is None else ops.attention_mask(key_mask(config, state, "src"), x.shape[1])
            state["x"] = m.DecoderLayer(config, w, block.name, block.index)(x, memory, self_mask, cross, record,
                                                                           position_bias=bias)
    elif block.kind == "final_norm":
        state["x"] = record[block.name] = m.LayerNorm(config, w, block.name)(state["x"])
    elif block.kind == "pooler":
        record["pooler"] = state["pooled"] = m.Pooler(config, w, "pooler")(state["x"])
    elif block.kind == "next_sentence":
        record["next_sentence"] = ops.linear(state["pooled"], w["next_sentence.kernel"], w["next_sentence.bias"])
    elif block.kind == "choice_head":
        x = state["x"]
        last = m.last_positions(key_mask(config, state, block.side))
        record["choice"] = ops.linear(x[np.arange(x.shape[0]), last], w["choice_head.kernel"], w["choice_head.bias"])
    elif block.kind == "classifier":
        mask = key_mask(config, state, block.side) if config.classifier_input != "eos" else \
            m.eos_mask(config, state["src_ids"], state["x"].shape[1])
        state["x"] = record["logits"] = m.Classifier(config, w, "classifier")(state["x"], mask, state.get("pooled"),
                                                                              record)
    elif block.kind == "head":
        state["x"] = record["head"] = m.HeadTransform(config, w)(state["x"])
    else:
        kernel = w[tied_output_embedding(config)].T if config.tie_embeddings else w["output.kernel"]
        logits = ops.linear(state["x"], kernel, w.get("output.bias"))
        if config.logit_divisor != 1.0:
            logits = logits / logits.dtype.type(config.logit_divisor)
        if config.final_logit_softcap is not None:
            logits = ops.soft_cap(logits, config.final_logit_softcap)
        state["x"] = record["logits"] = logits
    return record

