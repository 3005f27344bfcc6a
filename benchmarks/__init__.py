"""Runnable benchmark and measurement scripts (`python -m benchmarks.NAME`, from the repository root) and their
committed results (`benchmarks/results/`). The benchmark code itself is product code, in `transformer_parity.bench`
(`transformer-parity bench`); nothing in the installed packages imports this folder."""
