"""Hugging Face directory -> KerasHub preset: the tiny random transformers models of `test_llm_families.py` and
`test_bert_family.py` (odd sizes, every weight perturbed, id 0 in the inputs) written as KerasHub presets, by
`formats.save` and by `convert --to kerashub`, loaded by keras_hub, and its float32 outputs compared with
transformers' float32 outputs on the same ids (the causal LMs' logits; the encoders' sequence and pooled outputs: an
HF masked-LM head has no KerasHub equivalent, see below); `verify PRESET` then passes against keras_hub. A model that
a KerasHub preset cannot hold is refused in one line that names what keras_hub lacks: nothing is written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_parity import formats
from transformer_parity.cli import main

from . import test_bert_family as encoders
from . import test_llm_families as decoders
from . import test_moe_families as mixtures

keras_hub = pytest.importorskip("keras_hub")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOLERANCE = 1e-4  # keras_hub f32 vs transformers f32; the figures sit at float32 rounding, about 1e-6
CASES = {  # id -> (builders, their model, the KerasHub format, the class keras_hub loads)
    "llama3": (decoders, "llama3", "kerashub-llama", "LlamaCausalLM"),
    "mistral": (decoders, "mistral", "kerashub-mistral", "MistralCausalLM"),
    "qwen2": (decoders, "qwen2", "kerashub-qwen", "QwenCausalLM"),
    "qwen3": (decoders, "qwen3", "kerashub-qwen3", "Qwen3CausalLM"),
    "gemma": (decoders, "gemma-eps-1e-6", "kerashub-gemma", "GemmaCausalLM"),
    "phi3": (decoders, "phi3-longrope", "kerashub-phi3", "Phi3CausalLM"),
    "bloom": (decoders, "bloom", "kerashub-bloom", "BloomCausalLM"),
    "falcon-rw-alibi": (decoders, "falcon-rw-alibi", "kerashub-falcon", "FalconCausalLM"),
    "bert": (encoders, "bert-tanh-gelu", "kerashub-bert", "BertBackbone"),
    "distilbert": (encoders, "distilbert-gelu", "kerashub-distilbert", "DistilBertBackbone"),
    "albert": (encoders, "albert-tanh-gelu", "kerashub-albert", "AlbertBackbone"),
}
MEASURED: dict[str, float] = {}


def _outputs(case: str, model, config, keras_model) -> tuple[np.ndarray, np.ndarray]:
    """`(keras_hub's output, transformers' output)` in float64 on the same ids, each of them holding id 0: logits of a
    causal LM; an encoder's sequence output, and its pooled output beside it where it has a pooler."""
    builders = CASES[case][0]
    if builders is decoders:
        src = decoders.ids()
        out = keras_model({"token_ids": src, "padding_mask": np.ones_like(src)})
        return np.asarray(out, np.float64), decoders.hf_logits(model, src)
    ids, types, hf_kwargs = encoders.inputs(config)
    feed = {"token_ids": ids, "padding_mask": ids != config.pad_id}
    if "segment_ids" in {i.name for i in keras_model.inputs}:
        feed["segment_ids"] = types
    out = keras_model(feed)
    out = out if isinstance(out, dict) else {"sequence_output": out}  # DistilBertBackbone: the sequence output alone
    with torch.no_grad():
        theirs = model(**hf_kwargs)
    ours, desired = [out["sequence_output"]], [theirs.last_hidden_state]
    if config.pooler:
        ours, desired = ours + [out["pooled_output"]], desired + [theirs.pooler_output]
    return (np.concatenate([np.asarray(x, np.float64).ravel() for x in ours]),
            np.concatenate([x.double().numpy().ravel() for x in desired]))


