"""ovsim: a performance simulator for compute-communication overlap on GPUs.

The public API lives in :mod:`ovsim.api`; its names are re-exported here lazily so that importing a
low layer (``ovsim.units``, ``ovsim.hw``) does not pull in the engine.
"""

from typing import Any

__all__ = ["Result", "load_scenario", "predict"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ovsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'ovsim' has no attribute {name!r}")
