"""Power in both fidelities, and energy from a timeline.

The engine (:mod:`ovsim.engine.sim`) computes every GPU's activity from its current rates at each
event and turns it into power with :class:`~ovsim.hw.power.PowerModel`. Under a power cap or a
locked clock the board's power-limit loop sets the SM clock: every control period, the highest
clock at which the activity averaged over the last window fits the cap (:class:`ClockWindow`,
:func:`window_clock`). It records two piecewise-constant counters per rank, ``power_w`` and
``sm_clock_hz``; :func:`power_table` integrates them, which is exact because rates (and so power)
are constant between events.

The analytic fidelity's power is in :mod:`ovsim.engine.power_analytic`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ovsim.engine.timeline import Timeline
from ovsim.errors import OvsimError
from ovsim.hw.power import TENSOR, PowerModel, PowerSettings
from ovsim.models.ir import Op

if TYPE_CHECKING:
    import pandas as pd

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
    """The index of a tensor op's rate in :meth:`PowerConfig.multipliers`: its kernel's own
    saturation clock where it has one (registered by :meth:`PowerModel.with_kernel_saturations`),
    else its precision's."""
    own = op.kernel.saturation_clock_fraction if op.kernel is not None else None
    if own is not None:
        if own not in model.kernel_saturations:
            raise OvsimError(f"op {op.id}: its kernel's saturation clock has no rate class: build the power "
                             f"model with PowerModel.with_kernel_saturations", field="power")
        return 2 + model.tensor_saturations.index(own)
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


def power_table(timeline: Timeline, ranks: Iterable[int], idle_w: float, compute_clock_hz: float, *,
                start_s: float = 0.0, end_s: float | None = None, window_s: float = 0.0) -> pd.DataFrame:
    """:func:`power_rows` as a frame (POWER_COLUMNS, and ``peak_window_power_w`` with ``window_s``)."""
    import pandas as pd

    rows = power_rows(timeline, ranks, idle_w, compute_clock_hz, start_s=start_s, end_s=end_s, window_s=window_s)
    return pd.DataFrame(rows, columns=POWER_COLUMNS + (["peak_window_power_w"] if window_s > 0 else []))


def power_rows(timeline: Timeline, ranks: Iterable[int], idle_w: float, compute_clock_hz: float, *,
               start_s: float = 0.0, end_s: float | None = None, window_s: float = 0.0) -> list[dict[str, Any]]:
    """Per rank of ``ranks``: average and peak power, energy and the clock over [start_s, end_s]
    (default: the whole timeline), from the ``power_w`` and ``sm_clock_hz`` counters. Energy is the exact
    integral of the piecewise-constant power; a rank without samples is idle.

    With ``window_s`` > 0 a ``peak_window_power_w`` column gives the highest power averaged over
    any window of that length, as a sensor that reports averages sees the peak (NVML's power
    readings average over about 100 ms to 1 s); a window longer than the span gives the average."""
    end = timeline.makespan_s if end_s is None else end_s
    rows: list[dict[str, Any]] = []
    span = max(end - start_s, 0.0)
    # Each rank's samples in their order in the table (a stable sort): of samples at one instant
    # the last one holds.
    rank = timeline.counter_column("rank").astype(np.int64)
    t, v = timeline.counter_column("time_s").astype(float), timeline.counter_column("value").astype(float)
    counter = timeline.counter_column("counter")
    is_power, is_clock = counter == POWER_COUNTER, counter == CLOCK_COUNTER
    order = np.argsort(rank, kind="stable")
    sorted_rank = rank[order]
    for r in ranks:
        mine = order[np.searchsorted(sorted_rank, r, side="left"):np.searchsorted(sorted_rank, r, side="right")]
        pw, ck = mine[is_power[mine]], mine[is_clock[mine]]
        pv, pd_ = _segments(t[pw], v[pw], start_s, end, idle_w)
        cv, cd = _segments(t[ck], v[ck], start_s, end, compute_clock_hz)
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
    return rows


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
