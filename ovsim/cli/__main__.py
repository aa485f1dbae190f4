"""``python -m ovsim.cli``: the ``ovsim`` command."""

from ovsim.cli.main import console

console()
