"""The mixture-of-experts side of the KerasHub families that have one, both ways: their config.json keys, and the
experts' weights, which keras_hub keeps fused.

KerasHub's expert banks hold every expert of a layer in one array (`(experts, hidden, width)` for the gate and up
projections, `(experts, width, hidden)` for the down projection), some with the gate and up projections side by side
in one `(experts, hidden, 2 * width)` array, the gate first. The canonical weights have one kernel per expert
(`decoder.layers.{i}.ffn.experts.{e}.gate.kernel`, ...). A family states its banks as `Bank`s (the array's path and
the canonical kernels its column blocks hold); `to_canonical_state` splits each array into per-expert entries under
names of its own (`<path>/expert_{e}/<part>`, seen by the family's table only), `from_canonical_state` stacks them
back. Each family states its config.json keys and what keras_hub computes in an `ExpertKeys`; `read` turns them into
the canonical fields (`num_experts`, `experts_per_token`, `expert_d_ff`, `router_renormalize`, `shared_expert_d_ff`,
`expert_layers`), `problems` says why a config has none of them here, `write` writes them back. The keys that only
train (an auxiliary loss's coefficient, router jitter, returning the router logits) are accepted and change nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

import reference_numpy as rn

from transformer_parity.streaming import lazy

from .hf_experts import router_problems

LAYER_RULES = ("every_layer", "by_index", "as_layer_0")


@dataclass(frozen=True)
class ExpertKeys:
    """Where one KerasHub family's config.json keeps its mixture of experts, and what keras_hub computes."""

    width: str | None  # the key of each expert's width; None: intermediate_dim
    renormalize: str | None  # the key of `router_renormalize`; None: always renormalized
    shared: str | None  # the key of the sigmoid-gated shared expert's width; None: the family has none
    # which layers have experts: every_layer; by_index (layer i unless in mlp_only_layers, and (i + 1) a multiple of
    # decoder_sparse_step); as_layer_0 (the by_index rule applied to index 0 for every layer: all or none)
    layer_rule: str
    training: tuple[str, ...]  # the keys that only train: accepted, computing nothing
    backbone: str  # the backbone class, for messages


@dataclass(frozen=True)
class Bank:
    """One fused expert array: its external path (with `{i}`) and the canonical kernel (with `{i}` and `{e}`) of
    each of its equal column blocks along the last axis, in order."""

    path: str
    parts: tuple[str, ...]

    def virtual(self, part: int) -> str:
        """The per-expert entry's external name for the part `part` (with `{i}` and `{e}`)."""
        return f"{self.path}/expert_{{e}}/{part}"


def read(backbone: Mapping[str, Any], config: rn.TransformerConfig, spec: ExpertKeys) -> tuple[rn.TransformerConfig,
                                                                                               list[str]]:
    """`(config with its mixture of experts, notes)` from the backbone's config.json (`config`: the dense reading)."""
    from .hf import boolean, integer, number

    for key in spec.training:  # checked, computing nothing
        if isinstance(backbone.get(key), bool):
            boolean(backbone, key, False)
        elif backbone.get(key) is not None:
            number(backbone, key, 0.0)
    experts, per_token = integer(backbone, "num_experts"), integer(backbone, "top_k")
    if experts == 0:
        raise ValueError(f"config.json num_experts=0: no layer has experts (a dense model is not read as "
                         f"{spec.backbone})")
    if not 1 <= per_token <= experts:
        raise ValueError(f"config.json top_k={per_token} must be from 1 to the {experts} experts")
    layers, notes = _expert_layers(backbone, config.num_decoder_layers, spec)
    return config.replace(
        num_experts=experts, experts_per_token=per_token,
        expert_d_ff=integer(backbone, spec.width) if spec.width else None,
        router_renormalize=boolean(backbone, spec.renormalize, False) if spec.renormalize else True,
        shared_expert_d_ff=integer(backbone, spec.shared) if spec.shared else None,
        expert_layers=layers), notes


