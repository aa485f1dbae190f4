"""The GPU power model: board power from activity, clock and voltage; the cap and clock-lock solver.

Form (docs/power.md; per-component dynamic power from activity, as in AccelWattch, Kandiah et al., MICRO 2021)::

    P(c) = P_idle(c) + s(c) · Σ_k w_k · u_k  +  w_hbm · u_hbm  +  w_link · u_link
    P_idle(c) = P_min + (P_top - P_min) · (s(c) - s(c_min)) / (s(c_max) - s(c_min))
    s(c) = c · (V(c) / V(1))²                           dynamic CMOS power α·C·V²·f, normalised at c = 1
    V(c) / V(1) = v_knee                                 for c <= c_knee (the regulator's floor)
                = v_knee + (1 - v_knee)·(c - c_knee)/(1 - c_knee)   above it (linear, extends past 1)

``c`` is the SM clock as a fraction of the GPU's compute clock (the clock at which the published
peak rates hold). ``u_k`` is the fraction of the GPU's SMs kept busy by work of class ``k``:

- ``tensor``: tensor-core kernels (GEMM, attention, tensor-precision kernels), weight per precision;
- ``fp32``: clock-bound kernels on the CUDA cores;
- ``memory``: memory-bound kernels and NCCL's copy/reduce loops (load/store, L1/L2, crossbar); a
  memory-bound kind with a measured clock share also draws that share of the ``fp32`` weight.

``w_k`` is the dynamic power of *every* SM doing that work at c = 1, so a fully busy GPU running a
tensor GEMM draws ``P_idle + w_tensor·s(c) + ...``. HBM and link power follow bytes moved
(``u_hbm``: HBM bytes/s over the peak; ``u_link``: bytes/s in plus out over twice the per-direction
link bandwidth) and do not scale with the SM clock (they have their own clocks). ``P_idle`` is the
board power of an idle GPU: with a measured idle at the minimum clock (``P_min``,
``power_idle_min_clock_w``) it follows the clock up to the idle at the maximum clock (``P_top``),
as clock distribution and logic that never gates do; without one it is one number. Leakage growth
with voltage is folded into the dynamic weights, which are fitted at the voltage where they are used.

Parameters come from calibration files (:mod:`ovsim.hw.calib`, keys ``power_*``), each with its
source. Where a GPU has no fitted tensor weight, it follows from the TDP: a large dense GEMM at the
tensor reference clock draws exactly the TDP (see :func:`power_model`). docs/power.md has the
sources and what is not modelled.

A cap is met by lowering the clock: :meth:`PowerModel.solve_clock` returns the highest clock
fraction on the GPU's clock grid whose predicted power fits, within the settable clock range, and
where even the minimum clock does not fit, the clock below it at which the power does (the board's
hardware slowdown, down to ``HW_SLOWDOWN_FLOOR`` of the minimum).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, PositiveFloat

from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec

TENSOR = "tensor"
FP32 = "fp32"
MEMORY = "memory"
SM_CLASSES = (TENSOR, FP32, MEMORY)
# Kernel kinds that run on tensor cores whatever their precision field says.
TENSOR_KINDS = frozenset({"gemm", "attention"})
# Bisection steps of the clock solver: 2**-48 of the clock range is far below any clock grid.
_BISECT_STEPS = 48
# Below its minimum clock a board holds its power limit by hardware slowdown: NVML's clock event
# reason "HW Slowdown" ("power draw is too high and Fast Trigger protection is reducing the
# clocks", by "a factor of 2 or more"). Taken as a continuous clock down to this fraction of the
# minimum: what a board does below half its minimum clock is not documented.
HW_SLOWDOWN_FLOOR = 0.5
# A large GEMM's compulsory HBM traffic as a fraction of peak bandwidth; used only where the tensor
# weight is derived from the TDP (an 8192^3 BF16 GEMM moves ~0.7 GB in ~4 ms on A100: ~0.1).
_GEMM_HBM_FRACTION = 0.1


class PowerSettings(BaseModel):
    """What the user sets, as with ``nvidia-smi -pl`` (board power limit) and ``nvidia-smi -lgc``
    (locked SM clock). With both, the clock is the lower of the lock and what the cap allows.

    Left empty, the board runs its power-limit loop at its default limit (the TDP), as every
    A100 and H100 does out of the box. ``managed=False`` turns the loop off: every kernel runs at
    the rate it was calibrated at and power is only reported, which no real board does (the
    reported power can exceed the TDP); it is there for closed-form studies and comparisons."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    cap_w: PositiveFloat | None = None
    sm_clock_hz: PositiveFloat | None = None
    # What the power-limit loop's window holds when the workload starts: "steady", the same workload
    # (an iteration of a training loop), or "idle", a GPU that has idled for a while (a benchmark's
    # first run, which holds the top clock until the window fills; docs/power.md).
    start: Literal["steady", "idle"] = "steady"
    managed: bool = True


