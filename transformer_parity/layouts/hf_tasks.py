"""Task heads of Hugging Face model classes (`<Stem>ForSequenceClassification`, `<Stem>ForTokenClassification`,
`<Stem>ForQuestionAnswering`, `<Stem>ForPreTraining`, ...). Each is a family's base model (its bare model, or its
masked-LM model for pretraining) under a prefix, plus a few head weights; the canonical model holds the head as
`classifier` (or `next_sentence`) fields and weights (`reference_numpy` `TransformerConfig.classifier`).

A family lists its heads in its record's `task_heads` (`Head`s, `layouts.family`). Reading a task directory reads
the base model with the family's own functions, then applies the head's fields and the labels of config.json
(`num_labels`, `id2label`, `problem_type`); writing one writes the base model's config.json, names the task class
and adds the labels back. A class a family does not list is refused by the family's own `architectures` check,
naming what it supports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import reference_numpy as rn

# The canonical fields a head sets, with the values that mean "no head".
NO_HEAD = {"classifier": None, "num_labels": 0, "classifier_input": "pooler", "classifier_dense": None,
           "classifier_bias": True, "next_sentence": False, "label_names": None, "problem_type": None,
           "causal_encoder": False, "choice_head": False}
HEAD_FIELDS = ("classifier", "classifier_input", "classifier_dense", "classifier_bias", "next_sentence",
               "causal_encoder", "choice_head")


@dataclass(frozen=True)
class Head:
    """One task class of a family: what it computes on top of its base model, and its weights' names."""

    arch: str  # the task class: "<Stem>ForSequenceClassification"
    base: str  # the family class it extends: "<Stem>Model" (or "<Stem>ForMaskedLM" for pretraining)
    fields: dict[str, Any]  # canonical fields it sets: classifier, classifier_input, ..., pooler
    weights: list[tuple[str, str, str]]  # its head weights: (canonical, external, transform)
    base_fields: dict[str, Any] = field(default_factory=dict)  # the base class's values of fields the head changes
    prefix: str | None = None  # where its base model sits when not at the family's base_prefix (some QA classes)
    # config.json keys the class computes its head with: key -> (the value it needs, transformers' default)
    hf_keys: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    token_ids: dict[str, str] = field(default_factory=dict)  # canonical id fields its head reads: config.json keys

    def matches(self, config: rn.TransformerConfig) -> bool:
        """Whether `config`'s head is this one (every head field as it sets it, the others as without a head)."""
        wanted = {**{k: NO_HEAD[k] for k in HEAD_FIELDS}, **self.fields}
        return all(getattr(config, k) == v for k, v in wanted.items())

    def base_config(self, config: rn.TransformerConfig) -> rn.TransformerConfig:
        """The base class's config under `config`: the head's fields undone."""
        return config.replace(**NO_HEAD, **self.base_fields, **{name: None for name in self.token_ids})


def linear(canonical: str, external: str, bias: bool = True) -> list[tuple[str, str, str]]:
    """An `nn.Linear`'s two entries: weight `(out, in)` transposed to a canonical kernel, and its bias."""
    return [(f"{canonical}.kernel", f"{external}.weight", "transpose")] + (
        [(f"{canonical}.bias", f"{external}.bias", "identity")] if bias else [])


def encoder_heads(stem: str, sequence: dict[str, Any], sequence_weights: list, pooled_base: bool,
                  choice: tuple[dict[str, Any], list] | None = None) -> tuple[Head, ...]:
    """The sequence, multiple-choice, token and question-answering classes of an encoder family (`stem`: its
    classes' common prefix): `sequence` its sequence head's fields and weights, `choice` its multiple-choice head's
    (default: the sequence head's), `pooled_base` whether its bare model has a pooler (token and span heads never
    do). A multiple-choice class scores each choice once: the canonical model takes the choices as rows."""
    base, no_pool = f"{stem}Model", {"pooler": pooled_base}
    choice_fields, choice_weights = choice or (sequence, sequence_weights)
    return (Head(f"{stem}ForSequenceClassification", base, {"classifier": "sequence", **sequence}, sequence_weights,
                 no_pool),
            Head(f"{stem}ForMultipleChoice", base, {"classifier": "choice", **choice_fields}, choice_weights, no_pool),
            Head(f"{stem}ForTokenClassification", base, {"classifier": "token", "pooler": False},
                 linear("classifier", "classifier"), no_pool),
            Head(f"{stem}ForQuestionAnswering", base, {"classifier": "span", "pooler": False},
                 linear("classifier", "qa_outputs"), no_pool))


