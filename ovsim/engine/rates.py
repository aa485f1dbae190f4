"""The rate solver: how fast every resident block and every flow moves at this instant.

Per GPU, each SM's issue throughput is shared among its resident blocks (max-min with per-block
demands); HBM's loaded-latency law then lowers the demands of whoever waits on memory; HBM, links,
PCIe and NICs are shared among kernels and flows (weighted max-min with demand caps,
:mod:`ovsim.engine.channel`). A kernel's HBM grant sets ``hbm_pace_share``, the share of its blocks'
pace it keeps; a flow's grant is its rate.

A new resource needs no change here. One that flows cross (a port, a switch, a NIC: NICs came
this way) is a capacity in ``MachineModel.links`` under its own key, and the key with its bytes per
flow byte in :func:`ovsim.engine.routing.flow_usage`. One that kernels use beside HBM is a
:class:`~ovsim.engine.resources.KernelResource` in ``MachineModel.kernel_resources``. Every such
channel is shared like the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ovsim.engine.channel import CAP, latency_slowdowns, max_min_rates, water_fill
from ovsim.engine.machine import MachineModel
from ovsim.engine.resources import KernelResource
from ovsim.engine.state import FlowState, GpuState, KernelState, check_sms
from ovsim.hw.calib import PRESSURE_MAX
from ovsim.models.ir import Op


@dataclass
class ChannelLoads:
    """The channels one solve shared: each resource's index (("hbm", rank) or a link key), its
    capacity in bytes/s, and each user's rate with its (channel, bytes per byte) usage."""

    channel: dict[Any, int]
    capacity: list[float]
    rates: list[float]
    usage: list[list[tuple[int, float]]]


def slowed(users: Sequence[tuple[object, float, float]], demand: dict[KernelState, float], capacity: float,
           exponent: float, before: dict[KernelState, float]) -> list[tuple[FlowState, float]]:
    """HBM's loaded-latency law on one GPU's users, (owner, share of the HBM peak it moves alone,
    share of its time waiting on memory): lowers the demands of its kernels that it slows (in
    place in ``demand``, keeping theirs before in ``before``); returns the flows it slows, with
    their slowdowns."""
    if len(users) < 2 or not any(w > 0 for _, _, w in users):
        return []
    slow, _ = latency_slowdowns([x for _, x, _ in users], [w for _, _, w in users], capacity, exponent)
    flows: list[tuple[FlowState, float]] = []
    for i in range(len(users)):
        s = slow[i]
        if s <= 1.0:
            continue
        owner = users[i][0]
        if isinstance(owner, KernelState):
            before[owner] = demand[owner]
            demand[owner] = demand[owner] / s
        elif isinstance(owner, FlowState):
            flows.append((owner, s))
    return flows


def flow_weight(machine: MachineModel, f: FlowState) -> float:
    """A flow's weight where it shares HBM and links. Shares are fair in HBM bytes: a flow's rate
    counts hbm_coeff bytes per byte moved; the floor keeps a flow that barely touches HBM from an
    unbounded weight."""
    d = f.demand
    ce_weight = machine.copy_engine_hbm_weight if d.uses_copy_engine else 1.0
    return ce_weight * d.hbm_weight / max(d.hbm_coeff, 0.05)


def channel_index(machine: MachineModel, channel: dict[Any, int], capacity: list[float], key: Any) -> int:
    """The index of a flow's channel ``key`` (HBM already indexed, a link added at its capacity on
    first use)."""
    idx = channel.get(key)
    if idx is None:
        idx = channel[key] = len(capacity)
        capacity.append(machine.links[key])
    return idx


def sm_factor(f: FlowState) -> tuple[float, int]:
    """The share of its issue a collective's slowest resident member gets (NCCL moves data no
    faster than its channels can issue copies; 1 for a copy-engine flow), and that member's rank
    (-1: none gets less than all)."""
    factor = 1.0
    lowest = -1
    if not f.demand.uses_copy_engine:
        for q, m in f.members.items():
            k = m.kernel
            if k is not None:
                x = k.full_issue_blocks / k.blocks
                if x < factor:
                    factor = x
                    lowest = q
    return factor, lowest


