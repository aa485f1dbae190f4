"""The discrete-event engine: streams, the block dispatcher, shared channels, collectives.

Its hot modules may be compiled with mypyc (setup.py, OVSIM_COMPILE=1). A compiled module is
imported in place of its .py, so one built from an older .py would silently run old code: the
check below refuses it at import, naming the file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "compiled_sources.json"
REBUILD = "rebuild with `OVSIM_COMPILE=1 python setup.py build_ext --inplace` or delete the compiled files"


def compiled_modules(folder: Path | None = None) -> list[str]:
    """The engine modules that run compiled (their extension sits beside their .py), by name."""
    here = folder or Path(__file__).parent
    return sorted(p.name.split(".")[0] for p in (*here.glob("*.so"), *here.glob("*.pyd"))
                  if (here / f"{p.name.split('.')[0]}.py").is_file())


def check_compiled(folder: Path | None = None) -> None:
    """Raise ImportError if a compiled module was not built from the .py beside it."""
    here = folder or Path(__file__).parent
    names = compiled_modules(here)
    if not names:
        return
    try:
        digests = json.loads((here / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise ImportError(f"{here / MANIFEST}: unreadable ({e}); the compiled engine modules {', '.join(names)} "
                          f"cannot be checked against their sources: {REBUILD}") from None
    for name in names:
        source = here / f"{name}.py"
        if digests.get(source.name) != hashlib.sha256(source.read_bytes()).hexdigest():
            raise ImportError(f"{source}: changed since its compiled module was built, which would run the old "
                              f"code: {REBUILD}")


check_compiled()
