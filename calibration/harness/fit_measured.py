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
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from fit_common import COMMAND, DATA, fit_pair, fit_set
from fit_power_clock import (
    CLOCK,
    POWER,
    VOLTAGE,
    clock_report,
    clock_share_report,
    control_window_report,
    power_report,
    voltage_report,
)
from scipy.optimize import differential_evolution, minimize_scalar

from ovsim.calibrate import (
    FitReport,
    calibrate,
    fit_library_gemm,
    write_shipped,
)
from ovsim.engine.channel import latency_slowdowns
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import gpu_file, load_gpu
from ovsim.validate import (
    GEMM_AT_TOP_CLOCK,
    HARNESS_MEMORY_VICTIM_KIND,
    HARNESS_SM_FRACTION,
    MEASURED_COPY,
    MEASURED_GEMM,
    MEASURED_GEMM_PRECISIONS,
    MEASURED_HBM,
    SMLOSS_LOAD_FIT,
    harness_experiments,
    hbm_sharing_points,
    measured_copy_times,
    measured_gemm_points,
    smloss_bundle,
    smloss_scored,
)
from ovsim.validate.datasets import table_input, table_paths

# The data sets each GPU's fits read (folders under calibration/data/; registry.yaml's fits).
SMLOSS = fit_set("memory_sm_headroom")
# (fitted on, held out or None)
SHAPING = fit_pair("block_issue_share_per_warp", "held_out")
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
OVERLAP = fit_set("contention")
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
MEMORY = fit_set("memory")
MEMORY_VICTIMS = ("add_bf16_256M", "layernorm_bf16_16384x8192", "softmax_bf16_16384x8192")


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
    tables = table_paths(folder, "smloss", "gemm_*")
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
    tables = table_paths(DATA / fit_on, "shaping", "gemm64_*_occ?")
    return report, tables


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
    kernel tables (a clock part's ``clock.parquet``, a power log) join the entry of the first
    table of their data set, whose checksums then cover them too."""
    kernel_tables = [t for t in tables if t.parent.parent.name == "tables"]
    other = [t for t in tables if t not in kernel_tables]
    inputs = [table_input(t, trace_gpu or gpu) for t in kernel_tables]
    for i, kt in enumerate(kernel_tables):
        if any(kt.parents[2] == x.parents[2] for x in kernel_tables[:i]):
            continue
        own = tuple(str(t) for t in other if t.parent == kt.parents[2])
        if own:
            inputs[i] = dataclasses.replace(inputs[i], label=f"{inputs[i].label} and {len(own)} more files of its "
                                            "data set", files=inputs[i].files + own)
    homeless = [str(t) for t in other if all(t.parent != kt.parents[2] for kt in kernel_tables)]
    if homeless:
        raise SystemExit(f"{gpu}: no kernel table of the data set of the files a fit read: {', '.join(homeless)}")
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
        tables = table_paths(folder, "smloss", "add_bf16_256M__hold_*")
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
        tables = sorted(t for v in MEMORY_VICTIMS for t in table_paths(DATA / rel, "overlap", f"{v}__*"))
        inputs = [table_input(t, gpu) for t in tables]
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
        inputs = [table_input(t, gpu) for t in table_paths(DATA / rel, "overlap")]
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
