"""The GEMM fits: main-loop efficiency and time per wave, from traced and measured library GEMMs."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ovsim.calibrate.inputs import TraceInput
from ovsim.errors import OvsimError
from ovsim.hw.calib import (
    Parameters,
)
from ovsim.hw.spec import GpuSpec, load_gpu
from ovsim.replay_kernels import KernelColumns, overlap_flags
from ovsim.traces.aten import gemm_problem

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


def _clean_gemms(
        traces: Sequence[TraceInput]) -> Iterator[tuple[GpuSpec, KernelColumns, int, tuple[int, int, int, int], str]]:
    """(GPU, kernel columns, row, (m, n, k, batch), precision) of every GEMM kernel the GEMM fits
    can use: ran without communication beside it, launching operator with input shapes, precision
    in the name or the operator's input types (:func:`gemm_precision`), a peak for that precision;
    split-K reductions and GEMV kernels left out."""
    for tr in traces:
        gpu = load_gpu(tr.gpu)
        df = tr.bundle.kernels.reset_index(drop=True)
        c = KernelColumns.of(df)
        host_types = [str(x) for x in df["host_types"].tolist()]
        overlapped = overlap_flags(c)
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
    of the tiles its name gives (:func:`ovsim.replay_kernels.persistent_tiles`) raised the fit error on the
    1,479 aligned GEMMs of the shared H100 traces from 4.1% to 10.6% (their tile schedulers spread
    the tiles' work over the SMs more evenly than whole rounds).

    Memory-bound aligned GEMMs are left out: those whose operands and output, each moved once at
    the peak HBM bandwidth, take at least their main loop at efficiency 1 (a decode step's or a
    small batch's product streaming its weight), whose time says nothing of the main loop's
    efficiency. On the H100's shapes part (calibration/data/h100-sxm5-80gb/2026-11-26-f) they
    were half the BF16 GEMMs, and the fit error with them 22.4% against 5.0% without, at nearly
    the same efficiency. Unaligned GEMMs all stay: their own efficiency is what the narrow-load
    kernels achieve, memory or not."""
    from ovsim.models import cost, occupancy
    from ovsim.replay_kernels import kernel_launch

    work: dict[str, list[tuple[float, float, float, float, bool]]] = {}
    for gpu, c, i, prob, prec in _clean_gemms(traces):
        grid, shape = kernel_launch(c, i, gpu)
        occ = max(1, occupancy.blocks_per_sm(shape, gpu))
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
                                        "(ovsim.models.gemm_library.best_gemm), efficiency and time per wave of least "
                                        "mean absolute relative error (ovsim.calibrate.fit_library_gemm); no unaligned "
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
    """:func:`ovsim.models.gemm_library.best_gemm`'s time (s) for each GEMM (m, n, k, batch, measured s),
    in order; each problem is priced once."""
    from ovsim.models import gemm_library

    times: dict[tuple[int, int, int, int], float] = {}
    for m, n, k, b, _ in problems:
        if (m, n, k, b) not in times:
            times[(m, n, k, b)] = gemm_library.best_gemm(m, n, k, precision, gpu, params, batch=b).isolated_s
    return np.array([times[(m, n, k, b)] for m, n, k, b, _ in problems])


def library_gemm_errors(problems: Sequence[tuple[int, int, int, int, float]], precision: str, gpu: GpuSpec,
                        params: Parameters) -> np.ndarray:
    """Absolute relative error (fractions) of :func:`library_gemm_times` against each GEMM's
    measured time."""
    measured = np.array([p[4] for p in problems], dtype=float)
    return np.asarray(np.abs(library_gemm_times(problems, precision, gpu, params) - measured) / measured)


def library_gemm_mape(problems: Sequence[tuple[int, int, int, int, float]], precision: str, gpu: GpuSpec,
                      params: Parameters) -> float:
    """Mean absolute relative error (a fraction) of :func:`ovsim.models.gemm_library.best_gemm`'s time
    against GEMMs (m, n, k, batch, measured s)."""
    return float(np.mean(library_gemm_errors(problems, precision, gpu, params)))


# Starting points of the library-frame fit (efficiency, microseconds per wave): its error jumps
# where the chosen kernel changes, so one start can stop on a step.
_LIBRARY_STARTS = ((0.8, 1.0), (0.9, 5.0), (0.7, 0.0))


def fit_library_gemm(problems: Sequence[tuple[int, int, int, int, float]], precision: str, gpu: GpuSpec,
                     params: Parameters) -> tuple[float, float, float]:
    """``gemm_efficiency`` and ``gemm_tile_overhead_s`` of ``precision`` (and their error, a
    fraction) that bring the scenario GEMM, :func:`ovsim.models.gemm_library.best_gemm`, to GEMMs
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
