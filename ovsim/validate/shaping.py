"""Held-out checks of priority and occupancy shaping: a GEMM of one's own beside a copy loop.

The calibration harness's ``shaping`` part (calibration/harness/run.py) launches its 64x64x32 FP16
WMMA GEMM (``ovsim_gemm_tile64``, 8192^3) at its natural 6 blocks per SM and shaped to 1, twice
alone and then once with a 16-channel copy loop (544 threads a block, 82 KB of shared memory, sized
to last 1.2x the GEMM alone) launched just after it on a stream of normal or high priority. That is
the mechanism of Cui & Pericas's schedule on one GPU: with priority the loop's blocks go first,
and shaping leaves them room beside the GEMM's.

Each experiment is predicted as a scenario: the GEMM priced by the cost model (its efficiency
fitted on the first H100 data set's GEMM alone, nothing beside anything), the loop by its time
alone (the harness's 1.2x) and its HBM bytes at the pace of the data set's 16-channel copy alone
(comm part). The row is the GEMM's slowdown beside the loop (its time beside over its time alone,
measured against predicted), within 10%; a prediction of no slowdown at all would pass the 8 rows
of normal priority and 4 of high. docs/calibration.md has the table and what it shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovsim.validate.datasets import sets

if TYPE_CHECKING:
    from ovsim.validate.check import Check

# Data sets of the shaping part: GPU spec, a system holding it, and the data set whose comm part
# timed the 16-channel copy alone (the repeat run has no comm part: its first run's).
SHAPING_SETS = sets("shaping", "set", "gpu", "system", "comm")
SHAPING_GROUP = ("measured priority and occupancy shaping, a WMMA GEMM beside a copy loop (calibration harness "
                 "shaping part; held out)")
GEMM = "ovsim_gemm_tile64"
LOOP = "ovsim_channel_copy"
# The harness kernel's block: 64x64x32 tiles in two shared-memory stages of BF16/FP16 operands; the
# rest of what it declared is the shaping padding.
GEMM_TILE = (64, 64, 32)
GEMM_STAGES = 2
GEMM_NATURAL_SMEM_BYTES = GEMM_STAGES * (GEMM_TILE[0] * GEMM_TILE[2] + GEMM_TILE[1] * GEMM_TILE[2]) * 2
# run.py: the loop lasts about this many times the GEMM alone; a copy reads and writes each byte.
LOOP_ALONE_PER_GEMM_ALONE = 1.2
COPY_HBM_PER_BYTE = 2
TOLERANCE_PCT = 10.0


def copy_pace_bytes_per_s(folder: Path) -> float:
    """Bytes a second the data set's 16-channel, 512-thread copy moves alone (comm part, median)."""
    from ovsim.validate.measured_memory import HARNESS_CHANNEL_PASS_BYTES, channel_pass_s

    return HARNESS_CHANNEL_PASS_BYTES / channel_pass_s(folder, threads=512)[("copy", 16)]


def shaping_points(folder: Path, pace_bytes_per_s: float) -> list[dict[str, Any]]:
    """One row per experiment of the GEMM beside the copy loop: its launch shapes, the GEMM's
    measured time alone (its two launches before) and beside, the loop's delay after the GEMM's
    start and what it is given alone."""
    from ovsim.validate.datasets import experiments
    from ovsim.validate.measured_memory import harness_experiments

    rows = []
    tables = experiments(folder, "shaping")
    for label, e in sorted(harness_experiments(folder).items()):
        if e.get("part") != "shaping" or "priority" not in e or label not in tables:
            continue
        k = tables[label].kernels.sort_values("start_s")
        g, loop = k[k["name"] == GEMM], k[k["name"] == LOOP]
        if len(g) < 2 or loop.empty:
            continue
        beside, ch = g.iloc[-1], loop.iloc[0]
        loop_alone_s = LOOP_ALONE_PER_GEMM_ALONE * float(e["victim_alone_s"])
        rows.append({
            "label": label, "priority": e["priority"], "blocks_per_sm": int(e["blocks_per_sm_target"]),
            "gemm_registers": int(beside["registers_per_thread"]), "gemm_threads": int(beside["block_x"]),
            "padding_bytes": int(beside["shared_mem_bytes"]) - GEMM_NATURAL_SMEM_BYTES,
            "gemm_alone_s": float(g["duration_s"].iloc[:-1].median()), "gemm_beside_s": float(beside["duration_s"]),
            "loop_threads": int(ch["block_x"]), "loop_registers": int(ch["registers_per_thread"]),
            "loop_smem_bytes": int(ch["shared_mem_bytes"]),
            "loop_grid": int(ch["grid_x"] * ch["grid_y"] * ch["grid_z"]),
            "loop_alone_s": loop_alone_s, "loop_hbm_bytes": COPY_HBM_PER_BYTE * pace_bytes_per_s * loop_alone_s,
            "loop_delay_s": max(0.0, float(ch["launch_s"] - beside["start_s"]))})
    return rows


