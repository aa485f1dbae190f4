"""Power in both fidelities, and energy from a timeline.

The engine (:mod:`ovsim.engine.sim`) computes every GPU's activity from its current rates at each
event and turns it into power with :class:`~ovsim.hw.power.PowerModel`. Under a power cap or a
locked clock the board's power-limit loop sets the SM clock: every control period, the highest
clock at which the activity averaged over the last window fits the cap (:class:`ClockWindow`,
:func:`window_clock`). It records two piecewise-constant counters per rank, ``power_w`` and
``sm_clock_hz``; :func:`power_table` integrates them, which is exact because rates (and so power)
are constant between events.

The analytic fidelity has no shared resources, so the power of ops that run at the same time is
the sum of their isolated activities (:func:`analytic_power`). Under a windowed loop it runs the
same loop on that activity, the workload repeated (:func:`throttled_durations`); with no window
each op runs at the clock the cap gives it alone.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ovsim.engine.analytic import Plan
from ovsim.engine.timeline import Timeline, timeline_from_rows
from ovsim.hw.power import MEMORY, TENSOR, PowerModel, PowerSettings
from ovsim.hw.spec import GpuSpec
from ovsim.models.cost import blocks_per_sm
from ovsim.models.ir import Op, Workload

POWER_COUNTER = "power_w"
CLOCK_COUNTER = "sm_clock_hz"
POWER_COLUMNS = ["rank", "avg_power_w", "peak_power_w", "energy_j", "avg_sm_clock_hz", "min_sm_clock_hz"]


@dataclass(frozen=True)
class PowerConfig:
    """The power model of the machine's GPUs and what the user set."""

    model: PowerModel
    settings: PowerSettings = field(default_factory=PowerSettings)

    @property
    def managed(self) -> bool:
        """Whether the engine runs the firmware's clock loop (at the default limit without a cap).
        Unmanaged, every kernel runs at the rate it was calibrated at and power is only reported."""
        return self.settings.managed

    @property
    def cap_w(self) -> float:
        # A locked clock does not lift the board limit: without a cap the default limit (TDP) holds.
        return self.settings.cap_w if self.settings.cap_w is not None else self.model.tdp_w

    @property
    def max_clock_fraction(self) -> float:
        m = self.model
        hi = m.max_clock_fraction
        if self.settings.sm_clock_hz is not None:
            hi = min(hi, self.settings.sm_clock_hz / m.compute_clock_hz)
        return hi

    def multipliers(self, c: float) -> tuple[float, ...]:
        """Rate multipliers at clock fraction c: not clock-bound, CUDA-core, tensor work of each
        saturation clock (``PowerModel.tensor_saturations``; :func:`tensor_clock_class`), then
        memory-bound work of each clock share (``PowerModel.memory_clock_shares``;
        :func:`memory_clock_class`)."""
        m = self.model
        return (1.0, c, *(m.tensor_rate(c, x) for x in m.tensor_saturations),
                *(m.memory_rate(c, x) for x in m.memory_clock_shares))


def op_power_class(op: Op, model: PowerModel) -> tuple[str, float]:
    """An op's SM power class and its full-GPU dynamic weight (NCCL kernels are copy loops)."""
    k = op.kernel
    assert k is not None
    precision = op.info.get("precision")
    prec = precision if isinstance(precision, str) else None
    return model.sm_weight_w(op.kind, prec, k.clock_sensitive and op.flow is None)


def tensor_clock_class(op: Op, model: PowerModel) -> int:
    """The index of a tensor op's rate in :meth:`PowerConfig.multipliers`."""
    precision = op.info.get("precision")
    return 2 + model.tensor_saturations.index(model.tensor_saturation(precision if isinstance(precision, str)
                                                                       else None))


def rate_class(op: Op, model: PowerModel, power_cls: str) -> int:
    """The index of a kernel's rate in :meth:`PowerConfig.multipliers`, given its SM power class
    (:func:`op_power_class`): 0 for a collective's kernel, a CUDA-core or tensor class for
    clock-bound work, else its memory-bound kind's class."""
    k = op.kernel
    assert k is not None
    if op.flow is not None:
        return 0
    if k.clock_sensitive:
        return tensor_clock_class(op, model) if power_cls == TENSOR else 1
    return memory_clock_class(op, model)


