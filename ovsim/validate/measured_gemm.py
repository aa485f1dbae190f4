"""The calibration harness's GEMMs alone: the GEMM model held out by shape."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovsim.hw.calib import Parameters, load_calibration, shipped_parameters
from ovsim.hw.spec import gpu_file, load_gpu
from ovsim.models import cost

if TYPE_CHECKING:

    from ovsim.hw.spec import GpuSpec


from ovsim.validate.check import Check
from ovsim.validate.datasets import experiments, one_experiment, sets
from ovsim.validate.measured import MEASURED_DATA
from ovsim.validate.measured_memory import harness_power_log
from ovsim.validate.traces import MAMF_BY_PRECISION, MEMORY_TOLERANCE_PCT, split_at_10us

# Data sets of the harness's gemm part (cuBLAS GEMMs alone, 10 repeats each after 3 warm-ups).
MEASURED_GEMM = sets("gemm", "set", "gpu")
MEASURED_GEMM_PRECISIONS = ("bf16", "fp16", "fp8", "tf32")
# The gemm part's shapes that ran at the top clock: the squares up to 8192^3 ran first, within the
# part's first 0.35 s, each repeat within 1% of the others and NVML reading 1980 MHz throughout;
# the 16384^3 GEMMs that came next drove the card to its 700 W limit (NVML: 1335-1815 MHz, their
# times rising through the repeats, FP8's by half), and the part's other shapes ran after them at
# clocks no record gives (NVML's readings there are stale: one value for up to 0.1 s).
GEMM_AT_TOP_CLOCK = ((1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192))
MEASURED_GEMM_GROUP = "measured GEMMs (calibration harness gemm part; held out: leave one shape out)"


def measured_gemm_points(folder: Path, precision: str) -> list[tuple[int, int, int, int, float]]:
    """(m, n, k, batch 1, median measured s) of the gemm part's GEMMs of ``precision`` that ran at the top
    clock (``GEMM_AT_TOP_CLOCK``), as far as ``folder`` (a data set) holds them."""
    out = []
    tables = experiments(folder, "gemm", f"gemm_{precision}_*")
    for m, n, k in GEMM_AT_TOP_CLOCK:
        b = tables.get(f"gemm_{precision}_{m}x{n}x{k}")
        if b is None:
            continue
        t = b.kernels
        t = t[t["kind"] == "gemm"]
        if not t.empty:
            out.append((m, n, k, 1, float(t["duration_s"].median())))
    return out


def _mamf_roofline_note(problems: list[tuple[int, int, int, int, float]], precision: str, gpu: GpuSpec,
                        params: Parameters) -> str:
    """A note's baseline for GEMM rows: the MAPE of the roofline at MAMF's best-shape efficiency
    with no time per wave, where MAMF has a figure for the precision."""
    from ovsim.calibrate import library_gemm_mape

    mamf = MAMF_BY_PRECISION.get(precision)
    if mamf is None:
        return ""
    at_mamf = params.merged({"gemm_efficiency": {precision: mamf}, "gemm_tile_overhead_s": {precision: 0.0}})
    return (f"; the roofline at MAMF's best-shape efficiency {mamf:.3f}: "
            f"{library_gemm_mape(problems, precision, gpu, at_mamf) * 100:.1f}%")


def measured_gemm_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """The gemm part's GEMMs at the top clock held out: per GPU and precision, each shape priced
    as a scenario prices it (the library kernel the cost model picks,
    :func:`ovsim.models.gemm_library.best_gemm`) with the efficiency and time per wave fitted on the other
    shapes alone (:func:`ovsim.calibrate.fit_library_gemm`). Each MAPE passes at or below 10%;
    the note gives the roofline at the published best-shape efficiency (MAMF's, where there is one
    for the precision) with no time per wave."""
    from ovsim.calibrate import fit_library_gemm, library_gemm_mape

    checks: list[Check] = []
    for rel, gpu_name in MEASURED_GEMM:
        gpu = load_gpu(gpu_name)
        params = shipped_parameters(gpu_name)
        for prec in MEASURED_GEMM_PRECISIONS:
            pts = measured_gemm_points(folder / rel, prec)
            if len(pts) < 3:
                continue  # two shapes cannot fit two parameters and leave one out
            errs = []
            for i in range(len(pts)):
                eff, tile_s, _ = fit_library_gemm(pts[:i] + pts[i + 1:], prec, gpu, params)
                fitted = params.merged({"gemm_efficiency": {prec: eff}, "gemm_tile_overhead_s": {prec: tile_s}})
                errs.append(library_gemm_mape([pts[i]], prec, gpu, fitted) * 100)
            naive = _mamf_roofline_note(pts, prec, gpu, params)
            shapes = ", ".join(f"{m}^3 {e:.1f}%" for (m, *_), e in zip(pts, errs, strict=True))
            checks.append(Check(f"{gpu_name}: {prec} GEMM time MAPE ({len(pts)} shapes at the top clock)",
                                MEASURED_GEMM_GROUP, MEMORY_TOLERANCE_PCT, sum(errs) / len(errs), "% MAPE", 0.0,
                                f"calibration/data/{rel} (gemm part)", rule="at_most",
                                note=f"each shape at the fit on the others: {shapes}{naive}; passes at or below "
                                     f"{MEMORY_TOLERANCE_PCT:g}%"))
    return checks


# The shapes part's data sets (cuBLAS GEMMs over training and inference shapes), and each of its
# experiments' precision. Nothing is fitted on them: the GEMM parameters they are priced with come
# from the gemm part's squares on another board (MEASURED_GEMM).
MEASURED_SHAPES = sets("shapes", "set", "gpu")
SHAPE_EXPERIMENTS = {"bf16_linear": "bf16", "fp16_linear": "fp16", "fp8_linear": "fp8", "tf32_linear": "tf32",
                     "bf16_batched": "bf16"}
MEASURED_SHAPES_GROUP = "measured GEMM shapes (calibration harness shapes part; GEMM parameters fitted on other shapes)"
# NVML reads the SM clock on a 15 MHz grid and a GEMM at the top clock often reads one step under it.
_TOP_CLOCK_SLACK_HZ = 15e6


@functools.lru_cache(maxsize=8)
def _nvml_clock(log: Path) -> tuple[Any, Any]:
    """(wall-clock stamps, SM clock in Hz) of a harness power log, in time order: read once for
    all of a data set's experiments."""
    from ovsim.traces.power import read_power_samples

    samples = read_power_samples(log).sort_values("wall_time_s")
    return samples["wall_time_s"].to_numpy(float), samples["sm_clock_hz"].to_numpy(float)