@dataclass(frozen=True)
class Activity:
    """What drives power over an interval. SM terms are dynamic watts at c = 1 (Σ w_k·u_k, split
    into tensor work and the rest, because without power management they run at different
    reference clocks); bytes are per second."""

    sm_tensor_w: float = 0.0
    sm_other_w: float = 0.0
    hbm_bytes_per_s: float = 0.0
    link_bytes_per_s: float = 0.0


@dataclass(frozen=True)
class PowerModel:
    gpu: str
    idle_w: float
    tdp_w: float
    min_power_limit_w: float
    compute_clock_hz: float
    min_clock_hz: float
    max_clock_hz: float
    clock_step_hz: float
    # Dynamic power of every SM busy with the class's work at the compute clock.
    tensor_w: dict[str, float]
    fp32_w: float
    memory_w: float
    hbm_w: float
    link_w: float
    hbm_peak_bytes_per_s: float
    link_peak_bytes_per_s: float  # in plus out
    knee_clock_fraction: float
    knee_voltage_fraction: float
    # The clock fraction at which tensor kernels' calibrated efficiencies hold (they were measured
    # on a GPU throttled by its default power limit); other kernels' rates hold at c = 1.
    tensor_reference_clock_fraction: float
    tensor_precisions: frozenset[str]
    # Clock fractions above which tensor kernels' rates stop following the clock, by precision
    # ("default" for the rest); a precision with neither follows the clock all the way up.
    tensor_saturation_clock_fraction: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # Saturation clocks of single kernels (KernelDemand.saturation_clock_fraction: a GEMM of one's
    # own), which the rate classes must hold too (:meth:`with_kernel_saturations`).
    kernel_saturations: frozenset[float] = frozenset()
    # Share of a memory-bound kernel's time at c = 1 that follows the SM clock, by kind
    # (``memory_kind_clock_share``); a kind not listed does not follow it.
    memory_clock_share: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # The power-limit loop (``power_control_period_s``, ``power_control_window_s``): a window of 0
    # re-solves the clock from the activity of the moment.
    control_period_s: float = 0.0
    control_window_s: float = 0.0
    derived: tuple[str, ...] = ()  # parameters derived from the TDP rather than given
    # Idle power at the minimum SM clock (``power_idle_min_clock_w``); None: idle power does not
    # depend on the clock. With it, ``idle_w`` is the idle power at the maximum clock, and the part
    # between the two follows dynamic power (clock distribution and logic that never gates).
    idle_min_clock_w: float | None = None

    # -- the model ---------------------------------------------------------------------------------

    @property
    def min_clock_fraction(self) -> float:
        return self.min_clock_hz / self.compute_clock_hz

    @property
    def max_clock_fraction(self) -> float:
        return self.max_clock_hz / self.compute_clock_hz

    def tensor_saturation(self, precision: str | None) -> float:
        """The clock fraction above which a tensor kernel of ``precision`` stops speeding up
        (infinity: it follows the clock all the way up)."""
        sat = self.tensor_saturation_clock_fraction
        return sat.get(precision or "", sat.get("default", math.inf))

    @property
    def tensor_saturations(self) -> tuple[float, ...]:
        """The distinct saturation clocks tensor kernels can have, in a fixed order (the engine's
        rate classes; infinity, for precisions without one, first)."""
        return (math.inf, *sorted(set(self.tensor_saturation_clock_fraction.values()) | self.kernel_saturations))

    def with_kernel_saturations(self, saturations: Iterable[float | None]) -> PowerModel:
        """This model with rate classes for the given kernels' own saturation clocks (None: none)."""
        extra = frozenset(x for x in saturations if x is not None)
        return self if extra <= self.kernel_saturations else dataclasses.replace(
            self, kernel_saturations=self.kernel_saturations | extra)

    def tensor_rate(self, c: float, saturation: float = math.inf) -> float:
        """A tensor kernel's rate at clock fraction ``c`` relative to its calibrated rate: it follows
        the clock up to its saturation clock and holds there, ``min(c, sat) / min(c_ref, sat)``
        (the calibrated rate holds at the tensor reference clock)."""
        ref = self.tensor_reference_clock_fraction
        return min(c, saturation) / min(ref, saturation)

    @property
    def memory_clock_shares(self) -> tuple[float, ...]:
        """The distinct positive clock shares memory-bound kernels can have, in a fixed order (the
        engine's rate classes after the tensor ones)."""
        return tuple(sorted({x for x in self.memory_clock_share.values() if x > 0}))

    @staticmethod
    def memory_rate(c: float, share: float) -> float:
        """A memory-bound kernel's rate at clock fraction ``c`` relative to c = 1, when ``share`` of
        its time there follows the clock: ``1 / ((1 - share) + share / c)``."""
        return 1.0 / ((1.0 - share) + share / c)

    @functools.cached_property
    def idle_clock_w(self) -> float:
        """The clock-following part of idle power: dynamic watts at c = 1 (0 without a minimum-clock
        idle), so idle power at clock fraction c is ``idle_static_w + idle_clock_w·s(c)``."""
        if self.idle_min_clock_w is None:
            return 0.0
        lo, hi = self.dynamic_scale(self.min_clock_fraction), self.dynamic_scale(self.max_clock_fraction)
        return (self.idle_w - self.idle_min_clock_w) / (hi - lo) if hi > lo else 0.0

    @functools.cached_property
    def idle_static_w(self) -> float:
        """Idle power that does not follow the clock (all of it without a minimum-clock idle)."""
        return self.idle_w - self.idle_clock_w * self.dynamic_scale(self.max_clock_fraction)

    def idle_power_w(self, c: float) -> float:
        """Board power of an idle GPU at clock fraction ``c``."""
        return self.idle_static_w + self.idle_clock_w * self.dynamic_scale(c)

    def voltage_fraction(self, c: float) -> float:
        """V(c)/V(1)."""
        k, vk = self.knee_clock_fraction, self.knee_voltage_fraction
        if c <= k:
            return vk
        return vk + (1.0 - vk) * (c - k) / (1.0 - k)

    def dynamic_scale(self, c: float) -> float:
        """s(c) = c·(V(c)/V(1))²: dynamic power at clock fraction c relative to c = 1."""
        v = self.voltage_fraction(c)
        return c * v * v

    def sm_weight_w(self, kind: str, precision: str | None, clock_bound: bool) -> tuple[str, float]:
        """The class and full-GPU dynamic weight of a kernel."""
        if not clock_bound:
            # The share of a memory-bound kind's time that follows the SM clock is work on the
            # CUDA cores (a norm's reductions, a softmax's exponentials), and draws their power.
            return MEMORY, self.memory_w + self.memory_clock_share.get(kind, 0.0) * self.fp32_w
        # GEMMs and attention run on tensor cores unless their precision has none (an FP32 GEMM
        # runs on the CUDA cores, as its cost does); a traced kernel known only by its totals runs
        # on tensor cores when its precision does.
        on_tensor = precision in self.tensor_precisions if precision is not None else kind in TENSOR_KINDS
        if on_tensor and (kind in TENSOR_KINDS or kind == "generic"):
            w = self.tensor_w.get(precision or "", self.tensor_w["default"])
            return TENSOR, w
        return FP32, self.fp32_w

    def power_w(self, a: Activity, c: float, c_tensor: float | None = None) -> float:
        """Board power with the SMs at clock fraction ``c`` (tensor work at ``c_tensor`` if given:
        the state without power management, where each kernel runs as calibrated)."""
        return self.board_power_w(a.sm_tensor_w, a.sm_other_w, a.hbm_bytes_per_s, a.link_bytes_per_s, c,
                                  c if c_tensor is None else c_tensor)

    def board_power_w(self, sm_tensor_w: float, sm_other_w: float, hbm_bytes_per_s: float, link_bytes_per_s: float,
                      c: float, c_tensor: float) -> float:
        """:meth:`power_w` on plain numbers (the engine calls it at every event)."""
        hbm = hbm_bytes_per_s / self.hbm_peak_bytes_per_s
        lp = self.link_peak_bytes_per_s
        link = link_bytes_per_s / lp if lp > 0 else 0.0
        # The board's clock is the tensor work's where there is any (they differ only unmanaged).
        s_tensor = self.dynamic_scale(c_tensor)
        s_idle = s_tensor if sm_tensor_w > 0 else self.dynamic_scale(c)
        return (self.idle_static_w + self.idle_clock_w * s_idle + s_tensor * sm_tensor_w
                + self.dynamic_scale(c) * sm_other_w + self.hbm_w * (hbm if hbm < 1.0 else 1.0)
                + self.link_w * (link if link < 1.0 else 1.0))

    def solve_clocks(self, cap_w: float, terms: np.ndarray, hi: float, saturations: Sequence[float] = ()) -> np.ndarray:
        """:meth:`solve_clock` for many activities at once, with the same arithmetic and the same
        search, so each result equals the scalar one. ``terms``: one row per activity, columns
        ``sm_w``, ``hbm_fixed_bytes_per_s``, ``hbm_per_c_bytes_per_s``, ``link_bytes_per_s``, then
        the saturating tensor traffic at each of ``saturations``."""
        n = terms.shape[0]
        lo = self.min_clock_fraction
        fc, fmin, step = self.compute_clock_hz, self.min_clock_hz, self.clock_step_hz
        if step <= 0 or n == 0:
            sats = list(saturations)
            return np.array([self.solve_clock(cap_w, row[0], row[1], row[2], row[3], hi,
                                             tuple(zip(row[4:], sats, strict=True))) for row in terms], dtype=float)
        idle, hbm_w, link_w = self.idle_static_w, self.hbm_w, self.link_w
        hbm_peak, link_peak = self.hbm_peak_bytes_per_s, self.link_peak_bytes_per_s
        k, vk = self.knee_clock_fraction, self.knee_voltage_fraction
        slope = (1.0 - vk) / (1.0 - k)
        sm_w, fixed, per_c, link_b = terms[:, 0] + self.idle_clock_w, terms[:, 1], terms[:, 2], terms[:, 3]
        link = link_w * np.minimum(1.0, link_b / link_peak) if link_peak > 0 else np.zeros(n)

        def fits(c: np.ndarray) -> np.ndarray:
            v = np.where(c <= k, vk, vk + slope * (c - k))
            moved = fixed + per_c * c
            for j, sat in enumerate(saturations):
                moved = moved + terms[:, 4 + j] * np.where(c < sat, c, sat) / sat
            hbm = moved / hbm_peak
            out: np.ndarray = idle + c * v * v * sm_w + hbm_w * np.where(hbm < 1.0, hbm, 1.0) + link <= cap_w
            return out

        at_lo = fits(np.full(n, lo))
        below = self._slowed(fits, lo, ~at_lo)
        if hi <= lo:  # a clock locked at the minimum: only the slowdown below it is left
            return np.where(at_lo, lo, below)
        at_hi = fits(np.full(n, hi))
        # Grid points min + i·step below hi: the lowest fits, find the highest that does.
        i_lo = np.zeros(n, dtype=np.int64)
        i_hi = np.full(n, math.ceil((hi * fc - fmin) / step - 1e-9), dtype=np.int64)
        open_ = ~at_hi & at_lo
        while True:
            searching = open_ & (i_hi - i_lo > 1)
            if not searching.any():
                break
            mid = (i_lo + i_hi) // 2
            ok = fits((fmin + mid * step) / fc)
            i_lo = np.where(searching & ok, mid, i_lo)
            i_hi = np.where(searching & ~ok, mid, i_hi)
        return np.where(at_hi, hi, np.where(~at_lo, below, (fmin + i_lo * step) / fc))

    @staticmethod
    def _slowed(fits: Callable[[np.ndarray], np.ndarray], lo: float, rows: np.ndarray) -> np.ndarray:
        """For each of ``rows`` (the activities the minimum clock does not fit): the clock below
        it, down to ``HW_SLOWDOWN_FLOOR`` of it, at which the power fits (bisection; the floor if
        none does). Other rows: the minimum clock."""
        n = len(rows)
        a, b = np.full(n, lo * HW_SLOWDOWN_FLOOR), np.full(n, lo)
        if not rows.any():
            return b
        floor_fits = fits(a)
        for _ in range(_BISECT_STEPS):
            mid = 0.5 * (a + b)
            ok = fits(mid)
            a, b = np.where(ok, mid, a), np.where(ok, b, mid)
        return np.where(rows, np.where(floor_fits, a, lo * HW_SLOWDOWN_FLOOR), lo)

    def solve_clock(self, cap_w: float, sm_w: float, hbm_fixed_bytes_per_s: float, hbm_per_c_bytes_per_s: float,
                    link_bytes_per_s: float, hi: float,
                    hbm_saturating: Sequence[tuple[float, float]] = ()) -> float:
        """The highest clock fraction in [min clock, ``hi``] on the clock grid whose power fits
        ``cap_w`` (``hi`` itself, a locked clock, counts too). When none does, the board's hardware
        slowdown takes the clock below the minimum, continuously, to where the power fits, down to
        ``HW_SLOWDOWN_FLOOR`` of the minimum (where the GPU then draws more than the cap).

        ``sm_w`` is the SM dynamic power at c = 1; compute-bound kernels' HBM traffic scales with
        the clock (``hbm_per_c_bytes_per_s · c``), those of tensor kernels that saturate only up to
        their saturation clock (each (bytes/s at it, its clock fraction) of ``hbm_saturating``), the
        rest does not. P(c) grows with c, so a binary
        search over the grid finds the crossing (about seven evaluations on a 15 MHz grid)."""
        lo = self.min_clock_fraction
        hi = max(hi, lo)  # a clock locked at the minimum: only the slowdown below it is left
        idle, hbm_w, link_w = self.idle_static_w, self.hbm_w, self.link_w
        hbm_peak, link_peak = self.hbm_peak_bytes_per_s, self.link_peak_bytes_per_s
        k, vk = self.knee_clock_fraction, self.knee_voltage_fraction
        slope = (1.0 - vk) / (1.0 - k)
        link = link_w * min(1.0, link_bytes_per_s / link_peak) if link_peak > 0 else 0.0
        sm_w = sm_w + self.idle_clock_w

        def fits(c: float) -> bool:
            v = vk if c <= k else vk + slope * (c - k)
            moved = hbm_fixed_bytes_per_s + hbm_per_c_bytes_per_s * c
            for b, sat in hbm_saturating:
                moved += b * (c if c < sat else sat) / sat
            hbm = moved / hbm_peak
            return idle + c * v * v * sm_w + hbm_w * (hbm if hbm < 1.0 else 1.0) + link <= cap_w

        if fits(hi):
            return hi
        if not fits(lo):
            # Hardware slowdown below the minimum clock (HW_SLOWDOWN_FLOOR).
            floor = lo * HW_SLOWDOWN_FLOOR
            return _highest_fitting(fits, floor, lo) if fits(floor) else floor
        fc, fmin, step = self.compute_clock_hz, self.min_clock_hz, self.clock_step_hz
        if step <= 0:
            return _highest_fitting(fits, lo, hi)
        # Grid points min + i·step below hi: the lowest fits, find the highest that does.
        i_lo, i_hi = 0, math.ceil((hi * fc - fmin) / step - 1e-9)  # i_hi: first point at or above hi
        while i_hi - i_lo > 1:
            mid = (i_lo + i_hi) // 2
            if fits((fmin + mid * step) / fc):
                i_lo = mid
            else:
                i_hi = mid
        return (fmin + i_lo * step) / fc


