"""Power in the analytic fidelity: it has no shared resources, so the power of ops that run at the
same time is the sum of their isolated activities (``power_counters.analytic_power``). Under a windowed
power-limit loop it runs the same loop on that activity, the workload repeated
(:func:`throttled_durations`); with no window each op runs at the clock the cap gives it alone.

The analytic fidelity is the one for jobs of millions of ops, so everything here works on arrays
over the workload's ops: an op's activity is worked out once per kind of op (the ops of a repeated
layer share their demands), and each rank's power is swept over its streams, whose ops never
overlap, rather than op by op. The arithmetic is the engine's (:meth:`PowerModel.board_power_w`,
:meth:`PowerConfig.multipliers`) term for term, so the figures are the same to round-off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ovsim.engine.analytic import Plan, PlanTimes, analytic_timeline
from ovsim.engine.power import (
    Period,
    PowerConfig,
    SolverInputs,
    op_power_class,
    rate_class,
    tensor_clock_class,
)
from ovsim.engine.rank_clocks import average_clocks, one_rank_clocks
from ovsim.engine.timeline import Timeline
from ovsim.hw.power import HW_SLOWDOWN_FLOOR, MEMORY, TENSOR, PowerModel, voltage_fractions
from ovsim.hw.spec import GpuSpec
from ovsim.models.ir import FlowDemand, Op, Workload
from ovsim.models.occupancy import blocks_per_sm


@dataclass(frozen=True)
class _OpPower:
    cls: str  # tensor / fp32 / memory, "" for ops without SMs
    sm_w: float  # dynamic watts at c = 1
    hbm_bytes_per_s: float
    link_bytes_per_s: float


def isolated_activity(op: Op, gpu: GpuSpec, model: PowerModel) -> _OpPower:
    """What an op alone keeps busy, averaged over its isolated time (tail waves included)."""
    iso = op.isolated_s
    if iso <= 0:
        return _OpPower("", 0.0, 0.0, 0.0)
    sm_w = 0.0
    cls = ""
    hbm = 0.0
    link = 0.0
    k = op.kernel
    if k is not None:
        cls, w = op_power_class(op, model)
        occ = max(1, blocks_per_sm(k.block, gpu))
        sms = gpu.sm.count
        waves = math.ceil(k.blocks / (sms * occ))
        resident = k.blocks / (waves * sms * occ)  # mean fraction of block slots held
        per_sm = resident * (occ * k.issue_fraction if cls != MEMORY else 1.0)
        if op.flow is not None:
            f = op.flow
            busy = (iso - f.latency_s) / iso if iso > 0 else 0.0
            per_sm = k.blocks / (sms * occ) * busy
        sm_w = min(1.0, per_sm) * w
        if op.flow is None:
            hbm += k.hbm_bytes / iso
    if op.flow is not None:
        f = op.flow
        hbm += f.bytes * f.hbm_coeff / iso
        if f.pattern in ("ring", "all_pairs") and (f.group_size or len(f.ranks)) > 1:
            link += 2.0 * f.bytes * f.link_coeff / iso
        elif f.pattern == "p2p":
            link += f.bytes * f.link_coeff / iso
    return _OpPower(cls, sm_w, hbm, link)


def _flow_key(flow: FlowDemand | None) -> object:
    """What tells ``flow``'s terms from another's: every field but its group's name."""
    if flow is None:
        return None
    return tuple(v for k, v in vars(flow).items() if k != "group")


