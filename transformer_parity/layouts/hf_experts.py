"""The mixture-of-experts fields of the Hugging Face families that have them, both ways: how many experts and how
many per token, their width, the shared expert, which layers have experts, how the router weighs the chosen ones.
Each such family states its config.json keys and what its library computes in an `ExpertKeys` (Mixtral: every layer,
`num_local_experts`, always renormalized; Qwen2-MoE and Qwen3-MoE: `num_experts`, `moe_intermediate_size`,
`norm_topk_prob`, `decoder_sparse_step` and `mlp_only_layers`, and Qwen2-MoE's sigmoid-gated shared expert); this
module reads them into the canonical fields (`TransformerConfig.num_experts`, ...), refuses what is not computed
here, and writes them back. The keys that only train (`router_aux_loss_coef`, `output_router_logits`, and
`router_jitter_noise`, which scales the inputs in training only) are accepted and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping

import reference_numpy as rn

from .hf import boolean, integer, number

@dataclass(frozen=True)
class ExpertKeys:
    """Where one family's config.json keeps its mixture of experts, and what its library computes."""

    experts: tuple[str, ...]  # the key of the number of experts, then the other names transformers reads it under
    width: str | None  # the key of each expert's inner width; None: intermediate_size (every layer has experts)
    renormalize: str | None  # the key of `router_renormalize`; None: always renormalized
    shared: str | None  # the key of the shared expert's width (a sigmoid-gated one); None: the family has none
    sparse_layers: bool  # decoder_sparse_step and mlp_only_layers say which layers have experts (the others: dense)


def read(hf: Mapping[str, Any], keys: Collection[str], config: rn.TransformerConfig, spec: ExpertKeys
         ) -> rn.TransformerConfig:
    """`config` (the family's dense reading of config.json) with its mixture of experts."""
    boolean(hf, "output_router_logits", False)  # the keys that only train: checked, computing nothing
    number(hf, "router_aux_loss_coef", 0.0)
    if number(hf, "router_jitter_noise", 0.0) < 0:
        raise ValueError(f"config.json router_jitter_noise must be >= 0, received {hf['router_jitter_noise']!r}")
    found = {key: integer(hf, key) for key in spec.experts if hf.get(key) is not None}
    if not found:
        raise ValueError(f"config.json has no {spec.experts[0]}; it is needed to build the model")
    if len(set(found.values())) > 1:
        raise ValueError(f"config.json {' and '.join(f'{k}={v}' for k, v in found.items())} disagree")
    experts = next(iter(found.values()))
    if config.num_decoder_layers > len(keys):  # before a list of its layers exists
        raise ValueError(f"config.json num_hidden_layers={config.num_decoder_layers} cannot match a file of "
                         f"{len(keys)} tensors; refusing before allocating anything")
    layers = _expert_layers(hf, config.num_decoder_layers, experts) if spec.sparse_layers else None
    if experts == 0:
        raise ValueError(f"config.json {next(iter(found))}=0: no layer has experts (a dense model of this kind is not "
                         "read here)")
    if experts * (layers or [True]).count(True) > len(keys):  # before a parameter list of the config's size exists
        raise ValueError(f"config.json {next(iter(found))}={experts} cannot match a file of {len(keys)} tensors "
                         "(every expert has several); refusing before allocating anything")
    per_token = integer(hf, "num_experts_per_tok")
    if not 1 <= per_token <= experts:
        raise ValueError(f"config.json num_experts_per_tok={per_token} must be from 1 to the {experts} experts")
    return config.replace(
        num_experts=experts, experts_per_token=per_token,
        expert_d_ff=integer(hf, spec.width) if spec.width else None,
        router_renormalize=boolean(hf, spec.renormalize, False) if spec.renormalize else True,
        shared_expert_d_ff=integer(hf, spec.shared) if spec.shared else None,
        expert_layers=layers)


def _expert_layers(hf: Mapping[str, Any], depth: int, experts: int) -> list[bool] | None:
    """transformers' rule: layer i has experts when it is not in `mlp_only_layers` and (i + 1) is a multiple of
    `decoder_sparse_step` (None: every layer)."""
    step = integer(hf, "decoder_sparse_step", 1)
    dense = hf.get("mlp_only_layers") or []
    if step < 1:
        raise ValueError(f"config.json decoder_sparse_step must be >= 1, received {step!r}")
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < depth
                                              for i in dense):
        raise ValueError(f"config.json mlp_only_layers must list layer indices below num_hidden_layers={depth}, "
                         f"received {dense!r}")
    flags = [i not in dense and (i + 1) % step == 0 for i in range(depth)]
    if experts and not any(flags):
        raise ValueError(f"config.json decoder_sparse_step={step} and mlp_only_layers={dense} leave no layer with "
                         "experts (a dense model of this kind is not read here)")
    return None if all(flags) else flags


def router_problems(config: rn.TransformerConfig, spec, name: str, width_key: str) -> list[str]:
    """Why `config`'s router and experts have no equivalent in a family whose keys `spec` describes (this module's
    `ExpertKeys` or KerasHub's, `kerashub_experts`: its `renormalize`, `width` and `shared` keys, None where the
    family has none), called `name`, its experts' width read from `width_key`: empty if they have one."""
    if config.num_experts == 0:
        return [f"num_experts=0 ({name} has a mixture of experts in its feed-forward)"]
    out = []
    if config.router_softmax != "before_topk":
        out.append(f"router_softmax={config.router_softmax!r} ({name}'s router takes the softmax before the top-k)")
    if spec.renormalize is None and not config.router_renormalize:
        out.append(f"router_renormalize=False ({name} always divides the chosen weights by their sum)")
    if spec.width is None and config.expert_d_ff is not None:
        out.append(f"expert_d_ff={config.expert_d_ff} ({name}'s experts are {width_key}={config.d_ff} wide)")
    if spec.shared is None and config.shared_expert_d_ff is not None:
        out.append(f"shared_expert_d_ff={config.shared_expert_d_ff} ({name} has no shared expert)")
    if spec.shared is not None and config.shared_expert_d_ff is None:
        out.append(f"shared_expert_d_ff=None ({name} always has a shared expert)")
    return out


def problems(config: rn.TransformerConfig, spec: ExpertKeys, name: str) -> list[str]:
    """Why `config`'s mixture of experts has no equivalent in the family (`spec`, called `name`): empty if it has."""
    out = router_problems(config, spec, name, "intermediate_size")
    if config.num_experts and not spec.sparse_layers and config.expert_layers is not None:
        out.append(f"expert_layers={list(config.expert_layers)} ({name} has experts in every layer)")
    return out


def write(config: rn.TransformerConfig, spec: ExpertKeys) -> dict[str, Any]:
    """The config.json keys of `config`'s mixture of experts (one `problems` accepts)."""
    hf: dict[str, Any] = {spec.experts[0]: config.num_experts, "num_experts_per_tok": config.experts_per_token,
                          "output_router_logits": False}
    if spec.width:
        hf[spec.width] = config.expert_width
    if spec.renormalize:
        hf[spec.renormalize] = config.router_renormalize
    if spec.shared:
        hf[spec.shared] = config.shared_expert_d_ff
    if spec.sparse_layers:
        flags = config.expert_layers or [True] * config.num_decoder_layers
        hf.update(decoder_sparse_step=1, mlp_only_layers=[i for i, f in enumerate(flags) if not f])
    return hf