def _highest_fitting(fits: Callable[[float], bool], a: float, b: float) -> float:
    """Bisection between a clock that fits (``a``) and one that does not (``b``): the highest that
    fits, to ``_BISECT_STEPS`` halvings (the arithmetic :meth:`PowerModel._slowed` repeats on arrays)."""
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (a + b)
        if fits(mid):
            a = mid
        else:
            b = mid
    return a


def power_model(gpu: GpuSpec, params: Parameters) -> PowerModel:
    """The power model of ``gpu`` from the calibration's ``power_*`` parameters.

    Missing weights are derived, and listed in ``derived``: the tensor weight from the TDP (a large
    dense GEMM, all SMs busy and ~10% of peak HBM bandwidth, draws the TDP at the tensor reference
    clock), the CUDA-core and memory weights as fixed fractions of the tensor weight."""
    p = params
    if p.power_control_window_s > 0 and not 0 < p.power_control_period_s <= p.power_control_window_s:
        raise OvsimError(f"power_control_period_s must be in (0, power_control_window_s = "
                         f"{p.power_control_window_s:g}] where a window is set, got {p.power_control_period_s:g}",
                         field="power_control_period_s")
    derived: list[str] = []
    idle_w = gpu.power.idle_w if p.power_idle_w is None else p.power_idle_w
    if p.power_idle_min_clock_w is not None and p.power_idle_min_clock_w > idle_w:
        raise OvsimError(f"{p.power_idle_min_clock_w:g} W at the minimum clock is above the idle power at the "
                         f"maximum clock, {idle_w:g} W: idle power cannot fall as the clock rises",
                         field="power_idle_min_clock_w")
    hbm_w = gpu.memory.bandwidth_bytes_per_s * p.power_hbm_j_per_byte
    link_peak = 2.0 * max(gpu.links.bandwidth_bytes_per_s, 0.0)
    link_w = link_peak * p.power_link_j_per_byte
    base = PowerModel(
        gpu=gpu.name, idle_w=idle_w, tdp_w=gpu.power.tdp_w, min_power_limit_w=gpu.power.min_power_limit_w,
        compute_clock_hz=gpu.clocks.compute_clock_hz, min_clock_hz=gpu.clocks.min_sm_clock_hz,
        max_clock_hz=gpu.clocks.max_sm_clock_hz, clock_step_hz=p.power_clock_step_hz, tensor_w={"default": 0.0},
        fp32_w=0.0, memory_w=0.0, hbm_w=hbm_w, link_w=link_w, hbm_peak_bytes_per_s=gpu.memory.bandwidth_bytes_per_s,
        link_peak_bytes_per_s=link_peak, knee_clock_fraction=p.power_knee_clock_fraction,
        knee_voltage_fraction=p.power_knee_voltage_fraction,
        tensor_reference_clock_fraction=p.power_tensor_reference_clock_fraction,
        tensor_precisions=frozenset(gpu.compute.tensor_precisions),
        tensor_saturation_clock_fraction={k: v / gpu.clocks.compute_clock_hz
                                          for k, v in p.power_tensor_saturation_clock_hz.items()},
        memory_clock_share=dict(p.memory_kind_clock_share),
        control_period_s=p.power_control_period_s, control_window_s=p.power_control_window_s,
        idle_min_clock_w=p.power_idle_min_clock_w,
    )
    tensor = dict(p.power_tensor_w)
    if "default" not in tensor:
        budget = (gpu.power.tdp_w - base.idle_power_w(p.power_tensor_reference_clock_fraction)
                  - hbm_w * _GEMM_HBM_FRACTION)
        tensor["default"] = max(0.0, budget) / base.dynamic_scale(p.power_tensor_reference_clock_fraction)
        derived.append("power_tensor_w")
    fp32 = p.power_fp32_w
    if fp32 is None:
        fp32 = p.power_fp32_fraction_of_tensor * tensor["default"]
        derived.append("power_fp32_w")
    memory = p.power_memory_w
    if memory is None:
        memory = p.power_memory_fraction_of_tensor * tensor["default"]
        derived.append("power_memory_w")
    return dataclasses.replace(base, tensor_w=tensor, fp32_w=fp32, memory_w=memory, derived=tuple(derived))


