"""Fit the A100 (GA100) SM power weights of ovsim's power model to two published anchors.

Run from the repository root: ``python calibration/power/fit_published_anchors.py``. It prints the
weights that ``calibration/history/a100-sxm4-{40,80}gb.v2.yaml`` record (carried into every later
version). Nothing here is imported by ovsim.

Anchors (both primary sources):

1. Tensor cores. H. He, "Strangely, Matrix Multiplications on GPUs Run Faster When Given
   'Predictable' Data" (thonking.ai/p/strangely-matrix-multiplications): an 8192^3 half-precision
   cuBLAS GEMM on an A100 reaches 295 TFLOPS with all-zero inputs and 258 TFLOPS with randn inputs,
   the gap being throttling under the 400 W limit; idle 88 W. Taking the zero-input run as
   unthrottled at the 1410 MHz compute clock, the random-input run holds 258/295 = 0.875 of it
   while drawing 400 W. ovsim's tensor reference clock fraction is that 0.875 (the cost model's
   calibrated GEMM efficiency is a randn measurement at the default limit), and the tensor weight
   solves P(GEMM activity, c = 0.875) = 400 W with the 80 GB part's idle power (88 W, same source).

2. CUDA cores. pc2/GPUInspector.jl docs/src/examples/gpustresstest.md: an FP32 stress test on a
   DGX A100-SXM4-40GB draws about 300-340 W (monitoring plot), idle about 56 W. Taking the middle,
   320 W, with every SM busy at the compute clock (the stress stays below 400 W, so no throttling)
   and no HBM traffic: the CUDA-core weight is 320 - 56 W.

Both weights describe the GA100 SMs, so the 40 GB and 80 GB parts share them; each part keeps its
own idle power and HBM. Tests on these two numbers are consistency checks, not validations.

H100 SXM5 has no published GEMM power measurement (none was found in the public material searched), so its
tensor weight is not fitted but derived from the TDP the same way: the same GEMM, at the compute
clock (1830 MHz, the clock of NVIDIA's 989 TFLOPS figure, below the 1980 MHz maximum), draws 700 W.
"""

from __future__ import annotations

from ovsim.engine.power import isolated_activity
from ovsim.hw.calib import load_calibration
from ovsim.hw.power import power_model
from ovsim.hw.spec import load_gpu
from ovsim.models import cost
from ovsim.models.ir import Op

ZERO_INPUT_TFLOPS = 295.0
RANDN_TFLOPS = 258.0
LIMIT_W = 400.0
FP32_STRESS_W = 320.0  # middle of 300-340 W


def tdp_tensor_weight(stem: str, x_t: float) -> None:
    """The tensor weight at which the 8192^3 BF16 GEMM alone draws the TDP at clock fraction x_t."""
    gpu = load_gpu(stem)
    calib = load_calibration(gpu, stem)
    probe = power_model(gpu, calib.params.model_copy(update={"power_tensor_w": {"default": 1.0}}))
    k = cost.gemm(8192, 8192, 8192, "bf16", gpu, calib.params)
    a = isolated_activity(Op("g", "g", "gemm", 0, "s", kernel=k, info={"precision": "bf16"}), gpu, probe)
    hbm_w = probe.hbm_w * a.hbm_bytes_per_s / gpu.memory.bandwidth_bytes_per_s
    w = (gpu.power.tdp_w - gpu.power.idle_w - hbm_w) / (a.sm_w * probe.dynamic_scale(x_t))
    print(f"{stem}: TDP-derived power_tensor_w default {w:.1f} W (SM busy {a.sm_w:.4f}, HBM {hbm_w:.1f} W)")


def main() -> None:
    gpu = load_gpu("a100-sxm4-80gb")
    calib = load_calibration(gpu, "a100-sxm4-80gb")
    # Unit weights: the activity then reads directly as "fraction of all SMs busy".
    probe = power_model(gpu, calib.params.model_copy(update={"power_tensor_w": {"default": 1.0},
                                                             "power_fp32_w": 1.0, "power_memory_w": 1.0}))
    x_t = RANDN_TFLOPS / ZERO_INPUT_TFLOPS
    k = cost.gemm(8192, 8192, 8192, "bf16", gpu, calib.params)
    op = Op("gemm", "gemm", "gemm", 0, "s", kernel=k, info={"precision": "bf16"})
    a = isolated_activity(op, gpu, probe)
    hbm_u = a.hbm_bytes_per_s / gpu.memory.bandwidth_bytes_per_s
    hbm_w = probe.hbm_w * hbm_u
    tensor_w = (LIMIT_W - gpu.power.idle_w - hbm_w) / (a.sm_w * probe.dynamic_scale(x_t))
    print(f"GEMM 8192^3 bf16: SM busy fraction {a.sm_w:.4f}, HBM {a.hbm_bytes_per_s / 1e9:.1f} GB/s "
          f"({hbm_u:.3f} of peak, {hbm_w:.1f} W), calibrated {2 * 8192**3 / k.isolated_s / 1e12:.1f} TFLOPS")
    print(f"power_tensor_reference_clock_fraction: {x_t:.4f}")
    print(f"s(x_t) = {probe.dynamic_scale(x_t):.4f}")
    print(f"power_tensor_w default: {tensor_w:.1f} W")
    gpu40 = load_gpu("a100-sxm4-40gb")
    fp32_w = FP32_STRESS_W - gpu40.power.idle_w
    print(f"power_fp32_w: {fp32_w:.1f} W (ratio to tensor {fp32_w / tensor_w:.3f})")
    tdp_tensor_weight("h100-sxm5-80gb", 1.0)


if __name__ == "__main__":
    main()
