"""The copy-engine fit's Little's-law rate (calibration/harness/fit_copy_engine.py)."""

from __future__ import annotations

import pytest
from fit_copy_engine import DATA, warp_rate

from ovsim.validate.framework import COPY_FIT_SET


def test_the_warps_rate_comes_from_the_latency_bound_kernels_only() -> None:
    rate, rows = warp_rate(DATA / COPY_FIT_SET / "framework_ncu" / "metrics.csv")
    picked = {r["kernel"].replace("<unnamed>::", "").split("<")[0].rsplit("::", 1)[-1] for r in rows}
    # Of the GPT-2 layer's kernels alone, the gamma/beta gradient (24 blocks, 38% of HBM), the bias
    # gradient's reduction (32%) and the multi-tensor step (16%); not the BF16 add whose inputs sit
    # in L2 (44% of HBM, 73% of L2), the SM-bound layer norm, GEMMs or the streaming kernels.
    assert picked == {"GammaBetaBackwardCUDAKernelTemplate", "reduce_kernel", "multi_tensor_apply_kernel"}
    # Each is its DRAM bytes over its time over its warps; the bound is the largest, the gamma/beta
    # gradient's (768 warps moving 38% of the H100's 3.35 TB/s: about 1.7 GB/s a warp).
    for r in rows:
        assert r["bytes_per_s_per_warp"] == pytest.approx(r["bytes"] / r["duration_s"] / r["warps"])
    assert rate == max(r["bytes_per_s_per_warp"] for r in rows)
    assert rate == pytest.approx(0.38 * 3.35e12 / 768, rel=0.1)
