"""KerasHub's text classifiers (`BertTextClassifier`, `AlbertTextClassifier`, `RobertaTextClassifier`,
`DistilBertTextClassifier`) as canonical sequence classifiers (`TransformerConfig.classifier`).

keras-hub 0.32 builds them on the family's backbone: BERT and ALBERT score the backbone's `pooled_output` with one
Dense (`logits`); RoBERTa and DistilBERT read position 0 of the sequence output, through a Dense with tanh (RoBERTa)
or ReLU (DistilBERT) of `hidden_dim` units (`pooled_dense`), then score it. Their weights are task.weights.h5's
`layers/dense` (and `layers/dense_1`), in creation order. task.json holds `num_classes`, `activation` (an activation
on the scores: only none, "linear", is the canonical head) and `dropout`.

A family names its classifier in its module's `CLASSIFIER`; `kerashub_preset` reads, writes and checks it here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import reference_numpy as rn

from .hf_tasks import NO_HEAD


@dataclass(frozen=True)
class Classifier:
    """One KerasHub text classifier: what it computes on its backbone and where its weights are."""

    fields: dict[str, Any]  # the canonical head fields
    weights: list[tuple[str, str, str]]  # (canonical, task.weights.h5 path under `task/`, transform)
    hidden_dim: bool = False  # task.json has `hidden_dim` (the width of `pooled_dense`)


_ONE_DENSE = [("classifier.kernel", "task/layers/dense/vars/0", "identity"),
              ("classifier.bias", "task/layers/dense/vars/1", "identity")]
_TWO_DENSE = [("classifier.dense.kernel", "task/layers/dense_0/vars/0", "identity"),  # `dense` before a `dense_1`
              ("classifier.dense.bias", "task/layers/dense_0/vars/1", "identity"),
              ("classifier.kernel", "task/layers/dense_1/vars/0", "identity"),
              ("classifier.bias", "task/layers/dense_1/vars/1", "identity")]
CLASSIFIERS = {
    "BertTextClassifier": Classifier({"classifier": "sequence", "classifier_input": "pooler"}, _ONE_DENSE),
    "AlbertTextClassifier": Classifier({"classifier": "sequence", "classifier_input": "pooler"}, _ONE_DENSE),
    "RobertaTextClassifier": Classifier({"classifier": "sequence", "classifier_input": "first",
                                         "classifier_dense": "tanh"}, _TWO_DENSE, hidden_dim=True),
    "DistilBertTextClassifier": Classifier({"classifier": "sequence", "classifier_input": "first",
                                            "classifier_dense": "relu"}, _TWO_DENSE, hidden_dim=True),
}


def of(module) -> tuple[str, Classifier] | None:
    """`(class name, Classifier)` of a family module's `CLASSIFIER`, or None."""
    name = getattr(module, "CLASSIFIER", None)
    return None if name is None else (name, CLASSIFIERS[name])


def fields(task: str, task_config: dict[str, Any], config: rn.TransformerConfig, where: str) -> dict[str, Any]:
    """The canonical fields of a classifier task.json (`task_config`: its `config`), checked."""
    spec = CLASSIFIERS[task]
    count = task_config.get("num_classes")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{where}: num_classes must be a positive integer, received {count!r}")
    activation = task_config.get("activation")
    if activation not in (None, "linear"):
        raise ValueError(f"{where}: activation={activation!r} on the scores is not supported (the canonical head "
                         "returns the scores themselves); save the classifier with activation=None")
    width = task_config.get("hidden_dim", config.d_model) if spec.hidden_dim else config.d_model
    if width != config.d_model:
        raise ValueError(f"{where}: hidden_dim={width!r} is not supported (the canonical dense layer before the "
                         f"scores is d_model={config.d_model} wide)")
    return {**NO_HEAD, **spec.fields, "num_labels": count}


def matches(module, config: rn.TransformerConfig) -> bool:
    found = of(module)
    if found is None or config.classifier is None:
        return False
    wanted = {**{k: NO_HEAD[k] for k in ("classifier_dense", "classifier_bias", "next_sentence", "causal_encoder",
                                             "choice_head")},
              **found[1].fields}
    return all(getattr(config, k) == v for k, v in wanted.items())


def base(config: rn.TransformerConfig) -> rn.TransformerConfig:
    """The backbone's config under a classifier's: the head undone."""
    return config.replace(**NO_HEAD)


def serialized(module, task: str) -> tuple[str, str]:
    """`(module path, name)` of the classifier in task.json, beside its backbone's."""
    path, name = module.SERIALIZED[module.BACKBONE]
    return path.replace("_backbone", "_text_classifier"), name.replace("_backbone", "_text_classifier")


def export_problems(module, config: rn.TransformerConfig) -> list[str]:
    """Why a classifier config is not `module`'s text classifier on its backbone (empty if it is)."""
    if not matches(module, config):
        found = of(module)
        if found is None:
            return [f"a {config.classifier} head (KerasHub {module.BACKBONE} has no text classifier)"]
        wanted = ", ".join(f"{k}={v!r}" for k, v in found[1].fields.items())
        return [f"a {config.classifier} head reading {config.classifier_input} (KerasHub {found[0]} has {wanted})"]
    return module.export_problems(base(config))


def task_config(config: rn.TransformerConfig, task: str) -> dict[str, Any]:
    """The task's own `get_config()` fields besides backbone and preprocessor."""
    out = {"num_classes": config.num_labels, "activation": "linear", "dropout": config.dropout}
    if CLASSIFIERS[task].hidden_dim:
        out["hidden_dim"] = config.d_model
    return out
