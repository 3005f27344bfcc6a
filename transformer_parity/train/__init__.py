"""Training the twins side by side on a toy task (`run`); the `train` command is `transformer_parity.cli.train`."""
