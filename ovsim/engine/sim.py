"""The discrete-event engine.

simpy keeps the clock and the event queue; stream processes walk each stream's ops in order and
launch them. Between events every activity progresses at a constant rate, so the engine only needs
an event when something changes: a launch, a block finishing, a flow finishing, a latency elapsing.
At each such instant it

1. lets every GPU's block dispatcher place waiting blocks (stream priority, then launch order; a
   kernel waits while an earlier kernel of its priority still has blocks to place; no preemption;
   the SM group with the most room for the block first);
2. shares every SM's issue throughput among its resident blocks (max-min with per-block demands);
3. shares HBM, links and PCIe among kernels and flows (weighted max-min with demand caps,
   :mod:`ovsim.engine.channel`);
4. schedules the next completion.

Identical SMs are kept as groups ("100 SMs each running one GEMM block, 32 running one NCCL block")
so the cost does not grow with the SM count. Waves, tails, a persistent kernel blocking a later
one, and collectives waiting for their slowest rank all come out of these rules.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from ovsim.engine.channel import CAP, max_min_rates, water_fill
from ovsim.engine.machine import GpuModel, LinkKey, MachineModel
from ovsim.engine.timeline import COUNTER_COLUMNS, Timeline, timeline_from_rows
from ovsim.errors import OvsimError
from ovsim.models.cost import allocated_registers
from ovsim.models.ir import FlowDemand, Op, Workload

_INF = float("inf")
# Work left below this many seconds at the current rate counts as finished (float round-off).
_TIME_EPS = 1e-12


class _Kernel:
    """A launched kernel (or the SM-resident part of a collective) on one GPU."""

    __slots__ = (
        "blocks", "blocks_per_sm_alone", "bytes_per_block", "clock_sensitive", "done", "end_s", "flow", "gpu", "id",
        "issue", "launch_s", "op", "partitions", "priority", "rank", "regs", "resident", "seq", "share_hbm_s",
        "share_link_s", "share_sm_s", "smem", "start_s", "t_block", "theta", "threads", "undispatched",
        "wait_peers_s", "wait_sm_s",
    )

    def __init__(self, op: Op, gpu: _Gpu, priority: int, seq: int, done: simpy.Event, now: float) -> None:
        self.op = op
        self.id = op.id
        self.rank = op.rank
        self.gpu = gpu
        self.priority = priority
        self.seq = seq
        self.done = done
        self.launch_s = now
        self.start_s = _INF
        self.end_s = _INF
        self.flow: _Flow | None = None
        self.theta = 1.0
        self.wait_sm_s = self.share_sm_s = self.share_hbm_s = self.share_link_s = self.wait_peers_s = 0.0
        k = op.kernel
        assert k is not None
        self.blocks = k.blocks
        self.undispatched = k.blocks
        self.resident = 0
        m = gpu.model
        self.threads = math.ceil(k.block.threads / m.warp_size) * m.warp_size
        self.regs = allocated_registers(k.block.threads, k.block.registers_per_thread, m.warp_size,
                                        m.register_alloc_unit)
        self.smem = k.block.shared_mem_bytes + m.reserved_smem_per_block_bytes
        self.t_block = k.block_time_s
        self.issue = k.issue_fraction
        self.clock_sensitive = k.clock_sensitive
        self.bytes_per_block = k.hbm_bytes / k.blocks
        self.partitions = ("main",) if op.partition == "compute" else ("main", "reserved")
        self.blocks_per_sm_alone = max(1, _fit(gpu.model.threads_per_sm, gpu.model.registers_per_sm,
                                               gpu.model.shared_mem_per_sm_bytes, gpu.model.blocks_per_sm, self))

    def sort_key(self) -> tuple[int, int]:
        return (self.priority, self.seq)


def _fit(threads: int, regs: int, smem: int, blocks: int, k: _Kernel) -> int:
    n = min(threads // k.threads, blocks)
    if k.regs:
        n = min(n, regs // k.regs)
    if k.smem:
        n = min(n, smem // k.smem)
    return max(0, n)


def _issued_blocks(k: _Kernel) -> float:
    """Resident blocks of `k` weighted by the share of their issue demand they get."""
    issued = 0.0
    for g in k.gpu.groups:
        for e in g.entries:
            if e.k is k:
                issued += g.n * e.per_sm * e.share
    return issued


class _Entry:
    """Blocks of one kernel, ``per_sm`` on every SM of a group, all with the same work left."""

    __slots__ = ("born", "k", "per_sm", "rate", "remaining", "share")

    def __init__(self, k: _Kernel, per_sm: int, remaining: float, born: float) -> None:
        self.k = k
        self.per_sm = per_sm
        self.remaining = remaining  # fraction of one block's work
        self.born = born
        self.rate = 0.0  # block fractions per second
        self.share = 1.0  # issue share granted / issue share asked


class _Group:
    """``n`` identical SMs: same partition, same free resources, same resident blocks."""

    __slots__ = ("blocks", "entries", "n", "part", "regs", "smem", "threads")

    def __init__(self, n: int, part: str, threads: int, regs: int, smem: int, blocks: int) -> None:
        self.n = n
        self.part = part
        self.threads = threads
        self.regs = regs
        self.smem = smem
        self.blocks = blocks
        self.entries: list[_Entry] = []

    def clone(self, n: int) -> _Group:
        g = _Group(n, self.part, self.threads, self.regs, self.smem, self.blocks)
        g.entries = [_Entry(e.k, e.per_sm, e.remaining, e.born) for e in self.entries]
        for src, dst in zip(self.entries, g.entries, strict=True):
            dst.rate, dst.share = src.rate, src.share
        return g

    def key(self) -> tuple[Any, ...]:
        return (self.part, self.threads, self.regs, self.smem, self.blocks,
                tuple((id(e.k), e.per_sm, e.remaining) for e in self.entries))


class _Gpu:
    __slots__ = ("ce_free", "ce_waiting", "clock_factor", "groups", "model", "pending", "rank")

    def __init__(self, rank: int, model: GpuModel) -> None:
        self.rank = rank
        self.model = model
        self.clock_factor = 1.0
        m = model
        main = m.sm_count - m.comm_reserved_sms
        self.groups = [_Group(main, "main", m.threads_per_sm, m.registers_per_sm, m.shared_mem_per_sm_bytes,
                              m.blocks_per_sm)]
        if m.comm_reserved_sms:
            self.groups.append(_Group(m.comm_reserved_sms, "reserved", m.threads_per_sm, m.registers_per_sm,
                                      m.shared_mem_per_sm_bytes, m.blocks_per_sm))
        self.pending: list[_Kernel] = []
        self.ce_free = m.copy_engines
        self.ce_waiting: list[_Member] = []


@dataclass
class _Member:
    """One rank's op in a flow."""

    op: Op
    rank: int
    done: simpy.Event
    kernel: _Kernel | None  # SM-based collectives hold blocks; copy-engine flows do not
    launch_s: float
    arrived: bool = False
    has_ce: bool = False
    start_s: float = _INF
    end_s: float = _INF
    wait_sm_s: float = 0.0
    wait_peers_s: float = 0.0
    share_sm_s: float = 0.0
    share_hbm_s: float = 0.0
    share_link_s: float = 0.0


