"""Attention benchmarks: NumPy, PyTorch and TensorFlow/Keras attention timed on the same inputs (`transformer-parity bench`)."""
