"""What the engine records: counter samples while it runs, and the Timeline at the end."""

from __future__ import annotations

from typing import Any

from ovsim.engine.rates import ChannelLoads
from ovsim.engine.state import FlowState, GpuState, KernelState
from ovsim.engine.timeline import COUNTER_COLUMNS, Timeline, timeline_from_rows
from ovsim.models.ir import Workload


class Counters:
    """Piecewise-constant counter samples ``(time_s, rank, counter, value)``."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, str, float]] = []
        self.last: dict[tuple[int, str], float] = {}

    def add(self, t: float, rank: int, name: str, value: float) -> None:
        """A sample of counter ``name`` on ``rank`` at ``t`` seconds, kept only where the value moved."""
        key = (rank, name)
        if self.last.get(key) != value:
            self.last[key] = value
            self.rows.append((t, rank, name, value))


    def sample(self, now: float, gpus: list[GpuState], ranks: list[int], loads: ChannelLoads) -> None:
        """Record the SM, HBM, clock and link counters of the GPUs in ``ranks`` at ``now``."""
        channel, capacity, rates, usage = loads.channel, loads.capacity, loads.rates, loads.usage
        load = [0.0] * len(capacity)
        for x, use in zip(rates, usage, strict=True):
            for r, c in use:
                load[r] += x * c
        link_out = dict.fromkeys(ranks, 0.0)
        for key, i in channel.items():
            if key[0] in ("egress", "link") and key[1] in link_out:
                link_out[key[1]] += load[i]
        for r in ranks:
            gpu = gpus[r]
            busy = 0
            for g in gpu.groups:
                if g.entries:
                    busy += g.n
            self.add(now, r, "sm_busy_fraction", busy / gpu.model.sm_count)
            self.add(now, r, "hbm_bytes_per_s", load[channel[("hbm", r)]])
            self.add(now, r, "clock_factor", gpu.clock_factor)
            self.add(now, r, "link_out_bytes_per_s", link_out[r])


def timeline_of(workload: Workload, kernels: list[KernelState], flows: list[FlowState],
                counters: Counters) -> Timeline:
    """The run's Timeline: one row per op (its kernel's or its flow member's times and losses) and
    one per flow, with the counters' samples."""
    rows: list[dict[str, Any]] = []
    by_id = {k.id: k for k in kernels}
    members = {m.op.id: m for f in flows for m in f.members.values()}
    for op in workload.ops:
        if op.kind == "delay":
            continue
        row: dict[str, Any] = {
            "id": op.id, "name": op.name, "kind": op.kind, "rank": op.rank, "stream": op.stream,
            "isolated_s": op.isolated_s,
        }
        if op.id in members:
            m = members[op.id]
            row.update(launch_s=m.launch_s, start_s=min(m.start_s, m.end_s), end_s=m.end_s,
                       wait_sm_s=m.wait_sm_s, share_sm_s=m.share_sm_s, share_hbm_s=m.share_hbm_s,
                       share_link_s=m.share_link_s, wait_peers_s=m.wait_peers_s)
        else:
            k = by_id[op.id]
            row.update(launch_s=k.launch_s, start_s=k.start_s, end_s=k.end_s, wait_sm_s=k.wait_sm_s,
                       share_sm_s=k.share_sm_s, share_hbm_s=k.share_hbm_s, share_link_s=0.0,
                       wait_peers_s=0.0, clock_s=k.clock_s)
        row["blocks"] = op.kernel.blocks if op.kernel is not None else 0
        row["bytes"] = op.flow.bytes if op.flow is not None else (op.kernel.hbm_bytes if op.kernel else 0.0)
        rows.append(row)
    for f in flows:
        rows.append({
            "id": f"flow:{f.demand.group}", "name": f.demand.group, "kind": "flow", "rank": -1, "stream": "",
            "isolated_s": f.demand.latency_s + (f.demand.bytes / f.demand.rate_cap_bytes_per_s
                                                if f.demand.bytes > 0 else 0.0),
            "launch_s": min(m.launch_s for m in f.members.values()), "start_s": f.start_s, "end_s": f.end_s,
            "wait_sm_s": 0.0, "share_sm_s": 0.0, "share_hbm_s": 0.0, "share_link_s": 0.0,
            "wait_peers_s": 0.0, "blocks": 0, "bytes": f.demand.bytes,
        })
    c_t, c_rank, c_name, c_value = COUNTER_COLUMNS  # a dict display per row: a long run records many
    samples = [{c_t: t, c_rank: r, c_name: n, c_value: v} for t, r, n, v in counters.rows]
    return timeline_from_rows(rows, samples)