def measured_shape_points(folder: Path, experiment: str, precision: str) -> list[tuple[int, int, int, int, float]]:
    """(m, n, k, batch, median s) of each GEMM of a shapes-part experiment whose leading dimensions
    are aligned (:func:`ovsim.models.cost.gemm_aligned`) and whose every run NVML saw at the top
    clock: an operator's time is all its kernels' (a split-K product's reduction too, as a
    scenario prices it), the median over its repeats."""
    import numpy as np

    from ovsim.traces.aten import gemm_problem

    bundle = one_experiment(folder, "shapes", experiment)
    log = harness_power_log(folder)
    if bundle is None or log is None:
        return []
    if bundle.wall_origin_s is None:
        return []
    k = bundle.kernels
    k = k[k["kind"] == "gemm"]
    stamps, clock = _nvml_clock(log)
    ends = bundle.wall_origin_s + k["start_s"].to_numpy(float) + k["duration_s"].to_numpy(float)
    # The sample in effect when the kernel ended: the clock it was running at, up to NVML's period.
    at_clock = clock[np.clip(np.searchsorted(stamps, ends) - 1, 0, len(stamps) - 1)]
    # Per operator instance: its problem, all its kernels' seconds and the lowest clock seen.
    ops: dict[Any, tuple[tuple[int, int, int, int], float, float]] = {}
    for op_id, host, seconds, clk in zip(k["host_op_id"].tolist(), k["host_op"].tolist(),
                                         k["duration_s"].tolist(), at_clock.tolist(), strict=True):
        problem = gemm_problem(str(host))
        if problem is None or op_id is None:
            continue
        _, total, lowest = ops.get(op_id, (problem, 0.0, math.inf))
        ops[op_id] = (problem, total + float(seconds), min(lowest, float(clk)))
    runs: dict[tuple[int, int, int, int], list[tuple[float, float]]] = {}
    for problem, total, lowest in ops.values():
        runs.setdefault(problem, []).append((total, lowest))
    top = float(clock.max())
    out = []
    for (m, n, kk, batch), rs in sorted(runs.items()):
        if min(c for _, c in rs) >= top - _TOP_CLOCK_SLACK_HZ and cost.gemm_aligned(n, kk, precision):
            out.append((m, n, kk, batch, float(np.median([t for t, _ in rs]))))
    return out


def measured_shape_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """The shapes part's GEMMs priced as a scenario prices them (the library kernel the cost model
    picks, :func:`ovsim.models.gemm_library.best_gemm`) with the shipped calibration, whose GEMM
    efficiency and time per wave were fitted on the gemm part's squares on another board. Each
    MAPE passes at or below 10%; the note splits it at 10 us and gives the roofline at MAMF's
    best-shape efficiency with no time per wave."""
    from ovsim.calibrate import library_gemm_errors

    checks: list[Check] = []
    for rel, gpu_name in MEASURED_SHAPES:
        gpu = load_gpu(gpu_name)
        shipped = load_calibration(gpu, gpu_file(gpu_name).stem)
        params = shipped.params
        for experiment, prec in SHAPE_EXPERIMENTS.items():
            pts = measured_shape_points(folder / rel, experiment, prec)
            if not pts:
                continue
            err = library_gemm_errors(pts, prec, gpu, params)
            split = split_at_10us(pts, err)
            naive = _mamf_roofline_note(pts, prec, gpu, params)
            checks.append(Check(
                f"{rel}: {experiment} GEMM time MAPE ({len(pts)} shapes at the top clock)", MEASURED_SHAPES_GROUP,
                MEMORY_TOLERANCE_PCT, float(err.mean() * 100), "% MAPE", 0.0, f"calibration/data/{rel} (shapes part)",
                rule="at_most",
                note=f"efficiency {params.gemm_eff(prec):.3f}, {params.gemm_tile_s(prec) * 1e6:.2f} us per wave "
                     f"({shipped.files[-1]}){split}{naive}; passes at or below {MEMORY_TOLERANCE_PCT:g}%"))
    return checks
