"""Fit engine parameters from the calibration harness's measured data sets (calibration/data/) and
write each GPU's next calibration version, with the data set's files and checksums as provenance.

- ``gemm_efficiency`` and ``gemm_tile_overhead_s`` (BF16, FP16, FP8, TF32): from the ``gemm`` part,
  the cuBLAS GEMMs that ran at the top clock (``ovsim.validate.GEMM_AT_TOP_CLOCK``: 1024^3 to
  8192^3), median of 10 repeats; fitted in the frame a scenario prices a GEMM in, the library
  kernel the cost model picks for the shape (``ovsim.calibrate.fit_library_gemm``: least mean
  absolute relative error). They replace the H100's fit on the shared traces (BF16) and the
  published or assumed values (FP8, TF32, and the H200's copy of the H100's).
- ``ce_local_efficiency`` and ``host_link_efficiency``: from the ``copy`` part, a 1 GiB
  device-to-device and host-to-device cudaMemcpyAsync alone (median of 3): the fraction of the
  achievable HBM bandwidth (counting the read and the write) and of the PCIe link's bandwidth the
  copy reached, past the per-kernel overhead ovsim charges it. The copies beside kernels are not
  fitted (calibration/data/README.md says why).
- ``memory_sm_headroom``: from the ``smloss`` part, a streaming add measured alone and beside a
  kernel that holds 8 to 66 SMs and moves no data. With ``h`` of ``S`` SMs held the engine's
  bandwidth-bound kernel runs ``1 / min(1, headroom * (S - h) / S)`` slower; the fit is the
  headroom with the least squared relative error over the held counts.
- ``gemm_load_share``: from the ``smloss`` part of ``ovsim.validate.SMLOSS_LOAD_FIT`` (one data
  set a GPU), cuBLAS's BF16 GEMMs (8192^3, 4096^3, 2048x8192x8192) alone and beside a kernel that
  holds 1 to 66 SMs and moves no data, replayed as ``ovsim validate --measured`` replays them: the
  share with the least MAPE (a grid, then Brent's method between the best point's neighbours). The
  GPU's other smloss data sets, with 12 more GEMM shapes on the H200, are held out.
- ``block_issue_share_per_warp``: from the ``shaping`` part, the median block time of a 4-warp
  GEMM (64x64x32 tiles) with 1 to 6 of its blocks on each SM (the A100s take the H100's, a stated
  assumption: ``SHAPING_CARRIED``). The engine runs a block at
  min(cap, 1 / resident) of its SM against 1 / natural at full residency, so its time with ``n``
  resident is ``(1 / natural) / min(cap, 1 / n)`` of its time at full residency; the fit is the cap
  with the least squared error of the logarithms, divided by the block's warps. A second data set
  of the same GPU, where there is one, is reported against the fit (not fitted on).
- ``power_tensor_saturation_clock_hz``: from the ``clock`` part, cuBLAS GEMMs at the clocks the
  power limit walks them through, each with the SM clock its probes counted; per precision the
  clock ``sat`` for which ``max(sat / f, 1)`` times each experiment's own time at saturation fits
  the durations best (least squares on their logarithm).
- ``memory_kind_clock_share`` (norm, softmax): from the ``clock`` part, the layer norm and softmax
  run at the clocks the limit walks them through, each with its counted SM clock; the share of
  the kernel's time at the compute clock that follows the clock, from ``t = a + b / f``
  (``ovsim.calibrate.fit_clock_share``). A kind is written only where that law halves the RMS
  error of a time that does not follow the clock (``CLOCK_SHARE_MIN_GAIN``): the streaming add's
  does not move with the clock on the H100, and on the H200 the law gains 5%.
- the power parameters (``power_idle_w``, ``power_tensor_w``, ``power_memory_w``,
  ``power_hbm_j_per_byte``): ovsim's least-squares power fit (``ovsim.hw.power.fit_power``) on
  NVML samples after each phase's first second, with the activity the harness knows it ran: the
  ``power`` part's idle, streaming add (memory work, 3 x 2^29 B a launch) and 32 copy channels
  (memory work on 32 SMs, their traffic as the comm part measured it alone), at the clock each
  sample read; and the ``clock`` part's 8192^3 BF16 GEMM at the 700 W limit (tensor work on the
  SMs its kernels kept busy, the cost model's GEMM traffic) at the clock its probes counted, since
  NVML's readings under the limit fall below it. The ``power`` part's GEMM phases are held out:
  ``held_out`` reports them against the fit at NVML's clocks. Then the FP8 and TF32 tensor weights
  (``power_tensor_w.fp8``, ``.tf32``), each from its own clock-part GEMM at its counted clocks with
  every other weight held (``ovsim.hw.power.fit_tensor_weight``).
- ``power_control_window_s`` and ``power_control_period_s``: from the ``clock`` part's five GEMM
  phases, each started after seconds of idleness: the power limit holds the clock at the top for
  tens of milliseconds, then walks it down over about a hundred. The engine, started from an idle
  window, predicts each phase's clock at every measured kernel; the window is the one on a 10 ms
  grid with the least RMS error of the trajectories about their own steady clocks
  (``ovsim.calibrate.fit_control_window``). The period is not resolved by the data (see
  ``CONTROL_PERIOD_S``).
- the H200's memory-bound kernel parameters (``hbm_achievable_fraction``, ``memory_kernel_efficiency``,
  ``memory_kind_efficiency``): ``ovsim calibrate``'s memory fit on the clean instances of the
  ``overlap`` part's add, layer norm and softmax (the H200 had no trace to fit them on; the H100's
  come from the shared traces, with many more shapes, and stay).
- ``hbm_latency_capacity``, ``hbm_latency_exponent`` and ``hbm_latency_collective_wait``: from
  the ``overlap`` part, the streaming add, layer norm and softmax alone and beside one copy or
  reduce loop (``ovsim.validate.hbm_sharing_points``): each kernel's utilization of the HBM peak
  alone, the share of the victim's time that waits on memory (1 - its kind's clock share, fitted
  above), and both slowdowns beside each other (the loop's from its bytes less what it moved alone
  at the comm part's pace). The law (``ovsim.engine.channel.latency_slowdowns``) is fitted by
  differential evolution on the victims' relative errors plus 0.3 times the loops'. Each GPU on
  its first data set; ``ovsim validate --measured`` holds another board of each out to judge it.
- the contention parameters (``nccl_memory_pressure``, ``replay_hbm_fraction``,
  ``replay_collective_sm_fraction``): ``ovsim calibrate``'s contention fit on every experiment of
  the ``overlap`` part (GEMMs and memory-bound kernels alone and beside communication-like
  kernels). Their held-out errors (leave one victim kernel out, and another GPU) are
  ``ovsim validate --measured``'s rows.

    python calibration/harness/fit_measured.py [--dry-run]

A GPU whose newest calibration file already holds the fitted values gets no new file.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from analysis import profiled_window
from scipy.optimize import differential_evolution, minimize_scalar

from ovsim.calibrate import (
    FitReport,
    calibrate,
    fit_clock_share,
    fit_control_window,
    fit_library_gemm,
    trace_input,
    write_shipped,
)
from ovsim.engine.channel import latency_slowdowns
from ovsim.hw.calib import load_calibration
from ovsim.hw.power import FIT_COLUMNS, fit_power, fit_table_power_w, fit_tensor_weight, power_model
from ovsim.hw.spec import gpu_file, load_gpu
from ovsim.models.cost import element_bytes
from ovsim.traces.load import read_table
from ovsim.traces.power import read_power_samples
from ovsim.validate import (
    CLOCK_MEMORY_KINDS,
    CLOCK_STEADY_HZ,
    GEMM_AT_TOP_CLOCK,
    HARNESS_CHANNEL_PASS_BYTES,
    HARNESS_MEMORY_VICTIM_KIND,
    HARNESS_SM_FRACTION,
    MEASURED_COPY,
    MEASURED_GEMM,
    MEASURED_GEMM_PRECISIONS,
    MEASURED_HBM,
    SMLOSS_LOAD_FIT,
    channel_pass_s,
    clock_memory_points,
    harness_experiments,
    harness_power_log,
    hbm_sharing_points,
    measured_copy_times,
    measured_gemm_points,
    smloss_bundle,
    smloss_scored,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibration" / "data"
COMMAND = "python calibration/harness/fit_measured.py"
# The data sets each GPU's fits read (folders under calibration/data/).
SMLOSS = {"h100-sxm5-80gb": "h100-sxm5-80gb/2026-11-26-b", "h200-sxm": "h200-sxm/2026-11-26-b"}
# (fitted on, held out or None)
SHAPING = {"h100-sxm5-80gb": ("h100-sxm5-80gb/2026-11-26", "h100-sxm5-80gb/2026-11-26-repeat"),
           "h200-sxm": ("h200-sxm/2026-11-26", None)}
HEADROOM_BOUNDS = (1.0, 16.0)
# gemm_load_share: searched on this grid, then refined between the best point's neighbours.
LOAD_SHARE_GRID = tuple(round(0.05 * i, 2) for i in range(13))
SHAPED_WARPS = 4  # ovsim_gemm_tile64: 128 threads
# GPUs the harness has not measured take the H100's per-warp issue share, as a stated assumption:
# an Ampere SM issues from the same four sub-partitions, one warp scheduler each, so a 4-warp block
# alone on it has every scheduler too; its tensor cores peak at half the H100's dense work a clock
# (312 TFLOPS on 108 SMs at 1.41 GHz: 2,048 FLOPs an SM a clock; the H100 989 on 132 at 1.83:
# 4,096), so fewer warps keep them busy and the H100's share is if anything low for it. The assumption
# it replaces (a block never faster than at full residency) is the one both measured GPUs refute.
SHAPING_CARRIED = {"a100-sxm4-80gb": "h100-sxm5-80gb", "a100-sxm4-40gb": "h100-sxm5-80gb"}
OVERLAP = {"h100-sxm5-80gb": "h100-sxm5-80gb/2026-11-26"}
# HBM's latency law: each GPU's is fitted on its first data set of ovsim.validate.MEASURED_HBM, the
# other boards held out to judge it.
# The loops' slowdown counts less than the victims' in the loss: it is a difference of two large
# byte counts (the loop's total less what it moved alone), so noisier.
HBM_LOOP_WEIGHT = 0.3
# At the exponent's upper end (1 - U/K)^-Q is close to exp(Q U / K) over the utilizations
# measured: a fit there (the H200's) has found that exponential form, which a wider bound would
# move little.
HBM_LATENCY_BOUNDS = ((1.05, 10.0), (0.1, 20.0), (0.0, 1.0))
NCCL_PROTOCOLS = ("ll", "ll128", "simple")
MEMORY = {"h200-sxm": "h200-sxm/2026-11-26"}
MEMORY_VICTIMS = ("add_bf16_256M", "layernorm_bf16_16384x8192", "softmax_bf16_16384x8192")
# (power data set, data set whose comm part gives the 32 channels' traffic)
POWER = {"h100-sxm5-80gb": ("h100-sxm5-80gb/2026-11-26-b", "h100-sxm5-80gb/2026-11-26"),
         "h200-sxm": ("h200-sxm/2026-11-26", "h200-sxm/2026-11-26")}
# One board's power and clock parts with the GEMM-share alternations, and the comm set as above:
# what voltage_report fits the voltage floor on.
VOLTAGE = {"h100-sxm5-80gb": ("h100-sxm5-80gb/2026-11-26-e", "h100-sxm5-80gb/2026-11-26"),
           "h200-sxm": ("h200-sxm/2026-11-26-d", "h200-sxm/2026-11-26")}
# The clock part's alternations of the 8192^3 BF16 GEMM with the streaming add: the GEMM at
# clocks from the limit's (~1500 MHz) to the top, which places the voltage curve there. The ~55%
# one (the first the harness ran) is held out.
SHARE_PHASES = tuple(f"add_bf16_256M__gemm_share_{p}" for p in (10, 25, 75, 90))
SHARE_HELD_OUT = "add_bf16_256M__after_gemm"
# The GEMM phases are held out: NVML's clock readings under the power limit fall up to 9% below
# the clock the SMs count (the clock part), so the tensor weight is fitted on the clock part's
# GEMM phase at its counted clocks instead (``clock_power_rows``).
POWER_FITTED = ("idle", "add_bf16_256M", "channel_copy_32")
POWER_HELD_OUT = ("gemm_bf16_8192", "gemm_tf32_8192", "gemm_fp8_8192", "gemm_bf16_8192__channel_copy_32")
# Phases recorded before the harness fixed its power loop (calibration/data/README.md): not used.
POWER_DEFECTIVE = {"h200-sxm/2026-11-26": ("gemm_bf16_8192__channel_copy_32",)}
POWER_SETTLE_S = 1.0  # the first second of a phase: the clock and the sensor settling
# Idle power at the minimum SM clock, held in the power fits: the H100 spec's idle (public nvidia-smi
# -q dumps of 700 W Hopper SXM boards idling at 345 MHz), carried to the H200 (the same GH100 die
# on a 700 W SXM board; the H200 spec's idle names no clock). The idle the harness measured is at
# the top clock, 1980 MHz, where an idle board sits after work.
IDLE_MIN_CLOCK_GPU = "h100-sxm5-80gb"
# Data sets of the ``clock`` part: each kernel with the SM clock its probes counted.
CLOCK = {"h100-sxm5-80gb": "h100-sxm5-80gb/2026-11-26-d", "h200-sxm": "h200-sxm/2026-11-26-c"}
# The clock part's GEMM phase that stands in for the power part's when the power weights are
# fitted at counted clocks (the power part's GEMM phases have only NVML's clock readings).
CLOCK_POWER_PHASE = "gemm_bf16_8192x8192x8192"
# A memory kind's clock share is written only where t = a + b/f cuts the RMS relative error of a
# time that does not follow the clock by at least this factor.
CLOCK_SHARE_MIN_GAIN = 2.0
# The clock part's other GEMMs, each fitting its precision's own tensor weight with the rest held.
CLOCK_PRECISION_PHASES = {"fp8": "gemm_fp8_8192x8192x8192", "tf32": "gemm_tf32_8192x8192x8192"}
# The clock part's GEMM phases the power-limit loop's window is fitted on (all start from idle).
CONTROL_PHASES = {f"gemm_{p}_{m}x{n}x{k}": {"kind": "gemm", "m": m, "n": n, "k": k, "precision": p}
                  for p, m, n, k in (("bf16", 8192, 8192, 8192), ("bf16", 4096, 4096, 4096),
                                     ("bf16", 2048, 8192, 8192), ("fp8", 8192, 8192, 8192),
                                     ("tf32", 8192, 8192, 8192))}
CONTROL_HORIZON_S = 0.45  # a phase's first kernels: the walk down and a steady stretch after it
CONTROL_STEADY_FROM_S = 0.3  # where each trajectory's steady level is taken
CONTROL_WINDOWS_S = tuple(x / 1000 for x in range(10, 210, 10))
# The probes count the clock every ~5 ms (a group of kernels apart), and the clock changes no more
# often than that, so the data bound the loop's period from above only; with the window refitted,
# periods of 2 to 10 ms change the fit's error by under 3% on the H100.
CONTROL_PERIOD_S = 0.005
# The streaming add's traffic a launch: two BF16 inputs of 2^28 elements read, one written.
ADD_BYTES = 3 * 2**29
# Compulsory HBM traffic of an 8192^3 GEMM, in elements: A and B read, C written.
GEMM_8192_ELEMENTS = 2 * (2 * 8192 * 8192) + 8192 * 8192


def smloss_points(folder: Path, victim: str) -> list[tuple[int, float]]:
    """(SMs held, measured slowdown) of ``victim`` in a data set's smloss part."""
    summary = json.loads((folder / "summary.json").read_text())
    held = {label: e["held_sms"] for label, e in harness_experiments(folder).items() if e.get("part") == "smloss"}
    return sorted((held[r["experiment"]], float(r["slowdown"])) for r in summary.get("slowdowns", [])
                  if r["part"] == "smloss" and r["experiment"].startswith(victim + "__"))


