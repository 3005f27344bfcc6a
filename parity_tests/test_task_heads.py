"""Task heads (`TransformerConfig.classifier`, `next_sentence`; `layouts.hf_tasks`): the fine-tuned classes people
port, read from and written to Hugging Face directories, judged against transformers' own class.

Every model is a tiny random transformers model at odd sizes (3 or 5 labels, hidden 36 or 48, FFN 37), every
parameter moved by 0.1 N(0, 1) so that norms and biases are away from their initialization, with labels of its own
(`id2label`) and a `problem_type`. The probe ids hold id 0 (not the pad id) in every row and pad the second row; a
causal model's sequence classifier reads the last non-pad position, so its probe pads on the right and on the left.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import reference_numpy as rn
from transformer_parity import formats
from transformer_parity.cli import main

from .support.hf_models import perturbed
from transformer_parity.layouts import hf_families

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL32, ATOL64 = 1e-4, 1e-10  # the bars against transformers (observed: a few 1e-7 and 1e-15)
ENCODER = dict(vocab_size=53, hidden_size=36, num_attention_heads=3, intermediate_size=37, num_hidden_layers=2,
               max_position_embeddings=40, pad_token_id=3)
DECODER = dict(vocab_size=61, hidden_size=48, num_attention_heads=6, num_key_value_heads=2, intermediate_size=37,
               num_hidden_layers=2, max_position_embeddings=64, pad_token_id=3)
FAMILIES = {  # each family's config class and settings; its task classes are the ones its module lists
    "Bert": ("BertConfig", ENCODER),
    "Roberta": ("RobertaConfig", dict(ENCODER, pad_token_id=1)),
    "XLMRoberta": ("XLMRobertaConfig", dict(ENCODER, pad_token_id=1)),
    "DistilBert": ("DistilBertConfig", dict(vocab_size=53, dim=36, n_heads=3, hidden_dim=37, n_layers=2,
                                            max_position_embeddings=40, pad_token_id=3)),
    "Albert": ("AlbertConfig", dict(ENCODER, embedding_size=16)),
    "Electra": ("ElectraConfig", dict(ENCODER, embedding_size=16)),
    "DebertaV2": ("DebertaV2Config", dict(ENCODER, hidden_size=40, num_attention_heads=5, relative_attention=True,
                                          position_buckets=8, max_relative_positions=7, pos_att_type="p2c|c2p",
                                          norm_rel_ebd="layer_norm")),
    "MPNet": ("MPNetConfig", dict(ENCODER, pad_token_id=1)),
    # a full and a sliding layer (a window of 2 each way), biases everywhere, the head's dense too
    "ModernBert": ("ModernBertConfig", dict(ENCODER, global_attn_every_n_layers=2, local_attention=4,
                                            bos_token_id=None, eos_token_id=None, cls_token_id=None,
                                            sep_token_id=None, norm_bias=True, attention_bias=True, mlp_bias=True,
                                            classifier_bias=True)),
    "GPT2": ("GPT2Config", dict(vocab_size=61, n_embd=48, n_head=6, n_layer=2, n_positions=64, pad_token_id=3,
                                bos_token_id=1, eos_token_id=2)),
    "Llama": ("LlamaConfig", DECODER),
    "Mistral": ("MistralConfig", dict(DECODER, sliding_window=None)),
    "Qwen2": ("Qwen2Config", DECODER),
    "Qwen3": ("Qwen3Config", dict(DECODER, head_dim=16)),
    "Gemma": ("GemmaConfig", dict(DECODER, head_dim=16)),
    "Gemma2": ("Gemma2Config", dict(DECODER, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                    layer_types=["sliding_attention", "full_attention"])),
    "Gemma3Text": ("Gemma3TextConfig", dict(DECODER, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                                            layer_types=["sliding_attention", "full_attention"])),
    "SmolLM3": ("SmolLM3Config", dict(DECODER, head_dim=16, no_rope_layer_interval=2)),
    "Phi3": ("Phi3Config", dict(DECODER, num_key_value_heads=6)),
    "Starcoder2": ("Starcoder2Config", dict(DECODER, sliding_window=None)),
    "StableLm": ("StableLmConfig", dict(DECODER, use_qkv_bias=True)),
    "Phi": ("PhiConfig", DECODER),
    "GPTJ": ("GPTJConfig", dict(vocab_size=61, n_embd=48, n_head=6, n_layer=2, n_inner=37, n_positions=64,
                                rotary_dim=4, pad_token_id=3)),
    "GPTNeoX": ("GPTNeoXConfig", {k: v for k, v in DECODER.items() if k != "num_key_value_heads"}),
    "Falcon": ("FalconConfig", dict({k: v for k, v in DECODER.items() if k not in ("num_key_value_heads",
                                                                            "intermediate_size")},
                                    ffn_hidden_size=37, new_decoder_architecture=True, num_kv_heads=2, bias=True)),
    "Bloom": ("BloomConfig", {k: v for k, v in DECODER.items() if k not in ("num_key_value_heads",
                                                                            "intermediate_size")}),
    # a window of 2 under 3 pads: padded queries whose whole window is padding, which verify leaves out (differ there)
    "GPTNeo": ("GPTNeoConfig", dict(vocab_size=61, hidden_size=48, num_heads=6, num_layers=2, intermediate_size=37,
                                    attention_types=[[["global", "local"], 1]], window_size=2,
                                    max_position_embeddings=64, pad_token_id=3)),
    "Olmo": ("OlmoConfig", dict(DECODER, clip_qkv=0.3)),
    "Olmo2": ("Olmo2Config", DECODER),
    "Mixtral": ("MixtralConfig", dict(DECODER, num_local_experts=4, num_experts_per_tok=2)),
    "Qwen2Moe": ("Qwen2MoeConfig", dict(DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=19,
                                        shared_expert_intermediate_size=23)),
    "Qwen3Moe": ("Qwen3MoeConfig", dict(DECODER, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                        moe_intermediate_size=19, norm_topk_prob=True)),
    "GptOss": ("GptOssConfig", dict(DECODER, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                    sliding_window=4, swiglu_limit=0.5)),
    "Bart": ("BartConfig", dict(vocab_size=53, d_model=36, encoder_attention_heads=3, decoder_attention_heads=3,
                                encoder_ffn_dim=37, decoder_ffn_dim=37, encoder_layers=2, decoder_layers=1,
                                max_position_embeddings=40, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                decoder_start_token_id=2)),
    # T5: 6 heads of 8 beside a width of 40, 8 buckets up to distance 5 under the 9-token probes, eos 2 as BART's
    "T5": ("T5Config", dict(vocab_size=53, d_model=40, d_kv=8, num_heads=6, d_ff=37, num_layers=2,
                            num_decoder_layers=1, relative_attention_num_buckets=8, relative_attention_max_distance=5,
                            feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=2)),
    "MT5": ("MT5Config", dict(vocab_size=53, d_model=40, d_kv=8, num_heads=6, d_ff=37, num_layers=1,
                              relative_attention_num_buckets=8, relative_attention_max_distance=5, pad_token_id=0,
                              eos_token_id=2)),
    "MBart": ("MBartConfig", dict(vocab_size=53, d_model=36, encoder_attention_heads=3, decoder_attention_heads=3,
                                  encoder_ffn_dim=37, decoder_ffn_dim=37, encoder_layers=2, decoder_layers=1,
                                  max_position_embeddings=40, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                  decoder_start_token_id=2)),
}
SCORES = ("logits", "next_sentence", "choice")  # the records a task class's scores are compared as
CASES = [head.arch for family in hf_families() for head in family.task_heads]  # every head we implement
LABELS = {"SequenceClassification": ["negative", "neutral", "positive"],
          "TokenClassification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]}
_built: dict[str, Path] = {}


def task_dir(arch: str, tmp_path_factory) -> Path:
    """A `save_pretrained` directory of `arch`, built once per session."""
    if arch not in _built:
        family = max((f for f in FAMILIES if arch.startswith(f)), key=len)  # XLMRoberta, not Roberta
        task = arch[len(family):].removeprefix("For")
        config_class, settings = FAMILIES[family]
        names = LABELS.get(task)
        if arch.endswith(("LMHeadModel", "CausalLM")):  # BERT as a decoder: causal self-attention
            settings = dict(settings, is_decoder=True)
        extra = {} if names is None else {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in
                                                                                           enumerate(names)},
                                          "problem_type": "single_label_classification"}
        _built[arch] = perturbed(arch, config_class, {**settings, **extra}, arch, tmp_path_factory.mktemp(arch))[1]
    return _built[arch]


def probe(config, left: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(2, 9) ids with 0 in every row (the pad id is 1 or 3); row 1 padded by three, on the left if `left`. An
    encoder-decoder (BART) also gets its decoder input, the source shifted right after the eos id (BART's
    decoder_start_token_id), and each source row ends with the eos id, which its sequence head reads."""
    rng = np.random.default_rng(7)
    vocab = config.src_vocab_size if config.has_encoder else config.tgt_vocab_size
    ids = rng.integers(4, vocab, (2, 9))
    ids[:, 4] = 0
    if config.is_encoder_decoder:
        ids[0, -1], ids[1, -4] = 2, 2
    if left:
        ids[1, :3] = config.pad_id
    else:
        ids[1, -3:] = config.pad_id
    if not config.is_encoder_decoder:
        return ids, None
    return ids, np.concatenate([np.full((2, 1), 2), ids[:, :-1]], axis=1)


