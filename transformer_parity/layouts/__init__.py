"""External checkpoint layouts: one module per layout, each with its detection, config mapping (saying what it
assumed) and one declarative table (`layouts.table`), importing no framework until its weights are read or written.

Adding a layout is adding one module and one line here.

| format           | module           | what                                                              |
|------------------|------------------|-------------------------------------------------------------------|
| `hf-gpt2`        | `hf_gpt2`        | Hugging Face `GPT2LMHeadModel` / `GPT2Model` directories           |
| `hf-bert`        | `hf_bert`        | Hugging Face `BertForMaskedLM` / `BertModel` directories           |
| `hf-roberta`     | `hf_roberta`     | Hugging Face `RobertaForMaskedLM` / `RobertaModel` directories     |
| `hf-xlm-roberta` | `hf_xlm_roberta` | Hugging Face `XLMRobertaForMaskedLM` / `XLMRobertaModel` (RoBERTa's table) |
| `hf-distilbert`  | `hf_distilbert`  | Hugging Face `DistilBertForMaskedLM` / `DistilBertModel` directories |
| `hf-albert`      | `hf_albert`      | Hugging Face `AlbertForMaskedLM` / `AlbertModel` directories       |
| `hf-marian`      | `hf_marian`      | Hugging Face `MarianMTModel` directories                           |
| `hf-bart`        | `hf_bart`        | Hugging Face `BartForConditionalGeneration` directories            |
| `hf-llama`       | `hf_llama`       | Hugging Face `LlamaForCausalLM` / `LlamaModel` directories         |
| `hf-mistral`, `hf-qwen2`, `hf-qwen3`, `hf-gemma` | `hf_mistral`, ... | Llama's table with their own config fields |
| `hf-phi3`        | `hf_phi3`        | Hugging Face `Phi3ForCausalLM` (fused q/k/v and gate/up)           |
| `nn-transformer` | `nn_transformer` | state dicts of models built around `torch.nn.Transformer`          |
| `kerashub-gpt2`  | `kerashub_gpt2`  | KerasHub `GPT2Backbone` / `GPT2CausalLM` presets and weights       |
| `kerashub-bert`  | `kerashub_bert`  | KerasHub `BertBackbone` presets and weights                        |
| `kerashub-roberta`, `-distilbert`, `-albert` | `kerashub_roberta`, ... | KerasHub RoBERTa, DistilBERT, ALBERT |
| `kerashub-llama`, `-mistral`, `-qwen`, `-qwen3`, `-gemma`, `-phi3` | `kerashub_llama`, ... | KerasHub causal LMs |
| `kerashub-bart`  | `kerashub_bart`  | KerasHub `BartBackbone` / `BartSeq2SeqLM` presets                  |
| `kerashub-seq2seq` | `kerashub_seq2seq` | keras.io's English-to-Spanish KerasHub model's `.weights.h5`   |
| `--layout FILE`  | `user`           | a layout file a user writes (TOML) for a model this tool never saw |

The KerasHub families are listed in `kerashub_preset.FAMILIES` (`kerashub_preset` reads and writes their preset
directories); their tables are layout files (`kerashub_*.toml`), read by `user`, the format users write.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Callable

# format name -> module: the Hugging Face families (model directories, `hf.py` reads and writes them) ...
HF_LAYOUTS = {
    "hf-gpt2": "hf_gpt2",
    "hf-bert": "hf_bert",
    "hf-roberta": "hf_roberta",
    "hf-xlm-roberta": "hf_xlm_roberta",
    "hf-distilbert": "hf_distilbert",
    "hf-albert": "hf_albert",
    "hf-marian": "hf_marian",
    "hf-bart": "hf_bart",
    "hf-llama": "hf_llama",
    "hf-mistral": "hf_mistral",
    "hf-qwen2": "hf_qwen2",
    "hf-qwen3": "hf_qwen3",
    "hf-gemma": "hf_gemma",
    "hf-phi3": "hf_phi3",
}
# ... the KerasHub families (preset directories, `kerashub_preset.py` reads and writes them; kerashub-seq2seq is
# keras.io's seq2seq model, a bare .weights.h5) ...
KERASHUB_LAYOUTS = {
    "kerashub-gpt2": "kerashub_gpt2",
    "kerashub-bert": "kerashub_bert",
    "kerashub-roberta": "kerashub_roberta",
    "kerashub-distilbert": "kerashub_distilbert",
    "kerashub-albert": "kerashub_albert",
    "kerashub-llama": "kerashub_llama",
    "kerashub-mistral": "kerashub_mistral",
    "kerashub-qwen": "kerashub_qwen",
    "kerashub-qwen3": "kerashub_qwen3",
    "kerashub-gemma": "kerashub_gemma",
    "kerashub-phi3": "kerashub_phi3",
    "kerashub-bart": "kerashub_bart",
    "kerashub-seq2seq": "kerashub_seq2seq",
}
KERASHUB_PRESETS = ("kerashub", *(name for name in KERASHUB_LAYOUTS if name != "kerashub-seq2seq"))
# ... and the single-file layouts.
FILE_LAYOUTS = {
    "nn-transformer": "nn_transformer",
}


def hf_layout(name: str) -> ModuleType:
    """The module of a Hugging Face family format (`hf-gpt2`, ...)."""
    if name not in HF_LAYOUTS:
        raise ValueError(f"unknown Hugging Face format {name!r}; choose one of {', '.join(HF_LAYOUTS)}")
    return importlib.import_module(f"{__name__}.{HF_LAYOUTS[name]}")


# Settings only some families express (each names them in its module's `EXPRESSES`): any other exports them as a
# model that computes something else.
FAMILY_ONLY = {
    "positions_skip_pad": "RoBERTa's positions, counted over non-pad ids",
    "embedding_size": "ALBERT's factorized embeddings",
    "shared_layers": "ALBERT's one set of layer weights",
    "qk_norm_eps": "q/k norms at an epsilon of their own, as KerasHub's Qwen3 computes them",
    "causal_encoder": "an encoder with causal self-attention, as BertLMHeadModel's",
    "choice_head": "a multiple-choice score beside the logits, as GPT2DoubleHeadsModel's",
}


def canonical_only(config, module: ModuleType | None = None) -> list[str]:
    """The settings of `config` that no built-in external family expresses (Hugging Face, KerasHub,
    torch.nn.Transformer), and those of `FAMILY_ONLY` that `module` (None: any family without `EXPRESSES`) does
    not: each would export as a model that computes something else."""
    problems = [f"{field}={getattr(config, field)!r} ({what}; {getattr(module, 'NAME', 'this layout')} has none)"
                for field, what in FAMILY_ONLY.items()
                if getattr(config, field) and field not in getattr(module, "EXPRESSES", ())]
    if config.attention_scale != "head":
        problems.append(f"attention_scale={config.attention_scale!r} (scores scaled by 1/sqrt(d_head) there)")
    if config.embed_bias:
        problems.append("embed_bias=True (no bias on the token embedding there)")
    if config.head_order != "dense-activation-norm":
        problems.append(f"head_order={config.head_order!r} (dense -> activation -> LayerNorm there)")
    return problems


class Viewed:
    """A family module whose export checks are a task head's (`hf_tasks.export_problems`,
    `kerashub_classifiers.export_problems`), as `first_exporter` and `approximations.plan` ask a family; every other
    attribute is the module's own (`module` is the module itself)."""

    def __init__(self, module: ModuleType, problems: Callable[[ModuleType, Any], list[str]]):
        self.module, self._problems = module, problems

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def export_problems(self, config) -> list[str]:
        return self._problems(self.module, config)


def first_exporter(names, load, config, what: str) -> ModuleType:
    """The first of the layout modules `load(name)` whose `export_problems(config)` is empty; otherwise a
    `ValueError` that says, for each, why this model has no `what` equivalent."""
    problems = {}
    for name in names:
        module = load(name)
        problems[name] = canonical_only(config, module) + module.export_problems(config)
        if not problems[name]:
            return module.module if isinstance(module, Viewed) else module
    raise ValueError(f"this model has no {what} equivalent here: " + "; ".join(
        f"as {name}: {', '.join(p)}" for name, p in problems.items()))


def file_layout(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{FILE_LAYOUTS[name]}")
