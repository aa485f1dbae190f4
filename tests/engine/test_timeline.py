"""Timeline construction: the three forms of op rows agree, lost time is split by hand, and the
columns read the same with or without the frames."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ovsim.engine.timeline import COUNTER_COLUMNS, OP_COLUMNS, REASONS, Timeline, on_ranks, timeline_from_rows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gemm-allreduce-h100x4-priority.yaml"

ROW = {"id": "a", "name": "a", "kind": "gemm", "rank": 0, "stream": "s", "launch_s": 0.0, "start_s": 1.0,
       "end_s": 3.0, "isolated_s": 1.0, "wait_sm_s": 0.5, "share_sm_s": 0.0, "share_hbm_s": 1.5,
       "share_link_s": 0.0, "wait_peers_s": 0.0, "clock_s": 0.0, "blocks": 4, "bytes": 8.0}


@pytest.mark.parametrize("form", ["dicts", "frame", "columns"])
def test_lost_time_split_in_proportion(form: str) -> None:
    # Ran 2 s against 1 s alone: the 1 s lost splits 0.5 : 1.5 between the raw reasons.
    rows = [ROW, {**ROW, "id": "b", "end_s": 1.5, "wait_sm_s": 0.0, "share_hbm_s": 0.0, "clock_s": -0.5}]
    given = {"dicts": rows, "frame": pd.DataFrame(rows),
             "columns": {c: np.array([r[c] for r in rows]) for c in ROW}}[form]
    ops = timeline_from_rows(given, []).ops  # type: ignore[arg-type]
    a, b = ops.iloc[0], ops.iloc[1]
    assert (a["duration_s"], a["slowdown"]) == (2.0, 2.0)
    assert (a["wait_sm_s"], a["share_hbm_s"], a["clock_s"]) == pytest.approx((0.25, 0.75, 0.0))
    assert a["slowed_by"] == "sharing HBM"
    # 0.5 s ahead of its time alone: all of it the clock's gain, nothing lost.
    assert (b["clock_s"], b["wait_sm_s"], b["slowed_by"]) == (-0.5, 0.0, "")
    assert list(ops["rank"]) == [0, 0] and ops["bytes"].dtype == float


def test_no_rows() -> None:
    assert timeline_from_rows({c: [] for c in ROW}, []).ops.empty
    assert timeline_from_rows([], []).ops.empty


def _two_ranks() -> Timeline:
    rows = [ROW, {**ROW, "id": "b", "rank": 1, "stream": "t", "kind": "flow", "end_s": 9.0}]
    counters = {"time_s": np.array([0.0, 1.0]), "rank": np.array([0, 1]),
                "counter": ["power_w", "power_w"], "value": np.array([100.0, 200.0])}
    return timeline_from_rows({c: [r[c] for r in rows] for c in ROW}, counters)


def test_columns_read_the_same_before_and_after_the_frame_is_made() -> None:
    tl = _two_ranks()
    before = {c: tl.op_column(c).tolist() for c in OP_COLUMNS}
    makespan = tl.makespan_s
    frame = tl.ops  # made now, from the columns
    assert list(frame.columns) == OP_COLUMNS and len(frame) == tl.n_ops == 2
    assert {c: tl.op_column(c).tolist() for c in OP_COLUMNS} == before
    assert {c: frame[c].tolist() for c in OP_COLUMNS} == before
    # The flow's end (9 s) is not a rank's: the makespan ends with the kernel.
    assert makespan == tl.makespan_s == 3.0
    assert tl.counters["value"].tolist() == tl.counter_column("value").tolist() == [100.0, 200.0]


@pytest.mark.parametrize("framed", [False, True])
def test_on_ranks_renumbers_columns_and_frames_alike(framed: bool) -> None:
    tl = _two_ranks()
    if framed:
        tl = Timeline(ops=tl.ops.assign(extra=[1, 2]), counters=tl.counters)
    moved = on_ranks(tl, [5, 7])
    assert moved.op_column("rank").tolist() == [5, 7]
    assert moved.counter_column("rank").tolist() == [5, 7]
    # A frame keeps columns of its own.
    assert ("extra" in moved.ops.columns) == framed
    with pytest.raises(ValueError, match="rank 1 is beyond the 1 ranks given"):
        on_ranks(tl, [5])


def test_on_ranks_keeps_a_flows_rank() -> None:
    rows = [ROW, {**ROW, "id": "f", "kind": "flow", "rank": -1}]
    tl = timeline_from_rows({c: [r[c] for r in rows] for c in ROW}, [])
    assert on_ranks(tl, [3]).op_column("rank").tolist() == [3, -1]


def test_a_timeline_takes_ops_and_counters_once_each() -> None:
    tl = _two_ranks()
    with pytest.raises(TypeError):
        Timeline(ops=tl.ops, op_data=tl.op_data(), counters=tl.counters)
    with pytest.raises(TypeError):
        Timeline(op_data=tl.op_data())
    assert tl.with_counters({c: [] for c in COUNTER_COLUMNS}).counters.empty


def test_a_prediction_and_its_table_do_not_import_pandas() -> None:
    # pandas (with pyarrow) was most of a small prediction's start-up: the summary, power figures
    # and the command's table read the timeline's columns.
    code = ("import sys, contextlib, io\n"
            "from ovsim.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['predict', {str(EXAMPLE)!r}]) == 0\n"
            "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_timelines_that_share_columns_do_not_write_into_each_other() -> None:
    tl = _two_ranks()
    moved = on_ranks(tl, [5, 7])
    moved.ops.loc[0, "start_s"] = 99.0
    assert tl.ops["start_s"].iloc[0] == 1.0
    other = _two_ranks()
    again = on_ranks(other, [5, 7])
    other.ops.loc[0, "end_s"] = 99.0
    assert again.ops["end_s"].iloc[0] == 3.0


def test_frames_do_not_depend_on_what_was_read_first() -> None:
    counters = {c: [] for c in COUNTER_COLUMNS}
    rows = {c: [ROW[c]] for c in ROW}
    first = timeline_from_rows(rows, counters)
    read = timeline_from_rows(rows, counters)
    for c in OP_COLUMNS:
        read.op_column(c)
    read.counter_column("rank")
    assert first.ops.dtypes.to_dict() == read.ops.dtypes.to_dict()
    assert first.counters.dtypes.to_dict() == read.counters.dtypes.to_dict()
    # A number left out is NaN, as a frame reads it.
    two = {c: [ROW[c], ROW[c]] for c in ROW}
    gap = timeline_from_rows({**two, "id": ["a", "b"], "bytes": [8.0, None]}, counters)
    assert np.isnan(gap.op_column("bytes")[1]) and np.isnan(gap.ops["bytes"].iloc[1])


def _lost_time_as_rows(rows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The reasons' split and ``slowed_by`` by the rule's (ops, reasons) array form: NaN as 0, the
    clock's gain kept (but round-off, and no more than the op's lead), every other reason at least
    0 and scaled to split the rest of the time lost, the largest reason the first of equals."""
    names = list(REASONS)
    raw = np.column_stack([rows[c] for c in names])
    raw[np.isnan(raw)] = 0.0
    iso = rows["isolated_s"]
    net = rows["end_s"] - rows["start_s"] - iso
    clock = raw[:, names.index("clock_s")]
    gained = np.where(clock <= 0.0, clock, 0.0)
    gained = np.where(net >= gained, gained, net)
    gained = np.where(gained < -1e-9 * iso, gained, 0.0)
    raw[raw < 0.0] = 0.0
    total = raw.sum(axis=1)
    lost = np.where(net - gained >= 0.0, net - gained, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = lost / np.where(total > 0, total, np.nan)
    scale[np.isnan(scale)] = 0.0
    raw *= scale[:, None]
    raw[:, names.index("clock_s")] += gained
    texts = np.array([REASONS[c] for c in names], dtype=object)
    slowed = (net > 0.01 * iso) & (raw.max(axis=1) > 0)
    return raw, np.where(slowed, texts[raw.argmax(axis=1)], "")


def test_lost_time_by_column_agrees_with_the_rules_array_form() -> None:
    """The reasons are split column by column (a column no op lost time to stays zeros never
    written); the split and slowed_by are the (ops, reasons) array form's, bit for bit, over
    random rows with NaN, ties, negative clocks and all-zero columns."""
    rng = np.random.default_rng(7)
    n = 4000
    rows: dict[str, np.ndarray] = {c: np.zeros(n) for c in REASONS}
    rows["wait_sm_s"] = np.where(rng.random(n) < 0.5, rng.random(n), 0.0)
    rows["share_hbm_s"] = np.where(rng.random(n) < 0.3, rng.random(n), -rng.random(n))
    rows["share_hbm_s"][rng.random(n) < 0.05] = np.nan
    rows["share_hbm_s"][:50] = rows["wait_sm_s"][:50]  # ties: the first reason leads
    rows["clock_s"] = rng.normal(0.0, 0.5, n)
    rows["start_s"] = rng.random(n)
    rows["end_s"] = rows["start_s"] + rng.random(n) * 2.0
    rows["isolated_s"] = rng.random(n)
    given = {**ROW, **rows, **{c: np.full(n, v) for c, v in ROW.items() if c not in rows}}
    before = {c: rows[c].copy() for c in REASONS}
    tl = timeline_from_rows(given, [])
    expect, slowed_by = _lost_time_as_rows(rows)
    for j, c in enumerate(REASONS):
        assert np.array_equal(tl.op_column(c), expect[:, j], equal_nan=True), c
        np.testing.assert_array_equal(rows[c], before[c])  # the caller's columns are not written
    assert tl.op_column("slowed_by").tolist() == slowed_by.tolist()
    assert not tl.op_column("share_sm_s").any() and tl.op_column("share_sm_s") is not rows["share_sm_s"]
