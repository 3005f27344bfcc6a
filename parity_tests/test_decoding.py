"""Decoding parity: the key/value caches of torch and Keras against full recomputation by the NumPy reference, and
greedy and seeded-sampling outputs that are identical token for token in all three backends."""

from pathlib import Path

import numpy as np
import pytest

import reference_numpy as rn

from .torch_threads import one_torch_thread  # noqa: F401 (autouse)
from .conftest import FAMILIES, VARIANTS, weights_for
from .test_model_features import FEATURES
from .tolerances import atol

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "benchmarks" / "results" / "reverse" / "torch" / "checkpoint.safetensors"
CACHE_VARIANTS = ["post-ln", "pre-ln+final-norm", "learned-pos", "tied", "pad-id-3", "asymmetric-depth",
                  "post-norms+soft-caps", "layer-kinds+nope", "plain-norms+clip+multipliers",
                  "post-norms-only+qk-norm-all", "skip-pad-sinusoids", "relative-bias"]



def steppers(framework, config, weights, src, dtype):
    """`(cached, recompute)` next_logits callables of a framework."""
    if framework == "torch":
        import torch

        import torch_impl
        from torch_impl.decoding import cached_stepper, recompute_stepper
        model = torch_impl.Transformer.from_reference(config, weights, dtype=getattr(torch, dtype))
    else:
        import tf_impl
        from tf_impl.decoding import cached_stepper, recompute_stepper
        model = tf_impl.Transformer.from_reference(config, weights, dtype=dtype)
    return cached_stepper(model, src), recompute_stepper(model, src)


def all_backends(config, weights, src, dtype):
    """`{backend: next_logits}`: NumPy (recomputation), torch and Keras (cached)."""
    backends = {"numpy": rn.reference_stepper(rn.Transformer(config, weights, np.dtype(dtype)), src)}
    for framework in ("torch", "tf"):
        backends[framework] = steppers(framework, config, weights, src, dtype)[0]
    return backends


CACHE_CASES = [("torch", name) for name in CACHE_VARIANTS] + [("tf", name) for name in CACHE_VARIANTS[:3]] + [
    ("tf", "relative-bias")]


@pytest.mark.parametrize("framework, name", CACHE_CASES, ids=[f"{f}-{n}" for f, n in CACHE_CASES])
def test_cache_gives_the_logits_of_full_recomputation(framework, name, dtype):
    """Step by step, the cached logits equal the reference's recomputation over the whole prefix (the framework's
    own recomputation is `decode`, covered by test_model_parity)."""
    config = VARIANTS[name]
    weights = weights_for(config, dtype=dtype)
    src, _ = rn.sample_batch(config, batch=3, src_len=9, seed=4)
    desired = rn.reference_stepper(rn.Transformer(config, weights), src)
    cached, _ = steppers(framework, config, weights, src, dtype)
    ids = rn.sample_ids(config, 3, 10, config.tgt_vocab_size, seed=5)
    ids[ids == config.pad_id] = config.pad_id + 1  # decoder inputs of generation are all real tokens
    for t in range(1, ids.shape[1] + 1):
        np.testing.assert_allclose(cached(ids[:, :t]), desired(ids[:, :t]), rtol=0, atol=atol(dtype),
                                   err_msg=f"position {t - 1}")


def test_recompute_stepper_matches_cached_one():
    config = VARIANTS["post-ln"]
    weights = weights_for(config, dtype="float64")
    src, _ = rn.sample_batch(config, batch=2, src_len=7, seed=4)
    ids = np.array([[1, 5, 6, 7], [1, 8, 9, 10]])
    for framework in ("torch", "tf"):
        cached, recompute = steppers(framework, config, weights, src, "float64")
        for t in range(1, 5):
            np.testing.assert_allclose(cached(ids[:, :t]), recompute(ids[:, :t]), rtol=0, atol=atol("float64"))