def shaping_scenario(row: dict[str, Any], system: str) -> Any:
    """The experiment as a scenario: the GEMM as a kernel of one's own, shaped by the padding, and
    the loop launched after it on a stream of the measured priority."""
    from ovsim.scenario import Scenario

    gemm = {"name": "gemm", "kind": "gemm", "m": 8192, "n": 8192, "k": 8192, "precision": "fp16",
            "tile": list(GEMM_TILE), "threads": row["gemm_threads"], "registers_per_thread": row["gemm_registers"],
            "stages": GEMM_STAGES, "stream": "gemm"}
    loop = {"name": "loop", "kind": "kernel", "grid": row["loop_grid"], "threads": row["loop_threads"],
            "registers_per_thread": row["loop_registers"], "shared_mem_bytes": row["loop_smem_bytes"],
            "duration_s": row["loop_alone_s"], "hbm_bytes": row["loop_hbm_bytes"], "stream": "loop",
            "delay_s": row["loop_delay_s"]}
    # Measured times: no power-limit loop on top of the clock they ran at.
    return Scenario.model_validate({
        "name": row["label"], "system": system, "ranks": 1, "power": {"managed": False},
        "knobs": {"occupancy_shaping_smem_bytes": row["padding_bytes"]},
        "streams": {"gemm": 0, "loop": -1 if row["priority"] == "high" else 0}, "ops": [gemm, loop]})


def shaping_checks(folder: Path) -> list[Check]:
    """Per data set and experiment: the GEMM's slowdown beside the loop, within 10%."""
    from ovsim.api import predict
    from ovsim.validate.check import Check

    checks: list[Check] = []
    for rel, _gpu, system, comm_rel in SHAPING_SETS:
        if not all((folder / r / "experiments.jsonl").is_file() for r in (rel, comm_rel)):
            continue
        for row in shaping_points(folder / rel, copy_pace_bytes_per_s(folder / comm_rel)):
            ops = predict(shaping_scenario(row, system), counters=False).ops
            gemm = ops[ops["name"] == "gemm"].iloc[0]
            alone_s, beside_s = float(gemm["isolated_s"]), float(gemm["duration_s"])
            predicted = beside_s / alone_s
            measured = row["gemm_beside_s"] / row["gemm_alone_s"]
            blocks = f"{row['blocks_per_sm']} GEMM block{'s' if row['blocks_per_sm'] > 1 else ''} per SM"
            checks.append(Check(
                f"{rel}: {blocks}, loop at {row['priority']} priority: GEMM slowdown", SHAPING_GROUP, measured,
                predicted, "x", TOLERANCE_PCT,
                f"calibration/data/{rel} (shaping part, {row['label']})",
                note=f"GEMM measured {row['gemm_alone_s'] * 1e3:.2f} ms alone, {row['gemm_beside_s'] * 1e3:.2f} "
                     f"beside; predicted {alone_s * 1e3:.2f} and {beside_s * 1e3:.2f}; the loop given "
                     f"{row['loop_alone_s'] * 1e3:.2f} ms alone"))
    return checks