def check_settings(settings: PowerSettings, gpu: GpuSpec, source: str = "") -> None:
    """Reject what ``nvidia-smi`` would reject: a cap outside the board's settable range, a clock
    outside the SM clock range; and a setting of the power-limit loop where it is turned off."""
    p, c = gpu.power, gpu.clocks
    if not settings.managed:
        for name, value in (("cap_w", settings.cap_w), ("sm_clock_hz", settings.sm_clock_hz),
                            ("start", None if settings.start == "steady" else settings.start)):
            if value is not None:
                raise OvsimError("this sets the power-limit loop, which is turned off (managed: false, "
                                 "--no-power-management)", source=source, field=f"power.{name}")
    if settings.cap_w is not None and not p.min_power_limit_w <= settings.cap_w <= p.tdp_w:
        raise OvsimError(f"{settings.cap_w:g} W is outside {gpu.name}'s settable power limit range "
                         f"{p.min_power_limit_w:g}-{p.tdp_w:g} W", source=source, field="power.cap_w")
    if settings.sm_clock_hz is not None and not c.min_sm_clock_hz <= settings.sm_clock_hz <= c.max_sm_clock_hz:
        raise OvsimError(f"{settings.sm_clock_hz / 1e6:g} MHz is outside {gpu.name}'s SM clock range "
                         f"{c.min_sm_clock_hz / 1e6:g}-{c.max_sm_clock_hz / 1e6:g} MHz", source=source,
                         field="power.sm_clock_hz")


