"""transformer-parity: convert Transformer checkpoints between NumPy, PyTorch and Keras, and verify that every
backend computes the same function, sublayer by sublayer.

Importing this package imports nothing heavy; frameworks load only when a command needs them.
"""

__version__ = "0.1.0"  # keep equal to pyproject.toml's [project] version
