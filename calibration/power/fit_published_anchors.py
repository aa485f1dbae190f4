"""Fit the A100 (GA100) SM power weights of ovsim's power model to two published anchors.

Run from the repository root: ``python calibration/power/fit_published_anchors.py`` (``--dry-run``
prints without writing). It writes the weights as the next version of both A100 calibrations,
when they differ from the newest. Nothing here is imported by ovsim.

Anchors (both primary sources):

1. Tensor cores. H. He, "Strangely, Matrix Multiplications on GPUs Run Faster When Given
   'Predictable' Data" (thonking.ai/p/strangely-matrix-multiplications): an 8192^3 half-precision
   cuBLAS GEMM on an A100 reaches 295 TFLOPS with all-zero inputs and 258 TFLOPS with randn inputs,
   the gap being throttling under the 400 W limit; idle 88 W. Taking the zero-input run as
   unthrottled at the 1410 MHz compute clock, the random-input run holds 258/295 = 0.875 of it
   while drawing 400 W: the tensor weight solves P(GEMM activity, c = 0.875) = 400 W.

   The zero-input run is also the most a cuBLAS GEMM does per clock: 295 of 312 TFLOPS, 94.6% at
   1410 MHz. The cost model's A100 GEMM efficiency is MAMF's best, 271.2 TFLOPS
   (stas00/ml-engineering, its own shape at the default limit), so it holds at the clock where
   94.6% of the peak is 271.2 TFLOPS: 271.2/295 = 0.919 of 1410 MHz, ovsim's tensor reference
   clock fraction. (It was 0.875, thonking's clock, which put cuBLAS at 99.4% of the peak per
   clock, above what any A100 GEMM measured.) At 0.875, the 400 W clock of a sustained 8192^3
   GEMM, the model then gives thonking's 258 TFLOPS.

2. CUDA cores. pc2/GPUInspector.jl docs/src/examples/gpustresstest.md: an FP32 stress test on a
   DGX A100-SXM4-40GB draws about 300-340 W (monitoring plot), idle about 56 W. Taking the middle,
   320 W, with every SM busy at the compute clock (the stress stays below 400 W, so no throttling)
   and no HBM traffic: the CUDA-core weight is 320 W less the idle power at that clock.

Idle power follows the clock (``power_idle_min_clock_w``, docs/power.md): 88 W idling with the
clocks high, between GEMM runs at the 400 W limit (thonking.ai; the board's memory size is not
stated), 56 W left idle (the GPUInspector plot, clocks down). An H100 measured both ways: 125 W
between phases at 1980 MHz, 72 W idle at 345 MHz. Both parts take both values: the same GA100 die,
and the sources do not tell the 40 GB and 80 GB parts' idle apart.

Both weights describe the GA100 SMs, so the 40 GB and 80 GB parts share them; each part keeps its
own HBM. Tests on these two numbers are consistency checks, not validations.
"""

from __future__ import annotations

import argparse
import sys

from ovsim.calibrate import FitReport, write_shipped
from ovsim.engine.power_analytic import isolated_activity
from ovsim.hw.calib import load_calibration
from ovsim.hw.power import power_model
from ovsim.hw.spec import load_gpu
from ovsim.models import cost
from ovsim.models.ir import Op

ZERO_INPUT_TFLOPS = 295.0
RANDN_TFLOPS = 258.0
MAMF_TFLOPS = 271.2  # stas00/ml-engineering's MAMF table, A100 SXM BF16, the cost model's gemm_efficiency
LIMIT_W = 400.0
FP32_STRESS_W = 320.0  # middle of 300-340 W


