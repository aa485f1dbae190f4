"""The clock fits: the share of a memory-bound kernel's time that follows the SM clock, and the power loop's window."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.optimize import nnls

from ovsim.errors import OvsimError


def memory_clock_time_s(clock_hz: np.ndarray, time_at_reference_s: float, share: float,
                        reference_hz: float) -> np.ndarray:
    """A memory-bound kernel's time at each SM clock when ``share`` of its ``time_at_reference_s``
    (at ``reference_hz``) follows the clock and the rest does not."""
    return time_at_reference_s * ((1.0 - share) + share * reference_hz / np.asarray(clock_hz, float))


def fit_clock_share(clock_hz: Sequence[float] | np.ndarray, duration_s: Sequence[float] | np.ndarray,
                    reference_hz: float) -> dict[str, Any]:
    """The share of a kernel's time at ``reference_hz`` that follows the SM clock, from its
    durations at the clocks it ran at (``memory_kind_clock_share``).

    ``t = a + b / f`` with ``a, b >= 0`` by non-negative least squares on relative error, so the
    share ``(b / f_ref) / (a + b / f_ref)`` lies in [0, 1]. Also: the time at the reference clock,
    the RMS relative residual, and that of the best time that does not follow the clock at all."""
    f = np.asarray(clock_hz, float)
    t = np.asarray(duration_s, float)
    if f.shape != t.shape or len(f) < 2:
        raise OvsimError("needs a duration for each clock, at least two", field="clock_hz")
    if not (np.isfinite(f).all() and np.isfinite(t).all() and (f > 0).all() and (t > 0).all()):
        raise OvsimError("clocks and durations must be positive and finite", field="duration_s")
    if f.max() <= f.min():
        raise OvsimError(f"all durations ran at one clock ({f[0] / 1e6:g} MHz): nothing tells what follows it",
                         field="clock_hz")
    if not (reference_hz > 0 and math.isfinite(reference_hz)):
        raise OvsimError(f"must be positive and finite, got {reference_hz}", field="reference_hz")
    g = 1e9 / f  # per GHz: keeps both columns of order one
    (a, b), _ = nnls(np.column_stack((1.0 / t, g / t)), np.ones_like(t))
    at_ref = a + b * 1e9 / reference_hz
    if at_ref <= 0:
        raise OvsimError("the durations do not fit a time that follows the clock in part", field="duration_s")
    share = float(b * 1e9 / reference_hz / at_ref)
    rms = float(np.sqrt(np.mean(((a + b * g) / t - 1.0) ** 2)))
    # The clock-free time with the least squared relative error.
    flat = float(np.sum(1.0 / t) / np.sum(1.0 / t**2))
    rms_flat = float(np.sqrt(np.mean((flat / t - 1.0) ** 2)))
    return {"share": share, "time_at_reference_s": float(at_ref), "points": len(t),
            "clock_mhz_range": [round(float(f.min()) / 1e6), round(float(f.max()) / 1e6)],
            "rms_relative_residual": rms, "rms_relative_residual_if_time_did_not_follow_the_clock": rms_flat}


def fit_control_window(measured: dict[str, tuple[np.ndarray, np.ndarray]],
                       simulate: Callable[[float, str], tuple[np.ndarray, np.ndarray]],
                       windows_s: Sequence[float], steady_from_s: float,
                       baseline_s: float | None = None) -> dict[str, Any]:
    """The power-limit loop's averaging window (``power_control_window_s``) from phases started
    from idle: per phase, ``measured`` (kernel start times from the phase's start, SM clock Hz),
    and ``simulate(window_s, phase)`` the predicted clock as a step function (change times, clock
    Hz) from an idle start.

    Each trajectory is taken about its own steady level (its median from ``steady_from_s`` on), so
    that an error in the steady clock itself, which the power weights set, does not pull the
    window; the window on the grid with the least RMS difference over all phases' kernels wins.
    ``baseline_s``, a window not on the grid (0: the clock of each moment), is reported beside it."""
    if not measured:
        raise OvsimError("no phase to fit the control window on", field="measured")
    if not windows_s or min(windows_s) <= 0:
        raise OvsimError("needs positive windows to try", field="windows_s")
    for phase, (t, _) in measured.items():
        steady = t >= steady_from_s
        if not steady.any() or steady.all():
            raise OvsimError(f"{phase}: needs kernels before and after {steady_from_s:g} s", field="measured")

    def errors(w: float) -> dict[str, np.ndarray]:
        out = {}
        for phase, (t, clk) in measured.items():
            steady = t >= steady_from_s
            at, value = simulate(w, phase)
            pred = value[np.clip(np.searchsorted(at, t, side="right") - 1, 0, len(value) - 1)]
            out[phase] = (pred - np.median(pred[steady])) - (clk - np.median(clk[steady]))
        return out

    def rms(x: np.ndarray) -> float:
        return round(float(np.sqrt(np.mean(x**2))) / 1e6, 1)

    by_window = {w: errors(w) for w in windows_s}
    total = {w: rms(np.concatenate(list(e.values()))) for w, e in by_window.items()}
    best = min(total, key=lambda w: total[w])
    out: dict[str, Any] = {
        "window_s": best, "rms_mhz": total[best],
        "rms_mhz_by_window_ms": {round(w * 1e3): v for w, v in total.items()},
        "rms_mhz_by_phase": {p: rms(e) for p, e in by_window[best].items()},
        "kernels": int(sum(len(t) for t, _ in measured.values())), "steady_from_s": steady_from_s}
    if baseline_s is not None:
        out["rms_mhz_at_baseline_window"] = {"window_s": baseline_s,
                                             "rms_mhz": rms(np.concatenate(list(errors(baseline_s).values())))}
    return out
