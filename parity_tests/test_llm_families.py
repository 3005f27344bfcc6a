"""The decoder-only families people port — Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3, Starcoder2, StableLM, OPT —
against transformers itself: tiny random models with odd sizes (6 query heads over 2 key/value heads, a head width
that is not hidden / heads, an intermediate size of 37, a vocabulary of 53), every weight perturbed (norms away from
their init), id 0 in the inputs, rope scalings and a window shorter than the input where the family has them. Each is
saved with `save_pretrained`, imported, run by the float64 reference and both twins, verified by the CLI against
transformers (the built-in source), exported back and reloaded by transformers, and decoded greedily."""

from __future__ import annotations

import json

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main
from transformer_parity.layouts import hf_family
from transformer_parity.verify.source_hf import exact_float64

from .support.greedy import steppers
from .tolerances import property_atol

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB = 53
COMMON = dict(vocab_size=VOCAB, hidden_size=48, num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=2,
              intermediate_size=37, max_position_embeddings=64, rms_norm_eps=1e-5, pad_token_id=None,
              bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
OMIT = object()  # a COMMON key a family's config does not have (left out of its config.json)
# epsilons that are no library default (1e-5, 1e-6, Keras 1e-3): a reader that ignores the file's shows in float64
NEOX = dict(hidden_size=96, num_key_value_heads=OMIT, rms_norm_eps=OMIT, layer_norm_eps=2e-4)
FALCON = dict(NEOX, layer_norm_eps=OMIT, layer_norm_epsilon=2e-4, intermediate_size=OMIT, ffn_hidden_size=37,
              num_kv_heads=None)
BLOOM = dict(NEOX, layer_norm_eps=OMIT, layer_norm_epsilon=1e-5, intermediate_size=OMIT, num_attention_heads=OMIT,
             n_head=6, num_hidden_layers=OMIT, n_layer=2, max_position_embeddings=OMIT)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
MODELS = {  # id -> (transformers causal-LM class, config class, its settings)
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(head_dim=16, attention_bias=True, rope_parameters=LLAMA3)),
    "llama-linear": ("LlamaForCausalLM", "LlamaConfig",
                     dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    "llama-yarn": ("LlamaForCausalLM", "LlamaConfig",
                   dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                         "original_max_position_embeddings": 16})),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(head_dim=16, sliding_window=5)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=16)),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(head_dim=16, hidden_act="gelu_pytorch_tanh",
                                                      tie_word_embeddings=True)),
    "phi3": ("Phi3ForCausalLM", "Phi3Config",
             dict(rms_norm_eps=2e-4,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    # LayerNorms with a bias: biases on every linear and a window (Starcoder2), q/k/v biases over a rotary quarter of
    # each head, StableLM's default when config.json names none (StableLM)
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config", dict(sliding_window=5, norm_epsilon=2e-4)),
    "stablelm": ("StableLmForCausalLM", "StableLmConfig", dict(use_qkv_bias=True, hidden_size=96,
                                                                   layer_norm_eps=2e-4)),
    # attention and feed-forward side by side on input_layernorm (StableLM's use_parallel_residual)
    "stablelm-parallel": ("StableLmForCausalLM", "StableLmConfig", dict(use_parallel_residual=True, hidden_size=96)),
    # learned positions at +2 with LayerNorms before each sublayer and at the end, or after each (OPT-350m's)
    "opt": ("OPTForCausalLM", "OPTConfig", dict(ffn_dim=37)),
    "opt-post-ln": ("OPTForCausalLM", "OPTConfig", dict(ffn_dim=37, do_layer_norm_before=False)),
    # attention and feed-forward side by side, each with its LayerNorm, over a rotary half of each head of 16 (q/k/v
    # fused per head); one after the other, without attention biases, tied (GPT-NeoX)
    "gpt-neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(**NEOX, rope_parameters={
        "rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5})),
    "gpt-neox-sequential": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(**NEOX, use_parallel_residual=False,
                                                                        attention_bias=False, tie_word_embeddings=True)),
    # one LayerNorm read by attention and feed-forward side by side, biases everywhere (lm_head's too), grouped
    # heads of 16 with a rotary 0.5 of each, PhiConfig's default; with qk_layernorm, tied and over a quarter (Phi)
    "phi": ("PhiForCausalLM", "PhiConfig", dict(NEOX, num_key_value_heads=2, hidden_act="gelu_new")),
    "phi-qk-layernorm": ("PhiForCausalLM", "PhiConfig", dict(NEOX, qk_layernorm=True, tie_word_embeddings=True,
                                                             rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 10000.0,
                                                                              "partial_rotary_factor": 0.25})),
    # one LayerNorm read side by side, rotary positions on adjacent pairs of a half of each head of 16, no attention
    # biases, lm_head with one (GPT-J)
    "gptj": ("GPTJForCausalLM", "GPTJConfig", dict(NEOX, intermediate_size=OMIT, n_inner=37, rotary_dim=8,
                                                   layer_norm_eps=OMIT, layer_norm_epsilon=2e-4)),
    # LayerNorms without parameters and q/k/v clamped (OLMo); norms after the sublayers only and q/k norms over all
    # heads (OLMo 2); the four multipliers (Granite)
    "olmo": ("OlmoForCausalLM", "OlmoConfig", dict(clip_qkv=0.3, attention_bias=True)),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(rms_norm_eps=2e-4)),
    "granite": ("GraniteForCausalLM", "GraniteConfig", dict(head_dim=16, embedding_multiplier=3.0,
                                                            residual_multiplier=0.4, attention_multiplier=0.3,
                                                            logits_scaling=2.5, mlp_bias=True)),
    # GPT-2's blocks with separate q/k/v without biases, unscaled scores, a global and a local layer (window 5)
    "gpt-neo": ("GPTNeoForCausalLM", "GPTNeoConfig", dict(attention_types=[[["global", "local"], 1]], window_size=5,
                                                          num_key_value_heads=None, rms_norm_eps=None,
                                                          layer_norm_epsilon=2e-4)),
    # GPT-J's model with q, v, k fused in 4 shards of a head each (CodeGen)
    "codegen": ("CodeGenForCausalLM", "CodeGenConfig", dict(NEOX, hidden_size=64, num_attention_heads=4,
                                                            intermediate_size=OMIT, n_inner=37, rotary_dim=8,
                                                            layer_norm_eps=OMIT, layer_norm_epsilon=2e-4)),
    # one key/value head, attention and feed-forward side by side on one LayerNorm, no biases, tied (Falcon-7B); the
    # new decoder: ln_attn and ln_mlp side by side, 2 key/value groups fused with their query heads, biases (Falcon-40B)
    "falcon-7b": ("FalconForCausalLM", "FalconConfig", dict(FALCON, tie_word_embeddings=True, rope_parameters={
        "rope_type": "default", "rope_theta": 5000.0})),
    "falcon-40b": ("FalconForCausalLM", "FalconConfig", dict(FALCON, new_decoder_architecture=True, num_kv_heads=2,
                                                             bias=True)),
    # one sublayer after the other, q/k/v fused per head, biases (Falcon-RW)
    "falcon-rw": ("FalconForCausalLM", "FalconConfig", dict(FALCON, multi_query=False, parallel_attn=False, bias=True)),
    # ALiBi over 6 heads of 16 (slopes of 4 heads, then every other of 8), an embedding LayerNorm, fused q/k/v per
    # head, tied (BLOOM); untied
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(BLOOM, tie_word_embeddings=True)),
    "bloom-untied": ("BloomForCausalLM", "BloomConfig", dict(BLOOM)),
    # ALiBi in place of rotary positions, added before the scaling, one sublayer after the other, tied (Falcon-RW-1B);
    # side by side on one key/value head, untied (Falcon-7B's form)
    # (at 1e-5: keras-hub 0.32's Falcon layers normalize at 1e-5 whatever it says, test_hf_to_kerashub)
    "falcon-rw-alibi": ("FalconForCausalLM", "FalconConfig", dict(FALCON, multi_query=False, parallel_attn=False,
                                                                  bias=True, alibi=True, tie_word_embeddings=True,
                                                                  layer_norm_epsilon=1e-5)),
    "falcon-7b-alibi": ("FalconForCausalLM", "FalconConfig", dict(FALCON, alibi=True)),
    # 12 heads of 8, whose slopes transformers' Falcon rounds to bfloat16 (alibi_bfloat16)
    "falcon-rw-alibi-12": ("FalconForCausalLM", "FalconConfig", dict(FALCON, num_attention_heads=12, alibi=True,
                                                                     multi_query=False, parallel_attn=False)),
    # one bias-free LayerNorm read side by side, adjacent-pair rotary, q/k/v/o biases, tied, logits times 0.25
    # (Cohere)
    "cohere": ("CohereForCausalLM", "CohereConfig", dict(rms_norm_eps=OMIT, layer_norm_eps=1e-5, attention_bias=True,
                                                         tie_word_embeddings=True, logit_scale=0.25)),
    # what the KerasHub presets can hold (test_hf_to_kerashub.py): the llama3 rope without biases or a head_dim,
    # Gemma at its fixed eps of 1e-6, Phi-3 with full rotary and longrope (11 tokens take the long factors)
    "llama3": ("LlamaForCausalLM", "LlamaConfig", dict(rope_parameters=LLAMA3)),
    "gemma-eps-1e-6": ("GemmaForCausalLM", "GemmaConfig", dict(head_dim=16, hidden_act="gelu_pytorch_tanh",
                                                               rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "phi3-longrope": ("Phi3ForCausalLM", "Phi3Config", dict(original_max_position_embeddings=8, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.2, 1.5, 1.9],
        "long_factor": [1.1, 2.0, 3.1, 3.9], "original_max_position_embeddings": 8})),
}
_cache: dict = {}