@pytest.mark.parametrize("case", list(CASES))
def test_preset_from_a_directory_matches_transformers_in_keras_hub(case, tmp_path_factory, tmp_path, capsys):
    builders, name, fmt, cls = CASES[case]
    model, path = builders.hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    assert formats.save(tmp_path / "preset", loaded.config, dict(loaded.weights), fmt)[1] == fmt
    # the command line: an output directory with --to kerashub, the family picked from the model
    assert main(["--quiet", "convert", str(path), str(tmp_path / "cli"), "--to", "kerashub"]) == 0
    by_cli = formats.load(tmp_path / "cli")
    assert by_cli.format == fmt and by_cli.config == formats.load(tmp_path / "preset").config
    assert all(np.array_equal(by_cli.weights[k], v) for k, v in loaded.weights.items())
    task = cls.endswith("CausalLM")
    keras_model = (keras_hub.models.CausalLM if task else keras_hub.models.Backbone).from_preset(str(tmp_path / "cli"))
    assert type(keras_model).__name__ == cls
    actual, desired = _outputs(case, model, loaded.config, keras_model)
    MEASURED[case] = worst = float(np.max(np.abs(actual - desired)))
    with capsys.disabled():
        print(f"\n{case}: max |keras_hub - transformers| = {worst:.2e} ({cls})")
    np.testing.assert_allclose(actual, desired, rtol=0, atol=TOLERANCE)
    report = tmp_path / "report.json"
    src_len = "11" if task else "13"
    assert main(["--quiet", "verify", str(tmp_path / "cli"), "--src-len", src_len, "--json", str(report)]) == 0
    verdict = json.loads(report.read_text())["verdict"]
    assert verdict.startswith(f"PASS: matches the source (keras_hub {cls}"), verdict


