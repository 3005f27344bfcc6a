"""A mixture of experts' routing and dispatch as pure NumPy functions (`model.MixtureOfExperts` holds the weights).

The router scores every expert for every token, `x @ router.kernel`; each token runs through its `experts_per_token`
best experts, whose outputs are summed, weighted by the router (Shazeer et al. 2017; Mixtral, Qwen-MoE):

- `router_softmax="before_topk"` (Mixtral, Qwen): probabilities over every expert, then the k largest; with
  `router_renormalize` (Mixtral, Qwen's `norm_topk_prob`) the k chosen are divided by their sum;
- `router_softmax="after_topk"`: the k largest scores, then a softmax over those k.

Which experts a token chooses is what a port must get exactly right: `route` picks them as `torch.topk` does on the
CPU (transformers' routers), ties included. Scores that are exactly equal at the k-th place (a router column
repeated, or all-zero hidden states, which score every expert alike) leave the choice to torch's selection
algorithm: libstdc++'s `std::nth_element` (introselect), or, for `k * 64 <= num_experts`, a heap of k. `top_k`
replays those algorithms for such rows (`_torch_cpu_top_k`); every other row is a plain sort. The chosen experts of
every token are recorded as the sublayer `{ffn}.routing` (`routing_record`).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from . import ops


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)): the shared expert's gate."""
    with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0 gives 0, as it should
        return x.dtype.type(1.0) / (x.dtype.type(1.0) + np.exp(-x))


def route(logits: np.ndarray, config) -> tuple[np.ndarray, np.ndarray]:
    """Router scores `(N, num_experts)` -> `(ids, weights)`, each `(N, k)`: the experts each token runs through (in
    the order `torch.topk` returns them) and the weight of each one's output (`router_softmax`,
    `router_renormalize`)."""
    k = config.experts_per_token
    if config.router_softmax == "after_topk":
        ids = top_k(logits, k)
        return ids, ops.softmax(np.take_along_axis(logits, ids, axis=-1))
    probs = ops.softmax(logits)  # (N, E)
    ids = top_k(probs, k)
    weights = np.take_along_axis(probs, ids, axis=-1)  # (N, k)
    if config.router_renormalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return ids, weights


def dispatch(x: np.ndarray, ids: np.ndarray, weights: np.ndarray,
             experts: Sequence[Callable[[np.ndarray], np.ndarray]]) -> np.ndarray:
    """Tokens `(N, D)` through their experts, gathered by expert: expert e runs once on the tokens that chose it,
    its outputs times their weights added to those tokens' rows, expert after expert (transformers' order)."""
    out = np.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = np.nonzero(ids == e)  # a token chooses an expert at most once
        if token.size:
            out[token] += expert(x[token]) * weights[token, slot][:, None]
    return out


def routing_record(ids: np.ndarray, shape: tuple[int, ...], dtype) -> np.ndarray:
    """The `routing` sublayer: each token's chosen experts in ascending order, `(B, T, k)`, as `dtype` numbers (exact
    integers, so that the one comparison rule of every sublayer holds them: another expert is at least 1 away)."""
    return np.sort(ids, axis=-1).reshape(*shape, ids.shape[-1]).astype(dtype)


# --- top-k as torch.topk picks it on the CPU ------------------------------------------------------------------------

