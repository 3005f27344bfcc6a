"""Nothing the weights cannot tell is guessed: the importers refuse (exit 2, one line naming every missing setting)
until the user states it; `ignore` drops a nonzero tensor only when the user names it (`--allow-drop`); sinusoid
buffers are recognized in every usual layout within float32 rounding; PyTorch Lightning `.ckpt` files are read
(their `state_dict`, and `hyper_parameters` where a layout names a key)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from numpy.testing import assert_allclose

import reference_numpy as rn
from parity_tests.test_formats import PAD_IDX, TUTORIAL_SETTINGS, _randomize, _seq2seq_logits, _tutorial_classes
from parity_tests.test_layouts import (EXAMPLES, fill_scaffold, lightning_encoder_classes, reference_errors,
                                       torch_encoder_classes, torch_logits, train_a_little)
from parity_tests.tolerances import atol
from transformer_parity import formats
from transformer_parity.cli import main
from transformer_parity.layouts import table, user

torch = pytest.importorskip("torch")
nn = torch.nn


def run(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("transformer-parity: error: ") and "Traceback" not in err, err
    return lines[0]


def sets(**fields) -> list[str]:
    return [a for name, value in fields.items() for a in ("--set", f"{name}={value}")]


# --- nn-transformer: a 4-head tutorial model ports only with its head count -----------------------------------------

@pytest.fixture(scope="module")
def four_head_tutorial(tmp_path_factory):
    """PyTorch's translation tutorial with nhead=4 at odd sizes (nn.Transformer's default would be 8 heads)."""
    seq2seq, _ = _tutorial_classes()
    model = _randomize(seq2seq(2, 3, 40, 4, 37, 29, dim_feedforward=56), seed=11)
    path = tmp_path_factory.mktemp("four_heads") / "model.pt"
    torch.save(model.state_dict(), path)
    return model, path


SETTINGS = {"activation": "relu", "norm_first": "false", "layer_norm_eps": "1e-5", "scale_embedding": "true",
            "pad_id": PAD_IDX}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nn_transformer_without_its_settings_is_refused_naming_each(four_head_tutorial, tmp_path, capsys):
    _, path = four_head_tutorial
    out = tmp_path / "out.safetensors"
    code, _, err = run(["convert", path, out], capsys)
    assert code == 2 and not out.exists()
    assert ("model.pt (nn-transformer) does not say num_heads, activation, norm_first, layer_norm_eps, "
            "scale_embedding, pad_id: give them with --set FIELD=VALUE (e.g. --set num_heads=8) or --config "
            "FILE.json") in one_line(err)
    for command in (["convert", path, out], ["verify", path, "--backends", "numpy"]):
        code, _, err = run([*command, *sets(**SETTINGS)], capsys)
        assert code == 2 and "does not say num_heads:" in one_line(err)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nn_transformer_with_its_head_count_matches_the_tutorials_forward(four_head_tutorial, tmp_path, capsys):
    model, path = four_head_tutorial
    out = tmp_path / "out.safetensors"
    code, _, err = run(["convert", path, out, "--set", "num_heads=4", *sets(**SETTINGS)], capsys)
    assert code == 0, err
    loaded = formats.load(out)
    assert loaded.config.num_heads == 4
    src, tgt = rn.sample_batch(loaded.config, batch=3, src_len=11, tgt_len=9, seed=4)
    src[0, :3], tgt[0, :2] = 0, 0  # id 0 is an ordinary token of this model (its padding is PAD_IDX = 1)
    tutorial = _seq2seq_logits(model, src, tgt)
    assert_allclose(tutorial, rn.Transformer(loaded.config, loaded.weights)(src, tgt), rtol=0, atol=atol("float32"))
    wrong = formats.load(path, fields={**loaded.config.to_dict(), "num_heads": 8})  # what the old default read
    assert np.max(np.abs(tutorial - rn.Transformer(wrong.config, wrong.weights)(src, tgt))) > 100 * atol("float32")
    code, out_text, err = run(["verify", path, "--backends", "numpy,torch", "--set", "num_heads=4",
                               *sets(**SETTINGS)], capsys)
    assert code == 0, out_text + err


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nn_transformer_reads_hyper_parameters_only_under_the_fields_own_name(tmp_path, capsys):
    """In a Lightning .ckpt: `num_heads` (the field's name) is read, with a note naming the key; `nhead` is not,
    and a name with two values is refused as ambiguous."""
    _, lm = _tutorial_classes()

    class Lit(nn.Module):  # a LightningModule keeps its network under an attribute: keys "net.*"
        def __init__(self):
            super().__init__()
            self.net = lm(45, 36, 4, 52, 2, dropout=0.0)

    state = _randomize(Lit(), seed=5).state_dict()
    settings = sets(**{k: v for k, v in SETTINGS.items() if k != "pad_id"}, pad_id=0)
    cases = {"by-name": {"model_kwargs": {"num_heads": 4, "nhead": 4}, "lr": 0.1},
             "other-name": {"nhead": 4}, "ambiguous": {"num_heads": 4, "encoder": {"num_heads": 2}}}
    for name, hparams in cases.items():
        path = tmp_path / f"{name}.ckpt"
        torch.save({"state_dict": state, "hyper_parameters": hparams, "epoch": 3,
                    "pytorch-lightning_version": "2.5.0"}, path)
        code, _, err = run(["convert", path, tmp_path / f"{name}.safetensors", *settings], capsys)
        if name == "by-name":
            assert code == 0 and "num_heads=4 read from the checkpoint's hyper_parameters['model_kwargs.num_heads']" \
                in err, err
            assert formats.load(tmp_path / f"{name}.safetensors").config.num_heads == 4
        else:
            line = one_line(err)
            assert code == 2 and "does not say num_heads:" in line, line
            assert ("ambiguously: num_heads (num_heads=4, encoder.num_heads=2)" in line) == (name == "ambiguous")


# --- layout files: pad_id "none", hparam references --------------------------------------------------------------

def test_layout_config_none_is_null_and_hparam_references_stay_references():
    layout = user.parse('[config]\npad_id = "none"\nnum_heads = "hparam:model_kwargs.num_heads"\n[weights]\n'
                        '"e.weight" = "src_embed.embedding"\n')
    assert layout.config == {"pad_id": None, "num_heads": "hparam:model_kwargs.num_heads"}


# --- ignore: a trained tensor is dropped only when the user names it --------------------------------------------------

@pytest.fixture(scope="module")
def encoder_with_buffers(tmp_path_factory):
    """The W_Q..W_O encoder with buffers beside its parameters: an int64 position-id buffer, an all-zero float
    cache, and a nonzero float `scale` per layer (a constant the model would use)."""
    torch.manual_seed(2)
    model = train_a_little(torch_encoder_classes()(vocab=43, n_classes=9, d_model=36, num_heads=4, d_ff=52),
                           vocab=43, n_classes=9)
    state = dict(model.state_dict())
    state["position_ids"] = torch.arange(64)[None]
    state["cache"] = torch.zeros(3, 36)
    for i in range(2):
        state[f"layers.{i}.attn.scale"] = torch.tensor([3.0])
    path = tmp_path_factory.mktemp("buffers") / "model.pt"
    torch.save(state, path)
    layout = tmp_path_factory.getbasetemp() / "buffers.toml"
    layout.write_text((EXAMPLES / "torch_encoder.toml").read_text() + '"position_ids" = "- ignore"\n'
                      '"cache" = "- ignore"\n"layers.{i}.attn.scale" = "- ignore"\n')
    return model, path, layout


def test_ignore_refuses_nonzero_float_tensors_unless_allowed(encoder_with_buffers, tmp_path, capsys):
    model, path, layout = encoder_with_buffers
    out = tmp_path / "out.safetensors"
    code, _, err = run(["convert", "--layout", layout, path, out], capsys)
    line = one_line(err)
    assert code == 2 and not out.exists()
    assert ("2 tensor(s) marked ignore hold nonzero values, so dropping them would change the model: "
            "layers.0.attn.scale (shape (1,), max |x| 3); layers.1.attn.scale (shape (1,), max |x| 3)") in line, line
    assert "position_ids" not in line and "cache" not in line  # an integer buffer and a zero tensor may go
    code, _, err = run(["convert", "--layout", layout, path, out, "--allow-drop", "layers.0.attn.scale"], capsys)
    assert code == 2 and "1 tensor(s) marked ignore" in one_line(err)
    code, _, err = run(["convert", "--layout", layout, path, out, "--allow-drop", "layers.{i}.attn.scale",
                        "--allow-drop", "not.a.key"], capsys)
    assert code == 0, err
    assert "dropped (--allow-drop): layers.0.attn.scale (shape (1,), max |x| 3)" in err
    assert "--allow-drop not.a.key: no tensor of that name was dropped" in err
    loaded = formats.load(path, formats.LAYOUT_PREFIX + str(layout), allow_drop=["layers.{i}.attn.scale"])
    assert loaded.dropped == ["layers.0.attn.scale", "layers.1.attn.scale"]
    src = rn.sample_ids(loaded.config, batch=2, length=10, vocab_size=43, seed=3)
    build = lambda: torch_encoder_classes()(vocab=43, n_classes=9, d_model=36, num_heads=4, d_ff=52)  # noqa: E731
    reference_errors(loaded.config, loaded.weights, src, *torch_logits(model, src, build))
    for allow in ([], ["--allow-drop", "layers.{i}.attn.scale"]):
        code, out_text, err = run(["verify", "--layout", layout, path, "--backends", "numpy", "--src-len", "12",
                                   *allow], capsys)
        assert code == (0 if allow else 2), out_text + err
    assert ("dropped by --allow-drop, not compared: model.pt: layers.0.attn.scale, model.pt: layers.1.attn.scale"
            in " ".join(out_text.split())), out_text  # the verdict says what it did not prove


def test_integer_boolean_and_zero_buffers_go_silently_the_rest_by_name():
    state = {"ids": np.arange(5), "mask": np.tril(np.ones((4, 4), bool)), "zero": np.zeros(3, np.float32),
             "causal": np.tril(np.ones((4, 4), np.float32)), "nan": np.array([np.nan, 0.0])}
    with pytest.raises(ValueError, match=r"^m: 1 tensor\(s\) marked ignore .*: nan \(shape \(2,\), max \|x\| nan\);"):
        table.check_drops(state, list(state), table.Drops(("causal",)), "m")
    drops = table.Drops(("causal", "nan"))
    table.check_drops(state, list(state), drops, "m")
    assert drops.dropped == ["causal", "nan"] and drops.unused() == []
    assert drops.notes[0] == "dropped (--allow-drop): causal (shape (4, 4), max |x| 1)"


# --- sinusoid buffers in every usual layout, built in float32 ---------------------------------------------------------

def float32_table(length: int, d: int, layout: str) -> np.ndarray:
    """The tutorials' float32 formulas: PyTorch's (interleaved) and TensorFlow's ([sin | cos])."""
    position = torch.arange(length).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))  # float32
    angles = position * div_term  # (L, D/2), float32
    if layout == "interleaved":
        return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).reshape(length, d).numpy()
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1).numpy()