def hf_model(name: str, tmp_path_factory):
    """`(transformers model in eval mode, its save_pretrained directory)`, built once per session; every parameter
    perturbed, so that a norm read as `w` instead of `1 + w`, or a swapped bias, cannot hide behind init values."""
    if name not in _cache:
        cls_name, config_name, settings = MODELS[name]
        torch.manual_seed(sum(map(ord, name)))
        config = getattr(transformers, config_name)(**{k: v for k, v in {**COMMON, **settings}.items()
                                                        if v is not OMIT})
        model = getattr(transformers, cls_name)(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        path = tmp_path_factory.mktemp(name) / "model"
        model.save_pretrained(path)
        _cache[name] = model, path
    return _cache[name]


def ids(seed: int = 0, length: int = 11) -> np.ndarray:
    """`(2, length)` ids with 0 in them (every id is a real token: these models take padding as a mask)."""
    out = np.random.default_rng(seed).integers(0, VOCAB, size=(2, length))
    out[0, 3] = out[1, 0] = 0
    return out


def hf_logits(model, src: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(src)).logits.double().numpy()


@pytest.mark.parametrize("name", list(MODELS))
def test_float64_reference_matches_transformers_in_float64(name, tmp_path_factory):
    """transformers in float64, with the parts it keeps in float32 even then (rotary angles, RMSNorm, Gemma's
    embedding scale) computed in float64 (`source.exact_float64`, as verify's built-in source does)."""
    import copy

    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    model64 = copy.deepcopy(model).double()
    exact_float64(model64, loaded.config)
    fix = hf_family(loaded.format).float64_fix  # what the family keeps in float32 beyond those (GPT-J's tables,
    # OLMo's LayerNorms)
    if fix is not None:
        fix.apply(model64, loaded.config)
    src = ids()
    actual = rn.Transformer(loaded.config, loaded.weights, np.float64)(src)
    np.testing.assert_allclose(actual, hf_logits(model64, src), rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", ["transformers", "torch_impl", "tf_impl"])
@pytest.mark.parametrize("name", list(MODELS))
def test_float32_outputs_match_the_reference(name, impl, tmp_path_factory):
    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    src = ids()
    desired = rn.Transformer(loaded.config, loaded.weights, np.float64)(src)
    floor = np.max(np.abs(rn.Transformer(loaded.config, loaded.weights, np.float32)(src) - desired))
    if impl == "transformers":
        actual = hf_logits(model, src)
    elif impl == "torch_impl":
        import torch_impl

        with torch.no_grad():
            actual = torch_impl.Transformer.from_reference(loaded.config, loaded.weights)(src).double().numpy()
    else:
        import tf_impl

        actual = np.asarray(tf_impl.Transformer.from_reference(loaded.config, loaded.weights, dtype="float32")(src),
                            np.float64)
    np.testing.assert_allclose(actual, desired, rtol=0, atol=property_atol("float32", floor))
    assert np.max(np.abs(actual - desired)) <= 1e-4


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen3", "gemma", "phi3", "starcoder2", "stablelm",
                                  "opt", "gpt-neox", "phi-qk-layernorm", "gptj", "stablelm-parallel", "codegen",
                                  "olmo", "olmo2", "granite", "gpt-neo", "falcon-7b", "falcon-40b", "bloom",
                                  "falcon-rw-alibi", "falcon-rw-alibi-12", "cohere"])
