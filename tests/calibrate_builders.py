"""Traces and tables the calibration tests plant parameters in (closed forms of the model the fits
must recover), shared by test_calibrate.py and test_calibrate_power.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ovsim.calibrate import (
    TraceInput,
)
from ovsim.hw.calib import CALIB_DIR, load_calibration
from ovsim.hw.spec import load_gpu
from ovsim.replay import replay
from ovsim.traces.table import TraceBundle, make_table

GPU = "h100-sxm5-80gb"


H100_NAME = "NVIDIA H100 80GB HBM3"


# Planted: a resident LL collective keeps this share of HBM busy, with its 2 blocks (channels): the
# calibration's share is per block.
PRESSURE = 0.35


PRESSURE_PER_BLOCK = PRESSURE / 2


# memory_kernel_efficiency of the shipped H100 calibration: the share of HBM a memory-bound kernel asks.
MEM_EFF = load_calibration(load_gpu(GPU), GPU).params.memory_kernel_efficiency


# kernel_overhead_s of the shipped H100 calibration, in microseconds: the time a kernel moves no data.
OVERHEAD_US = load_calibration(load_gpu(GPU), GPU).params.kernel_overhead_s * 1e6


STREAMING_GRID = 1056


# The newest shipped version of the GPU's calibration file.
SHIPPED = max(int(p.name.split(".v")[-1].removesuffix(".yaml")) for p in CALIB_DIR.glob(f"{GPU}.v*.yaml"))


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    keys = sorted({k for r in rows for k in r})
    return make_table({k: [r.get(k) for r in rows] for k in keys})


def kernel(name: str, start_us: float, dur_us: float, *, stream: int = 7, kind: str = "elementwise",
           grid: int = 4, **extra: Any) -> dict[str, Any]:
    return {"rank": 0, "stream": stream, "name": name, "kind": kind, "start_s": start_us * 1e-6,
            "duration_s": dur_us * 1e-6, "grid_x": grid, "grid_y": 1, "grid_z": 1, "block_x": 128, "block_y": 1,
            "block_z": 1, "registers_per_thread": 32, "shared_mem_bytes": 0, **extra}


def planted_slowdown(need: float, pressure: float) -> float:
    """A streaming kernel needing ``need`` of the HBM channel beside a fixed ``pressure``, by the
    shipped H100 calibration's HBM latency law (docs/design.md), written out here on its own: with
    utilizations of the peak ``x = need * a`` and ``p = pressure * a`` (``a`` the achievable
    fraction), latency ``g(u) = (1 - u / K) ** -Q``, the kernel (all its time waiting on memory)
    slows by ``g(U) / g(x)`` where ``U = x / slowdown + p``; then it gets at most ``1 - pressure``
    of the channel (max-min, the pressure below the fair half)."""
    from scipy.optimize import brentq

    params = load_calibration(load_gpu(GPU), GPU).params
    k, q, a = params.hbm_latency_capacity, params.hbm_latency_exponent, params.hbm_achievable_fraction
    x, p = need * a, pressure * a

    def g(u: float) -> float:
        return float((1 - u / k) ** -q)

    u = brentq(lambda u: u - x * g(x) / g(u) - p, x, x + p)
    rate = min(need * g(x) / g(u), 1 - pressure)
    return need / rate


def contention_trace() -> TraceBundle:
    """A 10 us streaming kernel alone three times, then six times beside an LL all-reduce, each
    slowed as one HBM channel shared with the collective's pressure slows it
    (:func:`planted_slowdown`): the kernel moves data for all but the per-kernel overhead, so over
    its 10 us it needs MEM_EFF x (10 - OVERHEAD) / 10 of the channel, and stretches by the
    slowdown."""
    need = MEM_EFF * (10.0 - OVERHEAD_US) / 10.0
    assert need > 1 - PRESSURE  # so the planted pressure slows it
    slowed = 10.0 * planted_slowdown(need, PRESSURE)
    # 1056 blocks of 4 warps: 8 blocks an SM, one wave beside the collective's blocks, and enough
    # warps in flight to stream at HBM's rate (Little's law, memory_warp_bytes_per_s).
    rows = [kernel("ew", t, 10.0, grid=STREAMING_GRID) for t in (0.0, 20.0, 40.0)]
    rows.append(kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 100.0, 400.0, stream=9, kind="collective", grid=2,
                       collective="all_reduce", protocol="LL", algorithm="ring"))
    rows += [kernel("ew", 110.0 + 40.0 * i, slowed, grid=STREAMING_GRID) for i in range(6)]
    return TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME})


def sm_trace(overlapped_us: float) -> TraceInput:
    """A one-wave GEMM (132 blocks, one per H100 SM) alone three times at 100 us, then five times
    beside an all-reduce whose 16 NCCL blocks take whole SMs (640 threads x 96 registers), measured
    at ``overlapped_us``: 200 us is the second wave those 16 SMs force, 100 us is no SM lost."""
    def gemm(t: float, d: float) -> dict[str, Any]:
        return kernel("gemm", t, d, kind="gemm", grid=132, block_x=256, registers_per_thread=255)

    rows = [gemm(t, 100.0) for t in (0.0, 200.0, 400.0)]
    rows.append(kernel("ncclKernel_AllReduce_RING_SIMPLE_Sum_float", 1000.0, 1800.0, stream=9, kind="collective",
                       grid=16, block_x=640, registers_per_thread=96, collective="all_reduce", protocol="Simple",
                       algorithm="ring"))
    rows += [gemm(1100.0 + 300.0 * i, overlapped_us) for i in range(5)]
    return TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="sm", gpu=GPU)


def planted_gemms(shapes: tuple[tuple[int, int, int, int], ...], eff: float, tile_s: float) -> TraceInput:
    """BF16 GEMMs (M, N, K, grid) timed by the cost model's wave form: t = overhead + waves x
    (blocks_per_sm x flops_per_block / (peak / SMs x eff) + tile_s), at two blocks per SM (256
    threads x 128 registers fill half of the 65,536 registers)."""
    gpu = load_gpu(GPU)
    p = load_calibration(gpu, GPU).params
    per_sm = gpu.peak_flops_per_s("bf16") / gpu.sm.count * eff
    rows = []
    for i, (m, n, k, grid) in enumerate(shapes):
        waves = -(-grid // (gpu.sm.count * 2))
        t = p.kernel_overhead_s + waves * (2 * (2.0 * m * n * k / grid) / per_sm + tile_s)
        row = kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 1e4 * i, t * 1e6, kind="gemm", grid=grid,
                     host_op=f"aten::mm[[{m}, {k}], [{k}, {n}]]")
        rows.append({**row, "block_x": 256, "registers_per_thread": 128})
    return TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="g", gpu=GPU)


def planted_memory(fraction: float, softmax_fraction: float, ko: float | None = None) -> TraceInput:
    """Memory-bound kernels on an H100 timed by the cost model's streaming form, t = overhead +
    bytes / (peak HBM x fraction), bytes counted by hand: bf16 add (two inputs, one output) and
    softmax (one input, one output), all moving more than 2x the 50 MiB L2. Then kernels the fit
    must leave out, each timed 10x too fast to fit anything: one moving less than 2x the L2, two
    launched by one operator call, one beside an all-reduce. The overhead is the shipped one unless
    ``ko`` is given."""
    gpu = load_gpu(GPU)
    ko = load_calibration(gpu, GPU).params.kernel_overhead_s if ko is None else ko
    peak = gpu.memory.bandwidth_bytes_per_s
    rows: list[dict[str, Any]] = []

    def add(n: int, start_us: float, call: int, speed: float = 1.0, f: float = fraction) -> None:
        t_s = ko + 3 * 2 * n / (peak * f) / speed
        rows.append(kernel("add", start_us, t_s * 1e6, host_op=f"aten::add[[{n}], [{n}], []]",
                           host_types="['c10::BFloat16', 'c10::BFloat16', 'Scalar']", host_op_id=call))

    for i, n in enumerate((2**25, 2**26, 2**27)):
        add(n, 1e4 * i, i)
    for i, (r, c) in enumerate(((16384, 4096), (32768, 4096), (8192, 16384))):
        t_s = ko + 2 * 2 * r * c / (peak * softmax_fraction)
        rows.append(kernel("softmax", 1e5 + 1e4 * i, t_s * 1e6, host_op=f"aten::_softmax[[{r}, {c}], [], []]",
                           host_types="['c10::BFloat16', 'Scalar', 'Scalar']", host_op_id=10 + i))
    add(2**20, 2e5, 20, speed=10.0)
    add(2**26, 2.1e5, 21, speed=10.0)
    add(2**26, 2.2e5, 21, speed=10.0)
    add(2**26, 3e5, 30, speed=10.0)
    rows.append(kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 3e5, 1e4, stream=9, kind="collective", grid=2,
                       collective="all_reduce", protocol="LL", algorithm="ring"))
    return TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="m", gpu=GPU)


def tiny_adds(durations_us: list[float], first_call: int = 100, start_us: float = 5e5) -> list[dict[str, Any]]:
    """bf16 adds of 1024 elements (6 KiB: 2 ns at the H100's peak HBM bandwidth), one per
    operator call, timed as given."""
    return [kernel("add", start_us + 100.0 * i, d, host_op="aten::add[[1024], [1024], []]",
                   host_types="['c10::BFloat16', 'c10::BFloat16', 'Scalar']", host_op_id=first_call + i)
            for i, d in enumerate(durations_us)]


def overhead_trace(durations_us: list[float]) -> TraceInput:
    """Tiny adds timed as given, and what the overhead fit must not count: a tiny copy (recorded
    beside it), a tiny add beside an all-reduce, two tiny adds of one operator call, and an add
    moving 6 MiB (2 us at the peak bandwidth), each timed 100 us."""
    rows = tiny_adds(durations_us)
    rows.append(kernel("copy", 1e4, 100.0, host_op="aten::copy_[[1024], [1024], []]",
                       host_types="['c10::BFloat16', 'c10::BFloat16', 'Scalar']", host_op_id=1))
    rows += tiny_adds([100.0], first_call=2, start_us=2e4)
    rows += [{**r, "host_op_id": 3} for r in tiny_adds([100.0, 100.0], start_us=3e4)]
    rows.append(kernel("add", 4e4, 100.0, host_op="aten::add[[1048576], [1048576], []]",
                       host_types="['c10::BFloat16', 'c10::BFloat16', 'Scalar']", host_op_id=4))
    rows.append(kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1.99e4, 500.0, stream=9, kind="collective",
                       grid=2, collective="all_reduce", protocol="LL", algorithm="ring"))
    return TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="o", gpu=GPU)


# Planted power parameters: none of them is a shipped value, so recovering them shows the fit read
# the log, not the calibration it started from.
PLANTED_IDLE_W = 61.0


PLANTED_TENSOR_W = 530.0


PLANTED_MEMORY_W = 140.0


PLANTED_HBM_J_PER_BYTE = 20e-12


WALL_ORIGIN_S = 1_790_000_000.0


def power_trace() -> TraceBundle:
    """One rank on device 3, starting 5 s into the trace's clock: 0.5 s idle, 1 s of back-to-back
    GEMMs, 0.5 s idle, 1 s of wide and 1 s of narrow streaming kernels (different ratios of SM
    slots to HBM traffic, so the memory and HBM weights are told apart), 0.5 s idle."""
    rows: list[dict[str, Any]] = []
    t_us = 5.5e6
    for i in range(10):
        rows.append(kernel(f"gemm{i}", t_us, 1e5, kind="gemm", grid=2160, device=3, block_x=256))
        t_us += 1e5
    t_us += 5e5
    for grid in (4320, 108):
        for i in range(10):
            rows.append(kernel(f"ew{grid}_{i}", t_us, 1e5, grid=grid, device=3))
            t_us += 1e5
    rows.append(kernel("tail", t_us + 5e5, 10.0, device=3))
    df = table(rows)
    df["rank"] = 0
    return TraceBundle(kernels=df, gpu_names={0: "NVIDIA A100-SXM4-80GB"}, wall_origin_s=WALL_ORIGIN_S)


def planted_power(counters: pd.DataFrame, t: Any, hbm_peak: float) -> Any:
    """The planted closed form at simulation times ``t``, at the compute clock (dynamic scale 1):
    idle + tensor x u_tensor + memory x u_memory + HBM energy x bytes/s."""
    import numpy as np

    def at(name: str) -> Any:
        c = counters[(counters["counter"] == name) & (counters["rank"] == 0)].sort_values("time_s", kind="stable")
        tt, v = c["time_s"].to_numpy(float), c["value"].to_numpy(float)
        keep = np.append(tt[1:] != tt[:-1], True)
        tt, v = tt[keep], v[keep]
        return v[np.clip(np.searchsorted(tt, t, side="right") - 1, 0, len(tt) - 1)]

    hbm = np.minimum(at("hbm_bytes_per_s"), hbm_peak)
    return (PLANTED_IDLE_W + PLANTED_TENSOR_W * at("sm_tensor_fraction") + PLANTED_MEMORY_W * at("sm_memory_fraction")
            + PLANTED_HBM_J_PER_BYTE * hbm)


def write_smi_log(path: Path, bundle: TraceBundle, shift_s: float = 0.0) -> None:
    """An nvidia-smi CSV of GPUs 3 (the traced one) and 0 (not traced), a sample every 50 ms from the
    trace's start, stamped in UTC wall time, power from the planted closed form."""
    import datetime as dt

    import numpy as np

    r = replay(bundle, counters=True, power=True)
    gpu = load_gpu("a100-sxm4-80gb")
    trace_t = np.arange(5.0, 9.5, 0.05)
    watts = planted_power(r.timeline.counters, trace_t - r.clock_offset_s, gpu.memory.bandwidth_bytes_per_s)
    lines = ["timestamp, index, power.draw [W], clocks.sm [MHz]"]
    for t, w in zip(trace_t, watts, strict=True):
        stamp = dt.datetime.fromtimestamp(WALL_ORIGIN_S + t + shift_s, dt.UTC).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        lines.append(f"{stamp}, 3, {w:.4f} W, {gpu.clocks.compute_clock_hz / 1e6:.0f} MHz")
        lines.append(f"{stamp}, 0, 400.00 W, 1410 MHz")
    path.write_text("\n".join(lines) + "\n")


def ramp(window_s: float, t: np.ndarray, top: float = 2.0e9, low: float = 1.5e9) -> np.ndarray:
    """A clock that holds until half the window has passed, then falls linearly to ``low`` at the
    full window: a stand-in trajectory whose shape is set by the window alone."""
    x = np.clip((t - 0.5 * window_s) / (0.5 * window_s), 0.0, 1.0)
    return top - (top - low) * x