def memory_clock_class(op: Op, model: PowerModel) -> int:
    """The index of a memory-bound op's rate in :meth:`PowerConfig.multipliers`: 0 (not
    clock-bound) unless part of its kind's time follows the clock."""
    share = model.memory_clock_share.get(op.kind, 0.0)
    if share <= 0:
        return 0
    return 2 + len(model.tensor_saturations) + model.memory_clock_shares.index(share)


# -- energy from counters ---------------------------------------------------------------------------


def _segments(times: np.ndarray, values: np.ndarray, start_s: float, end_s: float,
              before: float) -> tuple[np.ndarray, np.ndarray]:
    """Piecewise-constant samples clipped to [start_s, end_s]: (value, duration) of each
    positive-length piece. Of samples at one instant the last one holds; ``before`` holds until
    the first sample."""
    t = np.concatenate(([start_s], times))
    v = np.concatenate(([before], values))
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    nxt = np.concatenate((t[1:], [max(end_s, t[-1])]))
    lo = np.clip(t, start_s, end_s)
    hi = np.clip(nxt, start_s, end_s)
    dur = hi - lo
    keep = dur > 0
    return v[keep], dur[keep]


def _window_peak(values: np.ndarray, durations: np.ndarray, window_s: float) -> float:
    """The highest mean over any ``window_s`` inside consecutive pieces. The mean of a window
    sliding over piecewise-constant power is piecewise linear in its start, so its maximum has a
    window edge on a piece boundary."""
    total = float(durations.sum())
    if window_s >= total or len(values) == 0:
        return float(np.dot(values, durations) / total) if total > 0 else 0.0
    edges = np.concatenate(([0.0], np.cumsum(durations)))
    energy = np.concatenate(([0.0], np.cumsum(values * durations)))

    def integral(x: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(values) - 1)
        return np.asarray(energy[i] + values[i] * (x - edges[i]))

    starts = np.clip(np.concatenate((edges, edges - window_s)), 0.0, total - window_s)
    return float(((integral(starts + window_s) - integral(starts)) / window_s).max())


def power_table(timeline: Timeline, n_ranks: int, idle_w: float, compute_clock_hz: float, *,
                start_s: float = 0.0, end_s: float | None = None, window_s: float = 0.0) -> pd.DataFrame:
    """Per rank: average and peak power, energy and the clock over [start_s, end_s] (default: the
    whole timeline), from the ``power_w`` and ``sm_clock_hz`` counters. Energy is the exact
    integral of the piecewise-constant power; a rank without samples is idle.

    With ``window_s`` > 0 a ``peak_window_power_w`` column gives the highest power averaged over
    any window of that length, as a sensor that reports averages sees the peak (NVML's power
    readings average over about 100 ms to 1 s); a window longer than the span gives the average."""
    end = timeline.makespan_s if end_s is None else end_s
    c = timeline.counters
    rows: list[dict[str, Any]] = []
    span = max(end - start_s, 0.0)
    for r in range(n_ranks):
        mine = c[c["rank"] == r] if len(c) else c
        pw = mine[mine["counter"] == POWER_COUNTER] if len(mine) else mine
        ck = mine[mine["counter"] == CLOCK_COUNTER] if len(mine) else mine
        pv, pd_ = _segments(pw["time_s"].to_numpy(float), pw["value"].to_numpy(float), start_s, end, idle_w)
        cv, cd = _segments(ck["time_s"].to_numpy(float), ck["value"].to_numpy(float), start_s, end,
                           compute_clock_hz)
        energy = float(np.dot(pv, pd_))
        extra = {"peak_window_power_w": _window_peak(pv, pd_, window_s)} if window_s > 0 else {}
        rows.append({
            "rank": r,
            "avg_power_w": energy / span if span > 0 else (float(pv[0]) if len(pv) else idle_w),
            "peak_power_w": float(pv.max()) if len(pv) else idle_w,
            "energy_j": energy,
            "avg_sm_clock_hz": float(np.dot(cv, cd) / span) if span > 0 and len(cv) else compute_clock_hz,
            "min_sm_clock_hz": float(cv.min()) if len(cv) else compute_clock_hz,
            **extra,
        })
    return pd.DataFrame(rows, columns=POWER_COLUMNS + (["peak_window_power_w"] if window_s > 0 else []))


# -- the board's power-limit loop -------------------------------------------------------------------