def _expert_layers(backbone: Mapping[str, Any], depth: int, spec: ExpertKeys) -> tuple[list[bool] | None, list[str]]:
    """keras_hub's choice of the layers with experts (None: every layer), and a note where it is not transformers'."""
    from .hf import integer

    if spec.layer_rule == "every_layer":
        return None, []
    step = integer(backbone, "decoder_sparse_step", 1)
    dense = backbone.get("mlp_only_layers") or []
    if step < 1:
        raise ValueError(f"config.json decoder_sparse_step must be >= 1, received {step!r}")
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < depth
                                              for i in dense):
        raise ValueError(f"config.json mlp_only_layers must list layer indices below num_layers={depth}, received "
                         f"{dense!r}")
    if spec.layer_rule == "as_layer_0":
        if 0 in dense or step != 1:
            raise ValueError(f"config.json decoder_sparse_step={step}, mlp_only_layers={dense}: keras-hub 0.32's "
                             f"{spec.backbone} builds every layer as its layer 0 (it never passes layer_index), so "
                             "no layer has experts (a dense model is not read as this family)")
        note = [f"mlp_only_layers={dense} changes nothing in keras_hub: {spec.backbone} builds every layer as its "
                "layer 0 (it never passes layer_index), so every layer has experts"] if dense else []
        return None, note
    flags = [i not in dense and (i + 1) % step == 0 for i in range(depth)]
    if not any(flags):
        raise ValueError(f"config.json decoder_sparse_step={step} and mlp_only_layers={dense} leave no layer with "
                         "experts (a dense model is not read as this family)")
    return (None if all(flags) else flags), []


def problems(config: rn.TransformerConfig, spec: ExpertKeys) -> list[str]:
    """Why `config`'s mixture of experts has no equivalent in the family (`spec`): empty if it has."""
    name = f"KerasHub {spec.backbone}"
    out = router_problems(config, spec, name, "intermediate_dim")
    if config.num_experts and spec.layer_rule != "by_index" and config.expert_layers is not None:
        why = "has experts in every layer" if spec.layer_rule == "every_layer" else \
            "builds every layer as its layer 0 (keras-hub 0.32 never passes layer_index): experts in all or none"
        out.append(f"expert_layers={list(config.expert_layers)} ({name} {why})")
    return out


def write(config: rn.TransformerConfig, spec: ExpertKeys) -> dict[str, Any]:
    """The config.json keys of `config`'s mixture of experts (one `problems` accepts)."""
    out: dict[str, Any] = {"num_experts": config.num_experts, "top_k": config.experts_per_token}
    if spec.width:
        out[spec.width] = config.expert_width
    if spec.renormalize:
        out[spec.renormalize] = config.router_renormalize
    if spec.shared:
        out[spec.shared] = config.shared_expert_d_ff
    if spec.layer_rule != "every_layer":
        flags = config.expert_layers or [True] * config.num_decoder_layers
        out.update(decoder_sparse_step=1, mlp_only_layers=[i for i, f in enumerate(flags) if not f])
    return out


# --- the fused expert arrays <-> one kernel per expert ---------------------------------------------------------------

def bank_table(banks: tuple[Bank, ...]) -> list[tuple[str, str, str]]:
    """The table entries of the per-expert parts `to_canonical_state` makes."""
    return [(canonical, bank.virtual(p), "identity") for bank in banks for p, canonical in enumerate(bank.parts)]


def _pattern(path: str) -> re.Pattern:
    return re.compile(re.escape(path).replace(re.escape("{i}"), "(0|[1-9][0-9]*)") + "$")


