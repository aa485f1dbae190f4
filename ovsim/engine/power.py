"""Power in both fidelities, and energy from a timeline.

The engine (:mod:`ovsim.engine.sim`) computes every GPU's activity from its current rates at each
event, turns it into power with :class:`~ovsim.hw.power.PowerModel`, and, under a power cap or a
locked clock, picks the SM clock first. It records two piecewise-constant counters per rank,
``power_w`` and ``sm_clock_hz``; :func:`power_table` integrates them, which is exact because rates
(and so power) are constant between events.

The analytic fidelity has no shared resources, so it has no shared power budget either: each op
runs at the clock the cap would give it alone (its clock-bound time stretched by that clock), and
the power of ops that happen to run at the same time is summed from their isolated activities
(:func:`analytic_power`). With one op at a time on a GPU this is what the engine does too, up to
the engine re-solving the clock as a kernel's tail wave leaves SMs idle.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ovsim.engine.timeline import Timeline, timeline_from_rows
from ovsim.hw.power import MEMORY, TENSOR, Activity, PowerModel, PowerSettings
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
        """Whether the engine runs the firmware's clock loop. Without settings, every kernel runs
        at the rate it was calibrated at and power is only reported."""
        return self.settings.active

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
        if f.pattern in ("ring", "all_pairs") and len(f.ranks) > 1:
            link += 2.0 * f.bytes * f.link_coeff / iso
        elif f.pattern == "p2p":
            link += f.bytes * f.link_coeff / iso
    return _OpPower(cls, sm_w, hbm, link)


def _solo_clock(a: _OpPower, cfg: PowerConfig, saturation: float = math.inf) -> float:
    """The clock the cap gives an op alone (a tensor op's rate saturating at ``saturation``)."""
    m = cfg.model
    follow = a.hbm_bytes_per_s if a.cls in (TENSOR, "fp32") else 0.0
    ref = m.tensor_reference_clock_fraction if a.cls == TENSOR else 1.0
    if a.cls == TENSOR and math.isfinite(saturation):
        # Its traffic at the saturation clock, from the calibrated traffic at the reference clock.
        at_sat = follow * saturation / min(ref, saturation)
        return m.solve_clock(cfg.cap_w, a.sm_w, a.hbm_bytes_per_s - follow, 0.0, a.link_bytes_per_s,
                             cfg.max_clock_fraction, hbm_saturating=((at_sat, saturation),))
    return m.solve_clock(cfg.cap_w, a.sm_w, a.hbm_bytes_per_s - follow, follow / ref,
                         a.link_bytes_per_s, cfg.max_clock_fraction)


def throttled_workload(workload: Workload, gpu: GpuSpec, cfg: PowerConfig) -> tuple[Workload, dict[str, float]]:
    """The workload with every clock-bound kernel's time (and the part of a memory-bound kernel's
    that follows the clock) stretched or shrunk by the clock the cap gives it alone, and each op's
    clock fraction."""
    ops: list[Op] = []
    clocks: dict[str, float] = {}
    for op in workload.ops:
        a = isolated_activity(op, gpu, cfg.model)
        cls = tensor_clock_class(op, cfg.model) if a.cls == TENSOR else 1
        c = _solo_clock(a, cfg, cfg.model.tensor_saturations[cls - 2] if a.cls == TENSOR else math.inf)
        clocks[op.id] = c
        k = op.kernel
        if k is not None and op.flow is None and not k.clock_sensitive:
            cls = memory_clock_class(op, cfg.model)
        if k is None or op.flow is not None or cls == 0:
            ops.append(op)
            continue
        mult = cfg.multipliers(c)[cls]
        k2 = dataclasses.replace(k, block_time_s=k.block_time_s / mult, isolated_s=k.isolated_s / mult)
        ops.append(dataclasses.replace(op, kernel=k2))
    return dataclasses.replace(workload, ops=tuple(ops)), clocks


def restore_isolated(timeline: Timeline, workload: Workload) -> Timeline:
    """Report the cost model's isolated times again; the difference is time lost to the clock."""
    iso = {op.id: op.isolated_s for op in workload.ops}
    ops = timeline.ops
    rows: list[dict[str, Any]] = []
    for rec in ops.to_dict(orient="records"):
        row = {str(k): v for k, v in rec.items()}
        oid = str(row["id"])
        if oid in iso:
            row["clock_s"] = max(0.0, float(row["duration_s"]) - iso[oid]) if iso[oid] != row["isolated_s"] else 0.0
            row["isolated_s"] = iso[oid]
        rows.append(row)
    counters = [{str(k): v for k, v in c.items()} for c in timeline.counters.to_dict(orient="records")]
    return timeline_from_rows(rows, counters)


def analytic_power(timeline: Timeline, workload: Workload, gpu: GpuSpec, cfg: PowerConfig,
                   clocks: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """``power_w`` and ``sm_clock_hz`` counter rows for an analytic timeline: each rank's power is
    idle plus the isolated activity of whatever ops run, each at its own clock."""
    m = cfg.model
    by_id = {op.id: op for op in workload.ops}
    ops = timeline.ops
    ops = ops[(ops["rank"] >= 0) & ops["id"].isin(by_id)]
    out: list[dict[str, Any]] = []
    x_t = m.tensor_reference_clock_fraction
    for r in range(workload.n_ranks):
        mine = ops[ops["rank"] == r]
        events: list[tuple[float, int, float]] = []  # time, op index, +1 start / -1 end
        acts: list[tuple[float, float, float, float]] = []
        for oid, start, end in zip(mine["id"].astype(str), mine["start_s"].to_numpy(float),
                                   mine["end_s"].to_numpy(float), strict=True):
            op = by_id[oid]
            if not end > start:
                continue
            a = isolated_activity(op, gpu, m)
            # Under a policy each op runs at its own solved clock; without one, as calibrated.
            managed_c = (clocks or {}).get(op.id, cfg.max_clock_fraction)
            c = managed_c if cfg.managed else (x_t if a.cls == TENSOR else 1.0)
            j = len(acts)
            acts.append((m.dynamic_scale(c) * a.sm_w, a.hbm_bytes_per_s, a.link_bytes_per_s, c))
            events.append((start, j, 1.0))
            events.append((end, j, -1.0))
        idle_clock = cfg.max_clock_fraction if cfg.managed else 1.0
        out.append({"time_s": 0.0, "rank": r, "counter": POWER_COUNTER, "value": m.idle_w})
        out.append({"time_s": 0.0, "rank": r, "counter": CLOCK_COUNTER, "value": idle_clock * m.compute_clock_hz})
        events.sort(key=lambda e: (e[0], e[1], e[2]))
        active: dict[int, None] = {}
        i = 0
        while i < len(events):
            t = events[i][0]
            while i < len(events) and events[i][0] == t:
                _, j, sign = events[i]
                if sign > 0:
                    active[j] = None
                else:
                    active.pop(j, None)
                i += 1
            vals = [acts[j] for j in active]
            act = Activity(hbm_bytes_per_s=sum(v[1] for v in vals), link_bytes_per_s=sum(v[2] for v in vals))
            p = m.power_w(act, 1.0) + sum(v[0] for v in vals)
            clock = min((v[3] for v in vals), default=idle_clock)
            out.append({"time_s": t, "rank": r, "counter": POWER_COUNTER, "value": p})
            out.append({"time_s": t, "rank": r, "counter": CLOCK_COUNTER, "value": clock * m.compute_clock_hz})
    return out