# What the clock solver needs of a GPU's activity (PowerModel.solve_clock's arguments): SM dynamic
# watts at c = 1, HBM bytes/s that do not follow the clock, HBM bytes/s at c = 1 of work that does,
# link bytes/s, and per saturation clock fraction the HBM bytes/s of tensor work at that clock.
SolverInputs = tuple[float, float, float, float, tuple[tuple[float, float], ...]]
# One control period of a GPU: its length, then each SolverInputs term integrated over it (watt-
# seconds and bytes; the saturating traffic as (saturation clock fraction, bytes)).
Period = tuple[float, float, float, float, float, tuple[tuple[float, float], ...]]


class ClockWindow:
    """The power-limit loop's view of one GPU: the activity integrated over the control period under
    way, and the last periods, at least ``window_s`` of them.

    A board holds its power limit on power averaged over tens of milliseconds: measured on an H100,
    a GEMM and a streaming add alternating every 5 ms ran at one clock, and from an idle start the
    clock held for tens of milliseconds before it fell (docs/power.md). So the engine sets the
    clock once a control period, to the highest clock at which the window's average activity
    fits the limit."""

    __slots__ = ("acc", "acc_s", "act", "act_t", "changed_t", "own", "own_sat", "own_total", "periods", "sat",
                 "window_s")

    def __init__(self, window_s: float, history: Iterable[Period] = ()) -> None:
        self.window_s = window_s
        self.periods: deque[Period] = deque(history)
        self._trim()
        self.acc = [0.0, 0.0, 0.0, 0.0]
        self.sat: dict[float, float] = {}
        self.acc_s = 0.0
        self.act: SolverInputs = (0.0, 0.0, 0.0, 0.0, ())
        self.act_t = 0.0
        # When the activity last changed (-inf: never), so the engine can tell a steady window.
        self.changed_t = -math.inf
        # This run's periods: the last window of them, and the totals of all (what repeated() needs,
        # in memory that does not grow with the run).
        self.own: deque[Period] = deque()
        self.own_total: list[float] = [0.0, 0.0, 0.0, 0.0, 0.0]
        self.own_sat: dict[float, float] = {}

    def record(self, t: float, act: SolverInputs) -> None:
        """The activity changed to ``act`` at time ``t``."""
        self.advance(t)
        if act != self.act:
            self.changed_t = t
        self.act = act

    def steady_since(self, t: float) -> bool:
        """Whether the activity has not changed since ``t``."""
        return self.changed_t <= t

    def advance(self, t: float) -> None:
        dt = t - self.act_t
        if dt > 0:
            a, acc = self.act, self.acc
            acc[0] += a[0] * dt
            acc[1] += a[1] * dt
            acc[2] += a[2] * dt
            acc[3] += a[3] * dt
            for b, sat in a[4]:
                self.sat[sat] = self.sat.get(sat, 0.0) + b * dt
            self.acc_s += dt
            self.act_t = t

    def close(self, t: float) -> None:
        """End the control period under way at ``t``."""
        self.advance(t)
        if self.acc_s > 0:
            a = self.acc
            period = (self.acc_s, a[0], a[1], a[2], a[3], tuple(self.sat.items()))
            self.periods.append(period)
            self._keep_own(period)
        self.acc = [0.0, 0.0, 0.0, 0.0]
        self.sat = {}
        self.acc_s = 0.0
        self._trim()

    def _trim(self) -> None:
        _trim_window(self.periods, self.window_s)

    def average(self) -> SolverInputs | None:
        """The closed periods' activity averaged over the last ``window_s`` (the oldest period in
        part), or over all of them when they cover less; None before any time has passed."""
        total = sum(p[0] for p in self.periods)
        if total <= 0:
            return None
        # The oldest period counts only for the part of it inside the window.
        over = max(0.0, total - self.window_s)
        span = total - over
        sums = [0.0, 0.0, 0.0, 0.0]
        sat: dict[float, float] = {}
        for i, p in enumerate(self.periods):
            w = (p[0] - over) / p[0] if i == 0 and over > 0 else 1.0
            sums[0] += p[1] * w
            sums[1] += p[2] * w
            sums[2] += p[3] * w
            sums[3] += p[4] * w
            for x, b in p[5]:
                sat[x] = sat.get(x, 0.0) + b * w
        return (sums[0] / span, sums[1] / span, sums[2] / span, sums[3] / span,
                tuple((b / span, x) for x, b in sat.items()))

    def _keep_own(self, period: Period) -> None:
        self.own.append(period)
        _trim_window(self.own, self.window_s)
        length, sm, fixed, per_c, link, saturating = period
        for i, x in enumerate((length, sm, fixed, per_c, link)):
            self.own_total[i] += x
        for x, b in saturating:
            self.own_sat[x] = self.own_sat.get(x, 0.0) + b

    def repeated(self) -> tuple[Period, ...]:
        """The window this run would leave were it run again and again: its last ``window_s`` of
        periods, or, where the whole run is shorter, the run's totals stretched over the window
        (as many repeats as the window holds; the average is the run's)."""
        total = self.own_total[0]
        if total <= 0:
            return ()
        if total >= self.window_s:
            return tuple(self.own)
        k = self.window_s / total
        sm, fixed, per_c, link = (k * x for x in self.own_total[1:])
        sat = tuple((x, b * k) for x, b in self.own_sat.items())
        return ((self.window_s, sm, fixed, per_c, link, sat),)


