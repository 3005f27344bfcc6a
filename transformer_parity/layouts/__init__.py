"""External checkpoint layouts: one module per layout, each with its detection, config mapping (saying what it
assumed) and one declarative table (`layouts.table`), importing no framework until its weights are read or written.

A family (a Hugging Face model type, a KerasHub backbone and its tasks) is one module, `hf_NAME.py` or
`kerashub_NAME.py`, that ends with its record, `FAMILY` (`family.HFFamily` or `family.KerasHubFamily`): its name and
the classes it is recognised by, its config both ways, its weight table and where the base model sits, the library
classes that judge it and the modules that compute its sublayers, its task heads or text classifier, the settings
only it expresses, its approximations and its quirks. Every field is stated, a hook it lacks as absent; shared code
(`hf`, `hf_tasks`, `kerashub_preset`, `kerashub_classifiers`, `approximations`, `verify`, the command line) reads
records only, through `hf_family` / `kerashub_family`, and names no family. Adding a family is adding its module
(and its tests) and one line in one of the registries below; `parity_tests/test_family_records.py` holds every
family to this.

The other layouts: `nn_transformer` (state dicts of models built around `torch.nn.Transformer`, `FILE_LAYOUTS`) and
`user` (a layout file a user writes, TOML, for a model this tool never saw: `--layout FILE`). The KerasHub families'
tables are layout files too (`kerashub_*.toml`), read by `user`; `kerashub_preset` reads and writes their preset
directories, `hf` the Hugging Face model directories.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import reference_numpy as rn

if TYPE_CHECKING:
    from .family import HFFamily, KerasHubFamily

# format name -> module: the Hugging Face families (model directories, `hf.py` reads and writes them) ...
HF_LAYOUTS = {
    "hf-gpt2": "hf_gpt2",
    "hf-gpt-neo": "hf_gpt_neo",
    "hf-opt": "hf_opt",
    "hf-bert": "hf_bert",
    "hf-roberta": "hf_roberta",
    "hf-xlm-roberta": "hf_xlm_roberta",
    "hf-distilbert": "hf_distilbert",
    "hf-albert": "hf_albert",
    "hf-electra": "hf_electra",
    "hf-deberta-v2": "hf_deberta_v2",
    "hf-mpnet": "hf_mpnet",
    "hf-marian": "hf_marian",
    "hf-bart": "hf_bart",
    "hf-mbart": "hf_mbart",
    "hf-pegasus": "hf_pegasus",
    "hf-m2m-100": "hf_m2m_100",
    "hf-t5": "hf_t5",
    "hf-mt5": "hf_mt5",
    "hf-llama": "hf_llama",
    "hf-mistral": "hf_mistral",
    "hf-mixtral": "hf_mixtral",
    "hf-gpt-oss": "hf_gpt_oss",
    "hf-qwen2": "hf_qwen2",
    "hf-qwen3": "hf_qwen3",
    "hf-qwen2-moe": "hf_qwen2_moe",
    "hf-qwen3-moe": "hf_qwen3_moe",
    "hf-gemma": "hf_gemma",
    "hf-gemma2": "hf_gemma2",
    "hf-gemma3-text": "hf_gemma3_text",
    "hf-smollm3": "hf_smollm3",
    "hf-phi3": "hf_phi3",
    "hf-starcoder2": "hf_starcoder2",
    "hf-stablelm": "hf_stablelm",
    "hf-gpt-neox": "hf_gpt_neox",
    "hf-phi": "hf_phi",
    "hf-gptj": "hf_gptj",
    "hf-olmo": "hf_olmo",
    "hf-olmo2": "hf_olmo2",
    "hf-granite": "hf_granite",
    "hf-codegen": "hf_codegen",
    "hf-falcon": "hf_falcon",
    "hf-bloom": "hf_bloom",
    "hf-cohere": "hf_cohere",
    "hf-modernbert": "hf_modernbert",
}
# ... the KerasHub families (preset directories, `kerashub_preset.py` reads and writes them) ...
KERASHUB_PRESET_LAYOUTS = {
    "kerashub-gpt2": "kerashub_gpt2",
    "kerashub-gpt-neox": "kerashub_gpt_neox",
    "kerashub-opt": "kerashub_opt",
    "kerashub-bert": "kerashub_bert",
    "kerashub-roberta": "kerashub_roberta",
    "kerashub-xlm-roberta": "kerashub_xlm_roberta",
    "kerashub-distilbert": "kerashub_distilbert",
    "kerashub-albert": "kerashub_albert",
    "kerashub-electra": "kerashub_electra",
    "kerashub-deberta-v3": "kerashub_deberta_v3",
    "kerashub-llama": "kerashub_llama",
    "kerashub-mistral": "kerashub_mistral",
    "kerashub-mixtral": "kerashub_mixtral",
    "kerashub-gpt-oss": "kerashub_gpt_oss",
    "kerashub-qwen": "kerashub_qwen",
    "kerashub-qwen-moe": "kerashub_qwen_moe",
    "kerashub-qwen3": "kerashub_qwen3",
    "kerashub-qwen3-moe": "kerashub_qwen3_moe",
    "kerashub-gemma": "kerashub_gemma",
    "kerashub-gemma3": "kerashub_gemma3",
    "kerashub-phi3": "kerashub_phi3",
    "kerashub-smollm3": "kerashub_smollm3",
    "kerashub-bart": "kerashub_bart",
    "kerashub-bloom": "kerashub_bloom",
    "kerashub-falcon": "kerashub_falcon",
    "kerashub-t5": "kerashub_t5",
}
# ... the Keras models that have no preset, only a bare .weights.h5 (`kerashub_preset.py` reads and writes it) ...
KERASHUB_WEIGHTS_LAYOUTS = {
    "kerashub-seq2seq": "kerashub_seq2seq",
}
KERASHUB_LAYOUTS = {**KERASHUB_PRESET_LAYOUTS, **KERASHUB_WEIGHTS_LAYOUTS}  # every KerasHub family
KERASHUB_PRESETS = ("kerashub", *KERASHUB_PRESET_LAYOUTS)  # the formats of preset directories
# ... and the single-file layouts.
FILE_LAYOUTS = {
    "nn-transformer": "nn_transformer",
}


def hf_family(name: str) -> HFFamily:
    """The record (`family.HFFamily`) of a Hugging Face family format (`HF_LAYOUTS`' keys)."""
    if name not in HF_LAYOUTS:
        raise ValueError(f"unknown Hugging Face format {name!r}; choose one of {', '.join(HF_LAYOUTS)}")
    return importlib.import_module(f"{__name__}.{HF_LAYOUTS[name]}").FAMILY


def kerashub_family(name: str) -> KerasHubFamily:
    """The record (`family.KerasHubFamily`) of a KerasHub family format (`KERASHUB_LAYOUTS`' keys)."""
    if name not in KERASHUB_LAYOUTS:
        raise ValueError(f"unknown KerasHub format {name!r}; choose one of {', '.join(KERASHUB_LAYOUTS)}")
    return importlib.import_module(f"{__name__}.{KERASHUB_LAYOUTS[name]}").FAMILY


def hf_families() -> list[HFFamily]:
    return [hf_family(name) for name in HF_LAYOUTS]


def kerashub_families() -> list[KerasHubFamily]:
    return [kerashub_family(name) for name in KERASHUB_LAYOUTS]


# Settings only some families express (each lists them in its record's `expresses`): any other exports them as a
# model that computes something else.
FAMILY_ONLY = {
    "positions_skip_pad": "positions counted over non-pad ids",
    "embedding_size": "factorized embeddings",
    "shared_layers": "one set of layer weights run by every layer",
    "qk_norm_eps": "q/k norms at an epsilon of their own",
    "causal_encoder": "an encoder with causal self-attention",
    "choice_head": "a multiple-choice score beside the logits",
    "num_experts": "a mixture-of-experts feed-forward",
    "attn_logit_softcap": "attention scores soft-capped",
    "final_logit_softcap": "logits soft-capped",
    "post_norms": "a norm on each sublayer's output too",
    "layer_kinds": "sliding and full attention layers by a pattern",
    "local_rope_theta": "a rotary base of their own for the sliding layers",
    "rope_layers": "layers without positions",
    "parallel_residual": "attention and feed-forward side by side on one residual",
    "ffn_shares_norm": "one norm read by attention and feed-forward",
    "rotary_interleaved": "rotary positions on adjacent dim pairs",
    "pre_norms": "no norm before the sublayers",  # False: OLMo 2
    "qk_norm_over": "q/k norms over all heads at once",
    "norm_affine": "norms without parameters",  # False: OLMo
    "norm_bias": "LayerNorms without a bias",  # False: ModernBERT, Cohere
    "first_attn_norm": "a first layer whose attention has no norm",  # False: ModernBERT
    "clip_qkv": "q, k and v clamped",
    "embedding_multiplier": "token embeddings times a multiplier",
    "residual_multiplier": "sublayer outputs times a multiplier",
    "logit_divisor": "logits divided by a divisor",
    "sinusoid_frequencies": "sinusoids at other frequencies",
    "relative_terms": "disentangled attention over relative positions",
    "relative_buckets": "log-bucketed relative positions",
    "max_relative_positions": "relative positions up to a distance",
    "relative_embed_norm": "a norm on the relative positions' table",
    "relative_shares_qk": "relative positions projected by q's and k's kernels",
    "embed_zero_padding": "embeddings zeroed at padding",
    "padded_queries": "padding queries averaging every position",
    "attention_sinks": "a learned logit per head in each softmax",
    "router_bias": "a bias on the router's scores",
    "glu_limit": "the gated feed-forward's inputs clamped",
    "glu_alpha": "silu at another sigmoid gain",
    "glu_up_offset": "an offset on the gated feed-forward's up projection",
    "alibi": "ALiBi biases on the attention scores in place of positions",
    "alibi_scaled": "ALiBi biases scaled with the attention scores",
    "alibi_bfloat16": "ALiBi biases rounded to bfloat16",
    "relative_bias_buckets": "a relative position bias on the attention scores",
    "relative_bias_max_distance": "relative position buckets up to another distance",
}


def canonical_only(config, family: HFFamily | KerasHubFamily | None = None) -> list[str]:
    """The settings of `config` that no built-in external family expresses (Hugging Face, KerasHub,
    torch.nn.Transformer), and those of `FAMILY_ONLY` that `family` (None: any family expressing none) does not,
    each saying which families do: each would export as a model that computes something else."""
    problems = [f"{field}={getattr(config, field)!r} ({what}{_expressed_by(field)}; "
                f"{family.name if family is not None else 'this layout'} has none)"
                for field, what in FAMILY_ONLY.items()
                if getattr(config, field) != _DEFAULTS[field] and field not in (family.expresses if family is not None else ())]
    if config.attention_scale != "head" and "attention_scale" not in (family.expresses if family is not None else ()):
        problems.append(f"attention_scale={config.attention_scale!r} (scores scaled by 1/sqrt(d_head) there"
                        f"{_expressed_by('attention_scale')})")
    if config.embed_bias:
        problems.append("embed_bias=True (no bias on the token embedding there)")
    if config.head_order != "dense-activation-norm":
        problems.append(f"head_order={config.head_order!r} (dense -> activation -> LayerNorm there)")
    return problems


# a FAMILY_ONLY setting is one away from its default
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(rn.TransformerConfig)}


