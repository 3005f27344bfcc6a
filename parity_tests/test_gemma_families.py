"""Gemma 2, Gemma 3's text model and SmolLM3 against transformers itself, through their family modules
(`hf_gemma2`, `hf_gemma3_text`, `hf_smollm3`): tiny random models at test_gemma_blocks' sizes (6 query heads over 2
key/value heads of 16, an intermediate size of 37, a vocabulary of 53), every weight perturbed, id 0 in the inputs,
a window of 4 under 11 tokens, sliding and full layers, soft caps, Gemma 3's rotary per layer type and SmolLM3's
layers without positions. Each is saved with `save_pretrained`, imported, run by the float64 reference and both
twins, verified by the CLI against transformers, exported back and reloaded by transformers, and decoded
greedily."""

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

from .test_gemma_blocks import HF, HF_COMMON, VOCAB, ids

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

FORMATS = {"gemma2": "hf-gemma2", "gemma3": "hf-gemma3-text", "smollm3": "hf-smollm3"}
_cache: dict = {}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (transformers model in eval mode, eager attention, its save_pretrained directory, loaded), built once
    per module; every parameter perturbed, so that a norm read as `w` instead of `1 + w` cannot hide."""
    if not _cache:
        for name, (cls_name, config_name, settings, _) in HF.items():
            torch.manual_seed(sum(map(ord, name)) + 1)
            config = getattr(transformers, config_name)(**{**HF_COMMON, **settings})
            model = getattr(transformers, cls_name)(config).eval()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.1 * torch.randn_like(p))
            path = tmp_path_factory.mktemp(name) / "model"
            model.save_pretrained(path)
            _cache[name] = model, path, formats.load(path)
    return _cache


def logits(model, src: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(src)).logits.double().numpy()


@pytest.mark.parametrize("name", list(HF))
def test_the_directory_reads_as_its_family_and_the_blocks_config(name, built):
    _, _, loaded = built[name]
    assert loaded.format == FORMATS[name]
    blocks = HF[name][3]
    fields = ("attn_logit_softcap", "final_logit_softcap", "post_norms", "layer_kinds", "local_rope_theta",
              "rope_layers", "attention_scale", "sliding_window", "rope_theta", "rope_scaling", "qk_norm",
              "norm_weight_offset", "scale_embedding", "activation", "tie_embeddings")
    assert {f: getattr(loaded.config, f) for f in fields} == {f: getattr(blocks, f) for f in fields}


@pytest.mark.parametrize("name", list(HF))
def test_float64_reference_matches_transformers_in_float64(name, built):
    """transformers in float64 with its family's float64_fix (eager softmax, Gemma 3's per-layer-type tables) and
    the generic one, as verify's source runs it: within 1e-10 (measured 1.9e-15 to 2.7e-15)."""
    model, _, loaded = built[name]
    model64 = copy.deepcopy(model).double()
    hf_family(loaded.format).float64_fix.apply(model64, loaded.config)
    exact_float64(model64, loaded.config)
    src = ids()
    actual = rn.Transformer(loaded.config, loaded.weights, np.float64)(src)
    np.testing.assert_allclose(actual, logits(model64, src), rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", ["transformers", "torch_impl", "tf_impl"])
@pytest.mark.parametrize("name", list(HF))
def test_float32_outputs_match_the_reference(name, impl, built):
    from .tolerances import property_atol

    model, _, loaded = built[name]
    src = ids()
    desired = rn.Transformer(loaded.config, loaded.weights, np.float64)(src)
    floor = np.max(np.abs(rn.Transformer(loaded.config, loaded.weights, np.float32)(src) - desired))
    if impl == "transformers":
        actual = logits(model, src)
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


@pytest.mark.parametrize("name", list(HF))
def test_verify_judges_the_directory_against_transformers(name, built, tmp_path, capsys):
    _, path, _ = built[name]
    report = tmp_path / "report.json"
    assert main(["verify", str(path), "--src-len", "11", "--json", str(report)]) == 0, capsys.readouterr().err
    verdict = json.loads(report.read_text())["verdict"]
    assert verdict.startswith("PASS: matches the source (transformers"), verdict


@pytest.mark.parametrize("name", list(HF))
def test_export_reloads_in_transformers_with_the_same_logits(name, built, tmp_path):
    model, path, loaded = built[name]
    out = tmp_path / "export"
    formats.save(out, loaded.config, dict(loaded.weights), loaded.format)
    assert json.loads((out / "config.json").read_text())["model_type"] == model.config.model_type
    again = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation=model.config._attn_implementation).eval()
    assert formats.load(out).config == loaded.config
    src = ids(1)
    np.testing.assert_array_equal(logits(again, src), logits(model, src))


@pytest.mark.parametrize("name", list(HF))
def test_greedy_generation_matches_transformers_for_32_tokens(name, built):
    from .support.greedy import steppers

    model, _, loaded = built[name]
    prompt = ids(2, length=4)
    with torch.no_grad():
        expected = {cache: model.generate(torch.as_tensor(prompt), attention_mask=torch.ones(2, 4, dtype=torch.long),
                                          do_sample=False, max_new_tokens=32, min_new_tokens=32, use_cache=cache,
                                          pad_token_id=0).numpy() for cache in (True, False)}
    np.testing.assert_array_equal(expected[True], expected[False])
    for label, stepper in steppers(loaded.config, loaded.weights).items():
        ours = rn.generate(stepper, 2, prompt=prompt, eos_id=VOCAB, pad_id=None, max_new_tokens=32)  # no end token
        np.testing.assert_array_equal(ours, expected[True], err_msg=label)


@pytest.mark.parametrize("name, field, value, named", [
    ("gemma2", "rope_parameters", {"rope_type": "su-scaled", "rope_theta": 10000.0}, "rope type 'su-scaled'"),
    ("gemma2", "layer_types", ["sliding_attention", "chunked_attention", "full_attention"], "layer_types=["),
    ("gemma2", "use_bidirectional_attention", True, "use_bidirectional_attention=True"),
    ("gemma3", "attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0 is not supported: transformers' Gemma 3"),
    ("gemma3", "rope_parameters", {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
     "rope_parameters.sliding_attention="),
    ("smollm3", "use_sliding_window", False, "use_sliding_window=False"),
    ("smollm3", "no_rope_layers", [1, 0, 1], "no_rope_layers=[1, 0, 1]"),
])
def test_a_config_field_we_do_not_implement_is_refused(name, field, value, named, built, tmp_path, capsys):
    _, path, _ = built[name]
    edited = tmp_path / "edited"
    shutil.copytree(path, edited)
    config = json.loads((edited / "config.json").read_text())
    config[field] = value
    (edited / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["convert", str(edited), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err


def test_a_soft_cap_or_a_post_norm_is_not_written_where_the_family_lacks_it(built, tmp_path):
    """Gemma 3 (in transformers) caps no attention scores, SmolLM3 has no post norms: each is refused, named."""
    from transformer_parity.errors import UsageError

    gemma2 = built["gemma2"][2]
    for target, field in (("hf-gemma3-text", "attn_logit_softcap"), ("hf-smollm3", "post_norms")):
        with pytest.raises((UsageError, ValueError), match=field):
            formats.save(tmp_path / target, gemma2.config, dict(gemma2.weights), target)
