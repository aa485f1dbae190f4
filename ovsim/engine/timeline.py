"""The Timeline: what a simulation (or an analytic prediction) says happened.

``ops`` has one row per op on a rank (kernels, collective kernels, copies) and one per flow
(``kind == "flow"``, ``rank == -1``), with these columns (times in seconds from the start):

=============== ======================================================================
id, name        op id (unique) and display name
kind            gemm, attention, elementwise, norm, softmax, generic, collective, transfer, flow
rank, stream    where it ran
launch_s        when its stream launched it
start_s, end_s  first block resident (or flow data start) and completion
duration_s      end_s - start_s
isolated_s      the cost model's time for the op alone
slowdown        duration_s / isolated_s
wait_sm_s       time lost because its blocks could not be resident (SMs held by others)
share_sm_s      time lost sharing SM issue throughput with co-resident blocks
share_hbm_s     time lost to a smaller HBM share than it asked for
share_link_s    time lost to a smaller link share (flows)
wait_peers_s    time a collective's kernel sat resident waiting for other ranks
clock_s         time lost to an SM clock below the one its isolated time assumes (power cap, clock lock);
                negative: gained on a clock above it
slowed_by       the largest of the six reasons above, or "" when within 1% of isolated
blocks, bytes   grid size; bytes moved (HBM bytes for kernels, bus bytes for flows)
=============== ======================================================================

``counters`` holds piecewise-constant samples ``time_s, rank, counter, value``; a value holds
until the next sample of the same (rank, counter), and of samples at one instant the last one
holds. Power counters: ``power_w`` (board power) and ``sm_clock_hz`` (see
:mod:`ovsim.engine.power`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from ovsim.models.ir import Op

OP_COLUMNS = [
    "id", "name", "kind", "rank", "stream", "launch_s", "start_s", "end_s", "duration_s", "isolated_s",
    "slowdown", "wait_sm_s", "share_sm_s", "share_hbm_s", "share_link_s", "wait_peers_s", "clock_s",
    "slowed_by", "blocks", "bytes",
]
COUNTER_COLUMNS = ["time_s", "rank", "counter", "value"]
REASONS = {
    "wait_sm_s": "waiting for SMs",
    "share_sm_s": "sharing SMs",
    "share_hbm_s": "sharing HBM",
    "share_link_s": "sharing links",
    "wait_peers_s": "waiting for peers",
    "clock_s": "lowered clock",
}
# A kernel within this fraction of its isolated time counts as not slowed.
SLOWED_THRESHOLD = 0.01


@dataclass(frozen=True)
class Timeline:
    ops: pd.DataFrame
    counters: pd.DataFrame

    @property
    def makespan_s(self) -> float:
        # On the columns' arrays: a filtered copy of the frame cost a schedule search a sixth of
        # its time on small scenarios.
        ops = self.ops
        if ops.empty:
            return 0.0
        keep = ops["kind"].to_numpy() != "flow"
        if not keep.any():
            return 0.0
        end = ops["end_s"].to_numpy(dtype=float)[keep]
        launch = ops["launch_s"].to_numpy(dtype=float)[keep]
        return float(end.max() - min(0.0, float(launch.min())))


def on_ranks(tl: Timeline, ranks: Sequence[int]) -> Timeline:
    """``tl`` with rank ``ranks[r]`` in place of each rank r (a trace's numbers, or a job's under
    rank symmetry); flows keep -1."""
    lookup = np.asarray(ranks, dtype=np.int64)

    def renumbered(df: pd.DataFrame) -> pd.DataFrame:
        if df.empty:
            return df
        r = df["rank"].to_numpy(dtype=np.int64)
        return df.assign(rank=np.where(r >= 0, lookup[np.clip(r, 0, None)], r))

    return Timeline(ops=renumbered(tl.ops), counters=renumbered(tl.counters))


def op_columns(ops: Sequence[Op], flows: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """The columns the ops themselves give a Timeline (id, name, kind, rank, stream, blocks, bytes),
    as the engine and the analytic fidelity lay them out: one row per op of ``ops``, then one per
    flow of ``flows`` (its group and bus bytes). Numbers go straight into arrays: at a million ops
    each list of Python numbers costs tens of megabytes."""
    n, nf = len(ops), len(flows)
    return {
        "id": [op.id for op in ops] + [f"flow:{group}" for group, _ in flows],
        "name": [op.name for op in ops] + [group for group, _ in flows],
        "kind": [op.kind for op in ops] + ["flow"] * nf,
        "rank": np.concatenate([np.fromiter((op.rank for op in ops), dtype=np.int64, count=n),
                                np.full(nf, -1, dtype=np.int64)]),
        "stream": [op.stream for op in ops] + [""] * nf,
        "blocks": np.concatenate([
            np.fromiter((op.kernel.blocks if op.kernel is not None else 0 for op in ops), dtype=np.int64, count=n),
            np.zeros(nf, dtype=np.int64)]),
        "bytes": np.concatenate([
            np.fromiter((op.flow.bytes if op.flow is not None else (op.kernel.hbm_bytes if op.kernel else 0.0)
                         for op in ops), dtype=float, count=n),
            np.array([size for _, size in flows], dtype=float)]),
    }


def timeline_from_rows(rows: list[dict[str, Any]] | pd.DataFrame | Mapping[str, Any],
                       counters: list[dict[str, Any]] | pd.DataFrame) -> Timeline:
    """A Timeline from op rows (dicts, a frame with those columns, or a mapping of column name to
    array) and counter samples; the derived columns (duration, slowdown, the split of time lost,
    slowed_by) are computed here, on arrays, and the frame is built once without copying its
    columns: a frame's column operations copy the whole frame (a million ops: gigabytes)."""
    given = [c for c in OP_COLUMNS if c not in ("duration_s", "slowdown", "slowed_by")]
    src: Mapping[str, Any]
    if isinstance(rows, Mapping):
        src = rows
        n = len(next(iter(rows.values()))) if rows else 0
    else:
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, columns=given)
        src = {c: frame[c].array for c in frame.columns}
        n = len(frame)

    def column(c: str) -> Any:
        return src[c] if c in src else np.full(n, np.nan)

    start = np.asarray(column("start_s"), dtype=float)
    iso = np.asarray(column("isolated_s"), dtype=float)
    duration = np.asarray(column("end_s"), dtype=float) - start
    with np.errstate(divide="ignore", invalid="ignore"):
        slowdown = duration / np.where(iso > 0, iso, np.nan)
    slowdown[np.isnan(slowdown)] = 1.0
    derived: dict[str, Any] = {"duration_s": duration, "slowdown": slowdown}
    derived.update(_lost_time(duration, iso, column))
    ops = pd.DataFrame({c: derived[c] if c in derived else column(c) for c in OP_COLUMNS}, copy=False)
    return Timeline(ops=ops, counters=pd.DataFrame(counters, columns=COUNTER_COLUMNS))