@dataclass
class _Flow:
    demand: FlowDemand
    members: dict[int, _Member] = field(default_factory=dict)
    latency_left_s: float = 0.0
    remaining_bytes: float = 0.0
    phase: str = "waiting"  # waiting -> latency -> data -> done
    rate: float = 0.0
    cap: float = 0.0
    bottleneck: str = ""
    sm_factor: float = 1.0
    start_s: float = _INF
    end_s: float = _INF
    usage: list[tuple[Any, float]] = field(default_factory=list)


@dataclass(frozen=True)
class EngineOptions:
    # Record counter samples (SM occupancy, HBM, links) for timelines; off for benchmarks.
    counters: bool = True
    # Check at every event that no SM limit or channel is over-subscribed (tests turn this on).
    check_invariants: bool = False


class Engine:
    """Simulates a :class:`Workload` on a :class:`MachineModel`; :meth:`run` returns the Timeline."""

    def __init__(self, workload: Workload, machine: MachineModel, options: EngineOptions | None = None,
                 priorities: dict[tuple[int, str], int] | None = None) -> None:
        if workload.n_ranks > machine.n_ranks:
            raise OvsimError(f"workload has {workload.n_ranks} ranks, machine {machine.n_ranks}", field="ranks")
        self.workload = workload
        self.machine = machine
        self.opts = options or EngineOptions()
        self.env = simpy.Environment()
        self.gpus = [_Gpu(r, g) for r, g in enumerate(machine.gpus)]
        self.priority = dict(priorities or {})
        for s in workload.streams:
            self.priority.setdefault((s.rank, s.name), s.priority)
        self.done: dict[str, simpy.Event] = {op.id: self.env.event() for op in workload.ops}
        self.kernels: list[_Kernel] = []
        self.running: list[_Kernel] = []  # launched compute kernels not finished
        self.flows: dict[str, _Flow] = {}
        self.active_flows: list[_Flow] = []
        self.seq = 0
        self.last_t = 0.0
        self.version = 0
        self.resolve_pending = False
        self.dirty_gpus: set[int] = set()
        self.counter_rows: list[tuple[float, int, str, float]] = []
        self.last_counter: dict[tuple[int, str], float] = {}
        self.link_keys: list[LinkKey] = list(machine.links)
        self.link_index = {k: i for i, k in enumerate(self.link_keys)}

    # -- streams -------------------------------------------------------------------------------

    def run(self) -> Timeline:
        by_stream: dict[tuple[int, str], list[Op]] = {}
        for op in self.workload.ops:
            by_stream.setdefault((op.rank, op.stream), []).append(op)
        for key, ops in by_stream.items():
            self.env.process(self._stream(key, ops))
        self.env.run()
        unfinished = [op.id for op in self.workload.ops if not self.done[op.id].triggered]
        if unfinished:
            waiting = [f.demand.group for f in self.flows.values() if f.phase == "waiting"]
            hint = f"; collective(s) {waiting[:3]} never got every rank" if waiting else ""
            raise OvsimError(f"{len(unfinished)} op(s) never finished, e.g. '{unfinished[0]}'{hint}", field="ops")
        return self._timeline()

    def _stream(self, key: tuple[int, str], ops: list[Op]) -> Generator[simpy.Event, Any, None]:
        for op in ops:
            for d in op.deps:
                ev = self.done[d]
                if not ev.processed:
                    yield ev
            if op.delay_s > 0:
                yield self.env.timeout(op.delay_s)
            if op.kind == "delay":
                self.done[op.id].succeed()
                continue
            self._launch(op, self.priority.get(key, 0))
            yield self.done[op.id]

    def set_clock_factor(self, rank: int, factor: float) -> None:
        """Scale rank's SM clock (compute-bound work slows, memory-bound work does not)."""
        if not factor > 0:
            raise OvsimError(f"clock factor must be positive, got {factor}", field="clock_factor")
        self._advance()
        self.gpus[rank].clock_factor = factor
        self._request_resolve()

    # -- launching -----------------------------------------------------------------------------

    def _launch(self, op: Op, priority: int) -> None:
        self._advance()
        now = self.env.now
        gpu = self.gpus[op.rank]
        kernel: _Kernel | None = None
        if op.kernel is not None:
            self.seq += 1
            kernel = _Kernel(op, gpu, priority, self.seq, self.done[op.id], now)
            self.kernels.append(kernel)
            bisect.insort(gpu.pending, kernel, key=_Kernel.sort_key)
            self.dirty_gpus.add(op.rank)
            if op.flow is None:
                self.running.append(kernel)
        if op.flow is not None:
            flow = self._flow(op.flow)
            member = _Member(op=op, rank=op.rank, done=self.done[op.id], kernel=kernel, launch_s=now)
            if op.rank in flow.members:
                raise OvsimError(f"rank {op.rank} joins collective '{op.flow.group}' twice", field="group")
            flow.members[op.rank] = member
            if kernel is not None:
                kernel.flow = flow
            if op.flow.uses_copy_engine:
                self._take_ce(gpu, member)
        self._request_resolve()

    def _flow(self, demand: FlowDemand) -> _Flow:
        flow = self.flows.get(demand.group)
        if flow is None:
            flow = _Flow(demand=demand, latency_left_s=demand.latency_s, remaining_bytes=demand.bytes)
            flow.usage = self._flow_usage(demand)
            self.flows[demand.group] = flow
            self.active_flows.append(flow)
        return flow

    def _flow_usage(self, d: FlowDemand) -> list[tuple[Any, float]]:
        """(resource, bytes per flow byte): ("hbm", rank) or a link key."""
        use: dict[Any, float] = {}

        def add(key: Any, c: float) -> None:
            if key in self.link_index or key[0] == "hbm":
                use[key] = use.get(key, 0.0) + c

        ranks = list(d.ranks)
        mesh = self.machine.topology == "mesh"
        if d.pattern == "local":
            add(("hbm", ranks[0]), d.hbm_coeff)
        elif d.pattern == "host":
            assert d.endpoints is not None
            src, dst = d.endpoints
            dev = dst if src < 0 else src
            add(("hbm", dev), d.hbm_coeff)
            add(("pcie_in", dst, -1) if src < 0 else ("pcie_out", src, -1), d.link_coeff)
        elif d.pattern == "p2p":
            assert d.endpoints is not None
            src, dst = d.endpoints
            add(("hbm", src), d.hbm_coeff)
            add(("hbm", dst), d.hbm_coeff)
            if mesh:
                add(("link", src, dst), d.link_coeff)
            else:
                add(("egress", src, -1), d.link_coeff)
                add(("ingress", dst, -1), d.link_coeff)
        else:
            n = len(ranks)
            for i, r in enumerate(ranks):
                add(("hbm", r), d.hbm_coeff)
                if n < 2:
                    continue
                if not mesh:
                    add(("egress", r, -1), d.link_coeff)
                    add(("ingress", r, -1), d.link_coeff)
                elif d.pattern == "all_pairs":
                    for s in ranks:
                        if s != r:
                            add(("link", r, s), d.link_coeff / (n - 1))
                else:
                    add(("link", r, ranks[(i + 1) % n]), d.link_coeff)
        return list(use.items())

    def _take_ce(self, gpu: _Gpu, member: _Member) -> None:
        if gpu.ce_free > 0:
            gpu.ce_free -= 1
            member.has_ce = True
        else:
            gpu.ce_waiting.append(member)

    def _release_ce(self, gpu: _Gpu) -> None:
        gpu.ce_free += 1
        if gpu.ce_waiting:
            m = gpu.ce_waiting.pop(0)
            gpu.ce_free -= 1
            m.has_ce = True

    # -- the event loop ------------------------------------------------------------------------

    def _request_resolve(self) -> None:
        if not self.resolve_pending:
            self.resolve_pending = True
            ev = self.env.event()
            ev.callbacks.append(self._resolve)
            ev.succeed()

    def _on_timer(self, version: int) -> Callable[[simpy.Event], None]:
        def fire(_: simpy.Event) -> None:
            if version == self.version and not self.resolve_pending:
                self._resolve(None)
        return fire

    def _resolve(self, _: simpy.Event | None) -> None:
        self.resolve_pending = False
        self._advance()
        self._finish()
        for r in sorted(self.dirty_gpus):
            self._dispatch(self.gpus[r])
        self.dirty_gpus.clear()
        self._arrivals()
        self._rates()
        self._schedule_next()

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self.last_t
        if dt <= 0:
            return
        self.last_t = now
        for gpu in self.gpus:
            for g in gpu.groups:
                for e in g.entries:
                    if e.rate > 0:
                        e.remaining -= e.rate * dt
        for k in self.running:
            self._attribute_kernel(k, dt)
        for f in self.active_flows:
            if f.phase == "latency":
                f.latency_left_s -= dt
            elif f.phase == "data":
                f.remaining_bytes -= f.rate * dt
            self._attribute_flow(f, dt)

    def _attribute_kernel(self, k: _Kernel, dt: float) -> None:
        if k.resident == 0:
            k.wait_sm_s += dt
            return
        allowed = k.gpu.model.sm_count - (k.gpu.model.comm_reserved_sms if k.partitions == ("main",) else 0)
        alone = min(k.undispatched + k.resident, allowed * k.blocks_per_sm_alone)
        f_res = min(1.0, k.resident / alone)
        f_issue = _issued_blocks(k) / k.resident
        k.wait_sm_s += dt * (1 - f_res)
        k.share_sm_s += dt * f_res * (1 - f_issue)
        k.share_hbm_s += dt * f_res * f_issue * (1 - k.theta)

    def _attribute_flow(self, f: _Flow, dt: float) -> None:
        for m in f.members.values():
            if m.end_s < _INF:
                continue
            if f.phase == "waiting":
                if m.arrived:
                    m.wait_peers_s += dt
                else:
                    m.wait_sm_s += dt
            elif f.phase == "data" and f.cap > 0:
                iso = f.demand.rate_cap_bytes_per_s
                lost_sm = 1 - f.sm_factor
                lost_rest = max(0.0, f.sm_factor - f.rate / iso)
                m.share_sm_s += dt * lost_sm
                if f.bottleneck == "hbm":
                    m.share_hbm_s += dt * lost_rest
                elif f.bottleneck == "link":
                    m.share_link_s += dt * lost_rest

    def _schedule_next(self) -> None:
        dt = _INF
        for gpu in self.gpus:
            for g in gpu.groups:
                for e in g.entries:
                    if e.rate > 0:
                        dt = min(dt, e.remaining / e.rate)
        for f in self.active_flows:
            if f.phase == "latency":
                dt = min(dt, f.latency_left_s)
            elif f.phase == "data" and f.rate > 0:
                dt = min(dt, f.remaining_bytes / f.rate)
        if dt == _INF:
            return
        self.version += 1
        t = self.env.timeout(max(0.0, dt))
        t.callbacks.append(self._on_timer(self.version))

    # -- completions ---------------------------------------------------------------------------

    def _finish(self) -> None:
        now = self.env.now
        for gpu in self.gpus:
            changed = False
            for g in gpu.groups:
                keep: list[_Entry] = []
                for e in g.entries:
                    if e.rate > 0 and e.remaining <= e.rate * _TIME_EPS:
                        self._free(g, e)
                        changed = True
                    else:
                        keep.append(e)
                g.entries = keep
            if changed:
                self.dirty_gpus.add(gpu.rank)
                self._merge(gpu)
        for k in list(self.running):
            if k.undispatched == 0 and k.resident == 0:
                k.end_s = now
                self.running.remove(k)
                k.done.succeed()
        for f in list(self.active_flows):
            if f.phase == "latency" and f.latency_left_s <= _TIME_EPS:
                f.phase = "data"
                f.latency_left_s = 0.0
            if f.phase == "data" and (f.remaining_bytes <= max(f.rate, 1.0) * _TIME_EPS):
                self._finish_flow(f, now)

    def _free(self, g: _Group, e: _Entry) -> None:
        k = e.k
        g.threads += e.per_sm * k.threads
        g.regs += e.per_sm * k.regs
        g.smem += e.per_sm * k.smem
        g.blocks += e.per_sm
        k.resident -= g.n * e.per_sm

    def _finish_flow(self, f: _Flow, now: float) -> None:
        f.phase = "done"
        f.end_s = now
        f.rate = 0.0
        self.active_flows.remove(f)
        for m in f.members.values():
            m.end_s = now
            k = m.kernel
            if k is not None:
                gpu = k.gpu
                for g in gpu.groups:
                    keep = []
                    for e in g.entries:
                        if e.k is k:
                            self._free(g, e)
                        else:
                            keep.append(e)
                    g.entries = keep
                if k in gpu.pending:
                    gpu.pending.remove(k)
                k.undispatched = 0
                k.end_s = now
                self._merge(gpu)
                self.dirty_gpus.add(gpu.rank)
            if m.has_ce:
                self._release_ce(self.gpus[m.rank])
            m.done.succeed()

    def _merge(self, gpu: _Gpu) -> None:
        merged: dict[tuple[Any, ...], _Group] = {}
        out: list[_Group] = []
        for g in gpu.groups:
            key = g.key()
            if key in merged:
                merged[key].n += g.n
            else:
                merged[key] = g
                out.append(g)
        gpu.groups = out

    # -- the block dispatcher ------------------------------------------------------------------

    def _dispatch(self, gpu: _Gpu) -> None:
        now = self.env.now
        placed_any = False
        while gpu.pending:
            k = gpu.pending[0]
            self._place(gpu, k, now)
            if k.undispatched > 0:
                break  # leftover policy: later kernels wait until this one has placed every block
            gpu.pending.pop(0)
            placed_any = True
        if placed_any or gpu.pending:
            self._merge(gpu)

    def _place(self, gpu: _Gpu, k: _Kernel, now: float) -> None:
        while k.undispatched > 0:
            best: _Group | None = None
            best_fit = 0
            for g in gpu.groups:
                if g.part not in k.partitions:
                    continue
                fit = _fit(g.threads, g.regs, g.smem, g.blocks, k)
                if fit > best_fit or (fit == best_fit and fit > 0 and best is not None and g.n > best.n):
                    best, best_fit = g, fit
            if best is None:
                return
            if k.undispatched < best.n:
                rest = best.clone(best.n - k.undispatched)
                best.n = k.undispatched
                gpu.groups.insert(gpu.groups.index(best) + 1, rest)
            best.threads -= k.threads
            best.regs -= k.regs
            best.smem -= k.smem
            best.blocks -= 1
            for e in best.entries:
                if e.k is k and e.born == now and e.remaining == 1.0:
                    e.per_sm += 1
                    break
            else:
                best.entries.append(_Entry(k, 1, 1.0 if k.flow is None else _INF, now))
            k.undispatched -= best.n
            k.resident += best.n
            if k.start_s == _INF:
                k.start_s = now

    def _arrivals(self) -> None:
        now = self.env.now
        for f in self.active_flows:
            if f.phase != "waiting":
                continue
            for m in f.members.values():
                if not m.arrived:
                    if m.kernel is not None:
                        m.arrived = m.kernel.resident > 0
                    else:
                        m.arrived = m.has_ce or not m.op.flow or not m.op.flow.uses_copy_engine
                    if m.arrived:
                        m.start_s = m.kernel.start_s if m.kernel is not None else now
            if len(f.members) == len(f.demand.ranks) and all(m.arrived for m in f.members.values()):
                f.start_s = now
                f.phase = "latency" if f.latency_left_s > 0 else "data"
                if f.phase == "data" and f.remaining_bytes <= 0:
                    self._finish_flow(f, now)

    # -- rates ---------------------------------------------------------------------------------

    def _rates(self) -> None:
        nccl_issue = self.machine.nccl_issue_fraction
        kernel_demand: dict[_Kernel, float] = {}
        for gpu in self.gpus:
            clock = gpu.clock_factor
            for g in gpu.groups:
                if not g.entries:
                    continue
                asks = [nccl_issue if e.k.flow is not None else e.k.issue for e in g.entries]
                shares = water_fill(asks, [e.per_sm for e in g.entries], 1.0)
                for e, ask, got in zip(g.entries, asks, shares, strict=True):
                    e.share = got / ask if ask > 0 else 1.0
                    k = e.k
                    if k.flow is not None:
                        e.rate = 0.0
                        continue
                    e.rate = e.share * (clock if k.clock_sensitive else 1.0) / k.t_block
                    if k.bytes_per_block > 0:
                        kernel_demand[k] = kernel_demand.get(k, 0.0) + g.n * e.per_sm * e.rate * k.bytes_per_block

        # Channels: HBM per GPU, then links.
        n_gpu = len(self.gpus)
        capacity = [gpu.model.hbm_bytes_per_s for gpu in self.gpus] + [self.machine.links[k] for k in self.link_keys]
        caps: list[float] = []
        weights: list[float] = []
        usage: list[list[tuple[int, float]]] = []
        owners: list[Any] = []
        hbm_has_kernel = [False] * n_gpu
        hbm_has_flow = [False] * n_gpu
        for k, demand in kernel_demand.items():
            caps.append(demand)
            weights.append(1.0)
            usage.append([(k.rank, 1.0)])
            owners.append(k)
            hbm_has_kernel[k.rank] = True
        for f in self.active_flows:
            if f.phase != "data":
                f.rate = 0.0
                continue
            d = f.demand
            factor = 1.0
            if not d.uses_copy_engine:
                # NCCL moves data no faster than its resident channels can issue copies.
                for m in f.members.values():
                    if m.kernel is not None:
                        factor = min(factor, _issued_blocks(m.kernel) / m.kernel.blocks)
            f.sm_factor = factor
            f.cap = d.rate_cap_bytes_per_s * factor
            use: list[tuple[int, float]] = []
            for key, c in f.usage:
                if key[0] == "hbm":
                    use.append((key[1], c))
                    hbm_has_flow[key[1]] = True
                else:
                    use.append((n_gpu + self.link_index[key], c))
            # Shares are fair in HBM bytes: a flow's rate counts hbm_coeff bytes per byte moved. The
            # floor keeps a flow that barely touches HBM from an unbounded weight.
            caps.append(f.cap)
            weights.append(d.hbm_weight / max(d.hbm_coeff, 0.05))
            usage.append(use)
            owners.append(f)
        for r in range(n_gpu):
            if hbm_has_kernel[r] and hbm_has_flow[r]:
                capacity[r] *= self.machine.hbm_mix_efficiency
        alloc = max_min_rates(caps, weights, usage, capacity)
        if self.opts.check_invariants:
            self._check(capacity, alloc.rates, usage)
        for i, owner in enumerate(owners):
            x = alloc.rates[i]
            if isinstance(owner, _Kernel):
                owner.theta = x / caps[i] if caps[i] > 0 else 1.0
            else:
                owner.rate = x
                b = alloc.bottleneck[i]
                owner.bottleneck = "" if b == CAP else ("hbm" if b < n_gpu else "link")
        for k in self.running:
            if k not in kernel_demand:
                k.theta = 1.0
        if kernel_demand:
            for gpu in self.gpus:
                for g in gpu.groups:
                    for e in g.entries:
                        if e.k.theta < 1.0:
                            e.rate *= e.k.theta
        if self.opts.counters:
            self._sample(capacity, alloc.rates, usage, n_gpu)

    def _check(self, capacity: list[float], rates: list[float], usage: list[list[tuple[int, float]]]) -> None:
        load = [0.0] * len(capacity)
        for x, use in zip(rates, usage, strict=True):
            for r, c in use:
                load[r] += x * c
        for r, (used, cap) in enumerate(zip(load, capacity, strict=True)):
            if used > cap * (1 + 1e-9):
                raise RuntimeError(f"channel {r} over-subscribed: {used} > {cap}")
        for gpu in self.gpus:
            m = gpu.model
            if sum(g.n for g in gpu.groups) != m.sm_count:
                raise RuntimeError(f"rank {gpu.rank}: SM groups cover {sum(g.n for g in gpu.groups)} SMs")
            for g in gpu.groups:
                used_threads = sum(e.per_sm * e.k.threads for e in g.entries)
                used_regs = sum(e.per_sm * e.k.regs for e in g.entries)
                used_smem = sum(e.per_sm * e.k.smem for e in g.entries)
                used_blocks = sum(e.per_sm for e in g.entries)
                if (min(g.threads, g.regs, g.smem, g.blocks) < 0 or used_threads > m.threads_per_sm
                        or used_regs > m.registers_per_sm or used_smem > m.shared_mem_per_sm_bytes
                        or used_blocks > m.blocks_per_sm
                        or g.threads + used_threads != m.threads_per_sm or g.blocks + used_blocks != m.blocks_per_sm):
                    raise RuntimeError(f"rank {gpu.rank}: an SM's limits are over-subscribed or lost")
            for k in self.running:
                if k.resident < 0 or k.undispatched < 0:
                    raise RuntimeError(f"kernel {k.id}: negative block count")

    def _sample(self, capacity: list[float], rates: list[float], usage: list[list[tuple[int, float]]],
                n_gpu: int) -> None:
        now = self.env.now
        load = [0.0] * len(capacity)
        for x, use in zip(rates, usage, strict=True):
            for r, c in use:
                load[r] += x * c
        for gpu in self.gpus:
            busy = sum(g.n for g in gpu.groups if g.entries)
            self._counter(now, gpu.rank, "sm_busy_fraction", busy / gpu.model.sm_count)
            self._counter(now, gpu.rank, "hbm_bytes_per_s", load[gpu.rank])
            self._counter(now, gpu.rank, "clock_factor", gpu.clock_factor)
        link_out = [0.0] * n_gpu
        for i, key in enumerate(self.link_keys):
            if key[0] in ("egress", "link") and key[1] < n_gpu:
                link_out[key[1]] += load[n_gpu + i]
        for r in range(n_gpu):
            self._counter(now, r, "link_out_bytes_per_s", link_out[r])

    def _counter(self, t: float, rank: int, name: str, value: float) -> None:
        key = (rank, name)
        if self.last_counter.get(key) != value:
            self.last_counter[key] = value
            self.counter_rows.append((t, rank, name, value))

    # -- output --------------------------------------------------------------------------------

    def _timeline(self) -> Timeline:
        rows: list[dict[str, Any]] = []
        by_id = {k.id: k for k in self.kernels}
        members = {m.op.id: m for f in self.flows.values() for m in f.members.values()}
        for op in self.workload.ops:
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
                           wait_peers_s=0.0)
            row["blocks"] = op.kernel.blocks if op.kernel is not None else 0
            row["bytes"] = op.flow.bytes if op.flow is not None else (op.kernel.hbm_bytes if op.kernel else 0.0)
            rows.append(row)
        for f in self.flows.values():
            rows.append({
                "id": f"flow:{f.demand.group}", "name": f.demand.group, "kind": "flow", "rank": -1, "stream": "",
                "isolated_s": f.demand.latency_s + (f.demand.bytes / f.demand.rate_cap_bytes_per_s
                                                    if f.demand.bytes > 0 else 0.0),
                "launch_s": min(m.launch_s for m in f.members.values()), "start_s": f.start_s, "end_s": f.end_s,
                "wait_sm_s": 0.0, "share_sm_s": 0.0, "share_hbm_s": 0.0, "share_link_s": 0.0,
                "wait_peers_s": 0.0, "blocks": 0, "bytes": f.demand.bytes,
            })
        counters = [dict(zip(COUNTER_COLUMNS, r, strict=True)) for r in self.counter_rows]
        return timeline_from_rows(rows, counters)
