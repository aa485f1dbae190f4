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


def test_validate_command_with_one_trace(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if not TRACES.exists():
        pytest.skip(f"shared traces not found at {TRACES}")
    monkeypatch.setattr(validate, "TRACE_CASES", (("param/et_replay/tests/inputs/dlrm_kineto.tar.gz", None),))
    assert main(["validate", "--traces", str(TRACES), "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    names = [c["name"] for c in checks]
    assert any("dlrm_kineto.tar.gz: span" in n for n in names)
    span = next(c for c in checks if c["name"].endswith(": span"))
    assert span["passed"] and span["group"] == "trace (held out)"


def test_validate_rejects_a_missing_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--traces", "no/such/folder"]) == 2
    assert "no/such/folder" in capsys.readouterr().err
