"""KerasHub's Llama (and Llama3, the same model) against keras_hub itself, and transformers and keras_hub against each
other: a tiny random preset (6 query heads over 2 key/value heads, an intermediate size of 37, a vocabulary of 53,
every weight perturbed) imported, verified against keras_hub (the built-in source), exported back to a preset that
keras_hub loads and to a Hugging Face directory transformers loads, and `verify HF_DIR KERASHUB_PRESET` naming the first
layer where the two libraries part."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main

keras_hub = pytest.importorskip("keras_hub")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB = 53
_cache: dict = {}


def preset(tmp_path_factory, tied: bool = False, llama3: bool = False):
    """`(LlamaCausalLM, its save_to_preset directory)`, built once per session."""
    key = (tied, llama3)
    if key not in _cache:
        rope = dict(rope_frequency_adjustment_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                    rope_pretraining_sequence_length=16, rope_max_wavelength=500000) if llama3 else {}
        cls = keras_hub.models.Llama3Backbone if llama3 else keras_hub.models.LlamaBackbone
        backbone = cls(vocabulary_size=VOCAB, num_layers=2, num_query_heads=6, hidden_dim=48, intermediate_dim=37,
                       num_key_value_heads=2, layer_norm_epsilon=1e-5, tie_word_embeddings=tied, **rope)
        task = (keras_hub.models.Llama3CausalLM if llama3 else keras_hub.models.LlamaCausalLM)(backbone=backbone,
                                                                                               preprocessor=None)
        rng = np.random.default_rng(7)
        for variable in task.weights:
            variable.assign(variable.numpy() + 0.1 * rng.standard_normal(variable.shape).astype("float32"))
        path = tmp_path_factory.mktemp("kerashub-llama") / "preset"
        task.save_to_preset(str(path))
        _cache[key] = task, path
    return _cache[key]


def ids(seed: int = 0) -> np.ndarray:
    out = np.random.default_rng(seed).integers(0, VOCAB, size=(2, 11))
    out[0, 3] = 0
    return out


def logits(task, src) -> np.ndarray:
    return np.asarray(task({"token_ids": src, "padding_mask": np.ones_like(src)}), np.float64)


@pytest.mark.parametrize("tied, llama3", [(False, False), (True, False), (False, True)],
                         ids=["untied", "tied", "llama3"])
def test_import_matches_keras_hub_and_exports_both_ways(tied, llama3, tmp_path_factory, tmp_path):
    task, path = preset(tmp_path_factory, tied, llama3)
    loaded = formats.load(path)
    assert loaded.format == "kerashub-llama" and loaded.config.tie_embeddings == tied
    src = ids()
    expected = logits(task, src)
    ours = rn.Transformer(loaded.config, loaded.weights, np.float64)(src)
    assert np.max(np.abs(ours - expected)) <= 1e-4
    formats.save(tmp_path / "again", loaded.config, dict(loaded.weights), "kerashub")
    again = keras_hub.models.CausalLM.from_preset(str(tmp_path / "again"))
    np.testing.assert_array_equal(logits(again, src), expected)
    formats.save(tmp_path / "hf", loaded.config, dict(loaded.weights), "hf-llama")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(input_ids=torch.as_tensor(src)).logits.double().numpy()
    assert np.max(np.abs(theirs - expected)) <= 1e-4


def test_verify_judges_the_preset_against_keras_hub(tmp_path_factory, tmp_path):
    _, path = preset(tmp_path_factory)
    report = tmp_path / "r.json"
    assert main(["verify", str(path), "--src-len", "11", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["verdict"].startswith("PASS: matches the source (keras_hub LlamaCausalLM)")


def _hf_and_preset(tmp_path_factory, tmp_path):
    """A Hugging Face directory and the KerasHub preset converted from it (the same weights)."""
    _, path = preset(tmp_path_factory)
    loaded = formats.load(path)
    formats.save(tmp_path / "hf", loaded.config, dict(loaded.weights), "hf-llama")
    return tmp_path / "hf", path


def test_verify_a_directory_against_a_preset_runs_both_libraries(tmp_path_factory, tmp_path):
    hf, kh = _hf_and_preset(tmp_path_factory, tmp_path)
    report = tmp_path / "r.json"
    assert main(["verify", str(hf), str(kh), "--src-len", "11", "--json", str(report)]) == 0
    result = json.loads(report.read_text())
    assert "transformers LlamaForCausalLM and keras_hub LlamaCausalLM" in result["verdict"]
    between = [r for r in result["rows"] if r["backends"] == ["keras_hub-f32", "transformers-f32"]]
    assert {r["sublayer"] for r in between} >= {"decoder.layers.0", "decoder.layers.1", "decoder.final_norm", "logits"}
    assert all(r["passed"] for r in between)


def test_where_the_libraries_part_is_named(tmp_path_factory, tmp_path):
    """The preset's second layer changed: keras_hub and transformers agree on layer 0 and part at layer 1."""
    import h5py

    hf, kh = _hf_and_preset(tmp_path_factory, tmp_path)
    changed = tmp_path / "changed"
    import shutil

    shutil.copytree(kh, changed)
    with h5py.File(changed / "model.weights.h5", "r+") as f:
        f["layers/llama_transformer_decoder_1/_feedforward_output_dense/vars/0"][...] *= 1.01
    report = tmp_path / "r.json"
    assert main(["verify", str(hf), str(changed), "--outputs-only", "--src-len", "11", "--json", str(report)]) == 1
    rows = json.loads(report.read_text())["rows"]
    between = {r["sublayer"]: r["passed"] for r in rows if r["backends"] == ["keras_hub-f32", "transformers-f32"]}
    assert between["decoder.layers.0"] and not between["decoder.layers.1"]


