"""The registry of measured data sets (``calibration/data/datasets.yaml``): which data sets each
family of ``ovsim validate --measured`` checks reads, and which of them a shipped parameter was
fitted on. The data live beside the package in a checkout of the repository, or wherever the
``OVSIM_DATA`` environment variable points; no package code names a data set."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from ovsim.errors import OvsimError

REGISTRY = "datasets.yaml"
# A checkout's data folder: calibration/data beside the package.
_CHECKOUT_DATA = Path(__file__).resolve().parents[2] / "calibration" / "data"


def data_root() -> Path:
    """Where the measured data sets are: ``OVSIM_DATA``, else the checkout's calibration/data."""
    env = os.environ.get("OVSIM_DATA")
    return Path(env) if env else _CHECKOUT_DATA


@functools.cache
def _registry(root: Path) -> dict[str, list[dict[str, Any]]]:
    from ovsim.hw.spec import read_yaml

    path = root / REGISTRY
    if not path.is_file():
        return {}
    data = read_yaml(path)
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise OvsimError("expected a mapping of families to lists of data sets", source=str(path))
    for family, entries in data.items():
        for i, e in enumerate(entries):
            if not isinstance(e, dict) or not isinstance(e.get("set"), str) or not isinstance(e.get("gpu"), str):
                raise OvsimError("each data set needs 'set' and 'gpu'", source=str(path), field=f"{family}.{i}")
    return data


def available() -> bool:
    """Whether the registry is there (a checkout, or ``OVSIM_DATA`` set)."""
    return (data_root() / REGISTRY).is_file()


def require() -> Path:
    """The data root, or a one-line error saying how to point ovsim at the data."""
    root = data_root()
    if not available():
        raise OvsimError(f"no measured data sets here ({root / REGISTRY} is missing): run from a checkout of the "
                         "repository, or set OVSIM_DATA to its calibration/data folder", field="--measured")
    return root


def entries(family: str) -> list[dict[str, Any]]:
    """The registry's data sets of ``family`` (none where the registry is absent)."""
    return list(_registry(data_root()).get(family, []))


def sets(family: str, *fields: str) -> tuple[tuple[str, ...], ...]:
    """The data sets of ``family`` as tuples of ``fields`` ("set", "gpu", "system", ...)."""
    out = []
    for i, e in enumerate(entries(family)):
        missing = [f for f in fields if not isinstance(e.get(f), str)]
        if missing:
            raise OvsimError(f"data set {e['set']} has no '{missing[0]}'", source=str(data_root() / REGISTRY),
                             field=f"{family}.{i}")
        out.append(tuple(str(e[f]) for f in fields))
    return tuple(out)


def fitted(family: str) -> dict[str, str]:
    """GPU -> the data set of ``family`` its parameter was fitted on (entries marked ``fit``)."""
    return {str(e["gpu"]): str(e["set"]) for e in entries(family) if e.get("fit")}