def _solver_inputs(op: Op, a: _OpPower, model: PowerModel) -> SolverInputs:
    """An op's isolated activity as the clock solver takes it (PowerModel.solve_clock's terms)."""
    follow = a.hbm_bytes_per_s if a.cls in (TENSOR, "fp32") else 0.0
    ref = model.tensor_reference_clock_fraction if a.cls == TENSOR else 1.0
    saturation = model.tensor_saturations[tensor_clock_class(op, model) - 2] if a.cls == TENSOR else math.inf
    if math.isfinite(saturation):
        # Its traffic at the saturation clock, from the calibrated traffic at the reference clock.
        at_sat = follow * saturation / min(ref, saturation)
        return (a.sm_w, a.hbm_bytes_per_s - follow, 0.0, a.link_bytes_per_s, ((at_sat, saturation),))
    return (a.sm_w, a.hbm_bytes_per_s - follow, follow / ref, a.link_bytes_per_s, ())


@dataclass(frozen=True)
class OpTerms:
    """What the analytic power loop needs of each op of a workload, one entry per op in its order.

    ``kind_solver``: per kind of op (``index``: each op's), the clock solver's terms (``sm_w``, HBM
    bytes/s that do not follow the clock, HBM bytes/s at c = 1 that do, link bytes/s, then per
    clock of ``saturations`` the saturating tensor traffic), each op's by :meth:`solver`: per op,
    they would hold 40 bytes an op or more; ``tensor``: a tensor-core kernel; ``rate_cls``: its index in
    :meth:`PowerConfig.multipliers` (0: not clock-bound, or no kernel); ``kernel_s`` the kernel's
    isolated time (where it has one) and ``isolated_s`` the op's; ``inputs``: each op's solver terms
    as a tuple, shared by the ops of one kind (``index`` into it)."""

    kind_solver: np.ndarray
    saturations: tuple[float, ...]
    tensor: np.ndarray
    rate_cls: np.ndarray
    kernel_s: np.ndarray
    isolated_s: np.ndarray
    inputs: list[SolverInputs]
    index: np.ndarray

    @staticmethod
    def of(workload: Workload, gpu: GpuSpec, model: PowerModel) -> OpTerms:
        ops = workload.ops
        # Ops of one kind, kernel demand, flow demand and precision share all of it: the ops of a
        # repeated layer share their demands (the workload keeps them alive, so ids are not reused),
        # and a collective repeated with its layer has a flow of its own per repeat, alike but for its
        # name, so flows are told apart by their other fields. (A delay's time is its own: every
        # delay shares terms that do not depend on it.)
        kinds: dict[tuple[str, int, object, object], int] = {}
        first: list[Op] = []
        at: list[int] = []  # each op's kind, in a list: an array's item assignment costs 5x
        gaps: list[int] = []  # the host gaps, whose isolated time is each one's own
        for i, op in enumerate(ops):
            kind = op.kind
            key = (kind, id(op.kernel), _flow_key(op.flow), op.info.get("precision"))
            j = kinds.get(key)
            if j is None:
                j = kinds[key] = len(first)
                first.append(op)
            at.append(j)
            if kind == "delay":
                gaps.append(i)
        # Narrow integers: at 3 million ops each byte an op is 3 MB, held through the prediction.
        index = np.array(at, dtype=np.int32)
        # An op's isolated time follows from its kind's key (its kernel's, or its flow's terms), but
        # a host gap's: from the first of each kind, the gaps' own.
        isolated_s = np.array([op.isolated_s for op in first], dtype=float)[index]
        isolated_s[gaps] = [ops[i].delay_s for i in gaps]
        acts = [isolated_activity(op, gpu, model) for op in first]
        inputs = [_solver_inputs(op, a, model) for op, a in zip(first, acts, strict=True)]
        sats = tuple(sorted({x for v in inputs for _, x in v[4]}))
        solver = np.array([[*v[:4], *(dict((s, b) for b, s in v[4]).get(s, 0.0) for s in sats)] for v in inputs],
                          dtype=float).reshape(len(inputs), 4 + len(sats))
        rate = [rate_class(op, model, op_power_class(op, model)[0]) if op.kernel is not None else 0 for op in first]
        kernel_s = [op.kernel.isolated_s if op.kernel is not None else math.nan for op in first]
        return OpTerms(kind_solver=solver, saturations=sats,
                       tensor=np.array([a.cls == TENSOR for a in acts], dtype=bool)[index],
                       rate_cls=np.array(rate, dtype=np.int16)[index],
                       kernel_s=np.array(kernel_s, dtype=float)[index],
                       isolated_s=isolated_s,
                       inputs=inputs, index=index)

    def solver(self, rows: np.ndarray | slice) -> np.ndarray:
        """The clock solver's terms of the ops ``rows``, one row each (:attr:`kind_solver`)."""
        out: np.ndarray = self.kind_solver[self.index[rows]]
        return out

    def hbm_at(self, rows: np.ndarray, c: np.ndarray) -> np.ndarray:
        """The HBM bytes/s of the ops ``rows`` at clock fractions ``c``: the traffic that does not
        follow the clock, that which does, and that which does up to its saturation clock."""
        # Column by column from the kinds' terms: no (ops, terms) array, at the counters' peak.
        kinds, per_kind = self.index[rows], self.kind_solver
        out: np.ndarray = per_kind[kinds, 1] + per_kind[kinds, 2] * c
        for j, sat in enumerate(self.saturations):
            out = out + per_kind[kinds, 4 + j] * np.minimum(c, sat) / sat
        return out


