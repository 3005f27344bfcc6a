"""Writes the "wild" corpus: tiny checkpoints saved by the real libraries at historical versions, each with the
library's own output on a fixed probe, into `parity_tests/wild/` (committed; the readers are proven on it).

This script imports nothing from the project: it runs inside side environments that hold the old libraries.

    python benchmarks/wild_corpus.py --kind hf4      --out parity_tests/wild   # transformers 4.30: pt, tf, flax
    python benchmarks/wild_corpus.py --kind hf4 --only bert-mlm-tf-sharded      # one directory of them
    python benchmarks/wild_corpus.py --kind hf4-buffers --out parity_tests/wild  # GPT-2 by transformers 4.26
    python benchmarks/wild_corpus.py --kind keras2   --out parity_tests/wild   # tf.keras (Keras 2) save_weights .h5
    python benchmarks/wild_corpus.py --kind kerasnlp --out parity_tests/wild   # keras-nlp save_to_preset
    python benchmarks/wild_corpus.py --kind verify   --out parity_tests/wild   # reload every dir this env can read

The environments (Python 3.11.7; torch 2.13.0 is the CPU wheel this machine serves from local disk):

    # "hf4": transformers 4.30.2 (the last release whose BERT/RoBERTa checkpoints carry `position_ids`) with the
    # TF 2.13 (Keras 2) and Flax 0.7 classes; the kinds hf4, keras2 and verify run here.
    python3.11 -m venv hf4
    hf4/bin/pip install transformers==4.30.2 tensorflow-cpu==2.13.1 jax==0.4.13 jaxlib==0.4.13 flax==0.7.0 \
        numpy==1.24.3
    hf4/bin/pip install --no-deps torch==2.13.0     # --no-deps: torch's typing-extensions pin would move TF's
    hf4/bin/pip install typing_extensions==4.12.2 sympy networkx jinja2 fsspec filelock "setuptools>=77"

    # "hf4-buffers": transformers 4.26.1, whose GPT-2 writes the buffers attn.bias (a uint8 causal mask) and
    # attn.masked_bias (-1e4) into pytorch_model.bin (4.27-4.29 write attn.bias as bool; 4.30 writes neither).
    python3.11 -m venv hf4-buffers
    hf4-buffers/bin/pip install transformers==4.26.1 numpy==1.24.3
    hf4-buffers/bin/pip install --no-deps torch==2.13.0
    hf4-buffers/bin/pip install typing_extensions==4.12.2 sympy networkx jinja2 fsspec filelock "setuptools>=77"

    # "kerasnlp": keras-nlp 0.12.1, the last keras-nlp before the KerasHub rename, on Keras 3.3 / TF 2.16.
    python3.11 -m venv kerasnlp
    kerasnlp/bin/pip install keras-nlp==0.12.1 keras==3.3.3 tensorflow-cpu==2.16.2 tensorflow-text==2.16.1

Every checkpoint is built from a config with a fixed seed, then EVERY saved parameter is moved away from its
initialisation (LayerNorm scales 1 + 0.1 N(0,1), every bias 0.1 N(0,1), every other weight N(0, 0.1); a tied
tensor is one variable and is drawn once). The seed is the CRC-32 of the directory name, so the pt, tf and flax
files of one family hold different numbers. `probe.npz` holds the ids and the output of the same class after
reloading the saved directory (`from_pretrained` / `load_weights` / `from_preset`), with the padding mask
`ids != pad_token_id` (and `tgt_ids != pad_token_id` for the decoder); GPT-2 and OPT (which numbers its positions
over the mask) get no padding and an all-ones mask. The later families (Llama ... M2M100) state every epsilon their
config has at 1e-3, off the library defaults, so that a reader ignoring the file's epsilon is caught.

`--kind verify` reloads each directory with transformers 4's own cross-loading (`from_tf`, `from_flax`); it fails
`albert-mlm-tf` by 0.43, transformers' bug and not the file's (KNOWN_CROSS_LOAD_BUGS).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SEQ2SEQ_DIMS = dict(d_model=24, encoder_layers=2, decoder_layers=2, encoder_attention_heads=3,
                    decoder_attention_heads=3, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=40)
DECODER_DIMS = dict(vocab_size=99, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
                    max_position_embeddings=40)
BERT_DIMS = dict(vocab_size=99, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
                 max_position_embeddings=40)


@dataclass(frozen=True)
class Family:
    """One transformers model class and the tiny config it is saved with."""

    config_class: str
    model_class: str  # the PyTorch class; the TF and Flax ones are "TF" + it and "Flax" + it
    config: dict
    pad_id: int | None  # None: no padding in the probe (GPT-2)
    type_ids: bool = False  # the probe has src_type_ids (BERT)
    seq2seq: bool = False  # the probe has tgt_ids
    static_positions: bool = False  # sinusoidal position tables are not weights: left as built
    formats: tuple = ("pt", "tf", "flax")
    extra: dict = field(default_factory=dict)


FAMILIES = {
    "bert-mlm": Family("BertConfig", "BertForMaskedLM", dict(BERT_DIMS, type_vocab_size=2, pad_token_id=0), 0,
                       type_ids=True),
    "bert-base": Family("BertConfig", "BertModel", dict(BERT_DIMS, type_vocab_size=2, pad_token_id=0), 0,
                        type_ids=True),
    "roberta-mlm": Family("RobertaConfig", "RobertaForMaskedLM",
                          dict(BERT_DIMS, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2), 1),
    "distilbert-mlm": Family("DistilBertConfig", "DistilBertForMaskedLM",
                             dict(vocab_size=99, dim=24, n_layers=2, n_heads=3, hidden_dim=37,
                                  max_position_embeddings=40, pad_token_id=0), 0),
    "gpt2-lm": Family("GPT2Config", "GPT2LMHeadModel",
                      dict(vocab_size=99, n_embd=24, n_layer=2, n_head=3, n_inner=37, n_positions=40,
                           bos_token_id=98, eos_token_id=98), None),
    "bart-lm": Family("BartConfig", "BartForConditionalGeneration",
                      dict(SEQ2SEQ_DIMS, vocab_size=99, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                           decoder_start_token_id=2, forced_eos_token_id=2), 1, seq2seq=True),
    "marian-mt": Family("MarianConfig", "MarianMTModel",
                        dict(SEQ2SEQ_DIMS, vocab_size=99, decoder_vocab_size=99, pad_token_id=98, eos_token_id=0,
                             decoder_start_token_id=98, forced_eos_token_id=0, activation_function="swish",
                             scale_embedding=True), 98, seq2seq=True, static_positions=True),
    # task models (fine-tuned heads): the same classes' task variants, labels of their own
    "bert-seqcls": Family("BertConfig", "BertForSequenceClassification",
                          dict(BERT_DIMS, type_vocab_size=2, pad_token_id=0, id2label={0: "neg", 1: "neu", 2: "pos"},
                               label2id={"neg": 0, "neu": 1, "pos": 2}), 0, type_ids=True),
    "roberta-tokcls": Family("RobertaConfig", "RobertaForTokenClassification",
                             dict(BERT_DIMS, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                  num_labels=5), 1),
    "distilbert-qa": Family("DistilBertConfig", "DistilBertForQuestionAnswering",
                            dict(vocab_size=99, dim=24, n_layers=2, n_heads=3, hidden_dim=37,
                                 max_position_embeddings=40, pad_token_id=0), 0),
    # the families added later (the readers of each gained their transformers 4.30 era): odd sizes, every
    # epsilon a config states moved off its library default (1e-3) so that a reader ignoring it is caught
    "llama-lm": Family("LlamaConfig", "LlamaForCausalLM",
                       dict(DECODER_DIMS, rms_norm_eps=1e-3, pad_token_id=97, bos_token_id=1, eos_token_id=2), 97,
                       formats=("pt",)),  # transformers 4.30 has no TF or Flax Llama
    "opt-lm": Family("OPTConfig", "OPTForCausalLM",
                     dict(vocab_size=99, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, ffn_dim=37,
                          max_position_embeddings=40, word_embed_proj_dim=24, pad_token_id=1, bos_token_id=2,
                          eos_token_id=2), None),  # OPT numbers positions over the mask, which ours reads as all ones
    "gpt-neox-lm": Family("GPTNeoXConfig", "GPTNeoXForCausalLM",
                          dict(DECODER_DIMS, rotary_pct=0.5, layer_norm_eps=1e-3, pad_token_id=97, bos_token_id=1,
                               eos_token_id=2, tie_word_embeddings=False), 97, formats=("pt",)),
    "gptj-lm": Family("GPTJConfig", "GPTJForCausalLM",
                      dict(vocab_size=99, n_embd=24, n_layer=2, n_head=3, n_inner=37, n_positions=40, rotary_dim=4,
                           layer_norm_epsilon=1e-3, pad_token_id=97, bos_token_id=1, eos_token_id=2), 97),
    "gpt-neo-lm": Family("GPTNeoConfig", "GPTNeoForCausalLM",
                         dict(vocab_size=99, hidden_size=24, num_layers=2, num_heads=3, intermediate_size=37,
                              max_position_embeddings=40, attention_types=[[["global", "local"], 1]], window_size=4,
                              layer_norm_epsilon=1e-3, pad_token_id=97, bos_token_id=1, eos_token_id=2), 97,
                         formats=("pt", "flax")),  # transformers 4.30 has no TF GPT-Neo
    "codegen-lm": Family("CodeGenConfig", "CodeGenForCausalLM",  # CodeGen splits qkv in 4: 4 heads
                         dict(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_inner=37, n_positions=40, n_ctx=40,
                              rotary_dim=4, layer_norm_epsilon=1e-3, pad_token_id=97, bos_token_id=1,
                              eos_token_id=2), 97, formats=("pt",)),
    "electra-mlm": Family("ElectraConfig", "ElectraForMaskedLM",  # factorized: embedding_size 16 != hidden 24
                          dict(BERT_DIMS, embedding_size=16, type_vocab_size=2, layer_norm_eps=1e-3,
                               pad_token_id=0), 0, type_ids=True),
    "albert-mlm": Family("AlbertConfig", "AlbertForMaskedLM",
                         dict(BERT_DIMS, embedding_size=16, type_vocab_size=2, layer_norm_eps=1e-3, pad_token_id=0,
                              bos_token_id=2, eos_token_id=3), 0, type_ids=True),
    "xlm-roberta-mlm": Family("XLMRobertaConfig", "XLMRobertaForMaskedLM",
                              dict(BERT_DIMS, type_vocab_size=1, layer_norm_eps=1e-3, pad_token_id=1, bos_token_id=0,
                                   eos_token_id=2), 1),
    "mbart-lm": Family("MBartConfig", "MBartForConditionalGeneration",
                       dict(SEQ2SEQ_DIMS, vocab_size=99, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                            decoder_start_token_id=2, forced_eos_token_id=2), 1, seq2seq=True),
    "pegasus-lm": Family("PegasusConfig", "PegasusForConditionalGeneration",
                         dict(SEQ2SEQ_DIMS, vocab_size=99, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                              forced_eos_token_id=1, scale_embedding=True), 0, seq2seq=True, static_positions=True),
    "m2m-100-mt": Family("M2M100Config", "M2M100ForConditionalGeneration",
                         dict(SEQ2SEQ_DIMS, vocab_size=99, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                              decoder_start_token_id=2), 1, seq2seq=True, static_positions=True,
                         formats=("pt",)),  # transformers 4.30 has no TF or Flax M2M100
    "llama-seqcls": Family("LlamaConfig", "LlamaForSequenceClassification",
                           dict(DECODER_DIMS, rms_norm_eps=1e-3, pad_token_id=97, bos_token_id=1, eos_token_id=2,
                                num_labels=3), 97, formats=("pt",)),
    "electra-tokcls": Family("ElectraConfig", "ElectraForTokenClassification",
                             dict(BERT_DIMS, embedding_size=16, type_vocab_size=2, layer_norm_eps=1e-3,
                                  pad_token_id=0, num_labels=5), 0, type_ids=True, formats=("tf",)),
    "gpt2-seqcls": Family("GPT2Config", "GPT2ForSequenceClassification",
                          dict(vocab_size=99, n_embd=24, n_layer=2, n_head=3, n_inner=37, n_positions=40,
                               bos_token_id=97, eos_token_id=97, pad_token_id=98, num_labels=3), 98,
                          formats=("pt", "tf")),  # transformers 4 has no Flax GPT-2 classifier
}
WEIGHTS_FILE = {"pt": "pytorch_model.bin", "tf": "tf_model.h5", "flax": "flax_model.msgpack"}
CLASS_PREFIX = {"pt": "", "tf": "TF", "flax": "Flax"}


# --- shared pieces: seeds, perturbation, probe ids, the directory's files ----------------------------------------


def seed_of(name: str) -> int:
    return zlib.crc32(name.encode())


def perturbed(role: str, shape, rng: np.random.Generator) -> np.ndarray:
    """A new value for one parameter: role is "scale" (a norm's), "bias" or "weight"."""
    noise = rng.standard_normal(shape).astype(np.float32)
    return {"scale": 1.0 + 0.1 * noise, "bias": 0.1 * noise, "weight": 0.1 * noise}[role].astype(np.float32)


def keras_role(variable_name: str) -> str:
    """The role of a Keras variable by its name (Keras 2: ".../gamma:0"; Keras 3: "gamma")."""
    leaf = variable_name.split("/")[-1].split(":")[0]
    if leaf == "gamma":
        return "scale"
    return "bias" if leaf == "beta" or "bias" in leaf else "weight"


def perturb_keras_variables(variables, rng: np.random.Generator, skip: str | None = None) -> list[str]:
    """Assigns every variable (each once, in order) a perturbed value; returns the names it touched."""
    seen, touched = set(), []
    for v in variables:
        name = getattr(v, "path", None) or v.name
        if id(v) in seen or (skip and skip in name):
            continue
        seen.add(id(v))
        v.assign(perturbed(keras_role(name), tuple(v.shape), rng))
        touched.append(name)
    return touched


def source_ids(pad_id: int | None) -> np.ndarray:
    """(2, 7) ids with 0 in every row; row 1 ends with two pad ids. Where 0 IS the pad id it appears only there."""
    ids = np.array([[5, 0, 41, 17, 96, 3, 60], [0, 7, 88, 50, 31, 22, 64]], dtype=np.int64)
    if pad_id == 0:
        ids[ids == 0] = 11
    if pad_id is not None:
        ids[1, -2:] = pad_id
    return ids


def target_ids(pad_id: int) -> np.ndarray:
    """(2, 5) decoder ids with 0 in every row; row 1 ends with one pad id. Where 0 IS the pad id it appears only
    there."""
    ids = np.array([[0, 45, 17, 73, 20], [9, 0, 50, 33, 61]], dtype=np.int64)
    if pad_id == 0:
        ids[ids == 0] = 11
    ids[1, -1] = pad_id
    return ids


def make_probe(fam: Family) -> dict:
    probe = {"src_ids": source_ids(fam.pad_id)}
    if fam.type_ids:
        probe["src_type_ids"] = np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0]], dtype=np.int64)
    if fam.seq2seq:
        probe["tgt_ids"] = target_ids(fam.pad_id)
    return probe


