"""The canonical weight schema: every parameter's name and shape, seeded initialisation, validation, and canonical
weights to and from a framework's own names through a table in the mapping language (`reference_numpy.mapping`).

Layout rules (see docs/contract.md, "Canonical weights"):
- names are dotted paths, e.g. `encoder.layers.0.self_attn.q.kernel`;
- a projection is `x @ kernel + bias` with `kernel` of shape `(in_features, out_features)`;
- attention projections keep heads in the output features, head-major: feature `h * head_dim + j`;
- LayerNorm is `gamma`/`beta`; an embedding table is `embedding`, shape `(vocab_or_positions, d_model)`.
"""

from __future__ import annotations

import zlib
from typing import Mapping, Sequence

import numpy as np

from . import mapping
from .config import TransformerConfig
from .mapping import preview

ATTENTION_PROJECTIONS = ("q", "k", "v", "o")


def _linear(prefix: str, d_in: int, d_out: int, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes = {f"{prefix}.kernel": (d_in, d_out)}
    if bias:
        shapes[f"{prefix}.bias"] = (d_out,)
    return shapes


def _attention(prefix: str, config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """q: `(d_model, num_heads * head_dim)`; k, v: `(d_model, kv_heads * head_dim)` (narrower under grouped-query
    attention); o: `(num_heads * head_dim, d_model)`; the sinks `(num_heads,)` under `attention_sinks`; the
    per-head norms of q and k under `qk_norm`."""
    d, inner, kv = config.d_model, config.num_heads * config.head_dim, config.kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for proj, width in (("q", inner), ("k", kv), ("v", kv)):
        shapes.update(_linear(f"{prefix}.{proj}", d, width, config.has_qkv_bias))
    shapes.update(_linear(f"{prefix}.o", inner, d, config.has_o_bias))
    if config.relative_terms and not config.relative_shares_qk:  # DeBERTa: the relative positions' own projections
        for term, proj in (("c2p", "pos_k"), ("p2c", "pos_q")):
            if term in config.relative_terms:
                shapes.update(_linear(f"{prefix}.{proj}", d, inner, config.has_qkv_bias))
    if config.attention_sinks:  # one learned logit per query head, beside the keys in the softmax
        shapes[f"{prefix}.sinks"] = (config.num_heads,)
    if config.qk_norm:  # over each head, or (qk_norm_over="all") over all of q's and of k's features at once
        every = config.qk_norm_over == "all"
        shapes.update(_norm(f"{prefix}.q_norm", inner if every else config.head_dim, config))
        shapes.update(_norm(f"{prefix}.k_norm", kv if every else config.head_dim, config))
    return shapes


def _norm(prefix: str, width: int, config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """A LayerNorm's gamma and beta, or an RMSNorm's gamma alone (`norm="rms"`) as a LayerNorm's under
    `norm_bias=False`; nothing under `norm_affine=False`."""
    if not config.norm_affine:
        return {}
    if config.norm == "rms" or not config.norm_bias:
        return {f"{prefix}.gamma": (width,)}
    return {f"{prefix}.gamma": (width,), f"{prefix}.beta": (width,)}


def _post_norm(prefix: str, config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """A norm on a sublayer's output before the residual (`post_norms`, Gemma 2/3), d_model wide; none otherwise."""
    return _norm(prefix, config.d_model, config) if config.post_norms else {}


def _pre_norm(prefix: str, config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """A sublayer's own norm (`norm1`, `norm2`, `norm3`), d_model wide; none under `pre_norms=False` (OLMo 2)."""
    return _norm(prefix, config.d_model, config) if config.pre_norms else {}


def _ffn(prefix: str, config: TransformerConfig, width: int | None = None) -> dict[str, tuple[int, ...]]:
    """linear1 (up), linear2 (down) and, when `ffn_gated`, the gate beside linear1; `width` inner features (None:
    d_ff)."""
    bias, width = config.has_ffn_bias, width or config.d_ff
    gate = _linear(f"{prefix}.gate", config.d_model, width, bias) if config.ffn_gated else {}
    return {**gate, **_linear(f"{prefix}.linear1", config.d_model, width, bias),
            **_linear(f"{prefix}.linear2", width, config.d_model, bias)}


def _experts(prefix: str, config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """A mixture of experts (`num_experts`): the router `(d_model, num_experts)` (and its bias under
    `router_bias`), each expert a feed-forward of
    `expert_d_ff` (`experts.{e}.gate`, `.linear1`, `.linear2`), and the shared expert and its gate `(d_model, 1)`
    where `shared_expert_d_ff` says."""
    shapes = _linear(f"{prefix}.router", config.d_model, config.num_experts, config.router_bias)
    for e in range(config.num_experts):
        shapes.update(_ffn(f"{prefix}.experts.{e}", config, config.expert_width))
    if config.shared_expert_d_ff:
        shapes.update(_ffn(f"{prefix}.shared", config, config.shared_expert_d_ff))
        shapes[f"{prefix}.shared_gate.kernel"] = (config.d_model, 1)
    return shapes


def _embedding(side: str, vocab_size: int, config: TransformerConfig, table: bool) -> dict[str, tuple[int, ...]]:
    """One side's input embeddings: token table (unless shared) and its bias, learned positions, segments (source),
    norm."""
    d = config.embed_width
    shapes: dict[str, tuple[int, ...]] = {f"{side}_embed.embedding": (vocab_size, d)} if table else {}
    if config.embed_bias:  # each side's own, even when the table is shared
        shapes[f"{side}_embed.bias"] = (d,)
    if config.positional == "learned":
        shapes[f"{side}_pos.embedding"] = (config.position_rows, d)
    if side == "src" and config.type_vocab_size:
        shapes["src_type.embedding"] = (config.type_vocab_size, d)
    if config.embed_norm:
        shapes.update(_norm(f"{side}_embed_norm", d, config))
    if config.embedding_size is not None:  # ALBERT: the factorized embedding's projection to d_model
        shapes.update(_linear(f"{side}_embed_proj", d, config.d_model, config.bias))
    return shapes


def parameter_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical parameter name and its shape, in a fixed order (embeddings, encoder, decoder, output).

    Decoder-only models (`num_encoder_layers=0`) have decoder layers without `cross_attn`/`norm2` (the FFN's norm
    stays `norm3`, so a name means one thing in every family). `post_norms` adds a norm after each sublayer:
    `post_attn_norm`, `post_cross_attn_norm` (encoder-decoder), `post_ffn_norm`; `ffn_shares_norm` drops the decoder's `norm3` (the feed-forward reads `norm1`). `share_embeddings` drops `tgt_embed.embedding`
    (the decoder reads `src_embed.embedding`); `tie_embeddings` drops `output.kernel`. `relative_bias_buckets` adds
    each stack's relative position bias table, `{stack}.relative_bias.embedding` `(buckets, heads)`. `embed_bias` adds
    `{side}_embed.bias` for each side, shared table or not. A decoder layer with a mixture of experts
    (`layer_experts`) has `ffn.router`, `ffn.experts.{e}.*` (and `ffn.shared.*`, `ffn.shared_gate`) in place of the
    feed-forward's linears.
    """
    d = config.d_model
    shapes: dict[str, tuple[int, ...]] = {}
    if config.has_encoder:
        shapes.update(_embedding("src", config.src_vocab_size, config, table=True))
    if config.has_decoder:
        shapes.update(_embedding("tgt", config.tgt_vocab_size, config, table=not config.share_embeddings))
    if config.relative_terms:  # DeBERTa: the relative positions' table every encoder layer reads, and its norm
        shapes["encoder.rel_embed.embedding"] = (2 * config.relative_span, d)
        if config.relative_embed_norm:
            shapes.update(_norm("encoder.rel_embed_norm", d, config))
    if config.relative_bias_buckets and config.has_encoder:  # T5: one table per stack, read by every layer
        shapes["encoder.relative_bias.embedding"] = (config.relative_bias_buckets, config.num_heads)
    for i in range(config.encoder_weight_layers):  # one under shared_layers
        shapes.update(_attention(f"encoder.layers.{i}.self_attn", config))
        if i or config.first_attn_norm:  # ModernBERT's first layer has no attention norm
            shapes.update(_pre_norm(f"encoder.layers.{i}.norm1", config))
        shapes.update(_post_norm(f"encoder.layers.{i}.post_attn_norm", config))
        shapes.update(_ffn(f"encoder.layers.{i}.ffn", config))
        shapes.update(_pre_norm(f"encoder.layers.{i}.norm2", config))
        shapes.update(_post_norm(f"encoder.layers.{i}.post_ffn_norm", config))
    if config.final_norm and config.has_encoder:
        shapes.update(_norm("encoder.final_norm", d, config))
    if config.relative_bias_buckets and config.has_decoder:
        shapes["decoder.relative_bias.embedding"] = (config.relative_bias_buckets, config.num_heads)
    for i in range(config.num_decoder_layers):
        shapes.update(_attention(f"decoder.layers.{i}.self_attn", config))
        shapes.update(_pre_norm(f"decoder.layers.{i}.norm1", config))
        shapes.update(_post_norm(f"decoder.layers.{i}.post_attn_norm", config))
        if config.has_encoder:
            shapes.update(_attention(f"decoder.layers.{i}.cross_attn", config))
            shapes.update(_pre_norm(f"decoder.layers.{i}.norm2", config))
            shapes.update(_post_norm(f"decoder.layers.{i}.post_cross_attn_norm", config))
        shapes.update(_experts(f"decoder.layers.{i}.ffn", config) if config.layer_experts(i) else
                      _ffn(f"decoder.layers.{i}.ffn", config))
        if not config.ffn_shares_norm:
            shapes.update(_pre_norm(f"decoder.layers.{i}.norm3", config))
        shapes.update(_post_norm(f"decoder.layers.{i}.post_ffn_norm", config))
    if config.final_norm and config.has_decoder:
        shapes.update(_norm("decoder.final_norm", d, config))
    if config.pooler:
        shapes.update(_linear("pooler", d, d, config.bias))
    e = config.embed_width  # ALBERT's head maps back to the embedding width
    if config.head_transform:
        shapes.update(_linear("head.dense", d, e, config.bias))
        shapes.update(_norm("head.norm", e, config))
    if config.next_sentence:
        shapes.update(_linear("next_sentence", d, 2, True))
    if config.choice_head:
        shapes.update(_linear("choice_head", d, 1, True))
    if config.classifier_dense:
        shapes.update(_linear("classifier.dense", d, d, True))
    if config.classifier:
        shapes.update(_linear("classifier", d, config.num_labels, config.classifier_bias))
    if config.output_projection and not config.tie_embeddings:
        shapes["output.kernel"] = (e, config.tgt_vocab_size)
    if config.has_output_bias:
        shapes["output.bias"] = (config.tgt_vocab_size,)
    return shapes


def unread_rows(config: TransformerConfig) -> dict[str, int]:
    """Learned position tables whose first rows the model never reads, and how many: position p reads row
    p + `position_offset` (BART: rows 0 and 1 unread), and under `positions_skip_pad` a pad token reads row
    `position_offset - 1` (RoBERTa: row 0 unread). Such rows carry whatever the checkpoint's library left there."""
    if config.positional != "learned":
        return {}
    first = config.position_offset - (1 if config.positions_skip_pad else 0)
    if first <= 0:
        return {}
    sides = [side for side, present in (("src", config.has_encoder), ("tgt", config.has_decoder)) if present]
    return {f"{side}_pos.embedding": first for side in sides if f"{side}_pos.embedding" in parameter_shapes(config)}


def tied_output_embedding(config: TransformerConfig) -> str:
    """The embedding the output projection reuses (transposed) when `tie_embeddings` is set."""
    return "tgt_embed.embedding" if config.has_decoder and not config.share_embeddings else "src_embed.embedding"


def token_embedding(config: TransformerConfig, side: str) -> str:
    """The token table a side (`src` or `tgt`) reads: its own, or the source's under `share_embeddings`."""
    return "src_embed.embedding" if side == "src" or config.share_embeddings else "tgt_embed.embedding"


def init_weights(config: TransformerConfig, seed: int = 0, dtype: np.dtype | type = np.float32) -> dict[str, np.ndarray]:
    """Seeded weights in the canonical layout, bit-identical on every machine for the same seed.

    Each parameter draws from its own stream, seeded by `(seed, crc32(name))`, so adding a layer does not change
    the others. Kernels are Glorot-uniform (the default of both torch.nn.Transformer and Keras Dense), biases and
    LayerNorm betas zero, gammas one, embeddings uniform with std d_model**-0.5 (unit variance after the
    sqrt(d_model) scale). Only uniform draws and correctly rounded IEEE operations (scale, shift, sqrt) are used, so
    neither BLAS nor libm (whose exp/log may differ by an ulp between machines) enters.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, received {seed!r}")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, received {dtype}")
    weights = {}
    for name, shape in parameter_shapes(config).items():
        rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
        leaf = name.rsplit(".", 1)[1]
        if leaf == "kernel":
            limit = np.sqrt(6.0 / (shape[0] + shape[1]))
            value = rng.uniform(-limit, limit, size=shape)
        elif leaf == "embedding":
            limit = np.sqrt(3.0 / config.d_model)
            value = rng.uniform(-limit, limit, size=shape)
        elif leaf == "gamma":
            value = np.full(shape, 1.0 - config.norm_weight_offset)  # the norm multiplies by 1 at init
        else:  # bias, beta
            value = np.zeros(shape)
        weights[name] = value.astype(dtype)
    return weights


def validate_weights(config: TransformerConfig, weights: Mapping[str, np.ndarray]) -> None:
    """Raise `ValueError` naming every missing, unexpected or misshaped parameter, or a non-float dtype."""
    expected = parameter_shapes(config)
    problems = []
    missing = [k for k in expected if k not in weights]
    unexpected = sorted(k for k in weights if k not in expected)
    if missing:
        problems.append(f"missing {len(missing)} parameter(s): {preview(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} parameter(s): {preview(unexpected)}")
    misshaped, not_float = [], []
    for name, shape in expected.items():
        if name in weights:
            value = weights[name]
            if tuple(np.shape(value)) != shape:
                misshaped.append(f"{name} has shape {tuple(np.shape(value))}, expected {shape}")
            elif not is_float_dtype(_dtype(value)):
                not_float.append(f"{name} has dtype {_dtype(value)}, expected a float dtype")
    if misshaped:  # a config that contradicts the file misshapes nearly every tensor: one line, not kilobytes
        problems.append(f"{len(misshaped)} with the wrong shape: {preview(misshaped, sep='; ')}")
    if not_float:
        problems.append(f"{len(not_float)} not floating point: {preview(not_float, sep='; ')}")
    if problems:
        raise ValueError("weights do not match the config: " + "; ".join(problems))


def _dtype(value) -> np.dtype:
    """An array's dtype without reading it (a lazily read tensor says its dtype up front)."""
    return value.dtype if isinstance(getattr(value, "dtype", None), np.dtype) else np.asarray(value).dtype


def is_float_dtype(dtype: np.dtype) -> bool:
    """float16/32/64, or bfloat16 (ml_dtypes' NumPy type, which checkpoints are stored in and converted as)."""
    return dtype in (np.float16, np.float32, np.float64) or dtype.name == "bfloat16"


def weights_dtype(weights: Mapping[str, np.ndarray]) -> np.dtype:
    """The single floating dtype of a weight dict (float32 or float64, or a checkpoint's bfloat16 or float16)."""
    dtypes = {_dtype(v) for v in weights.values()}
    if len(dtypes) != 1 or not is_float_dtype(next(iter(dtypes))):
        raise ValueError(f"weights must all have one float dtype, received dtypes {sorted(map(str, dtypes))}")
    return next(iter(dtypes))


def to_framework_state(config: TransformerConfig, weights: Mapping[str, np.ndarray], table: Sequence[mapping.Entry],
                       *, consume: bool = False, shared: bool = False) -> dict[str, np.ndarray]:
    """Canonical weights -> {framework name: array} through `table`, after checking them against the schema.

    Every array is fresh, so a framework model never shares memory with the canonical dict it came from (a later
    optimizer step must not reach back into it). `consume=True` removes each entry from `weights` (a dict) once it
    is mapped, so that converting a checkpoint holds it about once rather than twice. `shared`: see `mapping.plan`.
    """
    validate_weights(config, weights)
    plan = mapping.plan(parameter_shapes(config), table, shared=shared)
    return mapping.write(plan, weights if consume else dict(weights), config.head_dim, consume=consume)


def from_framework_state(config: TransformerConfig, state: Mapping[str, np.ndarray], table: Sequence[mapping.Entry],
                         *, consume: bool = False, shared: bool = False, defer: mapping.Defer | None = None
                         ) -> dict[str, np.ndarray]:
    """{framework name: array} -> canonical weights through `table`; fails on any missing, unused or misshaped
    entry. `consume=True` removes each entry from `state` (a dict) once it is mapped; `shared`: see `mapping.plan`;
    `defer`: arrays read from `state` when asked (see `mapping.read`)."""
    shapes = parameter_shapes(config)
    plan = mapping.plan(shapes, table, shared=shared)
    mapping.check_keys(plan, state)
    weights = mapping.read(plan, state if consume else dict(state), shapes, config.head_dim, consume=consume,
                           defer=defer)
    validate_weights(config, weights)
    return weights


def check_config_against_file(config: TransformerConfig, n_tensors: int, source: str) -> None:
    """Refuse a config naming more layers than the file holds tensors (each layer has several); `ValueError`."""
    for name in ("num_encoder_layers", "num_decoder_layers"):
        value = getattr(config, name)
        if value > n_tensors:
            raise ValueError(f"{source}: config field {name}={value} cannot match a file of {n_tensors} tensors "
                             "(every layer has several); refusing before allocating anything")
