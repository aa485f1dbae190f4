"""The engine's power loop: each GPU's clock and board power from its activity at every event.

Every event, each touched GPU's power is computed from its activity (:meth:`PowerLoop.activity`).
Under a power cap or a locked clock, the board's power-limit loop sets the clock: with a control
window (the calibration's), each control period closes the GPU's window of activity and sets the
clock at which the window's average power fits the cap (:meth:`PowerLoop.control`); without one,
the clock is re-solved at every event from that moment's activity (:meth:`PowerLoop.update`).
The physics (power model, windows, clock solver) is in :mod:`ovsim.engine.power`; docs/power.md
explains the loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ovsim.engine.power import CLOCK_COUNTER, POWER_COUNTER, ClockWindow, Period, PowerConfig, window_clock
from ovsim.engine.record import Counters
from ovsim.engine.state import Activity, GpuState


class PowerLoop:
    """Clocks and power of a run's GPUs under one power configuration."""

    def __init__(self, power: PowerConfig, gpus: list[GpuState], counters: Counters, detail: bool) -> None:
        self.power = power
        self.gpus = gpus
        self.counters = counters
        # Record the activity counters (SM fractions, link bytes/s) beside power and clock.
        self.detail = detail
        self.managed = power.managed
        m = power.model
        # The loop averages over a window (set once a control period) or, without one, re-solves
        # the clock at every event.
        self.windowed = self.managed and m.control_window_s > 0
        # Dynamic-power scale of tensor and other work without power management.
        self.s_calibrated = (m.dynamic_scale(m.tensor_reference_clock_fraction), m.dynamic_scale(1.0))
        for gpu in gpus:
            gpu.rate_multipliers = [1.0] * (2 + len(m.tensor_saturations) + len(m.memory_clock_shares))
        # Rate classes of tensor kernels that saturate, and their saturation clock fractions; rate
        # classes of memory-bound kernels, and the share of their time that follows the clock.
        sats = m.tensor_saturations
        self.saturating_cls = {2 + i: x for i, x in enumerate(sats) if math.isfinite(x)}
        self.memory_share_cls = {2 + len(sats) + i: x for i, x in enumerate(m.memory_clock_shares)}
        # Whether the last control period moved any clock (a steady loop may skip periods).
        self.clock_moved = True
        # A warm-up run (Engine._steady_history) only needs the window it leaves: no power counters.
        self.records_power = True
        # The power model's figures that record() reads at every event, read from the model once:
        # the model is Python (ovsim.hw.power), and reading it from compiled code is a generic
        # attribute lookup each time. Dynamic-power scales by clock fraction, which sits on the
        # clock grid.
        self.idle_static_w = m.idle_static_w
        self.idle_clock_w = m.idle_clock_w
        self.hbm_w = m.hbm_w
        self.link_w = m.link_w
        self.hbm_peak_bytes_per_s = m.hbm_peak_bytes_per_s
        self.link_peak_bytes_per_s = m.link_peak_bytes_per_s
        self.compute_clock_hz = m.compute_clock_hz
        self.scales: dict[float, float] = {}

    def idle_history(self) -> dict[int, tuple[Period, ...]]:
        """A window of idleness on every GPU."""
        w = self.power.model.control_window_s
        return {g.rank: ((w, 0.0, 0.0, 0.0, 0.0, ()),) for g in self.gpus} if w > 0 else {}

    def steady_periods(self, now: float, next_event_s: float) -> int:
        """Control periods until the next tick: one, or, where no GPU's activity has changed for a
        window and the last period moved no clock, all those before the next event but one (each
        would close an identical period and set the same clock; the window keeps them as one, of
        the same average). A GEMM of hours under the loop takes a few ticks, not millions."""
        period_s = self.power.model.control_period_s
        if self.clock_moved:
            return 1
        quiet_since = now - self.power.model.control_window_s - 2 * period_s
        if not all(g.clock_window is not None and g.clock_window.steady_since(quiet_since) for g in self.gpus):
            return 1
        if not math.isfinite(next_event_s):
            return 1
        return max(1, math.floor((next_event_s - now) / period_s) - 1)

    def control(self, now: float, touch: Callable[[int], None]) -> None:
        """Close every GPU's control period and set the clock its window gives."""
        pc = self.power
        cap, hi = pc.cap_w, pc.max_clock_fraction
        self.clock_moved = False
        for gpu in self.gpus:
            assert gpu.clock_window is not None
            gpu.clock_window.close(now)
            c = window_clock(pc.model, cap, hi, gpu.clock_window)
            if c != gpu.clock_frac:
                self.clock_moved = True
                touch(gpu.rank)
                self.set_clock(gpu, c)

    def start_clocks(self, history: dict[int, tuple[Period, ...]]) -> None:
        """Each GPU's clock at the start: the one its window of ``history`` gives, or the top clock
        (an idle GPU fits any settable cap)."""
        pc = self.power
        for gpu in self.gpus:
            c0 = pc.max_clock_fraction
            if self.windowed:
                gpu.clock_window = ClockWindow(pc.model.control_window_s, history.get(gpu.rank, ()))
                c0 = window_clock(pc.model, pc.cap_w, c0, gpu.clock_window)
            self.set_clock(gpu, c0)

    def set_clock(self, gpu: GpuState, c: float) -> None:
        gpu.clock_frac = c
        gpu.rate_multipliers = list(self.power.multipliers(c))
        gpu.throttled = any(x != 1.0 for x in gpu.rate_multipliers)

    def activity(self, gpu: GpuState) -> Activity:
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
            n = g.n_sms
            for e in g.entries:
                k = e.kernel
                f = k.flow
                if f is not None:
                    # NCCL's loops work only while data moves, in proportion to its pace.
                    if f.phase == "data" and f.demand.rate_cap_bytes_per_s > 0:
                        x = n * e.per_sm * k.busy_sms_per_block * min(1.0, f.rate / f.demand.rate_cap_bytes_per_s)
                        other += x * k.sm_weight_w
                        xm += x
                    continue
                x = n * e.per_sm * k.busy_sms_per_block * e.share * k.hbm_pace_share / k.hbm_pace_share_alone
                if k.on_tensor_cores:
                    tensor += x * k.sm_weight_w
                    xt += x
                else:
                    other += x * k.sm_weight_w
                    if k.clock_cls and k.clock_cls not in memory_cls:
                        xf += x
                    else:
                        xm += x
                        # The clock-following share of a memory-bound kind is CUDA-core work: its
                        # power is in sm_weight_w, and the fit tables read it as such (PowerModel.sm_weight_w).
                        xf += x * memory_cls.get(k.clock_cls, 0.0)
                if k.bytes_per_block > 0:
                    b = n * e.per_sm * e.rate * k.hbm_pace_share * k.bytes_per_block
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

    def update(self, ranks: list[int], now: float, rerate: Callable[[list[int]], None]) -> None:
        """Set each GPU's clock under its power policy, then record its power.

        The clock is solved from the activity at the current rates; a new clock changes the rates
        (and HBM shares), so the GPUs are re-rated and solved again until no clock moves. Clocks
        sit on the GPU's clock grid, so this stops after a step or two; the bound keeps a GPU whose
        clock would flip between two grid points deterministic."""
        pc = self.power
        model = pc.model
        acts: dict[int, Activity] = {}
        if self.windowed:
            for r in ranks:
                gpu = self.gpus[r]
                a = self.activity(gpu)
                assert gpu.clock_window is not None
                gpu.clock_window.record(now, (a[0] + a[1], a[2], a[3] / gpu.clock_frac, a[4], a[8]))
                if self.records_power:
                    self.record(gpu, now, a)
            return
        if self.managed:
            cap, hi = pc.cap_w, pc.max_clock_fraction
            for _ in range(4):
                changed = False
                for r in ranks:
                    gpu = self.gpus[r]
                    a = acts[r] = self.activity(gpu)
                    c = model.solve_clock(cap, a[0] + a[1], a[2], a[3] / gpu.clock_frac, a[4], hi,
                                          hbm_saturating=a[8])
                    if c != gpu.clock_frac:
                        self.set_clock(gpu, c)
                        changed = True
                if not changed:
                    break
                rerate(ranks)
                acts.clear()
        for r in ranks:
            gpu = self.gpus[r]
            a = acts[r] if r in acts else self.activity(gpu)
            self.record(gpu, now, a)

    def _scale(self, c: float) -> float:
        """The power model's dynamic_scale(c), remembered."""
        s = self.scales.get(c)
        if s is None:
            s = self.scales[c] = self.power.model.dynamic_scale(c)
        return s

    def record(self, gpu: GpuState, now: float, a: Activity) -> None:
        if self.managed:
            c = c_tensor = gpu.clock_frac
            s_tensor = s_other = self._scale(c)
        else:
            # Without power management each kernel runs as calibrated: tensor work at the clock
            # its efficiency was measured at, the rest at the compute clock (times any manual factor).
            c = gpu.clock_factor
            c_tensor = c * self.power.model.tensor_reference_clock_fraction
            if c == 1.0:
                s_tensor, s_other = self.s_calibrated
            else:
                s_tensor, s_other = self._scale(c_tensor), self._scale(c)
        tensor, other, fixed, follow, link = a[0], a[1], a[2], a[3], a[4]
        if a[8]:
            saturating = 0.0
            for b, sat in a[8]:
                saturating += b * min(gpu.clock_frac, sat) / sat
            follow += saturating
        hbm = (fixed + follow) / self.hbm_peak_bytes_per_s
        lp = self.link_peak_bytes_per_s
        lk = link / lp if lp > 0 else 0.0
        # Idle power follows the board's clock: the tensor work's where there is any (as recorded).
        s_idle = s_tensor if tensor > 0 else s_other
        p = (self.idle_static_w + self.idle_clock_w * s_idle + s_tensor * tensor + s_other * other
             + self.hbm_w * (hbm if hbm < 1.0 else 1.0) + self.link_w * (lk if lk < 1.0 else 1.0))
        r = gpu.rank
        self.counters.add(now, r, POWER_COUNTER, p)
        self.counters.add(now, r, CLOCK_COUNTER, (c_tensor if tensor > 0 else c) * self.compute_clock_hz)
        if self.detail:
            self.counters.add(now, r, "sm_tensor_fraction", a[5])
            self.counters.add(now, r, "sm_fp32_fraction", a[6])
            self.counters.add(now, r, "sm_memory_fraction", a[7])
            self.counters.add(now, r, "link_bytes_per_s", link)