def _trim_window(periods: deque[Period], window_s: float) -> None:
    """Drop the oldest periods while the rest still cover ``window_s``."""
    total = sum(p[0] for p in periods)
    while periods and total - periods[0][0] >= window_s:
        total -= periods.popleft()[0]


def window_clock(model: PowerModel, cap_w: float, hi: float, window: ClockWindow) -> float:
    """The clock the loop sets: the highest on the grid at which the window's average activity fits
    ``cap_w`` (``hi`` while the window is empty)."""
    a = window.average()
    if a is None:
        return hi
    return model.solve_clock(cap_w, a[0], a[1], a[2], a[3], hi, hbm_saturating=a[4])


# -- the analytic fidelity --------------------------------------------------------------------------


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


# Isolated activities by (op kind, id of its kernel demand, id of its flow demand, precision).
_ActivityCache = dict[tuple[str, int, int, object], _OpPower]


def _activity_of(op: Op, gpu: GpuSpec, model: PowerModel, cache: _ActivityCache) -> _OpPower:
    """:func:`isolated_activity`, once per kind, kernel, flow and precision: the ops of a repeated
    layer share their demands (the workload keeps them alive, so their ids are not reused)."""
    key = (op.kind, id(op.kernel), id(op.flow), op.info.get("precision"))
    a = cache.get(key)
    if a is None:
        a = cache[key] = isolated_activity(op, gpu, model)
    return a


def _solver_inputs(op: Op, gpu: GpuSpec, model: PowerModel,
                   cache: _ActivityCache) -> SolverInputs:
    """An op's isolated activity as the clock solver takes it (PowerModel.solve_clock's terms)."""
    a = _activity_of(op, gpu, model, cache)
    follow = a.hbm_bytes_per_s if a.cls in (TENSOR, "fp32") else 0.0
    ref = model.tensor_reference_clock_fraction if a.cls == TENSOR else 1.0
    saturation = model.tensor_saturations[tensor_clock_class(op, model) - 2] if a.cls == TENSOR else math.inf
    if math.isfinite(saturation):
        # Its traffic at the saturation clock, from the calibrated traffic at the reference clock.
        at_sat = follow * saturation / min(ref, saturation)
        return (a.sm_w, a.hbm_bytes_per_s - follow, 0.0, a.link_bytes_per_s, ((at_sat, saturation),))
    return (a.sm_w, a.hbm_bytes_per_s - follow, follow / ref, a.link_bytes_per_s, ())


def _stretched(workload: Workload, cfg: PowerConfig, clocks: dict[str, float], classes: dict[str, int]) -> list[float]:
    """Each op's time with every clock-bound kernel's time (and the part of a memory-bound
    kernel's that follows the clock) stretched or shrunk by its op's clock; ``classes``: each
    kernel's :func:`rate_class`."""
    out: list[float] = []
    mults: dict[float, tuple[float, ...]] = {}  # ops share a few clocks: each multiplier set once
    for op in workload.ops:
        k = op.kernel
        cls = classes.get(op.id, 0)
        if k is None or cls == 0 or op.flow is not None:
            out.append(op.isolated_s)
            continue
        c = clocks[op.id]
        mult = mults.get(c)
        if mult is None:
            mult = mults[c] = cfg.multipliers(c)
        out.append(k.isolated_s / mult[cls])
    return out


# Passes of the analytic fidelity's power-limit loop (clocks, then the timeline they give), at most.
_ANALYTIC_LOOP_PASSES = 4


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


