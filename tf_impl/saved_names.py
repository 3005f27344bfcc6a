"""The names Keras gives `tf_impl.Transformer`'s variables in a `.weights.h5`, and Keras's own `MultiHeadAttention`
layout, as tables in the mapping language (`reference_numpy.mapping`). Names only: the file is written and read by
`transformer_parity.formats.keras_file`, without TensorFlow.

Keras derives a `.weights.h5`'s layout from the model's structure. Two quirks the table encodes:

- layers reached through a Python list are named by class, not by attribute: the i-th encoder layer is
  `encoder/layers/encoder_layer_{i}` (the first one without `_0`), and layers reached only through the model's
  own `layers` list are `layers/embedding` (source), `layers/embedding_1` (target), `layers/output_projection`;
- a layer's variables are numbered in creation order (`vars/0` kernel, `vars/1` bias; a tied output layer's bias
  is `vars/0`).
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

import numpy as np

import reference_numpy as rn
from reference_numpy import TransformerConfig, mapping


_LIST_ITEM = re.compile(r"(encoder_layer|decoder_layer|feed_forward)_(\d+)/")
_LAYER_ITEM = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.")
_EXPERT_ITEM = re.compile(r"\.experts\.(\d+)\.")  # a mixture's experts: a list of FeedForward layers


def weights_h5_table(config: TransformerConfig) -> list[tuple[str, str, str]]:
    """canonical name -> dataset path in the `.weights.h5` of a `tf_impl.Transformer` with this config, in the
    mapping language (`reference_numpy.mapping`). A layer's variables are `vars/0`, `vars/1`, ... in creation order
    (kernel before bias, gamma before beta); the paths use `{stack}_layer_{i}` for every list item, and
    `keras_path` drops the `_0` as Keras does."""
    src, tgt = _embedding_paths(config)
    groups = {"src_embed": f"{src}/token", "tgt_embed": f"{tgt}/token", "src_pos": f"{src}/position",
              "tgt_pos": f"{tgt}/position", "src_type": f"{src}/segment", "src_embed_norm": f"{src}/norm",
              "tgt_embed_norm": f"{tgt}/norm", "pooler": "layers/pooler/dense", "output": "layers/output_projection",
              "src_embed_proj": f"{src}/proj"}
    variables: dict[str, list[str]] = {}  # Keras layer path -> its canonical variables, in creation order
    for name in rn.parameter_shapes(config):
        module, leaf = name.rsplit(".", 1)
        if name in ("src_embed.bias", "tgt_embed.bias"):
            group = src if name.startswith("src") else tgt  # the Embedding layer's own variable
        else:
            module = _EXPERT_ITEM.sub(r".experts.feed_forward_\1.", module)
            group = groups.get(module) or _LAYER_ITEM.sub(r"\1/layers/\1_layer_\2/", module).replace(".", "/")
        variables.setdefault(group, []).append(name)
    return [(name, f"{group}/vars/{k}", "identity") for group, names in variables.items()
            for k, name in enumerate(names)]


def _embedding_paths(config: TransformerConfig) -> tuple[str, str]:
    """Where Keras files the source and target Embedding layers: numbered in creation order, so a decoder-only
    model's one embedding (the target's) is `layers/embedding`."""
    return "layers/embedding", "layers/embedding_1" if config.has_encoder else "layers/embedding"


def keras_path(table_path: str) -> str:
    """`encoder/layers/encoder_layer_0/...` -> `encoder/layers/encoder_layer/...` (Keras leaves the first unnumbered)."""
    return _LIST_ITEM.sub(lambda m: f"{m[1]}/" if m[2] == "0" else m[0], table_path)


def table_path(keras_path_: str) -> str:
    """The inverse of `keras_path`."""
    return re.sub(r"(encoder_layer|decoder_layer|feed_forward)/", r"\1_0/", keras_path_)


def layer_groups(config: TransformerConfig) -> dict[str, str]:
    """Every layer group Keras writes (group path -> layer name), variables or not: the file's skeleton."""
    groups = {"": "transformer"}

    def embed(path: str, name: str, side: str) -> None:
        groups.update({path: name, f"{path}/dropout": "dropout"})
        if side == "src" or not config.share_embeddings:
            groups[f"{path}/token"] = "token"
        if config.positional == "learned":
            groups[f"{path}/position"] = "position"
        if side == "src" and config.type_vocab_size:
            groups[f"{path}/segment"] = "segment"
        if config.embed_norm:
            groups[f"{path}/norm"] = "norm"
        if config.embedding_size is not None:
            groups[f"{path}/proj"] = "proj"

    def attention(path: str, name: str, relative: bool = False) -> None:
        groups[path] = name
        parts = ("q", "k", "v", "o") + (("q_norm", "k_norm") if config.qk_norm else ())
        if relative and config.relative_terms and not config.relative_shares_qk:  # DeBERTa's position projections
            parts += tuple(proj for term, proj in (("c2p", "pos_k"), ("p2c", "pos_q")) if term in config.relative_terms)
        groups.update({f"{path}/{p}": p for p in parts})

    src, tgt = _embedding_paths(config)
    if config.has_encoder:
        embed(src, "src_embed", "src")
    if config.has_decoder:
        embed(tgt, "tgt_embed", "tgt")
    if config.pooler:
        groups.update({"layers/pooler": "pooler", "layers/pooler/dense": "dense"})
    if config.head_transform:
        groups.update({"head": "head", "head/dense": "dense", "head/norm": "norm"})
    if config.output_projection:
        groups["layers/output_projection"] = "output"
    for stack, depth in (("encoder", config.encoder_weight_layers), ("decoder", config.num_decoder_layers)):
        if depth == 0:
            continue
        groups[stack] = stack
        if config.final_norm:
            groups[f"{stack}/final_norm"] = "final_norm"
        if stack == "encoder" and config.relative_terms:  # DeBERTa's relative positions' table and its norm
            groups[f"{stack}/rel_embed"] = "rel_embed"
            if config.relative_embed_norm:
                groups[f"{stack}/rel_embed_norm"] = "rel_embed_norm"
        if config.relative_bias_buckets:  # T5: the stack's relative position bias table
            groups[f"{stack}/relative_bias"] = "relative_bias"
        for i in range(depth):
            path = keras_path(f"{stack}/layers/{stack}_layer_{i}/")[:-1]
            groups.update({path: f"layers_{i}", f"{path}/dropout": "dropout"})
            groups.update(_ffn_groups(config, f"{path}/ffn", "ffn", stack == "decoder" and config.layer_experts(i)))
            posts = ("post_attn_norm", "post_ffn_norm") + (
                ("post_cross_attn_norm",) if stack == "decoder" and config.has_encoder else ())
            if config.post_norms:
                groups.update({f"{path}/{post}": post for post in posts})
            attention(f"{path}/self_attn", "self_attn", relative=stack == "encoder")
            norms = ("norm1", "norm2") if stack == "encoder" or config.has_encoder else ("norm1", "norm3")
            if stack == "decoder" and config.has_encoder:
                norms += ("norm3",)
                attention(f"{path}/cross_attn", "cross_attn")
            if stack == "decoder" and config.ffn_shares_norm:  # the feed-forward reads norm1 (parallel_residual)
                norms = tuple(n for n in norms if n != "norm3")
            if stack == "encoder" and i == 0 and not config.first_attn_norm:  # ModernBERT: no attention norm
                norms = tuple(n for n in norms if n != "norm1")
            if config.pre_norms:  # OLMo 2 has none
                groups.update({f"{path}/{norm}": norm for norm in norms})
    return groups


