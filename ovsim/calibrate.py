"""``ovsim calibrate``: fit model parameters to real traces and write them, with provenance, as a
new calibration file (docs/calibration.md: everything fitted lives in versioned calibration
files with provenance).

What is fitted, from what, and how
----------------------------------

``contention``
    ``nccl_memory_pressure`` (per NCCL protocol: the share of HBM a resident SM collective keeps
    busy beyond its data) and ``replay_hbm_fraction`` (per compute-bound kernel kind: the HBM
    traffic replay gives it, as a fraction of what the achievable bandwidth moves in its isolated
    time). Data: every compute kernel that overlapped a collective and whose isolated duration is
    known from instances of the same signature that did not overlap (exactly the kernels replay
    scores). Model: the engine's HBM channel for one kernel beside the resident collectives (the
    same weighted max-min sharing, :func:`ovsim.engine.channel.max_min_rates`), applied over the
    measured fraction of the kernel's time that a collective was resident. Memory-bound kinds move
    ``memory_kernel_efficiency`` of the bandwidth, which anchors the scale. Loss: the mean absolute
    percentage error of those kernels, each trace weighted equally, with a negligible penalty that
    prefers the least contention among equal fits. Method: scipy's differential evolution with a
    fixed seed (deterministic). The fit uses this one-kernel view of the engine; the figures that
    judge it (``ovsim validate``, leave-one-trace-out) run the full engine.

``collectives``
    ``nccl_fitted``: latency and bus bandwidth per (collective, algorithm, protocol, ranks) from
    collectives of known message size that did not overlap compute. A kernel's duration includes
    waiting for peers, so each message size contributes its fastest instance; ``t = latency +
    bus_bytes / bandwidth`` is fitted by non-negative least squares over the sizes. Two distinct
    sizes at least; the prediction uses the fit only for that exact collective and rank count.

``overhead``
    ``kernel_overhead_s``, the fixed time the cost model adds to every kernel, from elementwise
    kernels too small for their traffic to count (at most 0.1 us of it at the peak HBM bandwidth)
    that ran without communication and were their operator call's only kernel; see
    :func:`fit_overhead`. Fitted first, so the gemm and memory fits of the same call build on it.

``gemm``
    ``gemm_efficiency`` (of the main loop) and ``gemm_tile_overhead_s`` (fixed time per wave of
    tiles) per precision from GEMM kernels that ran without communication and whose launching
    operator records input shapes; see :func:`fit_gemm`.

``memory``
    ``memory_kernel_efficiency`` (streaming elementwise kernels), ``memory_kind_efficiency`` (norm,
    softmax) and, where streaming kernels were measured to move more than it allows,
    ``hbm_achievable_fraction``, from memory-bound kernels moving at least twice the L2 whose
    bytes the launching operator's input shapes and types give (:mod:`ovsim.traces.aten`); see
    :func:`fit_memory`.

``power``
    ``power_idle_w`` and the power weights (``power_tensor_w``, ``power_fp32_w``,
    ``power_memory_w``, ``power_hbm_j_per_byte``, ``power_link_j_per_byte``) from power logs of the
    traced runs (nvidia-smi, dcgmi dmon, DCGM CSV; :mod:`ovsim.traces.power`). Each trace is
    replayed with power tracked; its log is put on the trace's clock (from the wall clocks of both,
    or a given offset) and each sample is set beside the replay's activity averaged over the
    sensor's window (the log's median sample interval unless given). Least squares with
    non-negative weights (:func:`ovsim.hw.power.fit_power`); a weight whose activity never occurs
    in the samples is not identifiable and is not written.

Old calibration files are never edited: the output is a new file, and an existing one is refused.
"""

from __future__ import annotations

import ast
import datetime as _dt
import hashlib
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import differential_evolution, nnls

from ovsim.engine.channel import latency_slowdowns, one_channel_rate
from ovsim.errors import OvsimError
from ovsim.files import atomic_output
from ovsim.hw.calib import (
    CALIB_DIR,
    PRESSURE_MAX,
    VERSIONED_NAME,
    Parameters,
    collective_pressure,
    load_calibration,
    newest_file,
    read_calib_file,
)
from ovsim.hw.spec import GpuSpec, gpu_file, load_gpu
from ovsim.models import nccl
from ovsim.replay import (
    COMPUTE_KINDS,
    MEMORY_KINDS,
    NCCL_OPS,
    _Cols,
    _mape,
    _overlap_flags,
    bundle_gpu,
    data_moving_s,
    engine_kind,
    isolated_durations,
    protocol_key,
)
from ovsim.traces.aten import Traffic, gemm_problem, traffic
from ovsim.traces.table import TraceBundle

QUANTITIES = ("contention", "collectives", "overhead", "gemm", "memory", "power")
# Quantities that belong to one GPU: not fitted for '*'.
GPU_SPECIFIC = ("collectives", "overhead", "gemm", "memory", "power")
# Compute kinds whose replay HBM traffic can be fitted (memory-bound kinds are the anchor).
FRACTION_KINDS = tuple(k for k in COMPUTE_KINDS if k not in MEMORY_KINDS)
_REGULARIZE = 1e-6


@dataclass(frozen=True)
class PowerLog:
    """A power log recorded during a traced run, and how to put it on the trace's clock."""

    path: str
    # Trace time of the log's first sample; None: from the wall clocks of the log and the trace.
    offset_s: float | None = None
    # The sensor's averaging window; None: the log's median sample interval.
    window_s: float | None = None


@dataclass(frozen=True)
class TraceInput:
    """One measured run to calibrate on: its bundle, where it came from, the GPU spec it ran on,
    and power logs recorded during it."""

    bundle: TraceBundle
    label: str
    gpu: str
    files: tuple[str, ...] = ()
    power_logs: tuple[PowerLog, ...] = ()


@dataclass
class FitReport:
    """What a calibration fitted, from how much data, and how well."""

    parameters: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    fits: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    # Every measured point a fit used beside what the written parameters predict for it
    # (POINT_COLUMNS); filled when calibrate() is asked for points.
    points: pd.DataFrame | None = None


# FitReport.points: the fit, the group a point belongs to (precision, class, collective, kernel
# kind, power log), its trace, the unit of the values ("s" or "W"), the measured value, the value
# the written parameters give, and the prediction the fit is judged against where it has one
# (contention: the naive isolated duration; power: the calibration in use before the fit).
POINT_COLUMNS = ("quantity", "group", "trace", "unit", "measured", "fitted", "baseline")


@dataclass(frozen=True)
class ContentionData:
    """A trace's scored kernels (overlapped, isolated duration from clean instances of the same
    signature): measured and isolated duration, the engine's replay without memory contention (one
    row per ``SM_FRACTIONS`` value), the fraction of the measured time a collective was resident on
    the rank, and kind, resident protocols and data-moving share of the isolated time. Prepared
    once per trace, whatever set of traces a fit uses it in."""

    label: str
    measured_s: np.ndarray
    isolated_s: np.ndarray
    baseline_s: np.ndarray  # (len(SM_FRACTIONS), kernels)
    covered: np.ndarray
    config: list[tuple[str, tuple[tuple[str, int], ...], float]]
    rows: np.ndarray  # the scored kernels' rows in the trace's kernel table


# Memory contention switched off: the engine's prediction without the parameters being fitted.
NO_CONTENTION: dict[str, Any] = {
    "nccl_memory_pressure": dict.fromkeys(("ll", "ll128", "simple", "default"), 0.0),
    "replay_hbm_fraction": dict.fromkeys(FRACTION_KINDS, 0.0),
}
# The values of replay_collective_sm_fraction the fit chooses among (each one a replay of every
# trace); NCCL's design, 1, first.
SM_FRACTIONS = (1.0, 0.5, 0.25, 0.0)
# Mean per-trace MAPE points a smaller SM fraction must gain to replace NCCL's design.
SM_FRACTION_MARGIN_PCT = 0.5
# Resolution of a kernel's data-moving share of its time in the contention fit.
MOVING_STEP = 0.05


def contention_data(tr: TraceInput) -> ContentionData:
    """The trace's scored kernels; the engine replays it (without memory contention) only when it
    has any, for the base the contention fit multiplies (SM sharing, stream order and waiting are
    the engine's)."""
    from ovsim.metrics import union_intervals
    from ovsim.replay import replay

    c = _Cols.of(tr.bundle.kernels.reset_index(drop=True))
    overlapped = _overlap_flags(c)
    iso, src = isolated_durations(c, overlapped)
    params = load_calibration(load_gpu(tr.gpu), gpu_file(tr.gpu).stem).params
    is_coll = np.array([k == "collective" for k in c.kind], dtype=bool)
    sel = np.flatnonzero(overlapped & (src == "signature") & (c.dur > 0))
    rows, covered, config = [], [], []
    for r in np.unique(c.rank[sel]):
        colls = np.flatnonzero(is_coll & (c.rank == r))
        cs, ce = c.start[colls], c.end[colls]
        protos = [protocol_key(c.protocol[j]) for j in colls]
        grids = [int(np.prod(np.where(np.isfinite(c.grid[j]), c.grid[j], 1.0))) for j in colls]
        for i in sel[c.rank[sel] == r]:
            s, e = c.start[i], c.end[i]
            hit = np.flatnonzero((cs < e) & (ce > s))
            resident = union_intervals(np.maximum(cs[hit], s), np.minimum(ce[hit], e))
            rows.append(i)
            covered.append(min(1.0, sum(b - a for a, b in resident) / c.dur[i]))
            # The share of its time the kernel moves data, as replay prices it, to MOVING_STEP:
            # kernels sharing a config share one slowdown in the fit.
            moving = data_moving_s(iso[i], params) / iso[i] if iso[i] > 0 else 1.0
            # The table's kind (replay_hbm_fraction is keyed by it), softmax told from the norms as
            # the engine tells it (its time waiting on memory).
            kind = "softmax" if engine_kind(c.kind[i], c.name[i]) == "softmax" else str(c.kind[i])
            config.append((kind, tuple(sorted((protos[j], max(1, grids[j])) for j in hit)),
                           round(round(moving / MOVING_STEP) * MOVING_STEP, 6)))
    ix = np.array(rows, dtype=np.int64)
    baseline = np.empty((len(SM_FRACTIONS), 0))
    if len(ix):
        baseline = np.array([replay(tr.bundle, gpu=tr.gpu, counters=False,
                                    overrides={**NO_CONTENTION, "replay_collective_sm_fraction": f})
                             .kernels["predicted_duration_s"].to_numpy(dtype=float)[ix] for f in SM_FRACTIONS])
    return ContentionData(tr.label, c.dur[ix], iso[ix], baseline, np.array(covered, float), config, ix)