def transformers_logits(path: Path, arch: str, ids: np.ndarray, tgt: np.ndarray | None, pad: int, config
                        ) -> dict[str, np.ndarray]:
    """transformers' float64 scores, float64 throughout (its rotary angles and RMSNorms are float32 even in a float64
    model: `verify.source.exact_float64` computes them in float64, as verify's own source does)."""
    from transformer_parity.verify.source_hf import exact_float64

    model = getattr(transformers, arch).from_pretrained(path, dtype=torch.float64).eval()
    if config.num_experts:  # its default experts (grouped_mm) take no float64
        model.set_experts_implementation("eager")
    family = next(f for f in hf_families() if arch in {h.arch for h in f.task_heads} | set(f.architectures))
    if family.float64_fix is not None:  # what transformers keeps in float32 even in a float64 model of it
        family.float64_fix.apply(model, config)
    if config.positional == "rope" or config.norm == "rms":
        exact_float64(model, config)
    inputs = {"input_ids": torch.as_tensor(ids), "attention_mask": torch.as_tensor(ids != pad).long()}
    if tgt is not None:
        inputs.update(decoder_input_ids=torch.as_tensor(tgt), decoder_attention_mask=torch.as_tensor(tgt != pad).long())
    if arch.endswith("MultipleChoice"):  # one question, the rows its choices: (1, choices, length)
        inputs = {k: v[None] for k, v in inputs.items()}
    if arch == "GPT2DoubleHeadsModel":  # its score read at each row's last real token, as a tokenizer's [CLS] ends it
        inputs["mc_token_ids"] = (torch.arange(ids.shape[1]) * torch.as_tensor(ids != pad).long()).argmax(-1)
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    if arch.endswith("NextSentencePrediction"):  # the scores beside the bare model's hidden states
        return {"next_sentence": out.logits.numpy(), "last_hidden_state": out.hidden_states[-1].numpy()}
    if arch.endswith("MultipleChoice"):
        return {"logits": out.logits.reshape(-1, 1).numpy()}
    if arch == "GPT2DoubleHeadsModel":
        return {"logits": out.logits.numpy(), "choice": out.mc_logits.reshape(-1, 1).numpy()}
    if arch.endswith("QuestionAnswering"):
        return {"logits": torch.stack([out.start_logits, out.end_logits], -1).numpy()}
    if arch.endswith("PreTraining"):  # BERT's next-sentence scores, ALBERT's sentence-order scores
        pair = out.sop_logits if arch.startswith("Albert") else out.seq_relationship_logits
        return {"logits": out.prediction_logits.numpy(), "next_sentence": pair.numpy()}
    return {"logits": out.logits.numpy()}


