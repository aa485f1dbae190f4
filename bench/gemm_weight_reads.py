"""How often a GEMM reads its weight from HBM, bounded by measurement: the calibration harness's
shapes part (cuBLAS GEMMs alone at the top clock, calibration/data; docs/calibration.md) against
the time reading the weight (the k x n operand) twice would take at the HBM bandwidth the cost
model allows (the peak times ``hbm_achievable_fraction``, what streaming kernels were measured to
reach). The cost model (``ovsim.models.cost.gemm_isolated_s``) reads the weight twice whenever
the GEMM has two or more row tiles, as every GEMM of more than 256 rows has with the tiles its
library holds; a measured GEMM faster than two reads cannot have done that at that bandwidth.
A benchmark: it prints figures and asserts nothing.

For each data set and precision, over the GEMMs of more than 256 rows: how many were measured,
how many ran faster than two reads of their weight, and the cost model's mean signed error on
those (its price against the measurement); then those GEMMs.

    python bench/gemm_weight_reads.py      # a few seconds
"""

from __future__ import annotations

import numpy as np

from ovsim.calibrate.gemm import library_gemm_times
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import gpu_file, load_gpu
from ovsim.models.cost import element_bytes
from ovsim.validate.measured import MEASURED_DATA
from ovsim.validate.measured_gemm import MEASURED_SHAPES, measured_shape_points

LINEAR = {"bf16_linear": "bf16", "fp16_linear": "fp16", "fp8_linear": "fp8", "tf32_linear": "tf32"}


def main() -> int:
    print("GEMMs of more than 256 rows; data set, precision: measured, faster than two reads of the weight, "
          "the cost model's mean signed error on those")
    listed: list[str] = []
    for rel, gpu_name in MEASURED_SHAPES:
        gpu = load_gpu(gpu_name)
        params = load_calibration(gpu, gpu_file(gpu_name).stem).params
        bandwidth = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction
        for experiment, prec in LINEAR.items():
            pts = [p for p in measured_shape_points(MEASURED_DATA / rel, experiment, prec) if p[0] > 256]
            if not pts:
                continue
            eb = element_bytes(prec)
            measured = np.array([p[4] for p in pts])
            two_reads_s = np.array([2.0 * k * n * b * eb / bandwidth for _, n, k, b, _ in pts])
            under = measured < two_reads_s
            priced = library_gemm_times(pts, prec, gpu, params)
            err = (priced - measured) / measured
            mean = f"{err[under].mean():+.1%}" if under.any() else "-"
            print(f"{rel:30s} {prec:5s} {len(pts):4d} {int(under.sum()):4d}  {mean}")
            for i in np.flatnonzero(under):
                m, n, k, _, t = pts[i]
                listed.append(f"{rel:30s} {prec:5s} m {m:5d} n {n:6d} k {k:6d}: weight {k * n * eb / 1e6:6.0f} MB, "
                              f"measured {t * 1e6:7.1f} us, two reads {two_reads_s[i] * 1e6:7.1f} us, "
                              f"priced {priced[i] * 1e6:7.1f} us ({err[i]:+.1%})")
    print("\nGEMMs faster than two reads of their weight:")
    print("\n".join(listed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
