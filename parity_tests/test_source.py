"""`verify` against the model the weights came from (`transformer_parity.verify.source`, docs/verify.md "What a verdict
proves"): a user's source file (docs/examples/seq2seq_source.py, and an encoder written here), an --expect file from
--write-probe, and the built-in sources (transformers, keras_hub, torch.nn). A right port passes and the verdict names
the source; a wrong setting fails against the source and names where it starts; bad sources are one line, exit 2."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from transformer_parity import cli

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "seq2seq_source.py"
SHAPE = ["--batch", "3", "--src-len", "13", "--tgt-len", "11"]
# The tutorial's settings, which its state dict cannot tell; stated, as the user states them.
TUTORIAL = ["--set", "num_heads=4", "--set", "pad_id=1", "--set", "activation=relu", "--set", "norm_first=false",
            "--set", "layer_norm_eps=1e-5", "--set", "scale_embedding=true", "--set", "dropout=0.1"]


def _example():
    spec = importlib.util.spec_from_file_location("seq2seq_source_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _perturb(model, seed: int):
    """Every parameter moved by 0.1 N(0, 1): norms and biases away from their initial ones and zeros."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


@pytest.fixture
def tutorial(tmp_path, monkeypatch):
    """The example's model, perturbed and saved; the example reads it through SOURCE_CHECKPOINT."""
    path = tmp_path / "seq2seq.pt"
    torch.save(_perturb(_example().Seq2SeqTransformer(), 3).state_dict(), path)
    monkeypatch.setenv("SOURCE_CHECKPOINT", str(path))
    return path


