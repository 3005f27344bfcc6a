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

What the trace leaves open becomes candidate mappings that `layouts.probe.settle` runs against the source, each
`Choice` made once for the whole model (one attention class, one feed-forward class): which of three separate
projections are q, k and v (six orders; under PyTorch the softmax's lineage names q and k, leaving two), whether a
fused array is concatenated or interleaved per head, which of a gated block's inputs is the gate, and whether a lone
stack is encoder or decoder layers: at most 6 x 2 x 2 x 2 = 48, deduplicated, the call order first. The pattern of
the first layer stands for every layer of its stack (the `{i}` patterns say they hold the same tensors).
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
            same = by_value.get(_digest(value), [])  # a tied table is stored under two keys: one for each call
            keys = [k for k in same if k not in used] or same
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
        import tf_impl.startup  # noqa: F401 (TensorFlow's start-up notices kept off the terminal)
        import keras

        original = self.original = keras.layers.Layer.__call__
        raw, keep = self.raw, self.keep

        def call(layer, *args, **kwargs):
            out = original(layer, *args, **kwargs)
            own = layer._trainable_variables + layer._non_trainable_variables
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
            import tf_impl.startup  # noqa: F401
            import keras

            keras.layers.Layer.__call__ = self.original


# --- roles from the trace ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    """What the trace leaves open, chosen once for the whole model (one attention class, one feed-forward class):
    which of three separate projections, by call position, are q, k and v; how a fused q/k/v array is laid out;
    which of a gated block's two input projections is the gate."""

    qkv: tuple[int, int, int] = (0, 1, 2)  # call positions of q, k, v
    fused: str = "fused_qkv"  # or "fused_qkv_heads": interleaved per head
    gate_first: bool = True


CHOICES = [Choice(qkv, fused, gate) for qkv in itertools.permutations(range(3))
           for fused in ("fused_qkv", "fused_qkv_heads") for gate in (True, False)]


def candidates(traced: Trace, state: Mapping[str, np.ndarray], torch_style: bool, guesses: Mapping[str, str]
               ) -> tuple[list[dict[str, str]], str | None]:
    """`(mappings, why none)`: the candidate mappings (external pattern -> "canonical [transform]") the trace
    allows, the call order first; every pattern the trace did not meet keeps its name guess (`guesses`). At most
    6 q/k/v orders x 2 fused layouts x 2 gate orders x 2 readings of a lone stack (encoder or decoder layers) = 48,
    fewer where the model has no such choice or where the trace rules one out (a softmax names q and k)."""
    calls = traced.calls
    if not calls:
        return [], "the source ran no PyTorch module or Keras layer holding a checkpoint tensor"
    stacks = user.layer_stacks({k: np.shape(v) for k, v in state.items()}, torch_style)
    where = {key: user._generalize(key, torch_style, stacks) for key in state}  # key -> (pattern, layer index)
    token = [c for c in calls if c.kind == "embedding" and c.ids_input in ("src", "tgt")]
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
    kinds = [["encoder", "decoder"]] if len(order) == 2 else [["encoder"], ["decoder"]]  # a lone stack: probed
    out, whys = [], []
    for kind in kinds:
        outside, why = _outside_roles(calls, where, order, kind, torch_style)
        if outside is None:
            whys.append(why)
            continue
        for choice in CHOICES:
            by_key = dict(outside)
            for stack, name in zip(order, kind):
                roles, why = _layer_roles(layer0[stack], d, torch_style, name, len(kind) == 2 and name == "decoder",
                                          traced.softmax, choice)
                if roles is None:
                    whys.append(f"read as {name} layers, the first of {stack}{{i}} has {why}")
                    break
                by_key.update(roles)
            else:
                mapping = dict(guesses)
                for key, value in by_key.items():
                    mapping[where[key][0]] = value
                if mapping not in out:
                    out.append(mapping)
    return out, None if out else "; ".join(dict.fromkeys(whys))


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


def _norm(call: Call, canonical: str) -> dict[str, str]:
    """A norm's entries: its scale as `canonical.gamma`, its shift (if it has one) as `canonical.beta`."""
    out = {call.weight: f"{canonical}.gamma"}
    if call.bias:
        out[call.bias] = f"{canonical}.beta"
    return out


def _dims(call: Call, torch_style: bool) -> tuple[int, int]:
    """`(in, out)` of a linear."""
    shape = call.shapes[_role(call, call.weight)]
    return (shape[1], shape[0]) if torch_style else (shape[0], shape[1])


def _layer_roles(calls: list[Call], d: int, torch_style: bool, stack: str, cross: bool,
                 softmax: list[frozenset[str]], choice: Choice) -> tuple[dict[str, str] | None, str | None]:
    """One layer's roles under `choice` (`cross`: a decoder layer with cross-attention): key -> "canonical
    [transform]", or None and why the calls do not read as such a layer (or not under this choice)."""
    prefix = f"{stack}.layers.{{i}}."
    norms = [c for c in calls if c.kind == "norm"]
    linears = [c for c in calls if c.kind == "linear"]
    names = ("norm1", "norm2", "norm3") if cross else ("norm1", "norm3") if stack == "decoder" else ("norm1", "norm2")
    if len(norms) != len(names):  # a decoder layer's norm2 is its cross-attention's
        return None, f"{len(norms)} norms (such a layer has {len(names)})"
    roles: dict[str, str] = {}
    for name, c in zip(names, norms):
        roles.update(_norm(c, f"{prefix}{name}"))
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
        width = sum(_dims(p, torch_style)[1] for p in pending)
        return None, f"projections of {width} columns with no output projection"
    wanted = 2 if cross else 1
    if len(attentions) != wanted:
        return None, f"{len(attentions)} attentions (such a layer has {wanted})"
    if cross and _is_cross(attentions[0][0]) and not _is_cross(attentions[1][0]):
        attentions.reverse()  # the self-attention is the one whose projections read one tensor
    for (projections, o), attn in zip(attentions, ("self_attn", "cross_attn")):
        assignment = _qkv_assignment(projections, attn == "cross_attn", torch_style, d, softmax, choice)
        if assignment is None:
            return None, "projections this choice of q, k and v does not fit"
        roles.update(_linear(o, f"{prefix}{attn}.o", torch_style))
        for call, (part, fused) in assignment:
            roles.update(_linear(call, f"{prefix}{attn}.{part}", torch_style, fused))
    ffn_roles = _ffn_roles(ffn, d, torch_style, prefix, choice.gate_first)
    if ffn_roles is None:
        return None, f"{len(ffn)} feed-forward linears that are not into an inner width and back"
    return {**roles, **ffn_roles}, None


def _is_cross(projections: list[Call]) -> bool:
    return len({p.inputs[:1] for p in projections}) > 1


def _qkv_assignment(projections: list[Call], cross: bool, torch_style: bool, d: int, softmax: list[frozenset[str]],
                    choice: Choice) -> list | None:
    """The projections read as q, k and v under `choice`: `[(call, (part, fused transform or None))]`, or None when
    the trace rules the choice out: a cross-attention's query is the projection that reads the decoder's state (the
    other two read the memory), and where a softmax's scores came from two of three projections, those are q and k
    and the third v."""
    widths = [_dims(p, torch_style)[1] for p in projections]
    if widths == [3 * d]:  # one fused array: q, k, v concatenated, or interleaved per head
        return [(projections[0], ("{qkv}", choice.fused))]
    if sorted(widths) == [d, 2 * d]:  # q, and k with v fused
        return [(projections[widths.index(d)], ("q", None)), (projections[widths.index(2 * d)], ("{kv}", "fused_qkv"))]
    if widths != [d, d, d]:
        return None
    q, k, v = (projections[i] for i in choice.qkv)
    scores = next((s & {p.weight for p in projections} for s in softmax
                   if len(s & {p.weight for p in projections}) == 2), None)
    if scores is not None and {q.weight, k.weight} != scores:
        return None
    if cross and (q.inputs[:1] == k.inputs[:1] or k.inputs[:1] != v.inputs[:1]):
        return None
    return [(q, ("q", None)), (k, ("k", None)), (v, ("v", None))]


def _ffn_roles(ffn: list[Call], d: int, torch_style: bool, prefix: str, gate_first: bool) -> dict[str, str] | None:
    dims = [_dims(c, torch_style) for c in ffn]
    if len(ffn) == 2 and dims[0][0] == d and dims[1] == (dims[0][1], d):
        return {**_linear(ffn[0], f"{prefix}ffn.linear1", torch_style),
                **_linear(ffn[1], f"{prefix}ffn.linear2", torch_style)}
    if len(ffn) == 3 and dims[0] == dims[1] and dims[0][0] == d and dims[2] == (dims[0][1], d):
        gate, up = ffn[:2] if gate_first else ffn[1::-1]
        return {**_linear(gate, f"{prefix}ffn.gate", torch_style), **_linear(up, f"{prefix}ffn.linear1", torch_style),
                **_linear(ffn[2], f"{prefix}ffn.linear2", torch_style)}
    return None


def _outside_roles(calls: list[Call], where, order: list[str], kind: list[str], torch_style: bool
                   ) -> tuple[dict[str, str] | None, str | None]:
    """Embeddings, final norms and the output projection: the calls outside the layer stacks."""
    out: dict[str, str] = {}
    decoder_only = kind == ["decoder"]
    side = {"src": "tgt" if decoder_only else "src", "tgt": "tgt"}
    stack_of = {stack: name for stack, name in zip(order, kind)}
    current = None  # the stack the last layered call belonged to
    last_side = None
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
            out.update(_norm(c, f"{current}.final_norm"))
        elif c.kind == "norm" and last_side is not None:
            out.update(_norm(c, f"{last_side}_embed_norm"))
        elif c.kind == "linear" and current == kind[-1]:
            out.update(_linear(c, "output", torch_style))
        else:
            return None, f"{c.weight}: a {c.kind} outside the layers that is neither an embedding, a final norm " \
                         "nor the output projection"
    return out, None