def start_clock(power: PowerConfig, periods: tuple[Period, ...]) -> float:
    """The clock fraction a GPU starts at from the window ``periods`` (empty: the top clock)."""
    m = power.model
    return window_clock(m, power.cap_w, power.max_clock_fraction, ClockWindow(m.control_window_s, periods))


def same_start(power: PowerConfig, a: dict[int, tuple[Period, ...]], b: dict[int, tuple[Period, ...]]) -> bool:
    """Whether the windows ``a`` and ``b`` start every GPU they name at clocks at most one step of
    the clock grid apart (a GPU neither names starts at the top clock)."""
    m = power.model
    step = m.clock_step_hz / m.compute_clock_hz if m.clock_step_hz > 0 else 0.0
    return all(abs(start_clock(power, a.get(r, ())) - start_clock(power, b.get(r, ()))) <= 1.001 * step
               for r in set(a) | set(b))


# Runs of a workload that find the power-limit loop's steady state, at most (steady_history).
_WARM_RUNS = 3


def steady_history(power: PowerConfig, idle: dict[int, tuple[Period, ...]], clocks: list[float],
                   warm_run: Callable[[dict[int, tuple[Period, ...]]], tuple[float, list[GpuState]]]
                   ) -> dict[int, tuple[Period, ...]]:
    """The window each GPU would bring into the workload had it just run the same workload over
    and over: run it from ``idle``, then from the window a repeat of each run leaves
    (ClockWindow.repeated), until the clocks those windows give stop moving (at most ``_WARM_RUNS``
    runs; a workload at least two windows long needs one). ``warm_run(history)`` runs the workload
    from the windows ``history`` and returns when it ended and its GPUs; ``clocks``: the GPUs'
    clock fractions before."""
    m = power.model
    history = idle
    for _ in range(_WARM_RUNS):
        end_s, gpus = warm_run(history)
        history = {g.rank: g.clock_window.repeated() for g in gpus if g.clock_window is not None}
        # After two windows the loop has forgotten where it started: the window a run that long
        # leaves does not depend on the one it started from.
        if end_s >= 2 * m.control_window_s:
            break
        new = [window_clock(m, power.cap_w, power.max_clock_fraction, ClockWindow(m.control_window_s, history[g.rank]))
               for g in gpus]
        if new == clocks:
            break
        clocks = new
    return history