IDLE_TOP_W = 88.0  # thonking.ai: idle between runs at the 400 W limit, clocks high
IDLE_MIN_CLOCK_W = 56.0  # GPUInspector.jl: a DGX A100-SXM4-40GB left idle
COMMAND = "python calibration/power/fit_published_anchors.py"
A100_STEMS = ("a100-sxm4-40gb", "a100-sxm4-80gb")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fits, write nothing")
    args = ap.parse_args()
    gpu = load_gpu("a100-sxm4-80gb")
    idle = {"power_idle_w": IDLE_TOP_W, "power_idle_min_clock_w": IDLE_MIN_CLOCK_W}
    calib = load_calibration(gpu, "a100-sxm4-80gb")
    # Unit weights: the activity then reads directly as "fraction of all SMs busy".
    probe = power_model(gpu, calib.params.model_copy(update={"power_tensor_w": {"default": 1.0},
                                                             "power_fp32_w": 1.0, "power_memory_w": 1.0, **idle}))
    x_t = RANDN_TFLOPS / ZERO_INPUT_TFLOPS
    k = cost.gemm(8192, 8192, 8192, "bf16", gpu, calib.params)
    op = Op("gemm", "gemm", "gemm", 0, "s", kernel=k, info={"precision": "bf16"})
    a = isolated_activity(op, gpu, probe)
    hbm_u = a.hbm_bytes_per_s / gpu.memory.bandwidth_bytes_per_s
    hbm_w = probe.hbm_w * hbm_u
    tensor_w = round((LIMIT_W - probe.idle_power_w(x_t) - hbm_w) / (a.sm_w * probe.dynamic_scale(x_t)), 1)
    print(f"GEMM 8192^3 bf16: SM busy fraction {a.sm_w:.4f}, HBM {a.hbm_bytes_per_s / 1e9:.1f} GB/s "
          f"({hbm_u:.3f} of peak, {hbm_w:.1f} W), calibrated {2 * 8192**3 / k.isolated_s / 1e12:.1f} TFLOPS")
    print(f"the 400 W clock fraction of the randn GEMM: {x_t:.4f}; s there = {probe.dynamic_scale(x_t):.4f}; "
          f"idle there {probe.idle_power_w(x_t):.1f} W")
    print(f"power_tensor_w default: {tensor_w:.1f} W")
    x_ref = round(MAMF_TFLOPS / ZERO_INPUT_TFLOPS, 4)
    print(f"power_tensor_reference_clock_fraction: {x_ref} (MAMF {MAMF_TFLOPS} / zero-input {ZERO_INPUT_TFLOPS})")
    fp32_w = round(FP32_STRESS_W - probe.idle_power_w(1.0), 1)
    print(f"power_fp32_w: {fp32_w:.1f} W (ratio to tensor {fp32_w / tensor_w:.3f})")
    idle_src = ("idle between 8192^3 GEMM runs at the 400 W limit, clocks high (thonking.ai/p/strangely-matrix-"
                "multiplications, 88 W; the board's memory size is not stated): the idle power at the maximum clock")
    min_src = ("a DGX A100-SXM4-40GB left idle (pc2/GPUInspector.jl docs/src/examples/gpustresstest.md, ~56 W): "
               "the idle power at the minimum clock; both A100 parts take it (the same GA100 die)")
    report = FitReport(
        parameters={**idle, "power_tensor_w": {"default": tensor_w}, "power_fp32_w": fp32_w,
                    "power_tensor_reference_clock_fraction": x_ref},
        sources={"power_idle_w": f"{idle_src}; {COMMAND}", "power_idle_min_clock_w": f"{min_src}; {COMMAND}",
                 "power_tensor_w": (f"fit: an 8192^3 half-precision GEMM draws 400 W at {x_t:.4f} of 1410 MHz "
                                    f"(thonking.ai: 258 TFLOPS with randn inputs, 295 with zeros, at the 400 W "
                                    f"limit), idle power at that clock {probe.idle_power_w(x_t):.1f} W; {COMMAND}"),
                 "power_fp32_w": (f"fit: FP32 stress on a DGX A100-SXM4-40GB draws ~300-340 W (pc2/GPUInspector.jl "
                                  f"gpustresstest.md; 320 W taken) with every SM busy at 1410 MHz, less the idle "
                                  f"power there ({probe.idle_power_w(1.0):.1f} W); {COMMAND}"),
                 "power_tensor_reference_clock_fraction": (
                     f"{MAMF_TFLOPS} / {ZERO_INPUT_TFLOPS} TFLOPS: the clock fraction at which cuBLAS's best per-clock "
                     f"rate (the all-zero 8192^3 GEMM, unthrottled at 1410 MHz, thonking.ai) gives MAMF's "
                     f"{MAMF_TFLOPS} TFLOPS (stas00/ml-engineering), the measurement gemm_efficiency comes from; "
                     f"{COMMAND}")},
        fits={"power_anchors": {"method": "closed form on two published anchors", "gemm_sm_busy": round(a.sm_w, 4),
                                "gemm_hbm_w": round(hbm_w, 1)}})
    write_a100(report, COMMAND, args.dry_run)
    return 0


def write_a100(report: FitReport, command: str, dry_run: bool) -> None:
    """Write ``report`` as the next version of both A100 calibrations: their power parameters are
    the GA100 die's, shared by the 40 GB and 80 GB parts (they differ in HBM only)."""
    for stem in A100_STEMS:
        _, done = write_shipped(report, [], stem, command, dry_run=dry_run)
        print(f"{stem}: {done}")


if __name__ == "__main__":
    sys.exit(main())
