"""Measure the ported models of docs/layouts.md and docs/kerashub.md: max abs logit error of the source model's own
forward, of torch_impl and of tf_impl, against each other and against the float64 NumPy reference, in float32 and
float64. Prints the Markdown tables the docs quote.

    python docs/examples/measure.py            # ~1 minute on 2 cores

The models are the ones the tests build (parity_tests/test_layouts.py, parity_tests/test_kerashub.py), at the same
tiny sizes; the inputs are padded (rows 1-2).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import warnings  # noqa: E402

import numpy as np  # noqa: E402

import reference_numpy as rn  # noqa: E402
from transformer_parity import formats  # noqa: E402
from transformer_parity.cli import main  # noqa: E402
from transformer_parity.verify import trace  # noqa: E402

warnings.filterwarnings("ignore")
EXAMPLES = ROOT / "docs" / "examples"


def err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def row(name: str, config, weights, inputs: dict, source: dict[str, np.ndarray], output: str = "logits") -> list[str]:
    """One line per dtype: source vs reference, torch_impl and tf_impl vs source and vs reference."""
    src, tgt, types = inputs.get("src"), inputs.get("tgt"), inputs.get("types")
    judge = trace("numpy", config, weights, "float64", src, tgt, types)[output]
    lines = []
    for dtype in ("float32", "float64"):
        if dtype not in source:
            continue
        ours = {b: trace(b, config, weights, dtype, src, tgt, types)[output] for b in ("numpy", "torch", "keras")}
        cells = [err(source[dtype], judge)] + [err(ours[b], source[dtype]) for b in ("torch", "keras")] + \
                [err(ours[b], judge) for b in ("numpy", "torch", "keras")]
        label = dtype if not dtype.endswith("*") else dtype
        lines.append(f"| {name} | {label} | " + " | ".join(f"{c:.1e}" for c in cells) + " |")
    return lines


def hand_written(tmp: Path) -> list[str]:
    import keras
    import torch

    from parity_tests import test_layouts as t

    lines = []
    torch.manual_seed(0)
    for name, classes, kwargs, layout, vocab, classes_n in (
            ("PyTorch W_Q/W_K/W_V/W_O encoder", t.torch_encoder_classes, dict(vocab=50, n_classes=7),
             "torch_encoder.toml", 50, 7),
            ("Lightning fused qkv_proj (interleaved)", t.lightning_encoder_classes,
             dict(vocab=40, model_dim=32, num_classes=5, num_heads=4, num_layers=2, dropout=0.1),
             "lightning_encoder.toml", 40, 5)):
        build = lambda: classes()(**kwargs)  # noqa: E731
        model = t.train_a_little(build(), vocab=vocab, n_classes=classes_n)
        path = tmp / f"{layout}.pt"
        torch.save(model.state_dict(), path)
        out = tmp / f"{layout}.safetensors"
        assert main(["--quiet", "convert", "--force", "--layout", str(EXAMPLES / layout), str(path), str(out)]) == 0
        loaded = formats.load(out)
        src = rn.sample_ids(loaded.config, batch=3, length=20, vocab_size=vocab, seed=1)
        logits32, logits64 = t.torch_logits(model, src, build)
        lines += row(name, loaded.config, loaded.weights, {"src": src}, {"float32": logits32, "float64": logits64})

    Encoder = t.keras_encoder_class()
    kwargs = dict(num_layers=2, d_model=32, num_heads=4, dff=64, vocab_size=50, n_classes=6)
    keras.utils.set_random_seed(3)
    model = Encoder(**kwargs)
    rng = np.random.default_rng(0)
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True)
    model.fit(rng.integers(1, 50, size=(8, 12)), rng.integers(0, 6, size=(8, 12)), epochs=2, batch_size=4, verbose=0)
    path = tmp / "keras.weights.h5"
    model.save_weights(path)
    out = tmp / "keras.safetensors"
    assert main(["--quiet", "convert", "--force", "--layout", str(EXAMPLES / "keras_encoder.toml"), str(path),
                 str(out)]) == 0
    loaded = formats.load(out)
    src = rn.sample_ids(loaded.config, batch=3, length=20, vocab_size=50, seed=3)
    logits32 = np.asarray(model(src))
    keras.config.set_dtype_policy("float64")
    model64 = Encoder(**kwargs)
    model64(src)
    keras.config.set_dtype_policy("float32")
    model64.set_weights([w.astype(np.float64) for w in model.get_weights()])
    lines += row("Keras Dense wq/wk/wv/dense, eps 1e-6", loaded.config, loaded.weights, {"src": src},
                 {"float32": logits32, "float64": np.asarray(model64(src))})
    return lines


def kerashub(tmp: Path) -> list[str]:
    import keras
    import keras_hub

    from parity_tests import test_kerashub as t

    lines = []
    backbone = keras_hub.models.GPT2Backbone(**t.GPT2, dropout=0.0)
    t.exercise(backbone)
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    lm.save_to_preset(str(tmp / "gpt2"))
    loaded = formats.load(tmp / "gpt2")
    ids = rn.sample_ids(loaded.config, batch=3, length=16, vocab_size=50, seed=1)
    b64 = keras_hub.models.GPT2Backbone(**t.GPT2, dropout=0.0, dtype="float64")
    b64.set_weights([w.astype(np.float64) for w in backbone.get_weights()])
    lm64 = keras_hub.models.GPT2CausalLM(backbone=b64, preprocessor=None)
    raw64 = t.gpt2_logits(lm64, ids)
    t.float64_exact(lm64)
    source = {"float32": t.gpt2_logits(lm, ids), "float64": t.gpt2_logits(lm64, ids)}
    lines += row("GPT2CausalLM", loaded.config, loaded.weights, {"src": ids}, source)
    judge = trace("numpy", loaded.config, loaded.weights, "float64", ids, None)["logits"]
    lines.append(f"| GPT2CausalLM | float64, Keras as is | {err(raw64, judge):.1e} | | | | | |")

    backbone = keras_hub.models.BertBackbone(**t.BERT, dropout=0.0)
    t.exercise(backbone, seed=1)
    backbone.save_to_preset(str(tmp / "bert"))
    loaded = formats.load(tmp / "bert")
    ids = rn.sample_ids(loaded.config, batch=3, length=16, vocab_size=50, seed=3)
    types = rn.sample_type_ids(loaded.config, ids, seed=3)
    b64 = t.float64_copy(keras_hub.models.BertBackbone, {**t.BERT, "dropout": 0.0}, backbone)
    source = {"float32": t.bert_outputs(backbone, ids, types)["last_hidden_state"],
              "float64": t.bert_outputs(b64, ids, types)["last_hidden_state"]}
    lines += row("BertBackbone (sequence output)", loaded.config, loaded.weights, {"src": ids, "types": types},
                 source, output="last_hidden_state")

    lm = keras_hub.models.BertMaskedLM(backbone=keras_hub.models.BertBackbone(**t.BERT, dropout=0.0),
                                       preprocessor=None)
    t.exercise(lm, seed=5)
    lm.save_to_preset(str(tmp / "mlm"))
    loaded = formats.load(tmp / "mlm")
    ids, types, _ = t.mlm_inputs(loaded.config)
    every = np.tile(np.arange(ids.shape[1], dtype=np.int32), (len(ids), 1))  # mask_positions: all, in order
    lm64 = keras_hub.models.BertMaskedLM(
        backbone=keras_hub.models.BertBackbone(**t.BERT, dropout=0.0, dtype="float64"), preprocessor=None)
    lm64.set_weights([w.astype(np.float64) for w in lm.get_weights()])
    raw64 = t.mlm_logits(lm64, ids, types, every)
    t.float64_exact(lm64)
    source = {"float32": t.mlm_logits(lm, ids, types, every), "float64": t.mlm_logits(lm64, ids, types, every)}
    lines += row("BertMaskedLM (every position)", loaded.config, loaded.weights, {"src": ids, "types": types}, source)
    judge = trace("numpy", loaded.config, loaded.weights, "float64", ids, None, types)["logits"]
    lines.append(f"| BertMaskedLM | float64, Keras as is | {err(raw64, judge):.1e} | | | | | |")

    model = t.english_to_spanish()
    t.exercise(model, seed=2)
    model.save_weights(tmp / "s2s.weights.h5")
    loaded = formats.load(tmp / "s2s.weights.h5", "kerashub-seq2seq")
    src, tgt = rn.sample_batch(loaded.config, batch=3, src_len=14, tgt_len=11, seed=4)
    src[0, -4:], src[1, 1:], tgt[2, -3:] = 0, 0, 0  # padded as the test pads them (mask_zero: id 0)
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    model64 = t.english_to_spanish()
    keras.config.set_dtype_policy("float32")
    keras.config.set_floatx("float32")
    model64.set_weights([w.astype(np.float64) for w in model.get_weights()])
    t.float64_exact(model64)
    source = {"float32": t.seq2seq_logits(model, src, tgt), "float64": t.seq2seq_logits(model64, src, tgt)}
    lines += row("keras.io English-to-Spanish (seq2seq)", loaded.config, loaded.weights, {"src": src, "tgt": tgt},
                 source)
    return lines


HEADER = ["| model | dtype | source vs reference | torch_impl vs source | tf_impl vs source | numpy vs reference | "
          "torch_impl vs reference | tf_impl vs reference |",
          "|---|---|---|---|---|---|---|---|"]

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print("\n".join(HEADER + hand_written(Path(tmp))))
        print()
        print("\n".join(HEADER + kerashub(Path(tmp))))
