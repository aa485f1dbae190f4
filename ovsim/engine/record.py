"""What the engine records: counter samples while it runs, and the Timeline at the end."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from ovsim.engine.rates import ChannelLoads
from ovsim.engine.state import FlowMember, FlowState, GpuState, KernelState
from ovsim.engine.timeline import COUNTER_COLUMNS, Timeline, op_columns, timeline_from_rows
from ovsim.models.ir import Workload

# Samples a Counters holds as tuples before it packs them into arrays.
_PACK_ROWS = 65536


class Counters:
    """Piecewise-constant counter samples ``(time_s, rank, counter, value)``. They come in as tuples
    (one append an event) and are packed into arrays every ``_PACK_ROWS``: a kept tuple cost about
    110 bytes a sample, its packed columns 28 (a simulation records about six an op)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, str, float]] = []
        self.last: dict[tuple[int, str], float] = {}
        self.codes: dict[str, int] = {}  # each counter's name, by its code in the packed columns
        # The packed columns, a list of arrays each: time_s, rank, the counter's code, value.
        self.packed: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [], [])

    def add(self, t: float, rank: int, name: str, value: float) -> None:
        """A sample of counter ``name`` on ``rank`` at ``t`` seconds, kept only where the value moved."""
        key = (rank, name)
        if self.last.get(key) != value:
            self.last[key] = value
            rows = self.rows
            rows.append((t, rank, name, value))
            if len(rows) >= _PACK_ROWS:
                self._pack()

    def _pack(self) -> None:
        rows, n = self.rows, len(self.rows)
        if not n:
            return
        codes = self.codes
        times, ranks, names, values = self.packed
        times.append(np.fromiter((r[0] for r in rows), dtype=float, count=n))
        ranks.append(np.fromiter((r[1] for r in rows), dtype=np.int64, count=n))
        names.append(np.fromiter((codes.setdefault(r[2], len(codes)) for r in rows), dtype=np.int32, count=n))
        values.append(np.fromiter((r[3] for r in rows), dtype=float, count=n))
        self.rows = []

    def columns(self) -> dict[str, Any]:
        """The samples as the Timeline's counter columns (COUNTER_COLUMNS), in the order they came;
        the counters are left empty. Each column is joined while the others stay packed."""
        self._pack()
        times, ranks, names, values = self.packed
        if not times:
            return {c: [] for c in COUNTER_COLUMNS}
        out: dict[str, Any] = {}
        for column, parts in (("time_s", times), ("rank", ranks), ("counter", names), ("value", values)):
            out[column] = np.concatenate(parts)
            parts.clear()
        labels = np.empty(len(self.codes), dtype=object)
        for name, code in self.codes.items():
            labels[code] = name
        out["counter"] = labels[out["counter"]]
        return out


    def sample(self, now: float, gpus: list[GpuState], ranks: list[int], loads: ChannelLoads) -> None:
        """Record the SM, HBM, clock and link counters of the GPUs in ``ranks`` at ``now``."""
        channel, capacity, rates, usage = loads.channel, loads.capacity, loads.rates, loads.usage
        load = [0.0] * len(capacity)
        for a in range(len(rates)):
            x = rates[a]
            for r, c in usage[a]:
                load[r] += x * c
        link_out = dict.fromkeys(ranks, 0.0)
        for key, i in channel.items():
            if key[0] in ("egress", "link") and key[1] in link_out:
                link_out[key[1]] += load[i]
            elif len(key) == 2 and key[0] != "hbm":
                # A registered kernel resource's channel (ovsim.engine.resources): (name, rank).
                self.add(now, key[1], f"{key[0]}_bytes_per_s", load[i])
        for r in ranks:
            gpu = gpus[r]
            busy = 0
            for g in gpu.groups:
                if g.entries:
                    busy += g.n_sms
            self.add(now, r, "sm_busy_fraction", busy / gpu.model.sm_count)
            self.add(now, r, "hbm_bytes_per_s", load[channel[("hbm", r)]])
            self.add(now, r, "clock_factor", gpu.clock_factor)
            self.add(now, r, "link_out_bytes_per_s", link_out[r])


# Per op: launch, start and end times, then the seconds lost to each reason.
RESULT_FIELDS = ("launch_s", "start_s", "end_s", "wait_sm_s", "share_sm_s", "share_hbm_s", "share_link_s",
                 "wait_peers_s", "clock_s")
_N = len(RESULT_FIELDS)


class Results:
    """What each op and flow came to, kept compactly as they finish (72 bytes an op), so that a
    finished kernel's or flow's state can be dropped at once."""

    def __init__(self, n_ops: int) -> None:
        self.values = array("d", bytes(8 * _N * n_ops))
        # (creation order, launch, start, end, isolated seconds, bytes) of each finished flow, by group.
        self.flows: dict[str, tuple[int, float, float, float, float, float]] = {}

    def kernel(self, i: int, k: KernelState) -> None:
        """Op ``i`` ran as kernel ``k``, now finished."""
        # Field by field: no array or tuple built per kernel (the row's other fields stay 0).
        v, at = self.values, _N * i
        v[at] = k.launch_s
        v[at + 1] = k.start_s
        v[at + 2] = k.end_s
        v[at + 3] = k.wait_sm_s
        v[at + 4] = k.share_sm_s
        v[at + 5] = k.share_hbm_s
        v[at + 8] = k.clock_s

    def member(self, i: int, m: FlowMember) -> None:
        """Op ``i`` was member ``m`` of a collective or transfer, now finished."""
        self.values[_N * i:_N * (i + 1)] = array("d", (
            m.launch_s, min(m.start_s, m.end_s), m.end_s, m.wait_sm_s, m.share_sm_s, m.share_hbm_s,
            m.share_link_s, m.wait_peers_s, 0.0))

    def flow(self, seq: int, f: FlowState) -> None:
        """Flow ``f``, the ``seq``-th created, has finished."""
        d = f.demand
        self.flows[d.group] = (seq, min(m.launch_s for m in f.members.values()), f.start_s, f.end_s, d.isolated_s,
                               d.bytes)


def timeline_of(workload: Workload, results: Results, counters: Counters) -> Timeline:
    """The run's Timeline: one row per op (its kernel's or its flow member's times and losses) and
    one per flow, in the order they were created, with the counters' samples, as columns
    (:func:`~ovsim.engine.timeline.op_columns`)."""
    ops = [op for op in workload.ops if op.kind != "delay"]
    index = np.fromiter((i for i, op in enumerate(workload.ops) if op.kind != "delay"), dtype=np.int64)
    v = np.frombuffer(results.values, dtype=float).reshape(-1, _N)[index]
    flows = sorted(results.flows.items(), key=lambda kv: kv[1][0])
    # (launch, start, end, isolated seconds, bytes) of each flow, in creation order.
    fv = np.array([f[1:] for _, f in flows], dtype=float).reshape(-1, 5)
    cols = op_columns(ops, [(group, f[5]) for group, f in flows])
    cols["isolated_s"] = np.concatenate([np.fromiter((op.isolated_s for op in ops), dtype=float, count=len(ops)),
                                         fv[:, 3]])
    flow_fields = {"launch_s": fv[:, 0], "start_s": fv[:, 1], "end_s": fv[:, 2]}
    for j, name in enumerate(RESULT_FIELDS):
        cols[name] = np.concatenate([v[:, j], flow_fields.get(name, np.zeros(len(flows)))])
    return timeline_from_rows(cols, counters.columns())