def test_cache_bookkeeping():
    import torch

    import torch_impl

    config = VARIANTS["post-ln"]
    model = torch_impl.Transformer.from_reference(config, weights_for(config, dtype="float64"))
    src, tgt = rn.sample_batch(config, batch=2, src_len=5, tgt_len=6, seed=1)
    memory = model.encode(src)
    cache = model.new_cache()
    with torch.no_grad():
        first = model.decode(tgt[:, :4], memory, src != config.pad_id, cache=cache)  # a prompt of 4 at once
        rest = model.decode(tgt[:, 4:], memory, src != config.pad_id, cache=cache)
        full = model.decode(tgt, memory, src != config.pad_id)
    assert cache.length == 6
    np.testing.assert_allclose(torch.cat([first, rest], 1).numpy(), full.numpy(), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="max_len"):
        model.decode(np.ones((2, config.max_len), dtype=np.int64), memory, src != config.pad_id, cache=cache)
    with pytest.raises(ValueError, match="encoder-only"):
        torch_impl.Transformer.from_reference(VARIANTS["encoder-only"],
                                              weights_for(VARIANTS["encoder-only"])).new_cache()


@pytest.mark.parametrize("name", ["post-ln", "pre-ln+final-norm"], ids=["post-ln", "pre-ln"])
def test_greedy_tokens_identical_random_weights(name, dtype):
    config = VARIANTS[name]
    weights = weights_for(config, dtype=dtype)
    src, _ = rn.sample_batch(config, batch=4, src_len=9, seed=6)
    outputs = {backend: rn.generate(step, 4, bos_id=1, eos_id=2, pad_id=config.pad_id, max_new_tokens=16)
               for backend, step in all_backends(config, weights, src, dtype).items()}
    for backend in ("torch", "tf"):
        np.testing.assert_array_equal(outputs[backend], outputs["numpy"], err_msg=backend)


@pytest.mark.skipif(not TRAINED.exists(), reason=f"no trained checkpoint at {TRAINED}")
def test_greedy_tokens_identical_trained_checkpoint():
    """The committed reversal model: the same tokens everywhere, and they are the right answers."""
    config, weights = rn.load_weights(TRAINED)
    task = rn.TaskSpec()
    batch = task.make_batch(24, np.random.default_rng(11))
    outputs = {backend: rn.generate(step, 24, bos_id=rn.BOS_ID, eos_id=rn.EOS_ID, pad_id=rn.PAD_ID,
                                    max_new_tokens=task.target_len)
               for backend, step in all_backends(config, weights, batch.src, "float32").items()}
    for backend in ("torch", "tf"):
        np.testing.assert_array_equal(outputs[backend], outputs["numpy"], err_msg=backend)
    token, _ = rn.accuracy(outputs["numpy"][:, 1:], batch.labels)
    assert token >= 0.99


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.7, 5)], ids=["t1", "t0.7-top5"])
def test_seeded_sampling_identical(temperature, top_k):
    config = VARIANTS["post-ln"]
    weights = weights_for(config, dtype="float64")
    src, _ = rn.sample_batch(config, batch=3, src_len=9, seed=8)
    outputs = {backend: rn.generate(step, 3, bos_id=1, eos_id=2, pad_id=config.pad_id, max_new_tokens=12,
                                    greedy=False, temperature=temperature, top_k=top_k,
                                    rng=np.random.default_rng(42))
               for backend, step in all_backends(config, weights, src, "float64").items()}
    for backend in ("torch", "tf"):
        np.testing.assert_array_equal(outputs[backend], outputs["numpy"], err_msg=backend)


def test_choose_next_rules():
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]))
    np.testing.assert_array_equal(rn.choose_next(logits), [3, 0])
    draws = np.stack([rn.choose_next(logits, greedy=False, top_k=2, rng=np.random.default_rng(s))
                      for s in range(400)])
    assert set(draws[:, 0]) == {2, 3} and set(draws[:, 1]) == {0, 1}  # only the two best
    assert 0.3 < (draws[:, 0] == 2).mean() < 0.55  # 0.3 / 0.7 = 0.43
    cold = [rn.choose_next(logits, greedy=False, temperature=1e-3, rng=np.random.default_rng(s)) for s in range(20)]
    assert all((c == [3, 0]).all() for c in cold)
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    rn.choose_next(logits, greedy=False, rng=rng_a)
    rn.choose_next(logits, greedy=False, top_k=1, temperature=3.0, rng=rng_b)
    assert rng_a.random() == rng_b.random()  # one draw per row whatever the settings
    for kwargs, message in ((dict(temperature=0.0), "temperature"), (dict(top_k=0), "top_k"),
                            (dict(top_k=5), "larger than the vocabulary"), (dict(rng=None), "Generator")):
        with pytest.raises(ValueError, match=message):
            rn.choose_next(logits, greedy=False, **{"rng": np.random.default_rng(0), **kwargs})


