"""What the PyTorch fixture models share: seeded perturbation, a float64 build, loading a checkpoint, running it."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np
import torch
from torch import nn


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules (and the buffers their code computes) in `dtype`, as a float64 program would."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def seeded(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    """`build()` under `torch.manual_seed(seed)` (the global generator is restored afterwards), then every LayerNorm
    weight set to 1 + 0.1 N(0, 1) and every bias (LayerNorm, Linear, `in_proj_bias`) to 0.1 N(0, 1), so that a port
    that mixes up a gamma, a beta or a bias changes the output. Returned in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    generator = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                noise = 0.1 * torch.randn(param.shape, generator=generator, dtype=param.dtype)
                if isinstance(module, nn.LayerNorm) and name == "weight":
                    param.copy_(1 + noise)
                elif name.endswith("bias"):
                    param.copy_(noise)
    return model.eval()


def read_state(path: str | Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def load(build: Callable[[], nn.Module], state: Mapping[str, torch.Tensor], dtype: str) -> nn.Module:
    """The model with `state` loaded, in eval mode. float32: `load_state_dict` as the user does (strict). float64:
    built under the float64 default dtype, its parameters loaded and upcast, its buffers its own float64 ones."""
    if dtype == "float32":
        model = build()
        model.load_state_dict(state)
        return model.eval()
    with default_dtype(torch.float64):
        model = build()
    buffers = {name for name, _ in model.named_buffers()}
    result = model.load_state_dict({k: v.double() for k, v in state.items() if k not in buffers}, strict=False)
    if result.unexpected_keys or set(result.missing_keys) - buffers:
        raise ValueError(f"the checkpoint does not fit the model: missing {result.missing_keys}, unexpected "
                         f"{result.unexpected_keys}")
    return model.eval()


@functools.lru_cache(maxsize=8)
def cached(loader: Callable[[str, str], nn.Module], path: str, mtime_ns: int, dtype: str) -> nn.Module:
    """`loader(path, dtype)`, once per file version and dtype (a source is called many times)."""
    return loader(path, dtype)


def model_for(loader: Callable[[str, str], nn.Module], path: str | Path, dtype: str) -> nn.Module:
    path = Path(path)
    return cached(loader, str(path.resolve()), path.stat().st_mtime_ns, dtype)


def numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def loaders(build: Callable[[bool], nn.Module]) -> dict[bool, Callable[[str, str], nn.Module]]:
    """`{renamed: loader(path, dtype)}` for a fixture whose model is `build(renamed)` (`_named`): made once per
    module, so that `model_for`'s cache meets the same loader on every call."""
    return {renamed: functools.partial(_load_built, build, renamed) for renamed in (False, True)}


def _load_built(build: Callable[[bool], nn.Module], renamed: bool, path: str, dtype: str) -> nn.Module:
    return load(lambda: build(renamed), read_state(path), dtype)


def fixture(cls: Callable[[bool], nn.Module], run: Callable[[nn.Module, dict], torch.Tensor]) -> dict:
    """The fixture API (`parity_tests.sources`) of a model built as `cls(renamed)` whose output on a batch is
    `run(model, batch)`: `build`, `save_checkpoint` (a `torch.save` of the state dict), `make_source`, `forward` and
    `forward_f64`, each taking `renamed` where it builds the model."""
    from parity_tests.sources import batch_dtype, checkpoint_path

    models = loaders(cls)

    def build(seed: int = 0, renamed: bool = False) -> nn.Module:
        """The model, float32, eval mode, LayerNorms and biases perturbed away from init."""
        return seeded(lambda: cls(renamed), seed)

    def save_checkpoint(path, seed: int = 0, renamed: bool = False) -> Path:
        torch.save(build(seed, renamed).state_dict(), path)
        return Path(path)

    def make_source(path, renamed: bool = False):
        def source(batch) -> np.ndarray:
            model = model_for(models[renamed], path, batch_dtype(batch))
            with torch.no_grad():
                return numpy(run(model, batch))
        return source

    def forward(batch) -> np.ndarray:
        return make_source(checkpoint_path())(batch)

    def forward_f64(batch) -> np.ndarray:
        return forward({**batch, "dtype": "float64"})

    return {"build": build, "save_checkpoint": save_checkpoint, "make_source": make_source, "forward": forward,
            "forward_f64": forward_f64}
