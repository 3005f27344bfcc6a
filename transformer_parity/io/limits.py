"""Bounds on what a file or an option may make this tool allocate.

Two checks, both made before anything large exists:

- `reference_numpy.schema.check_config_against_file` (here as `check_config_against_file`): a config read from a file (or given with --set next to one) cannot name more layers
  than the file holds tensors, so a 200 KB file saying `num_encoder_layers=10**9` is refused instead of building a
  name table of ten billion entries;
- `check_memory`: the bytes a run needs (`estimate_bytes`: weights, the activations of one batch, the position
  table, optimizer state) against the memory available now (`/proc/meminfo` MemAvailable, else physical memory),
  so that a size option (`--batch 10**9`, `--set max_len=10**12`) ends in one line naming the estimate instead of a
  MemoryError.

The estimate is deliberately rough (within a small factor of what the run allocates, never far below it): it is
used to refuse what cannot fit, not to plan. "Available" is also bounded by the process's address-space limit
(`ulimit -v`, `RLIMIT_AS`), so a run under a limit is refused in one line instead of failing inside NumPy.

Config files (a model directory's `config.json`, `--config FILE.json`) are read through `read_json_object`, which
reads at most `MAX_CONFIG_BYTES` of them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import reference_numpy as rn
from reference_numpy.schema import check_config_against_file  # noqa: F401 (one of the limits)

from transformer_parity.errors import UsageError


def parameter_count(config: rn.TransformerConfig) -> int:
    """The number of weights of `config`, computed without listing every layer's parameters (nor every expert's)."""
    if config.num_experts:  # a layer with a mixture of experts in place of the dense feed-forward (no biases)
        per, d, shared = (3 if config.ffn_gated else 2), config.d_model, config.shared_expert_d_ff
        mixture = d * config.num_experts + config.num_experts * per * d * config.expert_width + (
            per * d * shared + d if shared else 0)
        layers = config.num_decoder_layers if config.expert_layers is None else sum(config.expert_layers)
        dense = config.replace(num_experts=0, **rn.config.EXPERT_DEFAULTS)
        return parameter_count(dense) + layers * (mixture - per * d * config.d_ff)
    e, d = config.num_encoder_layers, config.num_decoder_layers
    e0, d0 = min(e, 1), min(d, 1)
    uniform = config.replace(layer_kinds=None, local_rope_theta=None, rope_layers=None)  # per-layer lists: no weights

    def count(encoders: int, decoders: int) -> int:
        shapes = rn.parameter_shapes(uniform.replace(num_encoder_layers=encoders, num_decoder_layers=decoders))
        return sum(math.prod(s) for s in shapes.values())

    total = count(e0, d0)
    if e > 1:
        total += (e - 1) * (count(2, d0) - count(1, d0))
    if d > 1:
        total += (d - 1) * (count(e0, 2) - count(e0, 1))
    return total


def available_bytes() -> int:
    """Memory available to a new allocation: MemAvailable from /proc/meminfo (else physical memory), and at most what
    the address-space limit leaves (`RLIMIT_AS` less what is mapped now)."""
    return min(_system_available(), _address_space_left())


def _address_space_left() -> int:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return 1 << 62
        with open("/proc/self/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        return max(soft - mapped, 0)
    except (ImportError, OSError, ValueError, StopIteration):
        return 1 << 62


def _system_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def estimate_bytes(config: rn.TransformerConfig, batch: int = 1, src_len: int = 1, tgt_len: int = 1,
                   itemsize: int = 8, weight_copies: int = 2, traces: int = 1, training: bool = False) -> int:
    """Rough peak bytes of running `config` on one batch: `weight_copies` copies of the weights, the sinusoidal
    position table, and `traces` sets of the activations a trace keeps (per layer a few `(B, T, d_model)` and
    `(B, T, d_ff)` tensors and the `(B, H, T, T)` attention weights; the logits); training adds gradients and Adam's
    two moments."""
    params = parameter_count(config)
    b, d, h = batch, config.d_model, config.num_heads
    s = src_len if config.has_encoder else 0
    t = tgt_len if config.has_decoder else 0
    per_token = 12 * d + 3 * config.d_ff
    acts = config.num_encoder_layers * b * s * (per_token + 3 * h * s)
    acts += config.num_decoder_layers * b * t * (per_token + 3 * h * (t + s))
    out_len = t if config.has_decoder else s
    acts += 3 * b * out_len * (config.tgt_vocab_size if config.output_projection else d)
    positions = config.max_len * d if config.positional == "sinusoidal" else 0
    total = params * (weight_copies + (3 if training else 0)) + positions * 2 + acts * traces * (2 if training else 1)
    return total * itemsize


def sinusoid_bytes(config: rn.TransformerConfig) -> int:
    """Peak bytes of computing a sinusoidal position table (`rn.sinusoidal_positions`: `(max_len, d_model)` in
    float64, built from angles and their sines and cosines, about three tables at once); 0 for learned positions,
    whose table is a weight of the file."""
    return 3 * 8 * config.max_len * config.d_model if config.positional == "sinusoidal" else 0


def check_positions(config: rn.TransformerConfig, source: str, origin: str = "") -> None:
    """Refuse a sinusoidal `max_len` whose position table (which every backend computes when it is built) does not
    fit in the memory available, naming the field: nothing in the weights bounds it."""
    need, have = sinusoid_bytes(config), available_bytes()
    if need > have:
        raise ValueError(f"{source}: config field max_len={config.max_len}{f' ({origin})' if origin else ''} needs a "
                         f"sinusoidal position table of about {human_bytes(need)} to build (max_len x d_model="
                         f"{config.d_model} in float64), more than the {human_bytes(have)} available; state the model's "
                         "real max_len (--set max_len=N)")


def check_memory(need: int, what: str) -> None:
    """`UsageError` naming `what` and the estimate when `need` bytes exceed the memory available."""
    have = available_bytes()
    if need > have:
        raise UsageError(f"{what} needs about {human_bytes(need)} of memory, more than the {human_bytes(have)} "
                         "available; "
                         "use smaller sizes")


def check_run(config: rn.TransformerConfig, what: str, **sizes) -> None:
    """`check_positions`, then `check_memory(estimate_bytes(config, **sizes), what)`."""
    check_positions(config, what)
    check_memory(estimate_bytes(config, **sizes), what)


MAX_CONFIG_BYTES = 1 << 20  # config files are a few kB; 1 MiB leaves room for large label maps


class FileTooLarge(ValueError):
    """A file over the size cap of what it claims to be (a config file of megabytes)."""


def read_json_object(path: str | os.PathLike, what: str, cap: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON object from a config file of at most `cap` bytes (only `cap + 1` bytes are ever read); `ValueError`
    naming the file: too large, not UTF-8 JSON, nested too deeply, or not an object."""
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise FileTooLarge(f"{path} is larger than {human_bytes(cap)}, too large for {what}; refusing to read it")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path} nests JSON too deeply to be {what}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object ({what}), received {type(value).__name__}")
    return value