def test_generate_stops_and_pads_after_eos():
    eos, pad = 2, 0
    fed = []

    def next_logits(ids):
        fed.append(ids.copy())
        logits = np.zeros((2, 5))
        logits[0, eos if ids.shape[1] == 2 else 4] = 1  # row 0 ends at its 2nd token
        logits[1, eos if ids.shape[1] == 4 else 3] = 1  # row 1 at its 4th
        return logits

    out = rn.generate(next_logits, 2, bos_id=1, eos_id=eos, pad_id=pad, max_new_tokens=8)
    np.testing.assert_array_equal(out, [[1, 4, 2, 0, 0, 0, 0, 0, 0], [1, 3, 3, 3, 2, 0, 0, 0, 0]])
    # a model with no pad token: finished rows are filled (and fed) with EOS
    fed.clear()
    out = rn.generate(next_logits, 2, bos_id=1, eos_id=eos, pad_id=None, max_new_tokens=8)
    np.testing.assert_array_equal(out, [[1, 4, 2, 2, 2, 2, 2, 2, 2], [1, 3, 3, 3, 2, 2, 2, 2, 2]])
    np.testing.assert_array_equal(fed[-1], [[1, 4, 2, 2], [1, 3, 3, 3]])


# --- tf_impl.decoding.greedy: the whole greedy loop as one tf.function over a fixed-size cache ---------------------

# name -> (config, start token): an encoder-decoder, GPT-2's decoder-only shape (its prompt holds pad_id, which must
# still be attended; max_len 10: prompt 5 + 6 new tokens fill every position, as the last one is never fed back),
# Marian's start token == pad_id. One encoder layer: XLA compilation is most of the test time.
GREEDY_CASES = {"encoder-decoder": (VARIANTS["post-ln"].replace(num_encoder_layers=1), 1),
                "gpt2-like": (FAMILIES["gpt2-like"].replace(max_len=10), None),
                "marian-like": (FAMILIES["marian-like"].replace(num_encoder_layers=1), FAMILIES["marian-like"].pad_id),
                "all-features": (FEATURES["decoder-only"].replace(num_decoder_layers=1, max_len=10), None)}
# Every model under XLA; without XLA (the same program, another compiler) the encoder-decoder only.
GREEDY_RUNS = [(name, True) for name in GREEDY_CASES] + [("encoder-decoder", False)]


def _greedy_inputs(config, start_id):
    """`(start, src)`: a `(3, 1)` start column and a source, or a decoder-only model's `(3, 5)` prompt."""
    if start_id is None:
        prompt = rn.sample_ids(config, 3, 5, config.tgt_vocab_size, seed=7)
        prompt[:, 2] = 0 if config.pad_id is None else config.pad_id
        return prompt, None
    src, _ = rn.sample_batch(config, batch=3, src_len=9, seed=4)
    return np.full((3, 1), start_id, dtype=np.int64), src


@pytest.mark.parametrize("name, jit_compile", GREEDY_RUNS,
                         ids=[f"{name}-{'xla' if jit else 'function'}" for name, jit in GREEDY_RUNS])
def test_tf_compiled_greedy_matches_reference(name, jit_compile):
    """The ids equal the reference's greedy ids, and the last step's logits its recomputation's."""
    import tf_impl
    from tf_impl.decoding import greedy

    config, start_id = GREEDY_CASES[name]
    weights = weights_for(config, dtype=np.float32)
    start, src = _greedy_inputs(config, start_id)
    reference = rn.reference_stepper(rn.Transformer(config, weights), src)
    desired = rn.generate(reference, 3, prompt=start, eos_id=-1, pad_id=config.pad_id, max_new_tokens=6)
    model = tf_impl.Transformer.from_reference(config, weights, dtype="float32")
    ids, logits = greedy(model, start, 6, src, jit_compile=jit_compile)
    np.testing.assert_array_equal(ids, desired)
    np.testing.assert_allclose(logits, reference(desired[:, :-1]), rtol=0, atol=atol("float32"))