def to_canonical_state(banks: tuple[Bank, ...]):
    """The family's `to_canonical_state`: each bank split, in place, into its per-expert parts."""

    def split(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
        for bank in banks:
            pattern = _pattern(bank.path)
            for key in [k for k in state if pattern.match(k)]:
                array = state.pop(key)  # read lazily: an expert's rows at a time (`lazy.leading_rows`)
                parts = len(bank.parts)
                if len(array.shape) != 3 or array.shape[0] != config.num_experts or array.shape[2] % parts:
                    raise ValueError(f"{key} {tuple(array.shape)} is not a bank of num_experts={config.num_experts} "
                                     f"experts (experts, in, {'out' if parts == 1 else f'{parts} x out'})")
                layer = pattern.match(key)[1]
                width = array.shape[2] // parts
                for e in range(array.shape[0]):
                    rows = lazy.leading_rows(array, e, e + 1)
                    for p in range(parts):
                        name = bank.virtual(p).replace("{i}", layer).replace("{e}", str(e))
                        state[name] = _columns(rows, p * width, (p + 1) * width)  # (in, out)

    return split


def from_canonical_state(banks: tuple[Bank, ...]):
    """The family's `from_canonical_state`: the per-expert parts stacked back, in place, into each bank."""

    def stack(config: rn.TransformerConfig, state: dict[str, Any]) -> None:
        for i in range(config.num_decoder_layers):
            if not config.layer_experts(i):
                continue
            for bank in banks:
                names = [[bank.virtual(p).replace("{i}", str(i)).replace("{e}", str(e)) for p in range(len(bank.parts))]
                         for e in range(config.num_experts)]
                parts = [[state.pop(n) for n in row] for row in names]
                state[bank.path.replace("{i}", str(i))] = _stacked(parts)  # (experts, in, parts * out)

    return stack


def _columns(rows: Any, start: int, stop: int) -> Any:
    """Columns `start:stop` of the one expert `rows` holds, `(1, in, out)` -> `(in, stop - start)`; lazy if it is."""
    def compute():
        return np.ascontiguousarray(np.asarray(rows)[0, :, start:stop])

    return lazy.LazyArray((rows.shape[1], stop - start), rows.dtype, compute) if lazy.is_lazy(rows) else compute()


def _stacked(parts: list[list[Any]]) -> Any:
    """Each expert's parts joined on their last axis, the experts stacked: `(experts, in, parts * out)`; a
    `LazyArray` made when it is written where the parts are lazy, so that a conversion holds one bank at a time."""
    def compute():
        return np.stack([np.concatenate([np.asarray(part) for part in row], axis=-1) for row in parts])

    if not any(lazy.is_lazy(part) for row in parts for part in row):
        return compute()
    first = parts[0][0]
    shape = (len(parts), first.shape[0], sum(part.shape[1] for part in parts[0]))
    return lazy.LazyArray(shape, first.dtype, compute)


# --- a KerasHub family with experts: its record's hooks ------------------------------------------------------------

def functions(dense: Mapping[str, Any], experts: ExpertKeys, banks: tuple[Bank, ...], keys: tuple[str, ...]
              ) -> dict[str, Any]:
    """The hooks of a family whose feed-forward is a mixture of experts (`experts`, its fused arrays `banks`), by
    their `KerasHubFamily` field names: its dense reading's hooks (`dense`, the same names) with the experts added;
    `keys`: every config.json key its backbone's `get_config()` writes (any other is refused)."""

    def table(config):
        return dense["table"](config) + bank_table(banks)

    def config_from_kerashub(backbone, task):
        unknown = sorted(set(backbone) - set(keys) - {"name", "trainable", "dtype"})
        if unknown:
            raise ValueError(f"config.json key(s) {', '.join(unknown)} are not supported (not in keras-hub 0.32's "
                             f"{experts.backbone}: what they change is not known here)")
        config, notes = dense["config_from_kerashub"](backbone, task)
        config, more = read(backbone, config, experts)
        return config, notes + more

    def export_problems(config):
        return dense["export_problems"](config) + problems(config, experts)

    def config_to_kerashub(config):
        backbone, task = dense["config_to_kerashub"](config)
        return {**backbone, **write(config, experts)}, task

    return {**dense, "table": table, "config_from_kerashub": config_from_kerashub, "export_problems": export_problems,
            "config_to_kerashub": config_to_kerashub, "to_canonical_state": to_canonical_state(banks),
            "from_canonical_state": from_canonical_state(banks)}
