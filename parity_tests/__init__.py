"""Parity tests: every backend against the float64 NumPy reference."""