def _windowed_clocks(workload: Workload, inputs: dict[str, SolverInputs], cfg: PowerConfig,
                     classes: dict[str, int], plan: Plan) -> dict[str, float]:
    """Each op's clock under the windowed power-limit loop, the workload repeated back to back (or,
    with the settings' ``start`` "idle", after idleness): the loop sets each rank's clock every
    control period from the rank's activity over the window before (wrapping round to the previous
    repeat), and an op takes the average clock over its span. The timeline depends on the clocks,
    so the two are iterated from the top clock."""
    m = cfg.model
    hi, cap = cfg.max_clock_fraction, cfg.cap_w
    period, window = m.control_period_s, m.control_window_s
    sats = sorted({x for v in inputs.values() for _, x in v[4]})
    clocks = dict.fromkeys(inputs, hi)
    # The ops a timeline has rows for (host gaps have none), by rank in program order.
    by_rank: dict[int, list[int]] = {}
    for i, op in enumerate(workload.ops):
        if op.kind != "delay" and op.id in inputs:
            by_rank.setdefault(op.rank, []).append(i)
    ids_of = {r: [workload.ops[i].id for i in rows] for r, rows in by_rank.items()}
    # Each op's solver terms, the saturating traffic by saturation clock.
    terms = {r: np.array([[*inputs[i][:4], *(dict((s, b) for b, s in inputs[i][4]).get(s, 0.0) for s in sats)]
                          for i in ids]) for r, ids in ids_of.items()}
    for _ in range(_ANALYTIC_LOOP_PASSES):
        _, start_all, end_all, _, _ = plan.times(_stretched(workload, cfg, clocks, classes))
        span = max((end_all[i] for rows in by_rank.values() for i in rows), default=0.0)
        new: dict[str, float] = {}
        for r in sorted(by_rank):
            rows = by_rank[r]
            ids = ids_of[r]
            start = np.array([start_all[i] for i in rows], dtype=float)
            end = np.array([end_all[i] for i in rows], dtype=float)
            if span <= 0:
                new.update(dict.fromkeys(ids, hi))
                continue
            # Each solver term's rate as steps at the ops' starts and ends, then its integral.
            x = terms[r]
            times = np.concatenate([start, end, [0.0, span]])
            steps = np.concatenate([x, -x, np.zeros((2, x.shape[1]))])
            order = np.argsort(times, kind="stable")
            times, rate = times[order], np.cumsum(steps[order], axis=0)
            cum = np.vstack([np.zeros(x.shape[1]), np.cumsum(rate[:-1] * np.diff(times)[:, None], axis=0)])

            ticks = np.arange(0.0, span + period, period)
            idle = cfg.settings.start == "idle"
            avg = (_periodic_integral(ticks, times, cum, span, idle)
                   - _periodic_integral(ticks - window, times, cum, span, idle)) / window
            c = m.solve_clocks(cap, avg, hi, sats)
            # The clock's integral over time, then each op's average clock over its span.
            edges = np.append(ticks, ticks[-1] + period)
            c_cum = np.concatenate([[0.0], np.cumsum(c * period)])
            at = np.interp(start, edges, c_cum), np.interp(end, edges, c_cum)
            idx = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, len(c) - 1)
            for i, oid in enumerate(ids):
                d = end[i] - start[i]
                new[oid] = float((at[1][i] - at[0][i]) / d) if d > 0 else float(c[idx[i]])
        if all(abs(new[k] - clocks[k]) <= 1e-12 for k in new):
            break
        clocks = new
    return clocks


def throttled_durations(workload: Workload, gpu: GpuSpec, cfg: PowerConfig,
                        plan: Plan | None = None) -> tuple[list[float], dict[str, float]]:
    """Each op's time with every clock-bound kernel's time (and the part of a memory-bound
    kernel's that follows the clock) stretched or shrunk by its op's clock, and each op's clock
    fraction: under a windowed power-limit loop the clock the loop gives the repeated workload
    where the op runs (:func:`_windowed_clocks`), without a window the clock the cap gives the op
    alone. ``plan``: the workload's analytic plan, where the caller has it already."""
    m = cfg.model
    cache: _ActivityCache = {}
    inputs = {op.id: _solver_inputs(op, gpu, m, cache) for op in workload.ops}
    classes = {op.id: rate_class(op, m, op_power_class(op, m)[0]) for op in workload.ops if op.kernel is not None}
    if m.control_window_s > 0:
        clocks = _windowed_clocks(workload, inputs, cfg, classes, plan if plan is not None else Plan.of(workload))
    else:
        clocks = {oid: m.solve_clock(cfg.cap_w, x[0], x[1], x[2], x[3], cfg.max_clock_fraction, hbm_saturating=x[4])
                  for oid, x in inputs.items()}
    return _stretched(workload, cfg, clocks, classes), clocks


