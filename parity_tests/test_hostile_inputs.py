"""Hostile inputs on the surfaces that read model directories, KerasHub configs and layout files: every size a file
states is checked against the tensors it holds and the memory available before anything is built, config files have
a size cap, layout files are data (never format strings), and every config field has the type it claims. Each test
builds its hostile input itself (small files, in a few tenths of a second); each case ends in exit 2 with one line,
and nothing is written."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import reference_numpy as rn
from parity_tests.support.hostile import LAYOUT
from transformer_parity import cli, formats
from transformer_parity.layouts import user
from transformer_parity.verify import seeded_weights

from .test_hostile import REPO, assert_clean_error, run

VOCAB = 23  # odd sizes throughout; every id below 23 is a token
GPT2 = rn.TransformerConfig(
    src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, num_heads=2, num_encoder_layers=0, num_decoder_layers=2,
    d_ff=24, max_len=9, activation="gelu_tanh", norm_first=True, final_norm=True, positional="learned",
    scale_embedding=False, tie_embeddings=True, pad_id=None, output_bias=False, dropout=0.0)
BERT = rn.TransformerConfig(
    src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=0,
    d_ff=24, max_len=9, activation="gelu", positional="learned", scale_embedding=False, tie_embeddings=True, pad_id=0,
    output_bias=True, embed_norm=True, type_vocab_size=2, head_transform=True, layer_norm_eps=1e-12, dropout=0.0)
MARIAN = rn.TransformerConfig(
    src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2,
    d_ff=24, max_len=9, activation="silu", sinusoid_layout="concatenated", share_embeddings=True, tie_embeddings=True,
    output_bias=True, pad_id=VOCAB - 1, dropout=0.0)
BART = MARIAN.replace(positional="learned", sinusoid_layout="interleaved", position_offset=2, embed_norm=True,
                      activation="gelu")
BERT_MODEL = BERT.replace(output_projection=False, tie_embeddings=False, output_bias=False, head_transform=False,
                          pooler=True)  # BertModel: no head, a pooler
MODELS = {"gpt2": ("hf-gpt2", GPT2), "bert": ("hf-bert", BERT), "bert-model": ("hf-bert", BERT_MODEL),
          "marian": ("hf-marian", MARIAN), "bart": ("hf-bart", BART), "kerashub-gpt2": ("kerashub-gpt2", GPT2)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Each family's directory, written once by this tool (no transformers or keras needed to read them)."""
    root = tmp_path_factory.mktemp("models")
    for name, (fmt, config) in MODELS.items():
        formats.save(root / name, config, seeded_weights(config, 0), fmt=fmt)
    return root


def edited(models, tmp_path, name, edit):
    """A copy of a model directory whose config.json `edit(dict)` changed (or, given a str, replaced)."""
    path = tmp_path / name
    shutil.copytree(models / name, path)
    config = path / "config.json"
    if isinstance(edit, str):
        config.write_text(edit)
    else:
        data = json.loads(config.read_text())
        edit(data)
        config.write_text(json.dumps(data))
    return path


def convert_refused(args, capsys, tmp_path, *fragments):
    out = tmp_path / "out.safetensors"
    code, _, err = run(["convert", *args[:1], out, *args[1:]], capsys)
    assert_clean_error(code, err, *fragments)
    assert not out.exists()
    return err


def setter(key, value, under=None):
    def edit(data):
        (data[under] if under else data)[key] = value
    return edit


# --- 1. sizes from configs: checked against the tensors present and the memory available, before anything is built

