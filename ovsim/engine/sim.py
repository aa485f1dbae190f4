"""The discrete-event engine.

:class:`~ovsim.engine.clock.EventQueue` keeps the clock and the events. Between events every
activity progresses at a constant rate, so the engine only needs an event when something changes:
a launch, a block finishing, a flow finishing, a latency elapsing. At each such instant it

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
(``power_loop.steady_history``), so it predicts the iteration's steady state.

Identical SMs are kept as groups ("100 SMs each running one GEMM block, 32 running one NCCL block")
so the cost does not grow with the SM count, and a kernel's waves that nothing else can interleave
with are taken in one event (:func:`ovsim.engine.dispatch.batch`), so the cost does not grow with its waves either.
Waves, tails, a persistent kernel blocking a later one, and collectives waiting for their slowest
rank all come out of these rules.

Work is local: a GPU's rates depend only on its own SMs and HBM and on the flows that use them, so
an event recomputes only the GPUs it touches. A flow moving data couples all its GPUs: their shared
channels are solved together, but a coupled GPU the event did not touch keeps its SMs' rates, and
is brought up to date only where the solve moves one of its rates
(:meth:`~ovsim.engine.rates.RateSolver.solve_beside`). Each GPU is advanced lazily to the present
when it is touched; between touches nothing about it changes.

This module is the event loop: streams, launches and the order of the steps above. The steps
themselves are parts with narrow interfaces: :mod:`~ovsim.engine.dispatch` (steps 1-2 for blocks,
and fast-forwarding), :mod:`~ovsim.engine.flows` (collectives and copies joining, waiting, moving
and finishing), :mod:`~ovsim.engine.rates` (steps 3-4),
:mod:`~ovsim.engine.routing` (which channels a flow uses), :mod:`~ovsim.engine.power_loop` (step 5),
:mod:`~ovsim.engine.progress` (work done and slow-down accounting between events, step 6's time),
:mod:`~ovsim.engine.record` (counters and the Timeline), over the records of
:mod:`~ovsim.engine.state`.
"""


from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

