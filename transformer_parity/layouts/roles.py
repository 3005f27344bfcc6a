"""Roles settled by what the source does, whatever the names (`layout --scaffold --source`).

Names are hints. A source that runs PyTorch modules is called once under a global forward hook (Keras layers under
a patched `Layer.__call__`): every module that owns parameters is recorded in call order with the identity of its
input and output tensors, and its parameters are matched to checkpoint keys by value. From that trace, per layer of
each stack:

- the projections of an attention are the linears that run until their widths add up to q, k and v (one fused
  array, k and v fused, or three), and the next linear back to the model width is its output projection;
- an attention whose projections all read one tensor is a self-attention; one whose projections read two tensors is
  a cross-attention, its query the projection that reads the other one (the decoder's state, not the memory);
- the norms are norm1, norm2 (, norm3) in call order, pre- and post-LN alike (which one it is, probing settles);
- the feed-forward linears are the rest: into the inner width and back (two into it: a gated block);
- outside the layers: token embeddings are the lookups of the input ids, position tables the other lookups, a norm
  after a stack's last layer is its final norm, and a linear after everything is the output projection.

What the trace leaves open, the order of q, k and v among projections that read the same tensor (and k and v in a
cross-attention, gate and linear1 in a gated block), becomes candidate mappings that `verify.probe.settle` runs
against the source: at most 6 x 2 x 2 = 24 of them, the call order (q, k, v as called) first. Every layer of a
stack must be laid out as its first layer is (one block class per stack), which the trace checks.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from . import user


@dataclass
class Trace:
    """What the source did: its module calls in order, and for each softmax it ran, the checkpoint tensors (by the
    module calls whose outputs it descends from) its input came from: the projections that made the scores."""

    calls: list
    softmax: list[frozenset[str]]


@dataclass
class Call:
    """One call of a module that owns parameters."""

    params: dict[str, str]  # its role ("weight", "bias", "kernel", ...) -> checkpoint key
    shapes: dict[str, tuple[int, ...]]
    inputs: tuple[int, ...]  # identities of its tensor inputs
    output: int
    ids_input: str | None = None  # "src" / "tgt" when its input is the batch's ids, "other" for other integers

    @property
    def weight(self) -> str:
        """The key of its main array: the 2-D weight, or a norm's scale."""
        two_d = [k for r, k in self.params.items() if len(self.shapes[r]) == 2]
        return two_d[0] if two_d else next(k for r, k in self.params.items() if r in ("weight", "gamma", "scale"))

    @property
    def bias(self) -> str | None:
        return next((k for r, k in self.params.items() if r in ("bias", "beta") and k != self.weight), None)

    @property
    def kind(self) -> str:
        shape = self.shapes[next(r for r, k in self.params.items() if k == self.weight)]
        if self.ids_input is not None:
            return "embedding"
        return "linear" if len(shape) == 2 else "norm"


def _digest(array) -> tuple:
    a = np.ascontiguousarray(np.asarray(array, dtype=np.float32))
    return a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).digest()


def trace(source: Callable[[dict], Any], batch: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray],
          torch_style: bool) -> Trace:
    """The calls the source makes on `batch` (see the module docstring); no calls when it runs neither PyTorch
    modules nor Keras layers, or none of them holds a checkpoint tensor. Under PyTorch every operation also carries
    which module outputs its result descends from, so that each softmax names the projections behind its scores."""
    by_value: dict[tuple, list[str]] = {}
    for key, value in state.items():
        if np.issubdtype(np.asarray(value).dtype, np.floating):
            by_value.setdefault(_digest(value), []).append(key)
    raw: list[tuple[dict[str, Any], list, Any]] = []
    keep: list = []  # the tensors seen, alive until the trace is read, so that their identities stay unique
    lineage = _Lineage(keep)
    with _torch_hook(raw, keep, lineage), _keras_hook(raw, keep):
        source({k: v.copy() for k, v in batch.items()})
    calls, used, call_of = [], set(), {}
    for n, (params, inputs, output) in enumerate(raw):
        matched, shapes = {}, {}
        for role, value in params.items():
            keys = [k for k in by_value.get(_digest(value), []) if k not in used] or by_value.get(_digest(value), [])
            if keys:
                matched[role], shapes[role] = keys[0], tuple(np.shape(value))
        if not matched or len(matched) != len(params) or len(matched) > 2:
            continue  # a module holding no checkpoint tensor, or a composite (nn.MultiheadAttention): names tell
        used.update(matched.values())
        ids = None
        for x in inputs:
            if np.issubdtype(np.asarray(x[1]).dtype, np.integer):
                ids = next((side for side in ("src", "tgt") if f"{side}_ids" in batch
                            and np.array_equal(x[1], batch[f"{side}_ids"])), "other")
        calls.append(Call(matched, shapes, tuple(x[0] for x in inputs), output, ids))
        call_of[n] = calls[-1].weight
    softmax = [frozenset(call_of[n] for n in origins if n in call_of) for origins in lineage.softmax]
    del keep
    return Trace(calls, softmax)


