"""Tiny transformers models for the tests: built from a class and config settings, every parameter moved away from
its initialization (norms and biases included), saved with `save_pretrained`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def perturbed(cls_name: str, config_name: str, settings: Mapping[str, Any], seed: str, directory: Path):
    """`(model in eval mode, its save_pretrained directory)`: transformers' `cls_name` on `config_name(**settings)`,
    torch seeded from the text `seed`, every parameter moved by 0.1 N(0, 1), saved at `directory / "model"`."""
    import torch
    import transformers

    torch.manual_seed(sum(map(ord, seed)))
    model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**settings)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = Path(directory) / "model"
    model.save_pretrained(path)
    return model, path