def _expressed_by(field: str) -> str:
    """`, which hf-x and kerashub-y have`: the families whose records express `field`."""
    names = [family.name for family in hf_families() + kerashub_families() if field in family.expresses]
    if not names:
        return ""
    return f", which {' and '.join(names) if len(names) < 3 else ', '.join(names[:-1]) + ' and ' + names[-1]} " + (
        "has" if len(names) == 1 else "have")


def why_not(family, config, problems: Callable[[Any, Any], list[str]] | None = None) -> list[str]:
    """Why the family record `family` does not write `config` (empty: it does): `canonical_only`, then
    `problems(family, config)`, by default the family's own `export_problems` (a task head's checks,
    `hf_tasks.export_problems` or `kerashub_classifiers.export_problems`, where the model has one)."""
    return canonical_only(config, family) + (problems(family, config) if problems else family.export_problems(config))


def first_exporter(families, config, what: str, problems: Callable[[Any, Any], list[str]] | None = None):
    """The first of the family records `families` that writes `config` (`why_not`, with `problems`); otherwise a
    `ValueError` that says, for each, why this model has no `what` equivalent."""
    found = {}
    for family in families:
        found[family.name] = why_not(family, config, problems)
        if not found[family.name]:
            return family
    raise ValueError(f"this model has no {what} equivalent here: " + "; ".join(
        f"as {name}: {', '.join(p)}" for name, p in found.items()))


def file_layout(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{FILE_LAYOUTS[name]}")
