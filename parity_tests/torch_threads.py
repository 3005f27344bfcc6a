"""An autouse fixture for test modules that run torch next to TensorFlow, or tiny torch models on a busy machine.

torch's OpenMP threads spin while they wait; next to TensorFlow's thread pools (or other processes) on 2 cores that
made a tiny training step ~100x slower (measured: 3.8 s instead of 30 ms). One intra-op thread is also the faster
choice for these tiny models. The module's setting is restored afterwards, so other test files are unaffected.
"""

import pytest


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