# -- fitting ---------------------------------------------------------------------------------------

# Columns a fit table needs: measured power, the SM clock, busy SM fractions per class, bytes/s.
FIT_COLUMNS = ("power_w", "sm_clock_hz", "sm_tensor_fraction", "sm_fp32_fraction", "sm_memory_fraction",
               "hbm_bytes_per_s", "link_bytes_per_s")
_WEIGHTS = ("idle_w", "tensor_w", "fp32_w", "memory_w", "hbm_w", "link_w")
_VOLTAGE = ("knee_voltage_fraction", "knee_clock_fraction")


@dataclass(frozen=True)
class PowerFit:
    """Fitted power parameters (the ones not fitted keep the starting model's values)."""

    params: dict[str, float]
    fitted: tuple[str, ...]
    n_samples: int
    rmse_w: float
    mape_pct: float


def voltage_fractions(c: np.ndarray, knee_clock: float, knee_voltage: float) -> np.ndarray:
    """V(c)/V(1) of every clock fraction in ``c``: :meth:`PowerModel.voltage_fraction` on arrays."""
    return np.where(c <= knee_clock, knee_voltage,
                    knee_voltage + (1.0 - knee_voltage) * (c - knee_clock) / (1.0 - knee_clock))


def _scale(c: np.ndarray, vk: float, ck: float) -> np.ndarray:
    v = voltage_fractions(c, ck, vk)
    return np.asarray(c * v * v)


