"""The analytic fidelity: every op takes its isolated time; only order and dependencies matter.

An op starts when its stream's previous op and its dependencies have finished (plus its launch
delay); a collective's members all end together, the op's isolated time after the last member is
ready. No resource is shared, so with nothing overlapping this agrees with the engine exactly.
"""

from __future__ import annotations

from typing import Any

from ovsim.engine.timeline import Timeline, timeline_from_rows
from ovsim.errors import OvsimError
from ovsim.gcpause import paused_gc
from ovsim.models.ir import Op, Workload, topological_order


def analytic_timeline(workload: Workload) -> Timeline:
    # Lists and dicts per op, none in a cycle: the cyclic collector's passes only cost time.
    with paused_gc():
        return _timeline(workload)


def _timeline(workload: Workload) -> Timeline:
    groups: dict[str, list[Op]] = {}
    for op in workload.ops:
        if op.flow is not None:
            groups.setdefault(op.flow.group, []).append(op)
    order = [workload.ops[i].id for i in _order(workload, groups)]
    by_id = {op.id: op for op in workload.ops}
    stream_pred: dict[str, str] = {}
    last: dict[tuple[int, str], str] = {}
    for op in workload.ops:
        key = (op.rank, op.stream)
        if key in last:
            stream_pred[op.id] = last[key]
        last[key] = op.id
    ready: dict[str, float] = {}
    end: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    done_groups: dict[str, float] = {}
    for oid in order:
        op = by_id[oid]
        t = 0.0
        if oid in stream_pred:
            t = max(t, end[stream_pred[oid]])
        for d in op.deps:
            t = max(t, end[d])
        launch = t
        t += op.delay_s
        if op.kind == "delay":
            end[oid] = t
            continue
        ready[oid] = t
        wait_peers = 0.0
        if op.flow is not None:
            members = groups[op.flow.group]
            missing = set(op.flow.ranks) - {m.rank for m in members}
            if missing:
                raise OvsimError(f"collective '{op.flow.group}' is never joined by rank(s) {sorted(missing)}",
                                 field="ranks")
            if op.flow.group not in done_groups:
                starts = [_ready_of(m, ready, end, stream_pred) for m in members]
                done_groups[op.flow.group] = max(starts) + op.isolated_s
                f = op.flow
                rows.append({"id": f"flow:{f.group}", "name": f.group, "kind": "flow", "rank": -1, "stream": "",
                             "launch_s": min(starts), "start_s": max(starts), "end_s": done_groups[f.group],
                             "isolated_s": op.isolated_s, "blocks": 0, "bytes": f.bytes, **_zero_reasons()})
            finish = done_groups[op.flow.group]
            wait_peers = finish - t - op.isolated_s
        else:
            finish = t + op.isolated_s
        end[oid] = finish
        reasons = _zero_reasons()
        reasons["wait_peers_s"] = max(0.0, wait_peers)
        rows.append({"id": oid, "name": op.name, "kind": op.kind, "rank": op.rank, "stream": op.stream,
                     "launch_s": launch, "start_s": t, "end_s": finish, "isolated_s": op.isolated_s,
                     "blocks": op.kernel.blocks if op.kernel is not None else 0,
                     "bytes": op.flow.bytes if op.flow is not None else (op.kernel.hbm_bytes if op.kernel else 0.0),
                     **reasons})
    # Ops in program order, then flows in the order of their first member.
    order_index = {op.id: i for i, op in enumerate(workload.ops)}
    for name, members in groups.items():
        order_index[f"flow:{name}"] = order_index[members[0].id]
    rows.sort(key=lambda r: (r["rank"] < 0, order_index[r["id"]]))
    return timeline_from_rows(rows, [])


def _order(workload: Workload, groups: dict[str, list[Op]]) -> list[int]:
    """The ops' indices in an order that respects stream order, dependencies and collectives.

    A member of a collective may only be finished once every member is ready: each member waits
    for the predecessors of all the others, through one join node per collective (predecessors ->
    join -> members: edges in proportion to the members, not their square)."""
    n = len(workload.ops)
    succ = workload.successors()
    preds: list[list[int]] = [[] for _ in range(n)]
    for p, out in enumerate(succ):
        for v in out:
            preds[v].append(p)
    index = {op.id: i for i, op in enumerate(workload.ops)}
    for j, members in enumerate(groups.values(), start=n):
        ids = {index[m.id] for m in members}
        succ.append(list(ids))
        for m in ids:
            for p in preds[m]:
                if p not in ids:
                    succ[p].append(j)
    order = topological_order(succ)
    if order is None:
        raise OvsimError("the ops cannot all finish: collectives are joined in conflicting orders", field="ops")
    return [v for v in order if v < n]


def _ready_of(op: Op, ready: dict[str, float], end: dict[str, float], stream_pred: dict[str, str]) -> float:
    if op.id in ready:
        return ready[op.id]
    t = 0.0
    if op.id in stream_pred:
        t = max(t, end[stream_pred[op.id]])
    for d in op.deps:
        t = max(t, end[d])
    return t + op.delay_s


def _zero_reasons() -> dict[str, float]:
    return {"wait_sm_s": 0.0, "share_sm_s": 0.0, "share_hbm_s": 0.0, "share_link_s": 0.0, "wait_peers_s": 0.0}
