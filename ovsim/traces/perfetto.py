"""Export a Timeline as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and
chrome://tracing load.

One process per rank with one thread (track) per stream; a "collectives" process with one track
per collective flow; counter tracks per rank for SM occupancy, HBM and link bandwidth, the clock,
board power (``power_w``) and the SM clock in hertz (``sm_clock_hz``). Each slowed op carries, in
its args, its isolated time and how the time it lost splits between reasons, and its name gets the
main reason appended so it shows on the track itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ovsim.engine.timeline import REASONS, Timeline
from ovsim.errors import OvsimError
from ovsim.files import atomic_output

_US = 1e6


def _num(x: float) -> float:
    return round(float(x) * _US, 6)


def trace_events(timeline: Timeline, *, label: str = "ovsim") -> dict[str, Any]:
    """The timeline as trace events (the module's docstring). Read a column at a time from the
    timeline's arrays rather than through its frames' records, which took 2.6 of the 4.5 s of a
    150,000-op timeline's events."""
    col = timeline.op_column
    rank_col = np.asarray(col("rank"))
    ranks = sorted(int(r) for r in np.unique(rank_col[rank_col >= 0]))
    flow_pid = (max(ranks) + 1) if ranks else 0
    events: list[dict[str, Any]] = []
    for r in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
    _op_events(timeline, flow_pid, events)
    if ranks and (rank_col < 0).any():
        events.append({"ph": "M", "name": "process_name", "pid": flow_pid, "tid": 0,
                       "args": {"name": "collectives"}})
    cc = timeline.counter_column
    for t, rank, name, value in zip(*(np.asarray(cc(c)).tolist() for c in ("time_s", "rank", "counter", "value")),
                                    strict=True):
        events.append({"ph": "C", "name": str(name), "pid": int(rank), "tid": 0, "ts": _num(t),
                       "args": {"value": float(value)}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": label}}


def _op_events(timeline: Timeline, flow_pid: int, events: list[dict[str, Any]]) -> None:
    """Append an event for each op with finite times (a track's name first where it opens one)."""
    col = timeline.op_column
    names = ("start_s", "end_s", "rank", "stream", "name", "kind", "isolated_s", "slowdown", "launch_s", "blocks",
             "bytes", "slowed_by", *REASONS)
    columns = [np.asarray(col(c)).tolist() for c in names]
    tids: dict[tuple[int, str], int] = {}
    reasons = list(REASONS.items())
    for row in zip(*columns, strict=True):
        start, end, rank = float(row[0]), float(row[1]), int(row[2])
        if not (math.isfinite(start) and math.isfinite(end)):
            continue
        if rank >= 0:
            pid, key = rank, (rank, str(row[3]))
        else:
            pid, key = flow_pid, (flow_pid, str(row[4]))
        if key not in tids:
            tids[key] = len(tids) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[key],
                           "args": {"name": key[1] if rank >= 0 else f"flow {row[4]}"}})
        args: dict[str, Any] = {
            "kind": row[5], "isolated_us": _num(row[6]), "slowdown": round(float(row[7]), 4),
            "launch_us": _num(row[8]), "blocks": int(row[9]), "bytes": float(row[10]),
        }
        slowed_by = str(row[11])
        if slowed_by:
            args["slowed_by"] = slowed_by
            for (_, text), lost in zip(reasons, row[12:], strict=True):
                if float(lost) > 0:
                    args[f"{text} (us)"] = _num(lost)
        name = str(row[4]) + (f" [{slowed_by}]" if slowed_by else "")
        events.append({"ph": "X", "name": name, "cat": row[5], "pid": pid, "tid": tids[key],
                       "ts": _num(start), "dur": _num(end - start), "args": args})


def write_trace(timeline: Timeline, path: str | Path, *, label: str = "ovsim") -> None:
    write_json(trace_events(timeline, label=label), path)


def replay_trace_events(kernels: Any, *, label: str = "ovsim replay") -> dict[str, Any]:
    """Measured and predicted timelines side by side: for every rank a "measured" and a
    "predicted" process, each with one track per stream, in that order. ``kernels`` is a replay's
    per-kernel table (measured_/predicted_ start and duration, rank, stream, name, kind)."""
    events: list[dict[str, Any]] = []
    ranks = sorted(int(r) for r in kernels["rank"].unique())
    t0 = float(min(kernels["measured_start_s"].min(), kernels["predicted_start_s"].min())) if len(kernels) else 0.0
    for i, r in enumerate(ranks):
        for j, which in enumerate(("measured", "predicted")):
            pid = 2 * i + j
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": f"rank {r} {which}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    named: set[tuple[int, int]] = set()
    for rec in kernels.to_dict(orient="records"):
        i = ranks.index(int(rec["rank"]))
        tid = int(rec["stream"])
        for j, which in enumerate(("measured", "predicted")):
            start, dur = float(rec[f"{which}_start_s"]), float(rec[f"{which}_duration_s"])
            if not (math.isfinite(start) and math.isfinite(dur)):
                continue
            pid = 2 * i + j
            if (pid, tid) not in named:
                named.add((pid, tid))
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": f"stream {tid}"}})
            args = {"kind": rec["kind"], "overlapped": bool(rec["overlapped"]),
                    "measured_us": _num(rec["measured_duration_s"]), "predicted_us": _num(rec["predicted_duration_s"]),
                    "isolated_us": _num(rec["isolated_s"]), "isolated_source": str(rec["isolated_source"])}
            events.append({"ph": "X", "name": str(rec["name"]), "cat": str(rec["kind"]), "pid": pid, "tid": tid,
                           "ts": _num(start - t0), "dur": _num(dur), "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": label}}


def write_json(events: dict[str, Any], path: str | Path) -> None:
    try:
        with atomic_output(path) as tmp:
            tmp.write_text(json.dumps(events))
    except OSError as e:
        raise OvsimError(f"cannot write: {e.strerror}", source=str(path)) from None
