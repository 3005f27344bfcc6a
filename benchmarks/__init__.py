"""Attention benchmarks: NumPy, PyTorch and TensorFlow/Keras attention timed on the same inputs and checked against
the float64 reference (`transformer-parity bench`, `python -m pytest benchmarks/ --benchmark-only`)."""