@pytest.mark.parametrize("shape", ["(L, D)", "(L, 1, D)", "(1, L, D)"])
@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
def test_sinusoid_tables_are_recognized_in_every_layout(shape, layout):
    rows = float32_table(5000, 38, layout)
    stored = {"(L, D)": rows, "(L, 1, D)": rows[:, None, :], "(1, L, D)": rows[None]}[shape]
    assert np.max(np.abs(rows - rn.sinusoidal_positions(5000, 38, layout))) > 1e-4  # float32 angles, far rows
    assert table.classify_sinusoid(table.sinusoid_rows(stored, 38)) == layout
    nudged = rows.copy()
    nudged[7, 5] += 1e-4  # a table trained away from the sinusoid, in one early row
    assert table.classify_sinusoid(nudged) is None
    assert table.sinusoid_mismatch(nudged, layout).startswith(
        f"against the {layout} table (read as (L, D) = (5000, 38)), row 7 differs by 0.0001")
    assert table.sinusoid_rows(rows[None, None], 38) is None and table.sinusoid_rows(rows, 40) is None


class SeqFirstPositionalEncoding(nn.Module):
    """PyTorch's language-model tutorial's PositionalEncoding (float32, `(max_len, 1, d)`), minus dropout, fed a
    batch-first `(B, S, D)`."""

    def __init__(self, d_model, max_len=5000):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[: x.size(1)].transpose(0, 1)  # (S, 1, D) -> (1, S, D)