def headroom_slowdown(headroom: float, held: np.ndarray, sms: int) -> np.ndarray:
    return np.asarray(1.0 / np.minimum(1.0, headroom * (sms - held) / sms))


def fit_headroom(points: list[tuple[int, float]], sms: int) -> dict[str, Any]:
    held = np.array([h for h, _ in points], dtype=float)
    measured = np.array([s for _, s in points])

    def loss(h: float) -> float:
        return float(np.sum(((headroom_slowdown(h, held, sms) - measured) / measured) ** 2))

    # The loss is flat wherever no held count binds: a grid finds the basin, Brent's method refines it.
    grid = np.linspace(*HEADROOM_BOUNDS, 1501)
    i = int(np.argmin([loss(h) for h in grid]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best = float(minimize_scalar(loss, bounds=(lo, hi), method="bounded").x)
    fitted = headroom_slowdown(best, held, sms)
    return {"value": round(best, 3), "points": len(points), "held_sms": held.astype(int).tolist(),
            "measured_slowdown": measured.round(4).tolist(), "fitted_slowdown": fitted.round(4).tolist(),
            "fit_mape_pct": round(float(np.mean(np.abs(fitted - measured) / measured) * 100), 2)}


def load_share_report(gpu: str) -> tuple[FitReport, list[Path]]:
    """``gemm_load_share`` from the smloss part of ``SMLOSS_LOAD_FIT[gpu]``: cuBLAS's GEMMs replayed
    beside the kernel that holds 1 to 66 SMs and moves no data, as ``ovsim validate --measured``
    replays them; the share with the least MAPE over every GEMM that ran beside the hold."""
    rel = SMLOSS_LOAD_FIT[gpu]
    folder = DATA / rel
    tables = sorted((folder / "tables" / "smloss").glob("gemm_*.parquet"))
    if not tables:
        raise SystemExit(f"{gpu}: {folder}: no smloss GEMM tables to fit gemm_load_share on")
    held = {label: int(e["held_sms"]) for label, e in harness_experiments(folder).items()
            if e.get("part") == "smloss"}
    bundles = [smloss_bundle(t) for t in tables]

    def ratios(share: float) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        out = []
        for b in bundles:
            a, c, d = (np.asarray(x, dtype=float) for x in smloss_scored(b, gpu, {"gemm_load_share": share}))
            out.append((a, c, d))
        return out

    def pooled_mape(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> float:
        meas = np.concatenate([r[0] for r in rows])
        pred = np.concatenate([r[1] for r in rows])
        return float(np.mean(np.abs(pred - meas) / meas) * 100)

    def mape(share: float) -> float:
        return pooled_mape(ratios(share))

    # The loss is a sum of kinks (rounds of tiles): a grid finds the basin, Brent's method refines it.
    grid = [mape(x) for x in LOAD_SHARE_GRID]
    i = int(np.argmin(grid))
    lo, hi = LOAD_SHARE_GRID[max(i - 1, 0)], LOAD_SHARE_GRID[min(i + 1, len(LOAD_SHARE_GRID) - 1)]
    best = round(float(minimize_scalar(mape, bounds=(lo, hi), method="bounded", options={"xatol": 1e-3}).x), 3)
    at_best, at_zero = ratios(best), ratios(0.0)
    per = [{"experiment": t.stem, "held_sms": held.get(t.stem),
            "measured_slowdown": round(float(np.median(m / iso)), 4),
            "fitted_slowdown": round(float(np.median(p / iso)), 4),
            "slowdown_without": round(float(np.median(p0 / iso)), 4)}
           for t, (m, p, iso), (_, p0, _) in zip(tables, at_best, at_zero, strict=True) if len(m)]
    record = {"method": "grid then bounded scalar search for the least MAPE of the replayed GEMMs (ovsim.validate."
                        "smloss_scored with gemm_load_share set)", "data_set": f"calibration/data/{rel}",
              "value": best, "points": int(sum(len(m) for m, _, _ in at_best)),
              "fit_mape_pct": round(pooled_mape(at_best), 2), "mape_without_pct": round(pooled_mape(at_zero), 2),
              "grid": dict(zip(map(str, LOAD_SHARE_GRID), (round(g, 2) for g in grid), strict=True)),
              "experiments": per}
    report = FitReport(
        parameters={"gemm_load_share": best},
        sources={"gemm_load_share": (
            f"measured: calibration/data/{rel} (smloss part: cuBLAS's BF16 GEMMs alone and beside "
            f"{', '.join(map(str, sorted(set(held.values()))))} SMs held without traffic), least MAPE of their "
            f"replay; {COMMAND}")},
        fits={"gemm_load_share": record})
    return report, tables


def shaping_points(folder: Path) -> list[tuple[int, float]]:
    """(blocks per SM, median block time) of the shaped GEMM alone, by the experiment's target."""
    target = {label: e["blocks_per_sm_target"] for label, e in harness_experiments(folder).items()
              if e.get("part") == "shaping" and "priority" not in e}
    summary = json.loads((folder / "summary.json").read_text())
    return sorted((int(target[r["experiment"]]), float(r["block_s_median"]))
                  for r in summary.get("shaping_residency", []) if r["experiment"] in target)


def shaped_time_ratio(cap: float, resident: np.ndarray, natural: int) -> np.ndarray:
    """Block time with ``resident`` blocks on its SM over its time at the natural occupancy."""
    return np.asarray((1.0 / natural) / np.maximum(1.0 / natural, np.minimum(cap, 1.0 / resident)))


def fit_issue_cap(points: list[tuple[int, float]]) -> tuple[float, dict[str, Any]]:
    natural = max(n for n, _ in points)
    full = dict(points)[natural]
    resident = np.array([n for n, _ in points], dtype=float)
    measured = np.array([t / full for _, t in points])

    def loss(cap: float) -> float:
        return float(np.sum(np.log(shaped_time_ratio(cap, resident, natural) / measured) ** 2))

    cap = float(minimize_scalar(loss, bounds=(1.0 / natural, 1.0), method="bounded").x)
    fitted = shaped_time_ratio(cap, resident, natural)
    return cap, {"natural_blocks_per_sm": natural, "resident": resident.astype(int).tolist(),
                 "measured_time_ratio": measured.round(4).tolist(), "fitted_time_ratio": fitted.round(4).tolist(),
                 "fit_mape_pct": round(float(np.mean(np.abs(fitted - measured) / measured) * 100), 2)}


def issue_cap_report(gpu: str) -> tuple[FitReport, list[Path]]:
    fit_on, held_out = SHAPING[gpu]
    cap, fit = fit_issue_cap(shaping_points(DATA / fit_on))
    per_warp = round(cap / SHAPED_WARPS, 4)
    record: dict[str, Any] = {
        "method": "bounded scalar least squares on log block-time ratios of (1/natural)/min(cap, 1/resident), "
                  f"per warp = cap / {SHAPED_WARPS}", "data_set": f"calibration/data/{fit_on}",
        "cap": round(cap, 4), **fit}
    if held_out is not None:
        pts = shaping_points(DATA / held_out)
        natural = max(n for n, _ in pts)
        full = dict(pts)[natural]
        measured = np.array([t / full for _, t in pts])
        pred = shaped_time_ratio(per_warp * SHAPED_WARPS, np.array([n for n, _ in pts], dtype=float), natural)
        record["held_out"] = {
            "data_set": f"calibration/data/{held_out}", "measured_time_ratio": measured.round(4).tolist(),
            "predicted_time_ratio": pred.round(4).tolist(),
            "mape_pct": round(float(np.mean(np.abs(pred - measured) / measured) * 100), 2)}
    report = FitReport(
        parameters={"block_issue_share_per_warp": per_warp},
        sources={"block_issue_share_per_warp": (
            f"measured: calibration/data/{fit_on} (shaping part: a 4-warp WMMA GEMM, 64x64x32 tiles, with 1 to its "
            f"natural 6 blocks per SM), least squares on the block times; {COMMAND}")},
        fits={"block_issue_share_per_warp": record})
    tables = sorted((DATA / fit_on / "tables" / "shaping").glob("gemm64_*_occ?.parquet"))
    return report, tables


def _phase_window(folder: Path, phase: str) -> tuple[float, float, list[dict[str, Any]]] | None:
    """(start, end) on the wall clock of a power phase's profiled activity, and its kernels (each
    with ``name`` and ``dur`` in microseconds, as Kineto writes them): from the raw trace where the
    data set kept it, else from the span ingest recorded (``windows.json``) and the kernel table.
    None when the data set has neither."""
    raw = folder / "raw" / "power" / f"{phase}.json.gz"
    if raw.is_file():
        doc = json.loads(gzip.decompress(raw.read_bytes()))
        start, end = profiled_window(doc)
        return start, end, [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    spans = folder / "windows.json"
    table = folder / "tables" / "power" / f"{phase}.parquet"
    key = f"power/{phase}"
    if not spans.is_file() or not table.is_file():
        return None
    windows = json.loads(spans.read_text())
    if key not in windows:
        return None
    k = read_table(table).kernels
    k = k[~k["kind"].isin(("memset", "memcpy"))]
    start, end = windows[key]
    return float(start), float(end), [{"name": n, "dur": d * 1e6} for n, d in zip(k["name"], k["duration_s"],
                                                                                    strict=True)]


def _power_log(folder: Path) -> Path:
    log = harness_power_log(folder)
    if log is None:
        raise SystemExit(f"{folder}: no power.csv or power.csv.gz")
    return log


def _busy(kernels: list[dict[str, Any]], start_s: float, end_s: float, name: str) -> tuple[float, float]:
    """(share of the window kernels named ``name`` ran, their median duration)."""
    ks = [e for e in kernels if name in e["name"]]
    if not ks:
        return 0.0, float("nan")
    busy = min(1.0, sum(e["dur"] for e in ks) / 1e6 / (end_s - start_s))
    return busy, float(np.median([e["dur"] for e in ks])) / 1e6


def _main_kernel(points: pd.DataFrame) -> pd.DataFrame:
    """The rows of the most frequent kernel: a clock experiment's victim (the rest are PyTorch's)."""
    main: pd.DataFrame = points[points["name"] == points["name"].value_counts().index[0]]
    return main


def power_table(gpu: str, rel: str, comm_rel: str, phases: tuple[str, ...]) -> pd.DataFrame | None:
    """One row per NVML sample in each phase's window (less its first second): measured power and
    clock, and the activity the harness ran (``ovsim.hw.power.FIT_COLUMNS``)."""
    folder = DATA / rel
    spec = load_gpu(gpu)
    sms = spec.sm.count
    log = read_power_samples(_power_log(folder))  # wall_time_s: UTC
    t = log["wall_time_s"]
    # Each pass of the 32 copy loops reads and writes the buffer once.
    channel_bps = 2 * HARNESS_CHANNEL_PASS_BYTES / channel_pass_s(DATA / comm_rel)[("copy", 32)]
    rows = []
    for phase in phases:
        window = _phase_window(folder, phase)
        if window is None or phase in POWER_DEFECTIVE.get(rel, ()):
            continue
        start, end, kernels = window
        act = dict.fromkeys(FIT_COLUMNS[2:], 0.0)
        if phase.startswith("gemm_"):
            prec = phase.split("_")[1]
            busy, dur = _busy(kernels, start, end, "gemm" if prec == "tf32" else "nvjet")
            gemm_bps = element_bytes(prec) * GEMM_8192_ELEMENTS / dur if busy else 0.0
            held = 32 / sms if "channel" in phase else 0.0
            act["sm_tensor_fraction"] = busy * (1 - held)
            act["sm_memory_fraction"] = held
            act["hbm_bytes_per_s"] = busy * gemm_bps + (channel_bps if held else 0.0)
        elif phase.startswith("add_"):
            busy, dur = _busy(kernels, start, end, "elementwise")
            act["sm_memory_fraction"] = busy
            act["hbm_bytes_per_s"] = busy * ADD_BYTES / dur
        elif phase.startswith("channel_"):
            act["sm_memory_fraction"] = 32 / sms
            act["hbm_bytes_per_s"] = channel_bps
        sel = (t > start + POWER_SETTLE_S) & (t < end)
        rows.append(pd.DataFrame({"phase": phase, "power_w": log.loc[sel, "power_w"].to_numpy(float),
                                  "sm_clock_hz": log.loc[sel, "sm_clock_hz"].to_numpy(float), **act}))
    return pd.concat(rows, ignore_index=True) if rows else None


def clock_points_of(rel: str) -> pd.DataFrame:
    """The clock part's GEMM kernels (the most frequent kernel of each ``gemm_*`` experiment) that
    ran at a steady clock, with their precision."""
    pts = pd.read_parquet(DATA / rel / "clock.parquet")
    pts = pts[pts["experiment"].str.startswith("gemm_") & (pts["clock_step_hz"] < CLOCK_STEADY_HZ)]
    out = []
    for exp, g in pts.groupby("experiment", sort=True):
        out.append(_main_kernel(g).assign(precision=str(exp).split("_")[1]))
    return pd.concat(out, ignore_index=True)


def saturating_time(sat_hz: float, clock_hz: np.ndarray) -> np.ndarray:
    """A saturating kernel's time at each clock, relative to its time at or above saturation."""
    return np.maximum(sat_hz / clock_hz, 1.0)


def fit_saturation(points: pd.DataFrame) -> dict[str, Any]:
    """The saturation clock shared by the experiments in ``points`` (each its own time at
    saturation), least squares on the logarithm of the durations."""
    groups = [(g["sm_clock_hz"].to_numpy(float), np.log(g["duration_s"].to_numpy(float)))
              for _, g in points.groupby("experiment", sort=True)]

    def loss(sat: float) -> float:
        err = 0.0
        for clk, logt in groups:
            r = logt - np.log(saturating_time(sat, clk))
            err += float(((r - r.mean()) ** 2).sum())  # each experiment's own time at saturation
        return err

    lo, hi = float(points["sm_clock_hz"].min()), float(points["sm_clock_hz"].max())
    res = minimize_scalar(loss, bounds=(lo, 1.25 * hi), method="bounded", options={"xatol": 1e5})
    sat = float(res.x)
    n = sum(len(c) for c, _ in groups)
    rms = float(np.sqrt(loss(sat) / n))
    # Against the law without saturation (time in proportion to 1 / clock), on the same points.
    rms_prop = float(np.sqrt(loss(1e30) / n))
    return {"value_hz": round(sat, -6), "points": n, "experiments": sorted(points["experiment"].unique()),
            "clock_mhz_range": [round(lo / 1e6), round(hi / 1e6)], "rms_log_residual": round(rms, 4),
            "rms_log_residual_if_time_followed_the_clock": round(rms_prop, 4)}


def gemm_report(gpu: str, rel: str) -> tuple[FitReport, list[Path]]:
    """The GEMM efficiency and time per wave of every precision the data set holds, fitted in the
    scenario's frame on the GEMMs that ran at the top clock."""
    g = load_gpu(gpu)
    params = load_calibration(g, gpu_file(gpu).stem).params
    effs: dict[str, float] = {}
    tiles: dict[str, float] = {}
    fits: dict[str, Any] = {}
    for prec in MEASURED_GEMM_PRECISIONS:
        pts = measured_gemm_points(DATA / rel, prec)
        if not pts:
            continue
        effs[prec], tiles[prec], err = fit_library_gemm(pts, prec, g, params)
        fits[prec] = {"points": len(pts), "shapes": [f"{m}x{n}x{k}" for m, n, k, _, _ in pts],
                      "measured_median_s": [t for *_, t in pts], "fit_mape_pct": round(err * 100, 2)}
    shapes = ", ".join(f"{m}^3" for m, _, _ in GEMM_AT_TOP_CLOCK)
    src = (f"measured: calibration/data/{rel} (gemm part: cuBLAS GEMMs alone at the top clock, {shapes}, median "
           f"of 10 repeats), fitted through the library kernel the cost model picks for each shape "
           f"(ovsim.calibrate.fit_library_gemm); {COMMAND}")
    report = FitReport(parameters={"gemm_efficiency": effs, "gemm_tile_overhead_s": tiles},
                       sources={"gemm_efficiency": src, "gemm_tile_overhead_s": src},
                       fits={"gemm": {"method": "least mean absolute relative error (Powell, bounded, three starts) of "
                                                "ovsim.models.gemm_library.best_gemm against the median measured time",
                                      "data_set": f"calibration/data/{rel}", "precisions": fits}})
    tables = [DATA / rel / "tables" / "gemm" / f"gemm_{prec}_{m}x{n}x{k}.parquet"
              for prec, f in fits.items() for m, n, k in (map(int, s.split("x")) for s in f["shapes"])]
    return report, tables


def copy_report(gpu: str, rel: str) -> tuple[FitReport, list[Path]]:
    """The copy efficiencies from the copy part's copies alone."""
    g = load_gpu(gpu)
    params = load_calibration(g, gpu_file(gpu).stem).params
    times = measured_copy_times(DATA / rel)
    values: dict[str, float] = {}
    fits: dict[str, Any] = {}
    for direction, (size, t_s) in times.items():
        rate = size / (t_s - params.kernel_overhead_s)
        if direction == "d2d":
            key, peak = "ce_local_efficiency", g.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction / 2
        else:
            key, peak = "host_link_efficiency", g.pcie.bandwidth_bytes_per_s
        values[key] = round(min(1.0, rate / peak), 3)
        fits[key] = {"direction": direction, "bytes": size, "median_s": t_s, "bytes_per_s": round(rate),
                     "model_peak_bytes_per_s": peak}
    src = (f"measured: calibration/data/{rel} (copy part: a 1 GiB cudaMemcpyAsync alone, median of 3), its rate "
           f"past kernel_overhead_s over the model's peak (achievable HBM bandwidth / 2 for a device-local copy, "
           f"the PCIe link for a host copy); {COMMAND}")
    report = FitReport(parameters=values, sources=dict.fromkeys(values, src),
                       fits={"copies": {"data_set": f"calibration/data/{rel}", **fits}})
    return report, [DATA / rel / "tables" / "copy" / f"{d}_alone.parquet" for d in times]


def clock_report(gpu: str) -> tuple[FitReport, list[Path]]:
    rel = CLOCK[gpu]
    pts = clock_points_of(rel)
    fits = {str(prec): fit_saturation(g) for prec, g in pts.groupby("precision", sort=True)}
    values = {prec: f["value_hz"] for prec, f in fits.items()}
    notes = ""
    if "bf16" in values and "fp16" not in values:
        # Not measured: FP16 runs the same tensor-core rate and operand width as BF16.
        values["fp16"] = values["bf16"]
        notes = "; fp16: BF16's, not measured (the same tensor-core rate and operand width)"
    src = (f"measured: calibration/data/{rel} (clock part: cuBLAS GEMMs run from a cool start down to the 700 W "
           f"limit's clocks, each at the SM clock its probes counted), per precision the clock above which time "
           f"stops falling, max(sat/f, 1) fitted in log least squares{notes}; {COMMAND}")
    report = FitReport(parameters={"power_tensor_saturation_clock_hz": values},
                       sources={"power_tensor_saturation_clock_hz": src},
                       fits={"power_tensor_saturation_clock_hz": {
                           "method": "bounded scalar least squares on log duration; each experiment's time at "
                                     "saturation free", "data_set": f"calibration/data/{rel}", **fits}})
    tables = sorted(DATA / rel / "tables" / "clock" / f"{e}.parquet" for e in pts["experiment"].unique())
    return report, tables


def clock_share_report(gpu: str) -> tuple[FitReport, list[Path]]:
    rel = CLOCK[gpu]
    ref = load_gpu(gpu).clocks.compute_clock_hz
    fits = {kind: fit_clock_share(clk, dur, ref) for kind, (clk, dur) in clock_memory_points(DATA / rel).items()}
    for f in fits.values():
        f["written"] = (f["rms_relative_residual_if_time_did_not_follow_the_clock"]
                        >= CLOCK_SHARE_MIN_GAIN * f["rms_relative_residual"])
    values = {kind: round(f["share"], 3) for kind, f in fits.items() if f["written"]}
    left = sorted(set(fits) - set(values))
    src = (f"measured: calibration/data/{rel} (clock part: the layer norm and softmax, BF16 16384x8192, run from a "
           f"cool start down to the 700 W limit's clocks, each at the SM clock its probes counted), t = a + b/f by "
           f"non-negative least squares on relative error, share (b/f)/(a + b/f) at the compute clock "
           f"{ref / 1e6:.0f} MHz" + (f"; {', '.join(left)} not written: the law does not halve the error of a time "
                                     f"that does not follow the clock" if left else "") + f"; {COMMAND}")
    report = FitReport(parameters={"memory_kind_clock_share": values}, sources={"memory_kind_clock_share": src},
                       fits={"memory_kind_clock_share": {
                           "method": "scipy.optimize.nnls on t = a + b/f, rows divided by t", "data_set":
                           f"calibration/data/{rel}", "reference_clock_hz": ref,
                           **{k: {x: (round(y, 5) if isinstance(y, float) else y) for x, y in f.items()}
                              for k, f in fits.items()}}})
    prefixes = [p for p, k in CLOCK_MEMORY_KINDS.items() if k in values]
    tables = sorted(t for t in (DATA / rel / "tables" / "clock").glob("*.parquet")
                    if any(t.name.startswith(p) for p in prefixes))
    return report, tables


def _clock_phase_samples(rel: str, phase: str) -> tuple[pd.DataFrame, float, np.ndarray, np.ndarray]:
    """A clock-part phase's kernels (with their counted clocks), the span its probes cover, and
    its NVML power samples after the first second with the SM clock of the first probe whose
    middle is not before each on the global timer (UTC, as NVML's timestamps are)."""
    folder = DATA / rel
    probes = pd.read_parquet(folder / "probes.parquet")
    probes = probes[probes["experiment"] == phase]
    pts = pd.read_parquet(folder / "clock.parquet")
    pts = pts[pts["experiment"] == phase]
    start_s, end_s = probes["start_ns"].min() * 1e-9, probes["end_ns"].max() * 1e-9
    log = read_power_samples(_power_log(folder))  # wall_time_s: UTC
    t = log["wall_time_s"].to_numpy(float)
    sel = (t > start_s + POWER_SETTLE_S) & (t < end_s)
    mid = ((probes["start_ns"] + probes["end_ns"]) * 0.5e-9).to_numpy()
    following = np.clip(np.searchsorted(mid, t[sel]), 0, len(mid) - 1)
    clock = probes["sm_clock_hz"].to_numpy(float)[following]
    return pts, float(end_s - start_s), log.loc[sel, "power_w"].to_numpy(float), clock


def clock_power_rows(rel: str, phase: str = CLOCK_POWER_PHASE) -> pd.DataFrame:
    """Power-fit rows (``FIT_COLUMNS``) from one of the clock part's 8192^3 GEMM phases: each NVML
    sample after its first second, at the SM clock of the first probe whose middle is not before
    it on the global timer (UTC, as NVML's timestamps are), the GEMMs' share of the phase as
    tensor work and the cost model's GEMM traffic (its element size) as HBM traffic."""
    pts, span_s, power_w, clock = _clock_phase_samples(rel, phase)
    gemm = _main_kernel(pts)
    busy = min(1.0, float(gemm["duration_s"].sum()) / span_s)
    eb = element_bytes(phase.split("_")[1])
    gemm_bps = eb * GEMM_8192_ELEMENTS / float(gemm["duration_s"].median())
    return pd.DataFrame({"phase": f"clock:{phase}", "power_w": power_w,
                         "sm_clock_hz": clock, "sm_tensor_fraction": busy, "sm_fp32_fraction": 0.0,
                         "sm_memory_fraction": 0.0, "hbm_bytes_per_s": busy * gemm_bps, "link_bytes_per_s": 0.0})


def share_power_rows(rel: str, phase: str) -> pd.DataFrame:
    """Power-fit rows (``FIT_COLUMNS``) from one of the clock part's alternations of the 8192^3 BF16
    GEMM with the streaming add (``add_bf16_256M__gemm_share_NN``, ``add_bf16_256M__after_gemm``):
    each NVML sample after its first second at the SM clock of the next probe (as
    ``clock_power_rows``), with the phase's mean activity: each kernel's share of the phase's span
    as tensor or memory work, and each one's traffic (the GEMM's compulsory bytes, the add's two
    reads and one write) over its own median time, times that share, as HBM traffic. The cycles
    (at most 15 ms) are shorter than the power loop's window, so the clock holds across them."""
    pts, span_s, power_w, clock = _clock_phase_samples(rel, phase)
    gemm = pts[pts["name"].str.contains("nvjet")]
    add = pts[pts["name"].str.contains("elementwise")]
    gemm_share = float(gemm["duration_s"].sum()) / span_s
    add_share = float(add["duration_s"].sum()) / span_s
    gemm_bps = element_bytes("bf16") * GEMM_8192_ELEMENTS / float(gemm["duration_s"].median())
    add_bps = ADD_BYTES / float(add["duration_s"].median())
    return pd.DataFrame({"phase": f"clock:{phase}", "power_w": power_w,
                         "sm_clock_hz": clock, "sm_tensor_fraction": gemm_share, "sm_fp32_fraction": 0.0,
                         "sm_memory_fraction": add_share,
                         "hbm_bytes_per_s": gemm_share * gemm_bps + add_share * add_bps, "link_bytes_per_s": 0.0})


def _idle_min_clock(gpu: str) -> tuple[dict[str, Any], str]:
    """The minimum-clock idle the power fits hold (``IDLE_MIN_CLOCK_GPU``), and its source."""
    w = load_gpu(IDLE_MIN_CLOCK_GPU).power.idle_w
    src = (f"the {IDLE_MIN_CLOCK_GPU} GPU spec's idle power ({w:g} W; public nvidia-smi -q dumps of 700 W Hopper "
           f"SXM boards idling at their 345 MHz idle clock)" + ("" if gpu == IDLE_MIN_CLOCK_GPU else
                                                                "; carried over: the same GH100 die on a 700 W "
                                                                "SXM board, and this GPU's spec idle names no "
                                                                "clock") + f"; held in the power fit, {COMMAND}")
    return {"power_idle_min_clock_w": w}, src


def power_report(gpu: str) -> tuple[FitReport, list[Path]]:
    rel, comm_rel = POWER[gpu]
    spec = load_gpu(gpu)
    idle_min, idle_min_src = _idle_min_clock(gpu)
    shipped = load_calibration(spec, gpu_file(gpu).stem).params.merged(idle_min)
    model = power_model(spec, shipped)
    table = power_table(gpu, rel, comm_rel, POWER_FITTED)
    if table is None:
        raise SystemExit(f"{gpu}: calibration/data/{rel}: no power phase to fit")
    table = pd.concat([table, clock_power_rows(CLOCK[gpu])], ignore_index=True)
    fit = fit_power({c: table[c].to_numpy(float) for c in FIT_COLUMNS}, model)
    v = fit.params
    values: dict[str, Any] = {
        **idle_min,
        "power_idle_w": round(v["idle_w"], 1), "power_tensor_w": {"default": round(v["tensor_w"], 1)},
        "power_memory_w": round(v["memory_w"], 1),
        "power_hbm_j_per_byte": float(f"{v['hbm_w'] / spec.memory.bandwidth_bytes_per_s:.4g}")}
    by_precision: dict[str, Any] = {}
    for prec, phase in CLOCK_PRECISION_PHASES.items():
        rows = clock_power_rows(CLOCK[gpu], phase)
        w, err = fit_tensor_weight({c: rows[c].to_numpy(float) for c in FIT_COLUMNS},
                                   power_model(spec, shipped.merged(values)))
        values["power_tensor_w"][prec] = round(w, 1)
        table = pd.concat([table, rows], ignore_index=True)
        by_precision[prec] = {"phase": f"clock:{phase}", "samples": len(rows), "fit_mape_pct": round(err, 2)}

    def phase_model(phase: str) -> Any:
        # A phase's tensor work at its precision's weight, as the engine prices it.
        prec = phase.split(":")[-1].split("_")[1] if "gemm_" in phase else "default"
        w = values["power_tensor_w"].get(prec, values["power_tensor_w"]["default"])
        return power_model(spec, shipped.merged({**values, "power_tensor_w": {"default": w}}))

    by_phase = {}
    for name, tbl in (("fitted", table), ("held_out", power_table(gpu, rel, comm_rel, POWER_HELD_OUT))):
        if tbl is None:
            continue
        pred = np.concatenate([fit_table_power_w({c: g[c].to_numpy(float) for c in FIT_COLUMNS[1:]},
                                                 phase_model(str(ph)))
                               for ph, g in tbl.groupby("phase", sort=False)])
        tbl = pd.concat([g for _, g in tbl.groupby("phase", sort=False)], ignore_index=True)
        for phase_name, g in tbl.assign(pred=pred).groupby("phase", sort=False):
            m, p_ = float(g["power_w"].mean()), float(g["pred"].mean())
            by_phase[str(phase_name)] = {
                "set": name, "samples": len(g), "measured_w": round(m, 1), "predicted_w": round(p_, 1),
                "error_pct": round((p_ - m) / m * 100, 1),
                "sm_clock_mhz_median": round(float(g["sm_clock_hz"].median()) / 1e6)}
    src = (f"measured: calibration/data/{rel} (power part: NVML instantaneous power, phases "
           f"{', '.join(POWER_FITTED)}) and calibration/data/{CLOCK[gpu]} (clock part: {CLOCK_POWER_PHASE} "
           f"at the SM clocks its probes counted), ovsim.hw.power.fit_power; {COMMAND}")
    sources = dict.fromkeys(values, src)
    sources["power_idle_min_clock_w"] = idle_min_src
    sources["power_idle_w"] = f"at the maximum clock (1980 MHz, where the idle phase ran): {src}"
    sources["power_tensor_w"] = (
        f"default: {src}; " + ", ".join(CLOCK_PRECISION_PHASES) + f": calibration/data/{CLOCK[gpu]} (clock part: "
        + ", ".join(CLOCK_PRECISION_PHASES.values()) + " at the SM clocks their probes counted), each precision's "
        f"weight with the others held, ovsim.hw.power.fit_tensor_weight; {COMMAND}")
    report = FitReport(parameters=values, sources=sources,
                       fits={"power": {"method": "ovsim.hw.power.fit_power (least squares, non-negative weights) on "
                                                 "each phase's samples after its first second, at the clocks read "
                                                 "(power part) or counted (clock part)",
                                       "data_set": f"calibration/data/{rel}", "clock_data_set":
                                       f"calibration/data/{CLOCK[gpu]}", "samples": fit.n_samples,
                                       "fit_mape_pct": round(fit.mape_pct, 2), "fit_rmse_w": round(fit.rmse_w, 1),
                                       "tensor_w_by_precision": {
                                           "method": "ovsim.hw.power.fit_tensor_weight (linear least squares, "
                                                     "the other weights as fitted) on the phase's samples",
                                           **by_precision},
                                       "phases": by_phase}})
    tables = sorted((DATA / rel / "tables" / "power").glob("*.parquet"))
    clock = [CLOCK_POWER_PHASE, *CLOCK_PRECISION_PHASES.values()]
    return report, [*tables, *(DATA / CLOCK[gpu] / "tables" / "clock" / f"{ph}.parquet" for ph in clock)]


def voltage_report(gpu: str) -> tuple[FitReport, list[Path]]:
    """The voltage floor (``power_knee_voltage_fraction``) the GEMM-share alternations fit, with the
    knee clock held (every sample lies above it): ``VOLTAGE``'s data set, one board's power part
    and its clock part's GEMM-share phases, the weights fitted with it on the same samples and
    not shipped (:func:`power_report` refits them on the power data set under the new floor). The
    ~55% alternation (``SHARE_HELD_OUT``) is held out and reported."""
    rel, comm_rel = VOLTAGE[gpu]
    spec = load_gpu(gpu)
    shipped = load_calibration(spec, gpu_file(gpu).stem).params.merged(_idle_min_clock(gpu)[0])
    model = power_model(spec, shipped)
    base = power_table(gpu, rel, comm_rel, POWER_FITTED)
    if base is None:
        raise SystemExit(f"{gpu}: calibration/data/{rel}: no power phase to fit")
    table = pd.concat([base, clock_power_rows(rel), *(share_power_rows(rel, ph) for ph in SHARE_PHASES)],
                      ignore_index=True)
    lowest_mhz = round(float(table.loc[table["phase"].str.startswith("clock:"), "sm_clock_hz"].min()) / 1e6)
    fits: dict[str, Any] = {"method": "ovsim.hw.power.fit_power with fit_voltage, knee_clock_fraction, fp32_w "
                                      "and link_w held, on each phase's samples after its first second",
                            "data_set": f"calibration/data/{rel}", "lowest_counted_clock_mhz": lowest_mhz}
    floor = math.nan
    for name, fit_voltage in (("assumed_curve", False), ("floor_fitted", True)):
        fit = fit_power({c: table[c].to_numpy(float) for c in FIT_COLUMNS}, model, fit_voltage=fit_voltage,
                        hold=("knee_clock_fraction", "fp32_w", "link_w"))
        v = fit.params
        fitted = power_model(spec, shipped.merged({
            "power_idle_w": v["idle_w"], "power_tensor_w": {"default": v["tensor_w"]}, "power_memory_w": v["memory_w"],
            "power_hbm_j_per_byte": v["hbm_w"] / spec.memory.bandwidth_bytes_per_s,
            "power_knee_voltage_fraction": v["knee_voltage_fraction"]}))
        held = share_power_rows(rel, SHARE_HELD_OUT)
        pred = fit_table_power_w({c: held[c].to_numpy(float) for c in FIT_COLUMNS[1:]}, fitted)
        fits[name] = {"knee_voltage_fraction": round(v["knee_voltage_fraction"], 3),
                      "knee_clock_fraction": v["knee_clock_fraction"], "idle_w": round(v["idle_w"], 1),
                      "tensor_w": round(v["tensor_w"], 1), "hbm_w": round(v["hbm_w"], 1),
                      "fit_mape_pct": round(fit.mape_pct, 2), "samples": fit.n_samples,
                      f"held_out_{SHARE_HELD_OUT}_error_pct": round(
                          (float(pred.mean()) / float(held["power_w"].mean()) - 1) * 100, 1)}
        if fit_voltage:
            floor = round(v["knee_voltage_fraction"], 3)
    src = (f"measured: calibration/data/{rel} (power part: idle, the add and 32 copy channels; clock part: the "
           f"8192^3 BF16 GEMM alone and alternating with the add at GEMM time shares of 10, 25, 75 and 90%, "
           f"{lowest_mhz}-1980 MHz counted), ovsim.hw.power.fit_power with the knee clock held: the voltage "
           f"barely moves between those clocks, so dynamic power follows the clock there; below {lowest_mhz} MHz "
           f"it is an extrapolation; {COMMAND}")
    report = FitReport(parameters={"power_knee_voltage_fraction": floor},
                       sources={"power_knee_voltage_fraction": src}, fits={"voltage": fits})
    tables = [t for t in sorted((DATA / rel / "tables" / "power").glob("*.parquet")) if "idle" not in t.name]
    return report, [*tables, DATA / rel / "clock.parquet", _power_log(DATA / rel)]


def control_window_report(gpu: str) -> tuple[FitReport, list[Path]]:
    from ovsim.engine.machine import build_machine
    from ovsim.engine.power import CLOCK_COUNTER, PowerConfig
    from ovsim.engine.sim import Engine, EngineOptions
    from ovsim.hw.power import PowerSettings
    from ovsim.hw.spec import load_system
    from ovsim.models.workload import build_workload
    from ovsim.scenario import Scenario

    rel = CLOCK[gpu]
    pts = pd.read_parquet(DATA / rel / "clock.parquet")
    system = {"h100-sxm5-80gb": "hgx-h100", "h200-sxm": "hgx-h200"}[gpu]
    sys_spec = load_system(system)
    spec = load_gpu(gpu)
    shipped = load_calibration(spec, gpu_file(gpu).stem).params
    measured: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    kernel_s: dict[str, float] = {}
    for phase in CONTROL_PHASES:
        g = _main_kernel(pts[pts["experiment"] == phase]).sort_values("start_s")
        t = (g["start_s"] - g["start_s"].min()).to_numpy(float)
        keep = t < CONTROL_HORIZON_S
        measured[phase] = (t[keep], g["sm_clock_hz"].to_numpy(float)[keep])
        kernel_s[phase] = float(g["duration_s"].iloc[:5].median())

    def simulate(window_s: float, phase: str) -> tuple[np.ndarray, np.ndarray]:
        params = shipped.merged({"power_control_window_s": window_s, "power_control_period_s": CONTROL_PERIOD_S})
        n = int(CONTROL_HORIZON_S / kernel_s[phase] * 1.3) + 5  # enough kernels to outlast the horizon
        ops = Scenario.model_validate({"name": phase, "system": system, "ranks": 1, "ops": [
            {"name": f"k{i}", **CONTROL_PHASES[phase]} for i in range(n)]}).ops
        wl = build_workload(list(ops), gpu=spec, system=sys_spec, params=params, n_ranks=1)
        machine = build_machine(sys_spec, spec, params, n_ranks=1)
        cfg = PowerConfig(model=power_model(spec, params), settings=PowerSettings(cap_w=spec.power.tdp_w, start="idle"))
        c = Engine(wl, machine, EngineOptions(power=cfg)).run().counters
        c = c[c["counter"] == CLOCK_COUNTER]
        return c["time_s"].to_numpy(float), c["value"].to_numpy(float)

    fit = fit_control_window(measured, simulate, CONTROL_WINDOWS_S, CONTROL_STEADY_FROM_S, baseline_s=0.0)
    src = (f"measured: calibration/data/{rel} (clock part: {len(CONTROL_PHASES)} cuBLAS GEMM phases started from "
           f"idle, the SM clock their probes counted over each phase's first {CONTROL_HORIZON_S:g} s), the window "
           f"on a 10 ms grid whose idle-start clock trajectories best match the measured ones about their own "
           f"steady clocks (ovsim.calibrate.fit_control_window); {COMMAND}")
    period_src = (f"assumption bounded by calibration/data/{rel}: the clock moved no more often than the probes' "
                  f"~5 ms spacing; with the window refitted, periods of 2-10 ms change the fit's error by under 3%; "
                  f"{COMMAND}")
    report = FitReport(parameters={"power_control_window_s": fit["window_s"],
                                   "power_control_period_s": CONTROL_PERIOD_S},
                       sources={"power_control_window_s": src, "power_control_period_s": period_src},
                       fits={"power_control_window_s": {"method": "grid search, RMS of clock trajectories about "
                                                                  "their steady levels", "data_set":
                                                        f"calibration/data/{rel}", **fit}})
    tables = [DATA / rel / "tables" / "clock" / f"{p}.parquet" for p in CONTROL_PHASES]
    return report, tables


def hbm_latency_points(gpu: str) -> tuple[pd.DataFrame, list[Path]]:
    """The first ``MEASURED_HBM`` data set of ``gpu``: per experiment the victim's and the loop's
    utilization of the HBM peak alone, the share of the victim's time alone that waits on memory
    (1 - its kind's measured clock share), and their measured slowdowns beside each other; and the
    tables they come from."""
    rel, _, _, comm_rel = next(m for m in MEASURED_HBM if m[1] == gpu)
    points = hbm_sharing_points(DATA / rel, DATA / comm_rel)
    spec = load_gpu(gpu)
    peak = spec.memory.bandwidth_bytes_per_s
    share = load_calibration(spec, gpu_file(gpu).stem).params.memory_kind_clock_share
    points = points.assign(
        victim_utilization=points["victim_hbm_bytes"] / points["victim_alone_s"] / peak,
        loop_utilization=points["loop_hbm_bytes"] / points["loop_alone_s"] / peak,
        victim_wait=[1.0 - share.get(HARNESS_MEMORY_VICTIM_KIND[v], 0.0) for v in points["victim"]])
    tables = [DATA / rel / "tables" / "overlap" / f"{label}.parquet" for label in points["label"]]
    return points, tables


def hbm_latency_predicted(points: pd.DataFrame, capacity: float, exponent: float,
                          loop_wait: float) -> tuple[np.ndarray, np.ndarray]:
    """(victim, loop) slowdowns beside each other by the engine's law
    (``ovsim.engine.channel.latency_slowdowns``)."""
    out = [latency_slowdowns([xv, xl], [wv, loop_wait], capacity, exponent)[0]
           for xv, xl, wv in zip(points["victim_utilization"], points["loop_utilization"], points["victim_wait"],
                                 strict=True)]
    return np.array([o[0] for o in out]), np.array([o[1] for o in out])


def fit_hbm_latency(points: pd.DataFrame) -> dict[str, Any]:
    """The latency law's capacity, exponent and the loops' share of time waiting on memory with the
    least mean relative error of the victims' slowdowns plus ``HBM_LOOP_WEIGHT`` times the loops'
    (differential evolution, seed 0)."""
    sv, sl = points["victim_slowdown"].to_numpy(float), points["loop_slowdown_beside"].to_numpy(float)

    def loss(p: np.ndarray) -> float:
        pv, pl = hbm_latency_predicted(points, *p)
        return float(np.mean(np.abs(pv / sv - 1)) + HBM_LOOP_WEIGHT * np.mean(np.abs(pl / sl - 1)))

    res = differential_evolution(loss, HBM_LATENCY_BOUNDS, seed=0, tol=1e-8, maxiter=300, polish=True)
    capacity, exponent, wait = (round(float(v), 3) for v in res.x)
    pv, pl = hbm_latency_predicted(points, capacity, exponent, wait)
    return {"capacity": capacity, "exponent": exponent, "loop_wait": wait, "points": len(points),
            "victim_fit_mape_pct": round(float(np.mean(np.abs(pv / sv - 1))) * 100, 2),
            "victim_naive_mape_pct": round(float(np.mean(np.abs(1 / sv - 1))) * 100, 2),
            "loop_fit_mape_pct": round(float(np.mean(np.abs(pl / sl - 1))) * 100, 2)}


def hbm_latency_report(gpu: str, measured: str | None = None) -> tuple[FitReport, list[Path]]:
    """The latency law fitted on ``measured``'s (default ``gpu``'s) overlap data, as ``gpu``'s."""
    points, tables = hbm_latency_points(measured or gpu)
    fit = fit_hbm_latency(points)
    rel = next(m[0] for m in MEASURED_HBM if m[1] == (measured or gpu))
    what = (f"calibration/data/{rel} (overlap part: a streaming add, a layer norm and a softmax alone and beside "
            f"{points['channels'].min()}-{points['channels'].max()} copy and reduce loops, {len(points)} experiments)")
    source = f"measured: {what}, differential evolution on the slowdowns; {COMMAND}"
    if measured is not None and measured != gpu:
        source = (f"assumption: the {measured} fit carried over (not fitted on this GPU; its own data is held "
                  f"out): {source}")
    report = FitReport(
        parameters={"hbm_latency_capacity": fit["capacity"], "hbm_latency_exponent": fit["exponent"],
                    "hbm_latency_collective_wait": fit["loop_wait"]},
        sources=dict.fromkeys(("hbm_latency_capacity", "hbm_latency_exponent", "hbm_latency_collective_wait"), source),
        fits={"hbm_latency": {"method": "scipy differential_evolution (seed 0) on the mean relative error of the "
                                        f"victims' slowdowns plus {HBM_LOOP_WEIGHT} times the loops' "
                                        "(ovsim.engine.channel.latency_slowdowns)",
                              "data_set": f"calibration/data/{rel}", **fit}})
    return report, tables


def _ship(report: FitReport, tables: list[Path], gpu: str, dry_run: bool, trace_gpu: str | None = None) -> None:
    """Write ``report`` as the GPU's next shipped version, its tables (measured on ``trace_gpu``,
    default ``gpu``) as provenance, and say what was done. Files among ``tables`` that are not
    kernel tables (a clock part's ``clock.parquet``, a power log) join the first table's entry,
    whose checksums then cover them too."""
    kernel_tables = [t for t in tables if t.parent.parent.name == "tables"]
    other = tuple(str(t) for t in tables if t not in kernel_tables)
    inputs = [trace_input([t], trace_gpu or gpu) for t in kernel_tables]
    if other:
        if not inputs:
            raise SystemExit(f"{gpu}: no kernel table among the files a fit read: {', '.join(other)}")
        inputs[0] = dataclasses.replace(inputs[0], label=f"{inputs[0].label} and {len(other)} more files of its "
                                        "data set", files=inputs[0].files + other)
    _, done = write_shipped(report, inputs, gpu, COMMAND, dry_run=dry_run)
    print(f"{gpu}: {done}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fits, write nothing")
    args = ap.parse_args()
    for rel, gpu in MEASURED_GEMM:
        report, tables = gemm_report(gpu, rel)
        print(json.dumps({"gpu": gpu, **report.parameters, **report.fits}, indent=1))
        _ship(report, tables, gpu, args.dry_run)
    for rel, gpu, _ in MEASURED_COPY:
        report, tables = copy_report(gpu, rel)
        print(json.dumps({"gpu": gpu, **report.parameters, **report.fits}, indent=1))
        _ship(report, tables, gpu, args.dry_run)
    for gpu, rel in SMLOSS.items():
        folder = DATA / rel
        manifest = json.loads((folder / "manifest.json").read_text())
        points = smloss_points(folder, "add_bf16_256M")
        if len(points) < 2:
            print(f"{gpu}: {folder}: fewer than two smloss points for the add", file=sys.stderr)
            return 1
        fit = fit_headroom(points, int(manifest["sm_count"]))
        tables = sorted((folder / "tables" / "smloss").glob("add_bf16_256M__hold_*.parquet"))
        report = FitReport(
            parameters={"memory_sm_headroom": fit["value"]},
            sources={"memory_sm_headroom": f"measured: calibration/data/{rel} (smloss part: a BF16 add of 2^28 "
                                           f"elements alone and beside {', '.join(map(str, fit['held_sms']))} SMs held "
                                           f"without traffic), least squares on the slowdowns; {COMMAND}"},
            fits={"memory_sm_headroom": {
                "method": "bounded scalar least squares on relative error of 1/min(1, headroom*(S-held)/S)",
                "data_set": f"calibration/data/{rel}", **fit}})
        print(json.dumps({"gpu": gpu, **report.fits}, indent=1))
        _ship(report, tables, gpu, args.dry_run)
    for gpu in SMLOSS_LOAD_FIT:
        report, tables = load_share_report(gpu)
        print(json.dumps({"gpu": gpu, **report.fits}, indent=1))
        _ship(report, tables, gpu, args.dry_run)
    for gpu in SHAPING:
        report, tables = issue_cap_report(gpu)
        print(json.dumps({"gpu": gpu, **report.fits}, indent=1))
        _ship(report, tables, gpu, args.dry_run)
    for gpu, measured in SHAPING_CARRIED.items():
        report, tables = issue_cap_report(measured)
        report.sources = {"block_issue_share_per_warp": (
            f"assumption: the {measured} fit carried over (the same four schedulers per SM; not measured on this "
            f"GPU; see SHAPING_CARRIED in calibration/harness/fit_measured.py): "
            f"{report.sources['block_issue_share_per_warp']}")}
        _ship(report, tables, gpu, args.dry_run, trace_gpu=measured)
    for gpu in CLOCK:
        report, tables = clock_report(gpu)
        print(json.dumps({"gpu": gpu, **report.parameters, **report.fits}, indent=1))
        _ship(report, tables, gpu, args.dry_run)
        report, tables = clock_share_report(gpu)
        print(json.dumps({"gpu": gpu, **report.parameters, **report.fits}, indent=1))
        _ship(report, tables, gpu, args.dry_run)
    # The voltage floor first: the power weights are refitted under it.
    for gpu in VOLTAGE:
        report, tables = voltage_report(gpu)
        print(json.dumps({"gpu": gpu, **report.parameters, **report.fits}, indent=1))
        _ship(report, tables, gpu, args.dry_run)
    for gpu in POWER:
        report, tables = power_report(gpu)
        print(json.dumps({"gpu": gpu, **report.parameters, **report.fits}, indent=1))
        _ship(report, [t for t in tables if "idle" not in t.name], gpu, args.dry_run)
    for gpu in CLOCK:
        report, tables = control_window_report(gpu)
        print(json.dumps({"gpu": gpu, **report.parameters, **report.fits}, indent=1))
        _ship(report, tables, gpu, args.dry_run)
    for gpu, rel in MEMORY.items():
        tables = sorted(t for v in MEMORY_VICTIMS for t in (DATA / rel / "tables" / "overlap").glob(f"{v}__*.parquet"))
        inputs = [trace_input([t], gpu) for t in tables]
        report = calibrate(inputs, gpu, quantities=["memory"])
        report.sources = {k: f"measured: calibration/data/{rel} (overlap part, the clean instances of "
                             f"{', '.join(MEMORY_VICTIMS)}); {v}; {COMMAND}" for k, v in report.sources.items()}
        print(json.dumps({"gpu": gpu, "parameters": report.parameters}, indent=1))
        _, done = write_shipped(report, inputs, gpu, COMMAND, dry_run=args.dry_run)
        print(f"{gpu}: {done}")
    for hbm_gpu in dict.fromkeys(m[1] for m in MEASURED_HBM):  # each GPU's first data set
        report, tables = hbm_latency_report(hbm_gpu)
        print(json.dumps({"gpu": hbm_gpu, **report.fits}, indent=1))
        _ship(report, tables, hbm_gpu, args.dry_run)
    # After the ones above: the contention fit replays with the newest calibration, which they set.
    for gpu, rel in OVERLAP.items():
        inputs = [trace_input([t], gpu) for t in sorted((DATA / rel / "tables" / "overlap").glob("*.parquet"))]
        # Every channel block holds its SM for the whole kernel (the per-block records): not fitted.
        report = calibrate(inputs, gpu, quantities=["contention"], sm_fraction=HARNESS_SM_FRACTION)
        report.sources = {k: f"measured: calibration/data/{rel} (overlap part); {v}; {COMMAND}"
                          for k, v in report.sources.items()}
        # The harness's channel kernels record no protocol, and replay knows no message size for
        # them, so the pressure fitted under "default" stands for their own data traffic. NCCL's
        # protocols keep none: a collective of known protocol and size moves its data as a flow,
        # which charges HBM itself (0 is what the shared traces' fit gave them, default.v4).
        report.parameters["nccl_memory_pressure"] = {**dict.fromkeys(NCCL_PROTOCOLS, 0.0),
                                                     **report.parameters["nccl_memory_pressure"]}
        report.sources["nccl_memory_pressure"] += (
            f"; {', '.join(NCCL_PROTOCOLS)}: 0, set with it: the fitted default stands for the data traffic of "
            "collectives that record no protocol, which NCCL's flows of known protocol and size charge themselves")
        print(json.dumps({"gpu": gpu, "parameters": report.parameters}, indent=1))
        _, done = write_shipped(report, inputs, gpu, COMMAND, dry_run=args.dry_run)
        print(f"{gpu}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
