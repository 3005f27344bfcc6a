"""The one exception the CLI turns into a single stderr line and exit status 2 (bad input or usage).

Subcommand modules raise `UsageError` for anything the user can fix; `cli.main` also maps `ValueError` and
`OSError` from loading and saving to the same clean exit. Any other exception is a bug: one line and exit status 3
(`cli.INTERNAL_ERROR`), so that exit 1 always means "the backends differ". `--debug` re-raises instead.
"""


class UsageError(Exception):
    """Bad input or usage: a missing file, a wrong format, a config that does not fit the weights."""