def test_a_seq_first_float32_pe_buffer_ports_as_a_sinusoid(tmp_path):
    def build():
        model = torch_encoder_classes()(vocab=43, n_classes=9, d_model=36, num_heads=4, d_ff=52)
        model.pos = SeqFirstPositionalEncoding(36)
        return model

    torch.manual_seed(4)
    model = train_a_little(build(), vocab=43, n_classes=9)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    assert tuple(model.state_dict()["pos.pe"].shape) == (5000, 1, 36)
    out = tmp_path / "out.safetensors"
    assert main(["--quiet", "convert", "--layout", str(EXAMPLES / "torch_encoder.toml"), str(path), str(out)]) == 0
    loaded = formats.load(out)
    assert (loaded.config.max_len, loaded.config.sinusoid_layout) == (5000, "interleaved")
    src = rn.sample_ids(loaded.config, batch=3, length=17, vocab_size=43, seed=6)
    logits32, logits64 = torch_logits(model, src, build)
    for dtype, source, limit in ((np.float32, logits32, 1e-4), (np.float64, logits64, 1e-10)):
        ours = rn.Transformer(loaded.config, loaded.weights, dtype)(src)
        assert np.max(np.abs(ours - source)) <= limit, dtype
    reference_errors(loaded.config, loaded.weights, src, logits32, logits64)