# --- the Llama-like families: Mistral (a window), Qwen (q/k/v biases, tied, a window), Qwen3 (QK-norm, head_dim) ------

DROP = object()  # a common setting (family_preset's) that the backbone does not take
FAMILIES = {
    "mistral": ("MistralBackbone", "MistralCausalLM", "hf-mistral", dict(sliding_window=5, head_dim=16)),
    "qwen": ("QwenBackbone", "QwenCausalLM", "hf-qwen2", dict(use_sliding_window_attention=True,
                                                                sliding_window_size=5, tie_word_embeddings=False)),
    "qwen-tied": ("QwenBackbone", "QwenCausalLM", "hf-qwen2", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Backbone", "Qwen3CausalLM", "hf-qwen3", dict(head_dim=16, sliding_window_size=5,
                                                                  tie_word_embeddings=False)),
    # the mixtures of experts: 4 experts, top-2 (Mixtral: always renormalized; Qwen3-MoE: renormalized by
    # norm_top_k_prob, its first layer dense; Qwen-MoE: not renormalized, a shared expert of 23)
    "mixtral": ("MixtralBackbone", "MixtralCausalLM", "hf-mixtral", dict(num_experts=4, top_k=2, sliding_window=5)),
    "qwen3-moe": ("Qwen3MoeBackbone", "Qwen3MoeCausalLM", "hf-qwen3-moe", dict(
        num_experts=4, top_k=2, moe_intermediate_dim=19, head_dim=16, norm_top_k_prob=True, sliding_window_size=5,
        layer_norm_epsilon=1e-6)),  # its q/k norms' epsilon (keras_hub's is always 1e-6)
    "qwen3-moe-dense": ("Qwen3MoeBackbone", "Qwen3MoeCausalLM", "hf-qwen3-moe", dict(
        num_experts=4, top_k=2, moe_intermediate_dim=19, head_dim=16, decoder_sparse_step=2, sliding_window_size=5,
        layer_norm_epsilon=1e-6, tie_word_embeddings=True)),  # layer 0 dense, not renormalized, tied
    # GPT-OSS: sinks, biases everywhere, a router with a bias over the k chosen, the clamped GLU (keras_hub's fixed
    # limit of 7, which these features stay under), the odd layer sliding within 4 (i - j <= 4: canonical 5), yarn x2
    "gpt-oss": ("GptOssBackbone", "GptOssCausalLM", "hf-gpt-oss", dict(num_experts=4, top_k=2, sliding_window=4,
                                                                       head_dim=16, rope_scaling_factor=2.0)),
    "qwen-moe": ("QwenMoeBackbone", "QwenMoeCausalLM", "hf-qwen2-moe", dict(
        num_experts=4, top_k=2, moe_intermediate_dim=19, shared_expert_intermediate_dim=23,
        use_sliding_window_attention=True, sliding_window_size=5)),
    # Gemma 3's text model: 6 layers (five sliding to a full one, each kind its own rotary base), q/k norms, post
    # norms, a logit soft cap, the full layers' positions scaled by 2
    "gemma3": ("Gemma3Backbone", "Gemma3CausalLM", "hf-gemma3-text", dict(
        image_size=None, num_layers=6, head_dim=16, use_post_ffw_norm=True, use_post_attention_norm=True,
        final_logit_soft_cap=30.0, use_sliding_window_attention=True, sliding_window_size=5, layer_norm_epsilon=1e-6,
        global_rope_scaling_factor=2.0)),
    # Gemma 2 (GemmaBackbone's own settings): 3 layers (the even ones sliding), post norms, both soft caps
    "gemma2": ("GemmaBackbone", "GemmaCausalLM", "hf-gemma2", dict(
        num_layers=3, head_dim=16, intermediate_dim=74, use_post_ffw_norm=True, use_post_attention_norm=True,
        final_logit_soft_cap=30.0, attention_logit_soft_cap=50.0, use_sliding_window_attention=True,
        sliding_window_size=5, layer_norm_epsilon=1e-6)),
    # SmolLM3: 3 layers, the middle one without rotary positions (NoPE)
    "smollm3": ("SmolLM3Backbone", "SmolLM3CausalLM", "hf-smollm3", dict(
        num_layers=3, num_query_heads=DROP, num_attention_heads=6, attention_bias=False, attention_dropout=0.0,
        rope_layer_enabled_list=[True, False, True], layer_types=["full_attention"] * 3, mlp_bias=False,
        max_position_embeddings=64, rope_theta=2e6, partial_rotary_factor=1.0)),
    # GPT-NeoX: the parallel residual (two LayerNorms), every projection biased, rotary on half of each head, the
    # tanh GELU, the head tied
    "gpt-neox": ("GPTNeoXBackbone", "GPTNeoXCausalLM", "hf-gpt-neox", dict(
        num_query_heads=DROP, num_key_value_heads=DROP, num_heads=6, rotary_percentage=0.5)),
    # OPT: GPT-2's pre-LN blocks with ReLU, positions from row 0 (transformers' from row 2), the head tied
    "opt": ("OPTBackbone", "OPTCausalLM", "hf-opt", dict(
        num_query_heads=DROP, num_key_value_heads=DROP, layer_norm_epsilon=DROP, num_heads=6, max_sequence_length=64)),
    # ALiBi over 6 heads of 16 beside the scaled scores, an embedding LayerNorm, the tanh GELU, 4 * hidden wide as
    # transformers' BLOOM always is (BLOOM); added before the scaling, one sublayer after the other, the exact GELU
    # (Falcon: transformers' Falcon-RW form with alibi=true)
    "bloom": ("BloomBackbone", "BloomCausalLM", "hf-bloom", dict(
        num_query_heads=DROP, num_key_value_heads=DROP, num_heads=6, hidden_dim=96, intermediate_dim=384)),
    "falcon": ("FalconBackbone", "FalconCausalLM", "hf-falcon", dict(
        num_query_heads=DROP, num_key_value_heads=DROP, num_attention_heads=6, hidden_dim=96)),
}