def dynamic_scale(model: PowerModel, c: np.ndarray) -> np.ndarray:
    """:meth:`PowerModel.dynamic_scale` of every clock fraction in ``c``."""
    v = voltage_fractions(c, model.knee_clock_fraction, model.knee_voltage_fraction)
    out: np.ndarray = c * v * v
    return out


def _multipliers(cfg: PowerConfig, c: np.ndarray) -> np.ndarray:
    """:meth:`PowerConfig.multipliers` of every clock fraction in ``c``, one row each."""
    m = cfg.model
    ref = m.tensor_reference_clock_fraction
    cols = [np.ones_like(c), c, *(np.minimum(c, x) / min(ref, x) for x in m.tensor_saturations),
            *(1.0 / ((1.0 - share) + share / c) for share in m.memory_clock_shares)]
    return np.column_stack(cols)


def _stretched(cfg: PowerConfig, clocks: np.ndarray, terms: OpTerms) -> list[float]:
    """Each op's time with every clock-bound kernel's time (and the part of a memory-bound
    kernel's that follows the clock) stretched or shrunk by its op's clock (``clocks``, per op)."""
    out = terms.isolated_s.copy()
    bound = np.flatnonzero(terms.rate_cls != 0)
    if bound.size:
        mult = _multipliers(cfg, clocks[bound])
        out[bound] = terms.kernel_s[bound] / mult[np.arange(bound.size), terms.rate_cls[bound]]
    result: list[float] = out.tolist()
    return result


# The most control ticks the analytic loop takes over one repeat of a workload (5,000 s at 5 ms).
_MAX_TICKS = 1_000_000
# Passes of the analytic fidelity's power-limit loop (clocks, then the timeline they give), at most;
# it stops sooner once a pass moves the iteration's span by at most _SETTLED of it.
_ANALYTIC_LOOP_PASSES = 8
_SETTLED = 1e-4
# Once the span turns back (it rose, then fell, or the other way), each op's clock moves only
# this share of the way to the one its pass's timeline gives: taken whole, the clocks of a long,
# power-bound iteration can flip between two states pass after pass (MLPerf's GPT-3 on 512 H100:
# its span alternating 12.29, 11.10, 12.21 s), and which one the last pass kept decided the
# prediction by 6%. While the span moves one way the clocks are taken whole, which settles sooner.
_DAMPING = 0.5


