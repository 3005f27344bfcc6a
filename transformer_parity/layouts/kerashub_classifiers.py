"""KerasHub's text classifiers (`<Stem>TextClassifier`) as canonical sequence classifiers
(`TransformerConfig.classifier`).

keras-hub 0.32 builds each on its family's backbone in one of two ways: one Dense (`logits`) on the backbone's
`pooled_output` (`pooled`), or a Dense with an activation of `hidden_dim` units (`pooled_dense`) on position 0 of the
sequence output, then the scores (`first_position`). Their weights are task.weights.h5's `layers/dense` (and
`layers/dense_1`), in creation order. task.json holds `num_classes`, `activation` (an activation on the scores: only
none, "linear", is the canonical head) and `dropout`.

A family names its classifier in its record's `classifier` (`layouts.family.KerasHubFamily`); `kerashub_preset`
reads, writes and checks it here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import reference_numpy as rn

from .hf_tasks import NO_HEAD


@dataclass(frozen=True)
class Classifier:
    """One KerasHub text classifier: what it computes on its backbone and where its weights are."""

    name: str  # its class, as task.json names it
    fields: dict[str, Any]  # the canonical head fields
    weights: list[tuple[str, str, str]]  # (canonical, task.weights.h5 path under `task/`, transform)
    hidden_dim: bool = False  # task.json has `hidden_dim` (the width of `pooled_dense`)


_ONE_DENSE = [("classifier.kernel", "task/layers/dense/vars/0", "identity"),
              ("classifier.bias", "task/layers/dense/vars/1", "identity")]
_TWO_DENSE = [("classifier.dense.kernel", "task/layers/dense_0/vars/0", "identity"),  # `dense` before a `dense_1`
              ("classifier.dense.bias", "task/layers/dense_0/vars/1", "identity"),
              ("classifier.kernel", "task/layers/dense_1/vars/0", "identity"),
              ("classifier.bias", "task/layers/dense_1/vars/1", "identity")]


def pooled(name: str) -> Classifier:
    """The classifier `name` that scores the backbone's pooled output with one Dense."""
    return Classifier(name, {"classifier": "sequence", "classifier_input": "pooler"}, _ONE_DENSE)


def first_position(name: str, activation: str) -> Classifier:
    """The classifier `name` that reads position 0 through a Dense of `hidden_dim` units with `activation`, then
    scores it."""
    return Classifier(name, {"classifier": "sequence", "classifier_input": "first", "classifier_dense": activation},
                      _TWO_DENSE, hidden_dim=True)


def fields(spec: Classifier, task_config: dict[str, Any], config: rn.TransformerConfig, where: str
           ) -> dict[str, Any]:
    """The canonical fields of a classifier task.json (`task_config`: its `config`), checked."""
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


def matches(family, config: rn.TransformerConfig) -> bool:
    """Whether `config`'s head is the text classifier of `family` (its record)."""
    if family.classifier is None or config.classifier is None:
        return False
    wanted = {**{k: NO_HEAD[k] for k in ("classifier_dense", "classifier_bias", "next_sentence", "causal_encoder",
                                             "choice_head")},
              **family.classifier.fields}
    return all(getattr(config, k) == v for k, v in wanted.items())


def base(config: rn.TransformerConfig) -> rn.TransformerConfig:
    """The backbone's config under a classifier's: the head undone."""
    return config.replace(**NO_HEAD)


def serialized(family) -> tuple[str, str]:
    """`(module path, name)` of `family`'s classifier in task.json, beside its backbone's."""
    path, name = family.serialized[family.backbone]
    return path.replace("_backbone", "_text_classifier"), name.replace("_backbone", "_text_classifier")


def export_problems(family, config: rn.TransformerConfig) -> list[str]:
    """Why a classifier config is not the text classifier of `family` (its record) on its backbone (empty if it
    is)."""
    if not matches(family, config):
        if family.classifier is None:
            return [f"a {config.classifier} head (KerasHub {family.backbone} has no text classifier)"]
        wanted = ", ".join(f"{k}={v!r}" for k, v in family.classifier.fields.items())
        return [f"a {config.classifier} head reading {config.classifier_input} (KerasHub {family.classifier.name} "
                f"has {wanted})"]
    return family.export_problems(base(config))


def task_config(config: rn.TransformerConfig, spec: Classifier) -> dict[str, Any]:
    """The classifier's own `get_config()` fields besides backbone and preprocessor."""
    out = {"num_classes": config.num_labels, "activation": "linear", "dropout": config.dropout}
    if spec.hidden_dim:
        out["hidden_dim"] = config.d_model
    return out