def family_preset(tmp_path_factory, name: str):
    """`(CausalLM, its save_to_preset directory)` of a tiny random member of family `name`, built once."""
    if name not in _cache:
        backbone_name, task_name, _, extra = FAMILIES[name]
        settings = {"vocabulary_size": VOCAB, "num_layers": 2, "num_query_heads": 6, "hidden_dim": 48,
                    "intermediate_dim": 37, "num_key_value_heads": 2, "layer_norm_epsilon": 1e-5, **extra}
        backbone = getattr(keras_hub.models, backbone_name)(**{k: v for k, v in settings.items() if v is not DROP})
        task = getattr(keras_hub.models, task_name)(backbone=backbone, preprocessor=None)
        rng = np.random.default_rng(11)
        for variable in task.weights:
            if "inv_freq" in variable.path:  # SmolLM3's rotary frequencies: a buffer, not a parameter
                continue
            variable.assign(variable.numpy() + 0.1 * rng.standard_normal(variable.shape).astype("float32"))
        path = tmp_path_factory.mktemp(name) / "preset"
        task.save_to_preset(str(path))
        _cache[name] = task, path
    return _cache[name]


def hf_config(name: str, config: rn.TransformerConfig) -> rn.TransformerConfig:
    """What the family's transformers export takes: KerasHub's Falcon computes ALiBi exactly, transformers' rounds it
    to bfloat16, which changes nothing for 6 heads over at most 256 positions (a preset has no maximum length: 2048
    is read, where the two part)."""
    return config.replace(max_len=256) if name == "falcon" else config