class _Lineage:
    """Which recorded module calls (by index) each PyTorch tensor descends from, carried through every operation
    by a `TorchFunctionMode`; the inputs of each softmax are kept in `softmax`."""

    def __init__(self, keep: list):
        self.keep, self.origins, self.softmax = keep, {}, []

    def mode(self):
        import torch
        from torch.overrides import TorchFunctionMode

        lineage = self
        softmaxes = {torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax}

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                found = frozenset().union(*(lineage.origins.get(id(t), frozenset())
                                            for t in _tensors((args, kwargs), torch.Tensor)))
                if func in softmaxes:
                    lineage.softmax.append(found)
                if found:
                    for t in _tensors(out, torch.Tensor):
                        lineage.keep.append(t)
                        lineage.origins[id(t)] = found
                return out

        return Mode()


def _tensors(obj, kind) -> list:
    """The tensors in nested tuples, lists and dicts."""
    if isinstance(obj, kind):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for x in obj for t in _tensors(x, kind)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x, kind)]
    return []


class _torch_hook:
    """Records every PyTorch module call (a module owning parameters) into `raw`, and sets the lineage of its
    output to that call alone."""

    def __init__(self, raw: list, keep: list, lineage: _Lineage):
        self.raw, self.keep, self.lineage, self.handle, self.mode = raw, keep, lineage, None, None

    def __enter__(self):
        try:
            import torch
        except ImportError:
            return self

        def hook(module, args, output):
            params = {n: p.detach().cpu().float().numpy() for n, p in module.named_parameters(recurse=False)}
            if not params:
                return
            out = output if isinstance(output, torch.Tensor) else next(
                (o for o in output if isinstance(o, torch.Tensor)), None) if isinstance(output, (tuple, list)) \
                else None
            inputs = [a for a in args if isinstance(a, torch.Tensor)]
            self.keep.extend(inputs + [out])
            self.lineage.origins[id(out)] = frozenset({len(self.raw)})
            self.raw.append((params, [(id(a), a.detach().cpu().numpy() if not a.is_floating_point() else
                                       np.zeros(0, np.float32)) for a in inputs], id(out)))

        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        self.mode = self.lineage.mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        if self.mode is not None:
            self.mode.__exit__(*exc)
        if self.handle is not None:
            self.handle.remove()


class _keras_hook:
    """Records every Keras layer call (a layer owning variables directly) into `raw`, by patching
    `keras.layers.Layer.__call__` for the duration of the source call."""

    def __init__(self, raw: list, keep: list):
        self.raw, self.keep, self.original = raw, keep, None

    def __enter__(self):
        import sys

        if "keras" not in sys.modules:  # a source that never imported Keras runs no Keras layer
            return self
        import keras

        original = self.original = keras.layers.Layer.__call__
        raw, keep = self.raw, self.keep

        def call(layer, *args, **kwargs):
            out = original(layer, *args, **kwargs)
            own = [v for v in layer._trainable_variables + layer._non_trainable_variables]
            if own:
                params = {v.path.rsplit("/", 1)[-1]: np.asarray(v.numpy(), np.float32) for v in own}
                inputs = [a for a in args if hasattr(a, "shape") and hasattr(a, "dtype")]
                keep.extend(inputs + [out])
                raw.append((params, [(id(a), np.asarray(a) if "int" in str(a.dtype) else np.zeros(0, np.float32))
                                     for a in inputs], id(out)))
            return out

        keras.layers.Layer.__call__ = call
        return self

    def __exit__(self, *exc):
        if self.original is not None:
            import keras

            keras.layers.Layer.__call__ = self.original


