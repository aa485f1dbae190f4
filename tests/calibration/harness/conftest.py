"""The harness's host-side scripts live outside the package; tests import them from their folder."""

from __future__ import annotations

import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[3] / "calibration" / "harness"
if str(HARNESS) not in sys.path:
    sys.path.insert(0, str(HARNESS))
