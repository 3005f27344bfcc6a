"""The pre-norm encoder-decoders against transformers itself: mBART (BART's names and learned positions) and
Pegasus (Marian's names and fixed sinusoids), each computed pre-norm with a final norm per stack. Tiny random models
with odd sizes (3 heads of 12, an intermediate size of 37, a vocabulary of 53), every weight and `final_logits_bias`
perturbed, scaled embeddings, pad ids in the source and id 0 in both inputs: read, run by the float64 reference and
both twins, verified by the CLI against transformers, exported back and reloaded by transformers, and decoded
greedily for 32 tokens with and without the cache."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main

from .support.greedy import steppers

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 53
SIZES = dict(vocab_size=VOCAB, d_model=36, encoder_attention_heads=3, decoder_attention_heads=3, encoder_ffn_dim=37,
             decoder_ffn_dim=37, encoder_layers=2, decoder_layers=2, max_position_embeddings=40,
             forced_eos_token_id=None, scale_embedding=True, bos_token_id=None)
# T5: 6 heads of 8 (inner width 48 beside d_model 40), 8 buckets up to distance 20, inputs longer than that (the
# far buckets hit, in the decoder too)
T5_SIZES = dict(vocab_size=VOCAB, d_model=40, d_kv=8, num_heads=6, d_ff=37, num_layers=2,
                relative_attention_num_buckets=8, relative_attention_max_distance=20)
_T5_READS = dict(embed_norm=False, positional="none", relative_bias_buckets=8, relative_bias_max_distance=20, head_dim=8,
                 scale_embedding=False, norm="rms", share_embeddings=True)
_BART_REFUSED = ("encoder_ffn_dim", 40, "encoder_ffn_dim=40 differs from decoder_ffn_dim=37")
_T5_REFUSED = ("dense_act_fn", "quick_gelu", "dense_act_fn='quick_gelu'")
FAMILIES = {  # name -> (config class, model class, pad id, decoder start id, what the reader must find, its sizes,
    # its (source, target) lengths, a config.json edit it refuses and what the refusal says)
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", 1, 2,
              dict(embed_norm=True, positional="learned", position_offset=2, scale_embedding=True), SIZES, (11, 7),
              _BART_REFUSED),
    "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration", 0, 0,
                dict(embed_norm=False, positional="sinusoidal", sinusoid_layout="concatenated", scale_embedding=True),
                SIZES, (11, 7), _BART_REFUSED),
    # fairseq's sinusoids counted over non-pad tokens from pad + 1, no final_logits_bias
    "m2m_100": ("M2M100Config", "M2M100ForConditionalGeneration", 1, 2,
                dict(embed_norm=False, positional="sinusoidal", sinusoid_frequencies="inclusive",
                     positions_skip_pad=True, position_offset=2, has_output_bias=False, scale_embedding=True), SIZES,
                (11, 7), _BART_REFUSED),
    # T5 v1.0: ReLU, the head tied to the token table, the final states rescaled by d_model**-0.5
    "t5": ("T5Config", "T5ForConditionalGeneration", 0, 0,
           dict(_T5_READS, activation="relu", ffn_gated=False, tie_embeddings=True, logit_divisor=40 ** 0.5),
           dict(T5_SIZES, feed_forward_proj="relu"), (27, 23), _T5_REFUSED),
    # T5 v1.1 / Flan-T5: gated gelu_new, an untied head, no rescale
    "t5-v1.1": ("T5Config", "T5ForConditionalGeneration", 0, 0,
                dict(_T5_READS, activation="gelu_tanh", ffn_gated=True, tie_embeddings=False, logit_divisor=1.0),
                dict(T5_SIZES, feed_forward_proj="gated-gelu", tie_word_embeddings=False), (27, 23), _T5_REFUSED),
    # mT5: T5 v1.1's computation under its own names (its head untied here)
    "mt5": ("MT5Config", "MT5ForConditionalGeneration", 0, 0,
            dict(_T5_READS, activation="gelu_tanh", ffn_gated=True, tie_embeddings=False, logit_divisor=1.0),
            T5_SIZES, (27, 23), _T5_REFUSED),
}
FORMATS = {"t5-v1.1": "hf-t5"}  # a family whose format is not hf-NAME


def _format(name: str) -> str:
    return FORMATS.get(name, f"hf-{name.replace('_', '-')}")


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """`(name, transformers model in eval mode, its save_pretrained directory, the loaded checkpoint)`."""
    config_class, model_class, pad, start, _, sizes, _, _ = FAMILIES[request.param]
    torch.manual_seed(7)
    config = getattr(transformers, config_class)(**sizes, pad_token_id=pad, eos_token_id=2,
                                                 decoder_start_token_id=start)
    model = getattr(transformers, model_class)(config).eval()
    if config_class.endswith("T5Config") and not FAMILIES[request.param][4]["tie_embeddings"]:
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())  # a head of its own
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name or not request.param == "pegasus":  # Pegasus' sinusoids are fixed
                p.add_(0.1 * torch.randn_like(p))
        if hasattr(model, "final_logits_bias"):  # M2M100 has none
            model.final_logits_bias.add_(0.1 * torch.randn_like(model.final_logits_bias))
    path = tmp_path_factory.mktemp(request.param) / "model"
    model.save_pretrained(path)
    return request.param, model, path, formats.load(path)


def _inputs(config, name):
    src, tgt = rn.sample_batch(config, 2, *FAMILIES[name][6], 0)
    # id 0 in both (Pegasus' and T5's pad id: a padded position then). Not first in T5's target: a query that may
    # see no key gets a zero output here, a softmax over the hidden keys' position biases in transformers' T5
    src[0, 2] = tgt[1, 3 if config.relative_bias_buckets else 0] = 0
    return src, tgt


def _hf_logits(model, src, tgt) -> np.ndarray:
    pad = model.config.pad_token_id
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(src), attention_mask=torch.as_tensor(src != pad),
                     decoder_input_ids=torch.as_tensor(tgt),
                     decoder_attention_mask=torch.as_tensor(tgt != pad)).logits.double().numpy()


def test_it_reads_pre_norm_with_final_norms(family):
    name, _, _, loaded = family
    assert loaded.format == _format(name)
    assert loaded.config.norm_first and loaded.config.final_norm
    for field, value in FAMILIES[name][4].items():
        assert getattr(loaded.config, field) == value, field


def test_the_reference_matches_transformers_in_float64_and_float32(family):
    from transformer_parity.layouts import hf_family

    name, model, _, loaded = family
    src, tgt = _inputs(loaded.config, name)
    desired = rn.Transformer(loaded.config, loaded.weights, np.float64)(src, tgt)
    model64 = copy.deepcopy(model).double()
    fix = hf_family(loaded.format).float64_fix  # Pegasus' sinusoids, T5's norms: float32 in transformers
    if fix is not None:
        fix.apply(model64, loaded.config)
    assert np.max(np.abs(_hf_logits(model64, src, tgt) - desired)) <= 1e-10
    assert np.max(np.abs(_hf_logits(model, src, tgt) - desired)) <= 1e-4


@pytest.mark.parametrize("impl", ["torch_impl", "tf_impl"])
def test_the_twins_match_the_reference(family, impl):
    name, _, _, loaded = family
    src, tgt = _inputs(loaded.config, name)
    desired = rn.Transformer(loaded.config, loaded.weights, np.float64)(src, tgt)
    if impl == "torch_impl":
        import torch_impl

        with torch.no_grad():
            actual = torch_impl.Transformer.from_reference(loaded.config, loaded.weights)(src, tgt).double().numpy()
    else:
        import tf_impl

        actual = np.asarray(tf_impl.Transformer.from_reference(loaded.config, loaded.weights, dtype="float32")(
            src, tgt), np.float64)
    assert np.max(np.abs(actual - desired)) <= 1e-4


def test_verify_judges_the_directory_against_transformers(family, tmp_path, capsys):
    _, _, path, _ = family
    report = tmp_path / "report.json"
    assert main(["verify", str(path), "--json", str(report)]) == 0, capsys.readouterr().err
    verdict = json.loads(report.read_text())["verdict"]
    assert verdict.startswith("PASS: matches the source (transformers"), verdict


def test_the_export_reloads_in_transformers_with_the_same_logits(family, tmp_path):
    name, model, _, loaded = family
    out = tmp_path / "export"
    formats.save(out, loaded.config, dict(loaded.weights), loaded.format)
    assert json.loads((out / "config.json").read_text())["model_type"] == model.config.model_type
    again = transformers.AutoModelForSeq2SeqLM.from_pretrained(out, dtype=torch.float32).eval()
    src, tgt = _inputs(loaded.config, name)
    np.testing.assert_array_equal(_hf_logits(again, src, tgt), _hf_logits(model, src, tgt))


def test_greedy_generation_matches_transformers_for_32_tokens(family):
    name, model, _, loaded = family
    if name == "t5-v1.1":
        pytest.skip("mT5 decodes T5 v1.1's computation (gated gelu_new, untied head) under its own names")
    src, _ = _inputs(loaded.config, name)
    pad, start = FAMILIES[name][2:4]
    with torch.no_grad():
        expected = {cache: model.generate(input_ids=torch.as_tensor(src), attention_mask=torch.as_tensor(src != pad),
                                          do_sample=False, num_beams=1, max_new_tokens=32, min_new_tokens=32,
                                          use_cache=cache, eos_token_id=None, pad_token_id=pad,
                                          decoder_start_token_id=start).numpy() for cache in (True, False)}
    np.testing.assert_array_equal(expected[True], expected[False])
    for label, stepper in steppers(loaded.config, loaded.weights, src, src != pad).items():  # no end token: eos_id past the vocabulary
        ours = rn.generate(stepper, 2, bos_id=start, eos_id=VOCAB, pad_id=pad, max_new_tokens=32)
        np.testing.assert_array_equal(ours, expected[True], err_msg=label)


def test_a_field_the_family_does_not_compute_here_is_refused(family, tmp_path, capsys):
    import shutil

    name, _, path, _ = family
    key, value, says = FAMILIES[name][7]
    edited = tmp_path / "edited"
    shutil.copytree(path, edited)
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, key: value}))
    capsys.readouterr()
    assert main(["convert", str(edited), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