# --- roles from the trace ---------------------------------------------------------------------------------------------

def candidates(traced: Trace, state: Mapping[str, np.ndarray], torch_style: bool, guesses: Mapping[str, str]
               ) -> tuple[list[dict[str, str]], str | None]:
    """`(mappings, why none)`: the candidate mappings (external pattern -> "canonical [transform]") the trace
    allows, the call order first; every pattern the trace did not meet keeps its name guess (`guesses`)."""
    calls = traced.calls
    if not calls:
        return [], "the source ran no PyTorch module or Keras layer holding a checkpoint tensor"
    stacks = user.layer_stacks({k: np.shape(v) for k, v in state.items()}, torch_style)
    where = {}  # checkpoint key -> (pattern, layer index)
    for key in state:
        where[key] = user._generalize(key, torch_style, stacks)
    embeddings = [c for c in calls if c.kind == "embedding"]
    token = [c for c in embeddings if c.ids_input in ("src", "tgt")]
    if not token:
        return [], "no lookup of the input ids in the trace (no token embedding)"
    d = token[0].shapes[_role(token[0], token[0].weight)][-1]
    order: list[str] = []  # the layer stacks, in call order
    layer0: dict[str, list[Call]] = {}
    for c in calls:
        pattern, index = where[c.weight]
        if index is None:
            continue
        stack = pattern.split("{i}")[0]
        if stack not in order:
            order.append(stack)
        if index == 0 and all(c.weight != other.weight for other in layer0.get(stack, [])):
            layer0.setdefault(stack, []).append(c)
    if not order or len(order) > 2:
        return [], f"{len(order)} layer stacks in the trace (one or two are understood)"
    names = ["encoder", "decoder"] if len(order) == 2 else None
    kinds = [names] if names else [["encoder"], ["decoder"]]  # one stack: encoder-only or decoder-only, probed
    out, whys = [], []
    for kind in kinds:
        per_stack = []
        for stack, name in zip(order, kind):
            options, why = _layer_roles(layer0[stack], d, torch_style, name, len(kind) == 2 and name == "decoder",
                                        traced.softmax)
            if not options:
                whys.append(f"read as {name} layers, the first of {stack}{{i}} has {why}")
                break
            per_stack.append(options)
        else:
            outside, why = _outside_roles(calls, where, order, kind, torch_style, d)
            if outside is None:
                whys.append(why)
                continue
        if len(per_stack) != len(kind):
            continue
        for combo in itertools.product(*per_stack):
            by_key = dict(outside)
            for roles in combo:
                by_key.update(roles)
            mapping = dict(guesses)
            for key, value in by_key.items():
                mapping[where[key][0]] = value
            out.append(mapping)
    return out, None if out else "; ".join(whys)


def _role(call: Call, key: str) -> str:
    return next(r for r, k in call.params.items() if k == key)


def _linear(call: Call, canonical: str, torch_style: bool, fused: str | None = None) -> dict[str, str]:
    """A linear's entries: its weight as `canonical.kernel` (transposed from torch's `(out, in)`), its bias."""
    if fused:
        transform = {"fused_qkv": "fused_qkv_t" if torch_style else "fused_qkv",
                     "fused_qkv_heads": "fused_qkv_heads_t" if torch_style else "fused_qkv_heads"}[fused]
        out = {call.weight: f"{canonical}.kernel {transform}"}
        if call.bias:
            out[call.bias] = f"{canonical}.bias {transform}"
        return out
    out = {call.weight: f"{canonical}.kernel" + (" transpose" if torch_style else "")}
    if call.bias:
        out[call.bias] = f"{canonical}.bias"
    return out


