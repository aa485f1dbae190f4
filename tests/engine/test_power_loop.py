"""The power-limit loop's window (ovsim.engine.power.ClockWindow, window_clock): closed forms of
time-weighted averages over a sliding window."""

from __future__ import annotations

import pytest

from ovsim.engine.power import ClockWindow, window_clock
from ovsim.hw.calib import load_calibration
from ovsim.hw.power import Activity, power_model
from ovsim.hw.spec import load_gpu


def test_average_is_time_weighted_over_the_last_window() -> None:
    """Periods of 10 ms at 100 W, 10 ms at 300 W and 30 ms at 0 W in a 40 ms window: the first is
    outside, so (300 * 10) / 40 = 75 W of SM power."""
    w = ClockWindow(0.04)
    w.record(0.0, (100.0, 0.0, 0.0, 0.0, ()))
    w.record(0.01, (300.0, 0.0, 0.0, 0.0, ()))
    w.close(0.01)
    w.record(0.02, (0.0, 0.0, 0.0, 0.0, ()))
    w.close(0.02)
    w.close(0.05)
    a = w.average()
    assert a is not None
    assert a[0] == pytest.approx(75.0)


def test_the_oldest_period_counts_only_for_its_part_inside_the_window() -> None:
    """Periods of 30 ms at 200 W and 20 ms at 0 W in a 40 ms window: 20 ms of the first are inside,
    (200 * 20) / 40 = 100 W."""
    w = ClockWindow(0.04)
    w.record(0.0, (200.0, 1e9, 0.0, 0.0, ((5e8, 0.9),)))
    w.close(0.03)
    w.record(0.03, (0.0, 0.0, 0.0, 0.0, ()))
    w.close(0.05)
    a = w.average()
    assert a is not None
    assert a[0] == pytest.approx(100.0)
    assert a[1] == pytest.approx(0.5e9)
    assert a[4] == (pytest.approx((2.5e8, 0.9)),)


def test_a_run_shorter_than_the_window_repeats_to_its_own_average() -> None:
    """A 3 ms run (1 ms at 600 W, 2 ms at 0 W) repeated over a 70 ms window averages 200 W."""
    w = ClockWindow(0.07, [(0.07, 0.0, 0.0, 0.0, 0.0, ())])  # an idle window before it
    w.record(0.0, (600.0, 0.0, 0.0, 0.0, ()))
    w.record(0.001, (0.0, 0.0, 0.0, 0.0, ()))
    w.close(0.003)
    again = ClockWindow(0.07, w.repeated())
    a = again.average()
    assert a is not None and a[0] == pytest.approx(200.0)


def test_window_clock_fits_the_cap_and_is_the_top_clock_when_empty() -> None:
    gpu = load_gpu("h100-sxm5-80gb")
    model = power_model(gpu, load_calibration(gpu, "h100-sxm5-80gb").params)
    hi = model.max_clock_fraction
    assert window_clock(model, 700.0, hi, ClockWindow(0.07)) == hi
    w = ClockWindow(0.07)
    w.record(0.0, (model.tensor_w["default"], 0.0, 0.0, 0.0, ()))
    w.close(0.07)
    c = window_clock(model, 700.0, hi, w)
    assert c < hi
    gemm = Activity(sm_tensor_w=model.tensor_w["default"])
    assert model.power_w(gemm, c) <= 700.0
    step = model.clock_step_hz / model.compute_clock_hz
    assert model.power_w(gemm, c + step) > 700.0