def contention_slowdown(kind: str, collectives: Sequence[tuple[str, int]], pressure: dict[str, float],
                        fraction: dict[str, float], params: Parameters, moving: float = 1.0) -> float:
    """Slowdown of a kernel of ``kind`` while ``collectives`` ((protocol, blocks holding SMs) each)
    are resident, by the engine's HBM channel (capacity 1: demands are fractions of the achievable
    bandwidth; a collective presses with its protocol's share per block, at most
    ``PRESSURE_MAX``); the kernel moves data ``moving`` of its isolated time, at its full share,
    and its demand over the whole time is that much lower, as the replay spreads it."""
    memory = kind in MEMORY_KINDS or kind == "softmax"
    demand = moving * (params.memory_kernel_efficiency if memory else fraction.get(kind, 0.0))
    resident = []
    for protocol, blocks in collectives:
        share, weight = collective_pressure(pressure, params.nccl_hbm_weight, protocol)
        if share > 0 and blocks > 0:
            resident.append((min(PRESSURE_MAX, share * blocks), weight))
    if demand <= 0 or not resident:
        return 1.0
    asked = demand
    if params.hbm_latency_capacity > 0:
        # HBM's latency law first, as the engine applies it (RateSolver.latency): utilizations of the
        # peak; the kernel waits on memory as a memory-bound kind does, the pressure (a fixed
        # share) not at all.
        wait = 1.0 - params.memory_kind_clock_share.get(kind, 0.0) if memory else 0.0
        ach = params.hbm_achievable_fraction
        slow, _ = latency_slowdowns([demand * ach] + [share * ach for share, _ in resident],
                                    [wait] + [0.0] * len(resident), params.hbm_latency_capacity,
                                    params.hbm_latency_exponent)
        asked = demand / slow[0]
    caps = [asked] + [share for share, _ in resident]
    weights = [1.0] + [weight for _, weight in resident]
    rate = one_channel_rate(caps, weights, params.hbm_mix_efficiency)
    return demand / rate if rate > 0 else math.inf


def held(collectives: Sequence[tuple[str, int]], j: int) -> list[tuple[str, int]]:
    """(protocol, blocks holding SMs) of resident collectives of these grids, as replay holds them
    at ``SM_FRACTIONS[j]``."""
    return [(p, math.ceil(grid * SM_FRACTIONS[j] - 1e-9)) for p, grid in collectives]


def contention_time_s(d: ContentionData, j: int, slowdown: np.ndarray) -> np.ndarray:
    """The fit's duration of ``d``'s kernels: the replay without memory contention at
    ``SM_FRACTIONS[j]``, slowed by ``slowdown`` over the share of each kernel's time a collective
    was resident."""
    return np.asarray(d.baseline_s[j] * (1.0 - d.covered + d.covered * slowdown))


def _replay_mape(tr: TraceInput, d: ContentionData, overrides: dict[str, Any]) -> float:
    """The engine's MAPE on a trace's scored kernels, replayed with ``overrides``."""
    from ovsim.replay import replay

    pred = replay(tr.bundle, gpu=tr.gpu, counters=False, overrides=overrides).kernels["predicted_duration_s"]
    return _mape(pred.to_numpy(dtype=float)[d.rows], d.measured_s)