def _periodic_integral(t: np.ndarray, times: np.ndarray, cum: np.ndarray, span: float,
                       idle_before: bool = False) -> np.ndarray:
    """The integral from 0 to each of ``t`` (negative: back into earlier repeats, or into idleness
    with ``idle_before``) of terms whose integral over one repeat of length ``span`` is ``cum`` at
    ``times``."""
    if idle_before:
        t = np.maximum(t, 0.0)
    q = np.floor(t / span)
    rest = t - q * span
    inside = np.column_stack([np.interp(rest, times, cum[:, j]) for j in range(cum.shape[1])])
    out: np.ndarray = q[:, None] * cum[-1] + inside
    return out


def _integrals(x: np.ndarray, start: np.ndarray, end: np.ndarray, span: float) -> tuple[np.ndarray, np.ndarray]:
    """Ops' terms ``x`` (a row per op, running from ``start`` to ``end``) summed as steps over one
    repeat of length ``span``: the steps' times, and each term's integral from 0 to each of them."""
    times = np.concatenate([start, end, [0.0, span]])
    steps = np.concatenate([x, -x, np.zeros((2, x.shape[1]))])
    order = np.argsort(times, kind="stable")
    times, rate = times[order], np.cumsum(steps[order], axis=0)
    cum = np.vstack([np.zeros(x.shape[1]), np.cumsum(rate[:-1] * np.diff(times)[:, None], axis=0)])
    return times, cum


def _ranks_rows(workload: Workload) -> dict[int, np.ndarray]:
    """The ops a timeline has rows for (host gaps have none), by rank in program order."""
    by_rank: dict[int, list[int]] = {}
    for i, op in enumerate(workload.ops):
        if op.kind != "delay":
            by_rank.setdefault(op.rank, []).append(i)
    return {r: np.array(rows, dtype=np.int64) for r, rows in sorted(by_rank.items())}


def _windowed_clocks(workload: Workload, terms: OpTerms, cfg: PowerConfig, plan: Plan,
                     top_times: PlanTimes | None = None) -> tuple[np.ndarray, list[PlanTimes]]:
    """Each op's clock under the windowed power-limit loop, the workload repeated back to back (or,
    with the settings' ``start`` "idle", after idleness): the loop sets each rank's clock every
    control period from the rank's activity over the window before (wrapping round to the previous
    repeat), and an op takes the average clock over its span. The timeline depends on the clocks,
    so the two are iterated from the top clock. Also a list holding the plan's times at the clocks
    returned where the loop settled (empty where it stopped at its most passes: a list, for
    :meth:`Plan.timeline` to take them out of); ``top_times``: the plan's times at the top clock,
    where the caller has them (the first pass's)."""
    clocks = np.full(len(workload.ops), cfg.max_clock_fraction)
    by_rank = _ranks_rows(workload)
    every = np.concatenate(list(by_rank.values())) if by_rank else np.zeros(0, dtype=np.int64)
    span, step, share = math.nan, 0.0, 1.0
    turned, n_turned = np.zeros(0), 0  # the clocks the passes gave since the span first turned back, summed
    for i in range(_ANALYTIC_LOOP_PASSES):
        at = top_times if i == 0 and top_times is not None else plan.times(_stretched(cfg, clocks, terms))
        was, span = span, max(at[2]) if at[2] else 0.0
        if i > 0:
            if abs(span - was) <= _SETTLED * span:
                return clocks, [at]
            if (span - was) * step < 0:
                share = _DAMPING
            step = span - was
        new = _pass_clocks(at, clocks, by_rank, every, terms, cfg)
        if np.all(np.abs(new[every] - clocks[every]) <= 1e-12):
            return clocks, [at]
        if share < 1.0:
            turned, n_turned = (turned + new if n_turned else new.copy()), n_turned + 1
        clocks = clocks + share * (new - clocks)
        del at  # before the next pass makes its times: two passes' lists are 160 bytes an op
    # Not settled: the clocks' quantized steps keep the passes wandering about the point where the
    # timeline and its clocks agree; their mean since the span first turned back stands for it.
    return (turned / n_turned if n_turned else clocks), []


