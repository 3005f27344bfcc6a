"""The mixture-of-experts families people port — Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-OSS — against transformers itself: tiny
random models with odd sizes (6 query heads over 2 key/value heads of 16, 4 experts of 19 or 37, top-2, a shared
expert of 23, a dense layer among the expert layers, a vocabulary of 53; GPT-OSS's sinks, biases and a clamp the GLU's
inputs cross, its sliding and full layers), every weight perturbed (norms, biases, sinks and routers away from their
init), id 0 in the inputs, a window shorter than the input. Each is saved with `save_pretrained` (one tensor per
expert; GPT-OSS's stacked per layer), imported, run by the float64 reference and both twins, verified by the CLI
against transformers (its experts run by its eager implementation, the only one that takes float64), exported back
and reloaded by transformers, and decoded greedily; a router that picks other experts is named at its layer's routing
record."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main
from transformer_parity.layouts import hf_family
from transformer_parity.verify.source_hf import exact_float64

from .support import faults
from .support.greedy import steppers
from .tolerances import property_atol

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB = 53
COMMON = dict(vocab_size=VOCAB, hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
              num_hidden_layers=2, intermediate_size=37, max_position_embeddings=64, rms_norm_eps=1e-5,
              pad_token_id=None, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
MODELS = {  # id -> (transformers causal-LM class, config class, its settings)
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2,
                                                            sliding_window=5)),
    "qwen2-moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2,
                                                                moe_intermediate_size=19,
                                                                shared_expert_intermediate_size=23)),
    "qwen3-moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(num_hidden_layers=3, num_experts=4,
                                                                num_experts_per_tok=2, moe_intermediate_size=19,
                                                                norm_topk_prob=True, mlp_only_layers=[1],
                                                                tie_word_embeddings=True)),
    "gpt-oss": ("GptOssForCausalLM", "GptOssConfig", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
                                                          swiglu_limit=0.5)),
}
_cache: dict = {}


def hf_model(name: str, tmp_path_factory):
    """`(transformers model in eval mode, its save_pretrained directory)`, built once per session, every parameter
    perturbed; its experts run by transformers' eager implementation (its default, grouped_mm, takes neither float64
    nor these odd widths)."""
    if name not in _cache:
        cls_name, config_name, settings = MODELS[name]
        torch.manual_seed(sum(map(ord, name)))
        model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**{**COMMON, **settings})).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        path = tmp_path_factory.mktemp(name) / "model"
        model.save_pretrained(path)
        model.set_experts_implementation("eager")
        _cache[name] = model, path
    return _cache[name]


def ids(seed: int = 0, length: int = 11) -> np.ndarray:
    """`(2, length)` ids with 0 in them (every id is a real token: these models take padding as a mask)."""
    out = np.random.default_rng(seed).integers(0, VOCAB, size=(2, length))
    out[0, 3] = out[1, 0] = 0
    return out


def hf_run(model, src: np.ndarray) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """transformers' logits, and each expert layer's chosen experts `(B, T, k)`, ascending (its routers' last
    output)."""
    chosen: dict[int, np.ndarray] = {}
    routers = {i: getattr(layer.mlp, "router", None) or layer.mlp.gate  # GPT-OSS's `router`, the others' `gate`
               for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")}
    hooks = [routers[i].register_forward_hook(
        lambda module, args, out, i=i: chosen.__setitem__(i, out[-1].sort(-1).values.reshape(*src.shape, -1).numpy()))
        for i in routers]
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.as_tensor(src)).logits.double().numpy()
    finally:
        for hook in hooks:
            hook.remove()
    return logits, chosen


def float64_copy(model, config: rn.TransformerConfig, fmt: str | None = None):
    """transformers in float64, with the parts it keeps in float32 even then (rotary angles, RMSNorm, the routers'
    softmax) computed in float64 (the family `fmt`'s `float64_fix`, then `source_hf.exact_float64`, as verify's
    built-in source does)."""
    model64 = copy.deepcopy(model).double()
    fix = hf_family(fmt).float64_fix if fmt is not None else None
    if fix is not None:
        fix.apply(model64, config)
    exact_float64(model64, config)
    return model64


@pytest.mark.parametrize("name", list(MODELS))
def test_it_reads_the_mixture_each_family_computes(name, tmp_path_factory):
    _, path = hf_model(name, tmp_path_factory)
    config = formats.load(path).config
    expected = {"mixtral": dict(num_experts=4, experts_per_token=2, expert_d_ff=None, router_renormalize=True,
                                shared_expert_d_ff=None, expert_layers=None, sliding_window=5),
                "qwen2-moe": dict(expert_d_ff=19, router_renormalize=False, shared_expert_d_ff=23, qkv_bias=True),
                "qwen3-moe": dict(expert_d_ff=19, router_renormalize=True, expert_layers=(True, False, True),
                                  qk_norm=True, tie_embeddings=True),
                "gpt-oss": dict(num_experts=4, experts_per_token=2, router_renormalize=False, router_bias=True,
                                ffn_bias=True, attention_bias=True, attention_sinks=True, glu_limit=0.5,
                                glu_alpha=1.702, glu_up_offset=1.0, sliding_window=5,
                                layer_kinds=("sliding", "full"), rope_theta=150000.0)}[name]
    assert {k: getattr(config, k) for k in expected} == expected
    assert (config.num_kv_heads, config.head_dim, config.router_softmax) == (
        2, 16, "after_topk" if name == "gpt-oss" else "before_topk")


@pytest.mark.parametrize("name", list(MODELS))
def test_float64_reference_matches_transformers_in_float64_routing_alike(name, tmp_path_factory):
    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    src = ids()
    trace = rn.Transformer(loaded.config, loaded.weights, np.float64).trace(src)
    logits, chosen = hf_run(float64_copy(model, loaded.config, loaded.format), src)
    np.testing.assert_allclose(trace["logits"], logits, rtol=0, atol=1e-10)
    assert sorted(chosen) == [i for i in range(loaded.config.num_decoder_layers) if loaded.config.layer_experts(i)]
    for i, experts in chosen.items():
        np.testing.assert_array_equal(trace[f"decoder.layers.{i}.ffn.routing"], experts, err_msg=f"layer {i}")


@pytest.mark.parametrize("impl", ["transformers", "torch_impl", "tf_impl"])
@pytest.mark.parametrize("name", list(MODELS))
def test_float32_outputs_match_the_reference(name, impl, tmp_path_factory):
    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    src = ids()
    desired = rn.Transformer(loaded.config, loaded.weights, np.float64)(src)
    floor = np.max(np.abs(rn.Transformer(loaded.config, loaded.weights, np.float32)(src) - desired))
    if impl == "transformers":
        actual = hf_run(model, src)[0]
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


@pytest.mark.parametrize("name", list(MODELS))
def test_verify_judges_the_directory_against_transformers(name, tmp_path_factory, tmp_path, capsys):
    _, path = hf_model(name, tmp_path_factory)
    report = tmp_path / "report.json"
    assert main(["verify", str(path), "--src-len", "11", "--json", str(report)]) == 0, capsys.readouterr().err
    result = json.loads(report.read_text())
    assert result["verdict"].startswith("PASS: matches the source (transformers"), result["verdict"]
    routing = [r for r in result["rows"] if r["sublayer"].endswith(".routing")]
    sources = {r["backends"][0] for r in routing if r["kind"] == "source"}
    assert {"transformers-f32", "transformers-f64"} <= sources and all(r["max_abs_err"] == 0 for r in routing)


@pytest.mark.parametrize("name", list(MODELS))
def test_export_reloads_in_transformers_with_the_same_logits(name, tmp_path_factory, tmp_path):
    from safetensors.numpy import load_file

    model, path = hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    out = tmp_path / "export"
    formats.save(out, loaded.config, dict(loaded.weights), loaded.format)
    assert json.loads((out / "config.json").read_text())["model_type"] == \
        json.loads((path / "config.json").read_text())["model_type"]
    source, written = load_file(path / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(written) <= set(source) and all(np.array_equal(written[k], source[k]) for k in written)
    again = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    again.set_experts_implementation("eager")
    src = ids(1)
    np.testing.assert_array_equal(hf_run(again, src)[0], hf_run(model, src)[0])


@pytest.mark.parametrize("name", list(MODELS))
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


def test_equal_router_scores_choose_the_experts_transformers_chooses(tmp_path_factory):
    """A router of zeros scores every expert alike: which two of four experts run is torch.topk's tie-break, which
    the reference replays (`reference_numpy.moe`) and both twins follow."""
    model, path = hf_model("mixtral", tmp_path_factory)
    loaded = formats.load(path)
    tied = copy.deepcopy(model)
    with torch.no_grad():
        tied.model.layers[1].mlp.gate.weight.zero_()
    weights = dict(loaded.weights, **{"decoder.layers.1.ffn.router.kernel": np.zeros((48, 4), np.float32)})
    src = ids(3)
    trace = rn.Transformer(loaded.config, weights).trace(src)
    logits, chosen = hf_run(float64_copy(tied, loaded.config), src)
    np.testing.assert_array_equal(trace["decoder.layers.1.ffn.routing"], chosen[1])
    np.testing.assert_allclose(trace["logits"], logits, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(hf_run(tied, src)[1][1], chosen[1])  # and so does transformers in float32


@pytest.mark.parametrize("name, field, value, named", [
    ("mixtral", "num_experts_per_tok", 5, "num_experts_per_tok=5 must be from 1 to the 4 experts"),
    ("mixtral", "num_local_experts", 10**9, "num_local_experts=1000000000 cannot match a file"),
    ("mixtral", "router_jitter_noise", -0.5, "router_jitter_noise must be >= 0"),
    ("qwen2-moe", "decoder_sparse_step", 0, "decoder_sparse_step must be >= 1"),
    ("qwen2-moe", "layer_types", ["full_attention", "sliding_attention"], "layer_types mixes"),
    ("qwen3-moe", "mlp_only_layers", [0, 7], "mlp_only_layers must list layer indices below num_hidden_layers=3"),
    ("qwen3-moe", "num_local_experts", 6, "num_experts=4 and num_local_experts=6 disagree"),
    ("gpt-oss", "swiglu_limit", -1.0, "swiglu_limit=-1.0 must be positive"),
    ("gpt-oss", "layer_types", ["sliding_attention", "chunked_attention"], "layer_types=['sliding_attention', "
                                                                           "'chunked_attention'] is not supported"),
], ids=["k-above-experts", "experts-beyond-the-file", "jitter", "sparse-step", "mixed-windows", "dense-layers",
        "two-counts", "glu-limit", "chunked-layers"])
def test_a_config_field_we_do_not_compute_is_refused_in_one_line(name, field, value, named, tmp_path_factory,
                                                                  tmp_path, capsys):
    _, path = hf_model(name, tmp_path_factory)
    edited = tmp_path / "edited"
    shutil.copytree(path, edited)
    config = json.loads((edited / "config.json").read_text())
    config.setdefault("num_experts", config.get("num_local_experts"))  # both of Qwen3-MoE's names, where it has two
    config[field] = value
    if name != "qwen3-moe":
        config.pop("num_experts" if name in ("mixtral", "gpt-oss") else "num_local_experts", None)
    (edited / "config.json").write_text(json.dumps(config))
    capsys.readouterr()  # transformers' own progress bars, if this test built the model just now
    assert main(["convert", str(edited), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err


def test_a_port_that_routes_otherwise_is_named_at_the_routing_record_of_its_layer(tmp_path_factory, tmp_path,
                                                                                 capsys):
    """The port's router numbers two experts the other way round in its last layer: verify names that layer's
    routing record as the first divergence (and the router's weights, compared first)."""
    _, path = hf_model("mixtral", tmp_path_factory)
    loaded = formats.load(path)
    bad, expected = faults.apply_weight_fault("swapped-router-columns", loaded.config, dict(loaded.weights))
    formats.save(tmp_path / "port", loaded.config, bad, loaded.format)
    report = tmp_path / "report.json"
    capsys.readouterr()
    assert main(["verify", str(path), str(tmp_path / "port"), "--src-len", "11", "--json", str(report)]) == 1
    result = json.loads(report.read_text())
    assert expected == "decoder.layers.1.ffn.routing" and result["first_divergence"] == expected
    assert [r["name"] for r in result["weights"]["rows"] if not r["passed"]] == ["decoder.layers.1.ffn.router.kernel"]


def test_gpt_oss_clamp_and_sinks_change_what_these_inputs_compute(tmp_path_factory):
    """The tiny GPT-OSS's GLU inputs cross its clamp of 0.5 and its sinks take weight on these inputs: without
    either, the reference's logits move far beyond the 1e-10 by which it matches transformers."""
    _, path = hf_model("gpt-oss", tmp_path_factory)
    loaded = formats.load(path)
    src = ids()
    logits = rn.Transformer(loaded.config, loaded.weights)(src)
    unclamped = rn.Transformer(loaded.config.replace(glu_limit=None), loaded.weights)(src)
    sinkless = dict(loaded.weights, **{n: np.full_like(w, -1e4) for n, w in loaded.weights.items()
                                       if n.endswith(".sinks")})  # exp(-1e4) = 0: the plain softmax
    assert np.max(np.abs(unclamped - logits)) > 1e-3
    assert np.max(np.abs(rn.Transformer(loaded.config, sinkless)(src) - logits)) > 1e-3


@pytest.mark.parametrize("source, target, named", [
    ("gpt-oss", "hf-mixtral", "attention_sinks=True"),
    ("mixtral", "hf-gpt-oss", "router_softmax='before_topk'"),
])
def test_an_export_to_a_family_without_the_blocks_is_refused_naming_them(source, target, named, tmp_path_factory,
                                                                         tmp_path):
    _, path = hf_model(source, tmp_path_factory)
    loaded = formats.load(path)
    with pytest.raises(ValueError, match=named.replace("(", "\\(")):
        formats.save(tmp_path / "out", loaded.config, dict(loaded.weights), target)