def test_verify_judges_the_directory_against_transformers(name, tmp_path_factory, tmp_path, capsys):
    _, path = hf_model(name, tmp_path_factory)
    report = tmp_path / "report.json"
    assert main(["verify", str(path), "--src-len", "11", "--json", str(report)]) == 0, capsys.readouterr().err
    verdict = json.loads(report.read_text())["verdict"]
    assert verdict.startswith("PASS: matches the source (transformers"), verdict


@pytest.mark.parametrize("name", list(MODELS))
def test_export_reloads_in_transformers_with_the_same_logits(name, tmp_path_factory, tmp_path):
    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    out = tmp_path / "export"
    formats.save(out, loaded.config, dict(loaded.weights), loaded.format)  # hf-llama, ...: the family it came as
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == json.loads((path / "config.json").read_text())["model_type"]
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    src = ids(1)
    np.testing.assert_array_equal(hf_logits(again, src), hf_logits(model, src))


@pytest.mark.parametrize("name", ["llama", "llama-linear", "llama-yarn", "mistral", "qwen2", "qwen3", "gemma",
                                  "phi3", "starcoder2", "stablelm", "opt", "opt-post-ln", "gpt-neox", "phi", "gptj",
                                  "olmo", "olmo2", "granite", "gpt-neo", "falcon-7b", "bloom",
                                  "falcon-rw-alibi", "cohere"])
