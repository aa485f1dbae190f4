"""The copy-engine fit's Little's-law rate (calibration/harness/fit_copy_engine.py)."""

from __future__ import annotations

import math

import pytest
from fit_copy_engine import DATA, warp_rate

from ovsim.framework_checks import COPY_FIT_SET


def test_the_warps_rate_comes_from_the_latency_bound_kernels_only() -> None:
    rate, rows = warp_rate(DATA / COPY_FIT_SET / "framework_ncu" / "metrics.csv")
    picked = {r["kernel"].replace("<unnamed>::", "").split("<")[0].rsplit("::", 1)[-1] for r in rows}
    # Of the GPT-2 layer's kernels alone, the gamma/beta gradient (24 blocks, 38% of HBM), the bias
    # gradient's reduction (32%) and the multi-tensor step (16%); not the BF16 add whose inputs sit
    # in L2 (44% of HBM, 73% of L2), the SM-bound layer norm, GEMMs or the streaming kernels.
    assert picked == {"GammaBetaBackwardCUDAKernelTemplate", "reduce_kernel", "multi_tensor_apply_kernel"}
    # Each is its DRAM bytes over its time over its warps; the rate is their geometric mean.
    for r in rows:
        assert r["bytes_per_s_per_warp"] == pytest.approx(r["bytes"] / r["duration_s"] / r["warps"])
    assert rate == pytest.approx(math.exp(sum(math.log(r["bytes_per_s_per_warp"]) for r in rows) / len(rows)))
    assert 1e8 < rate < 3e9
