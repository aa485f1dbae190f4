"""The discrete-event engine.

simpy keeps the clock and the event queue. Between events every activity progresses at a constant
rate, so the engine only needs an event when something changes: a launch, a block finishing, a
flow finishing, a latency elapsing. At each such instant it

1. retires what finished and launches what that released (stream order, dependencies, host delays);
2. lets each touched GPU's block dispatcher place waiting blocks (stream priority, then launch
   order; a kernel waits while an earlier kernel still has blocks to place on the same SM
   partition; no preemption; the SM group with the most room for the block first);
3. shares every SM's issue throughput among its resident blocks (max-min with per-block demands);
4. shares HBM, links and PCIe among kernels and flows (weighted max-min with demand caps,
   :mod:`ovsim.engine.channel`);
5. with power tracked, computes each touched GPU's power from its activity, and under a power cap
   or a locked clock feeds it to the power-limit loop (docs/power.md);
6. schedules the GPU's next completion.

The power-limit loop is an event of its own: every control period it closes each GPU's window of
activity and sets the clock at which the window's average power fits the cap (a calibration with
no window instead re-solves the clock at every event from that moment's activity, re-rating until
no clock moves). A run under the loop starts from the window the same workload leaves behind
(``Engine._steady_history``), so it predicts the iteration's steady state.

Identical SMs are kept as groups ("100 SMs each running one GEMM block, 32 running one NCCL block")
so the cost does not grow with the SM count, and a kernel's waves that nothing else can interleave
with are taken in one event (``Engine._batch``), so the cost does not grow with its waves either.
Waves, tails, a persistent kernel blocking a later one, and collectives waiting for their slowest
rank all come out of these rules.

Work is local: a GPU's rates depend only on its own SMs and HBM and on the flows that use them, so
an event recomputes only the GPUs it touches, closed over the flows moving data through them
(a running collective couples all its ranks). Each GPU is advanced lazily to the present when it is
touched; between touches nothing about it changes. The cost of an event therefore does not grow
with the number of ranks unless a collective spans them.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import simpy

from ovsim.engine.channel import CAP, latency_slowdowns, max_min_rates, water_fill
from ovsim.engine.machine import GpuModel, LinkKey, MachineModel
from ovsim.engine.power import (
    CLOCK_COUNTER,
    POWER_COUNTER,
    ClockWindow,
    Period,
    PowerConfig,
    op_power_class,
    rate_class,
    window_clock,
)
from ovsim.engine.timeline import COUNTER_COLUMNS, Timeline, timeline_from_rows
from ovsim.errors import OvsimError
from ovsim.gcpause import paused_gc
from ovsim.hw.calib import PRESSURE_MAX
from ovsim.hw.power import MEMORY, TENSOR, PowerModel
from ovsim.models.cost import allocated_registers, kept_load_share
from ovsim.models.ir import FlowDemand, KernelDemand, Op, Workload

_INF = float("inf")
# Room without a limit, in blocks (an int: block counts stay integers).
_BIG = 1 << 62
# Runs of a workload that find the power-limit loop's steady state, at most (Engine._steady_history).
_WARM_RUNS = 3
# Work left below this many seconds at the current rate counts as finished (float round-off).
_TIME_EPS = 1e-12


class _Kernel:
    """A launched kernel (or the SM-resident part of a collective) on one GPU."""

    __slots__ = (
        "ask", "batched", "blocks", "blocks_per_sm_alone", "bytes_per_block", "cap", "clock_cls", "clock_s",
        "clock_sensitive", "cluster", "ctas", "end_s", "flow", "gpu", "hbm_cap", "id", "issue", "issued", "late",
        "launch_s", "load_share", "max_resident",
        "mem_wait", "op", "paired",
        "partitions", "priority", "pw_tensor", "pw_unit", "pw_w", "rank", "regs", "resident", "seq", "share_hbm_s",
        "share_link_s", "share_sm_s", "smem", "start_s", "t_block", "theta", "theta_self", "threads", "undispatched",
        "wait_peers_s", "wait_sm_s",
    )

    def __init__(self, op: Op, gpu: _Gpu, priority: int, seq: int, now: float, nccl_issue: float,
                 shape: tuple[int, int, int, int, int], power: PowerConfig | None = None) -> None:
        self.op = op
        self.id = op.id
        self.rank = op.rank
        self.gpu = gpu
        self.priority = priority
        self.seq = seq
        self.launch_s = now
        self.start_s = _INF
        self.end_s = _INF
        self.flow: _Flow | None = None
        # theta: the share of its blocks' pace the kernel's HBM grant allows; theta_self: the share
        # its own bandwidth cap allows (a bandwidth-bound kernel alone), so theta / theta_self is
        # what contention costs it.
        self.theta = 1.0
        self.theta_self = 1.0
        self.issued = 0.0  # resident blocks weighted by the share of their issue demand they get
        self.wait_sm_s = self.share_sm_s = self.share_hbm_s = self.share_link_s = self.wait_peers_s = 0.0
        self.clock_s = 0.0
        k = op.kernel
        assert k is not None
        self.blocks = k.blocks
        self.undispatched = k.blocks
        self.resident = 0
        self.batched = 0  # blocks of later waves held by a fast-forwarded entry (see Engine._batch)
        # A persistent kernel's CTAs, and the first tiles of those that have found no SM, held back
        # until the rest are done (Engine._place): ctas - late have found one.
        self.ctas = k.persistent_ctas if 0 < k.persistent_ctas < k.blocks else 0
        self.late = 0
        # CTAs per cluster, where the GPU's placement units are known and its SMs one partition.
        self.cluster = k.cluster_ctas if k.cluster_ctas > 1 and gpu.model.unit_sms and not gpu.model.comm_reserved_sms \
            else 1
        # Whether its blocks took SMs beside a running cluster kernel or as one left, SMs its
        # clusters free two of a unit at a time, rather than an idle GPU's, which it fills as a
        # plain launch does (Engine._cluster_room).
        self.paired = False
        self.threads, self.regs, self.smem, self.blocks_per_sm_alone, self.max_resident = shape
        # Its blocks' count is then the SMs they keep busy (KernelDemand.load_share).
        self.load_share = kept_load_share(k.load_share, self.blocks_per_sm_alone) if op.flow is None else 0.0
        self.t_block = k.block_time_s
        self.issue = k.issue_fraction
        # NCCL blocks ask for a fixed share of an SM's issue slots, whatever the kernel says.
        self.ask = nccl_issue if op.flow is not None else k.issue_fraction
        # The most of an SM a block uses with room to spare; it runs cap / ask times its pace there.
        self.cap = self.ask if op.flow is not None or k.issue_cap is None else max(self.ask, k.issue_cap)
        self.clock_sensitive = k.clock_sensitive
        self.bytes_per_block = k.hbm_bytes / k.blocks
        self.hbm_cap = k.hbm_cap_bytes_per_s
        self.mem_wait = 0.0  # share of its time alone waiting on memory (Engine._memory_wait)
        self.partitions = _MAIN if op.partition == "compute" else _BOTH
        # Index into the GPU's rate multipliers: 0 not clock-bound, 1 CUDA cores, 2 and up tensor
        # cores (one class per saturation clock), then memory-bound kernels part of whose time
        # follows the clock (engine.power.rate_class).
        self.clock_cls = 1 if k.clock_sensitive and op.flow is None else 0
        self.pw_tensor = False
        self.pw_w = 0.0
        self.pw_unit = 0.0
        if power is not None:
            cls, self.pw_w = op_power_class(op, power.model)
            self.pw_tensor = cls == TENSOR
            self.clock_cls = rate_class(op, power.model, cls)
            # Compute blocks count by the issue share they use (occupancy shaping leaves SMs partly
            # idle); memory-bound blocks and NCCL's copy loops by the block slots they hold.
            self.pw_unit = 1.0 / self.blocks_per_sm_alone if cls == MEMORY else self.issue

    def sort_key(self) -> tuple[int, int]:
        return (self.priority, self.seq)


_MAIN = ("main",)
_BOTH = ("main", "reserved")


def _block_shape(k: KernelDemand, m: GpuModel, main_only: bool) -> tuple[int, int, int, int, int]:
    """A kernel's block on a GPU: threads, registers and shared memory it holds, blocks per SM and
    blocks resident at once with the kernel alone on the SMs it may use."""
    threads = math.ceil(k.block.threads / m.warp_size) * m.warp_size
    regs = allocated_registers(k.block.threads, k.block.registers_per_thread, m.warp_size, m.register_alloc_unit)
    smem = k.block.shared_mem_bytes + m.reserved_smem_per_block_bytes
    per_sm = max(1, _fit(m.threads_per_sm, m.registers_per_sm, m.shared_mem_per_sm_bytes, m.blocks_per_sm,
                         threads, regs, smem))
    allowed = m.sm_count - (m.comm_reserved_sms if main_only else 0)
    return threads, regs, smem, per_sm, allowed * per_sm


def _fit(threads: int, regs: int, smem: int, blocks: int, k_threads: int, k_regs: int, k_smem: int) -> int:
    n = threads // k_threads
    if blocks < n:
        n = blocks
    if k_regs and regs // k_regs < n:
        n = regs // k_regs
    if k_smem and smem // k_smem < n:
        n = smem // k_smem
    return n if n > 0 else 0


class _Entry:
    """Blocks of one kernel, ``per_sm`` on every SM of a group, all with the same work left.

    A fast-forwarded entry also holds its kernel's next ``extra`` waves on the same SMs:
    ``remaining`` then counts their work too (one unit per wave)."""

    __slots__ = ("born", "extra", "k", "per_sm", "rate", "remaining", "share")

    def __init__(self, k: _Kernel, per_sm: int, remaining: float, born: float) -> None:
        self.k = k
        self.per_sm = per_sm
        self.remaining = remaining  # fraction of one block's work (plus ``extra`` whole blocks)
        self.extra = 0
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
        entries = g.entries
        for src in self.entries:
            dst = _Entry(src.k, src.per_sm, src.remaining, src.born)
            dst.rate, dst.share = src.rate, src.share
            entries.append(dst)
        return g

    def key(self) -> tuple[Any, ...]:
        return (self.part, self.threads, self.regs, self.smem, self.blocks,
                tuple((id(e.k), e.per_sm, e.remaining) for e in self.entries))

    def same(self, o: _Group) -> bool:
        """``self.key() == o.key()`` without building the keys."""
        if (self.part != o.part or self.threads != o.threads or self.regs != o.regs or self.smem != o.smem
                or self.blocks != o.blocks or len(self.entries) != len(o.entries)):
            return False
        for a, b in zip(self.entries, o.entries, strict=True):
            if a.k is not b.k or a.per_sm != b.per_sm or a.remaining != b.remaining:
                return False
        return True


# A GPU's power inputs (Sim._activity): tensor and other SM watts, fixed and clock-following HBM
# bytes/s, link bytes/s, busy SM fractions of three classes, and saturating tensor HBM traffic.
_Activity = tuple[float, float, float, float, float, float, float, float, tuple[tuple[float, float], ...]]


class _Gpu:
    __slots__ = ("batched", "ce_free", "ce_waiting", "clock_factor", "clock_frac", "cluster_freed_s", "ctl", "flows",
                 "groups", "last_t",
                 "model", "mult", "n_partitions", "pending", "rank", "running", "throttled", "timer", "timer_at")

    def __init__(self, rank: int, model: GpuModel) -> None:
        self.rank = rank
        self.model = model
        self.clock_factor = 1.0
        # Rate multipliers of (not clock-bound, CUDA-core, tensor-core) work; the SM clock as a
        # fraction of the compute clock, where a power policy sets it; whether any multiplier is not 1.
        self.mult = [1.0, 1.0, 1.0]
        self.clock_frac = 1.0
        self.throttled = False
        m = model
        main = m.sm_count - m.comm_reserved_sms
        self.groups = [_Group(main, "main", m.threads_per_sm, m.registers_per_sm, m.shared_mem_per_sm_bytes,
                              m.blocks_per_sm)]
        self.n_partitions = 2 if m.comm_reserved_sms else 1
        if m.comm_reserved_sms:
            self.groups.append(_Group(m.comm_reserved_sms, "reserved", m.threads_per_sm, m.registers_per_sm,
                                      m.shared_mem_per_sm_bytes, m.blocks_per_sm))
        self.pending: list[_Kernel] = []
        self.running: list[_Kernel] = []  # launched compute kernels not finished
        self.flows: list[_Flow] = []  # unfinished flows that use this GPU's HBM or links, or have a member here
        self.ce_free = m.copy_engines
        self.ce_waiting: list[_Member] = []
        self.last_t = 0.0  # the GPU's state is up to date to this time
        self.timer = 0  # version of the GPU's pending completion timer
        self.timer_at = _INF  # when it fires
        self.batched = False  # some entry holds later waves (Engine._batch)
        self.ctl: ClockWindow | None = None  # the power-limit loop's window, where it runs one
        self.cluster_freed_s = -_INF  # when a cluster kernel's blocks last left SMs


@dataclass
class _Member:
    """One rank's op in a flow."""

    op: Op
    rank: int
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
    latency_slow: float = 1.0  # what HBM's loaded latency took off its cap (Engine._latency)
    start_s: float = _INF
    end_s: float = _INF
    last_t: float = 0.0
    usage: list[tuple[Any, float]] = field(default_factory=list)
    # GPUs whose HBM or links the flow uses, and the ranks of its members: all touched together.
    ranks: tuple[int, ...] = ()