def _pass_clocks(at: PlanTimes, clocks: np.ndarray, by_rank: dict[int, np.ndarray], every: np.ndarray,
                 terms: OpTerms, cfg: PowerConfig) -> np.ndarray:
    """Each op's clock the windowed loop sets from one pass's times ``at`` (:func:`_windowed_clocks`):
    ``clocks``, the pass's own, kept for the ops on no rank's rows; ``by_rank``, each rank's rows,
    and ``every``, all of them."""
    m = cfg.model
    period, window = m.control_period_s, m.control_window_s
    idle = cfg.settings.start == "idle"
    start_all, end_all = np.array(at[1], dtype=float), np.array(at[2], dtype=float)
    span = float(end_all[every].max()) if every.size else 0.0
    new = clocks.copy()
    if span <= 0:
        new[every] = cfg.max_clock_fraction
        return new
    # A repeat of more control periods than _MAX_TICKS (a GEMM of hours) sets its clocks at
    # coarser ticks, each still from the window's average before it.
    tick = max(period, span / _MAX_TICKS)
    ticks = np.arange(0.0, span + tick, tick)
    # The ranks' window averages are solved together, a batch at a time: one call a rank cost
    # 0.3 ms, most of a pass at thousands of ranks (10 of 17 s at 8,192). Each clock is its own
    # row's, so a batch changes none.
    batch: list[np.ndarray] = []
    averages: list[np.ndarray] = []
    for rows in by_rank.values():
        times, cum = _integrals(terms.solver(rows), start_all[rows], end_all[rows], span)
        averages.append((_periodic_integral(ticks, times, cum, span, idle)
                         - _periodic_integral(ticks - window, times, cum, span, idle)) / window)
        batch.append(rows)
        if len(batch) * len(ticks) >= _SOLVED_TOGETHER:
            _set_clocks(new, batch, averages, start_all, end_all, ticks, tick, cfg, terms)
            batch, averages = [], []
    if batch:
        _set_clocks(new, batch, averages, start_all, end_all, ticks, tick, cfg, terms)
    return new


# Window averages (a row per rank and control tick) solved in one call, at most: 12 MB at 6 terms.
_SOLVED_TOGETHER = 1 << 18
# A rank of fewer ops has its ops' average clocks read with other such ranks' (rank_clocks), one
# of more with np.interp, which is the faster per op: 26 against 44 ms at 2,048 ranks of 97 ops,
# 23 against 15 ms at 512 ranks of 390.
_FEW_OPS = 128


def _set_clocks(new: np.ndarray, batch: list[np.ndarray], averages: list[np.ndarray], start_all: np.ndarray,
                end_all: np.ndarray, ticks: np.ndarray, tick: float, cfg: PowerConfig, terms: OpTerms) -> None:
    """Into ``new``, the average clock over its span of each op of the ranks ``batch`` (each
    rank's rows; the ops' starts and ends in ``start_all`` and ``end_all``), from the clocks the
    loop sets at each control tick of ``ticks`` for the window ``averages`` before it (one array
    per rank)."""
    c = cfg.model.solve_clocks(cfg.cap_w, np.concatenate(averages), cfg.max_clock_fraction,
                               list(terms.saturations)).reshape(len(batch), len(ticks))
    edges = np.append(ticks, ticks[-1] + tick)
    few = [k for k, rows in enumerate(batch) if len(rows) < _FEW_OPS]
    if few:
        rows = np.concatenate([batch[k] for k in few])
        rank = np.repeat(np.arange(len(few)), [len(batch[k]) for k in few])
        new[rows] = average_clocks(c[few], tick, edges, rank, start_all[rows], end_all[rows])
    for k, rows in enumerate(batch):
        if len(rows) >= _FEW_OPS:
            new[rows] = one_rank_clocks(c[k], tick, edges, start_all[rows], end_all[rows])


