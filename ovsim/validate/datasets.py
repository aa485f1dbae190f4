"""The registry of measured data sets (``calibration/data/registry.yaml``): every run, which data
sets each family of ``ovsim validate --measured`` checks reads, and which of them each fit of a
shipped parameter reads (:func:`fit_sets`; :func:`roles` gathers each run's readers). The data
live beside the package in a checkout of the repository, or wherever the ``OVSIM_DATA``
environment variable points; no package code names a data set.

A data set keeps each part's kernel tables in one file, ``tables/<part>.parquet``, its experiments
told apart by a column (:func:`ovsim.traces.load.write_tables`); :func:`experiments` reads them, and
one file an experiment under ``tables/<part>/`` too (data sets ingested that way)."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import glob
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovsim.errors import OvsimError
from ovsim.traces.table import TraceBundle

if TYPE_CHECKING:
    from ovsim.calibrate.inputs import TraceInput

REGISTRY = "registry.yaml"
# The registry's lists that are not families of checks: every run, and what the fits read.
RUNS, FITS = "runs", "fits"
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
                         "repository, or give --data (or set OVSIM_DATA) its calibration/data folder",
                         field="--measured")
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


def fit_sets(fit: str) -> dict[str, dict[str, Any]]:
    """GPU -> the registry's entry of the data set ``fit`` reads for it (``set``, and ``with``,
    ``held_out``, ``defective`` where the entry has them); a one-line error where the registry names
    none."""
    found = {str(e["gpu"]): e for e in entries(FITS) if e.get("fit") == fit}
    if not found:
        raise OvsimError(f"no data set of fit '{fit}'", source=str(data_root() / REGISTRY), field=FITS)
    return found


def roles() -> dict[str, list[str]]:
    """Each run of the registry -> what reads it: ``fit NAME`` for each fit, ``held out by fit
    NAME`` for a fit's own held-out repeat, ``FAMILY`` for each family of checks (held out unless a
    fit of it reads the set too); runs no one reads have none."""
    out: dict[str, list[str]] = {str(e["set"]): [] for e in entries(RUNS)}
    for family, listed in _registry(data_root()).items():
        if family == RUNS:
            continue
        for e in listed:
            role = f"fit {e['fit']}" if family == FITS else family
            for key in ("set", "with", "comm", "held_out"):
                said = f"held out by {role}" if key == "held_out" else role
                if isinstance(e.get(key), str) and said not in out.setdefault(str(e[key]), []):
                    out[str(e[key])].append(said)
    return out


def part_file(run: Path, part: str) -> Path:
    """Where data set ``run`` keeps ``part``'s kernel tables: its one file, else its folder."""
    merged = run / "tables" / f"{part}.parquet"
    return merged if merged.is_file() else run / "tables" / part


@functools.lru_cache(maxsize=4)
def _read_merged(path: str, mtime_ns: int, size: int) -> dict[str, TraceBundle]:
    from ovsim.traces.load import read_tables

    return read_tables(path)


def experiments(run: Path, part: str, pattern: str = "*") -> dict[str, TraceBundle]:
    """The experiments of ``part`` in data set ``run`` whose label matches ``pattern`` (shell
    style), by label in sorted order, each as its own run (a table a caller may change)."""
    where = part_file(run, part)
    if where.is_file():
        st = where.stat()
        found = _read_merged(str(where), st.st_mtime_ns, st.st_size)
        return {k: _copy(b) for k, b in sorted(found.items()) if fnmatch.fnmatchcase(k, pattern)}
    if not where.is_dir():
        return {}
    from ovsim.traces.load import read_table

    return {p.stem: read_table(p) for p in sorted(where.glob(f"{pattern}.parquet"))}


def _copy(b: TraceBundle) -> TraceBundle:
    """A cached run as one a caller may change."""
    return dataclasses.replace(b, kernels=b.kernels.copy(), gpu_names=dict(b.gpu_names), sources=dict(b.sources),
                               skipped=dict(b.skipped), versions=dict(b.versions))


def one_experiment(run: Path, part: str, label: str) -> TraceBundle | None:
    """One experiment's kernel table (None where the data set has no such experiment)."""
    return experiments(run, part, glob.escape(label)).get(label)


def table_path(run: Path, part: str, label: str) -> Path:
    """The path that names one experiment's kernel table, ``<run>/tables/<part>/<label>.parquet``,
    whether the data set keeps it in a file of its own or in the part's one file."""
    return run / "tables" / part / f"{label}.parquet"


def table_paths(run: Path, part: str, pattern: str = "*") -> list[Path]:
    """:func:`table_path` of each experiment of ``part`` matching ``pattern``, in label order."""
    return [table_path(run, part, label) for label in experiments(run, part, pattern)]


def read_experiment(path: Path) -> TraceBundle:
    """The experiment a :func:`table_path` names."""
    from ovsim.traces.load import read_table

    run, part = path.parents[2], path.parent.name
    if not part_file(run, part).is_file() and path.is_file():
        return read_table(path)
    bundle = one_experiment(run, part, path.stem)
    if bundle is None:
        raise OvsimError(f"no experiment '{path.stem}' in the data set", source=str(part_file(run, part)),
                         field="experiment")
    return bundle


def table_input(path: Path, gpu: str) -> TraceInput:
    """The experiment a :func:`table_path` names as a run to replay or calibrate on, labelled as its
    own file would be and sourced to the file that holds it."""
    from ovsim.calibrate.inputs import TraceInput
    from ovsim.hw.spec import load_gpu

    load_gpu(gpu)
    where = part_file(path.parents[2], path.parent.name)
    where = where if where.is_file() else path
    return TraceInput(bundle=read_experiment(path), label=path.name, gpu=gpu, files=(str(where),))


def experiment_inputs(run: Path, part: str, gpu: str, pattern: str = "*") -> list[TraceInput]:
    """:func:`table_input` of each experiment of ``part`` matching ``pattern``, in label order."""
    return [table_input(p, gpu) for p in table_paths(run, part, pattern)]
