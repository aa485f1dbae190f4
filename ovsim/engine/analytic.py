"""The analytic fidelity: every op takes its isolated time; only order and dependencies matter.

An op starts when its stream's previous op and its dependencies have finished (plus its launch
delay); a collective's members all end together, the op's isolated time after the last member is
ready. No resource is shared, so with nothing overlapping this agrees with the engine exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ovsim.engine.timeline import Timeline, op_columns, timeline_from_rows
from ovsim.errors import OvsimError
from ovsim.gcpause import paused_gc
from ovsim.models.ir import Workload, id_index, topological_order

# What an op waits for, by index: the one op (most ops: their stream predecessor), or the ops (none,
# or several). An int, not a one-item list: 64 bytes an op of Megatron-LM's 1T row's 3.35 million.
Waits = int | Sequence[int]


def _each(waits: Waits) -> Sequence[int]:
    """The ops ``waits`` names, as a sequence."""
    return (waits,) if type(waits) is int else waits  # type: ignore[return-value]


# A plan's times of its ops (Plan.times): per op its launch, start and end and its time waiting for
# peers; per collective (by index) its flow's launch, start, end and duration.
PlanTimes = tuple[list[float], list[float], list[float], list[float], dict[int, tuple[float, float, float, float]]]


def analytic_timeline(workload: Workload, durations_s: Sequence[float] | None = None,
                      plan: Plan | None = None, *, isolated_s: np.ndarray | Sequence[float] | None = None,
                      handed: list[PlanTimes] | None = None) -> Timeline:
    """The workload's timeline with every op taking its isolated time, or ``durations_s`` (one per
    op of ``workload.ops``, as the power loop's clocks stretch them). ``plan``: the workload's
    :class:`Plan`, where the caller has it already. ``isolated_s``: each op's cost-model time
    (``Op.isolated_s``, as ``power_analytic.OpTerms`` holds them), where ``durations_s`` are its
    times at its clock; each op reports it as its isolated time and the rest of its span as lost
    to the clock. ``handed``: as :meth:`Plan.timeline` takes it."""
    # Lists and dicts per op, none in a cycle: the cyclic collector's passes only cost time.
    with paused_gc():
        if plan is None:
            plan = Plan.of(workload)
        dur = ([op.isolated_s for op in workload.ops] if durations_s is None
               else durations_s if type(durations_s) is list else list(durations_s))
        for given, what, field in ((dur, "durations", "durations_s"), (isolated_s, "isolated times", "isolated_s")):
            if given is not None and len(given) != len(workload.ops):
                raise OvsimError(f"{len(given)} {what} for {len(workload.ops)} ops", field=field)
        return plan.timeline(dur, isolated_s=isolated_s, handed=handed)


class _Order(NamedTuple):
    """A :class:`Plan`'s fields but its workload, as its structure keeps them (read, never
    changed)."""

    order: Sequence[int]
    members: list[list[int]]
    preds: list[Waits]
    delay_s: list[float]
    code: list[int]


@dataclass
class Plan:
    """What the analytic fidelity needs of a workload's order, worked out once for any durations:
    ops in an order that respects stream order, dependencies and collectives, each collective's
    members, and per op (the power loop's passes read them several times) what it waits for by
    index (its stream predecessor, then its dependencies), its launch delay, and its collective or
    whether it is a host gap, in one code (a list an op less than one of each, held through the
    analytic fidelity's peak: 8 bytes an op each)."""

    workload: Workload
    order: Sequence[int]  # a range where the ops' own order is one (most: no int object an op)
    members: list[list[int]]
    preds: list[Waits]
    delay_s: list[float]
    code: list[int]  # the op's collective (index into members); -1: none; -2: a host gap

    @staticmethod
    def of(workload: Workload) -> Plan:
        """The plan of ``workload``: what another workload of its structure worked out
        (``Workload.structure``: another build of its op list with other knobs), or made now."""
        known = workload.structure
        if known is not None and isinstance(known.plan, _Order):
            return Plan(workload, *known.plan)
        plan = Plan._made(workload)
        if known is not None:
            known.plan = _Order(plan.order, plan.members, plan.preds, plan.delay_s, plan.code)
        return plan

    @staticmethod
    def _made(workload: Workload) -> Plan:
        ops = workload.ops
        index = id_index(ops)
        # Each collective's members by its group, and what each op waits for: its stream
        # predecessor, then its dependencies.
        groups: dict[str, list[int]] = {}
        preds: list[Waits] = []
        last: dict[tuple[int, str], int] = {}
        for i, op in enumerate(ops):
            if op.flow is not None:
                groups.setdefault(op.flow.group, []).append(i)
            key = (op.rank, op.stream)
            p = last.get(key)
            last[key] = i
            if not op.deps:  # most ops: the stream's order alone
                preds.append(() if p is None else p)
                continue
            ps = [] if p is None else [p]
            ps.extend([index[d] for d in op.deps])
            preds.append(ps[0] if len(ps) == 1 else ps)
        members = list(groups.values())
        order = _order(preds, members)
        code = [-1] * len(ops)
        for g, (name, ms) in enumerate(groups.items()):
            flow = ops[ms[0]].flow
            missing = set(flow.ranks if flow else ()) - {ops[m].rank for m in ms}
            if missing:
                raise OvsimError(f"collective '{name}' is never joined by rank(s) {sorted(missing)}", field="ranks")
            for m in ms:
                code[m] = g
        for i, op in enumerate(ops):
            if op.kind == "delay":  # a host gap, whatever else it is
                code[i] = -2
        return Plan(workload, order, members, preds, [op.delay_s for op in ops], code)

    def times(self, dur: list[float], release_s: list[float] | None = None,
              slowed: Mapping[int, Sequence[tuple[float, float]]] | None = None) -> tuple[
            list[float], list[float], list[float], list[float], dict[int, tuple[float, float, float, float]]]:
        """Per op: launch, start and end times and time waiting for peers; per collective (by
        index): its flow's launch, start, end and duration. ``dur``: each op's duration. For a
        schedule search's bound (ovsim.tune_predictions.dispatch_release_s): ``release_s``, a time
        before which each op may not start; ``slowed``, for members of collectives, times until
        which their flow moves data at no more than a share of its rate, as (time, share)."""
        if release_s is None and not slowed:
            return self._times_plain(dur)
        n = len(self.workload.ops)
        rel = release_s if release_s is not None else [0.0] * n
        launch = [0.0] * n
        start = [0.0] * n
        end = [0.0] * n
        wait = [0.0] * n
        seen = [False] * n
        flows: dict[int, tuple[float, float, float, float]] = {}
        code, delay_s = self.code, self.delay_s
        # With release times or slowed flows (a schedule search's bound); the power loop's passes
        # over a million ops run _times_plain, which inlines the ready time.
        for i in self.order:
            t = self._ready(i, end)
            launch[i] = t
            t += delay_s[i]
            if rel[i] > t:
                t = rel[i]
            start[i] = t
            seen[i] = True
            g = code[i]
            if g == -2:  # a host gap: it ends once served
                end[i] = t
                continue
            if g < 0:
                end[i] = t + dur[i]
                continue
            if g not in flows:
                ms = self.members[g]
                starts = [start[m] if seen[m] else max(self._ready(m, end) + delay_s[m], rel[m]) for m in ms]
                # The members' durations are one flow's, so equal; the longest, should a caller's
                # differ, so that the span does not depend on which member the order reaches first.
                d = max(dur[m] for m in ms)
                begin = max(starts)
                done = begin + d
                if slowed:
                    for m in ms:
                        for until_s, share in slowed.get(m, ()):
                            done = max(done, _slowed_end(begin, d, self._latency_s(m), until_s, share))
                flows[g] = (min(starts), begin, done, d)
            end[i] = flows[g][2]
            wait[i] = max(0.0, end[i] - t - dur[i])
        return launch, start, end, wait, flows

    def _times_plain(self, dur: list[float]) -> tuple[
            list[float], list[float], list[float], list[float], dict[int, tuple[float, float, float, float]]]:
        """:meth:`times` with no release times and nothing slowed: the same values, by a pass that
        skips what those need (the power loop's passes and most bounds run this way)."""
        n = len(self.workload.ops)
        launch = [0.0] * n
        start = [0.0] * n
        end = [0.0] * n
        wait = [0.0] * n
        seen = [False] * n  # read for collectives' members only
        flows: dict[int, tuple[float, float, float, float]] = {}
        code, preds, delay_s = self.code, self.preds, self.delay_s
        for i in self.order:
            ps = preds[i]
            if type(ps) is int:  # most ops: one to wait for
                t = end[ps]
                if not t > 0.0:  # as the loop below: NaN, -0.0 and below start at 0
                    t = 0.0
            else:
                t = 0.0
                for p in ps:  # type: ignore[union-attr]
                    if end[p] > t:
                        t = end[p]
            launch[i] = t
            d = delay_s[i]
            if d:
                t += d
                if t < 0.0:  # a negative delay starts nothing before 0, as a release at 0
                    t = 0.0
            start[i] = t
            g = code[i]
            if g == -1:
                end[i] = t + dur[i]
                continue
            if g == -2:  # a host gap: it ends once served
                end[i] = t
                continue
            seen[i] = True
            f = flows.get(g)
            if f is None:
                ms = self.members[g]
                if len(ms) == 1:  # the lone member of its group on the simulated ranks (rank symmetry)
                    d = dur[i]
                    f = flows[g] = (t, t, t + d, d)
                    end[i] = f[2]
                    w = f[2] - t - d
                    if w > 0.0:
                        wait[i] = w
                    continue
                starts = [start[m] if seen[m] else max(self._ready(m, end) + delay_s[m], 0.0) for m in ms]
                longest = max(dur[m] for m in ms)
                begin = max(starts)
                f = flows[g] = (min(starts), begin, begin + longest, longest)
            end[i] = f[2]
            w = f[2] - t - dur[i]
            if w > 0.0:
                wait[i] = w
        return launch, start, end, wait, flows

    def _latency_s(self, i: int) -> float:
        f = self.workload.ops[i].flow
        return f.latency_s if f is not None else 0.0

    def _ready(self, i: int, end: list[float]) -> float:
        t = 0.0
        for p in _each(self.preds[i]):
            if end[p] > t:
                t = end[p]
        return t

    def makespan_s(self, dur: list[float], release_s: list[float] | None = None,
                   slowed: Mapping[int, Sequence[tuple[float, float]]] | None = None) -> float:
        """The makespan of :meth:`timeline` (``Timeline.makespan_s``: the last end over the ops
        with rows, from the first launch where that is before 0), without building it;
        ``release_s`` and ``slowed`` as :meth:`times` takes them."""
        launch, _, end, _, _ = self.times(dur, release_s, slowed)
        return self.span(launch, end)

    def span(self, launch: list[float], end: list[float]) -> float:
        """The makespan of the ops' times from :meth:`times`, as :meth:`makespan_s` gives it."""
        if -2 not in self.code:  # the ops have rows all (host gaps have none)
            return max(end) - min(0.0, min(launch)) if end else 0.0
        rows = [i for i, g in enumerate(self.code) if g != -2]
        if not rows:
            return 0.0
        return max(end[i] for i in rows) - min(0.0, min(launch[i] for i in rows))

    def timeline(self, dur: list[float], *, isolated_s: np.ndarray | Sequence[float] | None = None,
                 handed: list[PlanTimes] | None = None) -> Timeline:
        """The timeline of the ops taking ``dur``. ``isolated_s``: each op's cost-model time, where
        ``dur`` are the ops' times at the power loop's clocks; each op reports it (where known: not
        NaN) as its isolated time, and where ``dur`` stretched or shrank it the rest of its span as
        time lost to the clock (``clock_s``; negative where gained). ``handed``: a list holding
        :meth:`times`'s answer for ``dur`` where the caller has it (the power loop's last pass),
        taken out of it here, so that its lists go once read (a third of a GB at 3 million ops);
        empty or None: worked out."""
        launch, start, end, wait, flows = handed.pop() if handed else self.times(dur)
        ops = self.workload.ops
        # A host gap has no row; without gaps, a range (a list holds an int object an op).
        rows = [i for i, g in enumerate(self.code) if g != -2] if -2 in self.code else range(len(ops))
        # Flows in the order of their first member.
        order = sorted(flows, key=lambda g: self.members[g][0])
        named: list[tuple[str, float]] = []
        for g in order:
            f = ops[self.members[g][0]].flow
            assert f is not None
            named.append((f.group, f.bytes))
        spans = np.array([flows[g] for g in order], dtype=float).reshape(-1, 4)
        every = len(rows) == len(ops)

        def column(values: list[float], flow_part: np.ndarray) -> np.ndarray:
            # Arrays, not lists: a list keeps a float object an op (32 bytes, five columns).
            mine = np.array(values, dtype=float)
            return np.concatenate([mine if every else mine[rows], flow_part])

        timed = {"launch_s": column(launch, spans[:, 0]), "start_s": column(start, spans[:, 1]),
                 "end_s": column(end, spans[:, 2]), "isolated_s": column(dur, spans[:, 3]),
                 "wait_peers_s": column(wait, np.zeros(len(order)))}
        # The lists' floats go before the other columns are made (a third of a GB of the 1T row).
        del launch, start, end, wait
        cols = op_columns(ops if every else [ops[i] for i in rows], named)
        cols.update(timed)
        # One array each, as the engine's: a caller may change one (untouched zeros take no memory).
        cols.update({c: np.zeros(len(rows) + len(order)) for c in ("wait_sm_s", "share_sm_s", "share_hbm_s",
                                                                    "share_link_s")})
        if isolated_s is not None:
            mine = np.asarray(isolated_s, dtype=float)
            cols.update(_clock_columns(mine if every else mine[rows], cols, len(order)))
        return timeline_from_rows(cols, [])


def _clock_columns(isolated_s: np.ndarray, cols: dict[str, Any], n_flows: int) -> dict[str, np.ndarray]:
    """``isolated_s`` and ``clock_s`` of a timeline's columns ``cols`` (ops' rows, then
    ``n_flows`` flows') with the ops' cost-model times ``isolated_s`` in place of the durations
    they ran: an op whose time differs lost the difference of its span to the clock."""
    # In place where it can be, and no copy of a column read: at a million ops each array an op's
    # float is 8 MB, and this runs at the timeline's peak.
    mine = np.concatenate([isolated_s, np.zeros(n_flows)])
    had = np.asarray(cols["isolated_s"], dtype=float)
    known = ~np.isnan(mine)
    known[len(isolated_s):] = False
    stretched = known & (mine != had)
    clock = np.subtract(np.asarray(cols["end_s"], dtype=float), np.asarray(cols["start_s"], dtype=float))
    clock -= mine
    clock[~stretched] = 0.0
    del stretched
    unknown = ~known
    mine[unknown] = had[unknown]
    return {"isolated_s": mine, "clock_s": clock}


def _slowed_end(begin_s: float, dur_s: float, latency_s: float, until_s: float, share: float) -> float:
    """When a flow that begins at ``begin_s`` and takes ``dur_s`` (its latency, then its data at
    its rate) ends at the earliest if it moves data at no more than ``share`` of its rate until
    ``until_s``."""
    data_s = dur_s - latency_s
    slow_s = until_s - begin_s - latency_s  # time its data moves at the share
    if slow_s <= 0:
        return begin_s + dur_s
    if share > 0 and slow_s * share >= data_s:
        return begin_s + latency_s + data_s / share
    return until_s + data_s - slow_s * share


def _order(preds: list[Waits], members: list[list[int]]) -> Sequence[int]:
    """The ops' indices in an order that respects stream order, dependencies and collectives.

    A member of a collective may only be finished once every member is ready: each member waits
    for the predecessors of all the others, through one join node per collective (predecessors ->
    join -> members: edges in proportion to the members, not their square)."""
    n = len(preds)
    if _listed_in_order(preds, members):
        return range(n)
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for p in _each(ps):
            succ[p].append(i)
    for j, ms in enumerate(members, start=n):
        ids = set(ms)
        succ.append(list(ids))
        for m in ids:
            for p in _each(preds[m]):
                if p not in ids:
                    succ[p].append(j)
    order = topological_order(succ)
    if order is None:
        raise OvsimError("the ops cannot all finish: collectives are joined in conflicting orders", field="ops")
    return [v for v in order if v < n]


def _listed_in_order(preds: list[Waits], members: list[list[int]]) -> bool:
    """Whether the ops' own order is one :func:`_order` could give: every op after what it waits
    for, and every member of a collective after what each other member waits for. A generator
    lists ops so (a collective's members together, after their predecessors): one pass over the
    predecessors then stands for the successor lists, join nodes and sort (0.7 s of Megatron-LM's
    145.6B row's analytic prediction, profiled)."""
    for i, ps in enumerate(preds):
        if type(ps) is int:
            if ps >= i:
                return False
            continue
        for p in ps:  # type: ignore[union-attr]
            if p >= i:
                return False
    for ms in members:
        first = min(ms)
        for m in ms:
            for p in _each(preds[m]):
                if p >= first and p not in ms:
                    return False
    return True