def test_a_learned_table_mapped_as_a_sinusoid_is_refused_saying_what_was_compared(tmp_path, capsys):
    torch.manual_seed(5)
    model = torch_encoder_classes()(vocab=43, n_classes=9, d_model=36, num_heads=4, d_ff=52)
    state = model.state_dict()
    state["pos.pe"] = 0.1 * torch.randn(64, 36)
    torch.save(state, tmp_path / "model.pt")
    code, _, err = run(["convert", "--layout", EXAMPLES / "torch_encoder.toml", tmp_path / "model.pt",
                        tmp_path / "out.safetensors"], capsys)
    line = one_line(err)
    assert code == 2 and "pos.pe is mapped '- sinusoid' but is no sinusoid table the model computes: against the " \
        "interleaved table (read as (L, D) = (64, 36)), row 0 differs by" in line and "against the concatenated" in line


# --- PyTorch Lightning .ckpt ------------------------------------------------------------------------------------------

MODEL_KWARGS = {"vocab": 41, "model_dim": 36, "num_classes": 5, "num_heads": 4, "num_layers": 2, "dropout": 0.1}


class LitEncoder(nn.Module):
    """What a LightningModule saves: its network under an attribute (`model.*` keys)."""

    def __init__(self, **model_kwargs):
        super().__init__()
        self.model = lightning_encoder_classes()(**model_kwargs)

    def forward(self, ids):
        return self.model(ids)


@pytest.fixture(scope="module")
def lightning_ckpt(tmp_path_factory):
    """A Lightning-style `.ckpt` written with torch.save as Lightning writes it (lightning is not installed)."""
    torch.manual_seed(7)
    lit = LitEncoder(**MODEL_KWARGS)
    optimizer = torch.optim.Adam(lit.parameters(), lr=1e-2)
    train_a_little(lit, vocab=41, n_classes=5)
    lit(torch.randint(1, 41, (2, 5))).sum().backward()
    optimizer.step()
    lit.eval()
    path = tmp_path_factory.mktemp("lightning") / "epoch=3-step=30.ckpt"
    torch.save({"epoch": 3, "global_step": 30, "pytorch-lightning_version": "2.5.0", "state_dict": lit.state_dict(),
                "loops": {"fit_loop": {"epoch_progress": {"total": {"completed": 3}}}}, "callbacks": {},
                "optimizer_states": [optimizer.state_dict()], "lr_schedulers": [], "hparams_name": "kwargs",
                "hyper_parameters": {"model_kwargs": dict(MODEL_KWARGS), "lr": 1e-3}}, path)
    layout = tmp_path_factory.getbasetemp() / "lightning_ckpt.toml"
    text = (EXAMPLES / "lightning_encoder.toml").read_text().replace("num_heads = 4",
                                                                      'num_heads = "hparam:model_kwargs.num_heads"')
    layout.write_text(text.replace('\n"', '\n"model.'))  # the LightningModule's attribute, named by the layout
    return lit, path, layout