@pytest.mark.parametrize("case", ["llama3", "mistral", "qwen2", "qwen3", "gemma"])
def test_keras_hub_greedy_generation_from_the_preset_matches_transformers_for_32_tokens(case, tmp_path_factory,
                                                                                         tmp_path):
    """keras_hub's `generate` (greedy, its KV cache) on the exported preset gives transformers' 32 tokens. Phi-3 with
    longrope is left out: keras_hub picks the short or long factors from the length of the whole generation buffer
    (36: long from the first step), transformers from the positions decoded so far (short up to 8), so the two
    decode differently by design (here from the 13th token on), though their logits on one input agree."""
    _, name, fmt, _ = CASES[case]
    model, path = decoders.hf_model(name, tmp_path_factory)
    loaded = formats.load(path)
    formats.save(tmp_path / "preset", loaded.config, dict(loaded.weights), fmt)
    prompt = decoders.ids(2, length=4)
    with torch.no_grad():
        expected = model.generate(torch.as_tensor(prompt), attention_mask=torch.ones(2, 4, dtype=torch.long),
                                  do_sample=False, max_new_tokens=32, min_new_tokens=32, pad_token_id=0).numpy()
    task = keras_hub.models.CausalLM.from_preset(str(tmp_path / "preset"))
    task.compile(sampler="greedy")
    token_ids = np.zeros((2, 4 + 32), np.int32)  # the prompt (id 0 in it), then room for 32 tokens
    token_ids[:, :4] = prompt
    padding_mask = np.broadcast_to(np.arange(4 + 32) < 4, token_ids.shape)  # by position: 0 is a real token here
    ours = task.generate({"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None)
    np.testing.assert_array_equal(np.asarray(ours["token_ids"]), expected)


REFUSED = [  # (builders, model, --to, what the one line names)
    (decoders, "llama", "kerashub-llama", "head_size=16 (KerasHub Llama has None), biases on the attention"),
    (decoders, "llama-linear", "kerashub-llama",
     "rope_type='linear' (keras-hub 0.32's LlamaRotaryEmbedding never applies rope_position_scaling_factor"),
    (decoders, "llama-yarn", "kerashub-llama", "rope_type='yarn' (KerasHub Llama has llama3 only)"),
    (decoders, "qwen2", "kerashub-mistral", "tie_embeddings=True (MistralCausalLM's head is never tied)"),
    (decoders, "gemma", "kerashub-gemma", "layer_norm_eps=1e-05 (KerasHub Gemma has 1e-06)"),
    (decoders, "phi3", "kerashub-phi3", "rotary_fraction=0.5 (KerasHub Phi3 has 1.0)"),
    (encoders, "roberta-mlm", "kerashub-roberta", "positions_skip_pad=True (positions counted over non-pad ids, which"),
    (encoders, "roberta", "kerashub-roberta", "positions_skip_pad=True (positions counted over non-pad ids, which"),
    (encoders, "xlm-roberta-mlm", "kerashub-roberta", "positions_skip_pad=True (positions counted over non-pad ids"),
    (encoders, "distilbert-mlm", "kerashub-distilbert",  # an approximation: refused with its gap (test_approximations)
     "head_norm_eps: KerasHub's DistilBertMaskedLM normalizes its masked-LM head at epsilon 1e-05, the source at "
     "1e-12"),
    (encoders, "distilbert", "kerashub-distilbert", "activation='relu' (KerasHub DistilBertBackbone has 'gelu')"),
    (encoders, "albert-mlm", "kerashub-albert", "pooler=False (KerasHub AlbertMaskedLM has True)"),
    (encoders, "albert", "kerashub-albert", "gelu_tanh: KerasHub's AlbertBackbone computes tanh-approximated GELU"),
    (decoders, "falcon-7b-alibi", "kerashub-falcon", "parallel_residual=True (KerasHub Falcon has False)"),
    (decoders, "falcon-7b", "kerashub-falcon", "alibi=False (KerasHub Falcon has True)"),
    # keras-hub 0.32's Falcon layers keep 1e-5 whatever layer_norm_epsilon says (1.5e-2 off in the logits at 2e-4)
    (decoders, "falcon-rw-alibi-12", "kerashub-falcon", "layer_norm_eps=0.0002 (keras-hub 0.32's Falcon decoder layers "
                                                        "normalize at 1e-05"),
    (mixtures, "mixtral", "kerashub-mixtral", "head_size=16 (KerasHub Mixtral: hidden_dim / heads)"),
    (mixtures, "qwen2-moe", "kerashub-qwen-moe", "head_size=16 (KerasHub QwenMoe: hidden_dim / heads)"),
    (mixtures, "qwen3-moe", "kerashub-qwen3-moe",  # and a dense layer between expert layers: keras_hub has that
     "q/k norms at epsilon 1e-05 (KerasHub Qwen3Moe's attention normalizes q and k at 1e-06"),
    (mixtures, "gpt-oss", "kerashub-gpt-oss",  # transformers' first layer slides, keras_hub's second (and clamps at 7)
     "layer_kinds=('sliding', 'full'), sliding_window=5 (KerasHub GptOss slides on the odd layers only"),
]


@pytest.mark.parametrize("builders, name, fmt, named", REFUSED, ids=[f"{r[1]}-to-{r[2]}" for r in REFUSED])
def test_what_a_preset_cannot_hold_is_refused_in_one_line(builders, name, fmt, named, tmp_path_factory, tmp_path,
                                                          capsys):
    _, path = builders.hf_model(name, tmp_path_factory)
    capsys.readouterr()
    assert main(["convert", str(path), str(tmp_path / "preset"), "--to", fmt]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err, err
    assert not (tmp_path / "preset").exists()


def test_a_kerashub_llama_preset_with_a_position_scaling_factor_is_refused(tmp_path, capsys):
    """keras_hub takes `rope_position_scaling_factor` and computes as if it were 1 (shown here): reading it as
    transformers' linear rope would not be what keras_hub computes, reading it as 1 not what the preset says."""
    sizes = dict(vocabulary_size=decoders.VOCAB, num_layers=1, num_query_heads=2, num_key_value_heads=1, hidden_dim=16,
                 intermediate_dim=7)
    scaled = keras_hub.models.LlamaBackbone(**sizes, rope_position_scaling_factor=2.0)
    plain = keras_hub.models.LlamaBackbone(**sizes)
    plain.set_weights(scaled.get_weights())
    src = decoders.ids()
    feed = {"token_ids": src, "padding_mask": np.ones_like(src)}
    np.testing.assert_array_equal(np.asarray(scaled(feed)), np.asarray(plain(feed)))
    scaled.save_to_preset(str(tmp_path / "scaled"))
    assert main(["convert", str(tmp_path / "scaled"), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rope_position_scaling_factor=2.0 is not supported (keras-hub 0.32's" in err, err
