"""The validation suite: its rows, rules and the command's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ovsim import validate
from ovsim.cli import main
from ovsim.validate import Check

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def test_rules() -> None:
    assert Check("x", "g", 100.0, 109.0, "u", 10.0, "s").passed
    assert not Check("x", "g", 100.0, 111.0, "u", 10.0, "s").passed
    assert Check("m", "g", 10.0, 9.0, "% MAPE", 0.0, "s", rule="at_most").passed
    assert not Check("m", "g", 10.0, 11.0, "% MAPE", 0.0, "s", rule="at_most").passed


def test_nccl_figures_are_predicted_within_tolerance() -> None:
    """Bus bandwidths from NCCL's tuning model against nccl-tests measurements (not fitted to them)."""
    rows = [c for c in validate.published_checks() if c.group == validate.PREDICTED]
    assert len(rows) == 3 and all(c.passed for c in rows)


def test_validate_command_holds_each_trace_out(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    if not TRACES.exists():
        pytest.skip(f"shared traces not found at {TRACES}")
    monkeypatch.setattr(validate, "TRACE_CASES", (
        ("param/et_replay/tests/inputs/dlrm_kineto.tar.gz", None),
        ("HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz", "a100-sxm4-80gb")))
    assert main(["validate", "--traces", str(TRACES), "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    span = next(c for c in checks if c["name"] == "dlrm_kineto.tar.gz: span")
    assert span["passed"] and span["group"] == validate.HELD_OUT
    # Held out: contention refitted on the other trace only; the fit row is labelled a fit.
    held = [c for c in checks if c["group"] == validate.HELD_OUT and "MAPE" in c["name"]]
    assert len(held) == 2 and all("fitted on 1 other traces" in c["note"] for c in held)
    fit = [c for c in checks if c["group"] == validate.FIT]
    assert len(fit) == 2 and all("fit error" in c["note"] for c in fit)


def test_validate_rejects_a_missing_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--traces", "no/such/folder"]) == 2
    assert "no/such/folder" in capsys.readouterr().err