from ovsim.engine import dispatch, progress
from ovsim.engine.clock import EventQueue
from ovsim.engine.coupled import solve_local
from ovsim.engine.flows import Flows
from ovsim.engine.machine import MachineModel
from ovsim.engine.power import Period, PowerConfig
from ovsim.engine.power_loop import PowerLoop, steady_history
from ovsim.engine.rates import RateSolver
from ovsim.engine.record import Counters, Results, timeline_of
from ovsim.engine.state import (
    INF,
    TIME_EPS,
    GpuState,
    KernelSpec,
    KernelState,
    StreamState,
    spec_key,
)
from ovsim.engine.timeline import Timeline
from ovsim.errors import OvsimError
from ovsim.gcpause import paused_gc
from ovsim.hw.power import PowerModel
from ovsim.models.ir import Op, Workload


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
    # Take a kernel's waves that nothing else can interleave with in one event (dispatch.batch).
    # The timeline is the same either way, to float round-off; off only to check that.
    fast_forward: bool = True
    # Leave a GPU that a moving collective only couples to an event's GPUs as it is where its
    # rates do not move (RateSolver.solve_beside). The same timeline to float round-off; off only
    # to check that.
    keep_coupled: bool = True


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
        self.env = EventQueue()
        self.gpus = [GpuState(r, g) for r, g in enumerate(machine.gpus)]
        self.priority = dict(priorities or {})
        for s in workload.streams:
            self.priority.setdefault((s.rank, s.name), s.priority)
        self.finished: set[str] = set()
        self.waiters: dict[str, list[StreamState]] = {}
        self.streams: dict[tuple[int, str], StreamState] = {}
        self.released: list[StreamState] = []  # streams to move on once this instant's dispatching is done
        # What finished ops and flows came to; a finished kernel's or flow's state is dropped.
        self.results = Results(len(workload.ops))
        # What every launch of a kernel demand shares (state.spec_key); the workload and the
        # machine keep the demands and GPU models alive, so their ids are not reused during the run.
        self.specs: dict[tuple[int, int, str, bool, str, str | None], KernelSpec] = {}
        self.seq = 0
        self.resolves = 0  # events the engine handled (a figure for benchmarks)
        self.resolve_pending = False
        self.now = 0.0  # the time of the resolve under way, and its completion tolerance
        self.eps = TIME_EPS
        # Inputs gathered between resolves: GPUs whose timer fired, ops whose host delay ended,
        # clock changes.
        self.fired: list[int] = []
        self.woken: list[StreamState] = []
        self.clock_changes: list[tuple[int, float]] = []
        # Per resolve: GPUs brought up to date (in order), those still to check for completions,
        # and those whose dispatcher must run.
        self.touched: dict[int, None] = {}
        self.to_complete: list[int] = []
        self.to_dispatch: set[int] = set()
        self.counters = Counters()
        self.nccl_issue = machine.nccl_issue_fraction
        self.flows = Flows(machine, self.gpus, self.results, self._touch, self._stream_op_done,
                           self.to_dispatch)
        self.power = self.opts.power
        self.loop = PowerLoop(self.power, self.gpus, self.counters, self.opts.counters) \
            if self.power is not None else None
        self.managed = self.loop is not None and self.loop.managed
        self.windowed = self.loop is not None and self.loop.windowed
        # Rate classes of memory-bound kernels, and the share of their time that follows the clock.
        self.memory_share_cls = self.loop.memory_share_cls if self.loop is not None else {}
        any_load = any(op.kernel is not None and op.kernel.load_share > 0 and op.flow is None for op in workload.ops)
        self.solver = RateSolver(machine, self.gpus, any_load=any_load, memory_share_cls=self.memory_share_cls,
                                 keep_loads=self.opts.counters, check_invariants=self.opts.check_invariants)
        self.tick_due = False
        # Not where the power loop re-solves clocks at every event: a clock it moves re-rates the
        # touched GPUs inside the loop, which must then hold every GPU their flows couple.
        self.keep_coupled = self.opts.keep_coupled and not (self.managed and not self.windowed)
        # Resolves whose coupled GPUs were left as they were, and those that had to bring them in.
        self.coupled_kept = self.coupled_solved = 0
        self.coupled_local = 0  # of those kept, decided on the event's GPUs alone (coupled.solve_local)
        self.power_history = power_history
        if self.loop is not None and self.managed:
            self.loop.start_clocks(self.loop.idle_history() if power_history is None else power_history)

    def _steady_history(self) -> dict[int, tuple[Period, ...]]:
        """The window each GPU would bring into the workload had it just run the same workload
        over and over (power_loop.steady_history), found by runs of the workload itself."""
        assert self.power is not None and self.loop is not None
        opts = replace(self.opts, counters=False, progress=None)

        def warm_run(history: dict[int, tuple[Period, ...]]) -> tuple[float, list[GpuState]]:
            warm = Engine(self.workload, self.machine, opts, self.priority, power_history=history)
            assert warm.loop is not None
            warm.loop.records_power = False
            warm._simulate()
            return warm.now, warm.gpus

        return steady_history(self.power, self.loop.idle_history(), [g.clock_frac for g in self.gpus], warm_run)

    def left_window(self) -> dict[int, tuple[Period, ...]]:
        """After a run under a windowed power loop: the window each GPU leaves to a repeat of the
        workload (ClockWindow.repeated); empty without one."""
        return {g.rank: g.clock_window.repeated() for g in self.gpus if g.clock_window is not None}

    def _tick(self, _: object) -> None:
        """A control period ends: the loop sets each GPU's clock at the next resolve."""
        if len(self.finished) == len(self.workload.ops):
            return
        # Nothing else scheduled: the workload is stuck, and the run must end to say so.
        if not self.resolve_pending and self.env.peek() == INF:
            return
        assert self.power is not None and self.loop is not None
        period = self.power.model.control_period_s
        periods = self.loop.steady_periods(self.now, self.env.peek())
        self.tick_due = True
        self._request_resolve()
        self.env.schedule(periods * period, self._tick)

    # -- streams -------------------------------------------------------------------------------

    def run(self) -> Timeline:
        self._simulate()
        # The run's indexes over every op (about 200 bytes an op) go before the timeline is built
        # beside the results: they would otherwise set the peak of memory.
        self.finished.clear()
        self.streams.clear()
        return timeline_of(self.workload, self.results, self.counters)

    def _simulate(self) -> None:
        if self.windowed:
            assert self.power is not None and self.loop is not None
            # The power settings' start: "steady", the same workload came before (the steady state
            # of a loop of iterations, found by running it first); "idle", an idle window.
            if self.power_history is None and self.power.settings.start == "steady":
                self.loop.start_clocks(self._steady_history())
            self.env.schedule(self.power.model.control_period_s, self._tick)
        # The engine's objects (streams, kernels, entries, flows, scheduled events) form no garbage
        # cycles: reference counting frees them, and the cyclic collector's passes over the growing
        # heap of a long run only cost time (about 5% of it).
        with paused_gc():
            self.streams = self._streams()
            self.woken = list(self.streams.values())
            if self.loop is not None:
                for gpu in self.gpus:
                    self.loop.record(gpu, 0.0, (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, ()))
            self._request_resolve()
            try:
                self.env.run()
            finally:
                # Flows calls back into the engine; once the run is over the cycle is broken, so
                # that reference counting frees a finished engine at once.
                self.flows.detach()
        if self.windowed:
            # At the last completion (a tick after it changes nothing).
            for gpu in self.gpus:
                assert gpu.clock_window is not None
                gpu.clock_window.close(self.now)
        if len(self.finished) < len(self.workload.ops):
            self._report_unfinished()

    def _streams(self) -> dict[tuple[int, str], StreamState]:
        """Each stream's ops, with their indexes in the workload (an op's row in the results)."""
        by_stream: dict[tuple[int, str], tuple[list[Op], list[int]]] = {}
        for i, op in enumerate(self.workload.ops):
            key = (op.rank, op.stream)
            lists = by_stream.get(key)
            if lists is None:
                lists = by_stream[key] = ([], [])
            lists[0].append(op)
            lists[1].append(i)
        return {key: StreamState(key, ops, indexes, self.priority.get(key, 0))
                for key, (ops, indexes) in by_stream.items()}

    def _report_unfinished(self) -> None:
        unfinished = [op.id for op in self.workload.ops if op.id not in self.finished]
        if unfinished:
            waiting = self.flows.waiting_groups()
            hint = f"; collective(s) {waiting[:3]} never got every rank" if waiting else ""
            raise OvsimError(f"{len(unfinished)} op(s) never finished, e.g. '{unfinished[0]}'{hint}", field="ops")

    def _pump(self, s: StreamState) -> None:
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
                self.env.schedule(op.delay_s, self._on_wake(s))
                return
            s.slept = False
            if op.kind == "delay":
                s.idx += 1
                self._op_done(op.id)
                continue
            s.busy = True
            self._launch(op, s)

    def _next_order(self, s: StreamState) -> int:
        return s.indexes[s.idx] if s.idx < len(s.ops) else -1

    def _on_wake(self, s: StreamState) -> Callable[[object], None]:
        def wake(_: object) -> None:
            s.busy = False
            s.slept = True
            self.woken.append(s)
            self._request_resolve()
        return wake

    def _op_done(self, op_id: str) -> None:
        self.finished.add(op_id)
        self.released.extend(self.waiters.pop(op_id, ()))

    def _stream_op_done(self, s: StreamState, op_id: str) -> None:
        """The op stream ``s`` launched last finished: the stream moves on, then whoever waited for it.

        They launch only after the dispatcher has handed out what the finish freed: a launch takes
        microseconds on a real GPU, and the hardware scheduler places already-queued blocks first."""
        s.busy = False
        s.idx += 1
        self.finished.add(op_id)
        self.released.append(s)
        self.released.extend(self.waiters.pop(op_id, ()))

    def set_clock_factor(self, rank: int, factor: float) -> None:
        """Scale rank's SM clock (compute-bound work slows, memory-bound work does not) from now on.

        Callable before :meth:`run` or from an event's callback while it runs."""
        if not factor > 0:
            raise OvsimError(f"clock factor must be positive, got {factor}", field="clock_factor")
        if not 0 <= rank < len(self.gpus):
            raise OvsimError(f"no rank {rank} on a {len(self.gpus)}-GPU machine", field="clock_factor")
        self.clock_changes.append((rank, factor))
        self._request_resolve()

    # -- launching -----------------------------------------------------------------------------

    def _launch(self, op: Op, s: StreamState) -> None:
        """Launch ``op``, the op at stream ``s``'s position."""
        self._touch(op.rank)
        priority = s.priority
        index = s.indexes[s.idx]
        now = self.now
        gpu = self.gpus[op.rank]
        kernel: KernelState | None = None
        if op.kernel is not None:
            self.seq += 1
            # Ops of a repeated layer share their demand: what it asks is worked out once.
            key = spec_key(op, gpu.model, self.power)
            spec = self.specs.get(key)
            if spec is None:
                wait = self.solver.memory_wait(op) if self.solver.latency_law else 0.0
                spec = self.specs[key] = KernelSpec(op, gpu.model, self.nccl_issue, self.power, wait)
            kernel = KernelState(op, gpu, priority, self.seq, now, spec, index, s)
            pending = gpu.pending
            # Launch order is seq order: a kernel of no higher priority than the last goes last.
            if not pending or pending[-1].priority <= priority:
                pending.append(kernel)
            else:
                bisect.insort(pending, kernel, key=KernelState.sort_key)
            self.to_dispatch.add(op.rank)
            if op.flow is None:
                gpu.running.append(kernel)
        if op.flow is not None:
            self.flows.join(op, kernel, now, index, s)

    # -- the event loop ------------------------------------------------------------------------

    def _request_resolve(self) -> None:
        if not self.resolve_pending:
            self.resolve_pending = True
            self.env.schedule(0.0, self._resolve)

    def _on_timer(self, timer: object) -> None:
        rank, version = cast(tuple[int, int], timer)  # (rank, timer version), set by _schedule_next
        gpu = self.gpus[rank]
        if version == gpu.timer:
            gpu.timer_at = INF
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
        progress.advance(gpu, self.now)
        if gpu.batched:
            dispatch.unbatch(gpu, self.eps)

    def _resolve(self, _: object) -> None:
        self.resolve_pending = False
        # Time stands still during a resolve.
        self.now = now = self.env.now
        # Far from 0 a float time resolves less than TIME_EPS: a timer set for a completion can
        # land a few ulps short of it, and an absolute tolerance would then never see it complete.
        self.eps = max(TIME_EPS, 4 * math.ulp(now))
        self.resolves += 1
        if self.opts.progress is not None and self.resolves % 4096 == 0:
            self.opts.progress(len(self.finished), len(self.workload.ops))
        self.touched = {}
        if self.tick_due:
            self.tick_due = False
            assert self.loop is not None
            self.loop.control(now, self._touch)
        fired, self.fired = self.fired, []
        for r in fired:
            self._touch(r)
        changes, self.clock_changes = self.clock_changes, []
        for r, factor in changes:
            self._touch(r)
            g = self.gpus[r]
            g.clock_factor = factor
            if not self.managed:
                g.rate_multipliers = [1.0] + [factor] * (len(g.rate_multipliers) - 1)
                for i, share in self.memory_share_cls.items():
                    g.rate_multipliers[i] = PowerModel.memory_rate(factor, share)
                g.throttled = any(x != 1.0 for x in g.rate_multipliers)
        self.released, self.woken = self.woken, []
        self._settle_instant(couple=not self.keep_coupled)
        touched = self.touched
        ranks = sorted(touched) if len(touched) > 1 else list(touched)
        if self.flows.moving and self.keep_coupled:
            closure = self.solver.coupled(ranks, self.flows.moving_changes)
            if len(closure) > len(ranks):
                if self._keep_coupled(ranks, closure):
                    self._after_rates(ranks)
                    return
                self._settle_instant(couple=True)
                ranks = sorted(touched)
        self._rate(ranks)
        self._after_rates(ranks)

    def _keep_coupled(self, ranks: list[int], closure: list[int]) -> bool:
        """Rate ``ranks`` beside the GPUs moving flows couple to them (``closure``, the lot): True
        where those keep their rates, timers and waves (nothing about them changed); else False,
        with them brought up to date and touched, for a full solve."""
        kept, loads = solve_local(self.solver, self.touched)
        if kept:
            # The flows through them keep their rates: nothing outside them was shared with.
            self.coupled_local += 1
            sampled = sorted(self.touched)
        else:
            kept, loads = self.solver.solve_beside(closure, self.touched)
            sampled = closure
        if not kept:
            self.coupled_solved += 1
            for q in closure:
                self._touch(q)
            return False
        self.coupled_kept += 1
        if loads is not None:
            self.counters.sample(self.now, self.gpus, sampled, loads)
        return True

    def _settle_instant(self, couple: bool) -> None:
        """Retire what finished, dispatch and launch until this instant has nothing more to do.
        GPUs a flow moving data couples to a touched one are brought in first where something of
        theirs ends now, so that what it releases launches in program order with the rest;
        ``couple``: all of them."""
        gpus = self.gpus
        to_complete = self.to_complete
        to_dispatch = self.to_dispatch
        touched = self.touched
        now = self.now
        while True:
            while to_complete:
                self._complete(gpus[to_complete.pop()])
            if to_dispatch:
                for r in sorted(to_dispatch):
                    dispatch.dispatch(gpus[r], now)
                to_dispatch.clear()
            if self.flows.waiting:
                self.flows.arrivals(list(touched), now)
            # Within the completion tolerance of now: its blocks or flows complete at this instant.
            due = now + 4 * self.eps
            # A GPU's timer is queued within a few ulps of its time: with no event queued by then,
            # no coupled GPU has one due, and the coupled GPUs need not be looked at.
            if self.flows.moving and (couple or self.env.peek() <= due + 4 * self.eps):
                for q in self.solver.coupled(list(touched), self.flows.moving_changes):
                    if q not in touched and (couple or gpus[q].timer_at <= due):
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

    def _after_rates(self, ranks: list[int]) -> None:
        """Power, fast-forwarded waves and the next timer of each GPU whose rates were just set."""
        if self.loop is not None:
            self.loop.update(ranks, self.now, self._rate)
        fast_forward = self.opts.fast_forward
        gpus = self.gpus
        for r in ranks:
            # A GPU's batching reads and changes only its own SMs, so each GPU can be done at once.
            gpu = gpus[r]
            if fast_forward:
                dispatch.batch(gpu)
            self._schedule_next(gpu)

    def _rate(self, ranks: list[int]) -> None:
        """Solve the rates on the GPUs in ``ranks`` and sample their counters."""
        loads = self.solver.solve(ranks, self.flows.moving > 0)
        if loads is not None:
            self.counters.sample(self.now, self.gpus, ranks, loads)

    def _schedule_next(self, gpu: GpuState) -> None:
        """Settle the GPU's block rates, then set its timer for its next completion."""
        dt = progress.settle(gpu)
        now = self.now
        at = now + (dt if dt > 0.0 else 0.0)
        # The same completion recomputed after an unrelated event: keep the timer already set.
        # (Firing a femtosecond early or late is harmless: completion tests allow TIME_EPS.)
        if abs(at - gpu.timer_at) <= 1e-15 * (at if at > 1.0 else 1.0):
            return
        gpu.timer += 1  # an older timer of this GPU is stale now
        gpu.timer_at = at
        if dt == INF:
            return
        self.env.schedule(at - now, self._on_timer, (gpu.rank, gpu.timer))

    # -- completions ---------------------------------------------------------------------------

    def _complete(self, gpu: GpuState) -> None:
        now = self.now
        eps = self.eps
        done = dispatch.retire(gpu, now, eps)
        if done is not None:
            self.to_dispatch.add(gpu.rank)
            for k in done:
                k.end_s = now
                self.results.kernel(k.index, k)
                if self.solver.resources:
                    self.solver.forget(k)
                assert k.stream is not None
                self._stream_op_done(k.stream, k.op.id)
        if gpu.flows:
            self.flows.complete(gpu, now, eps)
