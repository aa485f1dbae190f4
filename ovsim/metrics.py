"""Overlap metrics computed the same way from any timeline, simulated or measured.

One function serves both: it takes a simulated Timeline's ops (``end_s``) or a measured kernel table
(``duration_s``, :mod:`ovsim.traces.table`). Communication hidden under compute follows Holistic
Trace Analysis's definition (``get_comm_comp_overlap``): the time in which some communication kernel
and some compute kernel of the same rank both run, over the union of communication intervals.
Copies and memsets count as neither, as in HTA's memory category: the table's ``copy`` and
``memset`` and the engine's ``transfer`` (a copy-engine flow: a replayed memcpy or memset, a
scenario's copy). NCCL kernels, pipeline send/recv included, are ``collective`` in both and count as
communication, and so does a scenario's collective run on copy engines (its ops are ``collective``
too, though a profiler would record its copies as memcpys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

# HTA's categories (get_kernel_type): NCCL kernels are communication; memcpy and memset, memory.
COMM_KINDS = {"collective"}
COPY_KINDS = {"transfer", "copy", "memset"}
NON_COMPUTE = COMM_KINDS | COPY_KINDS | {"flow", "delay"}


def union_intervals(starts: np.ndarray, ends: np.ndarray) -> list[tuple[float, float]]:
    """Merge [start, end) intervals into disjoint sorted ones."""
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, dtype=float)[order], np.asarray(ends, dtype=float)[order]
    keep = e > s
    s, e = s[keep], e[keep]
    if not len(s):
        return []
    # An interval opens a new one where it starts after every end before it (the running
    # maximum); each merged one ends at the running maximum just before the next opens.
    reach = np.maximum.accumulate(e)
    opens = np.flatnonzero(np.concatenate(([True], s[1:] > reach[:-1])))
    closes = np.concatenate((opens[1:] - 1, [len(s) - 1]))
    return list(zip(s[opens].tolist(), reach[closes].tolist(), strict=True))


def _length(iv: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in iv)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class RankOverlap:
    rank: int
    span_s: float
    compute_busy_s: float
    comm_busy_s: float
    overlapped_s: float

    @property
    def exposed_comm_s(self) -> float:
        return self.comm_busy_s - self.overlapped_s

    @property
    def comm_hidden_fraction(self) -> float:
        return self.overlapped_s / self.comm_busy_s if self.comm_busy_s > 0 else 0.0

    @property
    def idle_s(self) -> float:
        return self.span_s - (self.compute_busy_s + self.comm_busy_s - self.overlapped_s)


def _getter(ops: Any) -> tuple[Callable[[str], np.ndarray], int]:
    """A column reader over a kernel table, a timeline's ``ops`` or a timeline itself (whose
    columns are read without making its frame), and its row count. ``end_s`` is ``start_s +
    duration_s`` where a table has no such column."""
    if hasattr(ops, "op_column"):
        return ops.op_column, int(ops.n_ops)
    frame = ops

    def get(name: str) -> np.ndarray:
        if name == "end_s" and "end_s" not in frame.columns:
            return np.asarray(frame["start_s"].to_numpy(float) + frame["duration_s"].to_numpy(float))
        return np.asarray(frame[name].to_numpy())

    return get, len(frame)


def rank_overlap(ops: pd.DataFrame | Any) -> list[RankOverlap]:
    """Per rank: busy time of compute and communication, their overlap, exposed comm and idle time.
    ``ops``: a kernel table, a timeline's ``ops``, or a timeline itself."""
    get, _ = _getter(ops)
    kind = get("kind")
    rank_all = get("rank")
    keep = (rank_all >= 0) & (kind != "delay")
    rank = rank_all[keep].astype(np.int64)
    start, end = get("start_s").astype(float)[keep], get("end_s").astype(float)[keep]
    is_comm = np.isin(kind, list(COMM_KINDS))[keep]
    is_comp = ~np.isin(kind, list(NON_COMPUTE))[keep]
    t0 = float(start.min()) if len(start) else 0.0
    # Each rank's rows in their order in the table (a stable sort), as a group-by gives them.
    order = np.argsort(rank, kind="stable")
    ranks, firsts = np.unique(rank[order], return_index=True)
    out = []
    for r, mine in zip(ranks, np.split(order, firsts[1:]), strict=True):
        c, k = mine[is_comm[mine]], mine[is_comp[mine]]
        ci = union_intervals(start[c], end[c])
        ki = union_intervals(start[k], end[k])
        out.append(RankOverlap(rank=int(r), span_s=float(end[mine].max()) - t0, compute_busy_s=_length(ki),
                               comm_busy_s=_length(ci), overlapped_s=_intersection(ci, ki)))
    return out


STREAM_COLUMNS = ["rank", "stream", "busy_s", "ops"]


def stream_busy_rows(ops: pd.DataFrame | Any) -> list[dict[str, Any]]:
    """Busy time (union of op intervals) and op count per rank and stream, sorted by rank and
    stream: ``ops`` a kernel table, a timeline's ``ops`` or a timeline itself."""
    get, n = _getter(ops)
    if n == 0:
        return []
    rank_all = get("rank")
    rows = np.flatnonzero(rank_all >= 0)
    rank = rank_all[rows]
    stream = get("stream")[rows]
    start, end = get("start_s").astype(float)[rows], get("end_s").astype(float)[rows]
    out: list[dict[str, Any]] = []
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, key in enumerate(zip(rank.tolist(), stream.tolist(), strict=True)):
        if not _missing(key[1]):  # as a group-by, which leaves rows without a key out
            groups.setdefault(key, []).append(i)
    try:
        keys = sorted(groups)
    except TypeError:  # streams named by numbers and by words in one table
        keys = sorted(groups, key=lambda k: (k[0], str(k[1])))
    for (r, s) in keys:
        mine = np.asarray(groups[(r, s)], dtype=np.int64)
        iv = union_intervals(start[mine], end[mine])
        out.append({"rank": r, "stream": s, "busy_s": _length(iv), "ops": len(mine)})
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def stream_busy(ops: pd.DataFrame | Any) -> pd.DataFrame:
    """Busy time (union of op intervals) per rank and stream, as a frame (:func:`stream_busy_rows`)."""
    import pandas as pd

    return pd.DataFrame(stream_busy_rows(ops), columns=STREAM_COLUMNS)