@pytest.mark.parametrize("arch", CASES)
def test_a_task_model_matches_transformers_and_goes_both_ways_with_its_labels(arch, tmp_path_factory, tmp_path):
    path = task_dir(arch, tmp_path_factory)
    report = tmp_path / "report.json"
    assert main(["--quiet", "verify", str(path), "--src-len", "11", "--json", str(report)]) == 0, \
        json.loads(report.read_text())["verdict"]
    rows = json.loads(report.read_text())["rows"]
    for source, bar in (("transformers-f32", ATOL32), ("transformers-f64", ATOL64)):
        worst = max(r["max_abs_err"] for r in rows if r["backends"] == [source, "numpy-f64"] and r["sublayer"] in SCORES)
        assert worst <= bar, (source, worst)

    loaded = formats.load(path)
    hf_config = json.loads((path / "config.json").read_text())
    labelled = loaded.config.classifier not in (None, "choice")  # next-sentence, LM and choice scores have no labels
    if labelled:
        id2label = hf_config.get("id2label") or {str(i): f"LABEL_{i}" for i in range(hf_config.get("num_labels", 2))}
        names = tuple(id2label[str(i)] for i in range(len(id2label)))
        assert loaded.config.label_names == names and loaded.config.num_labels == len(names)
    keras_file, back = tmp_path / "m.weights.h5", tmp_path / "back"
    assert main(["--quiet", "convert", str(path), str(keras_file)]) == 0
    assert main(["--quiet", "convert", str(keras_file), str(back), "--to", loaded.format]) == 0  # XLM-R, not RoBERTa
    written = json.loads((back / "config.json").read_text())
    assert written["architectures"] == [arch]
    for key in ("id2label", "label2id", "problem_type"):
        assert written.get(key) == hf_config.get(key) or key not in hf_config or not labelled, key
    from safetensors.numpy import load_file

    source, again = load_file(path / "model.safetensors"), load_file(back / "model.safetensors")
    shared = set(again) & set(source)
    assert shared and all(np.array_equal(again[k], source[k]) for k in shared)

    config = loaded.config
    for left in (False, True) if config.classifier_input == "last" or config.choice_head else (False,):
        ids, tgt = probe(config, left)
        desired = transformers_logits(path, arch, ids, tgt, config.pad_id, config)
        reloaded = transformers_logits(back, arch, ids, tgt, config.pad_id, config)
        ours = rn.Transformer(config, loaded.weights).trace(ids, tgt, src_mask=ids != config.pad_id)
        # a padded position that sees no key (under GPT-Neo's window of 2) is the libraries' own: compared elsewhere
        real = ids != config.pad_id
        unseen = (rn.rows_seeing_no_key(config, None, real) if config.is_decoder_only else
                  rn.rows_seeing_no_key(config, real, None if tgt is None else tgt != config.pad_id))
        unseen = unseen.get("decoder" if config.has_decoder else "encoder", np.zeros(ids.shape, bool))
        for name, value in desired.items():
            np.testing.assert_array_equal(reloaded[name], value, err_msg=name)
            seen = ~unseen if value.shape[:2] == ids.shape else np.ones(value.shape[:1], bool)
            np.testing.assert_allclose(ours[name][seen], value[seen], rtol=0, atol=ATOL64,
                                       err_msg=f"{name}, left={left}")


