"""The benchmarks the product ships (`transformer-parity bench`, `transformer-parity bench model`): every attention
implementation, and the whole model in every framework and mode, timed on the same inputs and checked against the
float64 NumPy reference while timed.

Modules, bottom-up: `timing` (the clock: blocks, medians), `machine` (CPU, devices, threads, the measured GEMM peak,
memory), `harness` (what both benchmarks share: runners, interleaved timing rounds, failures as rows, result files,
number formats); the attention benchmark in `attention` (cases, grids, the run), `attention_reference`,
`attention_impls`, `attention_report` and `attention_plot`; the whole-model benchmark in `model`, `model_impls`,
`model_report`; the command line in `cli` and `model_cli`. PyTorch and TensorFlow are imported only when a benchmark
runs. The scripts and recorded results in the repository's `benchmarks/` folder call this package.
"""
