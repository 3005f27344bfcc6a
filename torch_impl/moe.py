"""A mixture-of-experts feed-forward in PyTorch, as `reference_numpy.model.MixtureOfExperts` and `reference_numpy.moe`
compute it: the router picks each token's experts with `torch.topk` (transformers' routers do the same, so ties at
the k-th place fall as theirs do on the same device), and the tokens are gathered by expert, each expert running
once on the tokens that chose it."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from reference_numpy import TransformerConfig

Record = dict  # canonical sublayer name -> tensor, in execution order


def route(logits: torch.Tensor, config: TransformerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Router scores `(N, num_experts)` -> `(ids, weights)`, each `(N, k)` (`router_softmax`, `router_renormalize`;
    the softmax in float32 at least, as transformers' routers compute it)."""
    k = config.experts_per_token
    work = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    if config.router_softmax == "after_topk":
        top, ids = torch.topk(work, k, dim=-1)
        weights = torch.softmax(top, dim=-1)
    else:
        weights, ids = torch.topk(torch.softmax(work, dim=-1), k, dim=-1)
        if config.router_renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights.to(logits.dtype)


def dispatch(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: nn.ModuleList) -> torch.Tensor:
    """Tokens `(N, D)` through their experts, gathered by expert: one sort of the (token, slot) choices by expert,
    then each expert once on its tokens, its outputs times their weights added to those rows, expert after expert."""
    k = ids.shape[-1]
    order = torch.argsort(ids.flatten(), stable=True)  # (N*k,): the choices, grouped by expert
    token = order // k
    weight = weights.flatten()[order]
    counts = torch.bincount(ids.flatten(), minlength=len(experts)).tolist()  # one read back to the host
    out = torch.zeros_like(x)
    start = 0
    for e, n in enumerate(counts):
        if n:
            rows = token[start:start + n]
            y = experts[e](x[rows]) * weight[start:start + n, None]  # autocast: bfloat16, added in x's dtype
            out.index_add_(0, rows, y.to(out.dtype))
            start += n
    return out


class MixtureOfExperts(nn.Module):
    """The router `(num_experts, d_model)` (with a bias under `router_bias`), the experts (`feed_forward(config, name, width)`, the model's
    FeedForward, of `expert_d_ff`) and the sigmoid-gated shared expert where `shared_expert_d_ff` says. `forward(x,
    record)` records the experts each token chose as `{name}.routing`: ascending, `(B, T, k)`, in x's dtype."""

    def __init__(self, config: TransformerConfig, name: str, feed_forward: Callable[..., nn.Module]):
        super().__init__()
        self.config, self.name = config, name
        d = config.d_model
        self.router = nn.Linear(d, config.num_experts, bias=config.router_bias)
        self.experts = nn.ModuleList(feed_forward(config, f"{name}.experts.{e}", config.expert_width)
                                     for e in range(config.num_experts))
        shared = config.shared_expert_d_ff
        self.shared = feed_forward(config, f"{name}.shared", shared) if shared else None
        self.shared_gate = nn.Linear(d, 1, bias=False) if shared else None

    def forward(self, x, record: Record | None = None):
        flat = x.reshape(-1, x.shape[-1])  # (B, T, D) -> (N, D)
        ids, weights = route(self.router(flat), self.config)  # (N, k) each
        out = dispatch(flat, ids, weights, self.experts)
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(flat)) * self.shared(flat)
        if record is not None:
            record[f"{self.name}.routing"] = ids.sort(dim=-1).values.reshape(*x.shape[:-1], -1).to(x.dtype)
        return out.reshape(x.shape)