def test_tf_fixed_size_cache_gives_the_logits_of_full_recomputation():
    """Eagerly, a prompt of 4 then one position at a time into a fixed-size cache of 7 (3 left unfilled)."""
    import tf_impl

    config = FAMILIES["bart-like"]  # learned positions read from row position_offset on
    weights = weights_for(config, dtype=np.float64)
    src, tgt = rn.sample_batch(config, batch=2, src_len=5, tgt_len=6, seed=1)
    model = tf_impl.Transformer.from_reference(config, weights)
    memory, src_mask = model.encode(src), src != config.pad_id
    cache = model.new_cache(batch_size=2, length=7)
    ones = np.ones((2, 4), dtype=bool)
    parts = [model.decode(tgt[:, :4], memory, src_mask, ones, cache=cache)]
    parts += [model.decode(tgt[:, t:t + 1], memory, src_mask, ones[:, :1], cache=cache) for t in (4, 5)]
    full = rn.Transformer(config, weights).decode(tgt, rn.Transformer(config, weights).encode(src, src_mask),
                                                  src_mask, tgt_mask=np.ones(tgt.shape, dtype=bool))
    np.testing.assert_allclose(np.concatenate(parts, axis=1), full, rtol=0, atol=atol("float64"))
    assert int(cache.length) == 6 and cache.key_mask.numpy().sum(axis=1).tolist() == [6, 6]
    with pytest.raises(ValueError, match="2 more position\\(s\\) after 6 cached ones exceeds the fixed-size cache's "
                                         "length 7"):
        model.decode(tgt[:, :2], memory, src_mask, ones[:, :2], cache=cache)
    for kwargs, message in ((dict(batch_size=2), "both batch_size and length"),
                            (dict(batch_size=2, length=config.max_len + 1), "exceeds max_len")):
        with pytest.raises(ValueError, match=message):
            model.new_cache(**kwargs)