def test_a_lightning_ckpt_ports_through_a_layout_reading_its_hyper_parameters(lightning_ckpt, tmp_path, capsys):
    lit, path, layout = lightning_ckpt
    assert formats.detect_format(path) == "torch"
    out = tmp_path / "out.safetensors"
    code, _, err = run(["convert", "--layout", layout, path, out], capsys)
    assert code == 0, err
    assert "read a PyTorch Lightning checkpoint (pytorch-lightning 2.5.0, epoch 3)" in err
    assert "num_heads=4 from the checkpoint's 'hparam:model_kwargs.num_heads'" in err
    loaded = formats.load(out)
    assert (loaded.config.num_heads, loaded.config.num_encoder_layers, loaded.config.d_model) == (4, 2, 36)
    src = rn.sample_ids(loaded.config, batch=3, length=15, vocab_size=41, seed=8)
    reference_errors(loaded.config, loaded.weights, src,
                     *torch_logits(lit, src, lambda: LitEncoder(**MODEL_KWARGS)))
    code, out_text, err = run(["verify", "--layout", layout, path, "--backends", "numpy,torch", "--src-len", "15"],
                              capsys)
    assert code == 0, out_text + err


def test_lightning_ckpt_mistakes_are_one_line(lightning_ckpt, tmp_path, capsys):
    _, path, layout = lightning_ckpt
    out = tmp_path / "out.safetensors"
    wrong_key = tmp_path / "wrong_key.toml"
    wrong_key.write_text(layout.read_text().replace("model_kwargs.num_heads", "model_kwargs.heads"))
    unprefixed = tmp_path / "unprefixed.toml"
    unprefixed.write_text(layout.read_text().replace('\n"model.', '\n"'))
    for toml, expected in ((wrong_key, "reads 'hparam:model_kwargs.heads', but hyper_parameters['model_kwargs'] has "
                                       "no key 'heads' (keys: dropout, model_dim, num_classes, num_heads"),
                           (unprefixed, "key(s) of the weights are not in the layout: 'model.embed.weight'")):
        code, _, err = run(["convert", "--layout", toml, path, out], capsys)
        assert code == 2 and expected in one_line(err) and not out.exists()
    code, _, err = run(["convert", path, out], capsys)  # no layout: not guessed as anything
    assert code == 2 and "layout --scaffold epoch=3-step=30.ckpt" in one_line(err)


def test_the_scaffold_of_a_lightning_ckpt_names_its_hyper_parameters(lightning_ckpt, tmp_path, capsys):
    lit, path, _ = lightning_ckpt
    code, text, err = run(["layout", "--scaffold", path], capsys)
    assert code == 0, err
    assert 'num_heads = "hparam:model_kwargs.num_heads" # = 4 in hyper_parameters' in text
    assert '"model.transformer.layers.{i}.self_attn.qkv_proj.weight"' in text
    layout = tmp_path / "scaffold.toml"
    layout.write_text(fill_scaffold(text, attention_scale="head", activation="relu", norm_first=False, layer_norm_eps=1e-5,
                                    scale_embedding=False, pad_id=0, positional="sinusoidal",
                                    sinusoid_layout="interleaved", max_len=128).replace(
        "fused_qkv_t", "fused_qkv_heads_t"))  # the scaffold's guess is concatenated; this model interleaves
    loaded = formats.load(path, formats.LAYOUT_PREFIX + str(layout))
    src = rn.sample_ids(loaded.config, batch=2, length=9, vocab_size=41, seed=9)
    reference_errors(loaded.config, loaded.weights, src,
                     *torch_logits(lit, src, lambda: LitEncoder(**MODEL_KWARGS)))