class RateSolver:
    """Sets block rates, kernels' HBM shares and flows' rates on the GPUs of a run."""

    def __init__(self, machine: MachineModel, gpus: list[GpuState], *, any_load: bool,
                 memory_share_cls: dict[int, float], keep_loads: bool, check_invariants: bool) -> None:
        self.machine = machine
        self.gpus = gpus
        # Some kernel's pace goes with how many SMs run such blocks (KernelDemand.load_share).
        self.any_load = any_load
        # Rate classes of memory-bound kernels and the share of their time that follows the clock.
        self.memory_share_cls = memory_share_cls
        self.keep_loads = keep_loads
        self.check_invariants = check_invariants
        self.has_pressure = any(v > 0 for v in machine.nccl_memory_pressure.values())
        # (share, weight) by protocol, looked up once: the pressure is asked at every coupled solve.
        self._protocol_pressure: dict[str, tuple[float, float]] = {}
        # HBM's loaded-latency law (channel.latency_slowdowns), where the calibration has one.
        self.latency_law = machine.hbm_latency_capacity > 0
        self.resources: tuple[KernelResource, ...] = machine.kernel_resources
        # Each GPU's coupled set (coupled), kept while the flows moving data are the same, and
        # Flows.moving_changes when they last changed (each flow solved keeps it: coupled.py).
        self._sets: dict[int, list[int]] = {}
        self.moving_at = -1
        # Per kernel, (resource index, bytes of it per HBM byte) of the resources it uses.
        self._uses: dict[KernelState, list[tuple[int, float]]] = {}

    def solve(self, ranks: list[int], moving: bool) -> ChannelLoads | None:
        """Rates of everything on the GPUs in ``ranks``: closed over running flows, so no flow or
        channel outside them is affected. ``moving``: some flow of the run moves data. Returns the
        channels' loads where the solver keeps them (counters, checks) and any were shared."""
        demands: list[tuple[int, dict[KernelState, float]]] = []
        for r in ranks:
            demand = self.share_sms(self.gpus[r])
            if demand:
                demands.append((r, self.own_demand(demand)))
        return self._shared(ranks, demands, self.moving_flows(ranks) if moving else [])

    def solve_beside(self, ranks: list[int], fresh: dict[int, None]) -> tuple[bool, ChannelLoads | None]:
        """Solve the GPUs in ``ranks`` (closed over the flows moving data) where only those in
        ``fresh`` changed: the others keep their SMs' rates and the HBM demands their last solve
        left (``GpuState.hbm_demand``), and are only shared with. Returns (True, loads) where the
        solve leaves every kernel of the others and every flow they carry as it was, so that they
        need not be brought up to date; otherwise (False, None) with all of it put back as it was,
        for a full solve once they are."""
        demands: list[tuple[int, dict[KernelState, float]]] = []
        paces: list[tuple[KernelState, float]] = []
        gpus = self.gpus
        for r in ranks:
            gpu = gpus[r]
            if r in fresh:
                demand = self.share_sms(gpu)
            else:
                for k in gpu.running:
                    paces.append((k, k.hbm_pace_share))
                    k.hbm_pace_share = k.hbm_pace_share_alone  # as the SM step of a full solve leaves it
                demand = gpu.hbm_demand
            if demand:
                demands.append((r, self.own_demand(demand)))
        moving = self.moving_flows(ranks)
        flows = [(f, (f.rate, f.effective_cap_bytes_per_s, f.sm_factor, f.latency_slow, f.bottleneck))
                 for f in moving]
        loads = self._shared(ranks, demands, moving)
        same = all(k.hbm_pace_share == pace for k, pace in paces) and all(
            (f.rate, f.effective_cap_bytes_per_s, f.sm_factor, f.latency_slow, f.bottleneck) == before
            or all(q in fresh for q in f.ranks) for f, before in flows)
        if same:
            return True, loads
        for k, pace in paces:
            k.hbm_pace_share = pace
        for f, before in flows:
            f.rate, f.effective_cap_bytes_per_s, f.sm_factor, f.latency_slow, f.bottleneck = before
        return False, None

    def own_demand(self, demand: dict[KernelState, float]) -> dict[KernelState, float]:
        """``demand`` as the shared step may take it: the latency law lowers demands in place, and
        ``GpuState.hbm_demand`` must keep them as the SM step left them; without the law nothing
        changes them, and the copy (at every event) is skipped."""
        return dict(demand) if self.latency_law else demand

    def coupled(self, ranks: list[int], moving_changes: int) -> list[int]:
        """``ranks`` and every GPU a flow moving data joins to them, directly or through others,
        sorted: a running collective's rates depend on every GPU it uses. ``moving_changes``
        counts the changes of which flows move (Flows.moving_changes): each GPU's set is kept
        until it moves, since an event asks for it again and again. Not to be changed."""
        if moving_changes != self.moving_at:
            self.moving_at = moving_changes
            self._sets.clear()
        sets = self._sets
        if len(ranks) == 1:
            got = sets.get(ranks[0])
            if got is None:
                got = self._coupled(ranks)
                for q in got:
                    sets[q] = got
            return got
        union: set[int] = set()
        for r in ranks:
            if r not in union:
                got = sets.get(r)
                if got is None:
                    got = self._coupled([r])
                    for q in got:
                        sets[q] = got
                union.update(got)
        return sorted(union)

    def _coupled(self, ranks: list[int]) -> list[int]:
        closed = dict.fromkeys(ranks)
        stack = list(ranks)
        seen: set[int] = set()
        while stack:
            for f in self.gpus[stack.pop()].flows:
                if f.phase == "data" and id(f) not in seen:
                    seen.add(id(f))
                    for q in f.ranks:
                        if q not in closed:
                            closed[q] = None
                            stack.append(q)
        return sorted(closed)

    def moving_flows(self, ranks: list[int]) -> list[FlowState]:
        """The flows moving data through the GPUs in ``ranks``, each once, in rank order."""
        flows: list[FlowState] = []
        seen: set[int] = set()
        for r in ranks:
            for f in self.gpus[r].flows:
                if f.phase == "data" and id(f) not in seen:
                    seen.add(id(f))
                    flows.append(f)
        return flows

    def share_sms(self, gpu: GpuState) -> dict[KernelState, float]:
        """Share each SM's issue slots among its blocks and set their rates; returns (and keeps as
        ``gpu.hbm_demand``) the HBM bytes/s each kernel would move at them, within its own cap."""
        mult = gpu.rate_multipliers
        groups = gpu.groups
        for g in groups:
            for e in g.entries:
                e.kernel.full_issue_blocks = 0.0
        demand: dict[KernelState, float] = {}
        # The fraction of the GPU's SMs running blocks that load the shared memory system
        # (GEMM tiles, KernelDemand.load_share): the fewer, the faster each of those runs.
        busy = 0
        if self.any_load:
            for g in groups:
                for e in g.entries:
                    if e.kernel.load_share > 0:
                        busy += g.n_sms
                        break
        idle_share = 1.0 - busy / gpu.model.sm_count
        for g in groups:
            entries = g.entries
            if not entries:
                continue
            if len(entries) == 1:
                e = entries[0]
                ask = e.kernel.issue_share_asked
                if ask > 0:
                    x = 1.0 / e.per_sm
                    cap = e.kernel.issue_share_cap
                    e.share = (x if x < cap else cap) / ask
                else:
                    e.share = 1.0
            else:
                shares = water_fill([e.kernel.issue_share_cap for e in entries], [e.per_sm for e in entries], 1.0)
                for i in range(len(entries)):
                    e = entries[i]
                    ask = e.kernel.issue_share_asked
                    e.share = shares[i] / ask if ask > 0 else 1.0
            n = g.n_sms
            for e in entries:
                k = e.kernel
                blocks = n * e.per_sm
                k.full_issue_blocks += blocks * e.share
                if k.flow is not None:
                    e.rate = 0.0
                    continue
                e.rate = e.share * mult[k.clock_cls] / k.block_time_s
                if k.load_share > 0:
                    e.rate /= 1.0 - k.load_share * idle_share
                if k.bytes_per_block > 0:
                    demand[k] = demand.get(k, 0.0) + blocks * e.rate * k.bytes_per_block
        for k in gpu.running:
            k.hbm_pace_share = k.hbm_pace_share_alone = 1.0
        for k, raw in demand.items():
            # The clock slows a memory-bound kernel's whole rate by the part of its time that
            # follows it, even one whose blocks could move data faster than HBM lets them.
            cap = k.hbm_cap_bytes_per_s
            if k.clock_cls in self.memory_share_cls:
                cap *= mult[k.clock_cls]
            if raw > cap:
                k.hbm_pace_share = k.hbm_pace_share_alone = cap / raw
                demand[k] = cap
        gpu.hbm_demand = demand
        return demand

    def _shared(self, ranks: list[int], demands: list[tuple[int, dict[KernelState, float]]],
                flows: list[FlowState]) -> ChannelLoads | None:
        """Share HBM, links and the collectives' caps among the kernels (``demands``, changed in
        place by the latency law) and the flows moving data (``flows``, :meth:`moving_flows`: the
        others take no bandwidth, and their rates are never read) of the GPUs in ``ranks``."""
        pressure = self.resident_pressure(ranks) if self.has_pressure else []
        for f in flows:
            # NCCL moves data no faster than its resident channels can issue copies.
            f.sm_factor, f.sm_lowest = sm_factor(f)
            f.effective_cap_bytes_per_s = f.demand.rate_cap_bytes_per_s * f.sm_factor
        # HBM's loaded latency slows whoever waits on memory (channel.latency_slowdowns): their
        # demands fall before bandwidth is shared.
        asked_alone: dict[KernelState, float] = {}
        if self.latency_law:
            asked_alone = self.latency(demands, flows, pressure)
        if not flows and not pressure and not self.resources and not self.keep_loads and not self.check_invariants:
            self._hbm_only(demands, asked_alone)
            return None

        # Channels: HBM of each GPU in ranks, the registered kernel resources on each, then the
        # links the flows use.
        channel: dict[Any, int] = {("hbm", r): i for i, r in enumerate(ranks)}
        capacity = [self.gpus[r].model.hbm_bytes_per_s for r in ranks]
        for res in self.resources:
            for r in ranks:
                channel[(res.name, r)] = len(capacity)
                capacity.append(res.bytes_per_s(self.gpus[r].model))
        caps: list[float] = []
        weights: list[float] = []
        usage: list[list[tuple[int, float]]] = []
        owners: list[KernelState | FlowState | None] = []
        hbm_has_kernel: set[int] = set()
        hbm_has_flow: set[int] = set()
        for r, demand in demands:
            hbm = [(channel[("hbm", r)], 1.0)]
            for k, asked in demand.items():
                caps.append(asked)
                weights.append(1.0)
                usage.append(self._kernel_usage(k, r, hbm, channel) if self.resources else hbm)
                owners.append(k)
            hbm_has_kernel.add(r)
        for f in flows:
            use: list[tuple[int, float]] = []
            for key, c in f.usage:
                if key[0] == "hbm":
                    hbm_has_flow.add(key[1])
                use.append((channel_index(self.machine, channel, capacity, key), c))
            caps.append(f.effective_cap_bytes_per_s)
            weights.append(flow_weight(self.machine, f))
            usage.append(use)
            owners.append(f)
        for r, share, weight in pressure:
            # A resident collective's memory-system traffic: it does not back off, so it asks for a
            # fixed share of HBM, with its protocol's weight, whether or not its data is moving.
            hbm_has_flow.add(r)
            caps.append(share * capacity[channel[("hbm", r)]])
            weights.append(weight)
            usage.append([(channel[("hbm", r)], 1.0)])
            owners.append(None)
        for r in hbm_has_kernel & hbm_has_flow:
            capacity[channel[("hbm", r)]] *= self.machine.hbm_mix_efficiency
        alloc = max_min_rates(caps, weights, usage, capacity)
        if self.check_invariants:
            self.check_loads(ranks, capacity, alloc.rates, usage)
        n_hbm = len(ranks)
        for i, owner in enumerate(owners):
            x = alloc.rates[i]
            if owner is None:
                continue
            if isinstance(owner, KernelState):
                full = asked_alone.get(owner, caps[i])
                owner.hbm_pace_share = (x / full if full > 0 else 1.0) * owner.hbm_pace_share_alone
            else:
                owner.rate = x
                b = alloc.bottleneck[i]
                owner.bottleneck_hbm = ranks[b] if 0 <= b < n_hbm else -1
                owner.moving_at = self.moving_at
                # A cap lowered by HBM's latency is HBM holding the flow back.
                owner.bottleneck = (("hbm" if owner.latency_slow > 1.0 else "") if b == CAP
                                    else ("hbm" if b < n_hbm else "link"))
        return ChannelLoads(channel, capacity, alloc.rates, usage) if self.keep_loads else None

    def _kernel_usage(self, k: KernelState, r: int, hbm: list[tuple[int, float]],
                      channel: dict[Any, int]) -> list[tuple[int, float]]:
        """The channels kernel ``k`` on GPU ``r`` uses, per HBM byte: HBM, then each registered
        resource it loads."""
        uses = self._uses.get(k)
        if uses is None:
            demand = k.op.kernel
            assert demand is not None
            uses = self._uses[k] = [(i, c) for i, res in enumerate(self.resources)
                                    if (c := res.per_hbm_byte(demand)) > 0]
        return hbm + [(channel[(self.resources[i].name, r)], c) for i, c in uses]

    def forget(self, k: KernelState) -> None:
        """Drop what the solver kept of a finished kernel."""
        self._uses.pop(k, None)

    def resident_pressure(self, ranks: list[int]) -> list[tuple[int, float, float]]:
        """(rank, share of HBM, weight) of every SM collective with blocks resident on ``ranks``: its
        protocol's share per block times its resident blocks, at most ``PRESSURE_MAX``."""
        out: list[tuple[int, float, float]] = []
        if not self.has_pressure:
            return out
        for r in ranks:
            for f in self.gpus[r].flows:
                m = f.members.get(r)
                if m is None or m.kernel is None or m.kernel.resident == 0 or f.demand.uses_copy_engine:
                    continue
                protocol = f.demand.protocol
                pw = self._protocol_pressure.get(protocol)
                if pw is None:
                    pw = self._protocol_pressure[protocol] = self.machine.pressure_of(protocol)
                share, weight = pw
                if share > 0:
                    total = share * m.kernel.resident
                    out.append((r, total if total < PRESSURE_MAX else PRESSURE_MAX, weight))
        return out

    def _hbm_only(self, demands: list[tuple[int, dict[KernelState, float]]],
                  asked_alone: dict[KernelState, float]) -> None:
        """No flow moves data on these GPUs: each HBM is shared among its kernels alone (max-min
        with demand caps, which is a water fill). ``asked_alone``: the demands of kernels the
        latency law slowed, before it did."""
        for r, demand in demands:
            cap = self.gpus[r].model.hbm_bytes_per_s
            total = 0.0
            for d in demand.values():
                total += d
            if total <= cap * (1 + 1e-9):
                if not asked_alone:
                    continue  # every kernel gets what it asks, as alone
                for k, d in demand.items():
                    full = asked_alone.get(k, d)
                    if full != d:
                        k.hbm_pace_share = (d / full if full > 0 else 1.0) * k.hbm_pace_share_alone
                continue
            ks = list(demand)
            asked = list(demand.values())
            got = water_fill(asked, [1] * len(ks), cap)
            for i in range(len(ks)):
                k, d, x = ks[i], asked[i], got[i]
                full = asked_alone.get(k, d)
                if full != d or x != d:
                    k.hbm_pace_share = (x / full if full > 0 else 1.0) * k.hbm_pace_share_alone

    def memory_wait(self, op: Op) -> float:
        """The share of a kernel's time alone that waits on memory, for the latency law: a
        memory-bound kernel's time less the part that follows the SM clock, none of a
        compute-bound kernel's (its pipelines hide latency) or of a collective's kernel (its flow
        moves the data)."""
        k = op.kernel
        if k is None or op.flow is not None or k.hbm_bytes <= 0:
            return 0.0
        if k.memory_wait is not None:
            return k.memory_wait
        if k.clock_sensitive:
            return 0.0
        return 1.0 - self.machine.memory_clock_share.get(op.kind, 0.0)

    def latency(self, demands: list[tuple[int, dict[KernelState, float]]], flows: list[FlowState],
                 pressure: list[tuple[int, float, float]]) -> dict[KernelState, float]:
        """Apply HBM's loaded-latency law on each GPU: lower the demands of kernels (in place in
        ``demands``) and the caps of flows by their slowdowns; returns the kernels' demands
        before, for their pace. A flow spanning GPUs takes its largest slowdown; a collective's
        pressure loads the memory and does not slow."""
        if not flows and not pressure and all(len(d) < 2 for _, d in demands):
            return {}  # no HBM has two users: nobody waits on another's traffic
        m = self.machine
        kappa, q = m.hbm_latency_capacity, m.hbm_latency_exponent
        users: dict[int, list[tuple[KernelState | FlowState | int, float, float]]] = {}
        for r, demand in demands:
            peak = self.gpus[r].model.hbm_peak_bytes_per_s
            users[r] = [(k, d / peak, k.memory_wait_share) for k, d in demand.items() if d > 0]
        yielding = m.copy_engine_hbm_weight < 1.0 and any(f.demand.uses_copy_engine for f in flows)
        by_rank = dict(demands)
        left: dict[int, float] = {}
        for f in flows:
            wait = 0.0 if f.demand.uses_copy_engine else m.collective_memory_wait
            for key, c in f.usage:
                if key[0] == "hbm" and c > 0:
                    r = key[1]
                    moved = f.effective_cap_bytes_per_s * c
                    if yielding and f.demand.uses_copy_engine:
                        # A copy engine yielding to kernels moves what they leave of HBM.
                        if r not in left:
                            left[r] = self.left_to_copies(r, by_rank.get(r, {}), flows, pressure)
                        moved = min(moved, left[r])
                    users.setdefault(r, []).append((f, moved / self.gpus[r].model.hbm_peak_bytes_per_s, wait))
        for i, (r, share, _) in enumerate(pressure):
            # A resident collective's pressure is a fixed share: it does not back off, and it
            # raises the latency the others see.
            users.setdefault(r, []).append((i, share * self.gpus[r].model.hbm_bytes_per_s
                                            / self.gpus[r].model.hbm_peak_bytes_per_s, 0.0))
        before: dict[KernelState, float] = {}
        flow_slow: dict[int, float] = {}
        for f in flows:
            f.slow_at.clear()
        for r, us in users.items():
            for f, s in slowed(us, by_rank.get(r, {}), kappa, q, before):
                f.slow_at[r] = s
                if s > flow_slow.get(id(f), 1.0):
                    flow_slow[id(f)] = s
        for f in flows:
            f.latency_slow = largest = flow_slow.get(id(f), 1.0)
            f.effective_cap_bytes_per_s /= largest
            f.slow_at_largest = sum(1 for s in f.slow_at.values() if s == largest)
        return before

    def left_to_copies(self, r: int, demand: dict[KernelState, float], flows: list[FlowState],
                       pressure: list[tuple[int, float, float]]) -> float:
        """The HBM bandwidth (bytes/s) GPU ``r``'s kernels (``demand``, before the latency law), SM
        flows (at their caps before it) and collective pressure leave to copy engines that yield
        to them."""
        model = self.gpus[r].model
        left = model.hbm_bytes_per_s - sum(demand.values())
        for f in flows:
            c = f.hbm_at.get(r, 0.0)
            if c > 0 and not f.demand.uses_copy_engine:
                left -= f.demand.rate_cap_bytes_per_s * f.sm_factor * c
        for pr, share, _ in pressure:
            if pr == r:
                left -= share * model.hbm_bytes_per_s
        return max(0.0, left)

    def check_loads(self, ranks: list[int], capacity: list[float], rates: list[float],
               usage: list[list[tuple[int, float]]]) -> None:
        load = [0.0] * len(capacity)
        for x, use in zip(rates, usage, strict=True):
            for r, c in use:
                load[r] += x * c
        for r, (used, cap) in enumerate(zip(load, capacity, strict=True)):
            if used > cap * (1 + 1e-9):
                raise RuntimeError(f"channel {r} over-subscribed: {used} > {cap}")
        for rank in ranks:
            check_sms(self.gpus[rank])