def test_greedy_generation_matches_transformers_for_32_tokens(name, tmp_path_factory):
    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    prompt = ids(2, length=4)
    with torch.no_grad():
        expected = {cache: model.generate(torch.as_tensor(prompt), attention_mask=torch.ones(2, 4, dtype=torch.long),
                                          do_sample=False, max_new_tokens=32, min_new_tokens=32, use_cache=cache,
                                          pad_token_id=0).numpy() for cache in (True, False)}
    np.testing.assert_array_equal(expected[True], expected[False])
    for label, stepper in steppers(loaded.config, loaded.weights).items():
        ours = rn.generate(stepper, 2, prompt=prompt, eos_id=VOCAB, pad_id=None, max_new_tokens=32)  # no end token
        np.testing.assert_array_equal(ours, expected[True], err_msg=label)


@pytest.mark.parametrize("field, value, named", [
    ("rope_parameters", {"rope_type": "su-scaled", "rope_theta": 10000.0}, "rope type 'su-scaled'"),
    ("rope_parameters", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0, "beta": 1}, "['beta']"),
    ("layer_types", ["full_attention", "sliding_attention"], "layer_types mixes"),
    ("pretraining_tp", 2, "pretraining_tp=2"),
    ("qk_layernorm", True, "qk_layernorm=True"),
    ("num_key_value_heads", 2, "num_key_value_heads=2"),  # GPT-NeoX: transformers reads none
    ("head_dim", 8, "head_dim=8 beside qk_layernorm"),  # Phi: its q/k LayerNorms are hidden_size / heads wide
    ("rotary_dim", None, "rotary_dim=None"),  # GPT-J: tables n_embd wide, which one head alone could use
    ("clip_qkv", -1.0, "clip_qkv"),
    ("use_sliding_window", True, "use_sliding_window=True"),
    ("use_bidirectional_attention", True, "use_bidirectional_attention=True"),
    ("attention_types", [[["global", "sparse"], 1]], "attention_types"),
    ("n_head", 2, "n_head=2"),  # CodeGen: 4 shards of heads
    ("num_kv_heads", 3, "num_kv_heads=3"),  # Falcon-RW: groups only in new_decoder_architecture
    ("apply_residual_connection_post_layernorm", True, "apply_residual_connection_post_layernorm=true"),  # BLOOM
    ("use_qk_norm", True, "use_qk_norm=True"),  # Cohere: per-head q/k norm weights
])
def test_a_config_field_we_do_not_implement_is_refused(field, value, named, tmp_path_factory, tmp_path, capsys):
    import shutil

    owner = {"layer_types": "qwen2", "qk_layernorm": "stablelm", "num_key_value_heads": "gpt-neox",
             "head_dim": "phi-qk-layernorm", "rotary_dim": "gptj", "n_head": "codegen", "clip_qkv": "olmo",
             "use_sliding_window": "olmo2", "use_bidirectional_attention": "granite", "attention_types": "gpt-neo",
             "num_kv_heads": "falcon-rw", "apply_residual_connection_post_layernorm": "bloom", "use_qk_norm": "cohere"}
    _, path = hf_model(owner.get(field, "llama"), tmp_path_factory)
    copy = tmp_path / "edited"
    shutil.copytree(path, copy)
    config = json.loads((copy / "config.json").read_text())
    config[field] = value
    (copy / "config.json").write_text(json.dumps(config))
    capsys.readouterr()  # transformers' own progress bars, if this test built the model just now
    assert main(["convert", str(copy), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err


def test_gpt_neox_reads_its_older_rotary_keys():
    """`rotary_pct` and `rotary_emb_base` (transformers 4's names) where config.json has no rope_parameters, 0.25 of
    each head where it names neither, as GPTNeoXConfig reads them; `rope_parameters` wins over both."""
    from transformer_parity.layouts import hf_gpt_neox

    hf = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": VOCAB, "hidden_size": 96,
          "num_attention_heads": 6, "num_hidden_layers": 2, "intermediate_size": 37, "max_position_embeddings": 64}
    keys = ["embed_out.weight"]
    config = hf_gpt_neox.config_from_hf({**hf, "rotary_pct": 0.5, "rotary_emb_base": 500.0}, keys)[0]
    assert (config.rotary_fraction, config.rope_theta, config.parallel_residual) == (0.5, 500.0, True)
    assert hf_gpt_neox.config_from_hf(hf, keys)[0].rotary_fraction == 0.25
    newer = {**hf, "rotary_pct": 0.5, "rope_parameters": {"rope_theta": 20.0, "partial_rotary_factor": 1.0}}
    read = hf_gpt_neox.config_from_hf(newer, keys)[0]
    assert (read.rotary_fraction, read.rope_theta) == (1.0, 20.0)


def test_falcon_reads_its_three_forms_and_refuses_what_transformers_cannot_run():
    """FalconDecoderLayer's flags as `(parallel_residual, ffn_shares_norm, num_kv_heads)`, written back as the same
    form (new_decoder_architecture wherever the older decoder cannot hold the key/value groups); the flag mixes
    transformers builds but cannot run and a partial rotary factor refused naming the field; ALiBi read in place of
    rotary positions, scaled with the scores, and written back."""
    import dataclasses

    from transformer_parity.layouts import hf_falcon

    hf = {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "vocab_size": VOCAB, "hidden_size": 96,
          "num_attention_heads": 6, "num_hidden_layers": 2, "max_position_embeddings": 64}
    forms = [({}, (True, True, 1)), ({"multi_query": False}, (True, True, None)),
             ({"parallel_attn": False, "multi_query": False}, (False, False, None)),
             ({"new_decoder_architecture": True, "num_kv_heads": 2}, (True, False, 2)),
             ({"new_decoder_architecture": True, "num_kv_heads": 3, "num_ln_in_parallel_attn": 1}, (True, True, 3))]
    for settings, expected in forms:
        config = hf_falcon.config_from_hf({**hf, **settings}, ["lm_head.weight"])[0]
        assert (config.parallel_residual, config.ffn_shares_norm, config.num_kv_heads) == expected, settings
        written = hf_falcon.config_to_hf(config)[0]
        assert hf_falcon.config_from_hf(written, ["lm_head.weight"])[0] == config, settings
    grouped = dataclasses.replace(config, parallel_residual=False, ffn_shares_norm=False)  # groups one after the other
    assert any(p.startswith("num_kv_heads=3") for p in hf_falcon.export_problems(grouped))
    config = hf_falcon.config_from_hf({**hf, "alibi": True, "parallel_attn": False, "multi_query": False},
                                      ["lm_head.weight"])[0]
    assert hf_falcon.config_from_hf(hf_falcon.config_to_hf(config)[0], ["lm_head.weight"])[0] == config
    assert (config.positional, config.alibi, config.alibi_scaled) == ("none", True, True)
    assert any(p.startswith("alibi_scaled=False") for p in hf_falcon.export_problems(
        dataclasses.replace(config, alibi_scaled=False)))
    for settings, named in [({"new_decoder_architecture": True, "parallel_attn": False}, "parallel_attn=false"),
                            ({"num_ln_in_parallel_attn": 2}, "num_ln_in_parallel_attn=2"),
                            ({"new_decoder_architecture": True, "num_kv_heads": 4}, "num_kv_heads=4"),
                            ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                  "partial_rotary_factor": 0.5}}, "partial_rotary_factor=0.5")]:
        with pytest.raises(ValueError, match=named):
            hf_falcon.config_from_hf({**hf, **settings}, ["lm_head.weight"])
