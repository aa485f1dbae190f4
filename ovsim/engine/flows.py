"""The engine's flows: collectives and copies joining, waiting, moving data and finishing.

A flow (:class:`~ovsim.engine.state.FlowState`) is made when its first member launches. It waits
until every member has arrived (an SM collective's kernel has a block resident, a copy holds a
copy engine), spends its latency, moves its bytes at the rate the solver gives it, and finishes
for all its members at once: their kernels leave the SMs, their copy engines go to the next copy
waiting, and their streams move on. The engine (:mod:`ovsim.engine.sim`) calls in at the points of
its event loop where these steps happen, and :class:`Flows` calls back to touch a GPU (bring it
up to date and into the resolve) and to tell a stream its op is done.
"""

from __future__ import annotations

from collections.abc import Callable

from ovsim.engine import dispatch
from ovsim.engine.machine import MachineModel
from ovsim.engine.record import Results
from ovsim.engine.routing import RANK_KEYED, flow_usage
from ovsim.engine.state import FlowMember, FlowState, GpuState, KernelState, StreamState
from ovsim.errors import OvsimError
from ovsim.models.ir import FlowDemand, Op


class Flows:
    """The unfinished flows of a run, by group, with counts the event loop reads: ``waiting`` for
    members, ``moving`` data."""

    def __init__(self, machine: MachineModel, gpus: list[GpuState], results: Results,
                 touch: Callable[[int], None], op_done: Callable[[StreamState, str], None],
                 to_dispatch: set[int]) -> None:
        self.machine = machine
        self.gpus = gpus
        self.results = results
        self.touch = touch  # bring a GPU up to now and into this resolve
        self.op_done = op_done  # the op a stream launched last (its id) has finished
        self.to_dispatch = to_dispatch  # GPUs whose dispatcher must run (the engine's set)
        self.live: dict[str, FlowState] = {}
        self.created = 0
        self.waiting = 0
        self.moving = 0
        # Counts the changes of which flows move data, which couple GPUs (RateSolver.coupled).
        self.moving_changes = 0

    def detach(self) -> None:
        """Drop the engine's callbacks (the run is over): no reference cycle outlives the run."""
        self.touch = _detached
        self.op_done = _detached

    def join(self, op: Op, kernel: KernelState | None, now: float, index: int, stream: StreamState) -> None:
        """``op`` (with a flow; the workload's op ``index``) launched on its rank by ``stream``: it
        becomes a member of its flow, holding ``kernel``'s blocks where it runs on SMs, else
        queueing for a copy engine where it needs one."""
        assert op.flow is not None
        flow = self._flow(op.flow, now)
        member = FlowMember(op=op, rank=op.rank, kernel=kernel, launch_s=now, index=index, stream=stream)
        if op.rank in flow.members or op.flow.group in self.results.flows:
            raise OvsimError(f"rank {op.rank} joins collective '{op.flow.group}' twice", field="group")
        flow.members[op.rank] = member
        if kernel is not None:
            kernel.flow = flow
        if op.flow.uses_copy_engine:
            gpu = self.gpus[op.rank]
            if gpu.ce_free > 0:
                gpu.ce_free -= 1
                member.has_ce = True
            else:
                gpu.ce_waiting.append(member)

    def _flow(self, demand: FlowDemand, now: float) -> FlowState:
        flow = self.live.get(demand.group)
        if flow is None:
            flow = FlowState(demand=demand, latency_left_s=demand.latency_s, remaining_bytes=demand.bytes,
                             last_t=now, seq=self.created)
            self.created += 1
            flow.usage = flow_usage(self.machine, demand)
            for key, c in flow.usage:
                if key[0] in RANK_KEYED:
                    flow.usage_at.setdefault(key[1], []).append((key, c))
                    if key[0] == "hbm":
                        flow.hbm_at[key[1]] = c
            ranks = set(demand.ranks)
            hubs = self.machine.nic_hubs
            for key, _ in flow.usage:
                if key[0] in ("nic_out", "nic_in") and key[1] in hubs:
                    # Flows through one port are coupled through the GPU that stands for it.
                    ranks.add(hubs[key[1]])
                else:
                    ranks.update(r for r in key[1:] if r >= 0)
            flow.ranks = tuple(sorted(r for r in ranks if r < len(self.gpus)))
            self.live[demand.group] = flow
            self.waiting += 1
            # A waiting flow changes no rate, so the GPUs it will use need not be touched yet.
            for r in flow.ranks:
                self.gpus[r].flows.append(flow)
        return flow

    def arrivals(self, ranks: list[int], now: float) -> None:
        """Flows on the GPUs in ``ranks`` whose members have all arrived start their latency (or
        their data, or finish where they have none)."""
        seen: set[int] = set()
        for r in ranks:
            for f in list(self.gpus[r].flows):
                if f.phase != "waiting" or id(f) in seen:
                    continue
                seen.add(id(f))
                for m in f.members.values():
                    if not m.arrived:
                        if m.kernel is not None:
                            m.arrived = m.kernel.resident > 0
                        else:
                            m.arrived = m.has_ce or not m.op.flow or not m.op.flow.uses_copy_engine
                        if m.arrived:
                            m.start_s = m.kernel.start_s if m.kernel is not None else now
                if len(f.members) == len(f.demand.ranks) and all(m.arrived for m in f.members.values()):
                    for q in f.ranks:
                        self.touch(q)
                    f.start_s = now
                    f.phase = "latency" if f.latency_left_s > 0 else "data"
                    self.waiting -= 1
                    self.moving += f.phase == "data"
                    self.moving_changes += f.phase == "data"
                    if f.phase == "data" and f.remaining_bytes <= 0:
                        self.finish(f, now)

    def complete(self, gpu: GpuState, now: float, eps: float) -> None:
        """Flows on ``gpu`` whose latency has elapsed start moving data; those whose bytes are
        moved (within ``eps`` seconds of their rate) finish."""
        for f in list(gpu.flows) if gpu.flows else ():
            if f.phase == "latency" and f.latency_left_s <= eps:
                f.phase = "data"
                self.moving += 1
                self.moving_changes += 1
                f.latency_left_s = 0.0
                for q in f.ranks:
                    self.touch(q)
            if f.phase == "data" and (f.remaining_bytes <= max(f.rate, 1.0) * eps):
                self.finish(f, now)

    def finish(self, f: FlowState, now: float) -> None:
        """Flow ``f`` ends now for every member."""
        for q in f.ranks:
            self.touch(q)
        if f.phase == "data":
            self.moving -= 1
            self.moving_changes += 1
        f.phase = "done"
        f.end_s = now
        f.rate = 0.0
        for q in f.ranks:
            self.gpus[q].flows.remove(f)
        for m in f.members.values():
            m.end_s = now
            k = m.kernel
            if k is not None:
                dispatch.evict(k.gpu, k)
                k.end_s = now
                self.to_dispatch.add(k.gpu.rank)
            if m.has_ce:
                _release_ce(self.gpus[m.rank])
        for m in f.members.values():
            # Nothing else charges a member these while its flow moves data (from 0).
            m.share_sm_s += f.share_sm_s
            m.share_hbm_s += f.share_hbm_s
            m.share_link_s += f.share_link_s
            self.results.member(m.index, m)
        self.results.flow(f.seq, f)
        del self.live[f.demand.group]
        for m in f.members.values():
            self.op_done(m.stream, m.op.id)
        # Its kernels point to it (KernelState.flow): without its members it makes no reference
        # cycle, so reference counting frees it and them at once, not the cyclic collector later.
        f.members.clear()

    def waiting_groups(self) -> list[str]:
        """Groups of the flows still waiting for members (a stuck run's error names them)."""
        return [f.demand.group for f in self.live.values() if f.phase == "waiting"]


def _detached(*_: object) -> None:
    raise RuntimeError("the run is over: its flows no longer drive the engine")


def _release_ce(gpu: GpuState) -> None:
    """A copy engine of ``gpu`` is free: the first copy waiting for one takes it."""
    gpu.ce_free += 1
    if gpu.ce_waiting:
        m = gpu.ce_waiting.pop(0)
        gpu.ce_free -= 1
        m.has_ce = True
