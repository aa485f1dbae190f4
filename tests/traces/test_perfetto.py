"""The Perfetto export (ovsim.traces.perfetto.trace_events) on a timeline written by hand: times in
microseconds, a track a rank's stream and one a flow, what slowed an op in its name and args, an op
that never ran left out, and each counter sample an event. The same events whether the timeline
holds columns or frames."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from ovsim.engine.timeline import Timeline, timeline_from_rows
from ovsim.traces.perfetto import trace_events

ROW = {"name": "g", "kind": "gemm", "rank": 0, "stream": "compute", "launch_s": 0.0, "start_s": 1e-3,
       "end_s": 3e-3, "isolated_s": 1e-3, "wait_sm_s": 1e-3, "share_sm_s": 0.0, "share_hbm_s": 0.0,
       "share_link_s": 0.0, "wait_peers_s": 0.0, "clock_s": 0.0, "blocks": 132, "bytes": 0.0}


def _timeline(frames: bool) -> Timeline:
    rows = [dict(ROW, id="g@0"),
            dict(ROW, id="ar@1", name="ar", kind="collective", rank=1, stream="comm", wait_sm_s=0.0, end_s=2e-3),
            dict(ROW, id="ar", name="ar", kind="flow", rank=-1, stream="", wait_sm_s=0.0, end_s=2e-3),
            dict(ROW, id="never@0", name="never", start_s=math.nan, end_s=math.nan)]
    counters = [{"time_s": 0.0, "rank": 0, "counter": "power_w", "value": 500.0},
                {"time_s": 2e-3, "rank": 1, "counter": "sm_clock_hz", "value": 1.5e9}]
    tl = timeline_from_rows(pd.DataFrame(rows), pd.DataFrame(counters))
    if frames:
        assert len(tl.ops) == 4 and len(tl.counters) == 2  # the frames made
    return tl


@pytest.mark.parametrize("frames", [False, True])
def test_trace_events_by_hand(frames: bool) -> None:
    events: list[dict[str, Any]] = trace_events(_timeline(frames))["traceEvents"]
    assert sorted(e["name"] for e in events if e["ph"] == "X") == ["ar", "ar", "g [waiting for SMs]"]
    g = next(e for e in events if e["ph"] == "X" and e["name"] == "g [waiting for SMs]")
    assert (g["pid"], g["ts"], g["dur"]) == (0, 1000.0, 2000.0)
    assert g["args"]["slowed_by"] == "waiting for SMs" and g["args"]["waiting for SMs (us)"] == 1000.0
    assert g["args"]["isolated_us"] == 1000.0 and g["args"]["slowdown"] == 2.0 and g["args"]["blocks"] == 132
    flows = [e for e in events if e["ph"] == "X" and e["pid"] == 2]  # the flow's process after ranks 0 and 1
    assert len(flows) == 1 and flows[0]["dur"] == 1000.0
    tracks = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert tracks == {(0, "compute"), (1, "comm"), (2, "flow ar")}
    assert [(e["name"], e["pid"], e["ts"], e["args"]["value"]) for e in events if e["ph"] == "C"] == [
        ("power_w", 0, 0.0, 500.0), ("sm_clock_hz", 1, 2000.0, 1.5e9)]
    assert not any("never" in e["name"] for e in events)


def test_columns_and_frames_give_the_same_events() -> None:
    assert trace_events(_timeline(False)) == trace_events(_timeline(True))
