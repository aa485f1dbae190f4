"""The calibration harness's ``clock_own`` and ``own_tiles`` parts: power, clock and time of GEMM
kernels of one's own.

The harness's FP16 WMMA GEMM (64x64x32 tiles, 128 threads, 8192^3; about a fifth of cuBLAS's rate)
ran back to back for 5 s under the board's 700 W limit at its natural occupancy and shaped to 4,
2 and 1 blocks per SM, then cuBLAS's FP16 and BF16 GEMMs of the same problem. Each phase is
predicted as its kernel repeated under the same limit: the board's power, the SM clock the
kernels' probes counted and the time per kernel, after the phase's first second.

The ``own_tiles`` part ran the same kernel's template at five tiles (64x64 to 128x128, 4 or 8
warps), alone and then back to back for 3 s under the limit: each tile's time alone against
``predict`` of one launch from an idle GPU (the top clock), and its sustained phase as above.

The smloss part run with ``--smloss-wmma`` held 8 to 66 SMs idle beside the 64x64 and 128x128
tiles: each one's time there against ``predict`` of one launch on the SMs left to it.

What was fitted on them (the registry's ``fit_phase``, whose rows are consistency checks): the
kernel's efficiency on the 128x128 tile alone, its L2 bandwidths on the 64x64 tile alone and beside
66 held SMs (``calibration/harness/fit_own_gemm.py``). Nothing on the clock_own part; every power
weight comes from other phases and boards.
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

# Data sets of the clock_own, own_tiles and WMMA smloss parts, their GPU spec and system, and the
# experiments a parameter was fitted on (space-separated).
MEASURED_OWN_POWER = sets("clock_own", "set", "gpu", "system")
MEASURED_OWN_TILES = sets("own_tiles", "set", "gpu", "system", "fit_phase")
MEASURED_OWN_HELD = sets("own_smloss", "set", "gpu", "system", "fit_phase")
MEASURED_OWN_HELD_GROUP = ("measured time of GEMM kernels of one's own beside SMs held idle (calibration harness "
                           "smloss part with --smloss-wmma; held out)")
MEASURED_OWN_HELD_FIT = ("measured time of GEMM kernels of one's own beside SMs held idle (calibration harness "
                         "smloss part with --smloss-wmma; calibration source of each SM's L2 bandwidth)")
MEASURED_OWN_TILES_ALONE = ("measured time of GEMM kernels of one's own at five tiles, alone (calibration harness "
                            "own_tiles part; held out)")
MEASURED_OWN_TILES_FIT = ("measured time of GEMM kernels of one's own at five tiles, alone (calibration harness "
                          "own_tiles part; calibration source of their efficiency and L2 bandwidth)")
MEASURED_OWN_POWER_HELD_OUT = ("measured power, clock and time of a GEMM kernel of one's own and cuBLAS's, "
                               "under the power limit (calibration harness clock_own part; held out)")
_SETTLE_S = 1.0  # a phase's first second: the clock and the sensor settling
_REPEATS = 20  # kernels a phase is predicted as
_TOLERANCE_PCT = 10.0


_SIZE = 8192  # every phase's GEMM is 8192^3


def _wmma_op(tile: tuple[int, int], kernel: pd.Series) -> dict[str, Any]:
    """The scenario op of one of the harness's FP16 WMMA GEMMs: ``tile`` and the launch ``kernel``
    (a kernel-table row) gave it."""
    from ovsim.validate.shaping import GEMM_STAGES

    return {"kind": "gemm", "m": _SIZE, "n": _SIZE, "k": _SIZE, "precision": "fp16", "tile": [*tile, 32],
            "threads": int(kernel["block_x"]), "registers_per_thread": int(kernel["registers_per_thread"]),
            "stages": GEMM_STAGES}


def own_phase_op(label: str, experiment: dict[str, Any], kernels: pd.DataFrame) -> tuple[dict[str, Any], int]:
    """The scenario op a clock_own or own_tiles phase repeats, and the shaping padding its launches
    carried."""
    from ovsim.validate.shaping import GEMM, GEMM_NATURAL_SMEM_BYTES, GEMM_TILE

    if "tile" in experiment:  # the own_tiles part: the template at a tile of its own
        bm, bn, _ = experiment["tile"]
        return _wmma_op((bm, bn), kernels[kernels["name"] == experiment["kernel"]].iloc[0]), 0
    if experiment.get("victim") != GEMM:  # cuBLAS's: the library's pick
        return {"kind": "gemm", "m": _SIZE, "n": _SIZE, "k": _SIZE, "precision": label.split("_")[1]}, 0
    k = kernels[kernels["name"] == GEMM].iloc[0]
    return _wmma_op(GEMM_TILE[:2], k), int(k["shared_mem_bytes"]) - GEMM_NATURAL_SMEM_BYTES


def _predicted(label: str, system: str, op: dict[str, Any], padding: int, limit_w: float,
               repeats: int = _REPEATS, sms_held: int = 0) -> dict[str, Any]:
    """``predict``'s summary of ``op`` repeated back to back under ``limit_w``: in the loop's steady
    state, or for one launch from an idle GPU (at the top clock, as the harness ran each kernel
    alone after a pause)."""
    from ovsim.api import predict
    from ovsim.scenario import Scenario

    sc = Scenario.model_validate({"name": label, "system": system, "ranks": 1,
                                  "knobs": {"occupancy_shaping_smem_bytes": padding, "sm_carveout": sms_held},
                                  "ops": [{"name": f"k{i}", **op} for i in range(repeats)]})
    return predict(sc, power_cap_w=limit_w, power_start="idle" if repeats == 1 else None, counters=False).summary()


def measured_own_power_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """Per data set and phase: board power, counted SM clock and time per kernel against
    ``predict`` of the phase's kernel repeated under the board's limit, within 10%; each tile's
    time alone, and beside SMs held idle, against ``predict`` of one launch from an idle GPU."""
    checks: list[Check] = []
    for rel, gpu, system in MEASURED_OWN_POWER:
        checks += _sustained_checks(folder, "clock_own", rel, gpu, system)
    for rel, gpu, system, fit_phases in MEASURED_OWN_TILES:
        checks += _sustained_checks(folder, "own_tiles", rel, gpu, system)
        checks += _alone_checks(folder, rel, gpu, system, fit_phases.split())
    for rel, gpu, system, fit_phases in MEASURED_OWN_HELD:
        checks += _held_checks(folder, rel, gpu, system, fit_phases.split())
    return checks


def _held_checks(folder: Path, rel: str, gpu: str, system: str, fitted: list[str]) -> list[Check]:
    """Each WMMA kernel's median time beside SMs held idle (the smloss part's last six runs)
    against ``predict`` of one launch on the SMs left to it (``sm_carveout``), from an idle GPU."""
    checks = []
    for label, e in harness_experiments(folder / rel).items():
        bundle = one_experiment(folder / rel, "smloss", label)
        if e.get("part") != "smloss" or not label.startswith("wmma_") or bundle is None:
            continue
        k = bundle.kernels
        k = k[k["name"].str.startswith("ovsim_gemm_")].sort_values("start_s")
        bm, bn = (int(x) for x in label.split("_")[1].split("x"))
        op = _wmma_op((bm, bn), k.iloc[0])
        held = int(e["held_sms"])
        res = _predicted(label, system, op, 0, float(load_gpu(gpu).power.tdp_w), repeats=1, sms_held=held)
        checks.append(Check(
            f"{gpu}: {label.split('__')[0].replace('_', ' ')} beside {held} SMs held: time per kernel",
            MEASURED_OWN_HELD_FIT if label in fitted else MEASURED_OWN_HELD_GROUP,
            float(k["duration_s"].iloc[6:].median()) * 1e3, float(res["makespan_s"]) * 1e3, "ms", _TOLERANCE_PCT,
            f"calibration/data/{rel} (smloss part, {label})",
            note=f"alone {float(k['duration_s'].iloc[:6].median()) * 1e3:.2f} ms; predicted on the SMs left to it"))
    return checks


def _alone_checks(folder: Path, rel: str, gpu: str, system: str, fitted: list[str]) -> list[Check]:
    """Each own_tiles kernel's median time alone against ``predict`` of one launch from an idle
    GPU (at the top clock, where it ran)."""
    checks = []
    for label, e in harness_experiments(folder / rel).items():
        bundle = one_experiment(folder / rel, "own_tiles", label)
        if e.get("part") != "own_tiles" or label.endswith("__sustained") or bundle is None:
            continue
        k = bundle.kernels
        k = k[k["name"] == e["kernel"]]
        op, padding = own_phase_op(label, e, bundle.kernels)
        res = _predicted(label, system, op, padding, float(load_gpu(gpu).power.tdp_w), repeats=1)
        checks.append(Check(
            f"{gpu}: {label.replace('_', ' ')} alone: time per kernel",
            MEASURED_OWN_TILES_FIT if label in fitted else MEASURED_OWN_TILES_ALONE,
            float(k["duration_s"].median()) * 1e3, float(res["makespan_s"]) * 1e3, "ms", _TOLERANCE_PCT,
            f"calibration/data/{rel} (own_tiles part, {label}; {len(k)} kernels)",
            note=f"tile {e['tile'][0]}x{e['tile'][1]}, {e['threads']} threads; median after warm-up"))
    return checks


def _sustained_checks(folder: Path, part: str, rel: str, gpu: str, system: str) -> list[Check]:
    """Power, counted clock and time of each of ``part``'s phases run back to back under the limit."""
    import pandas as pd

    from ovsim.traces.power import read_power_samples

    checks: list[Check] = []
    data = folder / rel
    log, clocks = harness_power_log(data), data / "clock.parquet"
    if log is None or not clocks.is_file():
        return checks
    samples = read_power_samples(log)
    points = pd.read_parquet(clocks)
    limit = float(load_gpu(gpu).power.tdp_w)
    for label, e in harness_experiments(data).items():
        bundle = one_experiment(data, part, label)
        if (e.get("part") != part or bundle is None or bundle.wall_origin_s is None
                or (part == "own_tiles" and not label.endswith("__sustained"))):
            continue
        pts = points[(points["part"] == part) & (points["experiment"] == label)]
        pts = pts[pts["name"] == pts["name"].value_counts().index[0]]
        start = float(pts["start_s"].min())
        steady = pts[pts["start_s"] > start + _SETTLE_S]
        wall0 = bundle.wall_origin_s + start + _SETTLE_S
        wall1 = bundle.wall_origin_s + float((pts["start_s"] + pts["duration_s"]).max())
        window = samples[(samples["wall_time_s"] > wall0) & (samples["wall_time_s"] < wall1)]
        op, padding = own_phase_op(label, e, bundle.kernels)
        res = _predicted(label, system, op, padding, limit)
        src = f"calibration/data/{rel} ({part} part, {label}; {len(steady)} kernels, {len(window)} samples)"
        what = f"{gpu}: {label.removesuffix('__sustained').replace('_', ' ')} at the {limit:.0f} W limit"
        checks += [
            Check(f"{what}: power", MEASURED_OWN_POWER_HELD_OUT, float(window["power_w"].mean()),
                  float(res["avg_power_w"]), "W", _TOLERANCE_PCT, src),
            Check(f"{what}: counted SM clock", MEASURED_OWN_POWER_HELD_OUT,
                  float(steady["sm_clock_hz"].median()) / 1e6, float(res["avg_sm_clock_hz"]) / 1e6, "MHz",
                  _TOLERANCE_PCT, src, note="median over the kernels after the first second"),
            Check(f"{what}: time per kernel", MEASURED_OWN_POWER_HELD_OUT, float(steady["duration_s"].median()) * 1e3,
                  float(res["makespan_s"]) / _REPEATS * 1e3, "ms", _TOLERANCE_PCT, src,
                  note="median of the kernels after the first second")]
    return checks
