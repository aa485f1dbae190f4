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

from ovsim.engine.timeline import REASONS, Timeline
from ovsim.errors import OvsimError
from ovsim.files import atomic_output

_US = 1e6


def _num(x: float) -> float:
    return round(float(x) * _US, 6)


def trace_events(timeline: Timeline, *, label: str = "ovsim") -> dict[str, Any]:
    ops = timeline.ops
    events: list[dict[str, Any]] = []
    ranks = sorted(int(r) for r in ops.loc[ops["rank"] >= 0, "rank"].unique())
    flow_pid = (max(ranks) + 1) if ranks else 0
    tids: dict[tuple[int, str], int] = {}
    for r in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
    records = [{str(k): v for k, v in r.items()} for r in ops.to_dict(orient="records")]
    for rec in records:
        start, end, rank = float(rec["start_s"]), float(rec["end_s"]), int(rec["rank"])
        if not (math.isfinite(start) and math.isfinite(end)):
            continue
        if rank >= 0:
            pid, key = rank, (rank, str(rec["stream"]))
        else:
            pid, key = flow_pid, (flow_pid, str(rec["name"]))
        if key not in tids:
            tids[key] = len(tids) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[key],
                           "args": {"name": key[1] if rank >= 0 else f"flow {rec['name']}"}})
        args: dict[str, Any] = {
            "kind": rec["kind"], "isolated_us": _num(rec["isolated_s"]), "slowdown": round(float(rec["slowdown"]), 4),
            "launch_us": _num(rec["launch_s"]), "blocks": int(rec["blocks"]), "bytes": float(rec["bytes"]),
        }
        slowed_by = str(rec["slowed_by"])
        if slowed_by:
            args["slowed_by"] = slowed_by
            for col, text in REASONS.items():
                lost = float(rec[col])
                if lost > 0:
                    args[f"{text} (us)"] = _num(lost)
        name = str(rec["name"]) + (f" [{slowed_by}]" if slowed_by else "")
        events.append({"ph": "X", "name": name, "cat": rec["kind"], "pid": pid, "tid": tids[key],
                       "ts": _num(start), "dur": _num(end - start), "args": args})
    if ranks and (ops["rank"] < 0).any():
        events.append({"ph": "M", "name": "process_name", "pid": flow_pid, "tid": 0,
                       "args": {"name": "collectives"}})
    counters = [{str(k): v for k, v in r.items()} for r in timeline.counters.to_dict(orient="records")]
    for c in counters:
        events.append({"ph": "C", "name": str(c["counter"]), "pid": int(c["rank"]), "tid": 0,
                       "ts": _num(c["time_s"]), "args": {"value": float(c["value"])}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": label}}


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
