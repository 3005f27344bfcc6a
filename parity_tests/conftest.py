"""Shared fixtures: configs that cover the variants, seeded weights and padded inputs."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

import reference_numpy as rn

from parity_tests.support.variants import FAMILIES, TINY, VARIANTS  # noqa: E402,F401 (fixtures import them from here)


@pytest.fixture(params=list(VARIANTS), ids=list(VARIANTS))
def variant(request) -> rn.TransformerConfig:
    return VARIANTS[request.param]


@pytest.fixture(params=["float32", "float64"])
def dtype(request) -> str:
    return request.param


def weights_for(config: rn.TransformerConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Seeded canonical weights with non-trivial biases and LayerNorm parameters, so that a bias or gamma/beta
    mix-up changes the output (zeros and ones would hide it); the same weights `verify` and `init --exercise-all`
    use."""
    from transformer_parity.verify import seeded_weights

    return seeded_weights(config, seed, dtype)


# --- backends: one adapter each, so model-level tests are written once ---------------------------------------------

class TorchBackend:
    name = "torch"

    def __init__(self):
        import torch
        import torch_impl
        self.torch, self.impl = torch, torch_impl

    def build(self, config, weights, dtype):
        return self.impl.Transformer.from_reference(config, weights, dtype=getattr(self.torch, dtype))

    def trace(self, model, src, tgt=None, **kwargs) -> dict[str, np.ndarray]:
        with self.torch.no_grad():
            return {k: v.numpy() for k, v in model.trace(src, tgt, **kwargs).items()}

    def logits(self, model, src, tgt=None, **kwargs) -> np.ndarray:
        with self.torch.no_grad():
            return model(src, tgt, **kwargs).numpy()

    def to_reference(self, model) -> dict[str, np.ndarray]:
        return model.to_reference()


class TFBackend:
    name = "tf"

    def __init__(self):
        import tf_impl
        self.impl = tf_impl

    def build(self, config, weights, dtype):
        return self.impl.Transformer.from_reference(config, weights, dtype=dtype)

    def trace(self, model, src, tgt=None, **kwargs) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in model.trace(src, tgt, **kwargs).items()}

    def logits(self, model, src, tgt=None, **kwargs) -> np.ndarray:
        return np.asarray(model(src, tgt, **kwargs))

    def to_reference(self, model) -> dict[str, np.ndarray]:
        return model.to_reference()


_BACKENDS = {"torch": TorchBackend, "tf": TFBackend}
_backend_cache: dict = {}


@pytest.fixture(params=list(_BACKENDS), scope="session")
def backend(request):
    """Each framework twin behind the same small adapter (build from canonical weights, trace, logits)."""
    if request.param not in _backend_cache:
        _backend_cache[request.param] = _BACKENDS[request.param]()
    return _backend_cache[request.param]