def throttled_durations(workload: Workload, gpu: GpuSpec, cfg: PowerConfig, plan: Plan | None = None,
                        terms: OpTerms | None = None) -> tuple[list[float], np.ndarray]:
    """Each op's time with every clock-bound kernel's time (and the part of a memory-bound
    kernel's that follows the clock) stretched or shrunk by its op's clock, and each op's clock
    fraction (in the workload's order): under a windowed power-limit loop the clock the loop gives
    the repeated workload where the op runs (:func:`_windowed_clocks`), without a window the clock
    the cap gives the op alone. ``plan`` and ``terms``: the workload's analytic plan and
    :class:`OpTerms`, where the caller has them."""
    durations, clocks, _ = _throttled(workload, gpu, cfg, plan, terms)
    return durations, clocks


def throttled_timeline(workload: Workload, gpu: GpuSpec, cfg: PowerConfig, plan: Plan, terms: OpTerms
                       ) -> tuple[Timeline, np.ndarray]:
    """The analytic timeline of ``workload`` with its ops taking :func:`throttled_durations`'
    times, and each op's clock fraction. Where the windowed loop settled, its last pass's times
    are the timeline's: that pass over the ops is not made again."""
    durations, clocks, settled = _throttled(workload, gpu, cfg, plan, terms)
    return analytic_timeline(workload, durations, plan, isolated_s=terms.isolated_s, handed=settled), clocks


def _throttled(workload: Workload, gpu: GpuSpec, cfg: PowerConfig, plan: Plan | None, terms: OpTerms | None
               ) -> tuple[list[float], np.ndarray, list[PlanTimes]]:
    """:func:`throttled_durations`' answer, and a list holding the plan's times at those durations
    where the windowed loop's last pass made them (:func:`_windowed_clocks`), else empty."""
    m = cfg.model
    terms = terms if terms is not None else OpTerms.of(workload, gpu, m)
    settled: list[PlanTimes] = []
    if m.control_window_s > 0:
        clocks, settled = _windowed_clocks(workload, terms, cfg, plan if plan is not None else Plan.of(workload))
    else:
        alone = np.array([m.solve_clock(cfg.cap_w, x[0], x[1], x[2], x[3], cfg.max_clock_fraction,
                                        hbm_saturating=x[4]) for x in terms.inputs], dtype=float)
        clocks = alone[terms.index] if terms.index.size else np.zeros(0)
    return _stretched(cfg, clocks, terms), clocks, settled


def _lowest_clock(workload: Workload, cfg: PowerConfig, terms: OpTerms) -> float:
    """A clock fraction at or below every one the analytic loop sets: the clock the cap gives the
    most any rank can draw at once, each of its streams running its most demanding op (a stream
    runs its ops one at a time, and the board's power grows with every term of the activity)."""
    keys: dict[tuple[int, str], int] = {}
    stream_of = np.fromiter((keys.setdefault((op.rank, op.stream), len(keys)) for op in workload.ops),
                            dtype=np.int64, count=len(workload.ops))
    if not keys:
        return cfg.max_clock_fraction
    peak = np.zeros((len(keys), terms.kind_solver.shape[1]))
    np.maximum.at(peak, stream_of, terms.solver(slice(None)))
    _, rank_of = np.unique(np.array([r for r, _ in keys]), return_inverse=True)
    most = np.zeros((int(rank_of.max()) + 1, peak.shape[1]))
    np.add.at(most, rank_of, peak)
    clocks = cfg.model.solve_clocks(cfg.cap_w, most, cfg.max_clock_fraction, terms.saturations)
    return float(clocks.min())


def _top_times(cfg: PowerConfig, plan: Plan, terms: OpTerms) -> PlanTimes:
    """The plan's times with every op at the top clock: the analytic loop's first pass."""
    return plan.times(_stretched(cfg, np.full(len(terms.isolated_s), cfg.max_clock_fraction), terms))