SIZE_CASES = {  # id: (model, config.json key, value, fragment of the one line)
    "gpt2-n_layer-1e9": ("gpt2", "n_layer", 10**9,
                         "num_decoder_layers=1000000000 (config.json n_layer) does not match the weights, which hold "
                         "2 decoder layers (0, 1)"),
    "gpt2-n_layer-1e30": ("gpt2", "n_layer", 10**30, "num_decoder_layers=1000000000000000000000000000000"),
    "bert-layers": ("bert", "num_hidden_layers", 10**9,
                    "num_encoder_layers=1000000000 (config.json num_hidden_layers)"),
    "marian-encoder-layers": ("marian", "encoder_layers", 10**9, "num_encoder_layers=1000000000 (config.json "
                              "encoder_layers)"),
    "marian-decoder-layers": ("marian", "decoder_layers", 10**9, "num_decoder_layers=1000000000"),
    "bart-layers": ("bart", "encoder_layers", 10**9, "num_encoder_layers=1000000000"),
    "gpt2-width": ("gpt2", "n_embd", 10**9, "d_model=1000000000 (config.json n_embd), the weights hold 16 "
                   "(transformer.wte.weight has shape (23, 16))"),
    "bert-vocab": ("bert", "vocab_size", 10**12, "src_vocab_size=1000000000000 (config.json vocab_size), the weights "
                   "hold 23"),
    "gpt2-positions": ("gpt2", "n_positions", 10**8, "max_len=100000000 (config.json n_positions), the weights hold 9"),
    "marian-max-len": ("marian", "max_position_embeddings", 10**12,
                       "max_len=1000000000000 (config.json max_position_embeddings) needs a sinusoidal position table "
                       "of about 349.2 TiB"),
}


@pytest.mark.parametrize("case", list(SIZE_CASES), ids=list(SIZE_CASES))
def test_config_json_sizes_must_match_the_weights(models, tmp_path, capsys, case):
    name, key, value, fragment = SIZE_CASES[case]
    path = edited(models, tmp_path, name, setter(key, value))
    start = time.perf_counter()
    convert_refused([path], capsys, tmp_path, fragment, "refusing" if "layers" in fragment else "")
    assert time.perf_counter() - start < 10  # it took ~20 s to run out of memory


def test_kerashub_num_layers_must_match_the_weights(models, tmp_path, capsys):
    path = edited(models, tmp_path, "kerashub-gpt2", setter("num_layers", 10**9, under="config"))
    convert_refused([path], capsys, tmp_path, "num_decoder_layers=1000000000 (config.json num_layers) does not "
                                              "match the weights")


@pytest.mark.parametrize("setting, fragment", [
    ("num_decoder_layers=1000000000", "num_decoder_layers=1000000000 (--set/--config) does not match the weights"),
    ("num_decoder_layers=1", "num_decoder_layers=1 (--set/--config) does not match the weights, which hold 2 decoder"),
    ("max_len=1000000000000", "max_len=1000000000000 (--set/--config) needs a sinusoidal position table"),
], ids=["layers-1e9", "layers-fewer", "max-len-1e12"])
def test_set_over_a_directory_must_match_the_weights(models, tmp_path, capsys, setting, fragment):
    convert_refused([models / "marian", "--set", setting], capsys, tmp_path, fragment)


def test_set_layers_over_an_nn_transformer_file_must_match_the_weights(tmp_path, capsys):
    pytest.importorskip("torch")
    config = rn.TransformerConfig.preset("tiny", dropout=0.0, final_norm=True)
    formats.save(tmp_path / "nn.pt", config, seeded_weights(config, 0), fmt="nn-transformer")
    convert_refused([tmp_path / "nn.pt", "--set", "num_encoder_layers=1000000000"], capsys, tmp_path,
                    "num_encoder_layers=1000000000 (--set/--config) does not match the weights, which hold 2 encoder "
                    "layers; refusing before allocating anything")


@pytest.mark.parametrize("name", list(MODELS))
def test_an_honest_directory_still_converts(models, tmp_path, capsys, name):
    """The strict readers read every field of an honest config.json as before: the same config, the same weights."""
    config = MODELS[name][1]
    out = tmp_path / "out.safetensors"
    code, _, err = run(["convert", models / name, out], capsys)
    assert code == 0, err
    loaded = formats.load(out)
    assert loaded.config == config
    for key, value in seeded_weights(config, 0).items():
        np.testing.assert_array_equal(loaded.weights[key], value)


# --- layout files: a path with its own small layout ------------------------------------------------------------------

LAYOUT_CONFIG = rn.TransformerConfig(
    src_vocab_size=VOCAB, tgt_vocab_size=7, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=0,
    d_ff=24, max_len=9, positional="learned", scale_embedding=False, pad_id=0, norm_first=False, dropout=0.0)
