"""Timeline construction: the three forms of op rows agree, and lost time is split by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ovsim.engine.timeline import timeline_from_rows

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