@pytest.mark.parametrize("name", FAMILIES)
def test_llama_like_families_import_verify_and_export_both_ways(name, tmp_path_factory, tmp_path):
    task, path = family_preset(tmp_path_factory, name)
    hf_format = FAMILIES[name][2]
    loaded = formats.load(path)
    assert loaded.format == ("kerashub-gemma" if name == "gemma2" else
                             "kerashub-" + name.removesuffix("-tied").removesuffix("-dense"))
    if name == "gemma2":
        assert loaded.config.layer_kinds == ("sliding", "full", "sliding") and loaded.config.post_norms
        assert (loaded.config.attn_logit_softcap, loaded.config.final_logit_softcap) == (50.0, 30.0)
    if name == "gemma3":
        assert loaded.config.layer_kinds == ("sliding",) * 5 + ("full",)
        assert (loaded.config.rope_theta, loaded.config.local_rope_theta) == (1e6, 1e4)
    window = FAMILIES[name][3].get("sliding_window", FAMILIES[name][3].get("sliding_window_size"))
    if name == "gpt-oss":  # keras_hub's sliding layers (the odd ones) see one key more than their window says
        assert loaded.config.layer_kinds == ("full", "sliding") and loaded.config.attention_sinks
        window += 1
    assert loaded.config.sliding_window == window
    assert loaded.config.tie_embeddings == task.backbone.token_embedding.tie_weights
    src = ids()  # 11 tokens: longer than the window of 5
    expected = logits(task, src)
    assert np.max(np.abs(rn.Transformer(loaded.config, loaded.weights, np.float64)(src) - expected)) <= 1e-4
    report = tmp_path / "r.json"
    assert main(["verify", str(path), "--src-len", "11", "--json", str(report)]) == 0
    result = json.loads(report.read_text())
    assert result["verdict"].startswith(f"PASS: matches the source (keras_hub {FAMILIES[name][1]}")
    hooked = {r["sublayer"] for r in result["rows"] if "keras_hub-f32" in r["backends"]}
    assert {"decoder.layers.0", "decoder.final_norm"} <= hooked  # each layer and the final norm, whatever its name
    formats.save(tmp_path / "again", loaded.config, dict(loaded.weights), loaded.format)
    np.testing.assert_array_equal(logits(keras_hub.models.CausalLM.from_preset(str(tmp_path / "again")), src),
                                  expected)
    formats.save(tmp_path / "hf", hf_config(name, loaded.config), dict(loaded.weights), hf_format)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    if loaded.config.num_experts:  # transformers' default experts (grouped_mm) take no odd widths
        hf.set_experts_implementation("eager")
    with torch.no_grad():
        theirs = hf(input_ids=torch.as_tensor(src)).logits.double().numpy()
    assert np.max(np.abs(theirs - expected)) <= 1e-4


