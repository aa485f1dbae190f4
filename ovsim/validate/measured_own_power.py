"""The calibration harness's ``clock_own`` part: power, clock and time of a GEMM kernel of one's own.

The harness's FP16 WMMA GEMM (64x64x32 tiles, 128 threads, 8192^3; about a fifth of cuBLAS's rate)
ran back to back for 5 s under the board's 700 W limit at its natural occupancy and shaped to 4,
2 and 1 blocks per SM, then cuBLAS's FP16 and BF16 GEMMs of the same problem. Each phase is
predicted as its kernel repeated under the same limit: the board's power, the SM clock the
kernels' probes counted and the time per kernel, after the phase's first second.

What was fitted on them: the own kernel's saturation clock on the natural-occupancy phase's times
(the registry's ``fit_phase``: its time rows are consistency checks). Nothing else: the own
kernel's efficiency and shaping come from another GPU's shaping part, every power weight from
other phases and boards.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovsim.hw.spec import load_gpu
from ovsim.validate.check import Check
from ovsim.validate.datasets import one_experiment, sets
from ovsim.validate.measured import MEASURED_DATA
from ovsim.validate.measured_memory import harness_experiments, harness_power_log

if TYPE_CHECKING:
    import pandas as pd

# Data sets of the clock_own part, their GPU spec and system, and the phase the own kernel's
# saturation clock was fitted on.
MEASURED_OWN_POWER = sets("clock_own", "set", "gpu", "system", "fit_phase")
MEASURED_OWN_POWER_HELD_OUT = ("measured power, clock and time of a GEMM kernel of one's own and cuBLAS's, "
                               "under the power limit (calibration harness clock_own part; held out)")
MEASURED_OWN_POWER_FIT = ("measured time of a GEMM kernel of one's own under the power limit (calibration "
                          "harness clock_own part; calibration source of its saturation clock)")
_SETTLE_S = 1.0  # a phase's first second: the clock and the sensor settling
_REPEATS = 20  # kernels a phase is predicted as
_TOLERANCE_PCT = 10.0


def own_phase_op(label: str, experiment: dict[str, Any], kernels: pd.DataFrame) -> tuple[dict[str, Any], int]:
    """The scenario op a clock_own phase repeats, and the shaping padding its launches carried."""
    from ovsim.shaping_checks import GEMM, GEMM_NATURAL_SMEM_BYTES, GEMM_STAGES, GEMM_TILE

    n = 8192
    if experiment.get("victim") != GEMM:  # cuBLAS's: the library's pick
        return {"kind": "gemm", "m": n, "n": n, "k": n, "precision": label.split("_")[1]}, 0
    k = kernels[kernels["name"] == GEMM].iloc[0]
    op = {"kind": "gemm", "m": n, "n": n, "k": n, "precision": "fp16", "tile": list(GEMM_TILE),
          "threads": int(k["block_x"]), "registers_per_thread": int(k["registers_per_thread"]),
          "stages": GEMM_STAGES}
    return op, int(k["shared_mem_bytes"]) - GEMM_NATURAL_SMEM_BYTES


def _predicted(label: str, system: str, op: dict[str, Any], padding: int, limit_w: float) -> dict[str, Any]:
    from ovsim.api import predict
    from ovsim.scenario import Scenario

    sc = Scenario.model_validate({"name": label, "system": system, "ranks": 1,
                                  "knobs": {"occupancy_shaping_smem_bytes": padding},
                                  "ops": [{"name": f"k{i}", **op} for i in range(_REPEATS)]})
    return predict(sc, power_cap_w=limit_w, counters=False).summary()


def measured_own_power_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """Per data set and phase: board power, counted SM clock and time per kernel against
    ``predict`` of the phase's kernel repeated under the board's limit, within 10%."""
    import pandas as pd

    from ovsim.traces.power import read_power_samples

    checks: list[Check] = []
    for rel, gpu, system, fit_phase in MEASURED_OWN_POWER:
        data = folder / rel
        log, clocks = harness_power_log(data), data / "clock.parquet"
        if log is None or not clocks.is_file():
            continue
        samples = read_power_samples(log)
        points = pd.read_parquet(clocks)
        limit = float(load_gpu(gpu).power.tdp_w)
        for label, e in harness_experiments(data).items():
            bundle = one_experiment(data, "clock_own", label)
            if e.get("part") != "clock_own" or bundle is None or bundle.wall_origin_s is None:
                continue
            pts = points[(points["part"] == "clock_own") & (points["experiment"] == label)]
            pts = pts[pts["name"] == pts["name"].value_counts().index[0]]
            start = float(pts["start_s"].min())
            steady = pts[pts["start_s"] > start + _SETTLE_S]
            wall0 = bundle.wall_origin_s + start + _SETTLE_S
            wall1 = bundle.wall_origin_s + float((pts["start_s"] + pts["duration_s"]).max())
            window = samples[(samples["wall_time_s"] > wall0) & (samples["wall_time_s"] < wall1)]
            op, padding = own_phase_op(label, e, bundle.kernels)
            res = _predicted(label, system, op, padding, limit)
            src = f"calibration/data/{rel} (clock_own part, {label}; {len(steady)} kernels, {len(window)} samples)"
            what = f"{gpu}: {label.replace('_', ' ')} at the {limit:.0f} W limit"
            time_group = MEASURED_OWN_POWER_FIT if label == fit_phase else MEASURED_OWN_POWER_HELD_OUT
            checks += [
                Check(f"{what}: power", MEASURED_OWN_POWER_HELD_OUT, float(window["power_w"].mean()),
                      float(res["avg_power_w"]), "W", _TOLERANCE_PCT, src),
                Check(f"{what}: counted SM clock", MEASURED_OWN_POWER_HELD_OUT,
                      float(steady["sm_clock_hz"].median()) / 1e6, float(res["avg_sm_clock_hz"]) / 1e6, "MHz",
                      _TOLERANCE_PCT, src, note="median over the kernels after the first second"),
                Check(f"{what}: time per kernel", time_group, float(steady["duration_s"].median()) * 1e3,
                      float(res["makespan_s"]) / _REPEATS * 1e3, "ms", _TOLERANCE_PCT, src,
                      note="median of the kernels after the first second")]
    return checks