NOT_HERE = {f"{stem}{kind}" for stem in ("Bart", "Marian", "MBart", "Pegasus", "M2M100")  # refused, naming what is supported
            for kind in ("ForCausalLM", "Model")} | {"ElectraForPreTraining", "ElectraForCausalLM",
                                                     "OPTForSequenceClassification",
                                                     "OPTForQuestionAnswering"} | {
    f"{stem}{kind}" for stem in ("T5", "MT5")  # not read yet: refused, naming what is supported
    for kind in ("EncoderModel", "ForTokenClassification")} | {
    # ModernBERT's multiple choice reads each row's first real position (attention_mask.argmax)
    "ModernBertForMultipleChoice"}


def test_every_task_class_transformers_has_for_our_families_is_read():
    """transformers' auto mappings (every task: sequence classification, QA, causal LM, pretraining, ...) name the
    classes of each model type; every one of our families' classes is read, as a base model or a task head, but the
    ones `NOT_HERE` (language models and bare models of the seq2seq families, refused below)."""
    import re

    from transformers.models.auto import modeling_auto

    mappings = [m for name, m in vars(modeling_auto).items()
                if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES") and isinstance(m, dict)]
    for family in hf_families():
        stem = re.match(r"[A-Za-z0-9]+?(?=For|Model|LMHead)", family.architectures[0]).group(0)
        listed = {c for m in mappings for c in np.atleast_1d(m.get(family.model_type, [])).tolist()
                  if c.startswith(stem)}
        ours = set(family.architectures) | {h.arch for h in family.task_heads}
        assert listed, family.name
        assert listed - ours <= NOT_HERE, (family.name, sorted(listed - ours))


def test_a_class_we_do_not_implement_is_refused_naming_it(tmp_path, capsys):
    """BartForCausalLM (BART's decoder alone, a language model) is not a model here: refused, naming what is."""
    config = transformers.BartConfig(**FAMILIES["Bart"][1])
    transformers.BartForCausalLM(config).save_pretrained(tmp_path / "model")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "model"), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "BartForCausalLM" in err and "never ported without its head" in err, err
    assert "BartForSequenceClassification" in err  # what is supported, task classes included