def model_inputs(fam: Family, probe: dict) -> dict:
    """The transformers keyword arguments (NumPy int64) that run a family on its probe."""
    src = probe["src_ids"]
    mask = np.ones_like(src) if fam.pad_id is None else (src != fam.pad_id).astype(np.int64)
    inputs = {"input_ids": src, "attention_mask": mask}
    if fam.type_ids:
        inputs["token_type_ids"] = probe["src_type_ids"]
    if fam.seq2seq:
        inputs["decoder_input_ids"] = probe["tgt_ids"]
        inputs["decoder_attention_mask"] = (probe["tgt_ids"] != fam.pad_id).astype(np.int64)
    return inputs


def outputs_of(result) -> dict:
    """`output` (logits, or last_hidden_state for a bare encoder) and `pooler` where the class has one."""
    if getattr(result, "start_logits", None) is not None:  # question answering: start and end, stacked as ours
        main = np.stack([np.asarray(result.start_logits), np.asarray(result.end_logits)], axis=-1)
    else:
        main = result.logits if hasattr(result, "logits") else result.last_hidden_state
    out = {"output": np.asarray(main, dtype=np.float32)}
    if getattr(result, "pooler_output", None) is not None:
        out["pooler"] = np.asarray(result.pooler_output, dtype=np.float32)
    return out


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def finish_dir(path: Path, keep_weights: list[str], probe: dict, outputs: dict, versions: dict) -> None:
    """Drops weight files other than keep_weights, writes probe.npz and versions.json."""
    for f in path.iterdir():  # config.json and generation_config.json stay as save_pretrained wrote them
        is_weights = f.suffix in (".bin", ".h5", ".msgpack", ".safetensors") or f.name.endswith(".index.json")
        if is_weights and f.name not in keep_weights:
            f.unlink()
    missing = [w for w in keep_weights if not (path / w).exists()]
    if missing:
        raise FileNotFoundError(f"{path.name}: save wrote no {missing}; it wrote {sorted(os.listdir(path))}")
    np.savez(path / "probe.npz", **probe, **outputs)
    (path / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")


def python_version() -> str:
    return platform.python_version()


# --- kind "hf4": transformers 4 PyTorch, TF and Flax classes ------------------------------------------------------


def perturb_torch(model, rng: np.random.Generator, fam: Family) -> None:
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():  # yields a tied parameter once
            if fam.static_positions and "embed_positions" in name:
                continue
            owner = model.get_submodule(name.rpartition(".")[0])
            leaf = name.rpartition(".")[2]
            is_norm = isinstance(owner, torch.nn.LayerNorm) or type(owner).__name__.endswith("RMSNorm")
            role = "scale" if is_norm and leaf == "weight" else (
                "bias" if leaf.endswith("bias") else "weight")
            p.copy_(torch.from_numpy(perturbed(role, tuple(p.shape), rng)))
        for name, b in model.named_buffers():
            if name.endswith("final_logits_bias"):
                b.copy_(torch.from_numpy(perturbed("bias", tuple(b.shape), rng)))


def perturb_flax_params(params, rng: np.random.Generator) -> dict:
    from flax.core import unfreeze
    from flax.traverse_util import flatten_dict, unflatten_dict

    flat = flatten_dict(unfreeze(params))
    new = {}
    for key in sorted(flat):
        leaf = key[-1]
        role = "scale" if leaf == "scale" else ("bias" if "bias" in leaf else "weight")
        new[key] = perturbed(role, flat[key].shape, rng)
    return unflatten_dict(new)


def run_torch(model, fam: Family, probe: dict) -> dict:
    import torch

    inputs = {k: torch.from_numpy(v) for k, v in model_inputs(fam, probe).items()}
    with torch.no_grad():
        return outputs_of(model.eval()(**inputs))


def run_tf(model, fam: Family, probe: dict) -> dict:
    inputs = {k: v.astype(np.int32) for k, v in model_inputs(fam, probe).items()}
    return outputs_of(model(inputs, training=False))


def run_flax(model, fam: Family, probe: dict) -> dict:
    import inspect

    inputs = {k: v.astype(np.int32) for k, v in model_inputs(fam, probe).items()}
    # FlaxOPT runs deterministic by default and takes no `train`
    mode = {"train": False} if "train" in inspect.signature(model.__call__).parameters else {}
    return outputs_of(model(**inputs, **mode))


def hf4_versions(fmt: str) -> dict:
    import transformers

    versions = {"python": python_version(), "numpy": np.__version__, "transformers": transformers.__version__}
    if fmt == "pt":
        import torch

        versions["torch"] = torch.__version__
    elif fmt == "tf":
        import keras
        import tensorflow as tf

        versions.update(tensorflow=tf.__version__, keras=keras.__version__)
    else:
        import flax
        import jax
        import jaxlib

        versions.update(jax=jax.__version__, jaxlib=jaxlib.__version__, flax=flax.__version__)
    return versions


def save_hf4(out: Path, family: str, fmt: str, suffix: str = "", shard: str | None = None) -> Path:
    """Builds, perturbs, saves and probes one family in one format; shard: save_pretrained's max_shard_size."""
    import transformers

    fam = FAMILIES[family]
    name = f"{family}-{fmt}{suffix}"
    path, seed = fresh_dir(out / name), seed_of(name)
    rng = np.random.default_rng(seed)
    config = getattr(transformers, fam.config_class)(**fam.config)
    cls = getattr(transformers, CLASS_PREFIX[fmt] + fam.model_class)
    probe = make_probe(fam)
    sharding = {"max_shard_size": shard} if shard else {}
    if fmt == "pt":
        import torch

        torch.manual_seed(seed)
        model = cls(config).eval()
        perturb_torch(model, rng, fam)
        model.save_pretrained(path, safe_serialization=False, **sharding)
        outputs = run_torch(cls.from_pretrained(path), fam, probe)
    elif fmt == "tf":
        import tensorflow as tf

        tf.random.set_seed(seed)
        model = cls(config)
        run_tf(model, fam, probe)  # builds the variables
        perturb_keras_variables(model.weights, rng, skip="embed_positions" if fam.static_positions else None)
        model.save_pretrained(path, **sharding)
        outputs = run_tf(cls.from_pretrained(path), fam, probe)
    else:
        model = cls(config, seed=seed % 2**31)
        model.params = perturb_flax_params(model.params, rng)
        model.save_pretrained(path, **sharding)
        outputs = run_flax(cls.from_pretrained(path), fam, probe)
    if shard:
        stem = WEIGHTS_FILE[fmt].partition(".")[0]  # pytorch_model, tf_model, flax_model: shards and their index
        keep = sorted(f.name for f in path.iterdir() if f.name.startswith(stem))
    else:
        keep = [WEIGHTS_FILE[fmt]]
    versions = dict(hf4_versions(fmt), family=family, format=fmt, **{"class": cls.__name__}, seed=seed)
    finish_dir(path, keep, probe, outputs, versions)
    print(f"wrote {name}: {', '.join(sorted(os.listdir(path)))}")
    return path


def write_hf4(out: Path, only: set[str] | None = None) -> None:
    for family, fam in FAMILIES.items():
        for fmt in fam.formats:
            if only is None or f"{family}-{fmt}" in only:
                save_hf4(out, family, fmt)
    for fmt in ("pt", "tf", "flax"):
        if only is None or f"bert-mlm-{fmt}-sharded" in only:
            save_hf4(out, "bert-mlm", fmt, suffix="-sharded", shard="20KB")


def write_hf4_buffers(out: Path) -> None:
    """GPT-2 as transformers <= 4.29 saved it: the causal-mask buffers attn.bias and attn.masked_bias in the file."""
    import torch

    path = save_hf4(out, "gpt2-lm", "pt", suffix="-buffers")
    keys = torch.load(path / WEIGHTS_FILE["pt"], map_location="cpu").keys()
    if not any(k.endswith("attn.masked_bias") for k in keys):
        raise RuntimeError(f"this transformers saved no attn.bias/masked_bias buffers (keys: {sorted(keys)[:8]}...); "
                           "run --kind hf4-buffers in the hf4-buffers env (transformers 4.26.1)")


# --- kind "keras2": a tutorial-style tf.keras Transformer saved with save_weights("model.h5") --------------------

KERAS2_SOURCE = '''"""A post-norm Transformer encoder LM in tf.keras (Keras 2), written the way the keras.io tutorials write it.

Layer and weight names are the ones Keras assigns automatically; build the model in a fresh session
(`keras.backend.clear_session()`) to get the names stored in model.h5.
"""

import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = tf.shape(x)[-1]
        positions = tf.range(start=0, limit=maxlen, delta=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim // num_heads)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


def build_model(vocab_size=99, maxlen=40, embed_dim=24, num_heads=3, ff_dim=37, num_layers=2):
    inputs = layers.Input(shape=(None,), dtype="int32")
    x = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)(inputs)
    for _ in range(num_layers):
        x = TransformerBlock(embed_dim, num_heads, ff_dim)(x)
    outputs = layers.Dense(vocab_size)(x)
    return keras.Model(inputs=inputs, outputs=outputs)
'''


def import_from(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fresh_keras2_model(directory: Path):
    """The model of directory/model_keras2.py, built in a fresh Keras session (so auto-names match model.h5)."""
    from tensorflow import keras

    keras.backend.clear_session()
    return import_from(directory / "model_keras2.py").build_model()


def write_keras2(out: Path) -> None:
    import keras
    import tensorflow as tf

    if not keras.__version__.startswith("2."):
        raise RuntimeError(f"--kind keras2 needs tf.keras 2.x (the hf4 env); received keras {keras.__version__}")
    name = "keras2-encoder-h5"
    path, seed = fresh_dir(out / name), seed_of(name)
    (path / "model_keras2.py").write_text(KERAS2_SOURCE)
    tf.random.set_seed(seed)
    model = fresh_keras2_model(path)
    perturb_keras_variables(model.weights, np.random.default_rng(seed))
    model.save_weights(str(path / "model.h5"))
    probe = {"src_ids": source_ids(None)}
    reloaded = fresh_keras2_model(path)
    reloaded.load_weights(str(path / "model.h5"))
    outputs = {"output": np.asarray(reloaded(probe["src_ids"].astype(np.int32), training=False), np.float32)}
    versions = {"python": python_version(), "numpy": np.__version__, "tensorflow": tf.__version__,
                "keras": keras.__version__, "class": "model_keras2.build_model", "seed": seed,
                "layer_names": [layer.name for layer in reloaded.layers],
                "weight_names": [w.name for w in reloaded.weights]}
    finish_dir(path, ["model.h5"], probe, outputs, versions)
    print(f"wrote {name}: {', '.join(sorted(os.listdir(path)))}")


# --- kind "kerasnlp": keras-nlp backbones saved with save_to_preset ----------------------------------------------

KERASNLP_BACKBONES = {
    "kerasnlp-bert-preset": ("BertBackbone", dict(vocabulary_size=99, num_layers=2, num_heads=3, hidden_dim=24,
                                                  intermediate_dim=37, max_sequence_length=40, num_segments=2), 0),
    "kerasnlp-gpt2-preset": ("GPT2Backbone", dict(vocabulary_size=99, num_layers=2, num_heads=3, hidden_dim=24,
                                                  intermediate_dim=37, max_sequence_length=40), None),
}


def keras_backbone_inputs(probe: dict, pad_id: int | None) -> dict:
    src = probe["src_ids"]
    inputs = {"token_ids": src.astype(np.int32),
              "padding_mask": np.ones_like(src, dtype=bool) if pad_id is None else src != pad_id}
    if "src_type_ids" in probe:
        inputs["segment_ids"] = probe["src_type_ids"].astype(np.int32)
    return inputs


def run_backbone(backbone, probe: dict, pad_id: int | None) -> dict:
    result = backbone(keras_backbone_inputs(probe, pad_id), training=False)
    if isinstance(result, dict):  # BertBackbone: sequence_output and pooled_output
        return {"output": np.asarray(result["sequence_output"], np.float32),
                "pooler": np.asarray(result["pooled_output"], np.float32)}
    return {"output": np.asarray(result, np.float32)}


def write_kerasnlp(out: Path) -> None:
    import keras
    import keras_nlp
    import tensorflow as tf

    for name, (cls_name, kwargs, pad_id) in KERASNLP_BACKBONES.items():
        path, seed = fresh_dir(out / name), seed_of(name)
        keras.utils.set_random_seed(seed % 2**31)
        cls = getattr(keras_nlp.models, cls_name)
        backbone = cls(**kwargs)
        perturb_keras_variables(backbone.weights, np.random.default_rng(seed))
        backbone.save_to_preset(str(path))
        probe = {"src_ids": source_ids(pad_id)}
        if cls_name == "BertBackbone":
            probe["src_type_ids"] = make_probe(FAMILIES["bert-base"])["src_type_ids"]
        outputs = run_backbone(cls.from_preset(str(path)), probe, pad_id)
        versions = {"python": python_version(), "numpy": np.__version__, "keras_nlp": keras_nlp.__version__,
                    "keras": keras.__version__, "keras_backend": keras.backend.backend(),
                    "tensorflow": tf.__version__, "class": f"keras_nlp.models.{cls_name}", "seed": seed}
        weights = [f.name for f in path.iterdir() if f.suffix == ".h5"]
        finish_dir(path, weights, probe, outputs, versions)
        print(f"wrote {name}: {', '.join(sorted(os.listdir(path)))}")


# --- kind "verify": reload each directory with what this env has and compare with probe.npz ----------------------


def verify_hf(path: Path, versions: dict, probe: dict) -> dict | None:
    """The PyTorch class reloads the directory (from_tf / from_flax for the others): transformers 4's cross-load."""
    import transformers

    fmt = versions["format"]
    if fmt != "pt" and int(transformers.__version__.split(".")[0]) >= 5:
        return None  # transformers 5 has no TF or Flax classes
    if fmt != "pt" and path.name.endswith("-sharded"):
        return None  # transformers 4.30's PyTorch classes cross-load no sharded TF or Flax file
    fam = FAMILIES[versions["family"]]
    model = getattr(transformers, fam.model_class).from_pretrained(path, from_tf=fmt == "tf",
                                                                    from_flax=fmt == "flax")
    if fmt == "tf" and hasattr(model, "final_logits_bias"):
        restore_final_logits_bias(model, path / WEIGHTS_FILE["tf"])
    return run_torch(model, fam, probe)


def restore_final_logits_bias(model, h5_path: Path) -> None:
    """transformers 4.30's from_tf fills named_parameters() only and so silently leaves the final_logits_bias
    buffer (BART, Marian) at zeros while reporting every TF weight used; read it from the file instead."""
    import h5py
    import torch

    with h5py.File(h5_path, "r") as f:
        value = f["final_logits_bias/final_logits_bias:0"][()]
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.from_numpy(value))


def verify_keras2(path: Path, probe: dict) -> dict | None:
    """Rebuilds model_keras2.py (Keras 2 here, or Keras 3 where tf.keras is Keras 3) and loads model.h5."""
    model = fresh_keras2_model(path)
    model.load_weights(str(path / "model.h5"))
    return {"output": np.asarray(model(probe["src_ids"].astype(np.int32), training=False), np.float32)}


def verify_keras_preset(path: Path, versions: dict, probe: dict) -> dict | None:
    """keras-nlp reloads its own preset; KerasHub (where installed instead) reads the keras-nlp-era preset."""
    try:
        import keras_nlp as models_pkg
    except ImportError:
        try:
            import keras_hub as models_pkg
        except ImportError:
            return None
    cls = getattr(models_pkg.models, versions["class"].rpartition(".")[2])
    pad_id = None if "gpt2" in path.name else 0
    return run_backbone(cls.from_preset(str(path)), probe, pad_id)


# directories whose PyTorch reload by transformers 4.30's from_tf / from_flax is known not to be the saved model
KNOWN_CROSS_LOAD_BUGS = {
    "albert-mlm-tf": "TFAlbertMLMHead adds decoder/bias and never reads its bias; PyTorch ties the two and from_tf "
                     "fills them from bias",
}


def verify(out: Path) -> int:
    failures = 0
    for path in sorted(p for p in out.iterdir() if (p / "versions.json").exists()):
        versions = json.loads((path / "versions.json").read_text())
        with np.load(path / "probe.npz") as npz:
            probe = dict(npz)
        try:
            if "transformers" in versions:
                got = verify_hf(path, versions, probe)
                tol = 1e-5 if versions["format"] == "pt" else 1e-4
            elif path.name.startswith("keras2"):
                got, tol = verify_keras2(path, probe), 1e-5
            else:
                got, tol = verify_keras_preset(path, versions, probe), 1e-5
        except ImportError as e:
            got, tol = None, 0.0
            print(f"{path.name:28s} skipped ({e})")
            continue
        if got is None:
            print(f"{path.name:28s} skipped (this env cannot read it)")
            continue
        diffs = {k: float(np.max(np.abs(got[k] - probe[k]))) for k in got if k in probe}
        ok = all(d <= tol for d in diffs.values()) and "output" in diffs
        if not ok and path.name in KNOWN_CROSS_LOAD_BUGS:
            print(f"{path.name:28s} known: {KNOWN_CROSS_LOAD_BUGS[path.name]}")
            continue
        failures += not ok
        shown = ", ".join(f"{k} {d:.2e}" for k, d in diffs.items())
        print(f"{path.name:28s} {'ok  ' if ok else 'FAIL'} max|diff| {shown} (tol {tol:.0e})")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", required=True, choices=["hf4", "hf4-buffers", "keras2", "kerasnlp", "verify"])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "parity_tests" / "wild")
    parser.add_argument("--only", nargs="+", metavar="DIR", help="write only these directories (--kind hf4)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.kind == "verify":
        failures = verify(args.out)
        print(f"{failures} failed")
        return 1 if failures else 0
    if args.only:
        if args.kind != "hf4":
            parser.error("--only selects among --kind hf4's directories")
        write_hf4(args.out, set(args.only))
        return 0
    writers = {"hf4": write_hf4, "hf4-buffers": write_hf4_buffers, "keras2": write_keras2, "kerasnlp": write_kerasnlp}
    writers[args.kind](args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
