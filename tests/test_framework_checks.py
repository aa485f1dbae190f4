"""Held-out rows of the harness's framework part (ovsim.validate.framework)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ovsim.calibrate import TraceInput
from ovsim.validate import MEASURED_DATA, scored
from ovsim.validate.framework import FRAMEWORK_GROUP, FRAMEWORK_SETS, framework_checks, framework_experiments

SWEEP = "h100-sxm5-80gb/2026-11-27-e"


def test_every_experiment_of_the_sweep_is_read() -> None:
    got = dict(framework_experiments(MEASURED_DATA, SWEEP, "h100-sxm5-80gb"))
    # 18 kernels beside copy loops of 1, 2, 4, 8, 16 and 32 channels (the data set's experiments.jsonl).
    assert len(got) == 18 * 6
    table = got["sgemm_f32_8192x768x768__copy_32"].kernels
    assert (table["name"] == "ovsim_channel_copy").sum() == 1


def test_a_gemm_beside_32_channels_is_predicted_nearer_than_naive() -> None:
    # Measured: the FP32 GEMM's 12 instances beside 32 copy channels took about 1.39x their time
    # alone. The shipped H100 calibration never saw this data set.
    bundle = dict(framework_experiments(MEASURED_DATA, SWEEP, "h100-sxm5-80gb"))["sgemm_f32_8192x768x768__copy_32"]
    tr = TraceInput(bundle=bundle, label="sgemm_f32_8192x768x768__copy_32", gpu="h100-sxm5-80gb")
    meas, pred, iso = (np.asarray(x) for x in scored(tr, None))
    assert len(meas) == 12
    assert 1.3 < float(np.median(meas / iso)) < 1.5
    assert np.mean(np.abs(pred - meas) / meas) < np.mean(np.abs(iso - meas) / meas) / 2


def test_no_data_set_no_rows(tmp_path: Path) -> None:
    assert framework_checks(tmp_path) == []


def test_rows_pool_a_kernel_over_data_sets(tmp_path: Path) -> None:
    # Two experiments of one kernel, one in each data set: one row, its kernels counted from both.
    for rel, gpu in FRAMEWORK_SETS[:2]:
        src = pd.read_parquet(MEASURED_DATA / rel / "tables" / "framework.parquet")
        keep = src[src["experiment"].isin(["sgemm_f32_8192x768x768__copy_8"])]
        (tmp_path / rel / "tables").mkdir(parents=True)
        keep.to_parquet(tmp_path / rel / "tables" / "framework.parquet", index=False)
        assert gpu == "h100-sxm5-80gb"
    rows = framework_checks(tmp_path)
    assert [r.group for r in rows] == [FRAMEWORK_GROUP]
    assert rows[0].name == "h100 framework: sgemm_f32_8192x768x768 (24 kernels)"
    # The H100's two data sets, not the H200's (its own row).
    assert "2026-11-27-d" in rows[0].source and "2026-11-27-e" in rows[0].source
