"""One record per family, and nothing shared names a family (`transformer_parity.layouts`, `layouts.family`).

Every registered family module ends with its record, `FAMILY`, of the registry's kind (`HFFamily`, `KerasHubFamily`),
every field stated (`None` only where the field's type allows it: explicitly absent); the registry and the modules
agree. No module of the command's package but a family's own (and the registry's lines in `layouts/__init__.py`)
names a family: the scan reads each module's syntax tree, its string literals (docstrings aside: documentation, not
behaviour) and its identifiers (names, attributes, definitions, arguments, imports), for each family's words, which
the records give: its format name's stem, its model type, its module's stem and the stems of the classes it is
recognised by.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from transformer_parity import layouts
from transformer_parity.layouts.family import HFFamily, KerasHubFamily

REPO = Path(__file__).resolve().parent.parent
# Scanned: the command's package, where the families live and everything that reads them. The reference and the
# twins below it define the canonical model, whose settings keep the names they are known by (a `llama3` rope).
SCANNED = ("transformer_parity",)
LAYOUTS = REPO / "transformer_parity" / "layouts"
REGISTRY = "transformer_parity/layouts/__init__.py"
REGISTRIES = ("HF_LAYOUTS", "KERASHUB_PRESET_LAYOUTS", "KERASHUB_WEIGHTS_LAYOUTS")  # the one place families are listed
KINDS = {"HF_LAYOUTS": HFFamily, "KERASHUB_PRESET_LAYOUTS": KerasHubFamily, "KERASHUB_WEIGHTS_LAYOUTS": KerasHubFamily}
# Names of families a shared module may still hold while a change rewrites it (module -> family words): none now.
PENDING: dict[str, set[str]] = {}

REGISTERED = [(registry, name, module)
              for registry in REGISTRIES for name, module in getattr(layouts, registry).items()]


def _module(module: str):
    return importlib.import_module(f"transformer_parity.layouts.{module}")


# --- the records ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", (HFFamily, KerasHubFamily), ids=lambda k: k.__name__)
def test_a_record_type_has_no_field_that_a_family_may_leave_out(kind):
    """No field has a default: a family that does not state one fails where its record is built."""
    assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen
    defaulted = [f.name for f in dataclasses.fields(kind)
                 if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    assert not defaulted, defaulted
    with pytest.raises(TypeError, match="missing"):
        kind(name="x")


def _alternatives(annotation: str) -> list[str]:
    """The members of a union annotation (`A | B[C | D] | None` -> `A`, `B[C | D]`, `None`), each by its head."""
    parts, depth, current = [], 0, ""
    for char in annotation:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "|" and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [part.split("[")[0] for part in parts + [current.strip()]]


CHECKS = {"str": str, "Path": Path, "tuple": tuple, "Mapping": Mapping}


def _wrong(field: dataclasses.Field, value) -> str | None:
    """Why `value` is not a stated value of `field` (by its annotation), or None."""
    kinds = _alternatives(field.type)
    if value is None:
        return None if "None" in kinds else "None, where the field must be stated"
    kind = kinds[0]
    if kind == "Callable":
        return None if callable(value) else f"{value!r} is not callable"
    if kind in CHECKS:
        return None if isinstance(value, CHECKS[kind]) else f"{value!r} is not a {kind}"
    return None if type(value).__name__ == kind else f"{value!r} is not a {kind}"


@pytest.mark.parametrize("registry,name,module", REGISTERED, ids=[name for _, name, _ in REGISTERED])
def test_every_family_module_ends_with_its_record_every_field_stated(registry, name, module):
    family = _module(module).FAMILY
    assert type(family) is KINDS[registry], f"{module}.FAMILY is a {type(family).__name__}"
    assert family.name == name
    wrong = {f.name: why for f in dataclasses.fields(family) if (why := _wrong(f, getattr(family, f.name)))}
    assert not wrong, wrong
    last = ast.parse((LAYOUTS / f"{module}.py").read_text()).body[-1]
    assert isinstance(last, ast.Assign) and [t.id for t in last.targets if isinstance(t, ast.Name)] == ["FAMILY"], \
        f"{module}.py does not end with its record (FAMILY = ...)"


def test_the_registry_and_the_family_modules_agree():
    """Every module that exports a record is registered, once; the registry's lookups give the records back; what
    tells families apart (model types, backbone classes) tells each from every other."""
    exporting = {p.stem for p in LAYOUTS.glob("*.py") if any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FAMILY" for t in n.targets)
        for n in ast.parse(p.read_text()).body)}
    modules = [module for _, _, module in REGISTERED]
    assert sorted(modules) == sorted(set(modules)) == sorted(exporting)
    assert layouts.KERASHUB_LAYOUTS == {**layouts.KERASHUB_PRESET_LAYOUTS, **layouts.KERASHUB_WEIGHTS_LAYOUTS}
    assert layouts.KERASHUB_PRESETS == ("kerashub", *layouts.KERASHUB_PRESET_LAYOUTS)
    assert [f.name for f in layouts.hf_families()] == list(layouts.HF_LAYOUTS)
    assert [f.name for f in layouts.kerashub_families()] == list(layouts.KERASHUB_LAYOUTS)
    model_types = [f.model_type for f in layouts.hf_families()]
    assert len(model_types) == len(set(model_types)), model_types
    backbones = [b for f in layouts.kerashub_families() for b in f.backbones]
    assert len(backbones) == len(set(backbones)), backbones
    for family in layouts.kerashub_families():  # a preset family writes a backbone; a weights-only one has none
        assert (family.backbone is not None) == (family.name in layouts.KERASHUB_PRESET_LAYOUTS), family.name
        assert family.backbone is None or family.backbone == family.backbones[0], family.name
    with pytest.raises(ValueError, match="unknown Hugging Face format 'hf-nothing'; choose one of hf-"):
        layouts.hf_family("hf-nothing")
    with pytest.raises(ValueError, match="unknown KerasHub format 'kerashub-nothing'; choose one of kerashub-"):
        layouts.kerashub_family("kerashub-nothing")


# --- nothing shared names a family ----------------------------------------------------------------------------------

def family_words() -> dict[str, set[str]]:
    """Each family's words, lower case: its format name's stem, its module's stem, its model type, and the stems of
    the classes it is recognised by (`GPT2LMHeadModel` -> gpt2, `MarianMTModel` -> marian)."""
    stem = re.compile(r"^([A-Za-z0-9]+?)(?=For|LMHead|MTModel|Model$|Backbone$)")
    words: dict[str, set[str]] = {}
    for registry, name, module in REGISTERED:
        family = _module(module).FAMILY
        classes = family.architectures if isinstance(family, HFFamily) else family.backbones
        found = {name.split("-", 1)[1], module.split("_", 1)[1], getattr(family, "model_type", name.split("-", 1)[1])}
        found |= {m.group(1) for c in classes if (m := stem.match(c))}
        words[name] = {w.lower() for w in found}
    return words


CLASS_PARTS = ("For", "Model", "LMHead", "MTModel", "Backbone", "Config", "Causal", "Tokenizer")  # after a stem


def named(text: str, words: set[str]) -> set[str]:
    """The family words `text` holds as words of their own: case aside, not inside a longer word (`roberta` holds no
    `bert`, `OPTIONAL` no `opt`). A word starts after anything but a letter, or at a change from lower to upper case;
    it ends before anything but a letter, after a digit, at a change from lower to upper case, or before the part of
    a class name that follows a family's stem (`hf_bert`, `DistilBertModel`, `LLAMA_3`, `GPT2LMHeadModel`,
    `OPTForCausalLM` hold theirs)."""
    found, low = set(), text.lower()
    for word in words:
        for m in re.finditer(re.escape(word), low):
            i, j = m.start(), m.end()
            starts = i == 0 or not text[i - 1].isalpha() or (text[i - 1].islower() and text[i].isupper())
            ends = (j == len(text) or not text[j].isalpha() or not text[j - 1].isalpha()
                    or (text[j - 1].islower() and text[j].isupper()) or text[j:].startswith(CLASS_PARTS))
            if starts and ends:
                found.add(word)
    return found


def _registry_lines(source: str) -> set[int]:
    """The lines of the registries' own statements (their dicts' keys and values) in layouts/__init__.py."""
    return {line for stmt in ast.parse(source).body if isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in REGISTRIES for t in stmt.targets)
            for line in range(stmt.lineno, stmt.end_lineno + 1)}


def _docstrings(tree: ast.Module) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)}


def names_of_families(source: str, words: set[str], skip: set[int] = frozenset()) -> list[tuple[int, str, str]]:
    """(line, family word, the text holding it) for every string literal but a docstring and every identifier of
    `source` that names a family (`named`); nodes on the lines `skip` are left out."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in docstrings or getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts = [node.value]
        elif isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts = [node.name]
        elif isinstance(node, ast.arg):
            texts = [node.arg]
        elif isinstance(node, ast.keyword):
            texts = [node.arg or ""]
        elif isinstance(node, ast.alias):
            texts = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            texts = [node.module or ""]
        else:
            continue
        found += [(getattr(node, "lineno", 0), word, text) for text in texts for word in sorted(named(text, words))]
    return found