def decoder_heads(stem: str, qa_prefix: str | None = None, token_score: str = "score", qa: bool = True
                  ) -> tuple[Head, ...]:
    """The sequence, token and (`qa`) question-answering classes of a causal family: the sequence head scores the
    last non-pad position with `score` (no bias), the token head with `token_score`; `qa_prefix` where its QA class
    keeps the base model where not at the family's base prefix (some keep `transformer.`, for backward
    compatibility)."""
    base = f"{stem}Model"
    return (Head(f"{stem}ForSequenceClassification", base, {"classifier": "sequence", "classifier_input": "last",
                                                           "classifier_bias": False},
                 linear("classifier", "score", bias=False)),
            Head(f"{stem}ForTokenClassification", base, {"classifier": "token"}, linear("classifier", token_score)),
            ) + ((Head(f"{stem}ForQuestionAnswering", base, {"classifier": "span"}, linear("classifier", "qa_outputs"),
                       prefix=qa_prefix),) if qa else ())


def causal_lm(arch: str, base: str) -> Head:
    """An encoder family's causal language model (`arch`, on its masked-LM class `base`): its masked-LM model under
    `is_decoder=true`, which makes every self-attention causal."""
    return Head(arch, base, {"causal_encoder": True}, [], hf_keys={"is_decoder": (True, False)})


def head_named(family, hf: Mapping[str, Any]) -> Head | None:
    """The head of the task class config.json names, or None (a class the family, a `layouts.family.HFFamily`,
    reads itself, or none); a class neither knows is refused, naming every class the family supports."""
    archs = hf.get("architectures") or []
    if not isinstance(archs, list):
        return None  # the family's own check says what is wrong
    head = next((h for h in family.task_heads if h.arch in archs), None)
    if head is None and archs and not set(archs) & set(family.architectures):
        supported = list(family.architectures) + [h.arch for h in family.task_heads]
        raise ValueError(f"config.json architectures={archs} is not supported for model_type {family.model_type!r} "
                         f"(its head is not implemented here, and a model is never ported without its head); "
                         f"supported: {', '.join(supported)}")
    return head


def head_for(family, config: rn.TransformerConfig) -> Head | None:
    """The head of `family` (its record) that computes `config`'s, or None."""
    return next((h for h in family.task_heads if h.matches(config)), None)


def has_head(config: rn.TransformerConfig) -> bool:
    return config.classifier is not None or config.next_sentence or config.causal_encoder or config.choice_head


def labels(hf: Mapping[str, Any], head: Head) -> dict[str, Any]:
    """The canonical label fields from config.json: `num_labels` (from `id2label`, as transformers derives it),
    `label_names` in id order, `problem_type`."""
    id2label = hf.get("id2label")
    if id2label is not None:
        if not isinstance(id2label, dict) or sorted(map(str, id2label)) != sorted(str(i) for i in range(len(id2label))):
            raise ValueError(f"config.json id2label must map 0..n-1 to labels, received {id2label!r}")
        names = tuple(str(id2label[str(i)] if str(i) in id2label else id2label[i]) for i in range(len(id2label)))
    else:
        count = hf.get("num_labels", 2)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"config.json num_labels must be a positive integer, received {count!r}")
        names = tuple(f"LABEL_{i}" for i in range(count))
    if "classifier" not in head.fields:
        return {}  # a pretraining class's two next-sentence scores are not labels, nor a causal LM's logits
    if head.fields.get("classifier") == "choice":
        return {"num_labels": 1}  # one score per choice, whatever num_labels says (transformers ignores it there)
    problem = hf.get("problem_type")
    return {"num_labels": len(names), "label_names": names, "problem_type": problem}


