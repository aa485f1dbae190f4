"""docs/published-runs.md's tables of published training runs give what ovsim predicts now: each
row cheap enough to run here (the SC'21 rows simulated by default, the 22B pair of Korthikanti et
al., llm-foundry's and NeMo's rows, the FlashAttention rows, MegaScale's and MLPerf's) is
predicted and its cells (ovsim's figure and the error against the published one) must read as the
prediction prints. A model change that moves a row fails here until docs/published-runs.md is
updated (`python bench/published_jobs.py --rows ROW [--mode analytic]` prints the figures). The
rows that take minutes (39B and up, 175B and up of Korthikanti et al.) are not run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ovsim import api

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
try:
    import fidelity_rows as fr
    import megascale_rows as ms
    import mlperf_rows as ml
    import published_rows as pr
finally:
    sys.path.remove(str(ROOT / "bench"))

NEMO_MODELS = {"gpt3-175b": "GPT-3 175B", "llama2-7b": "Llama 2 7B", "llama2-13b": "Llama 2 13B",
               "llama2-70b": "Llama 2 70B", "llama3-8b": "Llama 3 8B", "llama3-70b": "Llama 3 70B"}
GPU_NAMES = {"a100": "A100 80 GB", "h100": "H100"}


def _table_rows(text: str | None = None) -> list[list[str]]:
    """Every row of every table in ``text`` (docs/published-runs.md by default), as its cells."""
    if text is None:
        text = (ROOT / "docs" / "published-runs.md").read_text()
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and line.endswith(" |"):
            rows.append([c.strip() for c in line[2:-2].split(" | ")])
    return rows


def _find(match: Any) -> list[str]:
    found = [cells for cells in _table_rows() if match(cells)]
    assert len(found) == 1, f"{len(found)} rows of docs/published-runs.md match"
    return found[0]


def _predicted(row: Any, mode: str) -> tuple[float, str]:
    """The row's throughput per GPU and its error, as published_jobs.py prints them."""
    per_gpu = row.throughput(api.predict(row.scenario(), mode=mode, counters=False,
                                         max_ops=4_000_000).timeline.makespan_s)
    return per_gpu, f"{per_gpu / row.published - 1:+.1%}"


def _cases() -> Iterator[Any]:
    yield from (pytest.param(r, id=r.name) for r in pr.ROWS if r.name in ("1.7B", "3.6B", "7.5B", "18B"))
    yield from (pytest.param(r, id=r.name) for r in pr.FOUNDRY_ROWS + pr.NEMO_ROWS + pr.FLASH_ROWS)
    yield pytest.param("22B", id="k22B")
    yield from (pytest.param(r, id=r.name) for r in ms.MEGASCALE_ROWS)
    yield from (pytest.param(r, id=r.name) for r in ml.MLPERF_ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("row", list(_cases()))
def test_the_readme_row_is_what_ovsim_predicts(row: Any) -> None:
    if row == "22B":
        full, present = (r for r in pr.RECOMPUTE_ROWS if r.model == "22B" and r.dp == 1)
        cells = _find(lambda c: c[0] == "22B" and len(c) == 7)
        for (ovsim_cell, err_cell), r in ((cells[3:5], full), (cells[5:7], present)):
            per_gpu, err = _predicted(r, "analytic")
            assert (ovsim_cell.split(" / ")[0], err_cell) == (f"{per_gpu:.1f}", err), r.name
        return
    if isinstance(row, pr.Row):
        cells = _find(lambda c: c[0] == row.name and c[3] == "simulate")
        per_gpu, err = _predicted(row, "simulate")
        assert (cells[4], cells[6]) == (f"{per_gpu:.1f}", err)
    elif isinstance(row, pr.FoundryRow):
        label = f"MPT-{row.model.upper()}, seq {row.seq}"
        cells = _find(lambda c: c[0] == label and c[1] == f"{row.gpus} {GPU_NAMES[row.gpu]}")
        per_gpu, err = _predicted(row, "analytic")
        assert (cells[3], cells[5]) == (f"{per_gpu:,.0f}", err)
    elif isinstance(row, pr.NemoRow):
        label = f"NeMo {NEMO_MODELS[row.model]}"
        cells = _find(lambda c: c[0].startswith(label) and c[1] == f"{row.gpus} H100")
        per_gpu, err = _predicted(row, "analytic")
        assert (cells[3], cells[5]) == (f"{per_gpu:,.0f}", err)
    elif isinstance(row, ml.MlperfRow):
        cells = _find(lambda c: c[0] == f"{row.gpus:,}" and c[1] == f"{row.micro_batches} ({row.global_batch:,})")
        per_gpu, err = _predicted(row, "analytic")
        assert (cells[5], cells[6], cells[7]) == (f"{per_gpu:,.0f}", f"{row.published:,.0f}", err)
    elif isinstance(row, ms.MegaScaleRow):
        label = f"{row.gpus:,}" + ("" if row.global_batch in (768, 6144) else ", table 3's baseline")
        cells = _find(lambda c: c[0].startswith(label) and len(c) == 8 and c[1].startswith(f"{row.global_batch:,} ("))
        per_gpu, err = _predicted(row, "analytic")
        assert (cells[5], cells[6], cells[7]) == (f"{per_gpu:.1f}", f"{row.published:.1f}", err)
    else:
        cells = _find(lambda c: c[0].startswith(f"{row.model.upper()} (") and len(c) == 7)
        per_gpu, err = _predicted(row, "simulate")
        assert (cells[2], cells[4]) == (f"{per_gpu:,.0f}", err)


# Rows of docs/published-runs.md's "Both fidelities" table cheap enough to simulate here (a minute
# in all): the 8-GPU rows, one NeMo row and the largest jobs with the fewest micro-batches.
FIDELITY_CHECKED = ("mpt-13b-h100-8g-s2048", "mpt-7b-a100-8g-s2048", "flash-gpt3-355m", "nemo-llama2-7b-8g",
                    "llama3-16384-v2", "mlperf31-gpt3-10752")


def _fidelity_rows() -> dict[str, list[str]]:
    """The "Both fidelities" table's rows by the bench's row name."""
    text = (ROOT / "docs" / "published-runs.md").read_text()
    inside = text[text.index(fr.BEGIN):text.index(fr.END)]
    return {cells[1].strip("`"): cells for cells in _table_rows(inside) if cells[1].startswith("`")}


@pytest.mark.slow
@pytest.mark.parametrize("name", FIDELITY_CHECKED)
def test_the_fidelity_table_row_is_what_ovsim_predicts(name: str) -> None:
    row = fr.rows_by_name()[name]
    cells = _fidelity_rows()[name]
    errors = [f"{fr.predicted_error(row, mode)[0]:+.1%}" for mode in ("analytic", "simulate")]
    assert cells[4:6] == errors


@pytest.mark.slow
def test_the_fidelity_tables_counts_are_its_rows() -> None:
    """The summary under the table counts the table's own cells: 59 rows, the medians and the rows
    within 10% in each fidelity, as the docs quote them."""
    import statistics

    rows = _fidelity_rows()
    text = (ROOT / "docs" / "published-runs.md").read_text()
    assert len(rows) == 59
    for col, label in ((4, "analytic"), (5, "simulated")):
        errs = [float(c[col].rstrip("%")) / 100 for c in rows.values()]
        median = statistics.median(errs)
        within = sum(abs(e) <= 0.10 for e in errs)
        assert f"{label}: {min(errs):+.1%} to {max(errs):+.1%}, median {median:+.1%}, {within} within 10%" in text