def _shared_modules() -> list[Path]:
    """Every product module that is no family's own (the registry's file is scanned, its registries aside)."""
    own = {LAYOUTS / f"{module}.py" for _, _, module in REGISTERED}
    return [p for package in SCANNED for p in sorted((REPO / package).rglob("*.py"))
            if p not in own]


def test_no_shared_module_names_a_family():
    words = set().union(*family_words().values())
    found = []
    for path in _shared_modules():
        relative, source = str(path.relative_to(REPO)), path.read_text()
        skip = _registry_lines(source) if relative == REGISTRY else set()
        found += [f"{relative}:{line}: {word} in {text[:80]!r}"
                  for line, word, text in names_of_families(source, words, skip)
                  if word not in PENDING.get(relative, ())]
    assert not found, "family names outside the families' own modules:\n" + "\n".join(found)


def test_the_scan_finds_a_planted_family_name():
    """The checker fails on a family named in shared code, by string or identifier, in any spelling, and on none of
    the words that merely contain one."""
    words = family_words()
    assert {"gpt2", "marian", "xlm-roberta", "xlmroberta", "seq2seq", "llama3"} <= set().union(*words.values())
    planted = '''"""A docstring may say hf-marian."""
from .hf_bert import table

def convert(fmt, cls_name):
    if fmt == "hf-marian":  # a branch for one family
        return 1
    if cls_name.endswith("MaskedLM") or cls_name == "GPT2LMHeadModel":
        return 2
    return LLAMA_3 + model.xlm_roberta + kerashub_qwen3(distilbert=True)
'''
    every = set().union(*words.values())
    hits = {(line, word) for line, word, _ in names_of_families(planted, every)}
    assert {(2, "bert"), (5, "marian"), (7, "gpt2"), (9, "llama"), (9, "roberta"), (9, "qwen3"),
            (9, "distilbert")} <= hits, sorted(hits)
    assert not {line for line, _ in hits} & {1}  # the docstring is documentation
    assert not named("Roberta's RoBERTa", {"bert"}) and not named("albertine, gemmaceous, bartender", every)
    assert named("DistilBertModel", {"bert"}) == {"bert"} and named("hf-xlm-roberta", every) >= {"xlm-roberta"}
    assert not named("OPTIONAL_EXAMPLES, _OPTIONS, Options", {"opt"})  # a longer word in capitals holds none
    assert named("OPTForCausalLM", {"opt"}) == {"opt"} and named("hf_opt, OPT_2", {"opt"}) == {"opt"}