def _fit_values(model: PowerModel) -> dict[str, float]:
    """The model's parameters as :func:`fit_power` fits them (tensor work as one class)."""
    return {"idle_w": model.idle_w, "tensor_w": model.tensor_w["default"], "fp32_w": model.fp32_w,
            "memory_w": model.memory_w, "hbm_w": model.hbm_w, "link_w": model.link_w,
            "knee_voltage_fraction": model.knee_voltage_fraction, "knee_clock_fraction": model.knee_clock_fraction}


def _table_power_w(cols: Mapping[str, np.ndarray], values: Mapping[str, float], model: PowerModel) -> np.ndarray:
    c = cols["sm_clock_hz"] / model.compute_clock_hz
    uh = np.minimum(1.0, cols["hbm_bytes_per_s"] / model.hbm_peak_bytes_per_s)
    ul = (np.minimum(1.0, cols["link_bytes_per_s"] / model.link_peak_bytes_per_s)
          if model.link_peak_bytes_per_s > 0 else np.zeros(len(c)))
    s = _scale(c, values["knee_voltage_fraction"], values["knee_clock_fraction"])
    return np.asarray(_idle_w(c, s, values, model) + s * (values["tensor_w"] * cols["sm_tensor_fraction"]
                                              + values["fp32_w"] * cols["sm_fp32_fraction"]
                                              + values["memory_w"] * cols["sm_memory_fraction"])
                      + values["hbm_w"] * uh + values["link_w"] * ul)


