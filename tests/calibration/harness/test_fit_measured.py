"""calibration/harness/fit_measured.py: the headroom fit recovers the value its points were made with."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from fit_measured import (
    DATA,
    SHAPING,
    SMLOSS,
    fit_headroom,
    fit_issue_cap,
    headroom_slowdown,
    shaped_time_ratio,
    shaping_points,
    smloss_points,
)
from fit_power_clock import SHARE_PHASES, VOLTAGE, fit_saturation, share_power_rows


@pytest.mark.parametrize("headroom", [1.0, 1.5, 1.923, 3.0])
def test_headroom_fit_recovers_the_value_of_closed_form_points(headroom: float) -> None:
    held = np.array([8, 16, 32, 66, 100])
    points = list(zip(held.tolist(), headroom_slowdown(headroom, held, 132).tolist(), strict=True))
    fit = fit_headroom(points, 132)
    if headroom * 32 / 132 >= 1:  # no held count binds above this headroom's value: any larger one fits
        assert fit["value"] >= headroom - 1e-3
    else:
        assert fit["value"] == pytest.approx(headroom, abs=2e-3)
    assert fit["fit_mape_pct"] < 0.1


@pytest.mark.parametrize("gpu", sorted(SMLOSS))
def test_the_shipped_data_sets_give_the_adds_slowdowns_by_sms_held(gpu: str) -> None:
    points = smloss_points(DATA / SMLOSS[gpu], "add_bf16_256M")
    assert [h for h, _ in points] == [8, 16, 32, 66]
    assert all(0.95 < s < 1.25 for _, s in points)


@pytest.mark.parametrize("cap", [1 / 6, 0.3, 0.5564, 1.0])
def test_issue_cap_fit_recovers_the_cap_of_closed_form_block_times(cap: float) -> None:
    resident = np.arange(1, 7)
    points = list(zip(resident.tolist(), (2e-4 * shaped_time_ratio(cap, resident.astype(float), 6)).tolist(),
                      strict=True))
    fitted, record = fit_issue_cap(points)
    assert fitted == pytest.approx(cap, abs=1e-3)
    assert record["natural_blocks_per_sm"] == 6 and record["fit_mape_pct"] < 0.1


def test_the_shipped_shaping_data_sets_give_a_block_time_per_occupancy() -> None:
    for fit_on, _ in SHAPING.values():
        points = shaping_points(DATA / fit_on)
        assert [n for n, _ in points] == [1, 2, 3, 4, 5, 6]
        times = [t for _, t in points]
        assert times == sorted(times)  # more blocks on an SM, each slower


@pytest.mark.parametrize("sat_hz", [1.3e9, 1.6e9, 1.77e9])
def test_the_saturation_fit_recovers_the_clock_its_durations_were_made_with(sat_hz: float) -> None:
    """Two experiments of different sizes, time max(sat / f, 1) x their own, 1% noise."""
    rng = np.random.default_rng(0)
    rows = []
    for exp, t_sat in (("a", 1.4e-3), ("b", 1.7e-4)):
        f = rng.uniform(1.1e9, 1.98e9, 400)
        d = t_sat * np.maximum(sat_hz / f, 1.0) * rng.lognormal(0.0, 0.01, len(f))
        rows.append(pd.DataFrame({"experiment": exp, "sm_clock_hz": f, "duration_s": d}))
    fit = fit_saturation(pd.concat(rows, ignore_index=True))
    assert fit["value_hz"] == pytest.approx(sat_hz, rel=0.01)
    assert fit["rms_log_residual"] == pytest.approx(0.01, rel=0.15)
    assert fit["rms_log_residual_if_time_followed_the_clock"] > fit["rms_log_residual"]


@pytest.mark.parametrize("gpu", sorted(VOLTAGE))
def test_the_share_phases_give_power_rows_at_their_gemm_shares_and_clocks(gpu: str) -> None:
    """The clock part's GEMM/add alternations (calibration/data, the boards of VOLTAGE): each phase's
    rows carry the GEMM's and the add's measured time shares, within 3 points of the share the
    harness planned (its plan is within 1.5 of the time alone; the GEMM slows under the limit)
    and together nearly the whole span; more GEMM time, a lower median counted clock; every row
    a sample after the phase's first second, nearly all of them under load."""
    rel, _ = VOLTAGE[gpu]
    clocks = []
    for phase in SHARE_PHASES:
        rows = share_power_rows(rel, phase)
        planned = int(phase.rsplit("_", 1)[-1]) / 100
        gemm, add = float(rows["sm_tensor_fraction"].iloc[0]), float(rows["sm_memory_fraction"].iloc[0])
        assert abs(gemm - planned) < 0.03, (phase, gemm)
        assert 0.95 < gemm + add <= 1.0
        # (The H200's 90% phase holds 18 samples near idle, a pause of ~100 ms the kernels' shares
        # count too.)
        assert len(rows) > 100 and rows["power_w"].median() > 500 and (rows["power_w"] < 300).mean() < 0.05
        clocks.append(float(rows["sm_clock_hz"].median()))
    assert all(a >= b - 5e6 for a, b in itertools.pairwise(clocks))
    assert clocks[0] - clocks[-1] > 300e6