def _ffn_groups(config: TransformerConfig, path: str, name: str, experts: bool = False) -> dict[str, str]:
    """The layer groups of a FeedForward at `path`, or of a mixture of experts (its router, each expert a
    FeedForward in a list, named by class: `experts/feed_forward`, `experts/feed_forward_1`, ...; its shared
    expert and gate)."""
    if not experts:
        return {path: name, f"{path}/dropout": "dropout", f"{path}/linear1": "linear1", f"{path}/linear2": "linear2",
                **({f"{path}/gate": "gate"} if config.ffn_gated else {})}
    groups = {path: name, f"{path}/router": "router"}
    for e in range(config.num_experts):
        groups.update(_ffn_groups(config, keras_path(f"{path}/experts/feed_forward_{e}/")[:-1], f"experts_{e}"))
    if config.shared_expert_d_ff:
        groups.update({**_ffn_groups(config, f"{path}/shared", "shared"), f"{path}/shared_gate": "shared_gate"})
    return groups


# --- keras.layers.MultiHeadAttention <-> a canonical attention block ------------------------------------------------

KERAS_MHA_VARIABLES = ("query/kernel", "query/bias", "key/kernel", "key/bias", "value/kernel", "value/bias",
                       "attention_output/kernel", "attention_output/bias")  # layer.get_weights() order