@pytest.mark.parametrize("name", ["mixtral", "qwen3-moe", "gemma2", "smollm3", "opt", "bloom", "falcon"])
def test_keras_hub_greedy_generation_equals_transformers_on_our_export(name, tmp_path_factory, tmp_path):
    """keras_hub's greedy `generate` (its KV cache) on the preset gives the 32 tokens transformers decodes from our
    export of it. Left out, for keras_hub's reasons: Qwen-MoE with a window (keras-hub 0.32's cached attention takes
    a symbolic tensor as a Python bool under tf.function), Gemma 3 without a preprocessor (`Gemma3CausalLM.generate`
    returns a None it then cannot stack), GPT-NeoX (keras-hub 0.32's `GPTNeoXAttention` rotates each cached step's
    query at position 0, no `start_index`: its first generated token already differs from transformers')."""
    task, path = family_preset(tmp_path_factory, name)
    loaded = formats.load(path)
    formats.save(tmp_path / "hf", hf_config(name, loaded.config), dict(loaded.weights), FAMILIES[name][2])
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    if loaded.config.num_experts:  # transformers' default experts (grouped_mm) take no odd widths
        model.set_experts_implementation("eager")
    prompt = ids(2)[:, :4]  # id 0 in the first row
    with torch.no_grad():
        expected = model.generate(torch.as_tensor(prompt), attention_mask=torch.ones(2, 4, dtype=torch.long),
                                  do_sample=False, max_new_tokens=32, min_new_tokens=32, pad_token_id=0).numpy()
    task.compile(sampler="greedy")
    token_ids = np.zeros((2, 4 + 32), np.int32)
    token_ids[:, :4] = prompt
    padding_mask = np.broadcast_to(np.arange(4 + 32) < 4, token_ids.shape)  # by position: 0 is a real token here
    ours = task.generate({"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None)
    np.testing.assert_array_equal(np.asarray(ours["token_ids"]), expected)

def test_gpt_oss_verify_hf_dir_against_the_preset_and_keras_hubs_converter(tmp_path_factory, tmp_path, capsys):
    """`verify HF_DIR PRESET` on the GPT-OSS preset and our transformers export of it: both libraries within float32
    floors of each other at every layer. keras_hub's own `convert_gpt_oss` cannot take that directory: it reads the
    experts as MXFP4 blocks only (`gate_up_proj_blocks`, absent from a float checkpoint), and its config reader keeps
    transformers' window (keras_hub's sliding layers see one key more), reads the yarn factor from transformers 4's
    `rope_scaling` alone (transformers 5 writes `rope_parameters`: factor 1) and slides on the odd layers whatever
    `layer_types` says. Measured: the backbone its config builds, holding the preset's weights, parts from
    transformers by more than 1e-3 in the logits."""
    from keras_hub.src.utils.transformers import convert_gpt_oss
    from safetensors.numpy import load_file

    task, path = family_preset(tmp_path_factory, "gpt-oss")
    loaded = formats.load(path)
    formats.save(tmp_path / "hf", loaded.config, dict(loaded.weights), "hf-gpt-oss")
    report = tmp_path / "r.json"
    assert main(["--quiet", "verify", str(tmp_path / "hf"), str(path), "--src-len", "11", "--json", str(report)]) == 0
    between = [r for r in json.loads(report.read_text())["rows"]
               if r["backends"] == ["keras_hub-f32", "transformers-f32"]]
    assert {"decoder.layers.0", "decoder.layers.1", "logits"} <= {r["sublayer"] for r in between}
    assert all(r["passed"] for r in between)
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert not any(k.endswith("_blocks") for k in load_file(tmp_path / "hf" / "model.safetensors"))
    converted = convert_gpt_oss.convert_backbone_config(hf_config)
    assert (converted["sliding_window"], converted.get("rope_scaling_factor", 1.0)) == (5, 1.0)  # 4 and 2.0 here
    backbone = keras_hub.models.GptOssBackbone(**converted)
    backbone.load_weights(path / "model.weights.h5")  # the same variables: window and factor are no weights
    theirs = logits(keras_hub.models.GptOssCausalLM(backbone=backbone, preprocessor=None), ids())
    apart = np.max(np.abs(theirs - logits(task, ids())))
    assert apart > 1e-3
    with capsys.disabled():
        print(f"\ngpt-oss: keras_hub's converter's config, max |its logits - the preset's| {apart:.2e}")


def test_keras_hub_gpt_neox_computes_the_tanh_gelu_where_transformers_computes_the_exact_one(tmp_path_factory,
                                                                                          tmp_path):
    """keras_hub's GPT-NeoX always computes `gelu_approximate`; transformers' GPT-NeoX (Pythia) defaults to the
    exact `gelu`: `verify` on such a directory against the preset parts at the first feed-forward."""
    _, path = family_preset(tmp_path_factory, "gpt-neox")
    loaded = formats.load(path)
    formats.save(tmp_path / "hf", loaded.config, dict(loaded.weights), "hf-gpt-neox")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    report = tmp_path / "r.json"
    assert main(["verify", str(tmp_path / "hf"), str(path), "--outputs-only", "--src-len", "11", "--json",
                 str(report)]) == 1
    assert "first divergent sublayer decoder.layers.0.ffn" in json.loads(report.read_text())["verdict"]


# --- keras_hub's own converter (keras_hub/src/utils/transformers/convert_*.py) on the directory written from the
# preset: `verify HF_DIR KERASHUB_PRESET` runs both libraries and names the first layer where they part -------------
# (family id, keras_hub's converter module, config.json keys set in the directory (keys it reads that this tool leaves
# out, at transformers' values; or a setting the two libraries compute differently), where they part: None, nowhere)
CONVERTERS = {
    "mixtral": ("mixtral", "convert_mixtral", {}, None),
    "qwen3-moe": ("qwen3-moe", "convert_qwen3_moe", {"router_aux_loss_coef": 0.001}, None),
    # convert_qwen_moe passes use_sliding_window, which QwenMoeBackbone does not take (its key is
    # use_sliding_window_attention): keras_hub's model attends past the window of 5 that transformers keeps
    "qwen-moe": ("qwen-moe", "convert_qwen_moe", {"router_aux_loss_coef": 0.001}, "decoder.layers.0.self_attn"),
    "gemma3": ("gemma3", "convert_gemma3", {}, None),
    "gemma2": ("gemma2", "convert_gemma", {}, None),
    "smollm3": ("smollm3", "convert_smollm3", {}, None),
    # transformers' SmolLM3 slides where layer_types says so; keras_hub's keeps layer_types and never masks by it
    "smollm3-window": ("smollm3", "convert_smollm3", {"use_sliding_window": True, "sliding_window": 4,
                                                     "layer_types": ["sliding_attention"] * 3},
                       "decoder.layers.0.self_attn"),
}


def _converted(name: str, module: str, keys: dict, tmp_path_factory, tmp_path, monkeypatch):
    """`(Hugging Face directory, keras_hub's task)`: the directory written from family `name`'s preset (with `keys`
    set in its config.json), converted by keras_hub's converter functions. Its `from_preset` on a directory imports
    every converter, some needing sentencepiece, which only their tokenizers use: the functions are called as its
    preset loader calls them."""
    import importlib
    import sys
    import types

    from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader

    if importlib.util.find_spec("sentencepiece") is None:  # imported at the top of convert_gemma3, for its tokenizer
        monkeypatch.setitem(sys.modules, "sentencepiece", types.SimpleNamespace(SentencePieceProcessor=None))
    backbone_name, task_name, hf_format, _ = FAMILIES[name]
    loaded = formats.load(family_preset(tmp_path_factory, name)[1])
    formats.save(tmp_path / "hf", loaded.config, dict(loaded.weights), hf_format)
    converter = importlib.import_module(f"keras_hub.src.utils.transformers.{module}")
    hf_config = {**json.loads((tmp_path / "hf" / "config.json").read_text()), **keys}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(hf_config))
    backbone = getattr(keras_hub.models, backbone_name)(**converter.convert_backbone_config(hf_config))
    with SafetensorLoader(str(tmp_path / "hf")) as loader:
        converter.convert_weights(backbone, loader, hf_config)
    return tmp_path / "hf", getattr(keras_hub.models, task_name)(backbone=backbone, preprocessor=None)


@pytest.mark.parametrize("case", CONVERTERS)
def test_keras_hubs_own_converter_against_transformers(case, tmp_path_factory, tmp_path, monkeypatch, capsys):
    """keras_hub's converter on the directory written from the preset, judged beside transformers by
    `verify HF_DIR KERASHUB_PRESET`: within float32 floors of each other, or parting where keras_hub computes
    otherwise."""
    name, module, keys, parts_at = CONVERTERS[case]
    hf, task = _converted(name, module, keys, tmp_path_factory, tmp_path, monkeypatch)
    task.save_to_preset(str(tmp_path / "kh"))
    report = tmp_path / "r.json"
    assert main(["--quiet", "verify", str(hf), str(tmp_path / "kh"), "--src-len", "11", "--json",
                 str(report)]) == (0 if parts_at is None else 1)
    result = json.loads(report.read_text())
    between = {r["sublayer"]: r for r in result["rows"] if r["backends"] == ["keras_hub-f32", "transformers-f32"]}
    assert {"decoder.layers.0", "decoder.layers.1", "logits"} <= set(between)  # SmolLM3's final norm: not hooked
    if parts_at is None:
        assert all(r["passed"] for r in between.values())
    else:
        assert f"first divergent sublayer {parts_at} " in result["verdict"], result["verdict"]
        assert not between["decoder.layers.0"]["passed"]
    with capsys.disabled():
        print(f"\n{case}: keras_hub's converter, max |keras_hub - transformers| logits "
              f"{between['logits']['max_abs_err']:.2e}")


def test_keras_hub_scales_gemma3_scores_by_head_dim_whatever_its_converter_says(tmp_path_factory, tmp_path,
                                                                                  monkeypatch, capsys):
    """transformers scales Gemma 3's scores by 1/sqrt(query_pre_attn_scalar) (Gemma 3 27B: 168, head_dim 128).
    keras_hub's converter says query_head_dim_normalize=false for it, but Gemma3DecoderBlock builds its attention with
    True whatever the backbone says: keras_hub scales by 1/sqrt(head_dim), another function. Reading that preset is
    refused (the scale it means is unknown); the logits part by far more than float32 rounding."""
    hf, task = _converted("gemma3", "convert_gemma3", {"query_pre_attn_scalar": 24}, tmp_path_factory, tmp_path,
                          monkeypatch)
    task.save_to_preset(str(tmp_path / "kh"))
    with pytest.raises(ValueError, match=r"query_head_dim_normalize=false with head_dim=16 != hidden_dim // "
                                         r"num_query_heads=8 is not supported"):
        formats.load(tmp_path / "kh")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    src = ids()
    with torch.no_grad():
        theirs = model(input_ids=torch.as_tensor(src)).logits.double().numpy()
    gap = float(np.max(np.abs(logits(task, src) - theirs)))
    with capsys.disabled():
        print(f"\ngemma3 query_pre_attn_scalar=24: max |keras_hub - transformers| logits {gap:.2e}")
    assert gap > 1e-2

@pytest.mark.parametrize("name, settings, named", [
    ("qwen-moe", {"mlp_only_layers": [0]}, "mlp_only_layers=[0]: keras-hub 0.32's QwenMoeBackbone builds every layer "
                                           "as its layer 0 (it never passes layer_index), so no layer has experts"),
    ("qwen-moe", {"decoder_sparse_step": 2}, "decoder_sparse_step=2, mlp_only_layers=[]: keras-hub 0.32's"),
    ("qwen3-moe", {"mlp_only_layers": [0, 1]}, "decoder_sparse_step=1 and mlp_only_layers=[0, 1] leave no layer"),
    ("mixtral", {"top_k": 5}, "config.json top_k=5 must be from 1 to the 4 experts"),
    ("mixtral", {"router_bias": True}, "config.json key(s) router_bias are not supported (not in keras-hub 0.32's "
                                       "MixtralBackbone"),
    ("gpt-oss", {"swiglu_limit": 5.0}, "config.json key(s) swiglu_limit are not supported (not in keras-hub 0.32's "
                                       "GptOssBackbone"),
], ids=["qwen-moe-layer-0-dense", "qwen-moe-step-2", "qwen3-moe-all-dense", "mixtral-top-k", "mixtral-unknown-key",
        "gpt-oss-unknown-key"])
def test_a_mixture_preset_is_read_as_keras_hub_computes_it_or_refused(name, settings, named, tmp_path_factory,
                                                                      tmp_path):
    """keras_hub's QwenMoeBackbone never passes layer_index to its layers, so each applies transformers' rule to
    index 0: all layers have experts or none (a dense model, refused), and mlp_only_layers without 0 changes
    nothing (read so, with a note); settings no model has, and keys keras-hub 0.32 does not write, are refused."""
    import shutil

    _, path = family_preset(tmp_path_factory, name)
    shutil.copytree(path, tmp_path / "p")
    data = json.loads((tmp_path / "p" / "config.json").read_text())
    data["config"].update(settings)
    (tmp_path / "p" / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(named)):
        formats.load(tmp_path / "p")
    data["config"].update(mlp_only_layers=[1], decoder_sparse_step=1, top_k=2)
    data["config"].pop("router_bias", None)
    (tmp_path / "p" / "config.json").write_text(json.dumps(data))
    if name == "qwen-moe":
        loaded = formats.load(tmp_path / "p")
        assert loaded.config.expert_layers is None
        assert any("mlp_only_layers=[1] changes nothing in keras_hub" in note for note in loaded.notes)

def test_a_tied_model_is_refused_as_a_mistral_preset(tmp_path_factory, tmp_path):
    _, path = family_preset(tmp_path_factory, "qwen-tied")
    loaded = formats.load(path)
    config = loaded.config.replace(qkv_bias=None)
    weights = {k: v for k, v in loaded.weights.items() if not k.endswith(("q.bias", "k.bias", "v.bias"))}
    with pytest.raises(ValueError, match=r"tie_embeddings=True \(MistralCausalLM's head is never tied\)"):
        formats.save(tmp_path / "m", config, weights, "kerashub-mistral")


@pytest.mark.parametrize("backbone, settings", [
    ("LlamaBackbone", {"num_key_value_heads": 2, "tie_word_embeddings": False}),
    ("MistralBackbone", {"num_key_value_heads": 2}),  # never tied
    ("Phi3Backbone", {"num_key_value_heads": 6}),
], ids=["llama", "mistral", "phi3"])
def test_a_backbone_saved_alone_keeps_its_untied_head(backbone, settings, tmp_path):
    """A backbone whose reverse embedding is untied (`layers/reversible_embedding/vars/1`) saved without its task:
    the reverse embedding is the output head (was refused as an unexpected weight), judged by keras_hub's own
    `token_embedding(hidden, reverse=True)`."""
    import keras

    keras.utils.set_random_seed(5)
    model = getattr(keras_hub.models, backbone)(vocabulary_size=61, num_layers=2, num_query_heads=6, hidden_dim=48,
                                                intermediate_dim=37, **settings)
    rng = np.random.default_rng(5)
    for v in model.weights:
        v.assign(v.numpy() + 0.1 * rng.standard_normal(v.shape).astype("float32"))
    model.save_to_preset(str(tmp_path / "preset"))
    loaded = formats.load(tmp_path / "preset")
    assert loaded.config.output_projection and not loaded.config.tie_embeddings
    assert any("reverse embedding" in note for note in loaded.notes)
    report = tmp_path / "report.json"
    assert main(["--quiet", "verify", str(tmp_path / "preset"), "--src-len", "11", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["source"]["runs"][0]["label"] == "keras_hub-f32"


@pytest.mark.parametrize("name", ["gpt-neox", "opt", "bloom", "falcon"])
def test_a_setting_keras_hub_032_does_not_write_is_refused_and_an_untied_head_is_not_written(name, tmp_path_factory,
                                                                                            tmp_path):
    """GPT-NeoX, OPT, BLOOM and Falcon: a config.json key their backbone's get_config() does not write is refused,
    naming it; an untied head has no KerasHub form (their causal LMs' logits are the token embedding reversed)."""
    import shutil

    _, path = family_preset(tmp_path_factory, name)
    changed = tmp_path / "changed"
    shutil.copytree(path, changed)
    config = json.loads((changed / "config.json").read_text())
    config["config"]["use_parallel_residual"] = False
    (changed / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="use_parallel_residual are not supported"):
        formats.load(changed)
    loaded = formats.load(path)
    weights = {**loaded.weights, "output.kernel": np.array(loaded.weights["tgt_embed.embedding"]).T.copy()}
    with pytest.raises(ValueError, match=r"tie_embeddings=False \(\w+CausalLM's logits reuse the token embedding\)"):
        formats.save(tmp_path / "untied", loaded.config.replace(tie_embeddings=False), weights, "kerashub-" + name)


def test_what_the_alibi_presets_cannot_hold_is_refused_naming_it(tmp_path_factory, tmp_path):
    """KerasHub's Falcon takes two dropout rates the canonical model holds as one, normalizes its layers at 1e-5
    whatever layer_norm_epsilon says (its final norm only reads it), and computes ALiBi exactly where
    transformers' Falcon rounds it to bfloat16 (the same beyond 8 heads or 256 positions only); its BLOOM a
    feed-forward width transformers' BLOOM (4 * hidden) lacks; its Falcon always computes ALiBi, so a rotary Falcon
    has no preset."""
    import dataclasses
    import shutil

    _, path = family_preset(tmp_path_factory, "falcon")
    changed = tmp_path / "changed"
    shutil.copytree(path, changed)
    config = json.loads((changed / "config.json").read_text())
    config["config"]["attention_dropout_rate"] = 0.1
    (changed / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="attention_dropout_rate=0.1 beside feedforward_dropout_rate=0"):
        formats.load(changed)
    # keras-hub 0.32's FalconBackbone hands layer_norm_epsilon to its final norm only: its layers keep 1e-5
    config["config"].update(attention_dropout_rate=0.0, layer_norm_epsilon=2e-4)
    (changed / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"layer_norm_epsilon=0.0002 is not supported: .* final LayerNorm only"):
        formats.load(changed)
    loaded = formats.load(family_preset(tmp_path_factory, "bloom")[1])
    narrow = dataclasses.replace(loaded.config, d_ff=37)
    weights = {k: (v[:, :37] if k.endswith("linear1.kernel") else v[:37] if k.endswith("linear1.bias") or
                   k.endswith("linear2.kernel") else v) for k, v in loaded.weights.items()}
    formats.save(tmp_path / "narrow", narrow, weights, "kerashub-bloom")  # KerasHub's BLOOM takes any width
    with pytest.raises(ValueError, match="d_ff=37"):
        formats.save(tmp_path / "hf", narrow, weights, "hf-bloom")
    falcon = formats.load(family_preset(tmp_path_factory, "falcon")[1])
    with pytest.raises(ValueError, match="alibi_bfloat16=False .* 6 heads over max_len=2048"):
        formats.save(tmp_path / "hf-falcon", falcon.config, dict(falcon.weights), "hf-falcon")
    rotary = loaded.config.replace(alibi=False, positional="rope", embed_norm=False, activation="gelu")
    with pytest.raises(ValueError, match="alibi=False"):
        formats.save(tmp_path / "falcon", rotary, {k: v for k, v in loaded.weights.items() if "embed_norm" not in k},
                     "kerashub-falcon")
