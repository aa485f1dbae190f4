"""The memory fit: the bandwidth memory-bound kernels achieve, by kind."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ovsim.calibrate.gemm import MEMORY_L2_MULTIPLE
from ovsim.calibrate.inputs import TraceInput
from ovsim.errors import OvsimError
from ovsim.hw.calib import (
    CALIB_DIR,
    Parameters,
    newest_file,
    read_calib_file,
)
from ovsim.hw.spec import load_gpu
from ovsim.replay_kernels import KernelColumns, overlap_flags
from ovsim.traces.aten import Traffic, traffic

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
    c = KernelColumns.of(df)
    overlapped = overlap_flags(c)
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
