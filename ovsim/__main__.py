"""``python -m ovsim``: the ``ovsim`` command."""

from ovsim.cli.main import console

console()