STREAM_OVERHEAD = 3  # a streamed tensor is read, rearranged (a transpose copies) and cast or made contiguous


def check_streaming(weights, out_itemsize: int | None = None, what: str = "convert") -> int:
    """Refuse, in one line with the figures, a streamed conversion whose largest tensor cannot be held
    `STREAM_OVERHEAD` times over in the memory available now; returns that estimate in bytes. (Fused outputs, such as
    Phi-3's q/k/v, are counted as their parts' sum.)"""
    if not weights:
        return 0
    name, array = max(weights.items(), key=lambda item: item[1].nbytes)
    itemsize = max(array.dtype.itemsize, out_itemsize or 0)
    need = STREAM_OVERHEAD * math.prod(array.shape) * itemsize
    have = available_bytes()
    if need > have:
        raise UsageError(f"{what} needs about {human_bytes(need)} at once (its largest tensor, {name}, "
                         f"{human_bytes(array.nbytes)}, read, rearranged and written) and {human_bytes(have)} is "
                         "available")
    return need


SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
              "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """`5GB`, `500MB`, `2GiB` or a number of bytes -> bytes (decimal units as transformers' max_shard_size)."""
    import re

    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in SIZE_UNITS or float(match.group(1)) * SIZE_UNITS[unit] < 1:
        raise UsageError(f"a size must be a positive number of bytes or end in KB, MB, GB, KiB, MiB or GiB, received "
                         f"{text!r}")
    return int(float(match.group(1)) * SIZE_UNITS[unit])


def human_bytes(n: float) -> str:
    """A size as every command prints one: binary units, 1 MiB = 2**20 bytes."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"