NORM2_BIAS = '"layers.{i}.norm2.bias"'


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory):
    """`(layout file, a .safetensors under its names, a canonical .safetensors of the same weights)`."""
    root = tmp_path_factory.mktemp("layout")
    (root / "layout.toml").write_text(LAYOUT)
    weights = seeded_weights(LAYOUT_CONFIG, 0)
    user.export_with_layout(root / "model.safetensors", LAYOUT_CONFIG, weights, root / "layout.toml")
    formats.save(root / "canonical.safetensors", LAYOUT_CONFIG, weights)
    return root / "layout.toml", root / "model.safetensors", root / "canonical.safetensors"


def write_layout(tmp_path, text, name="bad.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_layout_config_layers_must_match_the_weights(laid_out, tmp_path, capsys):
    _, model, _ = laid_out
    layout = write_layout(tmp_path, LAYOUT.replace("pad_id = 0", "pad_id = 0\nnum_encoder_layers = 1000000000"))
    convert_refused([model, "--layout", layout], capsys, tmp_path,
                    "num_encoder_layers=1000000000 (bad.toml:8) does not match the weights, which hold 2 encoder "
                    "layers (0, 1)")


def test_a_far_layer_index_in_a_small_file_is_refused(laid_out, tmp_path, capsys):
    """One extra key `layers.999999999999.norm1.weight` in a file of a few kB read the layer count off the highest
    index: a parameter table of 10^12 layers."""
    from safetensors.numpy import load_file, save_file

    _, model, _ = laid_out
    state = load_file(str(model))
    state["layers.999999999999.norm1.weight"] = np.ones(16, np.float32)
    save_file(state, str(tmp_path / "far.safetensors"))
    assert (tmp_path / "far.safetensors").stat().st_size < 100_000
    convert_refused([tmp_path / "far.safetensors", "--layout", laid_out[0]], capsys, tmp_path,
                    "num_encoder_layers=1000000000000 (one more than the highest encoder layer index of the weights) "
                    "does not match the weights, which hold encoder layers 0, 1, 999999999999 (index 2 missing)")


def test_set_max_len_over_a_layout_must_match_its_position_table(laid_out, tmp_path, capsys):
    layout, model, _ = laid_out
    convert_refused([model, "--layout", layout, "--set", "max_len=100000000"], capsys, tmp_path,
                    "max_len=100000000 (--set/--config), the weights hold 9 (pos.weight has shape (9, 16))")


# --- measured: under an address-space limit, each case ends in one line, the honest conversion succeeds ------------

MEMORY_PROBE = r"""
import contextlib, io, json, resource, sys
import h5py, numpy  # the libraries' own address space first
from transformer_parity import cli
def vm_kib():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmSize:"))
limit = (vm_kib() + 512 * 1024) * 1024  # what is mapped now + 512 MiB: each case declares gigabytes or more
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
results = {}
for name, args in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(args)
    results[name] = [code, err.getvalue()]
print(json.dumps(results))
"""


def test_hostile_configs_under_a_memory_limit(models, laid_out, tmp_path):
    layout, model, _ = laid_out
    deep_layers = write_layout(tmp_path, LAYOUT.replace("pad_id = 0", "pad_id = 0\nnum_encoder_layers = 1000000000"))
    cases = {
        "honest": ["convert", models / "marian", tmp_path / "honest.safetensors"],
        "honest-layout": ["convert", "--layout", layout, model, tmp_path / "honest2.safetensors"],
        "n_layer": ["convert", edited(models, tmp_path, "gpt2", setter("n_layer", 10**9)), tmp_path / "x1.safetensors"],
        "max-len-1e8": ["convert", edited(models, tmp_path, "marian", setter("max_position_embeddings", 10**8)),
                        tmp_path / "x2.safetensors"],  # a 38 GB table to build: refused against the limit's 512 MiB
        "kerashub": ["convert", edited(models, tmp_path, "kerashub-gpt2", setter("num_layers", 10**9, "config")),
                     tmp_path / "x3.safetensors"],
        "set-layers": ["convert", models / "bart", tmp_path / "x4.safetensors",
                       "--set", "num_decoder_layers=1000000000"],
        "layout-config": ["convert", "--layout", deep_layers, model, tmp_path / "x5.safetensors"],
        "verify-max-len": ["verify", "--preset", "tiny", "--set", "max_len=100000000", "--backends", "numpy"],
    }
    cases = {name: [str(a) for a in args] for name, args in cases.items()}
    result = subprocess.run([sys.executable, "-c", MEMORY_PROBE, json.dumps(cases)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome.pop("honest")[0] == 0 and outcome.pop("honest-layout")[0] == 0
    for name, (code, err) in outcome.items():
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "MemoryError" not in err, (name, err)
    assert "available" in outcome["max-len-1e8"][1] and "max_len=100000000" in outcome["max-len-1e8"][1]
    assert not any((tmp_path / f"x{n}.safetensors").exists() for n in range(1, 6))


# --- config files have a size cap ------------------------------------------------------------------------------------

def _padded(data: dict, size: int) -> str:
    return json.dumps({**data, "padding": "x" * size})


def test_a_2mb_config_json_is_refused_as_too_large(models, tmp_path, capsys):
    data = json.loads((models / "gpt2" / "config.json").read_text())
    path = edited(models, tmp_path, "gpt2", _padded(data, 2 << 20))
    convert_refused([path], capsys, tmp_path, "config.json is larger than 1.0 MiB, too large for a model's config.json")


def test_a_2mb_kerashub_config_is_too_large_not_another_format(models, tmp_path, capsys):
    data = json.loads((models / "kerashub-gpt2" / "config.json").read_text())
    path = edited(models, tmp_path, "kerashub-gpt2", _padded(data, 2 << 20))
    err = convert_refused([path], capsys, tmp_path,
                          "config.json is larger than 1.0 MiB, too large for a model's config.json")
    assert "not a serialized KerasHub object" not in err


def test_a_2mb_config_option_is_refused(tmp_path, capsys):
    big = tmp_path / "big.json"
    big.write_text(_padded({"num_heads": 4}, 2 << 20))
    code, _, err = run(["init", "--preset", "tiny", "--config", big, "-o", tmp_path / "x.safetensors"], capsys)
    assert_clean_error(code, err, "big.json is larger than 1.0 MiB, too large for a config")
    assert not (tmp_path / "x.safetensors").exists()


# --- strict types in every config we read --------------------------------------------------------------------------

TYPE_CASES = {  # id: (model, config.json text edit (key, raw JSON value), fragment)
    "tie-string": ("gpt2", "tie_word_embeddings", '"false"',
                   "config.json tie_word_embeddings must be true or false, received 'false'"),
    "pad-float": ("bert", "pad_token_id", "3.7", "config.json pad_token_id must be a token id (an integer from 0 to "
                                                 "22, the vocabulary's last) or null, received 3.7"),
    "pad-true": ("bert", "pad_token_id", "true", "pad_token_id must be a token id"),
    "pad-string": ("bert", "pad_token_id", '"0"', "received '0'"),
    "pad-1e999": ("bert", "pad_token_id", "1e999", "pad_token_id must be a token id (an integer from 0 to 22, the "
                                                   "vocabulary's last) or null, received inf"),
    "pad-outside-vocab": ("marian", "pad_token_id", "23", "received 23"),
    "start-float": ("marian", "decoder_start_token_id", "2.5", "decoder_start_token_id must be a token id"),
    "gpt2-pad-1e999": ("gpt2", "pad_token_id", "1e999", "received inf"),
    "layers-float": ("gpt2", "n_layer", "2.0", "config.json n_layer must be a non-negative integer, received 2.0"),
    "layers-negative": ("bert", "num_hidden_layers", "-2", "received -2"),
    "segments-float": ("bert", "type_vocab_size", "2.0", "type_vocab_size must be a non-negative integer"),
    "dropout-string": ("gpt2", "resid_pdrop", '"0.1"', "config.json resid_pdrop must be a finite number"),
    "eps-infinite": ("bert", "layer_norm_eps", "1e999", "config.json layer_norm_eps must be a finite number, received "
                                                       "inf"),
    "scale-int": ("marian", "scale_embedding", "1", "scale_embedding must be true or false, received 1"),
    "refused-flag-int": ("gpt2", "add_cross_attention", "0", "add_cross_attention=0 is not supported (only False)"),
    "architectures-string": ("gpt2", "architectures", '"GPT2LMHeadModel"', "architectures must be a list"),
    "kerashub-dropout": ("kerashub-gpt2", "dropout", '"0.1"', "dropout must be a finite number"),
    "kerashub-layers": ("kerashub-gpt2", "num_layers", "2.5", "num_layers must be a non-negative integer"),
}


def _raw_edit(text: str, key: str, raw: str, model: str) -> str:
    """config.json with `key` set to the raw JSON text `raw` (`1e999` stays `1e999`, which Python reads as inf)."""
    data = json.loads(text)
    target = data["config"] if model.startswith("kerashub") else data
    target[key] = "@@RAW@@"
    return json.dumps(data).replace('"@@RAW@@"', raw)


@pytest.mark.parametrize("case", list(TYPE_CASES), ids=list(TYPE_CASES))
def test_config_json_types_are_strict(models, tmp_path, capsys, case):
    model, key, raw, fragment = TYPE_CASES[case]
    text = _raw_edit((models / model / "config.json").read_text(), key, raw, model)
    convert_refused([edited(models, tmp_path, model, text)], capsys, tmp_path, fragment)


@pytest.mark.parametrize("raw, fragment", [
    ('{"pad_id": 3.7}', "pad_id must be an integer or none, received 3.7"),
    ('{"tie_embeddings": "false"}', "tie_embeddings must be true or false, received 'false'"),
    ('{"num_heads": "4"}', "num_heads must be an integer, received '4'"),
    ('{"pad_id": 1e999}', "pad_id must be an integer or none, received inf"),
    ('{"dropout": true}', "dropout must be a finite number, received True"),
], ids=["pad-float", "bool-string", "int-string", "pad-1e999", "dropout-bool"])
def test_config_option_types_are_strict(tmp_path, capsys, raw, fragment):
    (tmp_path / "c.json").write_text(raw)
    code, _, err = run(["init", "--preset", "tiny", "--config", tmp_path / "c.json", "-o", tmp_path / "x.pt"], capsys)
    assert_clean_error(code, err, "c.json", fragment)
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("old, new, fragment", [
    ("norm_first = false", 'norm_first = "false"', "bad.toml:4: [config] norm_first must be true or false, received "
                                                  "'false'"),
    ("pad_id = 0", "pad_id = 3.7", "bad.toml:7: [config] pad_id must be an integer or none, received 3.7"),
    ("pad_id = 0", "pad_id = true", "pad_id must be an integer or none, received True"),
    ("position_offset = 0", "position_offset = inf", "position_offset must be an integer, received inf"),
    ("layer_norm_eps = 1e-5", 'layer_norm_eps = "1e-5"', "layer_norm_eps must be a finite number"),
], ids=["bool-string", "pad-float", "pad-bool", "offset-inf", "eps-string"])
def test_layout_config_types_are_strict(laid_out, tmp_path, capsys, old, new, fragment):
    _, model, _ = laid_out
    convert_refused([model, "--layout", write_layout(tmp_path, LAYOUT.replace(old, new))], capsys, tmp_path, fragment)


# --- 2. layout files are data: names, patterns, lines -----------------------------------------------------------------

@pytest.mark.parametrize("name, shown", [
    ("head.{i:>3000000000}", "'{i:>3000000000}' is not a placeholder"),
    ("head.{}", "'{}' is not a placeholder"),
    ("head.{x}", "'{x}' is not a placeholder"),
    ("head.{i", "'{' is not a placeholder"),
    ("head.i}", "'}' is not a placeholder"),
], ids=["format-spec", "empty", "unknown", "open-brace", "close-brace"])
def test_layout_names_are_not_format_strings(laid_out, tmp_path, capsys, name, shown):
    """`{i:>3000000000}` had allocated 2.97 GB through str.format; `{}` raised IndexError."""
    layout, model, canonical = laid_out
    bad = write_layout(tmp_path, LAYOUT.replace('"head.bias"', json.dumps(name)))
    start = time.perf_counter()
    convert_refused([model, "--layout", bad], capsys, tmp_path, "bad.toml:27: [weights]", shown, "no format specs")
    out = tmp_path / "out.pt"
    code, _, err = run(["convert", canonical, out, "--to-layout", bad], capsys)
    assert_clean_error(code, err, shown)
    assert not out.exists() and time.perf_counter() - start < 5


def test_a_canonical_name_that_is_a_format_string_is_refused(laid_out, tmp_path, capsys):
    _, model, _ = laid_out
    bad = write_layout(tmp_path, LAYOUT.replace('= "output.bias"', '= "output.{bias:>99999999}"'))
    convert_refused([model, "--layout", bad], capsys, tmp_path, "'{bias:>99999999}' is not a placeholder")


def test_a_placeholder_used_twice_round_trips(laid_out, tmp_path, capsys):
    """`layers.{i}.norm2.{i}.bias` raised re.error (a group named twice); both must be the same index."""
    original, model, canonical = laid_out
    layout = write_layout(tmp_path, LAYOUT.replace(NORM2_BIAS, '"layers.{i}.norm2.{i}.bias"'), "twice.toml")
    out = tmp_path / "twice.safetensors"
    code, _, err = run(["convert", canonical, out, "--to-layout", layout], capsys)
    assert code == 0, err
    from safetensors.numpy import load_file

    keys = set(load_file(str(out)))
    assert {"layers.0.norm2.0.bias", "layers.1.norm2.1.bias"} <= keys and "layers.0.norm2.1.bias" not in keys
    back = formats.load(out, formats.LAYOUT_PREFIX + str(layout))
    assert back.config == formats.load(model, formats.LAYOUT_PREFIX + str(original)).config
    for key, value in seeded_weights(LAYOUT_CONFIG, 0).items():
        np.testing.assert_array_equal(back.weights[key], value)
    state = load_file(str(out))
    state["layers.0.norm2.1.bias"] = state.pop("layers.0.norm2.0.bias")  # indices that disagree match nothing
    from safetensors.numpy import save_file

    save_file(state, str(tmp_path / "mixed.safetensors"))
    convert_refused([tmp_path / "mixed.safetensors", "--layout", layout], capsys, tmp_path,
                    "not in the layout: 'layers.0.norm2.1.bias'")


def test_a_layer_index_is_written_as_an_int(laid_out, tmp_path, capsys):
    """`layers.01...` would read as layer 1 and be written back as `layers.1...`: it matches no `{i}`."""
    from safetensors.numpy import load_file, save_file

    layout, model, _ = laid_out
    state = load_file(str(model))
    state["layers.01.norm1.weight"] = state.pop("layers.1.norm1.weight")
    save_file(state, str(tmp_path / "zero.safetensors"))
    convert_refused([tmp_path / "zero.safetensors", "--layout", layout], capsys, tmp_path,
                    "not in the layout: 'layers.01.norm1.weight'")


TWICE = {  # id: (lines added to LAYOUT, or (old, new) replaced in it; fragment naming both lines)
    "explicit-over-pattern": (LAYOUT.replace(NORM2_BIAS + ' = "encoder.layers.{i}.norm2.beta"',
                                             NORM2_BIAS + ' = "encoder.layers.{i}.norm2.beta"\n'
                                             '"layers.0.norm2.bias" = "encoder.layers.0.norm2.gamma"'),
                              "canonical parameter 'encoder.layers.0.norm2.gamma' is targeted twice, by line 20 "
                              "('layers.{i}.norm2.weight') and line 22 ('layers.0.norm2.bias')"),
    "key-under-a-pattern": (LAYOUT + '"layers.0.ff1.bias" = "- ignore"\n',
                            "key 'layers.0.ff1.bias' is targeted twice, by line 23 ('layers.{i}.ff1.bias') and line "
                            "28 ('layers.0.ff1.bias')"),
    "same-pattern-twice": (LAYOUT + '"blocks.{i}.norm1.weight" = "encoder.layers.{i}.norm1.gamma"\n',
                           "canonical parameter 'encoder.layers.{i}.norm1.gamma' is targeted twice, by line 18 "
                           "('layers.{i}.norm1.weight') and line 28 ('blocks.{i}.norm1.weight')"),
    "overlapping-patterns": (LAYOUT + '"layers.{i}.q_only.weight" = '
                                      '"encoder.layers.{i}.self_attn.q.kernel transpose"\n',
                             "canonical parameter 'encoder.layers.0.self_attn.q.kernel' is targeted twice, by line 14 "
                             "('layers.{i}.attn.{qkv}.weight') and line 28 ('layers.{i}.q_only.weight')"),
}


@pytest.mark.parametrize("case", list(TWICE), ids=list(TWICE))
def test_a_tensor_targeted_twice_is_refused_naming_both_lines(laid_out, tmp_path, capsys, case):
    """An explicit line over a `{i}` pattern line had written 34 of 35 tensors (a gamma overwritten by its beta)."""
    _, model, canonical = laid_out
    text, fragment = TWICE[case]
    layout = write_layout(tmp_path, text)
    out = tmp_path / "out.pt"
    code, _, err = run(["convert", canonical, out, "--to-layout", layout], capsys)
    assert_clean_error(code, err, fragment)
    assert not out.exists()
    if case == "overlapping-patterns":  # read: a file that also holds the keys the added line names
        from safetensors.numpy import load_file, save_file

        state = load_file(str(model))
        state.update({f"layers.{i}.q_only.weight": state[f"layers.{i}.attn.q.weight"] for i in range(2)})
        save_file(state, str(tmp_path / "more.safetensors"))
        convert_refused([tmp_path / "more.safetensors", "--layout", layout], capsys, tmp_path,
                        "canonical parameter 'encoder.layers.0.self_attn.q.kernel' is filled twice, from "
                        "'layers.0.attn.q.weight' (line 14 ('layers.{i}.attn.{qkv}.weight')) and "
                        "'layers.0.q_only.weight' (line 28")
    else:
        convert_refused([model, "--layout", layout], capsys, tmp_path, "targeted twice")


def test_a_100k_line_layout_parses_in_linear_time(tmp_path):
    """Each line's number had been found by rescanning the text: 10k lines 20 s, 40k over 2 minutes."""
    def text(n):
        return "[config]\nnum_heads = 2\n\n[weights]\n" + "".join(
            f'"blocks.{i}.w" = "encoder.layers.{i}.norm1.gamma"\n' for i in range(n))

    timings = {}
    for n in (10_000, 100_000):
        start = time.perf_counter()
        layout = user.parse(text(n), tmp_path / "big.toml")
        timings[n] = time.perf_counter() - start
    assert timings[100_000] < 30 and timings[100_000] < 25 * max(timings[10_000], 0.05), timings
    assert layout.where(layout.table[-1]) == f"line {100_000 + 4} ('blocks.99999.w')"
    twice = text(100_000).replace('"blocks.99998.w" = "encoder.layers.99998',
                                  '"blocks.99998.w" = "encoder.layers.99999')
    with pytest.raises(ValueError, match=r"big.toml: canonical parameter 'encoder.layers.99999.norm1.gamma' is "
                                         r"targeted twice, by line 100003 \('blocks.99998.w'\) and line 100004"):
        user.parse(twice, tmp_path / "big.toml")


@pytest.mark.parametrize("key, fragment", [
    ("", "an empty name: a tensor needs a name"),
    (".", "'.' is not an HDF5 dataset path"),
    ("/head.bias", "received ''"),
    ("head//bias", "received ''"),
    ("head/../bias", "received '..'"),
    ("head\u0000bias", "contains a NUL character"),
], ids=["empty", "dot", "leading-slash", "double-slash", "dot-dot", "nul"])
def test_names_a_weights_h5_cannot_hold_are_refused_at_parse_time(laid_out, tmp_path, capsys, key, fragment):
    _, _, canonical = laid_out
    layout = write_layout(tmp_path, LAYOUT.replace('"head.bias"', json.dumps(key)))
    out = tmp_path / "out.weights.h5"
    code, _, err = run(["convert", canonical, out, "--to-layout", layout], capsys)
    assert_clean_error(code, err, "bad.toml:27: [weights]", fragment)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]


def test_a_dataset_that_is_also_a_group_is_refused_and_a_path_is_kept(laid_out, tmp_path, capsys):
    import h5py

    _, _, canonical = laid_out
    clash = write_layout(tmp_path, LAYOUT.replace('"head.bias"', '"head.weight/b"'))
    out = tmp_path / "out.weights.h5"
    code, _, err = run(["convert", canonical, out, "--to-layout", clash], capsys)
    assert_clean_error(code, err, "'head.weight' would be an HDF5 dataset and also the group holding 'head.weight/b'")
    assert not out.exists()
    path = write_layout(tmp_path, LAYOUT.replace('"head.bias"', '"head/bias"'), "path.toml")
    code, _, err = run(["convert", canonical, out, "--to-layout", path], capsys)
    assert code == 0, err
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["head/bias"][()], seeded_weights(LAYOUT_CONFIG, 0)["output.bias"])


def test_toml_nested_3000_deep_is_one_line(laid_out, tmp_path, capsys):
    _, model, _ = laid_out
    layout = write_layout(tmp_path, "x = " + "[" * 3000 + "]" * 3000 + "\n")
    convert_refused([model, "--layout", layout], capsys, tmp_path, "nests tables or arrays too deeply")


def test_an_einsum_transform_on_a_1d_tensor_is_one_line(laid_out, tmp_path, capsys):
    """`heads_out` on a `(16,)` tensor had raised IndexError."""
    layout, model, _ = laid_out
    bad = LAYOUT.replace('"encoder.layers.{i}.norm1.gamma"', '"encoder.layers.{i}.norm1.gamma heads_in"')
    convert_refused([model, "--layout", write_layout(tmp_path, bad)], capsys, tmp_path,
                    "'layers.0.norm1.weight' has shape (16,), which a heads_in entry cannot hold")


def test_allow_drop_names_are_patterns_too(laid_out, tmp_path, capsys):
    layout, model, _ = laid_out
    convert_refused([model, "--layout", layout, "--allow-drop", "x.{i:>99999999}"], capsys, tmp_path,
                    "'{i:>99999999}' is not a placeholder")


def test_the_scaffold_quotes_every_name_so_its_output_parses(tmp_path):
    """Tensor names with a newline, a quote, a backslash or an escape sequence had printed TOML that does not parse."""
    import tomllib

    from safetensors.numpy import save_file

    names = ["plain.weight", "line\nbreak.weight", 'quote".weight', "back\\slash.weight", "esc\x1b[31m.weight",
             "tab\t.weight"]
    path = tmp_path / "odd\nname.safetensors"
    save_file({name: np.full((3,), i + 1, np.float32) for i, name in enumerate(names)}, str(path))
    text = user.scaffold(path)
    data = tomllib.loads(text)
    assert sorted(data["weights"]) == sorted(names)
    assert "odd\\nname.safetensors" in text.splitlines()[0]


def test_a_shard_index_over_its_cap_is_refused(models, tmp_path, capsys, monkeypatch):
    """A shard index is read through the same capped JSON reader as config.json (its cap, 64 MiB, lowered here so
    that the test writes a small file): one line, exit 2, nothing read past the cap."""
    from transformer_parity.layouts import hf_dir

    path = tmp_path / "gpt2"
    shutil.copytree(models / "gpt2", path)
    (path / hf_dir.SAFETENSORS_INDEX).write_text(json.dumps({"weight_map": {f"t{i}": "model.safetensors"
                                                                            for i in range(5000)}}))
    monkeypatch.setattr(hf_dir, "MAX_INDEX_BYTES", 4096)
    convert_refused([path], capsys, tmp_path, "model.safetensors.index.json is larger than 4.0 KiB, too large for "
                                              "a shard index")
