"""KerasHub Gemma and Phi3 against keras_hub itself and against transformers: tiny random presets with odd sizes
(Gemma: 3 query heads over 1 key/value head of 16 dims on a hidden size of 36, two branches of 37; Phi3: 6 query heads
over 2 key/value heads, an intermediate size of 37, with and without "su" rope scaling; every weight perturbed)
imported, verified against keras_hub (the built-in source), exported back to a preset keras_hub loads and to a
Hugging Face directory transformers loads; and what neither family's canonical config can say, refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main

keras_hub = pytest.importorskip("keras_hub")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB = 53
_FACTORS = np.random.default_rng(5).random((2, 4))  # head_dim 8: 4 rotation speeds
SU = dict(rope_scaling_type="su", rope_scaling_short_factor=[float(x) for x in 1 + _FACTORS[0]],
          rope_scaling_long_factor=[float(x) for x in 1 + 3 * _FACTORS[1]], max_sequence_length=32,
          pretraining_sequence_length=8)  # 11 tokens take the long factors, 6 the short ones; cos, sin x 1.29
PHI3 = dict(num_layers=2, num_query_heads=6, num_key_value_heads=2, hidden_dim=48, intermediate_dim=37,
            layer_norm_epsilon=1e-5)
FAMILIES = {  # name: (backbone, task, Hugging Face format, backbone arguments)
    "gemma": ("GemmaBackbone", "GemmaCausalLM", "hf-gemma",
              dict(num_layers=2, num_query_heads=3, num_key_value_heads=1, head_dim=16, hidden_dim=36,
                   intermediate_dim=74)),
    "phi3": ("Phi3Backbone", "Phi3CausalLM", "hf-phi3", PHI3),
    "phi3-su": ("Phi3Backbone", "Phi3CausalLM", "hf-phi3", {**PHI3, **SU}),
}
_cache: dict = {}


def family_preset(tmp_path_factory, name: str):
    """`(CausalLM, its save_to_preset directory)` of a tiny random member of family `name`, built once."""
    if name not in _cache:
        backbone_name, task_name, _, arguments = FAMILIES[name]
        backbone = getattr(keras_hub.models, backbone_name)(vocabulary_size=VOCAB, **arguments)
        task = getattr(keras_hub.models, task_name)(backbone=backbone, preprocessor=None)
        rng = np.random.default_rng(13)
        for variable in task.weights:
            variable.assign(variable.numpy() + 0.1 * rng.standard_normal(variable.shape).astype("float32"))
        path = tmp_path_factory.mktemp(name) / "preset"
        task.save_to_preset(str(path))
        _cache[name] = task, path
    return _cache[name]


def ids(length: int, seed: int = 0) -> np.ndarray:
    out = np.random.default_rng(seed).integers(0, VOCAB, size=(2, length))
    out[0, 3] = 0
    return out


def logits(task, src) -> np.ndarray:
    return np.asarray(task({"token_ids": src, "padding_mask": np.ones_like(src)}), np.float64)


@pytest.mark.parametrize("name", FAMILIES)
def test_import_verify_and_export_both_ways(name, tmp_path_factory, tmp_path):
    """keras_hub's logits within 1e-4 of the float64 reference; `verify` passes against keras_hub; the preset written
    back gives keras_hub's logits exactly; the Hugging Face export gives them within 1e-4 in transformers."""
    task, path = family_preset(tmp_path_factory, name)
    backbone_name, task_name, hf_format, _ = FAMILIES[name]
    loaded = formats.load(path)
    assert loaded.format == "kerashub-" + name.split("-")[0]
    formats.save(tmp_path / "again", loaded.config, dict(loaded.weights), loaded.format)
    again = keras_hub.models.CausalLM.from_preset(str(tmp_path / "again"))
    formats.save(tmp_path / "hf", loaded.config, dict(loaded.weights), hf_format)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    for length in (11, 6):
        src = ids(length)
        expected = logits(task, src)
        ours = rn.Transformer(loaded.config, loaded.weights, np.float64)(src)
        assert np.max(np.abs(ours - expected)) <= 1e-4
        np.testing.assert_array_equal(logits(again, src), expected)
        with torch.no_grad():
            theirs = hf(input_ids=torch.as_tensor(src)).logits.double().numpy()
        assert np.max(np.abs(theirs - expected)) <= 1e-4
    report = tmp_path / "r.json"
    assert main(["verify", str(path), "--src-len", "11", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["verdict"].startswith(f"PASS: matches the source (keras_hub {task_name})")


def test_gemma_reads_as_its_math(tmp_path_factory):
    """Half of intermediate_dim per branch, head_dim beside hidden_dim / heads, (1 + w) norms, the scaled embedding,
    the tanh GELU and the tied head; the gate is ffw_gating (the tanh GELU's input)."""
    _, path = family_preset(tmp_path_factory, "gemma")
    config = formats.load(path).config
    assert (config.d_ff, config.head_size, config.kv_heads) == (37, 16, 1)
    assert (config.norm_weight_offset, config.scale_embedding, config.activation) == (1.0, True, "gelu_tanh")
    assert config.tie_embeddings and config.output_projection and config.layer_norm_eps == 1e-6


def _edited(tmp_path_factory, tmp_path, name: str, **changes):
    """A copy of family `name`'s preset whose config.json has `changes` (None deletes a key)."""
    _, path = family_preset(tmp_path_factory, name)
    edited = tmp_path / "edited"
    shutil.copytree(path, edited)
    data = json.loads((edited / "config.json").read_text())
    data["config"].update(changes)
    (edited / "config.json").write_text(json.dumps(data))
    return edited


@pytest.mark.parametrize("changes, message", [
    (dict(use_post_ffw_norm=True), r"use_post_attention_norm=False, use_post_ffw_norm=True is not supported: one "
                                   r"post norm without the other"),
    (dict(layer_norm_epsilon=1e-5), r"layer_norm_epsilon=1e-05 .* its decoder blocks keep 1e-06"),
    (dict(query_head_dim_normalize=False), r"query_head_dim_normalize=false with head_dim=16 != hidden_dim // "
                                           r"num_query_heads=12"),
    (dict(rope_max_wavelength=500000), r"key\(s\) rope_max_wavelength are not supported"),
], ids=["post-ffw-norm-alone", "epsilon", "query-scale", "unknown-key"])
def test_gemma_settings_the_canonical_model_cannot_compute_are_refused(changes, message, tmp_path_factory, tmp_path):
    with pytest.raises(ValueError, match=message):
        formats.load(_edited(tmp_path_factory, tmp_path, "gemma", **changes))


def test_a_gemma_model_keras_hub_cannot_hold_is_refused(tmp_path_factory, tmp_path):
    _, path = family_preset(tmp_path_factory, "gemma")
    loaded = formats.load(path)
    weights = dict(loaded.weights)
    weights["output.kernel"] = weights["tgt_embed.embedding"].T.copy()
    for config, message in [(loaded.config.replace(tie_embeddings=False), r"tie_embeddings=False \(GemmaCausalLM"),
                            (loaded.config.replace(rope_theta=1e4 + 1), r"rope_theta=10001.0 \(KerasHub Gemma has"),
                            (loaded.config.replace(layer_norm_eps=1e-5), r"layer_norm_eps=1e-05 \(KerasHub Gemma")]:
        with pytest.raises(ValueError, match=message):
            formats.save(tmp_path / "g", config, weights if not config.tie_embeddings else dict(loaded.weights),
                         "kerashub-gemma")


def test_phi3_su_is_transformers_longrope(tmp_path_factory):
    """"su" reads as longrope (original length = pretraining_sequence_length, max_len = max_sequence_length), and both
    of its regimes matter on the test's inputs: with the factors swapped, or without the cos/sin scale, the reference
    is far from keras_hub at 11 tokens (long factors) and at 6 (short ones)."""
    task, path = family_preset(tmp_path_factory, "phi3-su")
    loaded = formats.load(path)
    rope = loaded.config.rope_scaling
    assert rope == {"rope_type": "longrope", "short_factor": SU["rope_scaling_short_factor"],
                    "long_factor": SU["rope_scaling_long_factor"], "original_max_position_embeddings": 8}
    assert loaded.config.max_len == 32
    swapped = {**rope, "short_factor": rope["long_factor"], "long_factor": rope["short_factor"]}
    for length in (11, 6):
        src = ids(length)
        expected = logits(task, src)
        for wrong in (swapped, {**rope, "attention_factor": 1.0}):
            ours = rn.Transformer(loaded.config.replace(rope_scaling=wrong), loaded.weights, np.float64)(src)
            assert np.max(np.abs(ours - expected)) > 1e-2


@pytest.mark.parametrize("changes, message", [
    (dict(rope_scaling_type="yarn"), r"rope_scaling_type='yarn' is not supported"),
    (dict(rope_scaling_long_factor=None), r"rope_scaling_long_factor must be a list of numbers"),
    (dict(partial_rotary_factor=0.5), r"key\(s\) partial_rotary_factor are not supported"),
], ids=["rope-type", "no-long-factor", "unknown-key"])
def test_phi3_settings_the_canonical_model_cannot_compute_are_refused(changes, message, tmp_path_factory, tmp_path):
    with pytest.raises(ValueError, match=message):
        formats.load(_edited(tmp_path_factory, tmp_path, "phi3-su", **changes))


def test_a_phi3_model_keras_hub_cannot_hold_is_refused(tmp_path_factory, tmp_path):
    _, path = family_preset(tmp_path_factory, "phi3-su")
    loaded = formats.load(path)
    rope = loaded.config.rope_scaling
    for changes, message in [
            (dict(rope_scaling={**rope, "attention_factor": 1.0}), r"attention_factor=1.0 \(KerasHub Phi3 derives"),
            (dict(rope_scaling={**rope, "factor": 2.0}), r"factor=2.0 \(KerasHub Phi3 derives max_len"),
            (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), r"rope_type='linear' \(KerasHub Phi3 has"),
            (dict(rope_scaling=None, rotary_fraction=0.5), r"rotary_fraction=0.5 \(KerasHub Phi3 has 1.0\)"),
            (dict(sliding_window=5), r"sliding_window=5 \(KerasHub Phi3 has none\)"),
            (dict(tie_embeddings=True), r"tie_embeddings=True \(Phi3CausalLM's head is never tied\)")]:
        with pytest.raises(ValueError, match=message):
            formats.save(tmp_path / "p", loaded.config.replace(**changes), dict(loaded.weights), "kerashub-phi3")


def test_a_phi3_directory_whose_two_original_lengths_disagree_is_refused(tmp_path_factory, tmp_path):
    """transformers 5's Phi3Config takes the top-level original_max_position_embeddings (4096 when absent) over the
    rope parameters' own: the export writes both, and a directory where they differ is refused."""
    _, path = family_preset(tmp_path_factory, "phi3-su")
    loaded = formats.load(path)
    formats.save(tmp_path / "hf", loaded.config, dict(loaded.weights), "hf-phi3")
    data = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert data["original_max_position_embeddings"] == data["rope_parameters"]["original_max_position_embeddings"] == 8
    data["original_max_position_embeddings"] = 16
    (tmp_path / "hf" / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"original_max_position_embeddings=16 and the rope parameters' 8 disagree"):
        formats.load(tmp_path / "hf")