def fit_contention(traces: Sequence[TraceInput], params: Parameters,
                   prepared: Sequence[ContentionData] | None = None,
                   sm_fraction: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fitted ``nccl_memory_pressure``, ``replay_hbm_fraction`` and ``replay_collective_sm_fraction``
    and the fit's record; raises when no kernel was measured both alone and beside communication.
    ``prepared`` are the traces' :func:`contention_data` (computed here when not given), in the
    order of ``traces``. ``sm_fraction`` (one of ``SM_FRACTIONS``) fixes the share of a collective's
    grid that holds SMs where it is known, instead of choosing it: the calibration harness's
    per-block records show its channel blocks resident for the whole kernel."""
    if sm_fraction is not None and sm_fraction not in SM_FRACTIONS:
        raise OvsimError(f"must be one of {list(SM_FRACTIONS)}, got {sm_fraction}", field="sm_fraction")
    all_data = prepared if prepared is not None else [contention_data(tr) for tr in traces]
    pairs = [(tr, d) for tr, d in zip(traces, all_data, strict=True) if len(d.measured_s)]
    data = [d for _, d in pairs]
    if not data:
        raise OvsimError("no compute kernel in these traces was measured both alone and beside a collective "
                         "(same name, grid, block and launching operator): contention cannot be fitted",
                         field="contention")
    protos = sorted({p for d in data for _, ps, _ in d.config for p, _ in ps})
    kinds = sorted({k for d in data for k, _, _ in d.config if k in FRACTION_KINDS})
    # One block may be fitted to press as much as a whole collective may.
    bounds = [(0.0, PRESSURE_MAX)] * len(protos) + [(0.0, 1.0)] * len(kinds)
    configs = sorted({cfg for d in data for cfg in d.config})
    index = {cfg: i for i, cfg in enumerate(configs)}
    cfg_ix = [np.array([index[cfg] for cfg in d.config]) for d in data]

    def unpack(x: np.ndarray) -> tuple[dict[str, float], dict[str, float]]:
        return (dict(zip(protos, (float(v) for v in x[:len(protos)]), strict=True)),
                dict(zip(kinds, (float(v) for v in x[len(protos):]), strict=True)))

    def per_trace(x: np.ndarray, j: int) -> list[float]:
        pressure, fraction = unpack(x)
        slow = np.array([contention_slowdown(k, held(ps, j), pressure, fraction, params, m) for k, ps, m in configs])
        out = []
        for d, ix in zip(data, cfg_ix, strict=True):
            pred = contention_time_s(d, j, slow[ix])
            out.append(float(np.mean(np.abs(pred - d.measured_s) / d.measured_s) * 100))
        return out

    def fit_at(j: int) -> tuple[np.ndarray, float]:
        """The memory parameters that fit best with the SM fraction ``SM_FRACTIONS[j]``."""
        def loss(x: np.ndarray) -> float:
            return float(np.mean(per_trace(x, j))) + _REGULARIZE * float(np.sum(x))

        res = differential_evolution(loss, bounds, seed=0, maxiter=80, popsize=12, tol=1e-7, polish=False,
                                     init="sobol", x0=x0)
        best = res.x if loss(res.x) <= loss(x0) else x0
        # Round to the precision the data can support, and check rounding did not cost anything.
        rounded = np.round(best, 3)
        if loss(rounded) <= loss(best) + 1e-3:
            best = rounded
        return best, loss(best)

    x0 = np.zeros(len(bounds))
    tried = range(len(SM_FRACTIONS)) if sm_fraction is None else [SM_FRACTIONS.index(sm_fraction)]
    fits = {j: fit_at(j) for j in tried}
    # NCCL's design (the first value) stays unless a smaller share fits better by a clear margin.
    j_best = min(fits)
    for j, (_, err) in fits.items():
        if err < fits[j_best][1] - SM_FRACTION_MARGIN_PCT:
            j_best = j
    best = fits[j_best][0]
    # The fit prices memory contention by one kernel beside the collectives; the engine shares HBM
    # among everything running. Fitted values stand only if the engine, replaying every trace with
    # them, beats itself without memory contention (the baseline at this SM share).
    engine_check: dict[str, Any] = {}
    if np.any(best > 0):
        pressure, fraction = unpack(best)
        trial = {"nccl_memory_pressure": pressure, "replay_hbm_fraction": fraction,
                 "replay_collective_sm_fraction": SM_FRACTIONS[j_best]}
        with_fit = [_replay_mape(tr, d, trial) for tr, d in pairs]
        without = per_trace(x0, j_best)
        engine_check = {"engine_mape_pct_fitted": {d.label: round(v, 2) for d, v in zip(data, with_fit, strict=True)},
                        "engine_mape_pct_without": {d.label: round(v, 2) for d, v in zip(data, without, strict=True)}}
        if float(np.mean(with_fit)) >= float(np.mean(without)):
            engine_check["kept"] = "no memory contention: the fitted values made the engine's mean error worse"
            best = x0
    pressure, fraction = unpack(best)
    record = {
        "method": "per value of replay_collective_sm_fraction in "
                  f"{list(SM_FRACTIONS)} (each a replay of every trace), differential evolution (scipy, seed 0) "
                  "on the mean per-trace MAPE of overlapped kernels: the engine's replay without memory "
                  "contention, times the one-kernel HBM-channel slowdown over the measured fraction of the kernel's "
                  "time a collective was resident; the SM fraction with the least error is kept when it beats "
                  f"NCCL's design (1) by more than {SM_FRACTION_MARGIN_PCT} points; non-zero memory values are kept "
                  "only if the engine, replaying every trace with them, beats itself without",
        "points": int(sum(len(d.measured_s) for d in data)),
        "points_per_trace": {d.label: len(d.measured_s) for d in data},
        "naive_mape_pct": {d.label: round(float(np.mean(np.abs(d.isolated_s - d.measured_s)
                                                                      / d.measured_s) * 100), 2) for d in data},
        "no_contention_mape_pct": {d.label: round(v, 2)
                                   for d, v in zip(data, per_trace(x0, 0), strict=True)},
        "mean_fit_mape_pct_by_sm_fraction": {str(SM_FRACTIONS[j]): round(err, 2) for j, (_, err) in fits.items()},
        **({"sm_fraction": f"{sm_fraction}: given, not chosen"} if sm_fraction is not None else {}),
        "fit_mape_pct": {d.label: round(v, 2) for d, v in zip(data, per_trace(best, j_best), strict=True)},
        **engine_check,
        "note": "fit error (on the traces fitted), not prediction error; held-out figures come from "
                "`ovsim validate` (leave one trace out)",
    }
    return {"nccl_memory_pressure": pressure, "replay_hbm_fraction": fraction,
            "replay_collective_sm_fraction": SM_FRACTIONS[j_best]}, record


def _collective_rows(bundle: TraceBundle) -> dict[str, list[tuple[float, float]]]:
    """(bus bytes, fastest duration) per message size of collectives that did not overlap compute."""
    df = bundle.kernels.reset_index(drop=True)
    c = _Cols.of(df)
    is_coll = np.array([k == "collective" for k in c.kind], dtype=bool)
    is_compute = np.array([k in COMPUTE_KINDS for k in c.kind], dtype=bool)
    out: dict[str, dict[float, float]] = {}
    for r in np.unique(c.rank):
        comp = np.flatnonzero(is_compute & (c.rank == r))
        cs, ce = c.start[comp], c.end[comp]
        for i in np.flatnonzero(is_coll & (c.rank == r)):
            op, size, n = c.collective[i], c.message_bytes[i], c.group_size[i]
            if op not in NCCL_OPS or not (math.isfinite(size) and size > 0 and math.isfinite(n) and n > 1):
                continue
            if np.any((cs < c.end[i]) & (ce > c.start[i])):
                continue
            algo = c.algorithm[i] or "unknown"
            key = f"{op}/{algo}/{protocol_key(c.protocol[i])}/{int(n)}"
            bus = size * nccl.bus_factor(op, int(n))  # type: ignore[arg-type]
            sizes = out.setdefault(key, {})
            sizes[bus] = min(sizes.get(bus, math.inf), float(c.dur[i]))
    return {k: sorted(v.items()) for k, v in out.items()}


def collective_time_s(bus_bytes: np.ndarray, latency_s: float, bus_bandwidth_bytes_per_s: float) -> np.ndarray:
    """The fitted time of a collective moving ``bus_bytes`` (bus bytes, as NCCL's tests count them)."""
    return np.asarray(latency_s + bus_bytes / bus_bandwidth_bytes_per_s)


def fit_collectives(traces: Sequence[TraceInput]) -> tuple[dict[str, Any], dict[str, Any]]:
    rows: dict[str, dict[float, float]] = {}
    for tr in traces:
        for key, pts in _collective_rows(tr.bundle).items():
            d = rows.setdefault(key, {})
            for b, t in pts:
                d[b] = min(d.get(b, math.inf), t)
    fitted: dict[str, dict[str, float]] = {}
    record: dict[str, Any] = {"method": "non-negative least squares of t = latency + bus_bytes / bandwidth on "
                                        "the fastest instance of each message size", "collectives": {}}
    for key, d in sorted(rows.items()):
        pts = sorted(d.items())
        if len(pts) < 2:
            record["collectives"][key] = {"points": len(pts), "fitted": False,
                                          "why": "one message size: latency and bandwidth cannot be told apart"}
            continue
        b_bytes = np.array([p[0] for p in pts])
        t_s = np.array([p[1] for p in pts])
        # Relative residuals: divide each row by its time so small messages count as much as large.
        coef, _ = nnls(np.stack([np.ones_like(b_bytes), b_bytes], axis=1) / t_s[:, None], np.ones_like(t_s))
        lat, inv_bw = float(coef[0]), float(coef[1])
        if inv_bw <= 0:
            record["collectives"][key] = {"points": len(pts), "fitted": False,
                                          "why": "no growth of time with size in the data"}
            continue
        pred = collective_time_s(b_bytes, lat, 1.0 / inv_bw)
        fitted[key] = {"latency_s": float(f"{lat:.4g}"), "bus_bandwidth_bytes_per_s": float(f"{1 / inv_bw:.4g}")}
        record["collectives"][key] = {
            "points": len(pts), "fitted": True, "bus_bytes_range": [float(b_bytes.min()), float(b_bytes.max())],
            "fit_mape_pct": round(float(np.mean(np.abs(pred - t_s) / t_s) * 100), 2)}
    if not fitted:
        why = "; ".join(f"{k}: {v['why']}" for k, v in record["collectives"].items()) or \
            "no collective of known message size ran without compute beside it"
        raise OvsimError(f"no collective could be fitted ({why})", field="collectives")
    return {"nccl_fitted": fitted}, record


# CUTLASS and cuBLAS tensor-op names: accumulator letter, MMA instruction shape, "gemm".
_MMA = re.compile(r"(?:^|_)(?P<acc>[sdhi])(?P<shape>\d{3,5})gemm")
_CUDA_CORE_GEMM = re.compile(r"(?:^|_)[sdhc]gemm")


# The profiler's names of the input types that fix a tensor-core precision on their own. FP32
# inputs do not: cuBLAS runs them on TF32 tensor cores or on CUDA cores, which only the kernel
# name tells.
_HOST_TYPE_PRECISION = {"c10::bfloat16": "bf16", "c10::half": "fp16", "c10::float8_e4m3fn": "fp8",
                        "c10::float8_e5m2": "fp8", "c10::float8_e4m3fnuz": "fp8", "c10::float8_e5m2fnuz": "fp8"}


def gemm_precision(kernel_name: str, host_types: str = "") -> str | None:
    """The tensor-core precision a GEMM kernel's name says, where it says one: an input type in
    the name, else the instruction: ``h1688gemm`` / ``h16816gemm`` accumulate in half precision
    (fp16 inputs), ``s1688gemm`` with no input type is Ampere's fp32-in, fp32-accumulate MMA,
    i.e. TF32 (Turing's and Volta's fp16 variants name their fp16 inputs), ``d884gemm`` FP64
    tensor cores, ``i8816gemm`` / ``i16832gemm`` INT8. CUDA-core kernels (``sgemm``) have none.

    A name that says none of these (cuBLAS's generated ``nvjet_*`` kernels) takes the launching
    operator's first two input types (``host_types``, as the profiler records them) where both are
    the same 16- or 8-bit type."""
    by_name = _precision_in_name(kernel_name)
    if by_name is not None or _CUDA_CORE_GEMM.search(kernel_name.lower()):
        return by_name
    return _precision_of_inputs(host_types)


def _precision_of_inputs(host_types: str) -> str | None:
    if not host_types:
        return None
    try:
        types = ast.literal_eval(host_types)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(types, list) or len(types) < 2:
        return None
    found = {_HOST_TYPE_PRECISION.get(str(t).lower()) for t in types[:2]}
    return found.pop() if len(found) == 1 else None


def _precision_in_name(kernel_name: str) -> str | None:
    n = kernel_name.lower()
    if "e4m3" in n or "e5m2" in n:
        return "fp8"
    if "bf16" in n:
        return "bf16"
    if "tf32" in n:
        return "tf32"
    if "f16" in n or "hgemm" in n or "fp16" in n:
        return "fp16"
    m = _MMA.search(n)
    if m is None:
        return None
    acc, shape = m["acc"], m["shape"]
    if acc == "h":
        return "fp16"
    if acc == "d":
        return "fp64"
    if acc == "i":
        return "int8"
    return "tf32" if shape == "1688" else None


def _clean_gemms(traces: Sequence[TraceInput]) -> Iterator[tuple[GpuSpec, _Cols, int, tuple[int, int, int, int], str]]:
    """(GPU, kernel columns, row, (m, n, k, batch), precision) of every GEMM kernel the GEMM fits
    can use: ran without communication beside it, launching operator with input shapes, precision
    in the name or the operator's input types (:func:`gemm_precision`), a peak for that precision;
    split-K reductions and GEMV kernels left out."""
    for tr in traces:
        gpu = load_gpu(tr.gpu)
        df = tr.bundle.kernels.reset_index(drop=True)
        c = _Cols.of(df)
        host_types = [str(x) for x in df["host_types"].tolist()]
        overlapped = _overlap_flags(c)
        for i in np.flatnonzero(np.array([k == "gemm" for k in c.kind]) & ~overlapped):
            name = c.name[i].lower()
            if "reduce" in name or "gemv" in name or not c.dur[i] > 0:
                continue
            prob, prec = gemm_problem(c.host_op[i]), gemm_precision(c.name[i], host_types[i])
            if prob is None or prec is None or prec not in gpu.compute.peak_flops_per_s:
                continue
            yield gpu, c, int(i), prob, prec


def gemm_points(traces: Sequence[TraceInput]) -> dict[str, list[tuple[float, float, float, float, bool]]]:
    """Per precision, the GEMM kernels :func:`fit_gemm` uses (:func:`_clean_gemms`). Each is
    (measured s, main-loop s at efficiency 1 = waves x blocks_per_sm x flops_per_tile / (peak /
    SMs), waves, FLOPs, whether its leading dimensions are aligned as
    :func:`ovsim.models.cost.gemm_aligned` says), at the measured grid and occupancy.

    A persistent kernel's waves are its launched grid's, not rounds of its tiles: counting rounds
    of the tiles its name gives (:func:`ovsim.replay.persistent_tiles`) raised the fit error on the
    1,479 aligned GEMMs of the shared H100 traces from 4.1% to 10.6% (their tile schedulers spread
    the tiles' work over the SMs more evenly than whole rounds).

    Memory-bound aligned GEMMs are left out: those whose operands and output, each moved once at
    the peak HBM bandwidth, take at least their main loop at efficiency 1 (a decode step's or a
    small batch's product streaming its weight), whose time says nothing of the main loop's
    efficiency. On the H100's shapes part (calibration/data/h100-sxm5-80gb/2026-11-26-f) they
    were half the BF16 GEMMs, and the fit error with them 22.4% against 5.0% without, at nearly
    the same efficiency. Unaligned GEMMs all stay: their own efficiency is what the narrow-load
    kernels achieve, memory or not."""
    from ovsim.models import cost
    from ovsim.replay import _block

    work: dict[str, list[tuple[float, float, float, float, bool]]] = {}
    for gpu, c, i, prob, prec in _clean_gemms(traces):
        grid, shape = _block(c, i, gpu)
        occ = max(1, cost.blocks_per_sm(shape, gpu))
        m, n, k, batch = prob
        flops = 2.0 * m * n * k * batch
        waves = math.ceil(grid / (gpu.sm.count * occ))
        w = waves * occ * (flops / grid) / (gpu.peak_flops_per_s(prec) / gpu.sm.count)
        aligned = cost.gemm_aligned(n, k, prec)
        compulsory_s = cost.element_bytes(prec) * batch * (m * k + k * n + m * n) / gpu.memory.bandwidth_bytes_per_s
        if aligned and compulsory_s >= w:
            continue
        work.setdefault(prec, []).append((float(c.dur[i]), w, float(waves), flops, aligned))
    return work


def gemm_shapes(traces: Sequence[TraceInput]) -> dict[str, list[tuple[int, int, int, int, float, bool]]]:
    """Per precision, the same GEMM kernels as :func:`gemm_points` by their problem: (m, n, k,
    batch, measured s, aligned), for pricing them as a scenario does (the library kernel the cost
    model picks) rather than at their measured grid."""
    from ovsim.models import cost

    out: dict[str, list[tuple[int, int, int, int, float, bool]]] = {}
    for _, c, i, (m, n, k, batch), prec in _clean_gemms(traces):
        out.setdefault(prec, []).append((m, n, k, batch, float(c.dur[i]), cost.gemm_aligned(n, k, prec)))
    return out


# Unaligned GEMMs a precision needs for their own efficiency to be fitted.
GEMM_MIN_UNALIGNED = 3


def gemm_time_s(main_loop_s: np.ndarray, waves: np.ndarray, inverse_efficiency: float, tile_s: float,
                overhead_s: float) -> np.ndarray:
    """The fit's GEMM time: the overhead, the main loop (its time at efficiency 1, from
    :func:`gemm_points`) over the efficiency, and a fixed time per wave of tiles."""
    return np.asarray(overhead_s + main_loop_s * inverse_efficiency + waves * tile_s)


def gemm_mape(t_s: np.ndarray, main_loop_s: np.ndarray, waves: np.ndarray, efficiency: float, tile_s: float,
              overhead_s: float) -> float:
    """Mean absolute relative error (a fraction) of :func:`gemm_time_s` at ``efficiency`` against
    the measured ``t_s``."""
    return float(np.mean(np.abs(gemm_time_s(main_loop_s, waves, 1.0 / efficiency, tile_s, overhead_s) - t_s) / t_s))


def gemm_efficiency_at(t_s: np.ndarray, main_loop_s: np.ndarray, waves: np.ndarray, tile_s: float,
                       overhead_s: float) -> tuple[float, float]:
    """The main-loop efficiency (to 0.001) of least mean absolute relative error for GEMMs measured
    at ``t_s``, at a given time per wave, and that error (a fraction)."""
    from scipy.optimize import minimize_scalar

    def mape(eff: float) -> float:
        return gemm_mape(t_s, main_loop_s, waves, eff, tile_s, overhead_s)

    eff = round(float(minimize_scalar(mape, bounds=(0.002, 1.0), method="bounded", options={"xatol": 1e-5}).x), 3)
    return eff, mape(eff)


GEMM_FRAMES = ("grid", "scenario")


def fit_gemm(traces: Sequence[TraceInput], params: Parameters, frame: str = "grid"
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``gemm_efficiency`` and ``gemm_tile_overhead_s`` per precision from GEMM kernels that ran
    without communication and whose launching operator records its input shapes.

    Model: the cost model's waves with the measured grid and occupancy, ``t = kernel_overhead_s +
    waves x (blocks_per_sm x (2 M N K batch / grid) / (peak / SMs x efficiency) + tile_s)``: a main
    loop at the efficiency, and a fixed time per wave of tiles (pipeline fill, epilogue) that makes
    short-K and small GEMMs less efficient. Both minimise the mean absolute relative error (Powell,
    bounded, from the relative least-squares solution). The fixed time is fitted only where the
    points identify it (main-loop work per wave differing by 2x or more between them) and kept
    only where it lowers the error of the efficiency alone, which is fitted and recorded too.

    These are fitted on aligned GEMMs (:func:`ovsim.models.cost.gemm_aligned`). Unaligned ones run
    on other kernels: with at least ``GEMM_MIN_UNALIGNED`` of them, their own main-loop efficiency
    (``gemm_unaligned_efficiency``) is fitted at the same time per wave.

    ``frame`` "scenario" fits the two instead where scenarios use them: each aligned GEMM priced as
    a scenario GEMM of its problem (the library kernel the cost model picks,
    :func:`fit_library_gemm`), not at its measured grid; no unaligned efficiency then."""
    if frame not in GEMM_FRAMES:
        raise OvsimError(f"unknown GEMM frame '{frame}'; one of {', '.join(GEMM_FRAMES)}", field="gemm_frame")
    if frame == "scenario":
        return _fit_gemm_scenario(traces, params)
    work = gemm_points(traces)
    if not work:
        raise OvsimError("no GEMM kernel without communication beside it has a launching operator with input "
                         "shapes (record_shapes) and a precision in its name", field="gemm")
    effs: dict[str, float] = {}
    tiles: dict[str, float] = {}
    record: dict[str, Any] = {"method": "the cost model's waves at the measured grid: main-loop efficiency and a "
                                        "fixed time per wave of tiles, minimising the mean absolute relative "
                                        "error (Powell, bounded), on GEMMs whose n and k are on 16 bytes; the "
                                        "others' own efficiency at that time per wave (bounded scalar)",
                              "precisions": {}}
    ko = params.kernel_overhead_s
    unaligned: dict[str, float] = {}
    for prec, pts in sorted(work.items()):
        main = [p for p in pts if p[4]]
        rec: dict[str, Any] = {"points": 0, "note": "no aligned GEMM: gemm_efficiency not fitted"}
        tile = params.gemm_tile_s(prec)
        if main:
            effs[prec], tile, rec = _fit_gemm_main(main, ko)
            tiles[prec] = tile
        odd = [p for p in pts if not p[4]]
        if len(odd) >= GEMM_MIN_UNALIGNED:
            t_s, w_s, n_waves = (np.array([p[j] for p in odd]) for j in range(3))
            eff_u, err = gemm_efficiency_at(t_s, w_s, n_waves, tile, ko)
            unaligned[prec] = eff_u
            rec["unaligned"] = {"points": len(odd), "efficiency": eff_u, "fit_mape_pct": round(err * 100, 2),
                                "time_per_wave_s": tile}
        elif odd:
            rec["unaligned"] = {"points": len(odd), "fitted": False,
                                "why": f"fewer than {GEMM_MIN_UNALIGNED} unaligned GEMMs"}
        if main or prec in unaligned:
            record["precisions"][prec] = rec
    if not record["precisions"]:
        raise OvsimError("no precision has an aligned GEMM or enough unaligned ones to fit", field="gemm")
    values: dict[str, Any] = {"gemm_efficiency": effs, "gemm_tile_overhead_s": tiles}
    if unaligned:
        values["gemm_unaligned_efficiency"] = unaligned
    return values, record


def _fit_gemm_scenario(traces: Sequence[TraceInput], params: Parameters) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`fit_gemm` in the scenario's frame."""
    shapes = {prec: [r[:5] for r in rows if r[5]] for prec, rows in gemm_shapes(traces).items()}
    shapes = {prec: rows for prec, rows in shapes.items() if rows}
    if not shapes:
        raise OvsimError("no aligned GEMM kernel without communication beside it has a launching operator with "
                         "input shapes (record_shapes) and a precision", field="gemm")
    gpu = load_gpu(traces[0].gpu)
    effs: dict[str, float] = {}
    tiles: dict[str, float] = {}
    record: dict[str, Any] = {"method": "scenario frame: each aligned GEMM priced as a scenario GEMM of its problem "
                                        "(ovsim.models.cost.best_gemm), efficiency and time per wave of least mean "
                                        "absolute relative error (ovsim.calibrate.fit_library_gemm); no unaligned "
                                        "efficiency in this frame", "frame": "scenario", "precisions": {}}
    for prec, rows in sorted(shapes.items()):
        effs[prec], tiles[prec], err = fit_library_gemm(rows, prec, gpu, params)
        record["precisions"][prec] = {"points": len(rows), "problems": len({r[:4] for r in rows}),
                                      "fit_mape_pct": round(err * 100, 2)}
    return {"gemm_efficiency": effs, "gemm_tile_overhead_s": tiles}, record


def _fit_gemm_main(pts: list[tuple[float, float, float, float, bool]], ko: float
                   ) -> tuple[float, float, dict[str, Any]]:
    """:func:`fit_gemm` on aligned GEMMs: (main-loop efficiency, time per wave, record)."""
    from scipy.optimize import lsq_linear, minimize, minimize_scalar

    t_s = np.array([p[0] for p in pts])
    w_s = np.array([p[1] for p in pts])
    n_waves = np.array([p[2] for p in pts])
    gflop = np.array([p[3] for p in pts]) / 1e9

    def mape(inv_eff: float, tile_s: float) -> float:
        return float(np.mean(np.abs(gemm_time_s(w_s, n_waves, inv_eff, tile_s, ko) - t_s) / t_s))

    one = minimize_scalar(lambda e: mape(1.0 / e, 0.0), bounds=(0.01, 1.0), method="bounded",
                          options={"xatol": 1e-4})
    eff, tile = round(float(one.x), 3), 0.0
    per_wave = w_s / n_waves
    identified = len(pts) >= 3 and float(per_wave.max()) >= 2.0 * float(per_wave.min())
    note = "the points do not identify a fixed time per wave (their main-loop work per wave is too alike)"
    if identified:
        # Relative least squares (rows divided by the time) gives the start; L1 refines it.
        a = np.column_stack([w_s, n_waves]) / t_s[:, None]
        start = lsq_linear(a, (t_s - ko) / t_s, bounds=([1.0, 0.0], [100.0, 1e-3])).x
        res = minimize(lambda x: mape(x[0], x[1] * 1e-6), x0=[start[0], start[1] * 1e6], method="Powell",
                       bounds=[(1.0, 100.0), (0.0, 1000.0)], options={"xtol": 1e-6, "ftol": 1e-9})
        e2, t2 = round(1.0 / float(res.x[0]), 3), round(float(res.x[1]) * 1e-6, 9)
        if mape(1.0 / e2, t2) < mape(1.0 / eff, 0.0):
            eff, tile = e2, t2
            note = "main-loop efficiency and a fixed time per wave of tiles"
        else:
            note = "a fixed time per wave did not lower the error of the efficiency alone"
    pred = gemm_time_s(w_s, n_waves, 1.0 / eff, tile, ko)
    rel = np.abs(pred - t_s) / t_s
    # The larger and smaller half by rank, not by the median: with many GEMMs of the median's size,
    # a median split could leave one half empty.
    big = np.zeros(len(pts), dtype=bool)
    big[np.argsort(gflop, kind="stable")[len(pts) // 2:]] = True
    return eff, tile, {
        "points": len(pts), "fit_mape_pct": round(float(rel.mean() * 100), 2),
        "fit_mape_pct_efficiency_only": round(mape(1.0 / round(float(one.x), 3), 0.0) * 100, 2),
        "efficiency_only": round(float(one.x), 3),
        "fit_mape_pct_larger_half": round(float(rel[big].mean() * 100), 2),
        "fit_mape_pct_smaller_half": round(float(rel[~big].mean() * 100), 2) if (~big).any() else None,
        "gflop_range": [round(float(gflop.min()), 4), round(float(gflop.max()), 2)],
        "note": note}


def library_gemm_times(problems: Sequence[tuple[int, int, int, int, float]], precision: str, gpu: GpuSpec,
                       params: Parameters) -> np.ndarray:
    """:func:`ovsim.models.cost.best_gemm`'s time (s) for each GEMM (m, n, k, batch, measured s),
    in order; each problem is priced once."""
    from ovsim.models import cost

    times: dict[tuple[int, int, int, int], float] = {}
    for m, n, k, b, _ in problems:
        if (m, n, k, b) not in times:
            times[(m, n, k, b)] = cost.best_gemm(m, n, k, precision, gpu, params, batch=b).isolated_s
    return np.array([times[(m, n, k, b)] for m, n, k, b, _ in problems])


def library_gemm_errors(problems: Sequence[tuple[int, int, int, int, float]], precision: str, gpu: GpuSpec,
                        params: Parameters) -> np.ndarray:
    """Absolute relative error (fractions) of :func:`library_gemm_times` against each GEMM's
    measured time."""
    measured = np.array([p[4] for p in problems], dtype=float)
    return np.asarray(np.abs(library_gemm_times(problems, precision, gpu, params) - measured) / measured)


def library_gemm_mape(problems: Sequence[tuple[int, int, int, int, float]], precision: str, gpu: GpuSpec,
                      params: Parameters) -> float:
    """Mean absolute relative error (a fraction) of :func:`ovsim.models.cost.best_gemm`'s time
    against GEMMs (m, n, k, batch, measured s)."""
    return float(np.mean(library_gemm_errors(problems, precision, gpu, params)))


# Starting points of the library-frame fit (efficiency, microseconds per wave): its error jumps
# where the chosen kernel changes, so one start can stop on a step.
_LIBRARY_STARTS = ((0.8, 1.0), (0.9, 5.0), (0.7, 0.0))


def fit_library_gemm(problems: Sequence[tuple[int, int, int, int, float]], precision: str, gpu: GpuSpec,
                     params: Parameters) -> tuple[float, float, float]:
    """``gemm_efficiency`` and ``gemm_tile_overhead_s`` of ``precision`` (and their error, a
    fraction) that bring the scenario GEMM, :func:`ovsim.models.cost.best_gemm`, to GEMMs
    (m, n, k, batch, measured s) measured alone: the mean absolute relative error,
    minimised with Powell from a few starts.

    This fits the parameters in the frame a scenario prices a GEMM in (the library kernel the cost
    model chooses for the shape), where :func:`fit_gemm` fits them at each kernel's measured grid:
    a trace's kernels replay at their measured times, so the scenario's GEMMs are what these
    parameters price."""
    from scipy.optimize import minimize

    if not problems:
        raise OvsimError(f"no {precision} GEMM to fit", field="gemm")

    def mape(x: np.ndarray) -> float:
        # Powell's bounded steps can land a rounding error outside the bounds.
        eff, tile_us = min(1.0, max(0.01, float(x[0]))), max(0.0, float(x[1]))
        p = params.merged({"gemm_efficiency": {precision: eff}, "gemm_tile_overhead_s": {precision: tile_us * 1e-6}})
        return library_gemm_mape(problems, precision, gpu, p)

    best = min((minimize(mape, np.array(x0), method="Powell", bounds=[(0.01, 1.0), (0.0, 1000.0)],
                         options={"xtol": 1e-4, "ftol": 1e-7})
                for x0 in _LIBRARY_STARTS), key=lambda r: float(r.fun))
    eff, tile_s = round(min(1.0, max(0.01, float(best.x[0]))), 3), round(max(0.0, float(best.x[1])) * 1e-6, 9)
    p = params.merged({"gemm_efficiency": {precision: eff}, "gemm_tile_overhead_s": {precision: tile_s}})
    return eff, tile_s, library_gemm_mape(problems, precision, gpu, p)


# A memory kernel's bytes count as HBM traffic only when they exceed the L2 this many times: below
# it, inputs its producer just wrote are still in L2 and writes can drain after the kernel ends
# (measured elementwise kernels of 1-2x L2 on the shared H100 traces run up to 1.1x the HBM peak).
MEMORY_L2_MULTIPLE = 2.0
MEMORY_MIN_POINTS = 3
# The classes of :data:`ovsim.traces.aten.CLASSES` the cost model prices (MemoryOp kinds); copies
# are measured and reported only.
MEMORY_FITTED = ("elementwise", "norm", "softmax")


def memory_mape(t_s: np.ndarray, peak_s: np.ndarray, fraction: float, overhead_s: float) -> float:
    """Mean absolute relative error of the cost model's streaming-kernel time, ``overhead_s +
    peak_s / fraction``, against measured times ``t_s`` (``peak_s``: bytes / peak HBM bandwidth)."""
    return float(np.mean(np.abs(memory_time_s(peak_s, fraction, overhead_s) - t_s) / t_s))


def memory_time_s(peak_s: np.ndarray, fraction: float, overhead_s: float) -> np.ndarray:
    """The cost model's streaming-kernel time: ``overhead_s + peak_s / fraction`` (``peak_s``: its
    bytes over the peak HBM bandwidth; ``fraction``: of the peak it reaches)."""
    return np.asarray(overhead_s + peak_s / fraction)


def _memory_kernels(tr: TraceInput) -> tuple[list[tuple[float, Traffic]], dict[str, int]]:
    """The trace's memory-bound kernels whose bytes :func:`ovsim.traces.aten.traffic` knows and
    that time one operator call alone (measured s, traffic); and how many were left out, by
    reason."""
    df = tr.bundle.kernels.reset_index(drop=True)
    c = _Cols.of(df)
    overlapped = _overlap_flags(c)
    ids = df["host_op_id"]
    # Kernels per operator call: an operator that launched several kernels cannot be split.
    calls = df.groupby([df["rank"], ids], dropna=True).size()
    types = df["host_types"].tolist()
    ranks, call = df["rank"].tolist(), ids.tolist()
    candidates = np.isin(np.array(c.kind), ["elementwise", "norm", "other"]) & (df["host_types"] != "").to_numpy()
    kept: list[tuple[float, Traffic]] = []
    left: dict[str, int] = {}
    for i in np.flatnonzero(candidates):
        t = traffic(c.host_op[i], types[i])
        if t is None or not c.dur[i] > 0:
            continue
        why = ("overlapped communication" if overlapped[i] else
               "operator call not recorded" if pd.isna(call[i]) else
               "operator call launched several kernels" if calls.get((ranks[i], call[i]), 0) != 1 else "")
        if why:
            left[why] = left.get(why, 0) + 1
        else:
            kept.append((float(c.dur[i]), t))
    return kept, left


def memory_points(traces: Sequence[TraceInput]) -> tuple[dict[str, list[tuple[float, float]]], dict[str, int]]:
    """Per class of memory-bound kernel (:data:`ovsim.traces.aten.CLASSES`), the kernels
    :func:`fit_memory` uses as (measured s, bytes / peak HBM bandwidth s); and how many kernels with
    a known traffic were left out, by reason."""
    points: dict[str, list[tuple[float, float]]] = {}
    left: dict[str, int] = {}
    for tr in traces:
        gpu = load_gpu(tr.gpu)
        bw = gpu.memory.bandwidth_bytes_per_s
        min_bytes = MEMORY_L2_MULTIPLE * gpu.memory.l2_bytes
        kept, why = _memory_kernels(tr)
        for k, n in why.items():
            left[k] = left.get(k, 0) + n
        for dur_s, t in kept:
            if t.bytes < min_bytes:
                k = f"moves less than {MEMORY_L2_MULTIPLE:g}x the L2"
                left[k] = left.get(k, 0) + 1
            else:
                points.setdefault(t.op_class, []).append((dur_s, t.bytes / bw))
    return points, left


def published_achievable_fraction() -> float:
    """``hbm_achievable_fraction`` of the newest default calibration file: measured over peak HBM
    bandwidth in published bandwidth tests, before any trace raised it."""
    default = newest_file("default", CALIB_DIR)
    value = read_calib_file(default).parameters.get("hbm_achievable_fraction") if default is not None else None
    return float(value) if value is not None else Parameters().hbm_achievable_fraction


def fit_memory(traces: Sequence[TraceInput], params: Parameters) -> tuple[dict[str, Any], dict[str, Any]]:
    """``memory_kernel_efficiency`` (streaming elementwise kernels), ``memory_kind_efficiency``
    (norm, softmax) and, where streaming kernels reach more than it, ``hbm_achievable_fraction``,
    from memory-bound kernels whose launching operator records input shapes and types
    (:func:`ovsim.traces.aten.traffic` gives their bytes).

    Model: the cost model's streaming kernel, ``t = kernel_overhead_s + bytes / (peak HBM bandwidth
    x fraction)``, the fraction of the peak per class minimising the mean absolute relative error.
    A fraction is an efficiency of the achievable bandwidth (``hbm_achievable_fraction`` x
    efficiency); where elementwise kernels reach more than the achievable fraction, that fraction
    is what is achievable and rises to it (the HBM channel must carry what a kernel was measured
    to move), and the efficiencies are of the new one. Whenever streaming kernels are fitted, the
    achievable fraction is re-derived from the published figure
    (:func:`published_achievable_fraction`), not from what the current calibration holds. Only
    kernels that ran without communication beside them, were their operator call's only kernel
    and moved at least ``MEMORY_L2_MULTIPLE`` times the L2 count; a class with fewer than
    ``MEMORY_MIN_POINTS`` is not fitted."""
    from scipy.optimize import minimize_scalar

    points, left = memory_points(traces)
    record: dict[str, Any] = {
        "method": "the cost model's streaming kernel: bytes from the operator's input shapes and types over the "
                  "peak HBM bandwidth times a fraction per class, minimising the mean absolute relative error; "
                  "efficiency = fraction / hbm_achievable_fraction, which is the published bandwidth-test figure "
                  "or the elementwise fraction, whichever is higher",
        "min_bytes": f"{MEMORY_L2_MULTIPLE:g}x the GPU's L2", "left_out": dict(sorted(left.items())), "classes": {}}
    ko = params.kernel_overhead_s
    ach = params.hbm_achievable_fraction
    fractions: dict[str, float] = {}
    for cls, pts in sorted(points.items()):
        t_s = np.array([p[0] for p in pts])
        peak_s = np.array([p[1] for p in pts])

        def mape(fraction: float, t_s: np.ndarray = t_s, peak_s: np.ndarray = peak_s, ko: float = ko) -> float:
            return memory_mape(t_s, peak_s, fraction, ko)

        rec: dict[str, Any] = {"points": len(pts), "median_fraction_of_peak": round(float(np.median(peak_s / t_s)), 3),
                               "fit_mape_pct_before": round(mape(ach * params.memory_eff(cls)) * 100, 2)}
        record["classes"][cls] = rec
        if cls not in MEMORY_FITTED or len(pts) < MEMORY_MIN_POINTS:
            rec.update(fitted=False, why=f"fewer than {MEMORY_MIN_POINTS} kernels" if cls in MEMORY_FITTED else
                       "measured only: the cost model has no such kernel")
            continue
        res = minimize_scalar(mape, bounds=(0.02, 1.0), method="bounded", options={"xatol": 1e-5})
        fractions[cls] = round(float(res.x), 3)
        # The fraction is the kernel body's, with kernel_overhead_s (an assumption) taken off every
        # kernel; how much that assumption moves it is recorded beside it.
        bare = minimize_scalar(lambda f: mape(f, ko=0.0), bounds=(0.02, 1.0), method="bounded",
                               options={"xatol": 1e-5})
        rec.update(fitted=True, fraction_of_peak=fractions[cls], fit_mape_pct=round(mape(fractions[cls]) * 100, 2),
                   fraction_of_peak_without_kernel_overhead=round(float(bare.x), 3))
    if not fractions:
        why = "; ".join(f"{k}: {v}" for k, v in sorted(left.items())) or "none has a launching operator with input " \
            "shapes and types of a known memory-bound operator (record_shapes)"
        raise OvsimError(f"no memory-bound kernel could be fitted ({why})", field="memory")
    values: dict[str, Any] = {}
    # Re-derived from the published bandwidth-test figure whenever streaming kernels were fitted, so
    # that a fraction an older fit raised it to (under other parameters) does not outlive the data
    # that justified it.
    if "elementwise" in fractions:
        new_ach = max(published_achievable_fraction(), fractions["elementwise"])
        if new_ach != ach:
            ach = values["hbm_achievable_fraction"] = new_ach
    for cls, f in fractions.items():
        eff = round(f / ach, 3)
        record["classes"][cls]["efficiency"] = eff
        if cls == "elementwise":
            values["memory_kernel_efficiency"] = eff
        else:
            values.setdefault("memory_kind_efficiency", {})[cls] = eff
    return values, record


def memory_clock_time_s(clock_hz: np.ndarray, time_at_reference_s: float, share: float,
                        reference_hz: float) -> np.ndarray:
    """A memory-bound kernel's time at each SM clock when ``share`` of its ``time_at_reference_s``
    (at ``reference_hz``) follows the clock and the rest does not."""
    return time_at_reference_s * ((1.0 - share) + share * reference_hz / np.asarray(clock_hz, float))


def fit_clock_share(clock_hz: Sequence[float] | np.ndarray, duration_s: Sequence[float] | np.ndarray,
                    reference_hz: float) -> dict[str, Any]:
    """The share of a kernel's time at ``reference_hz`` that follows the SM clock, from its
    durations at the clocks it ran at (``memory_kind_clock_share``).

    ``t = a + b / f`` with ``a, b >= 0`` by non-negative least squares on relative error, so the
    share ``(b / f_ref) / (a + b / f_ref)`` lies in [0, 1]. Also: the time at the reference clock,
    the RMS relative residual, and that of the best time that does not follow the clock at all."""
    f = np.asarray(clock_hz, float)
    t = np.asarray(duration_s, float)
    if f.shape != t.shape or len(f) < 2:
        raise OvsimError("needs a duration for each clock, at least two", field="clock_hz")
    if not (np.isfinite(f).all() and np.isfinite(t).all() and (f > 0).all() and (t > 0).all()):
        raise OvsimError("clocks and durations must be positive and finite", field="duration_s")
    if f.max() <= f.min():
        raise OvsimError(f"all durations ran at one clock ({f[0] / 1e6:g} MHz): nothing tells what follows it",
                         field="clock_hz")
    if not (reference_hz > 0 and math.isfinite(reference_hz)):
        raise OvsimError(f"must be positive and finite, got {reference_hz}", field="reference_hz")
    g = 1e9 / f  # per GHz: keeps both columns of order one
    (a, b), _ = nnls(np.column_stack((1.0 / t, g / t)), np.ones_like(t))
    at_ref = a + b * 1e9 / reference_hz
    if at_ref <= 0:
        raise OvsimError("the durations do not fit a time that follows the clock in part", field="duration_s")
    share = float(b * 1e9 / reference_hz / at_ref)
    rms = float(np.sqrt(np.mean(((a + b * g) / t - 1.0) ** 2)))
    # The clock-free time with the least squared relative error.
    flat = float(np.sum(1.0 / t) / np.sum(1.0 / t**2))
    rms_flat = float(np.sqrt(np.mean((flat / t - 1.0) ** 2)))
    return {"share": share, "time_at_reference_s": float(at_ref), "points": len(t),
            "clock_mhz_range": [round(float(f.min()) / 1e6), round(float(f.max()) / 1e6)],
            "rms_relative_residual": rms, "rms_relative_residual_if_time_did_not_follow_the_clock": rms_flat}


def fit_control_window(measured: dict[str, tuple[np.ndarray, np.ndarray]],
                       simulate: Callable[[float, str], tuple[np.ndarray, np.ndarray]],
                       windows_s: Sequence[float], steady_from_s: float,
                       baseline_s: float | None = None) -> dict[str, Any]:
    """The power-limit loop's averaging window (``power_control_window_s``) from phases started
    from idle: per phase, ``measured`` (kernel start times from the phase's start, SM clock Hz),
    and ``simulate(window_s, phase)`` the predicted clock as a step function (change times, clock
    Hz) from an idle start.

    Each trajectory is taken about its own steady level (its median from ``steady_from_s`` on), so
    that an error in the steady clock itself, which the power weights set, does not pull the
    window; the window on the grid with the least RMS difference over all phases' kernels wins.
    ``baseline_s``, a window not on the grid (0: the clock of each moment), is reported beside it."""
    if not measured:
        raise OvsimError("no phase to fit the control window on", field="measured")
    if not windows_s or min(windows_s) <= 0:
        raise OvsimError("needs positive windows to try", field="windows_s")
    for phase, (t, _) in measured.items():
        steady = t >= steady_from_s
        if not steady.any() or steady.all():
            raise OvsimError(f"{phase}: needs kernels before and after {steady_from_s:g} s", field="measured")

    def errors(w: float) -> dict[str, np.ndarray]:
        out = {}
        for phase, (t, clk) in measured.items():
            steady = t >= steady_from_s
            at, value = simulate(w, phase)
            pred = value[np.clip(np.searchsorted(at, t, side="right") - 1, 0, len(value) - 1)]
            out[phase] = (pred - np.median(pred[steady])) - (clk - np.median(clk[steady]))
        return out

    def rms(x: np.ndarray) -> float:
        return round(float(np.sqrt(np.mean(x**2))) / 1e6, 1)

    by_window = {w: errors(w) for w in windows_s}
    total = {w: rms(np.concatenate(list(e.values()))) for w, e in by_window.items()}
    best = min(total, key=lambda w: total[w])
    out: dict[str, Any] = {
        "window_s": best, "rms_mhz": total[best],
        "rms_mhz_by_window_ms": {round(w * 1e3): v for w, v in total.items()},
        "rms_mhz_by_phase": {p: rms(e) for p, e in by_window[best].items()},
        "kernels": int(sum(len(t) for t, _ in measured.values())), "steady_from_s": steady_from_s}
    if baseline_s is not None:
        out["rms_mhz_at_baseline_window"] = {"window_s": baseline_s,
                                             "rms_mhz": rms(np.concatenate(list(errors(baseline_s).values())))}
    return out


# A memory-bound kernel times the fixed per-kernel cost when its bytes would stream in at most this
# long at the peak HBM bandwidth: a few percent of the 1.5-4 us such kernels take on the shared
# traces, and below the 1 us resolution some of them record.
OVERHEAD_MAX_BODY_S = 0.1e-6
OVERHEAD_MIN_POINTS = 10


def overhead_points(traces: Sequence[TraceInput]) -> tuple[dict[str, list[tuple[float, str]]], dict[str, int]]:
    """Per trace label, the kernels :func:`fit_overhead` looks at as (measured s, class):
    memory-bound kernels that timed one operator call alone and whose bytes take at most
    ``OVERHEAD_MAX_BODY_S`` at the peak HBM bandwidth; and how many were left out, by reason."""
    points: dict[str, list[tuple[float, str]]] = {}
    left: dict[str, int] = {}
    for tr in traces:
        max_bytes = OVERHEAD_MAX_BODY_S * load_gpu(tr.gpu).memory.bandwidth_bytes_per_s
        kept, why = _memory_kernels(tr)
        for k, n in why.items():
            left[k] = left.get(k, 0) + n
        for dur_s, t in kept:
            if t.bytes > max_bytes:
                k = f"takes more than {OVERHEAD_MAX_BODY_S * 1e6:g} us at the peak HBM bandwidth"
                left[k] = left.get(k, 0) + 1
            else:
                points.setdefault(tr.label, []).append((dur_s, t.op_class))
    return points, left


# Share of the durations cut from each end of the trimmed mean used for whole-microsecond data.
OVERHEAD_TRIM = 0.1


def whole_microseconds(t_s: np.ndarray) -> bool:
    """Whether durations were recorded in whole microseconds (Kineto traces of older PyTorch)."""
    return bool(np.allclose(t_s * 1e6, np.round(t_s * 1e6), rtol=0.0, atol=1e-6))


def least_mape_constant(t_s: np.ndarray) -> float:
    """The constant with the least mean absolute relative error to ``t_s``: their median weighted
    by 1 / t."""
    order = np.argsort(t_s)
    t, w = t_s[order], 1.0 / t_s[order]
    cum = np.cumsum(w)
    return float(t[np.searchsorted(cum, 0.5 * cum[-1])])


def overhead_estimate(t_s: np.ndarray) -> float:
    """The constant time that best stands for ``t_s``. Sub-microsecond durations: the one of least
    mean absolute relative error (:func:`least_mape_constant`). Whole-microsecond durations: a
    median would sit on a whole microsecond (kernels of about 3.5 us record as 3 or 4 about equally
    often), while end minus start, each cut to the microsecond, is unbiased on average; so their
    mean, trimmed by ``OVERHEAD_TRIM`` at each end against stray slow kernels."""
    from scipy.stats import trim_mean

    if whole_microseconds(t_s):
        return float(trim_mean(t_s, OVERHEAD_TRIM))
    return least_mape_constant(t_s)


def fit_overhead(traces: Sequence[TraceInput]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``kernel_overhead_s``, the fixed time the cost model adds to every kernel (launch of the
    grid, prologue, epilogue, the tail of the last wave), from the kernels that do nothing else:
    elementwise kernels whose bytes would stream in at most ``OVERHEAD_MAX_BODY_S`` at the peak
    HBM bandwidth (:func:`overhead_points`). The cost model prices such a kernel at the overhead
    alone; the fit is :func:`overhead_estimate` of their durations, every kernel of every trace
    weighted alike. Tiny copies, norms and softmaxes take longer (strided indexing, reductions) and
    are recorded beside it, not fitted."""
    points, left = overhead_points(traces)
    t_s = np.array([t for pts in points.values() for t, _ in pts])
    classes = np.array([c for pts in points.values() for _, c in pts])
    use = t_s[classes == "elementwise"]
    if len(use) < OVERHEAD_MIN_POINTS:
        raise OvsimError(f"{len(use)} elementwise kernels small enough to time the per-kernel overhead (at most "
                         f"{OVERHEAD_MAX_BODY_S * 1e6:g} us of traffic at the peak HBM bandwidth, alone, one per "
                         f"operator call with recorded input shapes and types); {OVERHEAD_MIN_POINTS} are needed",
                         field="overhead")
    overhead = round(overhead_estimate(use), 9)
    whole_us = whole_microseconds(use)
    record: dict[str, Any] = {
        "method": (f"mean trimmed by {OVERHEAD_TRIM:g} at each end (durations in whole microseconds)" if whole_us else
                   "median weighted by 1 / duration (the constant of least mean absolute relative error)")
                  + " of the durations of elementwise kernels whose traffic takes at most "
                  f"{OVERHEAD_MAX_BODY_S * 1e6:g} us at the peak HBM bandwidth, alone, one per operator call",
        "points": len(use),
        "points_per_trace": {k: sum(c == "elementwise" for _, c in v) for k, v in sorted(points.items())},
        "left_out": dict(sorted(left.items())),
        "p10_p90_us": [round(float(np.percentile(use, q)) * 1e6, 3) for q in (10, 90)],
        "fit_mape_pct": round(float(np.mean(np.abs(overhead - use) / use)) * 100, 2),
        "median_us_other_classes": {str(c): {"kernels": int(np.sum(classes == c)),
                                             "median_us": round(float(np.median(t_s[classes == c])) * 1e6, 3)}
                                    for c in sorted(set(classes.tolist()) - {"elementwise"})},
        "note": "fit error (on the traces fitted), not prediction error; held-out figures come from `ovsim validate`",
    }
    return {"kernel_overhead_s": overhead}, record


# Weights of ovsim.hw.power.fit_power -> (the activity that identifies each, the calibration
# parameter it becomes).
_POWER_PARAMS = {"tensor_w": ("sm_tensor_fraction", "power_tensor_w"), "fp32_w": ("sm_fp32_fraction", "power_fp32_w"),
                 "memory_w": ("sm_memory_fraction", "power_memory_w"),
                 "hbm_w": ("hbm_bytes_per_s", "power_hbm_j_per_byte"),
                 "link_w": ("link_bytes_per_s", "power_link_j_per_byte")}


@dataclass(frozen=True)
class PowerSamples:
    """A trace's power samples beside the replay's activity (``ovsim.hw.power.FIT_COLUMNS``) and
    the shipped model's prediction at each (``predicted_w``)."""

    label: str
    log: str
    table: pd.DataFrame
    window_s: float


def _gpu_to_rank(tr: TraceInput, samples: pd.DataFrame, log: str) -> dict[int, int]:
    """Log GPU index -> trace rank, by the device each rank's kernels ran on."""
    k = tr.bundle.kernels
    out: dict[int, int] = {}
    for r in sorted(k["rank"].dropna().unique().tolist()):
        dev = k.loc[k["rank"] == r, "device"].dropna()
        if len(dev):
            d = int(dev.mode().iloc[0])
            if d in out:
                # Ranks of several hosts: one host's log cannot be told apart from another's.
                raise OvsimError(f"ranks {out[d]} and {int(r)} both ran on device {d} (several hosts): a power log "
                                 "covers one host; give it with a trace of that host's ranks", source=log,
                                 field="gpu")
            out[d] = int(r)
    gpus = sorted(set(samples["gpu"].tolist()))
    if not out and len(gpus) == 1 and k["rank"].nunique() == 1:
        out = {int(gpus[0]): int(k["rank"].iloc[0])}  # one GPU logged, one rank traced, no device ids
    if not set(out) & set(gpus):
        raise OvsimError(f"no GPU of the log ({', '.join(map(str, gpus))}) ran the trace (devices "
                         f"{', '.join(map(str, sorted(out))) or 'not recorded'})", source=log, field="gpu")
    return out


def power_samples(tr: TraceInput, log: PowerLog) -> PowerSamples:
    """The samples of ``log`` that fall inside the trace, each beside the activity of the trace's
    replay over the sensor's window (see the module docstring)."""
    from ovsim.replay import replay
    from ovsim.traces.power import align_samples, fit_table, offset_from_wall_clock, predicted_at, read_power_samples

    samples = read_power_samples(log.path)
    if samples.empty:
        raise OvsimError("the log has no power samples", source=log.path, field="power")
    if log.offset_s is not None:
        offset = log.offset_s
    elif tr.bundle.wall_origin_s is None:
        raise OvsimError(f"the trace {tr.label} records no wall clock to align the log with; give the trace time of "
                         "the log's first sample (--power-offset-s)", source=log.path, field="timestamp")
    else:
        offset = offset_from_wall_clock(samples, tr.bundle.wall_origin_s)
    window = log.window_s
    if window is None:
        steps = samples.groupby("gpu")["time_s"].diff().dropna()
        steps = steps[steps > 0]
        window = float(steps.median()) if len(steps) else 0.0
    k = tr.bundle.kernels
    start = float(k["start_s"].min())
    end = float((k["start_s"] + k["duration_s"]).max())
    # A sample averages the window before it: only windows wholly inside the trace are its activity.
    aligned = align_samples(samples, offset, start_s=start + window, end_s=end,
                            gpu_to_rank=_gpu_to_rank(tr, samples, log.path))
    if aligned.empty:
        t = samples["time_s"].to_numpy(float) + offset
        raise OvsimError(f"no sample falls inside the trace with its averaging window ({window:g} s): the log spans "
                         f"{t.min():.3f}..{t.max():.3f} s and the trace {start:.3f}..{end:.3f} s on the trace's clock "
                         "(nvidia-smi writes local time; give --power-offset-s)", source=log.path, field="timestamp")
    result = replay(tr.bundle, gpu=tr.gpu, counters=True, power=True)
    on_sim = aligned.assign(time_s=aligned["time_s"] - result.clock_offset_s)
    table = fit_table(on_sim, result.timeline.counters, window_s=window)
    table["predicted_w"] = predicted_at(on_sim, result.timeline.counters, "power_w", window)
    return PowerSamples(tr.label, Path(log.path).name, table, window)


def fit_power_logs(traces: Sequence[TraceInput], gpu: str, params: Parameters,
                   prepared: Sequence[PowerSamples] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fitted power parameters and the fit's record; raises when no trace has a power log or no
    sample falls inside its trace. ``prepared``: the traces' :func:`power_samples` (computed here
    when not given)."""
    from ovsim.hw.power import FIT_COLUMNS, fit_power, power_model

    data = list(prepared) if prepared is not None else [power_samples(tr, log) for tr in traces
                                                          for log in tr.power_logs]
    if not data:
        raise OvsimError("no power log given with the traces (--power-log)", field="power")
    spec = load_gpu(gpu)
    model = power_model(spec, params)
    table = pd.concat([d.table for d in data], ignore_index=True)
    fit = fit_power({c: table[c].to_numpy(float) for c in table.columns}, model, fit_idle=True)
    ok = np.isfinite(table[list(FIT_COLUMNS)].to_numpy(float)).all(axis=1)
    # Weights on bytes/s are written per byte, at the peak rate their activity is a fraction of.
    peak = {"hbm_w": model.hbm_peak_bytes_per_s, "link_w": model.link_peak_bytes_per_s}
    values: dict[str, Any] = {"power_idle_w": fit.params["idle_w"]}
    not_identifiable: list[str] = []
    for w, (activity, key) in _POWER_PARAMS.items():
        if not np.nanmax(np.abs(table.loc[ok, activity].to_numpy(float)), initial=0.0) > 0:
            not_identifiable.append(key)
            continue
        v = fit.params[w] / peak[w] if w in peak else fit.params[w]
        values[key] = {"default": v} if key == "power_tensor_w" else v
    meas = table.loc[ok, "power_w"].to_numpy(float)
    before = table.loc[ok, "predicted_w"].to_numpy(float)
    record = {
        "method": "least squares, non-negative weights (scipy least_squares), on samples beside the replay's "
                  "activity averaged over the sensor's window",
        "samples": fit.n_samples,
        "logs": [{"trace": d.label, "log": d.log, "samples": len(d.table), "window_s": d.window_s} for d in data],
        "fit_rmse_w": round(fit.rmse_w, 3),
        "fit_mape_pct": round(fit.mape_pct, 3),
        "shipped_model_mape_pct": round(float(np.nanmean(np.abs(before - meas) / np.maximum(meas, 1e-9)) * 100), 3),
        "not_identifiable": sorted(not_identifiable),
        "note": "fit error on the samples fitted; not a prediction error",
    }
    return _plain(values), record


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fit_points(quantity: str, traces: Sequence[TraceInput], params: Parameters, values: dict[str, Any], *,
               contention: Sequence[ContentionData] | None = None,
               power: Sequence[PowerSamples] | None = None, gemm_frame: str = "grid") -> pd.DataFrame:
    """The measured points the fit of ``quantity`` used, each beside what ``params`` with the fitted
    ``values`` on top predict for it (columns :data:`POINT_COLUMNS`). ``params`` are the ones the fit
    started from; ``contention`` and ``power``: the prepared data of those fits, in trace order."""
    p = params.merged(values)
    rows: list[tuple[str, str, str, str, float, float, float]] = []

    def add(group: str, trace: str, unit: str, measured: Any, fitted: Any, baseline: Any = None) -> None:
        m, f = np.asarray(measured, dtype=float), np.asarray(fitted, dtype=float)
        b = np.full(len(m), np.nan) if baseline is None else np.asarray(baseline, dtype=float)
        rows.extend((quantity, group, trace, unit, float(x), float(y), float(z))
                    for x, y, z in zip(m, f, b, strict=True))

    if quantity == "overhead":
        for label, timed in overhead_points(traces)[0].items():
            t = [d for d, cls in timed if cls == "elementwise"]
            add("elementwise", label, "s", t, [p.kernel_overhead_s] * len(t))
    elif quantity == "gemm" and gemm_frame == "scenario":
        for tr in traces:
            gpu = load_gpu(tr.gpu)
            for prec, problems in sorted(gemm_shapes([tr]).items()):
                scored = [r[:5] for r in problems if r[5] and prec in values.get("gemm_efficiency", {})]
                if scored:
                    add(prec, tr.label, "s", [r[4] for r in scored], library_gemm_times(scored, prec, gpu, p))
    elif quantity == "gemm":
        for tr in traces:
            aligned_eff, unaligned_eff = values.get("gemm_efficiency", {}), values.get("gemm_unaligned_efficiency", {})
            for prec, gemms in sorted(gemm_points([tr]).items()):
                for aligned, group, fitted in ((True, prec, aligned_eff), (False, f"{prec} unaligned", unaligned_eff)):
                    rows_of = [g for g in gemms if g[4] == aligned]
                    if prec not in fitted or not rows_of:
                        continue
                    arr = np.array([g[:4] for g in rows_of], dtype=float)
                    inverse = 1.0 / p.gemm_eff(prec, aligned)
                    add(group, tr.label, "s", arr[:, 0],
                        gemm_time_s(arr[:, 1], arr[:, 2], inverse, p.gemm_tile_s(prec), p.kernel_overhead_s))
    elif quantity == "memory":
        fitted_classes = ({"elementwise"} if "memory_kernel_efficiency" in values else set()) | \
            set(values.get("memory_kind_efficiency", {}))
        for tr in traces:
            for cls, streams in sorted(memory_points([tr])[0].items()):
                if cls in fitted_classes:
                    arr = np.array(streams, dtype=float)
                    add(cls, tr.label, "s", arr[:, 0],
                        memory_time_s(arr[:, 1], p.hbm_achievable_fraction * p.memory_eff(cls), p.kernel_overhead_s))
    elif quantity == "collectives":
        for tr in traces:
            for key, sizes in _collective_rows(tr.bundle).items():
                fit = values.get("nccl_fitted", {}).get(key)
                if fit is not None:
                    arr = np.array(sizes, dtype=float)
                    add(key, tr.label, "s", arr[:, 1],
                        collective_time_s(arr[:, 0], fit["latency_s"], fit["bus_bandwidth_bytes_per_s"]))
    elif quantity == "contention":
        data = contention if contention is not None else [contention_data(tr) for tr in traces]
        j = SM_FRACTIONS.index(p.replay_collective_sm_fraction)
        pressure, fraction = values.get("nccl_memory_pressure", {}), values.get("replay_hbm_fraction", {})
        for d in data:
            slow = np.array([contention_slowdown(k, held(ps, j), pressure, fraction, params, m)
                             for k, ps, m in d.config])
            kinds = [k for k, _, _ in d.config]
            pred = contention_time_s(d, j, slow) if len(slow) else np.empty(0)
            for kind in sorted(set(kinds)):
                sel = np.array([k == kind for k in kinds])
                add(kind, d.label, "s", d.measured_s[sel], pred[sel], d.isolated_s[sel])
    elif quantity == "power":
        from ovsim.hw.power import fit_table_power_w, power_model

        # A power fit is of one GPU (GPU_SPECIFIC): every trace ran on it.
        model = power_model(load_gpu(traces[0].gpu), p)
        for s in power if power is not None else [power_samples(tr, log) for tr in traces for log in tr.power_logs]:
            cols = {c: s.table[c].to_numpy(dtype=float) for c in s.table.columns}
            add(s.log, s.label, "W", cols["power_w"], fit_table_power_w(cols, model), cols["predicted_w"])
    else:
        raise OvsimError(f"unknown quantity '{quantity}' (known: {', '.join(QUANTITIES)})", field="fit")
    frame = pd.DataFrame(rows, columns=list(POINT_COLUMNS))
    kept: pd.DataFrame = frame[np.isfinite(frame["measured"]) & np.isfinite(frame["fitted"])].reset_index(drop=True)
    return kept


def calibrate(traces: Sequence[TraceInput], gpu: str, *, quantities: Sequence[str] | None = None,
              on_step: Callable[[str], None] | None = None, points: bool = False,
              sm_fraction: float | None = None, gemm_frame: str = "grid") -> FitReport:
    """Fit ``quantities`` (default: every one the traces support) for ``gpu`` ("*" for parameters
    that apply to any GPU, from traces of several GPUs). With ``points``, the report also holds
    every fitted point beside what the written parameters predict for it (:func:`fit_points`).
    ``sm_fraction`` fixes the contention fit's share of a collective's grid holding SMs
    (:func:`fit_contention`); ``gemm_frame`` is :func:`fit_gemm`'s frame."""
    if not traces:
        raise OvsimError("no traces to calibrate on", field="traces")
    if gpu != "*":
        for tr in traces:
            if tr.gpu != gpu:
                raise OvsimError(f"trace ran on {tr.gpu}, not {gpu}; calibrate one GPU at a time or use --gpu '*' "
                                 "for the GPU-independent contention parameters", source=tr.label, field="gpu")
    wanted = list(quantities) if quantities else list(QUANTITIES)
    for q in wanted:
        if q not in QUANTITIES:
            raise OvsimError(f"unknown quantity '{q}' (known: {', '.join(QUANTITIES)})", field="fit")
    if gpu == "*":
        for q in GPU_SPECIFIC:
            if q in wanted:
                if quantities:
                    raise OvsimError(f"{q} belongs to one GPU: name the GPU", field="fit")
                wanted.remove(q)
    ref = gpu if gpu != "*" else traces[0].gpu
    params = load_calibration(load_gpu(ref), gpu_file(ref).stem).params
    report = FitReport()
    # Data the fits and their points share (each costs replays of every trace).
    prepared: dict[str, Any] = {}

    def contention_fit() -> tuple[dict[str, Any], dict[str, Any]]:
        prepared["contention"] = [contention_data(tr) for tr in traces]
        return fit_contention(traces, params, prepared["contention"], sm_fraction)

    def power_fit() -> tuple[dict[str, Any], dict[str, Any]]:
        prepared["power"] = [power_samples(tr, log) for tr in traces for log in tr.power_logs]
        return fit_power_logs(traces, ref, params, prepared["power"])

    fitters: dict[str, Callable[[], tuple[dict[str, Any], dict[str, Any]]]] = {
        "contention": contention_fit,
        "collectives": lambda: fit_collectives(traces),
        "overhead": lambda: fit_overhead(traces),
        "gemm": lambda: fit_gemm(traces, params, gemm_frame),
        "memory": lambda: fit_memory(traces, params),
        "power": power_fit,
    }
    frames: list[pd.DataFrame] = []
    for q in wanted:
        if on_step is not None:
            on_step(q)
        try:
            values, record = fitters[q]()
        except OvsimError as e:
            if quantities:  # asked for by name: missing data is an error
                raise
            report.skipped[q] = e.message
            continue
        if points:
            frames.append(fit_points(q, traces, params, values, contention=prepared.get("contention"),
                                     power=prepared.get("power"), gemm_frame=gemm_frame))
        report.parameters.update(values)
        report.fits[q] = record
        # Later fits (gemm, memory: QUANTITIES puts overhead first) build on what was just fitted.
        params = params.merged(values)
        for k in values:
            report.sources[k] = f"fit: ovsim calibrate ({q}); see provenance.fits.{q}"
    if not report.parameters:
        why = "; ".join(f"{q}: {m}" for q, m in report.skipped.items())
        raise OvsimError(f"nothing could be fitted from these traces ({why})", field="traces")
    if points:
        report.points = (pd.concat(frames, ignore_index=True) if frames
                         else pd.DataFrame(columns=list(POINT_COLUMNS)))
    return report


def next_version(stem: str, folder: Path) -> int:
    """One more than the newest version of ``stem`` in ``folder`` and among the shipped files."""
    versions = [int(m["version"]) for d in (folder, CALIB_DIR) if d.is_dir() for p in d.iterdir()
                if (m := VERSIONED_NAME.match(p.name)) and m["stem"] == stem]
    return max(versions, default=0) + 1


def output_path(out: Path, gpu: str) -> tuple[Path, int]:
    """The file to write and its version: ``out`` itself when it is a ``<stem>.v<N>.yaml`` path, or
    the next version of the GPU's calibration inside ``out`` when it is a folder."""
    stem = "default" if gpu == "*" else gpu_file(gpu).stem
    if out.is_dir() or not out.suffix:
        version = next_version(stem, out)
        return out / f"{stem}.v{version}.yaml", version
    m = VERSIONED_NAME.match(out.name)
    if m is None:
        raise OvsimError("a calibration file is named <name>.v<version>.yaml (or give a folder)", source=str(out),
                         field="output")
    return out, int(m["version"])


def _holds(base: dict[str, Any], fitted: dict[str, Any]) -> bool:
    """Whether ``base`` already holds every fitted value; a mapping-valued one only for the keys the
    fit gave (a file on top merges such values key by key, so the others are not the fit's)."""
    def same(old: Any, new: Any) -> bool:
        if isinstance(new, dict) and isinstance(old, dict):
            return all(old.get(k) == v for k, v in new.items())
        return bool(old == new)

    return all(same(base.get(k), v) for k, v in fitted.items())


def write_shipped(report: FitReport, traces: Sequence[TraceInput], gpu: str, command: str, *,
                  dry_run: bool = False) -> tuple[Path | None, str]:
    """Write ``report`` as the next shipped version of the GPU's calibration (``default`` for '*'),
    carrying the newest one over as its base; nothing when the newest already holds every fitted
    value, or on a dry run. Returns the file written (None if none) and what was done."""
    stem = "default" if gpu == "*" else gpu_file(gpu).stem
    base = newest_file(stem, CALIB_DIR)
    if base is not None and _holds(read_calib_file(base).parameters, report.parameters):
        return None, f"{base.name} already holds these values; nothing written"
    if dry_run:
        return None, "dry run; nothing written"
    path = write_calibration(report, traces, gpu, CALIB_DIR, command=command, base=base)
    return path, f"wrote {path.name}"


def write_calibration(report: FitReport, traces: Sequence[TraceInput], gpu: str, out: Path,
                      command: str = "", base: Path | None = None) -> Path:
    """Write ``report`` as a new calibration file; an existing file is never replaced. With
    ``base`` (an older version of the same file) the new version carries its parameters and
    sources over, the fitted ones replaced, so it stands alone as the newest version does."""
    from ovsim import __version__

    path, version = output_path(out, gpu)
    if path.exists():
        raise OvsimError("exists: calibration files are never edited; write a new version", source=str(path),
                         field="output")
    inputs = []
    for tr in traces:
        files = [{"path": Path(f).name, "sha256": _sha256(f)} for f in tr.files if Path(f).is_file()]
        entry: dict[str, Any] = {
            "trace": tr.label, "gpu": tr.gpu,
            "device_names": sorted(set(tr.bundle.gpu_names.values())) or ["not recorded"],
            "software_versions": dict(tr.bundle.versions) or "not recorded in the trace",
            "ranks": int(tr.bundle.kernels["rank"].nunique()), "files": files}
        if tr.power_logs:
            entry["power_logs"] = [{"path": Path(lg.path).name, "sha256": _sha256(lg.path), "offset_s": lg.offset_s
                                    if lg.offset_s is not None else "from wall clocks"} for lg in tr.power_logs]
        inputs.append(entry)
    parameters: dict[str, Any] = {}
    sources: dict[str, str] = {}
    carried: dict[str, Any] = {}
    if base is not None:
        old = read_calib_file(base)
        if old.gpu != gpu:
            raise OvsimError(f"base file is for GPU '{old.gpu}', not '{gpu}'", source=str(base), field="gpu")
        parameters.update(old.parameters)
        sources.update(old.sources)
        # The base by name and checksum, not embedded: embedding made each file carry its whole
        # history (a file of 50 parameters grew to 10,000 lines). Superseded versions are kept in
        # calibration/history/ of the repository.
        carried = {"base": {"file": base.name, "version": old.version, "sha256": _sha256(str(base)),
                            "carried": "every parameter not fitted here, unchanged"}}
    for name, value in report.parameters.items():
        kept = parameters.get(name)
        if isinstance(value, dict) and isinstance(kept, dict) and set(kept) - set(value):
            # A fit of some keys of a mapping (one precision, one protocol) keeps the base's other
            # keys, as the file stack would if both files were loaded; the source says which is which.
            parameters[name] = {**kept, **value}
            sources[name] = (f"{', '.join(map(str, value))}: {report.sources.get(name, 'fitted')}; "
                             f"{', '.join(map(str, sorted(set(kept) - set(value))))}: carried from the base "
                             f"({sources.get(name, 'no source given')})")
        else:
            parameters[name] = value
            if name in report.sources:
                sources[name] = report.sources[name]
    sources.update({k: v for k, v in report.sources.items() if k not in report.parameters})
    doc = {
        "schema": "ovsim.calib/1",
        "gpu": gpu,
        "version": version,
        "provenance": {
            "kind": "fitted to traces by ovsim calibrate",
            "date": _dt.date.today().isoformat(),
            "ovsim_version": __version__,
            "command": command or "ovsim calibrate",
            "traces": inputs,
            "fits": report.fits,
            "skipped": report.skipped,
            **carried,
        },
        "parameters": parameters,
        "sources": sources,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path, exclusive=True) as tmp, open(tmp, "w", encoding="utf-8") as f:
        yaml.safe_dump(_plain(doc), f, sort_keys=False, width=110)
    return path


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def trace_input(paths: Sequence[str | Path], gpu: str | None = None, *, fallback_gpu: str | None = None) -> TraceInput:
    """A run to calibrate on. Its GPU is ``gpu`` when given, else the one its device names point at,
    else ``fallback_gpu`` (a trace that records no device)."""
    from ovsim.traces.load import load_trace

    bundle = load_trace(paths)
    name = gpu
    if name is None:
        try:
            name = bundle_gpu(bundle)
        except OvsimError:
            if fallback_gpu is None or bundle.gpu_names:
                raise
            name = fallback_gpu
    load_gpu(name)
    files: list[str] = []
    for p in paths:
        q = Path(p)
        if q.is_dir():
            files.extend(str(f) for f in sorted(q.rglob("*")) if f.is_file())
        else:
            files.append(str(q))
    label = ", ".join(Path(p).name for p in paths)
    return TraceInput(bundle=bundle, label=label, gpu=name, files=tuple(files))
