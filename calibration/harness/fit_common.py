"""Paths, the command and the data sets the measured-data fits share (fit_measured.py and the
modules it calls): which data set each fit reads is calibration/data/registry.yaml's ``fits``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ovsim.validate.datasets import fit_sets

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibration" / "data"
COMMAND = "python calibration/harness/fit_measured.py"


def fit_set(fit: str) -> dict[str, str]:
    """GPU -> the data set ``fit`` reads (registry.yaml's ``fits``), in the registry's order."""
    return {gpu: str(e["set"]) for gpu, e in fit_sets(fit).items()}


def fit_pair(fit: str, second: str = "with") -> dict[str, tuple[str, Any]]:
    """GPU -> (the data set ``fit`` reads, the entry's ``second`` data set or None: ``with``, the
    second one it reads, or ``held_out``, the repeat it scores itself on)."""
    return {gpu: (str(e["set"]), e.get(second)) for gpu, e in fit_sets(fit).items()}