def to_hf_labels(config: rn.TransformerConfig) -> dict[str, Any]:
    """config.json's label keys for a classifier config."""
    if config.classifier in (None, "choice"):
        return {}
    names = config.label_names or tuple(f"LABEL_{i}" for i in range(config.num_labels))
    out = {"id2label": {str(i): n for i, n in enumerate(names)}, "label2id": {n: i for i, n in enumerate(names)}}
    if config.problem_type is not None:
        out["problem_type"] = config.problem_type
    return out


def read(family, head: Head, hf: dict[str, Any], keys: list[str], token_id: Callable
         ) -> tuple[rn.TransformerConfig, str, list[str], list[tuple[str, str, str]]]:
    """`(config, architecture, notes, table)` of a task directory: the base model read by the family, the head
    applied. A causal family's base reads no pad id; its task classes do (`token_id`: `layouts.hf.token_id`)."""
    base_keys = [k for k in keys if not any(k == e for _, e, _ in head.weights)]
    for key, (value, default) in head.hf_keys.items():
        if hf.get(key, default) != value:
            raise ValueError(f"config.json {key}={json.dumps(hf.get(key, default))}: {head.arch} is ported with "
                             f"{key}={json.dumps(value)} only (otherwise transformers computes another head); set "
                             f"{key} to {json.dumps(value)}, or architectures to [\"{head.base}\"]")
    hf = {k: v for k, v in hf.items() if k not in head.hf_keys}
    config, _, notes = family.config_from_hf({**hf, "architectures": [head.base]}, base_keys)
    ids = {}  # the token ids the head reads, besides the base model's
    if config.is_decoder_only:
        ids = {"pad_id": token_id(hf, "pad_token_id", config.tgt_vocab_size)}
        notes.append(f"pad_token_id={ids['pad_id']} is what padding masks use" + (
            " and the last non-pad position the sequence head reads" if head.fields.get("classifier_input") == "last"
            else ""))
    for name, key in head.token_ids.items():
        ids[name] = token_id(hf, key, config.src_vocab_size)
        if ids[name] is None:
            raise ValueError(f"config.json has no {key}, which {head.arch}'s head reads; give it in config.json")
        notes.append(f"{key}={ids[name]}: the classifier reads the decoder at the source's last {key}")
    config = config.replace(**{**NO_HEAD, **head.fields, **labels(hf, head), **ids})
    return config, head.arch, [n for n in notes if "pooler" not in n], table(family, head, config)


def table(family, head: Head, config: rn.TransformerConfig) -> list[tuple[str, str, str]]:
    """The family's table under the head's prefix, with the head's weights in place of any entry of the same
    external name (a family's table may ignore a tensor that one of its task classes holds)."""
    prefix = head.prefix if head.prefix is not None else family.base_prefix
    own = {e for _, e, _ in head.weights}
    return [entry for entry in family.table(config, prefix) if entry[1] not in own] + head.weights


def export_problems(family, config: rn.TransformerConfig) -> list[str]:
    """Why a config with a task head has no equivalent in `family` (empty if one of its heads computes it)."""
    head = head_for(family, config)
    if head is None:
        listed = ", ".join(h.arch for h in family.task_heads) or "none"
        return [f"a {config.classifier or 'next-sentence'} head reading {config.classifier_input} (task classes: "
                f"{listed})"]
    try:
        base = head.base_config(config)
    except ValueError as exc:  # the head's base cannot be this model (an encoder's on a causal model)
        return [f"{head.arch} is built on {head.base}, which this model is not ({exc})"]
    return family.export_problems(base)


def write(family, config: rn.TransformerConfig) -> tuple[dict[str, Any], str, list]:
    """`(config.json contents, architecture, table)` of a config with a task head `export_problems` accepts."""
    head = head_for(family, config)
    hf, _ = family.config_to_hf(head.base_config(config))
    hf.update(architectures=[head.arch], **{k: v for k, (v, _) in head.hf_keys.items()}, **to_hf_labels(config))
    if config.is_decoder_only:
        hf["pad_token_id"] = config.pad_id
    hf.update({key: getattr(config, name) for name, key in head.token_ids.items()})
    return hf, head.arch, table(family, head, config)
