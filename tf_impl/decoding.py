"""`next_logits` steppers for `reference_numpy.generate`: incremental (key/value cache) or full recomputation; and
`greedy`, the whole greedy loop as one compiled program over a fixed-size cache.

Encoder-decoder models take the source ids; a decoder-only model takes none (its prompt goes to `generate`).
Decoder inputs always count as real tokens (all-True target mask), so a start token equal to `pad_id` (Marian's)
is attended to like any other.
"""

from __future__ import annotations

import weakref

import numpy as np
from .startup import tf  # noqa: I001 (before keras: its import loads TensorFlow)
from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice

import reference_numpy as rn
from reference_numpy.decoding import NextLogits

from .model import KVCache, Transformer, padding_mask


def _encode(model: Transformer, src_ids, src_mask):
    """`(memory, src_mask)`; `(None, None)` for a decoder-only model, which must get no source."""
    if model.config.is_decoder_only:
        if src_ids is not None or src_mask is not None:
            raise ValueError("a decoder-only model has no source: pass the prompt to generate(), received src_ids")
        return None, None
    src_ids = tf.constant(np.asarray(src_ids))
    src_mask = padding_mask(src_ids, model.config.pad_id) if src_mask is None else tf.constant(np.asarray(src_mask))
    return model.encode(src_ids, src_mask), src_mask


def cached_stepper(model: Transformer, src_ids=None, src_mask=None, compiled: bool = True) -> NextLogits:
    """Encode once; each call feeds only the positions not yet in the key/value cache (the prompt, then one per
    decoding step).

    `compiled`: after the first (eager) step, which fills the cache, run each step as one `tf.function` with the
    cache passed in and out as tensors (traced once per model, dynamic lengths). Eager Keras spends ~0.1 s per
    step in Python dispatch on a small model, which would hide what the cache saves.
    """
    memory, src_mask = _encode(model, src_ids, src_mask)
    cache = model.new_cache()

    def next_logits(ids: np.ndarray) -> np.ndarray:
        new = np.asarray(ids)[:, cache.length:]  # (B, T_new)
        if new.shape[1] == 0:
            raise ValueError(f"next_logits needs ids longer than the {cache.length} position(s) already cached")
        if compiled and cache.key_mask is not None:
            step = _compiled_step(model)
            source = () if memory is None else (memory, src_mask)
            logits, key_mask, tensors = step(tf.constant(new, tf.int64), cache.key_mask, _flatten(cache), *source)
            cache.key_mask = key_mask
            _unflatten(cache, tensors)
            return np.asarray(logits)
        logits = model.decode(new, memory, src_mask, tgt_mask=np.ones(new.shape, dtype=bool), cache=cache,
                              last_only=True)
        return np.asarray(logits[:, -1])

    return next_logits


def _flatten(cache: KVCache) -> list[tf.Tensor]:
    """Per layer: self-attention keys and values, then (encoder-decoder models) cross-attention's."""
    return [t for layer in cache.layers for c in layer if c is not None for t in (c.k, c.v)]


def _unflatten(cache: KVCache, tensors) -> None:
    tensors = iter(tensors)
    for layer in cache.layers:
        for c in layer:
            if c is not None:
                c.k, c.v = next(tensors), next(tensors)


_STEPS: "weakref.WeakKeyDictionary[Transformer, tf.types.experimental.GenericFunction]" = weakref.WeakKeyDictionary()


def _compiled_step(model: Transformer):
    """One decoding step as a `tf.function` of (new ids, cached key mask, cached keys and values[, memory, source
    mask]) -> (last logits, key mask, keys and values), with every batch and length dimension dynamic. A
    decoder-only model has no memory, source mask or cross-attention cache."""
    if model not in _STEPS:
        c, dtype = model.config, model.compute_dtype
        heads = tf.TensorSpec((None, c.kv_heads, None, c.head_dim), dtype)  # (B, KV, T, d_k)
        per_layer = 4 if c.has_encoder else 2
        signature = [tf.TensorSpec((None, None), tf.int64), tf.TensorSpec((None, None), tf.bool),
                     [heads] * (per_layer * c.num_decoder_layers)]
        if c.has_encoder:
            signature += [tf.TensorSpec((None, None, c.d_model), dtype), tf.TensorSpec((None, None), tf.bool)]

        def step(new_ids, key_mask, tensors, memory=None, src_mask=None):
            cache = model.new_cache()
            cache.key_mask = key_mask
            _unflatten(cache, tensors)
            logits = model.decode(new_ids, memory, src_mask, tgt_mask=tf.ones_like(new_ids, dtype=tf.bool),
                                  cache=cache, last_only=True)
            return logits[:, -1], cache.key_mask, _flatten(cache)

        _STEPS[model] = tf.function(step, input_signature=signature)
    return _STEPS[model]