def _idle_w(c: np.ndarray, s: np.ndarray, values: Mapping[str, float], model: PowerModel) -> np.ndarray:
    """Idle power at each clock, ``values["idle_w"]`` being the idle at the maximum clock (as
    :class:`PowerModel` takes it) and the model's minimum-clock idle held."""
    if model.idle_min_clock_w is None:
        return np.full(len(c), values["idle_w"])
    vk, ck = values["knee_voltage_fraction"], values["knee_clock_fraction"]
    lo, hi = _scale(np.array([model.min_clock_fraction, model.max_clock_fraction]), vk, ck)
    return np.asarray(model.idle_min_clock_w + (values["idle_w"] - model.idle_min_clock_w) * (s - lo) / (hi - lo))


def fit_table_power_w(table: Mapping[str, Sequence[float] | np.ndarray], model: PowerModel) -> np.ndarray:
    """Board power ``model`` gives for each row of a fit table (:data:`FIT_COLUMNS`' activity, tensor
    work at its "default" weight, as :func:`fit_power` fits it); NaN where the row lacks a value."""
    cols = {c: np.asarray(table[c], dtype=float) for c in FIT_COLUMNS if c != "power_w"}
    return _table_power_w(cols, _fit_values(model), model)


def fit_tensor_weight(table: Mapping[str, Sequence[float] | np.ndarray], model: PowerModel) -> tuple[float, float]:
    """The tensor weight (W at full tensor activity on every SM at the compute clock) that best
    explains samples of tensor work in one precision, every other weight held at ``model``'s, and
    its fit error (MAPE, %): linear least squares, not below zero. For a precision whose kernels
    draw more or less than the one :func:`fit_power` fitted its tensor term on."""
    cols = {c: np.asarray(table[c], dtype=float) for c in FIT_COLUMNS}
    ok = np.all([np.isfinite(v) for v in cols.values()], axis=0) & (cols["sm_tensor_fraction"] > 0)
    if not ok.any():
        raise OvsimError("no sample with tensor work", field="power")
    usable = {k: v[ok] for k, v in cols.items()}
    values = _fit_values(model)
    rest = _table_power_w(usable, {**values, "tensor_w": 0.0}, model)
    per_watt = _table_power_w(usable, {**values, "tensor_w": 1.0}, model) - rest
    w = max(0.0, float(np.dot(per_watt, usable["power_w"] - rest) / np.dot(per_watt, per_watt)))
    err = rest + w * per_watt - usable["power_w"]
    return w, float(np.mean(np.abs(err) / np.maximum(usable["power_w"], 1e-9)) * 100)


