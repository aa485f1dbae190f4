"""The clock and power fits of fit_measured.py (its docstring says what each fits, on which data
and how): the tensor saturation clock and memory kinds' clock shares from the ``clock`` part, the
voltage floor, the power weights, and the power-limit loop's window."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from analysis import profiled_window
from fit_common import COMMAND, DATA, fit_pair, fit_set
from scipy.optimize import minimize_scalar

from ovsim.calibrate import (
    FitReport,
    fit_clock_share,
    fit_control_window,
)
from ovsim.hw.calib import load_calibration
from ovsim.hw.power import FIT_COLUMNS, fit_power, fit_table_power_w, fit_tensor_weight, power_model
from ovsim.hw.spec import gpu_file, load_gpu
from ovsim.models.cost import element_bytes
from ovsim.traces.power import read_power_samples
from ovsim.validate import (
    CLOCK_MEMORY_KINDS,
    CLOCK_STEADY_HZ,
    HARNESS_CHANNEL_PASS_BYTES,
    channel_pass_s,
    clock_memory_points,
    harness_power_log,
)
from ovsim.validate.datasets import fit_sets, one_experiment, table_paths

# (power data set, data set whose comm part gives the 32 channels' traffic; registry.yaml's fits)
POWER = fit_pair("power")
# One board's power and clock parts with the GEMM-share alternations, and the comm set as above:
# what voltage_report fits the voltage floor on.
VOLTAGE = fit_pair("voltage")
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
POWER_DEFECTIVE = {str(e["set"]): tuple(str(e["defective"]).split()) for e in fit_sets("power").values()
                   if e.get("defective")}
POWER_SETTLE_S = 1.0  # the first second of a phase: the clock and the sensor settling
# Idle power at the minimum SM clock, held in the power fits: the H100 spec's idle (public nvidia-smi
# -q dumps of 700 W Hopper SXM boards idling at 345 MHz), carried to the H200 (the same GH100 die
# on a 700 W SXM board; the H200 spec's idle names no clock). The idle the harness measured is at
# the top clock, 1980 MHz, where an idle board sits after work.
IDLE_MIN_CLOCK_GPU = "h100-sxm5-80gb"
# Data sets of the ``clock`` part: each kernel with the SM clock its probes counted.
CLOCK = fit_set("clock")
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
# Compulsory HBM traffic of an 8192^3 GEMM, in elements: A and B read, C written.
GEMM_8192_ELEMENTS = 2 * (2 * 8192 * 8192) + 8192 * 8192


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
    bundle = one_experiment(folder, "power", phase)
    key = f"power/{phase}"
    if not spans.is_file() or bundle is None:
        return None
    windows = json.loads(spans.read_text())
    if key not in windows:
        return None
    k = bundle.kernels
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
    tables = [t for t in table_paths(DATA / rel, "clock") if any(t.name.startswith(p) for p in prefixes)]
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
    tables = table_paths(DATA / rel, "power")
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
    tables = [t for t in table_paths(DATA / rel, "power") if "idle" not in t.name]
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
# The streaming add's traffic a launch: two BF16 inputs of 2^28 elements read, one written.
ADD_BYTES = 3 * 2**29
