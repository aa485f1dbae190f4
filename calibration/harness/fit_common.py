"""Paths and the command the measured-data fits share (fit_measured.py and the modules it calls)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibration" / "data"
COMMAND = "python calibration/harness/fit_measured.py"