def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The `k` highest of each row of `scores` `(N, E)`, highest first, `(N, k)` int64: the experts `torch.topk`
    picks on the CPU. A row whose k-th and (k+1)-th highest scores are equal is replayed through torch's algorithm
    (`_torch_cpu_top_k`), since which of the equal ones it keeps depends on it; the other rows are a stable sort."""
    order = np.argsort(-scores, axis=-1, kind="stable")
    ids = order[:, :k].astype(np.int64)
    if k < scores.shape[-1]:
        ranked = np.take_along_axis(scores, order[:, k - 1:k + 1], axis=-1)  # (N, 2): the k-th and (k+1)-th
        for row in np.flatnonzero(ranked[:, 0] == ranked[:, 1]):
            ids[row] = _torch_cpu_top_k(scores[row].tolist(), k)
    return ids


def tied_top_k(num_experts: int, k: int) -> np.ndarray:
    """The `k` experts `torch.topk` picks on the CPU from `num_experts` equal scores `(k,)`: what a twin whose own
    top-k breaks ties otherwise (Keras's takes the lowest ids) uses for a row of equal scores."""
    return np.asarray(_torch_cpu_top_k([0.0] * num_experts, k), dtype=np.int64)


def _before(a: tuple[float, int], b: tuple[float, int]) -> bool:
    """torch's topk order (largest first, NaN before any number), on (score, expert) pairs."""
    return (a[0] != a[0] and b[0] == b[0]) or a[0] > b[0]


def _torch_cpu_top_k(row: list[float], k: int) -> list[int]:
    """The experts `torch.topk(row, k)` returns on the CPU (ATen's `topk_impl_loop`, in its order): for
    `k * 64 <= len(row)` a heap of the first k, each later score that ranks before the heap's last entering it;
    otherwise `std::nth_element(.., k - 1, ..)` (libstdc++'s introselect) and a sort of the k - 1 before it."""
    q = list(zip(row, range(len(row))))
    if k * 64 <= len(q):
        heap = q[:k]
        _make_heap(heap, 0, k)
        for item in q[k:]:
            if _before(item, heap[0]):
                heap[0], heap[k - 1] = heap[k - 1], heap[0]  # std::pop_heap: the root to the back, then sifted
                _adjust_heap(heap, 0, 0, k - 1, heap[0])
                heap[k - 1] = item
                _push_heap(heap, 0, k - 1, 0, item)  # std::push_heap
        return [i for _, i in sorted(heap, key=lambda p: (-p[0], p[1]))]  # the order within k does not matter
    _introselect(q, 0, k - 1, len(q), 2 * int(math.log2(len(q))))
    return [i for _, i in q[:k]]


def _introselect(q: list, first: int, nth: int, last: int, depth: int) -> None:
    while last - first > 3:
        if depth == 0:
            _heap_select(q, first, nth + 1, last)
            q[first], q[nth] = q[nth], q[first]
            return
        depth -= 1
        mid = first + (last - first) // 2
        _move_median_to_first(q, first, first + 1, mid, last - 1)
        cut = _unguarded_partition(q, first + 1, last, first)
        if cut <= nth:
            first = cut
        else:
            last = cut
    _insertion_sort(q, first, last)


def _move_median_to_first(q: list, result: int, a: int, b: int, c: int) -> None:
    if _before(q[a], q[b]):
        pick = b if _before(q[b], q[c]) else c if _before(q[a], q[c]) else a
    else:
        pick = a if _before(q[a], q[c]) else c if _before(q[b], q[c]) else b
    q[result], q[pick] = q[pick], q[result]


def _unguarded_partition(q: list, first: int, last: int, pivot: int) -> int:
    while True:
        while _before(q[first], q[pivot]):
            first += 1
        last -= 1
        while _before(q[pivot], q[last]):
            last -= 1
        if not first < last:
            return first
        q[first], q[last] = q[last], q[first]
        first += 1


def _insertion_sort(q: list, first: int, last: int) -> None:
    for i in range(first + 1, last):
        value = q[i]
        if _before(value, q[first]):
            q[first + 1:i + 1] = q[first:i]
            q[first] = value
        else:
            j = i
            while _before(value, q[j - 1]):
                q[j] = q[j - 1]
                j -= 1
            q[j] = value


def _heap_select(q: list, first: int, middle: int, last: int) -> None:
    _make_heap(q, first, middle)
    for i in range(middle, last):
        if _before(q[i], q[first]):
            value, q[i] = q[i], q[first]  # std::__pop_heap(first, middle, i)
            _adjust_heap(q, first, 0, middle - first, value)


def _make_heap(q: list, first: int, last: int) -> None:
    n = last - first
    if n < 2:
        return
    for parent in range((n - 2) // 2, -1, -1):
        _adjust_heap(q, first, parent, n, q[first + parent])


def _adjust_heap(q: list, first: int, hole: int, n: int, value) -> None:
    top = child = hole
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if _before(q[first + child], q[first + child - 1]):
            child -= 1
        q[first + hole] = q[first + child]
        hole = child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        q[first + hole] = q[first + child - 1]
        hole = child - 1
    _push_heap(q, first, hole, top, value)


def _push_heap(q: list, first: int, hole: int, top: int, value) -> None:
    parent = (hole - 1) // 2
    while hole > top and _before(q[first + parent], value):
        q[first + hole] = q[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    q[first + hole] = value