def _shorter_than(length_s: float, workload: Workload, cfg: PowerConfig, top_times: PlanTimes,
                  terms: OpTerms) -> bool:
    """Whether the analytic loop's run of ``workload`` is certainly shorter than ``length_s``,
    decided cheaply: its length at the top clock (``top_times``, :func:`_top_times`: one pass of
    the plan, where the loop takes several), stretched as far as the slowest rate class slows at a
    clock at or below every one the loop sets. That clock is first the lowest the board's hardware
    slowdown reaches, then, where that does not settle it, :func:`_lowest_clock` (which reads
    every op)."""
    hi = cfg.max_clock_fraction
    span = max(top_times[2], default=0.0)
    # The loop sets no clock above the top one (but the minimum under a clock locked below it,
    # where this answer is only cautious).
    if span >= length_s:
        return False

    def stretched_s(floor: float) -> float:
        mult = _multipliers(cfg, np.array([hi, min(hi, floor)]))
        return span * float(np.max(mult[0] / mult[1]))

    return (stretched_s(cfg.model.min_clock_fraction * HW_SLOWDOWN_FLOOR) < length_s
            or stretched_s(_lowest_clock(workload, cfg, terms)) < length_s)


# Workloads at least this many control windows long (by the analytic fidelity) start the engine
# from the window the analytic loop leaves (steady_window) rather than from warm-up runs.
STEADY_WINDOWS = 10


def steady_window(workload: Workload, gpu: GpuSpec, cfg: PowerConfig,
                  min_windows: float = STEADY_WINDOWS) -> dict[int, tuple[Period, ...]] | None:
    """The window each rank brings into ``workload`` in a loop of iterations, from the analytic
    fidelity's windowed loop on the workload repeated (:func:`_windowed_clocks`): the rank's
    activity over the last control window of the repeat, one period per control period, in the
    engine's form (:class:`ClockWindow`). None where the loop has no window, is off, or the
    workload's analytic length is under ``min_windows`` windows: there the start weighs on the
    whole run, and the engine's own warm-up runs find it (docs/power.md, "Steady state"). The
    analytic fidelity shares nothing, so where contention moves the iteration's end this window
    can be off: the caller checks it against the one the run leaves
    (:func:`ovsim.engine.power_loop.same_start`)."""
    m = cfg.model
    period, window = m.control_period_s, m.control_window_s
    if not cfg.managed or window <= 0:
        return None
    plan = Plan.of(workload)
    terms = OpTerms.of(workload, gpu, m)
    top = _top_times(cfg, plan, terms)
    if _shorter_than(min_windows * window, workload, cfg, top, terms):
        return None
    # The loop's first pass is the one just made, and where it settles, its last pass gives the
    # times at its clocks.
    clocks, settled = _windowed_clocks(workload, terms, cfg, plan, top_times=top)
    at = settled[0] if settled else plan.times(_stretched(cfg, clocks, terms))
    _, start_list, end_list, _, _ = at
    start_all, end_all = np.array(start_list, dtype=float), np.array(end_list, dtype=float)
    by_rank = _ranks_rows(workload)
    # The engine's run, and so the window it leaves, ends with its last op, a host gap included.
    span = float(end_all.max()) if end_all.size else 0.0
    if span < min_windows * window:
        return None
    n = math.ceil(window / period - 1e-9)
    edges = span - period * np.arange(n, -1, -1)
    out: dict[int, tuple[Period, ...]] = {}
    for r, rows in by_rank.items():
        times, cum = _integrals(terms.solver(rows), start_all[rows], end_all[rows], span)
        per = np.diff(_periodic_integral(edges, times, cum, span), axis=0)
        out[r] = tuple((period, float(x[0]), float(x[1]), float(x[2]), float(x[3]),
                        tuple((sat, float(b)) for sat, b in zip(terms.saturations, x[4:], strict=True) if b > 0))
                       for x in per)
    return out