def test_gpt2s_old_causal_mask_buffer_is_checked_not_dropped():
    """Old GPT-2 files hold `h.{i}.attn.bias`, a float causal mask `(1, 1, n, n)`: checked to be one and left out;
    `masked_bias` (the fill of masked logits, -1e4) is checked to mask and left out, any other value refused."""
    from transformer_parity.layouts import hf_gpt2

    config = rn.TransformerConfig(src_vocab_size=23, tgt_vocab_size=23, d_model=12, num_heads=3, num_encoder_layers=0,
                                  num_decoder_layers=2, d_ff=20, max_len=9, activation="gelu_tanh", norm_first=True,
                                  final_norm=True, positional="learned", scale_embedding=False,
                                  output_projection=False, output_bias=False)
    weights = rn.init_weights(config, seed=3)
    entries = hf_gpt2.table(config, "")
    state = table.export_state(config, weights, entries)
    for i in range(2):
        state[f"h.{i}.attn.bias"] = np.tril(np.ones((9, 9), np.float32))[None, None]
    back = table.import_state(config, dict(state), entries)
    assert all(np.array_equal(back[k], weights[k]) for k in weights)
    state["h.1.attn.bias"] = np.ones((1, 1, 9, 9), np.float32)  # not causal: the model would attend ahead
    with pytest.raises(ValueError, match=r"h.1.attn.bias \(1, 1, 9, 9\) is mapped causal_mask but is not a causal"):
        table.import_state(config, dict(state), entries)
    state["h.1.attn.bias"] = state["h.0.attn.bias"]
    state["h.0.attn.masked_bias"] = np.float32(-1e4) * np.ones((), np.float32)
    skipped: list[str] = []
    table.import_state(config, dict(state), entries, skipped=skipped)
    assert "h.0.attn.masked_bias (-10000)" in skipped and "h.1.attn.bias (a causal mask)" in skipped
    state["h.0.attn.masked_bias"] = np.float32(-5.0) * np.ones((), np.float32)  # would leak into masked positions
    with pytest.raises(ValueError, match=r"masked_bias \(\) float32 is mapped mask_fill but holds -5, which does not "
                                         r"mask \(at most -10000\)"):
        table.import_state(config, dict(state), entries)


def test_the_scaffold_never_guesses_a_float_tensor_ignore(tmp_path, capsys):
    """A one-hot input through a Linear with a bias (the Lightning tutorial's input_net) is left "?", never
    `- ignore`; an integer buffer is `- ignore`; [config] lists the settings these weights cannot tell."""
    torch.manual_seed(8)
    state = {"input_net.1.weight": torch.randn(36, 11), "input_net.1.bias": torch.randn(36),
             "position_ids": torch.arange(20)[None], **{f"blocks.{k}": v for k, v in torch_encoder_classes()(
                 vocab=43, n_classes=9, d_model=36, num_heads=4, d_ff=52).state_dict().items() if k != "pos.pe"}}
    torch.save(state, tmp_path / "model.pt")
    code, text, err = run(["layout", "--scaffold", tmp_path / "model.pt"], capsys)
    assert code == 0, err
    rows = dict(re.findall(r'^"([^"]+)"\s*=\s*"([^"]*)"', text, flags=re.M))
    inputs = {key: guess for key, guess in rows.items() if key.startswith("input_net.")}
    assert len(inputs) == 2 and set(inputs.values()) == {"?"}, inputs
    assert rows["position_ids"] == "- ignore" and list(rows.values()).count("- ignore") == 1
    assert [line.split()[0] for line in text.splitlines() if re.match(r'^\w+ = "\?"', line)] == [
        "num_heads", "attention_scale", "activation", "norm_first", "layer_norm_eps", "scale_embedding", "pad_id", "positional",
        "sinusoid_layout", "max_len"]