def recompute_stepper(model: Transformer, src_ids=None, src_mask=None, compiled: bool = True) -> NextLogits:
    """Encode once; each call runs the decoder over the whole prefix again (the no-cache baseline).

    `compiled`: as one `tf.function` per model with dynamic lengths, like `cached_stepper`, so that the two are
    compared on equal terms."""
    memory, src_mask = _encode(model, src_ids, src_mask)

    def next_logits(ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        if compiled:
            source = () if memory is None else (memory, src_mask)
            return np.asarray(_compiled_recompute(model)(tf.constant(ids, tf.int64), *source))
        logits = model.decode(ids, memory, src_mask, tgt_mask=np.ones(ids.shape, dtype=bool), last_only=True)
        return np.asarray(logits[:, -1])

    return next_logits


_RECOMPUTE: "weakref.WeakKeyDictionary[Transformer, tf.types.experimental.GenericFunction]" = \
    weakref.WeakKeyDictionary()


def _compiled_recompute(model: Transformer):
    if model not in _RECOMPUTE:
        signature = [tf.TensorSpec((None, None), tf.int64)]
        if model.config.has_encoder:
            signature += [tf.TensorSpec((None, None, model.config.d_model), model.compute_dtype),
                          tf.TensorSpec((None, None), tf.bool)]

        def step(ids, memory=None, src_mask=None):
            logits = model.decode(ids, memory, src_mask, tgt_mask=tf.ones_like(ids, dtype=tf.bool), last_only=True)
            return logits[:, -1]

        _RECOMPUTE[model] = tf.function(step, input_signature=signature)
    return _RECOMPUTE[model]


def greedy(model: Transformer, start, new_tokens: int, src_ids=None, src_mask=None, *, jit_compile: bool = True
           ) -> tuple[np.ndarray, np.ndarray]:
    """`new_tokens` greedy tokens after `start` `(B, P)` (the start token, or a decoder-only model's prompt), as ONE
    `tf.function`: encode the source, run `start` through the decoder in one call filling a fixed-size key/value
    cache of `P + new_tokens - 1` positions (the last token chosen is never fed back), then a `tf.while_loop` of
    one token per step (argmax). No early stop, so every call does the same work. Traced (and, with `jit_compile`,
    compiled by XLA) once per model, shapes and `new_tokens`.

    Returns `(ids, logits)`: `(B, P + new_tokens)` int64 ids (the start, then the chosen tokens) and the last
    step's logits `(B, V)` (the scores of the final token).
    """
    c = model.config
    rn.check_stack(c, "decode")
    start = rn.check_token_ids("start", start, c.tgt_vocab_size, c.max_len)
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, (int, np.integer)) or new_tokens < 1:
        raise ValueError(f"new_tokens must be a positive integer, received {new_tokens!r}")
    batch, p = start.shape
    if p + new_tokens - 1 > c.max_len:  # the last token chosen is never fed back
        raise ValueError(f"start length {p} + new_tokens={new_tokens} needs {p + new_tokens - 1} decoder positions, "
                         f"more than max_len={c.max_len}")
    source = ()
    if c.is_decoder_only:
        if src_ids is not None or src_mask is not None:
            raise ValueError("a decoder-only model has no source: its prompt is start, received src_ids")
    else:
        if src_ids is None:
            raise ValueError("an encoder-decoder model needs src_ids, received None")
        src_ids = rn.check_token_ids("src_ids", src_ids, c.src_vocab_size, c.max_len)
        if src_ids.shape[0] != batch:
            raise ValueError(f"src_ids and start have different batch sizes: {src_ids.shape[0]} and {batch}")
        src_mask = (rn.padding_mask(src_ids, c.pad_id) if src_mask is None
                    else rn.check_padding_mask("src_mask", src_mask, src_ids.shape))
        source = (tf.constant(src_ids, tf.int64), tf.constant(src_mask))
    ids, logits = _compiled_greedy(model, jit_compile)(tf.constant(start, tf.int64), int(new_tokens), *source)
    return ids.numpy(), logits.numpy()


_GREEDY: "weakref.WeakKeyDictionary[Transformer, dict]" = weakref.WeakKeyDictionary()


def _compiled_greedy(model: Transformer, jit_compile: bool):
    """`greedy`'s program as a `tf.function` of (start, new_tokens (a Python int)[, src_ids, src_mask]) ->
    (ids, last logits); one per model and `jit_compile`, retraced per input shape and `new_tokens`."""
    functions = _GREEDY.setdefault(model, {})
    if jit_compile not in functions:
        def run(start, new_tokens, src_ids=None, src_mask=None):
            b, p = start.shape  # static: the cache and the ids buffer have fixed sizes
            memory = None if src_ids is None else model.encode(src_ids, src_mask)
            cache = model.new_cache(b, p + new_tokens - 1)

            def decode(new):  # (B, T) ids -> (B, V) logits of the last one; all decoder inputs are real tokens
                return model.decode(new, memory, src_mask, tgt_mask=tf.ones_like(new, dtype=tf.bool), cache=cache,
                                    last_only=True)[:, -1]

            def choose(ids, logits, position):  # the argmax written into column `position` of (B, P + N)
                chosen = tf.argmax(logits, axis=-1, output_type=tf.int64)[:, None]  # (B, 1)
                return dynamic_update_slice(ids, chosen, [0, position])

            logits = decode(start)  # the prompt in one call
            ids = choose(tf.concat([start, tf.zeros((b, new_tokens), tf.int64)], axis=1), logits, p)  # (B, P + N)

            def step(i, ids, logits, state):  # feeds token p + i - 1, chooses token p + i
                _set_state(cache, state)
                logits = decode(tf.slice(ids, [0, p + i - 1], [b, 1]))  # (B, V)
                return i + 1, choose(ids, logits, p + i), logits, _state(cache)

            _, ids, logits, _ = tf.while_loop(lambda i, *_: i < new_tokens, step,
                                              (tf.constant(1), ids, logits, _state(cache)))
            return ids, logits

        functions[jit_compile] = tf.function(run, jit_compile=jit_compile)
    return functions[jit_compile]


def _state(cache: KVCache) -> list[tf.Tensor]:
    """A fixed-size cache as loop variables: key mask, index, then `_flatten`'s keys and values."""
    return [cache.key_mask, cache.index, *_flatten(cache)]


def _set_state(cache: KVCache, state) -> None:
    cache.key_mask, cache.index, *tensors = state
    _unflatten(cache, tensors)
