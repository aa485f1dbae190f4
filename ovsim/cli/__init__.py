"""The ``ovsim`` command: a thin shell over :mod:`ovsim.api`, one module per family of commands
(``predict``, ``sweep``, ``replay``, ``calibrate``, ``tune``) over their shared helpers
(``common``); ``main`` holds the parser.

Bad input prints one line (``ovsim: error: FILE: FIELD: message``) and exits with status 2; an
unexpected failure prints one line and exits with status 3 (set OVSIM_DEBUG=1 for the traceback).
"""

from ovsim.cli.main import console, main, parser

__all__ = ["console", "main", "parser"]
