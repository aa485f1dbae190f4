"""Cross-stream waits in an Nsight Systems SQLite export, for :mod:`ovsim.traces.nsys`.

Explicit syncs (``TraceBundle.syncs``: ``rank``, ``waiting_stream``, ``waiting_after_s``,
``recorded_correlation``, plus ``inferred``) are derived one of two ways:

1. From CUPTI's own records, when the file has ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` and
   ``CUPTI_ACTIVITY_KIND_CUDA_EVENT`` (CUpti_ActivitySynchronization / CUpti_ActivityCudaEvent: both
   carry ``streamId``, ``eventId``, ``correlationId``). Each sync row of type STREAM_WAIT_EVENT
   (``syncType`` through ``ENUM_CUPTI_SYNC_TYPE``, else CUPTI's value 2) is a wait: ``waiting_stream``
   is its ``streamId`` and ``waiting_after_s`` the host start of its ``cudaStreamWaitEvent`` (the
   runtime row with its correlation id, else the sync row's ``start``). The event record it waits
   on is the latest CUDA_EVENT row of the same process and ``eventId`` with a smaller correlation id
   (correlation ids grow in API-call order within a process), and ``recorded_correlation`` is the
   correlation id of the GPU activity last launched on that record's stream before it (largest smaller
   correlation id). ``inferred`` is False.
2. Otherwise from the runtime calls alone. ``CUPTI_ACTIVITY_KIND_RUNTIME`` has no stream or event
   handle column (only start, end, eventClass, globalTid, correlationId, nameId, returnValue,
   callchainId), so the streams are inferred from the launch order of the calling host thread: for
   each ``cudaStreamWaitEvent*``/``cuStreamWaitEvent*`` call (``nameId`` -> ``StringIds``), the event
   is taken as the latest ``cudaEventRecord*``/``cuEventRecord*`` of the same thread before it,
   ``recorded_correlation`` is the activity that thread launched last before that record call,
   ``waiting_stream`` the stream of the first activity that thread launched after the wait, and
   ``waiting_after_s`` the wait's host start. This is right for the usual pattern (record after the
   producer's launches, wait just before the consumer's) and wrong when a thread records on a stream
   it did not launch on last; such rows have ``inferred`` True. Rows whose two streams come out
   equal are dropped (counted as ``"sync: inferred streams equal"``).

Waits whose record, recorded activity or waiting stream cannot be found are dropped and counted under
``"sync: ..."`` keys of ``skipped``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ovsim.traces.nsys_db import NS, PROC_SHIFT, NsysDb, count_skipped

SYNCHRONIZATION = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
CUDA_EVENT = "CUPTI_ACTIVITY_KIND_CUDA_EVENT"
_STREAM_WAIT_EVENT = 2  # CUpti_ActivitySynchronizationType
RECORD_CALL = re.compile(r"^(?:cuda|cu)EventRecord")
WAIT_CALL = re.compile(r"^(?:cuda|cu)StreamWaitEvent")


def read_syncs(db: NsysDb, act: pd.DataFrame, runtime: pd.DataFrame, rank_of: dict[int, int],
           skipped: dict[str, int]) -> pd.DataFrame | None:
    exact = (db.has_columns(SYNCHRONIZATION, ("streamId", "eventId", "correlationId"))
             and db.has_columns(CUDA_EVENT, ("streamId", "eventId", "correlationId")))
    rows = _exact_syncs(db, act, runtime, rank_of, skipped) if exact else _inferred_syncs(act, runtime, skipped)
    if rows is None:
        return None
    rows = rows.loc[rows["proc"].map(lambda x: int(x) in rank_of)]
    out = pd.DataFrame({
        "rank": pd.array([rank_of[int(x)] for x in rows["proc"].tolist()], dtype="Int64"),
        "waiting_stream": pd.array(rows["waiting_stream"].tolist(), dtype="Int64"),
        "waiting_after_s": rows["wait_ns"].to_numpy(dtype=float) * NS,
        "recorded_correlation": pd.array(rows["recorded_correlation"].tolist(), dtype="Int64"),
        "inferred": np.full(len(rows), not exact, dtype=bool),
    })
    return out.sort_values(["rank", "waiting_after_s"], kind="stable").reset_index(drop=True)



def _asof(left: pd.DataFrame, right: pd.DataFrame, on: str, by: list[str], direction: str) -> pd.DataFrame:
    """merge_asof on int64 keys with strictly earlier/later matches (pandas needs both sides sorted)."""
    left = left.assign(**{on: left[on].astype("int64")}).sort_values(on, kind="stable")
    right = right.assign(**{on: right[on].astype("int64")}).sort_values(on, kind="stable")
    for b in by:
        left[b] = left[b].astype("int64")
        right[b] = right[b].astype("int64")
    return pd.merge_asof(left, right, on=on, by=by, direction="backward" if direction == "backward" else "forward",
                         allow_exact_matches=False)


def _exact_syncs(db: NsysDb, act: pd.DataFrame, runtime: pd.DataFrame, rank_of: dict[int, int],
                 skipped: dict[str, int]) -> pd.DataFrame | None:
    lone = next(iter(rank_of)) if len(rank_of) == 1 else None

    def procs(df: pd.DataFrame, table: str) -> pd.Series:
        # With one process there is nothing to tell apart (and the activity may lack globalPid).
        if "globalPid" in df.columns and lone is None:
            return (db.ints(df, table, "globalPid") // PROC_SHIFT).astype("Int64")
        return pd.Series(pd.array([lone] * len(df), dtype="Int64"), index=df.index)

    sync = db.read(SYNCHRONIZATION, ("streamId", "eventId", "correlationId"), ("start", "globalPid", "syncType"))
    types = db.enum("ENUM_CUPTI_SYNC_TYPE")
    wait_ids = {k for k, v in types.items() if "STREAM_WAIT_EVENT" in v.upper().replace(" ", "_")} or {
        _STREAM_WAIT_EVENT}
    stype = db.ints(sync, SYNCHRONIZATION, "syncType")
    is_wait = stype.isin(list(wait_ids)).fillna(False).to_numpy(dtype=bool)
    sync = sync.loc[is_wait]
    waits = pd.DataFrame({"proc": procs(sync, SYNCHRONIZATION),
                          "waiting_stream": db.ints(sync, SYNCHRONIZATION, "streamId"),
                          "event": db.ints(sync, SYNCHRONIZATION, "eventId"),
                          "correlation": db.ints(sync, SYNCHRONIZATION, "correlationId"),
                          "sync_start": db.ints(sync, SYNCHRONIZATION, "start")})
    if waits.empty:
        return None
    host = runtime.loc[runtime["correlation"].notna(), ["proc", "correlation", "start_ns"]].drop_duplicates(
        ["proc", "correlation"])
    waits = waits.merge(host, on=["proc", "correlation"], how="left")
    waits["wait_ns"] = waits["start_ns"].fillna(waits["sync_start"])
    ok = waits[["proc", "waiting_stream", "event", "correlation", "wait_ns"]].notna().all(axis=1)
    count_skipped(skipped, "sync: wait without stream, event or time", int((~ok).sum()))
    waits = waits.loc[ok, ["proc", "waiting_stream", "event", "correlation", "wait_ns"]]

    ev = db.read(CUDA_EVENT, ("streamId", "eventId", "correlationId"), ("globalPid",))
    records = pd.DataFrame({"proc": procs(ev, CUDA_EVENT), "event": db.ints(ev, CUDA_EVENT, "eventId"),
                            "record_stream": db.ints(ev, CUDA_EVENT, "streamId"),
                            "correlation": db.ints(ev, CUDA_EVENT, "correlationId")}).dropna()
    records["record_corr"] = records["correlation"]
    paired = _asof(waits, records, "correlation", ["proc", "event"], "backward")
    found = paired["record_corr"].notna()
    count_skipped(skipped, "sync: wait on an event recorded before the trace", int((~found).sum()))
    paired = paired.loc[found].drop(columns=["correlation"]).rename(columns={"record_corr": "correlation"})

    launched = act.loc[act["correlation"].notna(), ["proc", "stream", "correlation"]].rename(
        columns={"stream": "record_stream"})
    launched = launched.assign(recorded_correlation=launched["correlation"])
    done = _asof(paired, launched, "correlation", ["proc", "record_stream"], "backward")
    found = done["recorded_correlation"].notna()
    count_skipped(skipped, "sync: event recorded on an idle stream", int((~found).sum()))
    return done.loc[found]


def _inferred_syncs(act: pd.DataFrame, runtime: pd.DataFrame, skipped: dict[str, int]) -> pd.DataFrame | None:
    calls = runtime.loc[runtime["tid"].notna() & runtime["start_ns"].notna()]
    waits = calls.loc[calls["call"] == "wait", ["proc", "tid", "start_ns"]].rename(columns={"start_ns": "t"})
    if waits.empty:
        return None
    records = calls.loc[calls["call"] == "record", ["tid", "start_ns"]].rename(columns={"start_ns": "t"})
    records = records.assign(record_t=records["t"])
    launched = act.loc[act["tid"].notna() & act["launch_ns"].notna() & act["correlation"].notna(),
                       ["tid", "launch_ns", "stream", "correlation"]].rename(columns={"launch_ns": "t"})
    paired = _asof(waits.assign(wait_ns=waits["t"]), records, "t", ["tid"], "backward")
    found = paired["record_t"].notna()
    count_skipped(skipped, "sync: wait without an earlier event record", int((~found).sum()))
    paired = paired.loc[found]
    # The record's stream is taken as the one the thread launched on last before recording.
    before = _asof(paired.assign(t=paired["record_t"]), launched.rename(
        columns={"stream": "record_stream", "correlation": "recorded_correlation"}), "t", ["tid"], "backward")
    after = _asof(before.assign(t=before["wait_ns"]), launched.rename(
        columns={"stream": "waiting_stream", "correlation": "next_correlation"}), "t", ["tid"], "forward")
    ok = after["recorded_correlation"].notna() & after["waiting_stream"].notna()
    count_skipped(skipped, "sync: no launch around the event record or wait", int((~ok).sum()))
    after = after.loc[ok]
    same = (after["record_stream"] == after["waiting_stream"]).to_numpy(dtype=bool)
    count_skipped(skipped, "sync: inferred streams equal", int(same.sum()))
    return after.loc[~same]
