"""What the fits read and return: traces with their GPU and power logs, and the fit report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ovsim.errors import OvsimError
from ovsim.hw.spec import load_gpu
from ovsim.replay import bundle_gpu
from ovsim.replay_kernels import COMPUTE_KINDS, MEMORY_KINDS
from ovsim.traces.table import TraceBundle

QUANTITIES = ("contention", "collectives", "overhead", "gemm", "memory", "power")
# Quantities that belong to one GPU: not fitted for '*'.
GPU_SPECIFIC = ("collectives", "overhead", "gemm", "memory", "power")
# Compute kinds whose replay HBM traffic can be fitted (memory-bound kinds are the anchor).
FRACTION_KINDS = tuple(k for k in COMPUTE_KINDS if k not in MEMORY_KINDS)
_REGULARIZE = 1e-6


@dataclass(frozen=True)
class PowerLog:
    """A power log recorded during a traced run, and how to put it on the trace's clock."""

    path: str
    # Trace time of the log's first sample; None: from the wall clocks of the log and the trace.
    offset_s: float | None = None
    # The sensor's averaging window; None: the log's median sample interval.
    window_s: float | None = None


@dataclass(frozen=True)
class TraceInput:
    """One measured run to calibrate on: its bundle, where it came from, the GPU spec it ran on,
    and power logs recorded during it."""

    bundle: TraceBundle
    label: str
    gpu: str
    files: tuple[str, ...] = ()
    power_logs: tuple[PowerLog, ...] = ()
    source: str = ""  # the paths as given, for errors (else ``label``)


@dataclass
class FitReport:
    """What a calibration fitted, from how much data, and how well."""

    parameters: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    fits: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    # Every measured point a fit used beside what the written parameters predict for it
    # (POINT_COLUMNS); filled when calibrate() is asked for points.
    points: pd.DataFrame | None = None


# FitReport.points: the fit, the group a point belongs to (precision, class, collective, kernel
# kind, power log), its trace, the unit of the values ("s" or "W"), the measured value, the value
# the written parameters give, and the prediction the fit is judged against where it has one
# (contention: the naive isolated duration; power: the calibration in use before the fit).
POINT_COLUMNS = ("quantity", "group", "trace", "unit", "measured", "fitted", "baseline")


def trace_input(paths: Sequence[str | Path], gpu: str | None = None, *, fallback_gpu: str | None = None) -> TraceInput:
    """A run to calibrate on. Its GPU is ``gpu`` when given, else the one its device names point at,
    else ``fallback_gpu`` (a trace that records no device)."""
    from ovsim.traces.load import load_trace

    bundle = load_trace(paths)
    name = gpu
    if name is None:
        try:
            name = bundle_gpu(bundle)
        except OvsimError:
            if fallback_gpu is None or bundle.gpu_names:
                raise
            name = fallback_gpu
    load_gpu(name)
    files: list[str] = []
    for p in paths:
        q = Path(p)
        if q.is_dir():
            files.extend(str(f) for f in sorted(q.rglob("*")) if f.is_file())
        else:
            files.append(str(q))
    label = ", ".join(Path(p).name for p in paths)
    return TraceInput(bundle=bundle, label=label, gpu=name, files=tuple(files),
                      source=", ".join(str(p) for p in paths))


def _plain(x: Any) -> Any:
    """Numbers and containers as YAML writes them (numpy scalars as Python ones, tuples as lists)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x