def _interleave(sizes: list[int], first_end_s: list[float], period_s: list[float], blocks: int,
                keep_last: bool = True) -> list[int]:
    """Whole waves each group of SMs runs from ``blocks`` waiting blocks, groups refilling themselves
    as their waves end (group i: ``sizes[i]`` blocks a wave, current wave ending at
    ``first_end_s[i]``, then one every ``period_s[i]``), counted up to the first wave end that finds
    too few blocks for every group ending then (within float round-off, ends are simultaneous).
    With ``keep_last``, the wave that would take the last blocks is not given either: the moment
    the kernel has none left waiting is when a kernel behind it may dispatch, which must be an
    event."""
    given, ends, blocks = _skip_waves(sizes, first_end_s, period_s, blocks)
    while True:
        t = min(ends)
        tie = [i for i, x in enumerate(ends) if x <= t + 1e-9 * max(t, 1e-9)]
        need = sum(sizes[i] for i in tie)
        if need > blocks or (keep_last and need == blocks):
            return given
        blocks -= need
        for i in tie:
            given[i] += 1
            ends[i] += period_s[i]


def _skip_waves(sizes: list[int], first_end_s: list[float], period_s: list[float],
                blocks: int) -> tuple[list[int], list[float], int]:
    """The waves that surely end before :func:`_interleave` stops, given at once: counted in closed
    form up to three of the longest periods before the time the blocks would run out at the groups'
    mean rates, so that the wave-by-wave loop only settles the last few (a kernel of billions of
    blocks would otherwise take a loop turn per wave). Returns (waves given, each group's next wave
    end, blocks left)."""
    zero = [0] * len(sizes)
    rate = sum(n / p for n, p in zip(sizes, period_s, strict=True))
    if rate <= 0 or blocks < 64 * sum(sizes):
        return zero, list(first_end_s), blocks
    t_out = (blocks + sum(n * f / p for n, f, p in zip(sizes, first_end_s, period_s, strict=True))) / rate
    t0 = t_out - 3 * max(period_s)
    given = [max(0, math.floor((t0 - f) / p) + 1) if t0 >= f else 0 for f, p in zip(first_end_s, period_s, strict=True)]
    used = sum(n * g for n, g in zip(sizes, given, strict=True))
    if used >= blocks:
        return zero, list(first_end_s), blocks
    ends = [f + g * p for f, g, p in zip(first_end_s, given, period_s, strict=True)]
    return given, ends, blocks - used


class _Stream:
    __slots__ = ("busy", "idx", "key", "ops", "priority", "slept")

    def __init__(self, key: tuple[int, str], ops: list[Op], priority: int) -> None:
        self.key = key
        self.ops = ops
        self.priority = priority
        self.idx = 0
        self.busy = False  # an op of the stream is launched or sleeping its host delay
        self.slept = False  # the op at idx has served its delay


@dataclass(frozen=True)
class EngineOptions:
    # Record counter samples (SM occupancy, HBM, links) for timelines; off for benchmarks.
    counters: bool = True
    # Check at every event that no SM limit or channel is over-subscribed (tests turn this on).
    check_invariants: bool = False
    # Called now and then with (ops finished, ops in total), for a progress display.
    progress: Callable[[int, int], None] | None = None
    # Track power (``power_w`` and ``sm_clock_hz`` counters) and, with a cap or a locked clock in
    # its settings, run the clock loop; None: no power, no clock loop (benchmarks, replay).
    power: PowerConfig | None = None
    # Take a kernel's waves that nothing else can interleave with in one event (Engine._batch).
    # The timeline is the same either way, to float round-off; off only to check that.
    fast_forward: bool = True


