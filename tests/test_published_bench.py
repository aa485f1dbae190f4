"""bench/published_jobs.py on one small published row: the row line and its ``--breakdown``, whose
parts must add up as a timeline does (one compute stream: its kernels cannot take longer than the
iteration), and the published iteration the throughput implies."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_breakdown_of_a_published_row_adds_up(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import published_jobs as pj
        from published_rows import FOUNDRY_ROWS
    finally:
        sys.path.remove(str(ROOT / "bench"))
    row = next(r for r in FOUNDRY_ROWS if r.name == "mpt-7b-h100-8g-s2048")
    assert pj.main(["--rows", row.name, "--mode", "analytic", "--breakdown"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "rank 0:" in x)
    seconds = {k: float(v) for k, v in re.findall(r"(GEMMs|attention|memory-bound|them|busy|iteration|published) "
                                                 r"([0-9.]+) s", line)}
    assert set(seconds) == {"GEMMs", "attention", "memory-bound", "them", "busy", "iteration", "published"}
    kernels = seconds["GEMMs"] + seconds["attention"] + seconds["memory-bound"]
    assert 0 < seconds["GEMMs"] < kernels <= seconds["iteration"] * 1.0001
    assert seconds["busy"] > 0
    # FSDP's pre-divides run beside the compute stream, on the post-backward stream.
    assert 0 < seconds["them"] < seconds["memory-bound"]
    # The published iteration: the row's micro-batches of tokens at its published tokens a second.
    tokens = row.micro_batch * row.accum * row.seq
    assert seconds["published"] == pytest.approx(tokens / row.published_tokens_per_s, rel=2e-3)