def verify(capsys, *args) -> tuple[int, dict]:
    """`verify ... --json -`: (exit status, the report)."""
    capsys.readouterr()
    code = cli.main(["verify", *map(str, args), "--json", "-"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip() else {})


def source_rows(report, sublayer=None):
    return [r for r in report["rows"] if r["kind"] == "source" and sublayer in (None, r["sublayer"])]


def assert_one_line(code, err, *fragments):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- the example source file: a right port passes, named; a wrong setting fails against it ---------------------------

@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_example_source_passes_a_right_port_and_the_verdict_names_it(tutorial, capsys):
    code, report = verify(capsys, tutorial, *TUTORIAL, "--source", f"{EXAMPLE}:forward", "--backends", "numpy,torch",
                          *SHAPE)
    assert code == 0 and report["passed"]
    assert report["verdict"].startswith(f"PASS: matches the source ({EXAMPLE}:forward) to ")
    assert report["source"] == {"runs": [{"label": "source", "name": f"{EXAMPLE}:forward", "kind": "file",
                                          "dtype": "float32"}], "self_consistent_only": None}
    rows = {tuple(r["backends"]): r for r in source_rows(report, "logits")}
    assert set(rows) == {("source", "numpy-f64"), ("numpy-f32", "source"), ("torch", "source")}
    assert rows[("source", "numpy-f64")]["max_abs_err"] < 1e-5 and all(r["passed"] for r in rows.values())
    assert source_rows(report) == list(rows.values())  # no intermediates: the output alone


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_wrong_head_count_fails_against_the_source_and_passes_without_one(tutorial, capsys):
    wrong = [*TUTORIAL, "--set", "num_heads=8"]  # the tutorial has 4: what a guess of nn.Transformer's default gives
    code, report = verify(capsys, tutorial, *wrong, "--source", f"{EXAMPLE}:forward_with_sublayers",
                          "--backends", "torch", *SHAPE)
    assert code == 1 and report["verdict"].startswith(f"FAIL: differs from the source ({EXAMPLE}:forward_with_sub")
    assert report["first_divergence"] == "encoder.layers.0" and "source" in report["first_divergence_backends"]
    assert all(r["passed"] for r in report["rows"] if r["kind"] != "source")  # self-consistent all the same
    code, report = verify(capsys, tutorial, *wrong, "--no-source", "--backends", "torch", *SHAPE)
    assert code == 0 and report["verdict"].startswith("PASS (self-consistent only: --no-source; judged by numpy-f64")
    assert report["source"] == {"runs": [], "self_consistent_only": "--no-source"}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_wrong_epsilon_fails_at_the_first_layer_the_source_exposes_else_at_the_output(tutorial, capsys):
    wrong = [*TUTORIAL, "--set", "layer_norm_eps=1e-3"]
    code, report = verify(capsys, tutorial, *wrong, "--source", f"{EXAMPLE}:forward_with_sublayers",
                          "--backends", "torch", *SHAPE)
    assert code == 1 and report["first_divergence"] == "encoder.layers.0"
    failing = [r for r in source_rows(report) if not r["passed"]]
    assert {r["sublayer"] for r in failing} >= {"encoder.layers.0", "decoder.layers.1", "logits"}
    code, report = verify(capsys, tutorial, *wrong, "--source", f"{EXAMPLE}:forward", "--backends", "torch", *SHAPE)
    assert code == 1 and report["first_divergence"] == "logits"
    assert report["verdict"].startswith(f"FAIL: differs from the source ({EXAMPLE}:forward): first divergent "
                                        "sublayer logits (")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_float64_source_is_held_to_its_float64_floor(tutorial, tmp_path, capsys):
    """float64 from a float64 model: ~1e-15 off, passes. The float32 model's output cast to float64: its float32
    rounding (~1e-7) is 1e6 float64 floors, and it fails."""
    code, report = verify(capsys, tutorial, *TUTORIAL, "--source", f"{EXAMPLE}:forward64", "--backends", "torch",
                          *SHAPE)
    judged = next(r for r in source_rows(report, "logits") if r["backends"] == ["source", "numpy-f64"])
    assert code == 0 and report["source"]["runs"][0]["dtype"] == "float64"
    assert judged["max_abs_err"] < 1e-12 and judged["tolerance"] < 1e-10
    assert "in float64" in report["verdict"]
    cast = tmp_path / "cast.py"
    cast.write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("example_for_cast", {str(EXAMPLE)!r})
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)

        def forward(batch):
            return example.forward(batch).astype("float64")  # float32 work, float64 dtype
        """))
    code, report = verify(capsys, tutorial, *TUTORIAL, "--source", f"{cast}:forward", "--backends", "torch", *SHAPE)
    judged = next(r for r in source_rows(report, "logits") if r["backends"] == ["source", "numpy-f64"])
    assert code == 1 and judged["ratio"] > 1e4 and report["verdict"].startswith("FAIL: differs from the source")


# --- an encoder written here, with its sublayers exposed ----------------------------------------------------------

ENCODER_SOURCE = '''
import math
import torch
from torch import nn

VOCAB, D, HEADS, FF, LAYERS, PAD = 41, 24, 3, 40, 2, 5


class Encoder(nn.Module):
    """Batch-first, pre-LN, GELU, learned positions, its own output Linear."""

    def __init__(self):
        super().__init__()
        self.tok_embedding = nn.Embedding(VOCAB, D)
        self.pos_embedding = nn.Parameter(torch.zeros(30, D))
        layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True, layer_norm_eps=1e-6)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, norm=nn.LayerNorm(D, eps=1e-6),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        x = self.tok_embedding(ids) + self.pos_embedding[: ids.shape[1]]
        return self.head(self.encoder(x, src_key_padding_mask=ids == PAD))


def build(path=None):
    model = Encoder()
    if path is not None:
        model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def forward(batch):
    import os
    model = build(os.environ["ENCODER_CHECKPOINT"])
    found = {}
    for i, layer in enumerate(model.encoder.layers):
        name = f"encoder.layers.{i}"
        layer.self_attn.register_forward_hook(lambda m, a, out, n=name: found.__setitem__(n + ".self_attn", out[0]))
        layer.linear2.register_forward_hook(lambda m, a, out, n=name: found.__setitem__(n + ".ffn", out))
        layer.register_forward_hook(lambda m, a, out, n=name: found.__setitem__(n, out))
    with torch.no_grad():
        logits = model(torch.as_tensor(batch["src_ids"]))
    return {"output": logits, **found}
'''
ENCODER_SETTINGS = ["--set", "num_heads=3", "--set", "activation=gelu", "--set", "norm_first=true", "--set",
                    "layer_norm_eps=1e-6", "--set", "scale_embedding=false", "--set", "pad_id=5", "--set",
                    "dropout=0"]


@pytest.fixture
def encoder(tmp_path, monkeypatch):
    source = tmp_path / "encoder_source.py"
    source.write_text(ENCODER_SOURCE)
    spec = importlib.util.spec_from_file_location("encoder_source_for_test", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = _perturb(module.build(), 11)
    path = tmp_path / "encoder.pt"
    torch.save(model.state_dict(), path)
    monkeypatch.setenv("ENCODER_CHECKPOINT", str(path))
    return path, f"{source}:forward"


def test_an_encoder_with_sublayers_passes_and_a_wrong_norm_placement_is_located(encoder, capsys):
    path, spec = encoder
    code, report = verify(capsys, path, *ENCODER_SETTINGS, "--source", spec, "--backends", "torch", "--batch", "2",
                          "--src-len", "17")
    assert code == 0, report["verdict"]
    named = {r["sublayer"] for r in source_rows(report)}
    assert {"encoder.layers.0.self_attn", "encoder.layers.1.ffn", "encoder.layers.1", "logits"} <= named
    code, report = verify(capsys, path, *ENCODER_SETTINGS, "--set", "norm_first=false", "--source", spec,
                          "--backends", "torch", "--batch", "2", "--src-len", "17")
    assert code == 1 and report["first_divergence"] == "encoder.layers.0.self_attn"


# --- --write-probe and --expect -------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::UserWarning")
def test_probe_and_expect_round_trip(tutorial, tmp_path, capsys):
    probe = tmp_path / "probe.npz"
    assert cli.main(["verify", str(tutorial), *TUTORIAL, "--write-probe", str(probe), *SHAPE]) == 0
    with np.load(probe, allow_pickle=False) as data:
        inputs = {k: data[k] for k in data.files}
    assert sorted(inputs) == ["src_ids", "tgt_ids"] and inputs["src_ids"].shape == (3, 13)
    assert inputs["tgt_ids"].shape == (3, 11) and inputs["src_ids"].dtype == np.int64
    assert (inputs["src_ids"] == 0).any()  # id 0 is a token like any other here (the pad id is 1)
    capsys.readouterr()
    assert cli.main(["verify", str(tutorial), *TUTORIAL, "--write-probe", str(probe)]) == 2  # no overwrite
    assert_one_line(2, capsys.readouterr().err, "exists; pass --force")

    answer = _example().forward_with_sublayers(inputs)  # computed "elsewhere", on the probe's inputs
    expected = tmp_path / "expected.npz"
    np.savez(expected, **inputs, **answer)
    code, report = verify(capsys, tutorial, *TUTORIAL, "--expect", expected, "--backends", "torch")
    assert code == 0 and report["verdict"].startswith(f"PASS: matches the source ({expected}) to ")
    assert report["inputs"] == {"batch": 3, "src_len": 13, "tgt_len": 11, "seed": None}
    assert {r["sublayer"] for r in source_rows(report)} == {"encoder.layers.0", "encoder.layers.1",
                                                            "decoder.layers.0", "decoder.layers.1", "logits"}
    answer["decoder.layers.1"][1, 4, 7] += 1e-3
    np.savez(expected, **inputs, **answer)
    code, report = verify(capsys, tutorial, *TUTORIAL, "--expect", expected, "--backends", "torch")
    assert code == 1 and report["first_divergence"] == "decoder.layers.1"


def _bad_expect_files(tmp_path, inputs, output):
    files = {}

    def write(name, **arrays):
        files[name] = tmp_path / f"{name}.npz"
        np.savez(files[name], **arrays)

    (tmp_path / "text.npz").write_text("not a zip")
    files["text"] = tmp_path / "text.npz"
    write("no-output", **inputs)
    write("no-tgt", src_ids=inputs["src_ids"], output=output)
    write("short-output", **inputs, output=output[:, :3])
    write("int-output", **inputs, output=output.astype(np.int64))
    write("ids-out-of-vocab", src_ids=inputs["src_ids"] + 1000, tgt_ids=inputs["tgt_ids"], output=output)
    write("unknown-name", **inputs, output=output, **{"encoder.layer.0": output})
    write("object", **inputs, output=np.array([object()] * 3, dtype=object))
    write("nan", **inputs, output=np.full_like(output, np.nan))
    import io
    import zipfile

    header = io.BytesIO()  # a member whose header promises 10^12 float32 values in a few bytes
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)})
    files["bomb"] = tmp_path / "bomb.npz"
    with zipfile.ZipFile(files["bomb"], "w") as archive:
        for key, value in inputs.items():
            member = io.BytesIO()
            np.save(member, value)
            archive.writestr(f"{key}.npy", member.getvalue())
        archive.writestr("output.npy", header.getvalue() + b"\0" * 16)
    return files


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bad_expect_files_are_one_line(tutorial, tmp_path, capsys):
    example = _example()
    rng = np.random.default_rng(0)
    inputs = {"src_ids": rng.integers(2, example.SRC_VOCAB, (2, 6)), "tgt_ids": rng.integers(2, example.TGT_VOCAB,
                                                                                              (2, 5))}
    output = example.forward(inputs)
    fragments = {"text": "not a readable .npz", "no-output": "has no output", "no-tgt": "has no tgt_ids",
                 "short-output": "of shape (2, 3, 47); expected (2, 5, 47)", "int-output": "as int64",
                 "ids-out-of-vocab": "has ids in", "unknown-name": "'encoder.layer.0', which is not a sublayer",
                 "object": "not a readable .npz", "nan": "NaN or inf",
                 "bomb": "declares shape (1000000, 1000000) of float32 (4000000000000 bytes) but holds"}
    for name, path in _bad_expect_files(tmp_path, inputs, output).items():
        capsys.readouterr()
        code = cli.main(["verify", str(tutorial), *TUTORIAL, "--expect", str(path), "--backends", "torch"])
        assert_one_line(code, capsys.readouterr().err, fragments[name])


# --- bad source specs: one line, exit 2 ----------------------------------------------------------------------------

BAD_SOURCES = '''
import numpy as np
NOT_CALLABLE = 3

def raises(batch):
    raise RuntimeError("boom")

def wrong_shape(batch):
    return np.zeros((1, 2, 3), np.float32)

def ints(batch):
    b, t = batch["tgt_ids"].shape
    return np.zeros((b, t, 47), np.int64)

def nan(batch):
    b, t = batch["tgt_ids"].shape
    return np.full((b, t, 47), np.nan, np.float32)

def no_output(batch):
    return {"logits": np.zeros(3)}

def bad_key(batch):
    b, t = batch["tgt_ids"].shape
    return {"output": np.zeros((b, t, 47), np.float32), "encoder.layer.0": np.zeros(3)}
'''


@pytest.mark.parametrize("name, fragment", [
    (None, "needs FILE.py:NAME"), ("missing", "no such file"), ("absent", "defines no 'absent'"),
    ("NOT_CALLABLE", "is a int, not callable"), ("raises", "raised RuntimeError: boom"),
    ("wrong_shape", "output of shape (1, 2, 3); expected (3, 11, 47)"), ("ints", "as int64"),
    ("nan", "NaN or inf"), ("no_output", "without the key 'output'"), ("bad_key", "'encoder.layer.0'"),
    ("broken", "importing"),
], ids=lambda x: str(x))
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bad_source_specs_are_one_line(name, fragment, tutorial, tmp_path, capsys):
    good = tmp_path / "bad_sources.py"
    good.write_text(BAD_SOURCES)
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    spec = {None: str(good), "missing": f"{tmp_path / 'nope.py'}:f",
            "broken": f"{tmp_path / 'broken.py'}:f"}.get(name, f"{good}:{name}")
    capsys.readouterr()
    code = cli.main(["verify", str(tutorial), *TUTORIAL, "--source", spec, "--backends", "numpy", *SHAPE])
    assert_one_line(code, capsys.readouterr().err, fragment)


def test_source_flags_that_cannot_go_together(tmp_path, capsys):
    for args, fragment in ((["--preset", "tiny", "--source", f"{EXAMPLE}:forward"], "give the checkpoint"),
                           (["x.pt", "--source", f"{EXAMPLE}:forward", "--no-source"], "exclude each other"),
                           (["x.pt", "--expect", "e.npz", "--batch", "3"], "leave out --batch"),
                           (["--preset", "tiny", "--write-probe", str(tmp_path / "p.npz"), "--json", "-"],
                            "leave out --json"),
                           (["--preset", "tiny", "--write-probe", str(tmp_path / "p.txt")], "ending in .npz")):
        capsys.readouterr()
        assert_one_line(cli.main(["verify", *args]), capsys.readouterr().err, fragment)


# --- built-in sources ----------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_nn_transformer_file_is_judged_by_torch_nn_by_default(tutorial, capsys):
    code, report = verify(capsys, tutorial, *TUTORIAL, "--backends", "torch", *SHAPE)
    assert code == 0 and report["verdict"].startswith("PASS: matches the source (torch.nn ")
    assert [r["label"] for r in report["source"]["runs"]] == ["torch.nn-f32", "torch.nn-f64"]
    assert {r["sublayer"] for r in source_rows(report)} >= {"encoder.embed", "encoder.layers.1.ffn",
                                                            "decoder.layers.0.cross_attn", "decoder.final_norm"}
    f64 = next(r for r in source_rows(report, "logits") if r["backends"] == ["torch.nn-f64", "numpy-f64"])
    assert f64["max_abs_err"] < 1e-12
    assert any("a state dict cannot tell them" in n for n in report["notes"])


transformers = pytest.importorskip("transformers") if importlib.util.find_spec("transformers") else None
HF_VOCAB = 61


def _hf_dir(tmp_path, cls_name, config, name):
    torch.manual_seed(len(name))
    model = _perturb(getattr(transformers, cls_name)(config), len(name))
    model.save_pretrained(tmp_path / name)
    return tmp_path / name


def _gpt2(**extra):
    return transformers.GPT2Config(n_embd=24, n_layer=2, n_head=3, vocab_size=HF_VOCAB, n_positions=40,
                                   bos_token_id=HF_VOCAB - 1, eos_token_id=HF_VOCAB - 1, **extra)


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_hf_bert_is_judged_by_transformers_and_a_wrong_epsilon_fails(tmp_path, capsys):
    config = transformers.BertConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
                                     vocab_size=HF_VOCAB, max_position_embeddings=40, pad_token_id=7)
    path = _hf_dir(tmp_path, "BertForMaskedLM", config, "bert")
    code, report = verify(capsys, path, "--backends", "torch", "--src-len", "15")
    assert code == 0 and report["verdict"].startswith("PASS: matches the source (transformers BertForMaskedLM) to ")
    assert "in float32 and to " in report["verdict"] and "in float64" in report["verdict"]
    assert {"encoder.embed", "encoder.layers.1.self_attn", "head", "logits"} <= {r["sublayer"] for r in
                                                                                source_rows(report)}
    code, report = verify(capsys, path, "--backends", "torch", "--src-len", "15", "--set", "layer_norm_eps=1e-3")
    assert code == 1 and report["first_divergence"] == "encoder.embed"  # BERT's embedding LayerNorm
    assert report["verdict"].startswith("FAIL: differs from the source (transformers BertForMaskedLM)")


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_hf_gpt2_with_a_pad_token_is_judged_by_transformers(tmp_path, capsys):
    path = _hf_dir(tmp_path, "GPT2LMHeadModel", _gpt2(pad_token_id=HF_VOCAB - 1), "gpt2")
    code, report = verify(capsys, path, "--backends", "torch", "--src-len", "15")
    assert code == 0 and report["verdict"].startswith("PASS: matches the source (transformers GPT2LMHeadModel) to ")


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_hf_gpt2_without_a_pad_token_matches_transformers(tmp_path, capsys):
    path = _hf_dir(tmp_path, "GPT2LMHeadModel", _gpt2(), "gpt2")
    code, report = verify(capsys, path, "--backends", "torch", "--src-len", "15")
    assert code == 0, report["verdict"]


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_without_the_library_the_verdict_says_self_consistent_only(tmp_path, capsys, monkeypatch):
    from transformer_parity.verify import source

    path = _hf_dir(tmp_path, "GPT2LMHeadModel", _gpt2(pad_token_id=HF_VOCAB - 1), "gpt2")
    monkeypatch.setattr(source, "_missing", lambda *packages: "transformers")
    code, report = verify(capsys, path, "--backends", "torch", "--src-len", "15")
    assert code == 0 and report["source"]["self_consistent_only"] == "transformers not installed"
    assert report["verdict"].startswith("PASS (self-consistent only: transformers not installed; judged by numpy-f64")


def test_a_kerashub_preset_is_judged_by_keras_hub(tmp_path, capsys):
    keras_hub = pytest.importorskip("keras_hub")
    from .test_kerashub import GPT2, exercise

    backbone = keras_hub.models.GPT2Backbone(**GPT2, dropout=0.0)
    exercise(backbone)
    keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None).save_to_preset(str(tmp_path / "preset"))
    code, report = verify(capsys, tmp_path / "preset", "--backends", "torch", "--src-len", "15")
    assert code == 0 and report["verdict"].startswith("PASS: matches the source (keras_hub GPT2CausalLM) to ")
    assert [r["label"] for r in report["source"]["runs"]] == ["keras_hub-f32"]
