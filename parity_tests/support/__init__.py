"""The test harness: planted faults, the config variants every parity test loops over, and the training-parity
measures. Tests and the scripts in benchmarks/ import it; the product never does."""