def _lost_time(duration: np.ndarray, iso: np.ndarray, column: Callable[[str], Any]) -> dict[str, Any]:
    """The time each op lost, split by reason (one column each), and ``slowed_by``.

    The raw reasons integrate where progress was lost; they are rescaled so that they split the
    time lost, duration - isolated, in the same proportions (a kernel pushed into an extra wave
    loses a whole wave although its blocks were short of SMs only during the first one).
    Producers that never lose time to a reason may leave its column out. A clock above the
    calibration's gains time: clock_s is negative then, and kept as it integrated; the other
    reasons split what is left of duration - isolated. One (ops, reasons) array, changed in
    place: each copy of it is 48 bytes an op."""
    n = len(duration)
    names = list(REASONS)
    ci = names.index("clock_s")
    reasons = np.empty((n, len(names)))
    for j, c in enumerate(names):
        reasons[:, j] = np.asarray(column(c), dtype=float)
    reasons[np.isnan(reasons)] = 0.0
    net = duration - iso
    clock = reasons[:, ci]
    gained = np.where(clock <= 0.0, clock, 0.0)
    # A kernel further ahead than its integrated gain (wave edges, round-off): all of its lead is
    # the clock's, nothing was lost.
    gained = np.where(net >= gained, gained, net)
    gained = np.where(gained < -1e-9 * iso, gained, 0.0)  # round-off is no gain
    reasons[reasons < 0.0] = 0.0
    total = reasons.sum(axis=1)
    lost = net - gained
    lost[~(lost >= 0.0)] = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = lost / np.where(total > 0, total, np.nan)
    scale[np.isnan(scale)] = 0.0
    reasons *= scale[:, None]
    reasons[:, ci] += gained
    slowed = net > SLOWED_THRESHOLD * iso
    if n:
        top = np.array([REASONS[c] for c in names], dtype=object)[reasons.argmax(axis=1)]
        has_reason = reasons.max(axis=1) > 0
    else:
        top, has_reason = np.array([], dtype=object), np.array([], dtype=bool)
    out: dict[str, Any] = {"slowed_by": np.where(slowed & has_reason, top, "")}
    for j, c in enumerate(names):
        out[c] = reasons[:, j]
    return out