def test_a_causal_lm_class_without_is_decoder_is_refused_as_the_other_model_it_runs(tmp_path, capsys):
    """BertLMHeadModel with is_decoder=false attends both ways (transformers warns and runs a masked LM): reading it
    as causal would be wrong, and reading it as bidirectional would port a model the user did not mean."""
    transformers.BertLMHeadModel(transformers.BertConfig(**ENCODER)).save_pretrained(tmp_path / "model")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "model"), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is_decoder=false: BertLMHeadModel" in err, err
    assert 'architectures to ["BertForMaskedLM"]' in err and not (tmp_path / "out.safetensors").exists()


# --- KerasHub's text classifiers (`layouts.kerashub_classifiers`) ---------------------------------------------------

KERAS_HUB_ATOL = 1e-4  # keras_hub float32 against our reference and against transformers (observed: about 1e-7)
BACKBONES = {"Bert": {}, "Roberta": {}, "XLMRoberta": {}, "DistilBert": {}, "Albert": {"embedding_dim": 16}}


@pytest.mark.parametrize("stem", list(BACKBONES))
def test_a_keras_hub_text_classifier_matches_keras_hub_and_goes_to_transformers(stem, tmp_path):
    """Read as a sequence classifier and judged by keras_hub itself; where transformers has the same model (not
    RoBERTa or XLM-RoBERTa, whose KerasHub positions do not skip pads), the exported class gives keras_hub's scores."""
    keras_hub = pytest.importorskip("keras_hub")
    import keras

    keras.utils.set_random_seed(sum(map(ord, stem)))
    backbone = getattr(keras_hub.models, f"{stem}Backbone")(
        vocabulary_size=53, num_layers=2, num_heads=3, hidden_dim=36, intermediate_dim=37, max_sequence_length=40,
        **BACKBONES[stem])
    task = getattr(keras_hub.models, f"{stem}TextClassifier")(backbone=backbone, num_classes=5, preprocessor=None)
    rng = np.random.default_rng(1)
    for v in task.weights:
        v.assign(v.numpy() + 0.1 * rng.standard_normal(v.shape).astype("float32"))
    task.save_to_preset(str(tmp_path / "preset"))
    report = tmp_path / "report.json"
    assert main(["--quiet", "verify", str(tmp_path / "preset"), "--set", "pad_id=0", "--src-len", "11",
                 "--json", str(report)]) == 0, json.loads(report.read_text())["verdict"]
    loaded = formats.load(tmp_path / "preset", fields={"pad_id": 0})
    assert (loaded.config.classifier, loaded.config.num_labels) == ("sequence", 5)

    ids = np.random.default_rng(2).integers(1, 53, (2, 9))
    ids[:, 4], ids[1, -3:] = 0, 0  # id 0 is BERT's [PAD] here: padding, as the mask says
    inputs = {"token_ids": ids, "padding_mask": ids != 0}
    if stem in ("Bert", "Albert"):
        inputs["segment_ids"] = np.zeros_like(ids)
    theirs = np.asarray(task(inputs), np.float64)
    ours = rn.Transformer(loaded.config, loaded.weights)(ids, src_mask=ids != 0)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=KERAS_HUB_ATOL)
    if stem in ("Roberta", "XLMRoberta"):
        return
    assert main(["--quiet", "convert", str(tmp_path / "preset"), str(tmp_path / "hf"), "--set", "pad_id=0",
                 "--to", "hf"]) == 0
    hf = getattr(transformers, f"{stem}ForSequenceClassification").from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        logits = hf(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(ids != 0).long()).logits.numpy()
    np.testing.assert_allclose(logits, theirs, rtol=0, atol=KERAS_HUB_ATOL)
    assert main(["--quiet", "convert", str(tmp_path / "hf"), str(tmp_path / "again"), "--to", "kerashub"]) == 0
    again = keras_hub.models.TextClassifier.from_preset(str(tmp_path / "again"))
    np.testing.assert_array_equal(np.asarray(again(inputs)), np.asarray(task(inputs)))


