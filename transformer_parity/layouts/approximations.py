"""Approximations: a setting a target family cannot express, where what it computes instead is a nearby function
(the tanh GELU for the exact one, a fixed epsilon for the model's own), as opposed to a structural difference (a
missing pooler, another position scheme), which stays a refusal.

A family lists its approximations in its record's `approximations` (`layouts.family`); each names the setting
(`gelu_tanh`, `qk_norm_eps`, ...), says in words what the target computes and what the source does, and gives the
canonical fields the target computes for a config (none where it does not apply). `plan` finds the family that takes
a model once its approximations are applied. `convert` refuses such an export, saying by how much the two functions
differ on the model (`verify.approximation.measure`), and writes it only when `--accept-approximation NAME` names
every one; the output then carries a `Record` (a KerasHub preset: in its metadata.json, which keras_hub does not
read), so that reading it back says so, `verify` reports the gap as such (never PASS), and an export back to the
source's format restores the source's settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import reference_numpy as rn

RECORD_KEY = "transformer_parity"  # our key in a preset's metadata.json; keras_hub reads none of that file


@dataclass(frozen=True)
class Approximation:
    """One setting a family cannot express, and the nearby function it computes instead."""

    name: str  # what --accept-approximation names: gelu_tanh
    computes: str  # what the target computes: "KerasHub's <Stem>Backbone computes tanh-approximated GELU"
    fields: Callable[[rn.TransformerConfig], dict[str, Any]]  # the fields the target computes for a config; {}: n/a
    source: Callable[[rn.TransformerConfig], str]  # what the source computes: "the source exact GELU"
    site: str  # where in a sublayer it acts, in words: "the feed-forward's activation"
    shows_in: tuple[str, ...]  # the sublayers it changes first, by the last part of their name: ("ffn", "head")

    def changes(self, config: rn.TransformerConfig) -> dict[str, Any]:
        """The fields of `config` this approximation changes (empty: the model does not need it)."""
        return {k: v for k, v in self.fields(config).items() if getattr(config, k) != v}

    def says(self, config: rn.TransformerConfig) -> str:
        """`gelu_tanh: KerasHub's <Stem>Backbone computes tanh-approximated GELU, the source exact GELU`."""
        return f"{self.name}: {self.computes}, {self.source(config)}"


@dataclass(frozen=True)
class Plan:
    """How a model is exported with approximations: the family, what it computes and what was changed."""

    family: Any  # the family record (`layouts.family`) that takes the approximated model
    config: rn.TransformerConfig  # what the target computes
    needed: tuple[Approximation, ...]
    says: tuple[str, ...]  # each one's `says(source config)`
    source_settings: dict[str, Any]  # the source's values of the fields changed
    target_settings: dict[str, Any]  # the target's

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.needed]


def plan(families: Sequence[Any], config: rn.TransformerConfig,
         why_not: Callable[[Any, rn.TransformerConfig], list[str]]) -> Plan | None:
    """The first of the family records `families` that takes `config` once the approximations it lists are applied
    (`why_not(family, config)` empty: `layouts.why_not`); None where none does (call it once no family takes the
    model exactly)."""
    for family in families:
        needed = [a for a in family.approximations if a.changes(config)]
        if not needed:
            continue
        changes = {k: v for a in needed for k, v in a.changes(config).items()}
        try:
            approximated = config.replace(**changes)
        except ValueError:
            continue
        if not why_not(family, approximated):
            return Plan(family, approximated, tuple(needed), tuple(a.says(config) for a in needed),
                        {k: getattr(config, k) for k in changes}, {k: getattr(approximated, k) for k in changes})
    return None


def known(families: Sequence[Any]) -> list[str]:
    """Every approximation name the family records `families` list, sorted."""
    return sorted({a.name for family in families for a in family.approximations})


def named(wanted: Sequence[str], families: Sequence[Any]) -> list[Approximation]:
    """The approximation of each name in `wanted` as the first of the family records `families` lists it (families
    that share a name compute the same function in the same place); a name none lists (a record written by another
    version of this tool) is left out."""
    every = [a for family in families for a in family.approximations]
    return [next(a for a in every if a.name == name) for name in wanted if any(a.name == name for a in every)]


def located(first: str | None, needed: Sequence[Approximation]) -> str | None:
    """Where in sublayer `first` the approximations `needed` act, in words ("its q/k norms"), or None where none of
    them acts there first (or `first` is None: they show nowhere)."""
    if first is None:
        return None
    sites = [a.site for a in needed if first.rpartition(".")[2] in a.shows_in]
    return ", ".join(dict.fromkeys(sites)) or None


# a setting whose None means another field's value (reference_numpy.TransformerConfig): what a record's None says
INHERITS = {"qk_norm_eps": "layer_norm_eps", "head_layer_norm_eps": "layer_norm_eps", "head_activation": "activation"}


def settings_text(settings: Mapping[str, Any], config: rn.TransformerConfig) -> str:
    """`activation='gelu'`; a None that means another field's value says which and what it is among `settings`,
    else on `config`: `qk_norm_eps=None (= layer_norm_eps, 1e-06)`."""
    def one(k: str, v: Any) -> str:
        if v is None and k in INHERITS:
            other = INHERITS[k]
            return f"{k}=None (= {other}, {settings[other] if other in settings else getattr(config, other)!r})"
        return f"{k}={v!r}"

    return ", ".join(one(k, v) for k, v in settings.items())


@dataclass
class Record:
    """What an output written with accepted approximations says about them (its JSON: `to_json`)."""

    names: list[str]
    says: list[str]  # each one in words, as the refusal said it
    source_settings: dict[str, Any]  # canonical fields as the source computed them: restored on the way back
    target_settings: dict[str, Any]  # as the target computes them (what reading the output gives)
    gap: dict[str, Any] = field(default_factory=dict)  # `verify.approximation.Gap.to_json()`, measured at conversion

    def to_json(self) -> dict[str, Any]:
        return {"accepted_approximations": self.names, "approximations": self.says,
                "source_settings": self.source_settings, "target_settings": self.target_settings, "gap": self.gap}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Record":
        """The record, checked: every setting a canonical config field, the two sides naming the same fields."""
        fields = set(rn.TransformerConfig.__dataclass_fields__)
        try:
            names, says = list(data["accepted_approximations"]), list(data["approximations"])
            source, target, gap = dict(data["source_settings"]), dict(data["target_settings"]), dict(data["gap"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: its {RECORD_KEY} record of accepted approximations is malformed") from None
        if not all(isinstance(n, str) for n in names + says) or set(source) != set(target) or not set(source) <= fields:
            raise ValueError(f"{where}: its {RECORD_KEY} record of accepted approximations is malformed (names "
                             f"{names!r}, settings {sorted(source)} and {sorted(target)})")
        kinds = {"max_abs": (int, float), "largest": (int, float), "top1_changed": (int, type(None)),
                 "positions": (int,), "phrase": (str,), "first_sublayer": (str, type(None)), "site": (str, type(None))}
        wrong = [k for k, types in kinds.items() if k in gap and (not isinstance(gap[k], types) or
                                                                  isinstance(gap[k], bool))]
        if wrong:  # verify prints these beside what it measures
            raise ValueError(f"{where}: its {RECORD_KEY} record's measured gap is malformed: {wrong[0]}="
                             f"{gap[wrong[0]]!r}")
        return cls(names, says, source, target, gap)

    def holds(self, config: rn.TransformerConfig, side: str) -> bool:
        """Whether `config` computes this record's `side` ("source" or "target") at every recorded field."""
        settings = self.source_settings if side == "source" else self.target_settings
        return all(getattr(config, k) == v for k, v in settings.items())

    def restore(self, config: rn.TransformerConfig) -> rn.TransformerConfig | None:
        """The source's config from the target's (`config` as read back), or None where `config` no longer
        computes what the record says the target does (the output was changed since)."""
        if not self.holds(config, "target"):
            return None
        return config.replace(**self.source_settings)

    def note(self, config: rn.TransformerConfig) -> str:
        """How reading an output with this record (`config` as read) says so."""
        settings = settings_text(self.source_settings, config)
        gap = self.gap.get("phrase")
        return (f"records the accepted approximation(s) {'; '.join(self.says)}; read as what the target computes"
                + (f"; when it was written, {gap}" if gap else "") + f"; a Hugging Face export restores {settings}")


def record_of(metadata: Mapping[str, Any], where: str) -> Record | None:
    """The `Record` in a preset's metadata.json contents, or None where it has none."""
    ours = metadata.get(RECORD_KEY)
    if ours is None:
        return None
    if not isinstance(ours, dict):
        raise ValueError(f"{where}: its {RECORD_KEY} entry is not an object")
    return Record.from_json(ours, where) if "accepted_approximations" in ours else None


def fixed_head_norm_eps(task: str, eps: float) -> Approximation:
    """`head_norm_eps`: a masked-LM head (KerasHub's `MaskedLMHead`) normalized at a fixed `eps`, whatever the
    model's; `task` names the class that does so."""
    def effective(c: rn.TransformerConfig) -> float:
        return c.layer_norm_eps if c.head_layer_norm_eps is None else c.head_layer_norm_eps

    return Approximation("head_norm_eps", f"KerasHub's {task} normalizes its masked-LM head at epsilon {eps:g}",
                         lambda c: {"head_layer_norm_eps": eps} if c.head_transform and effective(c) != eps else {},
                         lambda c: f"the source at {effective(c):g}", "its norm", ("head",))
