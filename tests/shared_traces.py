"""Where the tests find the public traces the docs cite (the Holistic Trace Analysis, TraceLens,
PARAM and Echo files, each at its path in its upstream repository), read in place, never copied:
the folder ``OVSIM_TRACES`` names, else ``shared/traces`` beside the repository's folder. Tests
that need one skip where it is not there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TRACES = Path(os.environ.get("OVSIM_TRACES") or Path(__file__).resolve().parents[1].parent / "shared" / "traces")


def real(rel: str) -> Path:
    """The shared trace at ``rel`` (skip the test where it is not there)."""
    p = TRACES / rel
    if not p.exists():
        pytest.skip(f"shared trace {rel} not present at {TRACES} (a copy of its upstream repository's file; "
                    "OVSIM_TRACES names the folder)")
    return p


def traces() -> Path:
    """The shared traces' folder (skip the test where it is not there)."""
    if not TRACES.exists():
        pytest.skip(f"shared traces not found at {TRACES} (OVSIM_TRACES names the folder)")
    return TRACES
