"""The cost model's best BF16 square-GEMM throughput on an H100 against the published sweep, with
the shipped calibration (its GEMM fit on the calibration harness's measured cuBLAS GEMMs), with the
published best-shape efficiency the shipped files held before any fit, and with calibration files
given on top of the shipped one.

Best over the library kernels a scenario GEMM chooses from (``ovsim.models.gemm_library.best_gemm``:
output tiles 128x256 down to 64x128, multistage and Hopper warp-specialized blocks). Published:
zzc0721/torch-performance-test-data #79 (H100 80GB HBM3, BF16 square GEMMs).

    python bench/gemm_square_sweep.py [CALIBRATION.yaml ...]
"""

from __future__ import annotations

import sys

from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import load_gpu
from ovsim.validate import MAMF_EFFICIENCY, best_gemm_tflops

GPU = "h100-sxm5-80gb"
PUBLISHED_TFLOPS = {1024: 177.0, 2048: 677.0, 4096: 789.0, 8192: 798.0, 10240: 720.0}


def main(argv: list[str]) -> int:
    gpu = load_gpu(GPU)
    shipped = load_calibration(gpu, GPU).params
    # What the shipped file held before any GEMM fit (h100-sxm5-80gb.v4): MAMF's best-shape
    # efficiency, 794.5 of 989.4 TFLOPS, and no time per wave.
    mamf = shipped.merged({"gemm_efficiency": {"bf16": MAMF_EFFICIENCY[GPU]}, "gemm_tile_overhead_s": {"bf16": 0.0}})
    runs = [("shipped", shipped), ("MAMF efficiency, no time per wave", mamf)]
    runs += [(path, load_calibration(gpu, GPU, (path,)).params) for path in argv]
    print(f"{'calibration':<40} " + " ".join(f"{s:>6}" for s in PUBLISHED_TFLOPS) + "  mean error")
    print(f"{'published (TFLOPS)':<40} " + " ".join(f"{v:>6.0f}" for v in PUBLISHED_TFLOPS.values()))
    for label, params in runs:
        got = {s: best_gemm_tflops(GPU, s, s, s, "bf16", params) for s in PUBLISHED_TFLOPS}
        err = sum(abs(got[s] - v) / v for s, v in PUBLISHED_TFLOPS.items()) / len(PUBLISHED_TFLOPS) * 100
        print(f"{label[-40:]:<40} " + " ".join(f"{v:>6.0f}" for v in got.values()) + f"  {err:>9.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