def _dims(call: Call, torch_style: bool) -> tuple[int, int]:
    """`(in, out)` of a linear."""
    shape = call.shapes[_role(call, call.weight)]
    return (shape[1], shape[0]) if torch_style else (shape[0], shape[1])


def _layer_roles(calls: list[Call], d: int, torch_style: bool, stack: str, cross: bool,
                 softmax: list[frozenset[str]]) -> tuple[list[dict[str, str]], str | None]:
    """The candidate role sets of one layer's calls (`cross`: a decoder layer with cross-attention): key ->
    "canonical [transform]"."""
    prefix = f"{stack}.layers.{{i}}."
    norms = [c for c in calls if c.kind == "norm"]
    linears = [c for c in calls if c.kind == "linear"]
    expected = 3 if cross else 2
    if len(norms) != expected:
        return [], f"{len(norms)} norms (such a layer has {expected})"
    fixed: dict[str, str] = {}
    names = ("norm1", "norm3") if stack == "decoder" and not cross else ("norm1", "norm2", "norm3")  # norm2: cross
    for name, c in zip(names, norms):
        fixed[c.weight] = f"{prefix}{name}.gamma"
        if c.bias:
            fixed[c.bias] = f"{prefix}{name}.beta"
    attentions, pending, ffn = [], [], []
    for c in linears:
        d_in, d_out = _dims(c, torch_style)
        width = sum(_dims(p, torch_style)[1] for p in pending)
        if pending and width == 3 * d and d_out == d:  # q, k and v are in: this one maps the heads back
            attentions.append((pending, c))
            pending = []
        elif d_in == d and d_out in (d, 2 * d, 3 * d) and width + d_out <= 3 * d and not ffn:
            pending.append(c)
        else:
            ffn.append(c)
    if pending:
        return [], f"projections of {sum(_dims(p, torch_style)[1] for p in pending)} columns with no output projection"
    wanted = 2 if cross else 1
    if len(attentions) != wanted:
        return [], f"{len(attentions)} attentions (such a layer has {wanted})"
    if cross and _is_cross(attentions[0][0]) and not _is_cross(attentions[1][0]):
        attentions.reverse()  # the self-attention is the one whose projections read one tensor
    attention_options = []
    for (projections, o), attn in zip(attentions, ("self_attn", "cross_attn")):
        options = []
        for assignment in _qkv_assignments(projections, attn == "cross_attn", torch_style, d, softmax):
            roles = dict(_linear(o, f"{prefix}{attn}.o", torch_style))
            for call, (part, fused) in assignment:
                roles.update(_linear(call, f"{prefix}{attn}.{part}", torch_style, fused))
            options.append(roles)
        attention_options.append(options)
    ffn_options = _ffn_assignments(ffn, d, torch_style, prefix)
    if not ffn_options:
        return [], f"{len(ffn)} feed-forward linears that are not into an inner width and back"
    out = []
    for parts in itertools.product(*attention_options, ffn_options):
        roles = dict(fixed)
        for part in parts:
            roles.update(part)
        out.append(roles)
    return out, None


def _is_cross(projections: list[Call]) -> bool:
    return len({p.inputs[:1] for p in projections}) > 1