def restore_isolated(timeline: Timeline, workload: Workload) -> Timeline:
    """Report the cost model's isolated times again; the difference is time lost to the clock."""
    iso = pd.Series({op.id: op.isolated_s for op in workload.ops}, dtype=float)
    ops = timeline.ops.copy()
    mine = ops["id"].map(iso)
    known = mine.notna().to_numpy()
    # Lost to a clock below the calibration's, or gained (negative) above it.
    stretched = known & (mine != ops["isolated_s"]).to_numpy()
    ops["clock_s"] = np.where(stretched, ops["duration_s"] - mine, np.where(known, 0.0, ops["clock_s"]))
    ops["isolated_s"] = np.where(known, mine, ops["isolated_s"])
    return timeline_from_rows(ops, timeline.counters)


def _hbm_at(x: SolverInputs, c: float) -> float:
    """An op's HBM bytes/s at clock fraction ``c`` from its clock-solver terms: the traffic that does
    not follow the clock, that which does, and that which does up to its saturation clock."""
    return x[1] + x[2] * c + sum(b * min(c, sat) / sat for b, sat in x[4])


def analytic_power(timeline: Timeline, workload: Workload, gpu: GpuSpec, cfg: PowerConfig,
                   clocks: dict[str, float] | None = None) -> list[tuple[float, int, str, float]]:
    """``power_w`` and ``sm_clock_hz`` counter rows ``(time_s, rank, counter, value)`` for an
    analytic timeline: each rank's power is idle plus the isolated activity of whatever ops run,
    each at its own clock."""
    m = cfg.model
    by_id = {op.id: op for op in workload.ops}
    ops = timeline.ops
    ops = ops[(ops["rank"] >= 0) & ops["id"].isin(by_id)]
    out: list[tuple[float, int, str, float]] = []
    x_t = m.tensor_reference_clock_fraction
    cache: _ActivityCache = {}
    clock_of = clocks or {}
    managed, top = cfg.managed, cfg.max_clock_fraction
    hz = m.compute_clock_hz
    rows_of: dict[Any, Any] = ops.groupby("rank").indices  # rank -> row positions, in order
    ids = ops["id"].astype(str).to_numpy()
    starts, ends = ops["start_s"].to_numpy(float), ops["end_s"].to_numpy(float)
    for r in range(workload.n_ranks):
        events: list[tuple[float, int, float]] = []  # time, op index, +1 start / -1 end
        acts: list[tuple[float, float, float, float]] = []
        for k in rows_of.get(r, ()):
            start, end = starts[k], ends[k]
            if not end > start:
                continue
            op = by_id[ids[k]]
            a = _activity_of(op, gpu, m, cache)
            # Under a policy each op runs at its own solved clock; without one, as calibrated.
            c = clock_of.get(op.id, top) if managed else (x_t if a.cls == TENSOR else 1.0)
            # A compute-bound kernel moves its bytes at its own pace, as the clock solver takes it.
            j = len(acts)
            acts.append((m.dynamic_scale(c) * a.sm_w, _hbm_at(_solver_inputs(op, gpu, m, cache), c),
                         a.link_bytes_per_s, c))
            events.append((start, j, 1.0))
            events.append((end, j, -1.0))
        events.sort()
        # Between ops a windowed loop keeps the clock it last set (the op before's; before the
        # first op, the first op's); without a window an idle GPU boosts to the top clock.
        windowed = managed and m.control_window_s > 0
        idle_clock = (acts[events[0][1]][3] if windowed and events else top) if managed else 1.0
        out.append((0.0, r, POWER_COUNTER, m.idle_power_w(idle_clock)))
        out.append((0.0, r, CLOCK_COUNTER, idle_clock * hz))
        active: dict[int, None] = {}
        i = 0
        n = len(events)
        while i < n:
            t = events[i][0]
            while i < n and events[i][0] == t:
                _, j, sign = events[i]
                if sign > 0:
                    active[j] = None
                else:
                    active.pop(j, None)
                i += 1
            vals = [acts[j] for j in active]
            clock = min((v[3] for v in vals), default=idle_clock)
            if windowed and vals:
                idle_clock = clock
            p = m.board_power_w(0.0, 0.0, sum(v[1] for v in vals), sum(v[2] for v in vals), clock, clock) \
                + sum(v[0] for v in vals)
            out.append((t, r, POWER_COUNTER, p))
            out.append((t, r, CLOCK_COUNTER, clock * hz))
    return out