def fit_power(table: Mapping[str, Sequence[float] | np.ndarray], model: PowerModel, *, fit_idle: bool = True,
              fit_voltage: bool = False, hold: Collection[str] = ()) -> PowerFit:
    """Least-squares fit of the component model to measured power and the activity behind it.

    ``table`` maps each of :data:`FIT_COLUMNS` to one value per sample (a DataFrame works): the
    measured ``power_w`` and the activity a prediction aligned to the samples gives (see
    :func:`ovsim.traces.power.fit_table`). The tensor, CUDA-core, memory, HBM and link weights are
    always fitted (non-negative); the idle power when ``fit_idle``; the voltage knee when
    ``fit_voltage`` (it needs samples at several clocks). ``hold`` names parameters kept at
    ``model``'s values all the same (``knee_clock_fraction``, say, where every sample's clock lies
    above the knee, so that only the curve's slope there is determined). Tensor work is fitted as
    one class (the per-precision weights of ``model`` are replaced by one). Returns the parameters
    in the model's units and the fit error."""
    from scipy.optimize import least_squares

    missing = [c for c in FIT_COLUMNS if c not in table]
    if missing:
        raise OvsimError(f"fit table lacks {', '.join(missing)}", field="power")
    cols = {c: np.asarray(table[c], dtype=float) for c in FIT_COLUMNS}
    ok = np.all([np.isfinite(v) for v in cols.values()], axis=0)
    n = int(ok.sum())
    unknown = sorted(set(hold) - set(_WEIGHTS) - set(_VOLTAGE))
    if unknown:
        raise OvsimError(f"cannot hold {', '.join(unknown)}: not a power-fit parameter", field="hold")
    names = [w for w in _WEIGHTS if (fit_idle or w != "idle_w") and w not in hold]
    names += [v for v in _VOLTAGE if fit_voltage and v not in hold]
    if n < len(names):
        raise OvsimError(f"{n} usable samples for {len(names)} parameters", field="power")
    p_meas = cols["power_w"][ok]
    usable = {k: v[ok] for k, v in cols.items()}
    start = _fit_values(model)

    def predict(values: dict[str, float]) -> np.ndarray:
        return _table_power_w(usable, values, model)

    def residual(x: np.ndarray) -> np.ndarray:
        return np.asarray(predict({**start, **dict(zip(names, x.tolist(), strict=True))}) - p_meas)

    lower = [0.05 if k in _VOLTAGE else 0.0 for k in names]
    upper = [1.0 if k == "knee_voltage_fraction" else 0.95 if k == "knee_clock_fraction" else np.inf for k in names]
    x0 = np.clip([start[k] for k in names], np.asarray(lower) + 1e-9, np.asarray(upper) - 1e-9)
    sol = least_squares(residual, x0, bounds=(lower, upper), x_scale="jac")
    fitted = {**start, **dict(zip(names, sol.x.tolist(), strict=True))}
    err = predict(fitted) - p_meas
    rmse = float(np.sqrt(np.mean(err**2)))
    mape = float(np.mean(np.abs(err) / np.maximum(p_meas, 1e-9)) * 100)
    return PowerFit(params=fitted, fitted=tuple(names), n_samples=n, rmse_w=rmse, mape_pct=mape)