def test_tf_compiled_greedy_rejects_bad_inputs():
    import tf_impl
    from tf_impl.decoding import greedy

    config = VARIANTS["post-ln"]
    model = tf_impl.Transformer.from_reference(config, weights_for(config))
    decoder_only = tf_impl.Transformer.from_reference(FAMILIES["gpt2-like"], weights_for(FAMILIES["gpt2-like"]))
    src, _ = rn.sample_batch(config, batch=2, src_len=5, seed=1)
    start = np.ones((2, 1), dtype=np.int64)
    cases = [
        (lambda: greedy(model, start, 0, src), ValueError, "new_tokens must be a positive integer, received 0"),
        (lambda: greedy(model, start, True, src), ValueError, "new_tokens must be a positive integer"),
        (lambda: greedy(model, start, config.max_len + 1, src), ValueError,
         f"start length 1 \\+ new_tokens={config.max_len + 1} needs {config.max_len + 1} decoder positions, more "
         f"than max_len={config.max_len}"),
        (lambda: greedy(model, start.astype(np.float32), 3, src), TypeError, "start must hold integer token ids"),
        (lambda: greedy(model, start, 3), ValueError, "needs src_ids, received None"),
        (lambda: greedy(model, start[:1], 3, src), ValueError, "different batch sizes: 2 and 1"),
        (lambda: greedy(model, start, 3, src, src_mask=src), TypeError, "src_mask must be a bool array"),
        (lambda: greedy(decoder_only, start, 3, src), ValueError, "decoder-only model has no source"),
        (lambda: greedy(tf_impl.Transformer.from_reference(VARIANTS["encoder-only"],
                                                           weights_for(VARIANTS["encoder-only"])), start, 3),
         ValueError, "decode\\(\\) needs a decoder"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


@pytest.mark.parametrize("backend", ["numpy", "torch", "tf"])
def test_last_only_is_the_last_row_of_the_full_logits(backend, dtype):
    """`decode(..., last_only=True)`, which the steppers use, equals the float64 reference's full logits at the last
    position (the other positions skip the output projection, nothing else changes)."""
    config = VARIANTS["tied"]
    weights = weights_for(config, dtype=dtype)
    src, tgt = rn.sample_batch(config, batch=3, src_len=9, tgt_len=6, seed=8)
    reference = rn.Transformer(config, weights)
    memory, src_mask = reference.encode(src), src != config.pad_id
    desired = reference.decode(tgt, memory, src_mask)[:, -1:]  # (B, 1, V), every position projected
    if backend == "numpy":
        actual = rn.Transformer(config, weights, np.dtype(dtype)).decode(tgt, memory.astype(dtype), src_mask,
                                                                          last_only=True)
    elif backend == "torch":
        import torch

        import torch_impl
        model = torch_impl.Transformer.from_reference(config, weights, dtype=getattr(torch, dtype))
        with torch.no_grad():
            actual = model.decode(torch.as_tensor(tgt), model.encode(torch.as_tensor(src)), torch.as_tensor(src_mask),
                                  last_only=True).numpy()
    else:
        import tf_impl
        model = tf_impl.Transformer.from_reference(config, weights, dtype=dtype)
        actual = np.asarray(model.decode(tgt, model.encode(src), src_mask, last_only=True))
    assert actual.shape == desired.shape
    np.testing.assert_allclose(actual, desired, rtol=0, atol=atol(dtype))


# --- a model with every canonical setting hand-written models need (pad_id=None, attention_scale, embed_bias,
# head_order): the caches of both twins against the reference's recomputation, and the same greedy tokens ----------

FEATURE_CASES = [(framework, name) for framework in ("torch", "tf") for name in ("encoder-decoder", "decoder-only")]


@pytest.mark.parametrize("framework, name", FEATURE_CASES, ids=[f"{f}-{n}" for f, n in FEATURE_CASES])
def test_cache_with_every_model_setting(framework, name, dtype):
    config = FEATURES[name]
    weights = weights_for(config, seed=9, dtype=dtype)
    src = None if config.is_decoder_only else rn.sample_batch(config, batch=3, src_len=9, tgt_len=3, seed=4)[0]
    desired = rn.reference_stepper(rn.Transformer(config, weights), src)
    cached, recompute = steppers(framework, config, weights, src, dtype)
    ids = rn.sample_ids(config, 3, 10, config.tgt_vocab_size, seed=5)  # no pad token: no padding, id 0 in each row
    assert (ids == 0).any(axis=1).all()
    for t in range(1, ids.shape[1] + 1):
        want = desired(ids[:, :t])
        np.testing.assert_allclose(cached(ids[:, :t]), want, rtol=0, atol=atol(dtype), err_msg=f"position {t - 1}")
        np.testing.assert_allclose(recompute(ids[:, :t]), want, rtol=0, atol=atol(dtype), err_msg=f"position {t - 1}")


@pytest.mark.parametrize("name", ["encoder-decoder", "decoder-only"])
def test_greedy_tokens_identical_with_every_model_setting(name):
    """float64, an EOS that some rows reach (finished rows are filled with it: the model has no pad token)."""
    config = FEATURES[name]
    weights = weights_for(config, seed=9, dtype="float64")
    start = {"prompt": rn.sample_ids(config, 4, 3, config.tgt_vocab_size, seed=6)} if config.is_decoder_only \
        else {"bos_id": 1}
    src = None if config.is_decoder_only else rn.sample_batch(config, batch=4, src_len=9, tgt_len=3, seed=6)[0]
    backends = all_backends(config, weights, src, "float64")
    free = rn.generate(backends["numpy"], 4, eos_id=-1, pad_id=None, max_new_tokens=12, **start)
    eos = int(free[0, -6])  # a token row 0 produces: that row, at least, finishes early
    outputs = {backend: rn.generate(step, 4, eos_id=eos, pad_id=None, max_new_tokens=12, **start)
               for backend, step in all_backends(config, weights, src, "float64").items()}  # fresh caches
    for backend in ("torch", "tf"):
        np.testing.assert_array_equal(outputs[backend], outputs["numpy"], err_msg=backend)
    assert (outputs["numpy"][0, -5:] == eos).all()