def _qkv_assignments(projections: list[Call], cross: bool, torch_style: bool, d: int, softmax: list[frozenset[str]]):
    """Each way of reading the projections as q, k and v: `[(call, (part, fused transform or None))]`. Of three
    separate projections, the two behind a softmax's scores are q and k, the third v (where the trace saw it)."""
    widths = [_dims(p, torch_style)[1] for p in projections]
    if widths == [3 * d]:  # one fused array: q, k, v concatenated, or interleaved per head
        return [[(projections[0], ("{qkv}", "fused_qkv"))], [(projections[0], ("{qkv}", "fused_qkv_heads"))]]
    if sorted(widths) == [d, 2 * d]:  # q, and k with v fused
        q = projections[widths.index(d)]
        kv = projections[widths.index(2 * d)]
        return [[(q, ("q", None)), (kv, ("{kv}", "fused_qkv"))]]
    if widths != [d, d, d]:
        return []
    scores = next((s & {p.weight for p in projections} for s in softmax
                   if len(s & {p.weight for p in projections}) == 2), None)
    if scores is not None:
        v = next(p for p in projections if p.weight not in scores)
        q_k = [p for p in projections if p.weight in scores]
        if cross:  # the query reads the decoder's state, the key the memory
            q = next(p for p in q_k if p.inputs[:1] != v.inputs[:1])
            return [[(q, ("q", None)), (next(p for p in q_k if p is not q), ("k", None)), (v, ("v", None))]]
        return [[(a, ("q", None)), (b, ("k", None)), (v, ("v", None))] for a, b in (q_k, q_k[::-1])]
    if cross:  # the query reads the decoder's state, k and v the memory
        groups: dict[tuple, list[Call]] = {}
        for p in projections:
            groups.setdefault(p.inputs[:1], []).append(p)
        q = next(ps[0] for ps in groups.values() if len(ps) == 1)
        k_v = [p for p in projections if p is not q]
        return [[(q, ("q", None)), (a, ("k", None)), (b, ("v", None))] for a, b in (k_v, k_v[::-1])]
    return [[(c, (part, None)) for c, part in zip(perm, ("q", "k", "v"))]
            for perm in itertools.permutations(projections)]


def _ffn_assignments(ffn: list[Call], d: int, torch_style: bool, prefix: str) -> list[dict[str, str]]:
    dims = [_dims(c, torch_style) for c in ffn]
    if len(ffn) == 2 and dims[0][0] == d and dims[1] == (dims[0][1], d):
        return [{**_linear(ffn[0], f"{prefix}ffn.linear1", torch_style),
                 **_linear(ffn[1], f"{prefix}ffn.linear2", torch_style)}]
    if len(ffn) == 3 and dims[0] == dims[1] and dims[0][0] == d and dims[2] == (dims[0][1], d):
        down = _linear(ffn[2], f"{prefix}ffn.linear2", torch_style)
        return [{**_linear(a, f"{prefix}ffn.gate", torch_style), **_linear(b, f"{prefix}ffn.linear1", torch_style),
                 **down} for a, b in (ffn[:2], ffn[1::-1])]
    return []


def _outside_roles(calls: list[Call], where, order: list[str], kind: list[str], torch_style: bool, d: int
                   ) -> tuple[dict[str, str] | None, str | None]:
    """Embeddings, final norms and the output projection: the calls outside the layer stacks."""
    out: dict[str, str] = {}
    decoder_only = kind == ["decoder"]
    side = {"src": "tgt" if decoder_only else "src", "tgt": "tgt"}
    stack_of = {stack: name for stack, name in zip(order, kind)}
    current = None  # the stack the last layered call belonged to
    last_side = None
    after_all = False
    for c in calls:
        pattern, index = where[c.weight]
        if index is not None:
            current = stack_of[pattern.split("{i}")[0]]
            continue
        if c.weight in out:
            continue
        if c.kind == "embedding":
            if c.ids_input in ("src", "tgt"):
                last_side = side[c.ids_input]
                out[c.weight] = f"{last_side}_embed.embedding"
            elif last_side is not None:
                out[c.weight] = f"{last_side}_pos.embedding"
            else:
                return None, f"{c.weight}: a lookup before any token embedding"
            current = None
        elif c.kind == "norm" and current is not None:
            out[c.weight] = f"{current}.final_norm.gamma"
            if c.bias:
                out[c.bias] = f"{current}.final_norm.beta"
        elif c.kind == "norm" and last_side is not None:
            out[c.weight] = f"{last_side}_embed_norm.gamma"
            if c.bias:
                out[c.bias] = f"{last_side}_embed_norm.beta"
        elif c.kind == "linear" and current == kind[-1]:
            out.update(_linear(c, "output", torch_style))
            after_all = True
        else:
            return None, f"{c.weight}: a {c.kind} outside the layers that is neither an embedding, a final norm " \
                         "nor the output projection"
    del after_all
    return out, None