# Canonical block names -> Keras MultiHeadAttention variable names, with the per-head reshapes Keras's einsum kernels
# need: q/k/v kernels `(D, H*dk)` <-> `(D, H, dk)`, their biases `(H*dk,)` <-> `(H, dk)`, the output kernel
# `(H*dk, D)` <-> `(H, dk, D)`. Canonical features are head-major (`h * dk + j`), exactly how a C-order reshape
# splits them.
KERAS_MHA_TABLE = [
    ("{qkv}.kernel", "{qkv}/kernel", "heads_out"),
    ("{qkv}.bias", "{qkv}/bias", "heads_out"),
    ("o.kernel", "o/kernel", "heads_in"),
    ("o.bias", "o/bias", "identity"),
]
_KERAS_NAMES = {"q": "query", "k": "key", "v": "value", "o": "attention_output"}


def _block_names(bias: bool) -> list[str]:
    return [f"{p}.{leaf}" for p in "qkvo" for leaf in (("kernel", "bias") if bias else ("kernel",))]


def _keras_name(table_name: str) -> str:
    proj, leaf = table_name.split("/")
    return f"{_KERAS_NAMES[proj]}/{leaf}"


def canonical_to_keras_mha(block: Mapping[str, np.ndarray], num_heads: int, prefix: str = "") -> list[np.ndarray]:
    """A canonical attention block (`{prefix}q.kernel`, ... `{prefix}o.bias`) -> the list
    `keras.layers.MultiHeadAttention(num_heads, key_dim=D // num_heads).set_weights()` takes."""
    bias = f"{prefix}q.bias" in block
    names = _block_names(bias)
    missing = [prefix + n for n in names if prefix + n not in block]
    if missing:
        raise ValueError(f"attention block is missing {missing}")
    d = np.shape(block[f"{prefix}q.kernel"])[0]
    if d % num_heads:
        raise ValueError(f"d_model={d} is not divisible by num_heads={num_heads}")
    weights = {}
    for name in names:
        weights[name] = np.asarray(block[prefix + name])
        expected = (d,) if name.endswith("bias") else (d, d)
        if weights[name].shape != expected:
            raise ValueError(f"{prefix}{name} has shape {weights[name].shape}, expected {expected}")
    out = mapping.write(mapping.plan(names, KERAS_MHA_TABLE), weights, head_dim=d // num_heads)
    out = {_keras_name(k): v for k, v in out.items()}
    return [out[k] for k in KERAS_MHA_VARIABLES if k in out]


def keras_mha_to_canonical(values: Sequence[np.ndarray], num_heads: int, prefix: str = "") -> dict[str, np.ndarray]:
    """The inverse: `keras.layers.MultiHeadAttention.get_weights()` (with `key_dim = value_dim = D // num_heads`
    and the default output width) -> canonical `{prefix}q.kernel`, ..., `{prefix}o.bias`."""
    if len(values) not in (4, 8):
        raise ValueError(f"expected the 8 (or, without biases, 4) arrays of MultiHeadAttention.get_weights(), "
                         f"received {len(values)}")
    bias = len(values) == 8
    keras_names = [k for k in KERAS_MHA_VARIABLES if bias or k.endswith("kernel")]
    by_name = dict(zip(keras_names, (np.asarray(v) for v in values)))
    q = by_name["query/kernel"]
    if q.ndim != 3 or q.shape[1] != num_heads or q.shape[0] != q.shape[1] * q.shape[2]:
        raise ValueError(f"query kernel has shape {q.shape}; expected (D, num_heads={num_heads}, D // num_heads)")
    d = q.shape[0]
    names = _block_names(bias)
    plan = mapping.plan(names, KERAS_MHA_TABLE)
    shapes = {name: (d,) if name.endswith("bias") else (d, d) for name in names}
    state = {table_name: by_name[_keras_name(table_name)] for table_name, _, _ in plan.values()}
    try:
        weights = mapping.read(plan, state, shapes, head_dim=d // num_heads)
    except mapping.ShapeMismatch as exc:
        raise ValueError(f"MultiHeadAttention weights that do not map to a canonical block of d_model={d}: "
                         + "; ".join(exc.problems)) from None
    return {prefix + name: value for name, value in weights.items()}
