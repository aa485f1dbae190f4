"""ovsim's build. Everything is in pyproject.toml except one optional step: with OVSIM_COMPILE=1
the discrete-event engine's modules are compiled to C extensions with mypyc (part of mypy), which
runs the same type-checked code about 5x faster (docs/design.md, "A compiled engine"):

    pip install -e ".[compile]"
    OVSIM_COMPILE=1 python setup.py build_ext --inplace

Without it (the default, and what `pip install` does) ovsim is pure Python. The .py files stay the
source: ovsim.engine refuses a compiled module whose .py changed after it was built.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from setuptools import setup

ENGINE_DIR = Path("ovsim") / "engine"
# Every module an engine event runs through, the power-limit loop and the recorder included. The
# rest of ovsim (scenario parsing, workload building, cost models, reports) stays Python.
COMPILED_MODULES = (
    "sim", "clock", "rates", "dispatch", "flows", "state", "channel", "resources", "progress", "routing",
    "power_loop", "power", "record", "machine", "coupled",
)
# Written beside the compiled modules: each source's SHA-256, which ovsim.engine checks at import.
MANIFEST = "compiled_sources.json"


def engine_extensions() -> list[object]:
    if os.environ.get("OVSIM_COMPILE", "") != "1":
        return []
    from mypyc.build import mypycify

    sources = [ENGINE_DIR / f"{name}.py" for name in COMPILED_MODULES]
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sources}
    (ENGINE_DIR / MANIFEST).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    return list(mypycify([str(p) for p in sources], opt_level="3", group_name="ovsim.engine.compiled"))


setup(ext_modules=engine_extensions())
