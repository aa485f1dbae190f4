"""``python -m ovsim.cli``: the ``ovsim`` command."""

import sys

from ovsim.cli.main import main

sys.exit(main())
