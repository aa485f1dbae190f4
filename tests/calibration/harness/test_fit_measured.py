"""calibration/harness/fit_measured.py: the headroom fit recovers the value its points were made with."""

from __future__ import annotations

import numpy as np
import pytest
from fit_measured import DATA, SMLOSS, fit_headroom, headroom_slowdown, smloss_points


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


def test_the_shipped_data_set_gives_the_adds_slowdowns_by_sms_held() -> None:
    folder = DATA / SMLOSS["h100-sxm5-80gb"]
    points = smloss_points(folder, "add_bf16_256M")
    assert [h for h, _ in points] == [8, 16, 32, 66]
    assert all(0.95 < s < 1.1 for _, s in points)