class Engine:
    """Simulates a :class:`Workload` on a :class:`MachineModel`; :meth:`run` returns the Timeline."""

    def __init__(self, workload: Workload, machine: MachineModel, options: EngineOptions | None = None,
                 priorities: dict[tuple[int, str], int] | None = None,
                 power_history: dict[int, tuple[Period, ...]] | None = None) -> None:
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
        self.finished: set[str] = set()
        self.order = {op.id: i for i, op in enumerate(workload.ops)}
        self.waiters: dict[str, list[_Stream]] = {}
        self.streams: dict[tuple[int, str], _Stream] = {}
        self.released: list[_Stream] = []  # streams to move on once this instant's dispatching is done
        self.kernels: list[_Kernel] = []
        # Block shapes by (id of the kernel demand, id of the GPU model, main partition only); the
        # workload and the machine keep both alive, so the ids are not reused during the run.
        self.shapes: dict[tuple[int, int, bool], tuple[int, int, int, int, int]] = {}
        self.flows: dict[str, _Flow] = {}
        self.seq = 0
        self.resolves = 0  # events the engine handled (a figure for benchmarks)
        self.resolve_pending = False
        self.now = 0.0  # the time of the resolve under way, and its completion tolerance
        self.eps = _TIME_EPS
        # Inputs gathered between resolves: GPUs whose timer fired, ops whose host delay ended,
        # clock changes.
        self.fired: list[int] = []
        self.woken: list[_Stream] = []
        self.clock_changes: list[tuple[int, float]] = []
        # Per resolve: GPUs brought up to date (in order), those still to check for completions,
        # and those whose dispatcher must run.
        self.touched: dict[int, None] = {}
        self.to_complete: list[int] = []
        self.to_dispatch: set[int] = set()
        self.counter_rows: list[tuple[float, int, str, float]] = []
        self.last_counter: dict[tuple[int, str], float] = {}
        self.link_keys: list[LinkKey] = list(machine.links)
        self.link_index = {k: i for i, k in enumerate(self.link_keys)}
        self.nccl_issue = machine.nccl_issue_fraction
        self.has_pressure = any(v > 0 for v in machine.nccl_memory_pressure.values())
        # HBM's loaded-latency law (channel.latency_slowdowns), where the calibration has one.
        self.latency_law = machine.hbm_latency_capacity > 0
        # Kernels whose pace goes with how many SMs run such blocks (KernelDemand.load_share).
        self.any_load = any(op.kernel is not None and op.kernel.load_share > 0 and op.flow is None
                            for op in workload.ops)
        self.n_waiting = 0  # flows waiting for members
        self.n_data = 0  # flows moving data
        self.power = self.opts.power
        self.managed = self.power is not None and self.power.managed
        if self.power is not None:
            m = self.power.model
            # Dynamic-power scale of tensor and other work without power management.
            self.s_calibrated = (m.dynamic_scale(m.tensor_reference_clock_fraction), m.dynamic_scale(1.0))
            for gpu in self.gpus:
                gpu.mult = [1.0] * (2 + len(m.tensor_saturations) + len(m.memory_clock_shares))
        # Rate classes of tensor kernels that saturate, and their saturation clock fractions; rate
        # classes of memory-bound kernels, and the share of their time that follows the clock.
        self.saturating_cls: dict[int, float] = {}
        self.memory_share_cls: dict[int, float] = {}
        if self.power is not None:
            sats = self.power.model.tensor_saturations
            self.saturating_cls = {2 + i: x for i, x in enumerate(sats) if math.isfinite(x)}
            self.memory_share_cls = {2 + len(sats) + i: x
                                     for i, x in enumerate(self.power.model.memory_clock_shares)}
        # The power-limit loop averages over a window (set once a control period) or, without one,
        # re-solves the clock at every event.
        self.windowed = self.managed and self.power is not None and self.power.model.control_window_s > 0
        self.tick_due = False
        # Whether the last control period moved any clock (a steady loop may skip periods).
        self.clock_moved = True
        self.power_history = power_history
        # A warm-up run (_steady_history) only needs the window it leaves: no power counters.
        self.records_power = True
        if self.power is not None and self.managed:
            self._start_clocks(self._idle_history() if power_history is None else power_history)

    def _idle_history(self) -> dict[int, tuple[Period, ...]]:
        """A window of idleness on every GPU."""
        assert self.power is not None
        w = self.power.model.control_window_s
        return {g.rank: ((w, 0.0, 0.0, 0.0, 0.0, ()),) for g in self.gpus} if w > 0 else {}

    def _steady_history(self) -> dict[int, tuple[Period, ...]]:
        """The window each GPU would bring into the workload had it just run the same workload
        over and over: run it from idle, then from the window a repeat of each run leaves
        (ClockWindow.repeated), until the clocks those windows give stop moving (at most
        ``_WARM_RUNS`` runs; a workload at least two windows long needs one)."""
        assert self.power is not None
        pc = self.power
        opts = replace(self.opts, counters=False, progress=None)
        history = self._idle_history()
        clocks = [g.clock_frac for g in self.gpus]
        for _ in range(_WARM_RUNS):
            warm = Engine(self.workload, self.machine, opts, self.priority, power_history=history)
            warm.records_power = False
            warm._simulate()
            history = {g.rank: g.ctl.repeated() for g in warm.gpus if g.ctl is not None}
            # After two windows the loop has forgotten where it started: the window a run that long
            # leaves does not depend on the one it started from.
            if warm.now >= 2 * pc.model.control_window_s:
                break
            new = [window_clock(pc.model, pc.cap_w, pc.max_clock_fraction,
                                ClockWindow(pc.model.control_window_s, history[g.rank])) for g in self.gpus]
            if new == clocks:
                break
            clocks = new
        return history

    def _tick(self, _: simpy.Event) -> None:
        """A control period ends: the loop sets each GPU's clock at the next resolve."""
        if len(self.finished) == len(self.workload.ops):
            return
        # Nothing else scheduled: the workload is stuck, and the run must end to say so.
        if not self.resolve_pending and self.env.peek() == _INF:
            return
        assert self.power is not None
        period = self.power.model.control_period_s
        periods = self._steady_periods(period)
        self.tick_due = True
        self._request_resolve()
        self.env.timeout(periods * period).callbacks.append(self._tick)

    def _steady_periods(self, period_s: float) -> int:
        """Control periods until the next tick: one, or, where no GPU's activity has changed for a
        window and the last period moved no clock, all those before the next event but one (each
        would close an identical period and set the same clock; the window keeps them as one, of
        the same average). A GEMM of hours under the loop takes a few ticks, not millions."""
        assert self.power is not None
        if self.clock_moved:
            return 1
        quiet_since = self.now - self.power.model.control_window_s - 2 * period_s
        if not all(g.ctl is not None and g.ctl.steady_since(quiet_since) for g in self.gpus):
            return 1
        next_event = self.env.peek()
        if not math.isfinite(next_event):
            return 1
        return max(1, math.floor((next_event - self.now) / period_s) - 1)

    def _control(self) -> None:
        """Close every GPU's control period and set the clock its window gives."""
        assert self.power is not None
        pc = self.power
        cap, hi = pc.cap_w, pc.max_clock_fraction
        now = self.now
        self.clock_moved = False
        for gpu in self.gpus:
            assert gpu.ctl is not None
            gpu.ctl.close(now)
            c = window_clock(pc.model, cap, hi, gpu.ctl)
            if c != gpu.clock_frac:
                self.clock_moved = True
                self._touch(gpu.rank)
                self._set_clock(gpu, c)

    def _start_clocks(self, history: dict[int, tuple[Period, ...]]) -> None:
        """Each GPU's clock at the start: the one its window of ``history`` gives, or the top clock
        (an idle GPU fits any settable cap)."""
        assert self.power is not None
        pc = self.power
        for gpu in self.gpus:
            c0 = pc.max_clock_fraction
            if self.windowed:
                gpu.ctl = ClockWindow(pc.model.control_window_s, history.get(gpu.rank, ()))
                c0 = window_clock(pc.model, pc.cap_w, c0, gpu.ctl)
            self._set_clock(gpu, c0)

    # -- streams -------------------------------------------------------------------------------

    def run(self) -> Timeline:
        self._simulate()
        return self._timeline()

    def _simulate(self) -> None:
        if self.windowed:
            assert self.power is not None
            # The power settings' start: "steady", the same workload came before (the steady state
            # of a loop of iterations, found by running it first); "idle", an idle window.
            if self.power_history is None and self.power.settings.start == "steady":
                self._start_clocks(self._steady_history())
            self.env.timeout(self.power.model.control_period_s).callbacks.append(self._tick)
        by_stream: dict[tuple[int, str], list[Op]] = {}
        for op in self.workload.ops:
            by_stream.setdefault((op.rank, op.stream), []).append(op)
        self.streams = {key: _Stream(key, ops, self.priority.get(key, 0)) for key, ops in by_stream.items()}
        self.woken = list(self.streams.values())
        if self.power is not None:
            for gpu in self.gpus:
                self._record_power(gpu, 0.0, (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, ()))
        self._request_resolve()
        # The engine's objects (kernels, entries, flows, simpy's events) form no garbage cycles:
        # reference counting frees them, and the cyclic collector's passes over the growing heap
        # of a long run only cost time (about 5% of it).
        with paused_gc():
            self.env.run()
        if self.windowed:
            # At the last completion (a tick after it changes nothing).
            for gpu in self.gpus:
                assert gpu.ctl is not None
                gpu.ctl.close(self.now)
        unfinished = [op.id for op in self.workload.ops if op.id not in self.finished]
        if unfinished:
            waiting = [f.demand.group for f in self.flows.values() if f.phase == "waiting"]
            hint = f"; collective(s) {waiting[:3]} never got every rank" if waiting else ""
            raise OvsimError(f"{len(unfinished)} op(s) never finished, e.g. '{unfinished[0]}'{hint}", field="ops")

    def _pump(self, s: _Stream) -> None:
        """Move stream ``s`` on as far as it can go now: past finished deps, into a host delay, or
        into a launch."""
        while not s.busy and s.idx < len(s.ops):
            op = s.ops[s.idx]
            for d in op.deps:
                if d not in self.finished:
                    self.waiters.setdefault(d, []).append(s)
                    return
            if op.delay_s > 0 and not s.slept:
                s.busy = True
                self.env.timeout(op.delay_s).callbacks.append(self._on_wake(s))
                return
            s.slept = False
            if op.kind == "delay":
                s.idx += 1
                self._op_done(op.id)
                continue
            s.busy = True
            self._launch(op, s.priority)

    def _next_order(self, s: _Stream) -> int:
        return self.order[s.ops[s.idx].id] if s.idx < len(s.ops) else -1

    def _on_wake(self, s: _Stream) -> Callable[[simpy.Event], None]:
        def wake(_: simpy.Event) -> None:
            s.busy = False
            s.slept = True
            self.woken.append(s)
            self._request_resolve()
        return wake

    def _op_done(self, op_id: str) -> None:
        self.finished.add(op_id)
        self.released.extend(self.waiters.pop(op_id, ()))

    def _stream_op_done(self, op: Op) -> None:
        """An op launched by its stream finished: the stream moves on, then whoever waited for it.

        They launch only after the dispatcher has handed out what the finish freed: a launch takes
        microseconds on a real GPU, and the hardware scheduler places already-queued blocks first."""
        s = self.streams[(op.rank, op.stream)]
        s.busy = False
        s.idx += 1
        self.finished.add(op.id)
        self.released.append(s)
        self.released.extend(self.waiters.pop(op.id, ()))

    def set_clock_factor(self, rank: int, factor: float) -> None:
        """Scale rank's SM clock (compute-bound work slows, memory-bound work does not) from now on.

        Callable before :meth:`run` or from a simpy process or callback while it runs."""
        if not factor > 0:
            raise OvsimError(f"clock factor must be positive, got {factor}", field="clock_factor")
        if not 0 <= rank < len(self.gpus):
            raise OvsimError(f"no rank {rank} on a {len(self.gpus)}-GPU machine", field="clock_factor")
        self.clock_changes.append((rank, factor))
        self._request_resolve()

    # -- launching -----------------------------------------------------------------------------

    def _launch(self, op: Op, priority: int) -> None:
        self._touch(op.rank)
        now = self.now
        gpu = self.gpus[op.rank]
        kernel: _Kernel | None = None
        if op.kernel is not None:
            self.seq += 1
            # Ops of a repeated layer share their demand: its block shape is worked out once.
            main_only = op.partition == "compute"
            key = (id(op.kernel), id(gpu.model), main_only)
            shape = self.shapes.get(key)
            if shape is None:
                shape = self.shapes[key] = _block_shape(op.kernel, gpu.model, main_only)
            kernel = _Kernel(op, gpu, priority, self.seq, now, self.nccl_issue, shape, self.power)
            if self.latency_law:
                kernel.mem_wait = self._memory_wait(op)
            self.kernels.append(kernel)
            pending = gpu.pending
            # Launch order is seq order: a kernel of no higher priority than the last goes last.
            if not pending or pending[-1].priority <= priority:
                pending.append(kernel)
            else:
                bisect.insort(pending, kernel, key=_Kernel.sort_key)
            self.to_dispatch.add(op.rank)
            if op.flow is None:
                gpu.running.append(kernel)
        if op.flow is not None:
            flow = self._flow(op.flow)
            member = _Member(op=op, rank=op.rank, kernel=kernel, launch_s=now)
            if op.rank in flow.members:
                raise OvsimError(f"rank {op.rank} joins collective '{op.flow.group}' twice", field="group")
            flow.members[op.rank] = member
            if kernel is not None:
                kernel.flow = flow
            if op.flow.uses_copy_engine:
                self._take_ce(gpu, member)

    def _flow(self, demand: FlowDemand) -> _Flow:
        flow = self.flows.get(demand.group)
        if flow is None:
            flow = _Flow(demand=demand, latency_left_s=demand.latency_s, remaining_bytes=demand.bytes,
                         last_t=self.now)
            flow.usage = self._flow_usage(demand)
            ranks = set(demand.ranks)
            for key, _ in flow.usage:
                ranks.update(r for r in key[1:] if r >= 0)
            flow.ranks = tuple(sorted(r for r in ranks if r < len(self.gpus)))
            self.flows[demand.group] = flow
            self.n_waiting += 1
            # A waiting flow changes no rate, so the GPUs it will use need not be touched yet.
            for r in flow.ranks:
                self.gpus[r].flows.append(flow)
        return flow

    def _flow_usage(self, d: FlowDemand) -> list[tuple[Any, float]]:
        """(resource, bytes per flow byte): ("hbm", rank) or a link key."""
        use: dict[Any, float] = {}

        def add(key: Any, c: float) -> None:
            if c > 0 and (key in self.link_index or key[0] == "hbm"):
                use[key] = use.get(key, 0.0) + c

        ranks = list(d.ranks)
        mesh = self.machine.topology == "mesh"
        node = self.machine.node_of
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
            if node(src) != node(dst):
                net = d.link_coeff if d.net_coeff is None else d.net_coeff
                add(("nic_out", self.machine.nic_port(src), -1), net)
                add(("nic_in", self.machine.nic_port(dst), -1), net)
            elif mesh:
                add(("link", src, dst), d.link_coeff)
            else:
                add(("egress", src, -1), d.link_coeff)
                add(("ingress", dst, -1), d.link_coeff)
        else:
            self._group_usage(d, ranks, add)
        return list(use.items())

    def _group_usage(self, d: FlowDemand, ranks: list[int], add: Callable[[Any, float], None]) -> None:
        """A collective's links: of a rank's link bytes, the share that leaves its node crosses its
        NICs. A ring crosses to the next node once per node and ring, and NCCL spreads its rings
        over the NICs of the node's m members: 1/m of a member's bytes. All-pairs traffic goes to
        the n - m members elsewhere: (n - m)/(n - 1)."""
        n = d.group_size or len(ranks)
        node = self.machine.node_of
        members = Counter(node(r) for r in ranks)
        multi = len(members) > 1
        mesh = self.machine.topology == "mesh"
        for i, r in enumerate(ranks):
            add(("hbm", r), d.hbm_coeff)
            if n < 2:
                continue
            m = members[node(r)]
            intra = d.link_coeff
            port = self.machine.nic_port(r)
            if d.net_coeff is not None:
                add(("nic_out", port, -1), d.net_coeff)
                add(("nic_in", port, -1), d.net_coeff)
            elif multi:
                net = (n - m) / (n - 1) if d.pattern == "all_pairs" else 1.0 / m
                add(("nic_out", port, -1), d.link_coeff * net)
                add(("nic_in", port, -1), d.link_coeff * net)
                intra = d.link_coeff * (1.0 - net)
            if not mesh:
                add(("egress", r, -1), intra)
                add(("ingress", r, -1), intra)
                continue
            peers = [s for s in ranks if s != r and node(s) == node(r)]
            if d.pattern == "all_pairs" or multi:
                for s in peers:
                    add(("link", r, s), intra / len(peers))
            else:
                add(("link", r, ranks[(i + 1) % len(ranks)]), intra)

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

    def _on_timer(self, ev: simpy.Event) -> None:
        rank, version = ev.value  # type: ignore[misc]  # set by _schedule_next
        gpu = self.gpus[rank]
        if version == gpu.timer:
            gpu.timer_at = _INF
            self.fired.append(rank)
            if not self.resolve_pending:
                self._resolve(None)

    def _touch(self, rank: int) -> None:
        """Bring a GPU (and the flows it carries) up to now and include it in this resolve."""
        if rank in self.touched:
            return
        self.touched[rank] = None
        self.to_complete.append(rank)
        gpu = self.gpus[rank]
        self._advance(gpu)
        if gpu.batched:
            self._unbatch(gpu)

    def _resolve(self, _: simpy.Event | None) -> None:
        self.resolve_pending = False
        # Time stands still during a resolve.
        self.now = now = self.env.now
        # Far from 0 a float time resolves less than _TIME_EPS: a timer set for a completion can
        # land a few ulps short of it, and an absolute tolerance would then never see it complete.
        self.eps = max(_TIME_EPS, 4 * math.ulp(now))
        self.resolves += 1
        if self.opts.progress is not None and self.resolves % 4096 == 0:
            self.opts.progress(len(self.finished), len(self.workload.ops))
        self.touched = {}
        if self.tick_due:
            self.tick_due = False
            self._control()
        fired, self.fired = self.fired, []
        for r in fired:
            self._touch(r)
        changes, self.clock_changes = self.clock_changes, []
        for r, factor in changes:
            self._touch(r)
            g = self.gpus[r]
            g.clock_factor = factor
            if not self.managed:
                g.mult = [1.0] + [factor] * (len(g.mult) - 1)
                for i, share in self.memory_share_cls.items():
                    g.mult[i] = PowerModel.memory_rate(factor, share)
                g.throttled = any(x != 1.0 for x in g.mult)
        self.released, self.woken = self.woken, []
        gpus = self.gpus
        to_complete = self.to_complete
        to_dispatch = self.to_dispatch
        touched = self.touched
        while True:
            while to_complete:
                self._complete(gpus[to_complete.pop()])
            if to_dispatch:
                for r in sorted(to_dispatch):
                    self._dispatch(gpus[r])
                to_dispatch.clear()
            if self.n_waiting:
                self._arrivals()
            if self.n_data:
                # Rates of a GPU carrying data for a collective depend on every GPU it uses.
                seen: set[int] = set()
                for r in list(touched):
                    for f in gpus[r].flows:
                        if f.phase == "data" and id(f) not in seen:
                            seen.add(id(f))
                            for q in f.ranks:
                                if q not in touched:
                                    self._touch(q)
            if to_complete or to_dispatch:
                continue
            if not self.released:
                break
            # Ops released at one instant launch in program order (their order in the workload).
            released = self.released
            if len(released) > 1:
                released = sorted({id(s): s for s in released}.values(), key=self._next_order)
            self.released = []
            for s in released:
                self._pump(s)
        ranks = sorted(touched) if len(touched) > 1 else list(touched)
        self._rates(ranks)
        if self.power is not None:
            self._power(ranks)
        fast_forward = self.opts.fast_forward
        for r in ranks:
            # A GPU's batching reads and changes only its own SMs, so each GPU can be done at once.
            gpu = gpus[r]
            if fast_forward:
                self._batch(gpu)
            self._schedule_next(gpu)

    def _advance(self, gpu: _Gpu) -> None:
        now = self.now
        dt = now - gpu.last_t
        if dt > 0:
            gpu.last_t = now
            for g in gpu.groups:
                for e in g.entries:
                    rate = e.rate
                    if rate > 0:
                        e.remaining -= rate * dt
            throttled = gpu.throttled
            mult = gpu.mult
            for k in gpu.running:
                # Slow-down reasons (inlined: this runs for every kernel at every event).
                if k.resident == 0:
                    k.wait_sm_s += dt
                    continue
                alone = k.undispatched + k.batched + k.resident + k.late
                if alone > k.max_resident:
                    alone = k.max_resident
                f_res = k.resident / alone if k.resident < alone else 1.0
                f_issue = k.issued / k.resident
                if f_issue > 1.0:  # blocks with room run faster than at full residency: no loss
                    f_issue = 1.0
                k.wait_sm_s += dt * (1 - f_res)
                k.share_sm_s += dt * f_res * (1 - f_issue)
                if throttled:
                    # Time lost to a clock below the calibration's, or gained (negative) above it.
                    m = mult[k.clock_cls]
                    if m != 1.0:
                        k.clock_s += dt * f_res * f_issue * (1 - m)
                        f_issue *= m
                k.share_hbm_s += dt * f_res * f_issue * (1 - k.theta / k.theta_self)
        for f in gpu.flows:
            fdt = now - f.last_t
            if fdt > 0:
                f.last_t = now
                if f.phase == "latency":
                    f.latency_left_s -= fdt
                elif f.phase == "data":
                    f.remaining_bytes -= f.rate * fdt
                self._attribute_flow(f, fdt)

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

    def _schedule_next(self, gpu: _Gpu) -> None:
        """Apply each kernel's HBM share to its blocks' rates, then set the GPU's next timer."""
        dt = _INF
        for g in gpu.groups:
            for e in g.entries:
                rate = e.rate
                theta = e.k.theta
                if theta < 1.0:
                    e.rate = rate = rate * theta
                if rate > 0 and e.remaining < dt * rate:
                    dt = e.remaining / rate
        for f in gpu.flows:
            if f.phase == "latency":
                if f.latency_left_s < dt:
                    dt = f.latency_left_s
            elif f.phase == "data" and f.rate > 0 and f.remaining_bytes < dt * f.rate:
                dt = f.remaining_bytes / f.rate
        now = self.now
        at = now + (dt if dt > 0.0 else 0.0)
        # The same completion recomputed after an unrelated event: keep the timer already set.
        # (Firing a femtosecond early or late is harmless: completion tests allow _TIME_EPS.)
        if abs(at - gpu.timer_at) <= 1e-15 * (at if at > 1.0 else 1.0):
            return
        gpu.timer += 1  # an older timer of this GPU is stale now
        gpu.timer_at = at
        if dt == _INF:
            return
        t = self.env.timeout(at - now, (gpu.rank, gpu.timer))
        t.callbacks.append(self._on_timer)

    # -- completions ---------------------------------------------------------------------------

    def _complete(self, gpu: _Gpu) -> None:
        now = self.now
        eps = self.eps
        changed = False
        for g in gpu.groups:
            for e in g.entries:
                if e.rate > 0 and e.remaining <= e.rate * eps:
                    break
            else:
                continue
            keep: list[_Entry] = []
            for e in g.entries:
                if e.rate > 0 and e.remaining <= e.rate * eps:
                    self._free(g, e)
                    changed = True
                    if e.k.cluster > 1:
                        gpu.cluster_freed_s = now
                else:
                    keep.append(e)
            g.entries = keep
        if changed:
            self.to_dispatch.add(gpu.rank)
            self._merge(gpu)
            for k in gpu.running:
                if k.late and k.undispatched == 0 and k.resident == 0:
                    # The resident CTAs have run every other tile and left: the late ones start.
                    k.undispatched, k.late = k.late, 0
            done = [k for k in gpu.running if k.undispatched == 0 and k.resident == 0]
            if done:
                gpu.running = [k for k in gpu.running if not (k.undispatched == 0 and k.resident == 0)]
                for k in done:
                    k.end_s = now
                    self._stream_op_done(k.op)
        for f in list(gpu.flows) if gpu.flows else ():
            if f.phase == "latency" and f.latency_left_s <= eps:
                f.phase = "data"
                self.n_data += 1
                f.latency_left_s = 0.0
                for q in f.ranks:
                    self._touch(q)
            if f.phase == "data" and (f.remaining_bytes <= max(f.rate, 1.0) * eps):
                self._finish_flow(f, now)

    def _free(self, g: _Group, e: _Entry) -> None:
        k = e.k
        g.threads += e.per_sm * k.threads
        g.regs += e.per_sm * k.regs
        g.smem += e.per_sm * k.smem
        g.blocks += e.per_sm
        k.resident -= g.n * e.per_sm

    def _finish_flow(self, f: _Flow, now: float) -> None:
        for q in f.ranks:
            self._touch(q)
        if f.phase == "data":
            self.n_data -= 1
        f.phase = "done"
        f.end_s = now
        f.rate = 0.0
        for q in f.ranks:
            self.gpus[q].flows.remove(f)
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
                self.to_dispatch.add(gpu.rank)
            if m.has_ce:
                self._release_ce(self.gpus[m.rank])
        for m in f.members.values():
            self._stream_op_done(m.op)

    def _merge(self, gpu: _Gpu) -> None:
        if len(gpu.groups) < 2:
            return
        groups = gpu.groups
        if len(groups) > 8:
            merged: dict[tuple[Any, ...], _Group] = {}
            out: list[_Group] = []
            for g in groups:
                key = g.key()
                if key in merged:
                    merged[key].n += g.n
                else:
                    merged[key] = g
                    out.append(g)
            gpu.groups = out
            return
        # Groups are usually two to four: comparing each with the groups kept beats hashing a key
        # of every group (the quadratic cost would not, past a few).
        out = [groups[0]]
        for i in range(1, len(groups)):
            g = groups[i]
            for h in out:
                if h.same(g):
                    h.n += g.n
                    break
            else:
                out.append(g)
        if len(out) < len(groups):
            gpu.groups = out

    # -- fast-forwarding waves -----------------------------------------------------------------

    def _batch(self, gpu: _Gpu) -> None:
        """Fast-forward waves: give a kernel's next whole waves to the SMs that would run them,
        as long as nothing else happens on the GPU, so that they take one event instead of one each.

        When blocks finish, the dispatcher gives the room they free to the first pending kernel
        with blocks left that may use the partition. If that is the blocks' own kernel, it refills
        the same SMs with the same layer (any other room it could use, it would have filled
        already), and the rates after the refill are the rates before it. So each group of SMs
        holding the kernel keeps running it, one wave after another, at its present rate, until
        the kernel's blocks run short. Which group gets which of the remaining blocks follows from
        the order in which their waves end; the waves given away are those that end before the
        first moment a group would find too few blocks (or groups ending together would compete
        for them), or, with another kernel pending, would take the kernel's last ones: that one
        may dispatch then. The entries hold them as ``extra`` (their blocks move from ``undispatched`` to
        ``batched``); any event that touches the GPU first returns the waves not begun
        (:meth:`_unbatch`), so the dispatcher and every rate see exactly what they would have seen.
        Runs after the rates are set: a group's wave lasts ``1 / rate``."""
        if not gpu.pending:
            return
        first: dict[str, _Kernel] = {}
        for k in gpu.pending:
            if k.undispatched > 0 or k.late:
                for p in k.partitions:
                    if p not in first:
                        first[p] = k
        if not first:
            return
        # A kernel waiting behind k may dispatch the moment k has no blocks left waiting, so the wave
        # that takes k's last blocks must begin at an event (a kernel launched later is one).
        behind = len(gpu.pending) > 1
        # A kernel first on both partitions counts once.
        for k in {id(k): k for k in first.values()}.values() if len(first) > 1 else first.values():
            if k.flow is not None:
                continue
            where = [(g, e) for g in gpu.groups for e in g.entries if e.k is k]
            if not where:
                continue
            if any(first.get(g.part) is not k or e.extra or e.rate <= 0 for g, e in where):
                continue
            # The blocks a kernel short of SMs would fill them with stay waiting: the slow-down
            # attribution (Engine._advance) counts them while the waves run.
            spare = k.undispatched - max(0, k.max_resident - k.resident)
            if spare <= 0:
                continue
            if len(where) == 1:
                g, e = where[0]
                wave = g.n * e.per_sm
                self._give(gpu, k, e, wave, (spare - 1) // wave if behind else spare // wave)
                continue
            waves = _interleave([g.n * e.per_sm for g, e in where], [e.remaining / e.rate for _, e in where],
                                [1.0 / e.rate for _, e in where], spare, keep_last=behind)
            for (g, e), n in zip(where, waves, strict=True):
                self._give(gpu, k, e, g.n * e.per_sm, n)

    @staticmethod
    def _give(gpu: _Gpu, k: _Kernel, e: _Entry, wave: int, waves: int) -> None:
        if waves > 0:
            e.extra = waves
            e.remaining += waves
            k.undispatched -= waves * wave
            k.batched += waves * wave
            gpu.batched = True

    def _unbatch(self, gpu: _Gpu) -> None:
        """Give fast-forwarded waves not yet begun back to their kernels (see :meth:`_batch`)."""
        for g in gpu.groups:
            for e in g.entries:
                if e.extra:
                    k = e.k
                    # Each wave is one unit of work, the current one last to have begun.
                    left = min(e.extra, max(0, math.ceil(e.remaining) - 1))
                    e.remaining -= left
                    wave = g.n * e.per_sm
                    k.batched -= e.extra * wave
                    k.undispatched += left * wave
                    e.extra = 0
        gpu.batched = False

    # -- the block dispatcher ------------------------------------------------------------------

    def _dispatch(self, gpu: _Gpu) -> None:
        """Leftover policy, per SM partition: a kernel places blocks only on partitions where no
        earlier kernel (in priority, then launch order) still has blocks waiting. A carve-out
        partitions the SMs, so a compute kernel waiting for room on the main SMs does not hold a
        collective back from the reserved ones."""
        now = self.now
        placed_any = False
        blocked: set[str] = set()
        any_done = False
        for k in gpu.pending:
            allowed = tuple(p for p in k.partitions if p not in blocked) if blocked else k.partitions
            if allowed:
                before = k.undispatched
                self._place(gpu, k, now, allowed)
                placed_any = placed_any or k.undispatched < before
            if k.undispatched == 0 and not k.late:
                any_done = True
                continue
            blocked.update(k.partitions)
            if len(blocked) == gpu.n_partitions:
                break
        if any_done:
            gpu.pending = [k for k in gpu.pending if k.undispatched > 0 or k.late]
        if placed_any:
            self._merge(gpu)

    def _place(self, gpu: _Gpu, k: _Kernel, now: float, partitions: tuple[str, ...]) -> None:
        """Place k's blocks one SM-layer at a time on the group of SMs with the most room for
        another of its blocks (ties: the larger group), as long as any SM has room.

        Layers the greedy choice would put on the same group in a row are placed at once: one
        block more takes exactly one off the group's fit, so the best group keeps winning until
        its fit falls to the runner-up's."""
        kt, kr, ks = k.threads, k.regs, k.smem
        cap = self._cluster_room(gpu, k) if k.cluster > 1 else _BIG
        if k.start_s == _INF and k.cluster == 1 and gpu.model.unit_sms:
            k.paired = gpu.cluster_freed_s == now or any(o.cluster > 1 and o.resident > 0 for o in gpu.running)
        if k.ctas and k.start_s == _INF:
            self._hold_late(gpu, k, partitions, cap)
        todo = min(k.undispatched, cap - k.resident)
        while todo > 0:
            best: _Group | None = None
            best_fit = 0
            second_fit = 0
            second_n = 0
            for g in gpu.groups:
                if g.part not in partitions:
                    continue
                # _fit, inlined: this runs for every group at every placement.
                fit = g.threads // kt
                if g.blocks < fit:
                    fit = g.blocks
                if kr and g.regs // kr < fit:
                    fit = g.regs // kr
                if ks and g.smem // ks < fit:
                    fit = g.smem // ks
                if fit <= 0:
                    continue
                if best is None or fit > best_fit or (fit == best_fit and g.n > best.n):
                    if best is not None:
                        second_fit, second_n = best_fit, best.n
                    best, best_fit = g, fit
                elif fit > second_fit or (fit == second_fit and g.n > second_n):
                    second_fit, second_n = fit, g.n
            if best is None:
                return
            if todo < best.n:
                rest = best.clone(best.n - todo)
                best.n = todo
                gpu.groups.insert(gpu.groups.index(best) + 1, rest)
                layers = 1
            else:
                wins = best_fit - second_fit + (1 if best.n > second_n else 0)
                layers = max(1, min(wins, best_fit, todo // best.n))
            best.threads -= layers * kt
            best.regs -= layers * kr
            best.smem -= layers * ks
            best.blocks -= layers
            for e in best.entries:
                if e.k is k and e.born == now and e.remaining == 1.0:
                    e.per_sm += layers
                    break
            else:
                best.entries.append(_Entry(k, layers, 1.0 if k.flow is None else _INF, now))
            k.undispatched -= layers * best.n
            k.resident += layers * best.n
            if k.start_s == _INF:
                k.start_s = now
            if k.late and k.resident > k.ctas - k.late:
                # More tiles run at once than CTAs had found SMs: late CTAs have found some (SMs
                # another kernel freed) and run their first tiles among the rest.
                came = min(k.late, k.resident - (k.ctas - k.late))
                k.late -= came
                k.undispatched += came
            todo = min(k.undispatched, cap - k.resident)

    @staticmethod
    def _cluster_room(gpu: _Gpu, k: _Kernel) -> int:
        """The most blocks of a cluster kernel resident at once: its blocks per SM on every SM but
        those other kernels hold (no block of it fits there) and the free ones those strand, no
        whole cluster fitting in their placement unit. SMs held by kernels that started on an
        idle GPU are taken to sit where a plain launch puts its blocks (GpuModel.stranded_sms), as
        NCCL's and the harness's kernels are launched: measured, calibration/data/README.md, "Where
        2-block clusters go". Those held by kernels that started beside a cluster kernel or as one
        left SMs took SMs its clusters could not use first (the stranded ones), then SMs its
        clusters freed, whole clusters' worth: they strand none."""
        held = paired = 0
        for g in gpu.groups:
            if _fit(g.threads, g.regs, g.smem, g.blocks, k.threads, k.regs, k.smem) == 0 and \
                    not any(e.k is k for e in g.entries):
                held += g.n
                if all(e.k.paired for e in g.entries):
                    paired += g.n
        m = gpu.model
        plain = held - paired
        stranded = m.stranded_sms(plain, k.cluster)
        return (m.sm_count - plain - stranded - max(0, paired - stranded)) * k.blocks_per_sm_alone

    @staticmethod
    def _hold_late(gpu: _Gpu, k: _Kernel, partitions: tuple[str, ...], cap: int) -> None:
        """At a persistent kernel's first placement, hold back the first tiles of the CTAs that find
        no SM (another kernel holds it). Each runs its first tile only once the resident CTAs have
        run all the other tiles: one more round of tiles from the first SM taken, as measured on
        cuBLAS's Hopper GEMMs beside SM-holding kernels (calibration/data/README.md, "smloss")."""
        room = min(cap, sum(g.n * _fit(g.threads, g.regs, g.smem, g.blocks, k.threads, k.regs, k.smem)
                            for g in gpu.groups if g.part in partitions))
        if room <= 0:
            return  # nothing starts now; counted again when something does
        late = k.ctas - min(room, k.ctas)
        if late > 0:
            k.late = late
            k.undispatched -= late

    def _arrivals(self) -> None:
        now = self.now
        seen: set[int] = set()
        for r in list(self.touched):
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
                        self._touch(q)
                    f.start_s = now
                    f.phase = "latency" if f.latency_left_s > 0 else "data"
                    self.n_waiting -= 1
                    self.n_data += f.phase == "data"
                    if f.phase == "data" and f.remaining_bytes <= 0:
                        self._finish_flow(f, now)

    # -- rates ---------------------------------------------------------------------------------

    def _rates(self, ranks: list[int]) -> None:
        """Rates of everything on the GPUs in ``ranks``: closed over running flows, so no flow or
        channel outside them is affected."""
        # HBM bytes/s each kernel would move at its block rates, one dict per GPU (in rank order).
        demands: list[tuple[int, dict[_Kernel, float]]] = []
        gpus = self.gpus
        for r in ranks:
            gpu = gpus[r]
            mult = gpu.mult
            groups = gpu.groups
            for g in groups:
                for e in g.entries:
                    e.k.issued = 0.0
            demand: dict[_Kernel, float] = {}
            # The fraction of the GPU's SMs running blocks that load the shared memory system
            # (GEMM tiles, KernelDemand.load_share): the fewer, the faster each of those runs.
            busy = 0
            if self.any_load:
                for g in groups:
                    for e in g.entries:
                        if e.k.load_share > 0:
                            busy += g.n
                            break
            idle_share = 1.0 - busy / gpu.model.sm_count
            for g in groups:
                entries = g.entries
                if not entries:
                    continue
                if len(entries) == 1:
                    e = entries[0]
                    ask = e.k.ask
                    if ask > 0:
                        x = 1.0 / e.per_sm
                        cap = e.k.cap
                        e.share = (x if x < cap else cap) / ask
                    else:
                        e.share = 1.0
                else:
                    shares = water_fill([e.k.cap for e in entries], [e.per_sm for e in entries], 1.0)
                    for e, got in zip(entries, shares, strict=True):
                        ask = e.k.ask
                        e.share = got / ask if ask > 0 else 1.0
                n = g.n
                for e in entries:
                    k = e.k
                    blocks = n * e.per_sm
                    k.issued += blocks * e.share
                    if k.flow is not None:
                        e.rate = 0.0
                        continue
                    e.rate = e.share * mult[k.clock_cls] / k.t_block
                    if k.load_share > 0:
                        e.rate /= 1.0 - k.load_share * idle_share
                    if k.bytes_per_block > 0:
                        demand[k] = demand.get(k, 0.0) + blocks * e.rate * k.bytes_per_block
            for k in gpu.running:
                k.theta = k.theta_self = 1.0
            for k, raw in demand.items():
                # The clock slows a memory-bound kernel's whole rate by the part of its time that
                # follows it, even one whose blocks could move data faster than HBM lets them.
                cap = k.hbm_cap * mult[k.clock_cls] if k.clock_cls in self.memory_share_cls else k.hbm_cap
                if raw > cap:
                    k.theta = k.theta_self = cap / raw
                    demand[k] = cap
            if demand:
                demands.append((r, demand))

        # Only flows moving data take bandwidth; the others' rates are never read.
        flows: list[_Flow] = []
        if self.n_data:
            seen: set[int] = set()
            for r in ranks:
                for f in gpus[r].flows:
                    if f.phase == "data" and id(f) not in seen:
                        seen.add(id(f))
                        flows.append(f)
        pressure = self._pressure(ranks) if self.has_pressure else []
        for f in flows:
            d = f.demand
            factor = 1.0
            if not d.uses_copy_engine:
                # NCCL moves data no faster than its resident channels can issue copies.
                for m in f.members.values():
                    if m.kernel is not None:
                        factor = min(factor, m.kernel.issued / m.kernel.blocks)
            f.sm_factor = factor
            f.cap = d.rate_cap_bytes_per_s * factor
        # HBM's loaded latency slows whoever waits on memory (channel.latency_slowdowns): their
        # demands fall before bandwidth is shared.
        asked_alone: dict[_Kernel, float] = {}
        if self.latency_law:
            asked_alone = self._latency(demands, flows, pressure)
        if not flows and not pressure and not self.opts.counters and not self.opts.check_invariants:
            self._hbm_only(demands, asked_alone)
            return

        # Channels: HBM of each GPU in ranks, then the links the flows use.
        channel: dict[Any, int] = {("hbm", r): i for i, r in enumerate(ranks)}
        capacity = [self.gpus[r].model.hbm_bytes_per_s for r in ranks]
        caps: list[float] = []
        weights: list[float] = []
        usage: list[list[tuple[int, float]]] = []
        owners: list[_Kernel | _Flow | None] = []
        hbm_has_kernel: set[int] = set()
        hbm_has_flow: set[int] = set()
        for r, demand in demands:
            hbm = [(channel[("hbm", r)], 1.0)]
            for k, asked in demand.items():
                caps.append(asked)
                weights.append(1.0)
                usage.append(hbm)
                owners.append(k)
            hbm_has_kernel.add(r)
        for f in flows:
            d = f.demand
            use: list[tuple[int, float]] = []
            for key, c in f.usage:
                if key[0] == "hbm":
                    hbm_has_flow.add(key[1])
                idx = channel.get(key)
                if idx is None:
                    idx = channel[key] = len(capacity)
                    capacity.append(self.machine.links[key])
                use.append((idx, c))
            # Shares are fair in HBM bytes: a flow's rate counts hbm_coeff bytes per byte moved. The
            # floor keeps a flow that barely touches HBM from an unbounded weight.
            caps.append(f.cap)
            ce_weight = self.machine.copy_engine_hbm_weight if d.uses_copy_engine else 1.0
            weights.append(ce_weight * d.hbm_weight / max(d.hbm_coeff, 0.05))
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
        if self.opts.check_invariants:
            self._check(ranks, capacity, alloc.rates, usage)
        n_hbm = len(ranks)
        for i, owner in enumerate(owners):
            x = alloc.rates[i]
            if owner is None:
                continue
            if isinstance(owner, _Kernel):
                full = asked_alone.get(owner, caps[i])
                owner.theta = (x / full if full > 0 else 1.0) * owner.theta_self
            else:
                owner.rate = x
                b = alloc.bottleneck[i]
                # A cap lowered by HBM's latency is HBM holding the flow back.
                owner.bottleneck = (("hbm" if owner.latency_slow > 1.0 else "") if b == CAP
                                    else ("hbm" if b < n_hbm else "link"))
        if self.opts.counters:
            self._sample(ranks, channel, capacity, alloc.rates, usage)

    def _pressure(self, ranks: list[int]) -> list[tuple[int, float, float]]:
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
                share, weight = self.machine.pressure_of(f.demand.protocol)
                if share > 0:
                    total = share * m.kernel.resident
                    out.append((r, total if total < PRESSURE_MAX else PRESSURE_MAX, weight))
        return out

    def _hbm_only(self, demands: list[tuple[int, dict[_Kernel, float]]], asked_alone: dict[_Kernel, float]) -> None:
        """No flow moves data on these GPUs: each HBM is shared among its kernels alone (max-min
        with demand caps, which is a water fill). ``asked_alone``: the demands of kernels the
        latency law slowed, before it did."""
        for r, demand in demands:
            cap = self.gpus[r].model.hbm_bytes_per_s
            ks = list(demand)
            asked = list(demand.values())
            got = asked if sum(asked) <= cap * (1 + 1e-9) else water_fill(asked, [1] * len(ks), cap)
            for k, d, x in zip(ks, asked, got, strict=True):
                full = asked_alone.get(k, d)
                if full != d or x != d:
                    k.theta = (x / full if full > 0 else 1.0) * k.theta_self

    def _memory_wait(self, op: Op) -> float:
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

    def _latency(self, demands: list[tuple[int, dict[_Kernel, float]]], flows: list[_Flow],
                 pressure: list[tuple[int, float, float]]) -> dict[_Kernel, float]:
        """Apply HBM's loaded-latency law on each GPU: lower the demands of kernels (in place in
        ``demands``) and the caps of flows by their slowdowns; returns the kernels' demands
        before, for their pace. A flow spanning GPUs takes its largest slowdown; a collective's
        pressure loads the memory and does not slow."""
        m = self.machine
        kappa, q = m.hbm_latency_capacity, m.hbm_latency_exponent
        users: dict[int, list[tuple[_Kernel | _Flow | int, float, float]]] = {}
        for r, demand in demands:
            peak = self.gpus[r].model.hbm_peak_bytes_per_s
            users[r] = [(k, d / peak, k.mem_wait) for k, d in demand.items() if d > 0]
        yielding = m.copy_engine_hbm_weight < 1.0
        left = self._hbm_left(demands, flows, pressure) if yielding else {}
        for f in flows:
            wait = 0.0 if f.demand.uses_copy_engine else m.collective_memory_wait
            for key, c in f.usage:
                if key[0] == "hbm" and c > 0:
                    r = key[1]
                    moved = f.cap * c
                    if yielding and f.demand.uses_copy_engine:
                        # A copy engine yielding to kernels moves what they leave of HBM.
                        moved = min(moved, left[r])
                    users.setdefault(r, []).append((f, moved / self.gpus[r].model.hbm_peak_bytes_per_s, wait))
        for i, (r, share, _) in enumerate(pressure):
            # A resident collective's pressure is a fixed share: it does not back off, and it
            # raises the latency the others see.
            users.setdefault(r, []).append((i, share * self.gpus[r].model.hbm_bytes_per_s
                                            / self.gpus[r].model.hbm_peak_bytes_per_s, 0.0))
        before: dict[_Kernel, float] = {}
        flow_slow: dict[int, float] = {}
        by_rank = dict(demands)
        for r, us in users.items():
            if len(us) < 2 or not any(w > 0 for _, _, w in us):
                continue
            slow, _ = latency_slowdowns([x for _, x, _ in us], [w for _, _, w in us], kappa, q)
            for (owner, _, _), s in zip(us, slow, strict=True):
                if s <= 1.0:
                    continue
                if isinstance(owner, _Kernel):
                    demand = by_rank[r]
                    before[owner] = demand[owner]
                    demand[owner] = demand[owner] / s
                elif isinstance(owner, _Flow) and s > flow_slow.get(id(owner), 1.0):
                    flow_slow[id(owner)] = s
        for f in flows:
            f.latency_slow = flow_slow.get(id(f), 1.0)
            f.cap /= f.latency_slow
        return before

    def _hbm_left(self, demands: list[tuple[int, dict[_Kernel, float]]], flows: list[_Flow],
                  pressure: list[tuple[int, float, float]]) -> dict[int, float]:
        """Per GPU, the HBM bandwidth (bytes/s) its kernels, SM flows and collective pressure leave
        to copy engines that yield to them."""
        left = {r: self.gpus[r].model.hbm_bytes_per_s - sum(d.values()) for r, d in demands}
        for f in flows:
            for key, c in f.usage:
                if key[0] == "hbm":
                    r = key[1]
                    if r not in left:
                        left[r] = self.gpus[r].model.hbm_bytes_per_s
                    if not f.demand.uses_copy_engine:
                        left[r] -= f.cap * c
        for r, share, _ in pressure:
            if r in left:
                left[r] -= share * self.gpus[r].model.hbm_bytes_per_s
        return {r: max(0.0, x) for r, x in left.items()}

    def _check(self, ranks: list[int], capacity: list[float], rates: list[float],
               usage: list[list[tuple[int, float]]]) -> None:
        load = [0.0] * len(capacity)
        for x, use in zip(rates, usage, strict=True):
            for r, c in use:
                load[r] += x * c
        for r, (used, cap) in enumerate(zip(load, capacity, strict=True)):
            if used > cap * (1 + 1e-9):
                raise RuntimeError(f"channel {r} over-subscribed: {used} > {cap}")
        for rank in ranks:
            gpu = self.gpus[rank]
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
            for k in gpu.running:
                if k.resident < 0 or k.undispatched < 0:
                    raise RuntimeError(f"kernel {k.id}: negative block count")

    # -- power ---------------------------------------------------------------------------------

    def _set_clock(self, gpu: _Gpu, c: float) -> None:
        assert self.power is not None
        gpu.clock_frac = c
        gpu.mult = list(self.power.multipliers(c))
        gpu.throttled = any(x != 1.0 for x in gpu.mult)

    def _activity(self, gpu: _Gpu) -> _Activity:
        """Power inputs of a GPU from its current rates (before HBM shares are applied to block
        rates): tensor and other SM dynamic watts at c = 1, HBM bytes/s that do not follow the SM
        clock, HBM bytes/s of clock-bound kernels, link bytes/s in plus out, and the busy SM count
        of tensor, CUDA-core and memory work."""
        tensor = other = fixed = follow = link = xt = xf = xm = 0.0
        # HBM bytes/s of tensor kernels whose rate saturates, per rate class: they follow the clock
        # only up to their saturation clock.
        saturating: dict[int, float] = {}
        memory_cls = self.memory_share_cls
        r = gpu.rank
        for g in gpu.groups:
            n = g.n
            for e in g.entries:
                k = e.k
                f = k.flow
                if f is not None:
                    # NCCL's loops work only while data moves, in proportion to its pace.
                    if f.phase == "data" and f.demand.rate_cap_bytes_per_s > 0:
                        x = n * e.per_sm * k.pw_unit * min(1.0, f.rate / f.demand.rate_cap_bytes_per_s)
                        other += x * k.pw_w
                        xm += x
                    continue
                x = n * e.per_sm * k.pw_unit * e.share * k.theta / k.theta_self
                if k.pw_tensor:
                    tensor += x * k.pw_w
                    xt += x
                else:
                    other += x * k.pw_w
                    if k.clock_cls and k.clock_cls not in memory_cls:
                        xf += x
                    else:
                        xm += x
                if k.bytes_per_block > 0:
                    b = n * e.per_sm * e.rate * k.theta * k.bytes_per_block
                    if k.clock_cls in self.saturating_cls:
                        saturating[k.clock_cls] = saturating.get(k.clock_cls, 0.0) + b
                    elif k.clock_cls and k.clock_cls not in memory_cls:
                        follow += b
                    else:
                        # The clock solver takes a memory-bound kernel's traffic as fixed, also
                        # where part of its time follows the clock: it then overstates that
                        # kernel's HBM power at clocks below the current one.
                        fixed += b
        for f in gpu.flows:
            if f.phase != "data" or f.rate <= 0:
                continue
            for key, c in f.usage:
                if key[0] == "hbm":
                    if key[1] == r:
                        fixed += f.rate * c
                elif key[0] in ("egress", "ingress", "link") and (key[1] == r or key[2] == r):
                    link += f.rate * c
        sms = gpu.model.sm_count
        c = gpu.clock_frac
        # As (bytes/s at the saturation clock, that clock), the form the clock solver takes.
        sat = tuple((b * self.saturating_cls[i] / min(c, self.saturating_cls[i]), self.saturating_cls[i])
                    for i, b in saturating.items())
        return tensor / sms, other / sms, fixed, follow, link, xt / sms, xf / sms, xm / sms, sat

    def _power(self, ranks: list[int]) -> None:
        """Set each GPU's clock under its power policy, then record its power.

        The clock is solved from the activity at the current rates; a new clock changes the rates
        (and HBM shares), so the GPUs are re-rated and solved again until no clock moves. Clocks
        sit on the GPU's clock grid, so this stops after a step or two; the bound keeps a GPU whose
        clock would flip between two grid points deterministic."""
        assert self.power is not None
        pc = self.power
        model = pc.model
        acts: dict[int, _Activity] = {}
        if self.windowed:
            now = self.now
            for r in ranks:
                gpu = self.gpus[r]
                a = self._activity(gpu)
                assert gpu.ctl is not None
                gpu.ctl.record(now, (a[0] + a[1], a[2], a[3] / gpu.clock_frac, a[4], a[8]))
                if self.records_power:
                    self._record_power(gpu, now, a)
            return
        if self.managed:
            cap, hi = pc.cap_w, pc.max_clock_fraction
            for _ in range(4):
                changed = False
                for r in ranks:
                    gpu = self.gpus[r]
                    a = acts[r] = self._activity(gpu)
                    c = model.solve_clock(cap, a[0] + a[1], a[2], a[3] / gpu.clock_frac, a[4], hi,
                                          hbm_saturating=a[8])
                    if c != gpu.clock_frac:
                        self._set_clock(gpu, c)
                        changed = True
                if not changed:
                    break
                self._rates(ranks)
                acts.clear()
        now = self.now
        for r in ranks:
            gpu = self.gpus[r]
            a = acts[r] if r in acts else self._activity(gpu)
            self._record_power(gpu, now, a)

    def _record_power(self, gpu: _Gpu, now: float, a: _Activity) -> None:
        assert self.power is not None
        model = self.power.model
        if self.managed:
            c = c_tensor = gpu.clock_frac
            s_tensor = s_other = model.dynamic_scale(c)
        else:
            # Without power management each kernel runs as calibrated: tensor work at the clock
            # its efficiency was measured at, the rest at the compute clock (times any manual factor).
            c = gpu.clock_factor
            c_tensor = c * model.tensor_reference_clock_fraction
            if c == 1.0:
                s_tensor, s_other = self.s_calibrated
            else:
                s_tensor, s_other = model.dynamic_scale(c_tensor), model.dynamic_scale(c)
        tensor, other, fixed, follow, link = a[0], a[1], a[2], a[3], a[4]
        follow += sum(b * min(gpu.clock_frac, sat) / sat for b, sat in a[8])
        hbm = (fixed + follow) / model.hbm_peak_bytes_per_s
        lp = model.link_peak_bytes_per_s
        lk = link / lp if lp > 0 else 0.0
        p = (model.idle_w + s_tensor * tensor + s_other * other + model.hbm_w * (hbm if hbm < 1.0 else 1.0)
             + model.link_w * (lk if lk < 1.0 else 1.0))
        r = gpu.rank
        self._counter(now, r, POWER_COUNTER, p)
        self._counter(now, r, CLOCK_COUNTER, (c_tensor if tensor > 0 else c) * model.compute_clock_hz)
        if self.opts.counters:
            self._counter(now, r, "sm_tensor_fraction", a[5])
            self._counter(now, r, "sm_fp32_fraction", a[6])
            self._counter(now, r, "sm_memory_fraction", a[7])
            self._counter(now, r, "link_bytes_per_s", link)

    def _sample(self, ranks: list[int], channel: dict[Any, int], capacity: list[float], rates: list[float],
                usage: list[list[tuple[int, float]]]) -> None:
        now = self.now
        load = [0.0] * len(capacity)
        for x, use in zip(rates, usage, strict=True):
            for r, c in use:
                load[r] += x * c
        link_out = dict.fromkeys(ranks, 0.0)
        for key, i in channel.items():
            if key[0] in ("egress", "link") and key[1] in link_out:
                link_out[key[1]] += load[i]
        for r in ranks:
            gpu = self.gpus[r]
            busy = 0
            for g in gpu.groups:
                if g.entries:
                    busy += g.n
            self._counter(now, r, "sm_busy_fraction", busy / gpu.model.sm_count)
            self._counter(now, r, "hbm_bytes_per_s", load[channel[("hbm", r)]])
            self._counter(now, r, "clock_factor", gpu.clock_factor)
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
                           wait_peers_s=0.0, clock_s=k.clock_s)
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
        c_t, c_rank, c_name, c_value = COUNTER_COLUMNS  # a dict display per row: a long run records many
        counters = [{c_t: t, c_rank: r, c_name: n, c_value: v} for t, r, n, v in self.counter_rows]
        return timeline_from_rows(rows, counters)