def test_a_head_keras_hub_has_no_class_for_is_refused_as_such_not_as_an_approximation(tmp_path_factory, tmp_path,
                                                                                      capsys):
    """ALBERT's GELU is an accepted approximation away from KerasHub's, but KerasHub has no multiple-choice class:
    the refusal names the head, with or without --accept-approximation (the approximation's plan asks the family
    through its text classifier, as the export does)."""
    path = task_dir("AlbertForMultipleChoice", tmp_path_factory)
    for extra in ([], ["--accept-approximation", "gelu_tanh"]):
        capsys.readouterr()
        assert main(["convert", str(path), str(tmp_path / "preset"), "--to", "kerashub-albert", *extra]) == 2
        err = capsys.readouterr().err
        assert "a choice head reading pooler (KerasHub AlbertTextClassifier has classifier='sequence'" in err, err
        assert not (tmp_path / "preset").exists()


@pytest.mark.parametrize("key, value", [("classifier_pooling", "mean"), ("classifier_activation", "gelu_new")])
def test_a_modernbert_head_computed_otherwise_is_refused_naming_the_key(key, value, tmp_path_factory, tmp_path,
                                                                          capsys):
    """ModernBERT's sequence head over a masked mean, or with an activation of its own, is refused in one line."""
    import shutil

    edited = shutil.copytree(task_dir("ModernBertForSequenceClassification", tmp_path_factory), tmp_path / "edited")
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, key: value}))
    capsys.readouterr()
    assert main(["convert", str(edited), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f'config.json {key}="{value}"' in err, err
