"""Hugging Face SmolLM3 (`SmolLM3ForCausalLM`, `SmolLM3Model`): Llama's names and blocks, with layers that take no
positions (`no_rope_layers`, inverted: 1 means the layer rotates; absent, every `no_rope_layer_interval`-th layer
takes none: `rope_layers`) and, with `use_sliding_window`, a window on the layers `layer_types` names sliding (by
default the ones without positions: `layer_kinds`).

A config.json whose `layer_types` names sliding layers without `use_sliding_window` or a `sliding_window` is refused:
transformers' masks would slide there and its attention modules would not. verify's float64 run takes eager
attention's softmax in float64 (`hf_gemma2.exact_eager_attention`)."""

from __future__ import annotations

from typing import Any, Collection, Mapping

import reference_numpy as rn

from . import hf_gemma2, hf_llama
from .family import Float64Fix, HFFamily
from .hf import boolean, integer, optional_integer
from .hf_llama import FamilySpec
from .hf_tasks import decoder_heads

NAME = "hf-smollm3"
MODEL_TYPE = "smollm3"
ARCHITECTURES = ("SmolLM3ForCausalLM", "SmolLM3Model")
SPEC = FamilySpec("smollm3", ARCHITECTURES, tie_default=True)
THETA = 2_000_000.0  # SmolLM3Config's rotary base where config.json names none
CONFIG_KEYS = {**hf_llama.CONFIG_KEYS, "rope_layers": "no_rope_layers", "layer_kinds": "layer_types",
               "sliding_window": "sliding_window"}
_OWN = ("no_rope_layers", "no_rope_layer_interval", "use_sliding_window", "sliding_window", "layer_types")


def rope_layers(hf: Mapping[str, Any], layers: int) -> tuple[bool, ...]:
    """Whether each layer rotates: `no_rope_layers` (1: it does), or every `no_rope_layer_interval`-th does not."""
    flags = hf.get("no_rope_layers")
    if flags is None:
        interval = integer(hf, "no_rope_layer_interval", 4)
        if interval < 1:
            raise ValueError(f"config.json no_rope_layer_interval={interval!r} must be positive")
        return tuple(bool((i + 1) % interval) for i in range(layers))
    if not isinstance(flags, list) or len(flags) != layers or any(type(f) is not int or f not in (0, 1)
                                                                  for f in flags):
        raise ValueError(f"config.json no_rope_layers={flags!r} is not supported (0 or 1 for each of "
                         f"num_hidden_layers={layers}; 1: the layer rotates)")
    return tuple(bool(f) for f in flags)


def layer_kinds(hf: Mapping[str, Any], rotary: tuple[bool, ...]) -> tuple[tuple[str, ...], int | None]:
    """`(kind per layer, sliding_window)`: `layer_types`, by default the layers without positions sliding where
    `use_sliding_window` and a `sliding_window` say so."""
    use, window = boolean(hf, "use_sliding_window", False), optional_integer(hf, "sliding_window")
    types = hf.get("layer_types")
    if types is None:
        types = ["sliding_attention" if use and window is not None and not r else "full_attention" for r in rotary]
    if not isinstance(types, list) or len(types) != len(rotary) \
            or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"config.json layer_types={types!r} is not supported (full_attention or sliding_attention "
                         f"for each of num_hidden_layers={len(rotary)})")
    kinds = tuple("sliding" if t == "sliding_attention" else "full" for t in types)
    if "sliding" in kinds and (not use or window is None):
        raise ValueError(f"config.json layer_types names sliding_attention layers with use_sliding_window={use} and "
                         f"sliding_window={window}: transformers' masks slide there and its attention does not")
    return kinds, window if "sliding" in kinds else None


def config_from_hf(hf: dict[str, Any], keys: Collection[str]) -> tuple[rn.TransformerConfig, str, list[str]]:
    """`(config, architecture, notes)` from SmolLM3's `config.json`."""
    plain = {k: v for k, v in hf.items() if k not in _OWN}
    if "rope_theta" not in (hf.get("rope_parameters") or {}) and "rope_theta" not in hf:
        plain["rope_theta"] = THETA
    config, arch, notes = hf_llama.read_config(plain, keys, SPEC, hf_llama.BASE_PREFIX)
    rotary = rope_layers(hf, config.num_decoder_layers)
    kinds, window = layer_kinds(hf, rotary)
    return config.replace(sliding_window=window, layer_kinds=kinds if window is not None else None,
                          rope_layers=rotary), arch, notes


def export_problems(config: rn.TransformerConfig) -> list[str]:
    problems = hf_llama.problems_for(config.replace(sliding_window=None, layer_kinds=None, local_rope_theta=None,
                                                    rope_layers=None), SPEC)
    if config.local_rope_theta is not None:
        problems.append(f"local_rope_theta={config.local_rope_theta} (smollm3 rotates every layer at one base)")
    return problems


def config_to_hf(config: rn.TransformerConfig) -> tuple[dict[str, Any], str]:
    hf, arch = hf_llama.write_config(config, SPEC)
    layers = range(config.num_decoder_layers)
    hf.update(no_rope_layers=[int(config.layer_rotary(i)) for i in layers],
              layer_types=[f"{config.layer_kind(i)}_attention" for i in layers],
              use_sliding_window=config.sliding_window is not None, sliding_window=config.sliding_window)
    return hf, arch


TASK_HEADS = decoder_heads("SmolLM3", qa_prefix="transformer.")  # `hf_tasks`


FAMILY = HFFamily(
    name=NAME, model_type=MODEL_TYPE, architectures=ARCHITECTURES,
    config_from_hf=config_from_hf, export_problems=export_problems, config_to_hf=config_to_hf,
    config_keys=CONFIG_KEYS, table=hf_llama.table,
    prefix=lambda arch, keys=None: hf_llama.prefix_for(arch, keys, SPEC, hf_llama.BASE_PREFIX),
    base_prefix=hf_llama.BASE_PREFIX,
    transformers_classes=ARCHITECTURES,  # the source oracle: with an output projection, without one
    hooks=hf_llama.HOOKS, head_hook=None, task_heads=TASK_HEADS, expresses=("layer_kinds", "rope_layers"),
    approximations=(),
    float64_fix=Float64Fix("eager attention's softmax, which transformers takes in float32, taken in float64",
                           hf_gemma2.exact_eager_attention))
