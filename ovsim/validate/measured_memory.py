"""The calibration harness's HBM sharing (memory-bound kernels beside copy loops) and copies alone."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovsim.hw.calib import shipped_parameters

if TYPE_CHECKING:
    import pandas as pd



from ovsim.validate.check import GB, GIB, Check
from ovsim.validate.datasets import experiments, sets
from ovsim.validate.measured import MEASURED_DATA

# HBM shared by a memory-bound kernel and the harness's copy loops (overlap part): data sets, their
# GPU, a system holding it, and the data set whose comm part timed the loops alone (each pass of
# one over its buffer). The latency law is fitted on the first; the others are held out.
MEASURED_HBM = sets("hbm", "set", "gpu", "system", "comm")
MEASURED_HBM_FIT = "measured HBM sharing, memory-bound kernels beside copy loops (calibration harness; law fitted here)"
MEASURED_HBM_HELD_OUT = ("measured HBM sharing, memory-bound kernels beside copy loops (calibration harness; held out: "
                         "law fitted on another data set)")
# HBM bytes one launch of each memory-bound victim moves: the add reads two BF16 vectors of 2^28
# elements and writes one; the layer norm and softmax read and write a 16384 x 8192 BF16 matrix.
HARNESS_MEMORY_VICTIM_BYTES = {"add_bf16_256M": 3 * 2 * 2**28, "layernorm_bf16_16384x8192": 2 * 2 * 16384 * 8192,
                               "softmax_bf16_16384x8192": 2 * 2 * 16384 * 8192}
# The harness's kinds of them, for the share of their time that follows the clock.
HARNESS_MEMORY_VICTIM_KIND = {"add_bf16_256M": "elementwise", "layernorm_bf16_16384x8192": "norm",
                              "softmax_bf16_16384x8192": "softmax"}
HARNESS_CHANNEL_PASS_BYTES = 256 << 20  # one pass of a copy loop over its buffer (run.py's CHANNEL_BUFFER_BYTES)
# HBM bytes per byte of buffer a loop passes over: the copy reads and writes it, the reduce reads two.
HARNESS_CHANNEL_HBM_PER_BYTE = {"copy": 2, "reduce": 3}
HBM_TOLERANCE_PCT = 10.0


def harness_power_log(folder: Path) -> Path | None:
    """A harness data set's NVML log of instantaneous power: ``power.csv``, or ``power.csv.gz`` in
    the data sets ingested compressed; None when it has neither."""
    for name in ("power.csv", "power.csv.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def harness_experiments(folder: Path) -> dict[str, dict[str, Any]]:
    """A harness data set's experiments (``experiments.jsonl``) by label."""
    import json

    lines = filter(str.strip, (folder / "experiments.jsonl").read_text().splitlines())
    return {e["label"]: e for e in map(json.loads, lines)}


def channel_pass_s(folder: Path, threads: int = 640) -> dict[tuple[str, int], float]:
    """Seconds one copy or reduce loop of ``threads`` threads a block takes alone for one pass over
    its buffer, by (op, loops), from a data set's comm part (median of its launches)."""

    out: dict[tuple[str, int], float] = {}
    tables = experiments(folder, "comm")
    for label, e in harness_experiments(folder).items():
        if e.get("part") == "comm" and e.get("threads") == threads and label in tables:
            k = tables[label].kernels
            k = k[k["name"].str.startswith("ovsim_channel")]
            out[(e["op"], int(e["channels"]))] = (float(k["duration_s"].median()) * HARNESS_CHANNEL_PASS_BYTES
                                                  / e["bytes_per_launch"])
    return out


def hbm_sharing_points(folder: Path, comm_folder: Path) -> pd.DataFrame:
    """One row per overlap experiment of a memory-bound victim beside a copy loop, at normal
    priority, loops launched first: the victim's launch, its median time alone and beside the
    loop, its HBM bytes; the loop's launch, its time alone (its passes at the comm part's pace of
    the same loop, from ``comm_folder``), its measured time and HBM bytes; the victims' start after
    the loop's and their count beside it; and what the two moved beside each other: the victim's
    slowdown and the loop's (its bytes less what it moved at its own pace while alone, over the
    victims' time)."""
    import numpy as np
    import pandas as pd

    exps = harness_experiments(folder)
    pass_s = channel_pass_s(comm_folder)
    tables = experiments(folder, "overlap")
    rows = []
    for label, e in sorted(exps.items()):
        if (e.get("part") != "overlap" or e.get("victim") not in HARNESS_MEMORY_VICTIM_BYTES
                or e.get("priority") != "normal" or e.get("first") != "comm"):
            continue
        counts = sorted(c for o, c in pass_s if o == e["op"])
        if label not in tables or not counts:
            continue
        k = tables[label].kernels.sort_values("start_s")
        ch = k[k["name"].str.startswith("ovsim_channel")].iloc[0]
        v = k[~k["name"].str.startswith("ovsim_") & (k["duration_s"] > 1e-4)]
        c0, c1 = float(ch["start_s"]), float(ch["start_s"] + ch["duration_s"])
        beside = v[(v["start_s"] >= c0) & (v["start_s"] + v["duration_s"] <= c1)]
        alone = v[v["start_s"] + v["duration_s"] <= c0]
        if beside.empty or alone.empty:
            continue
        # A loop count the comm part did not time takes the pace between the counts it did.
        one_pass_s = float(np.interp(e["channels"], counts, [pass_s[(e["op"], c)] for c in counts]))
        bytes_c = e["comm_iters"] * HARNESS_CHANNEL_PASS_BYTES * HARNESS_CHANNEL_HBM_PER_BYTE[e["op"]]
        loop_alone_s = e["comm_iters"] * one_pass_s
        overlap_s = float(beside["duration_s"].sum())
        moved_beside = bytes_c - bytes_c / loop_alone_s * (float(ch["duration_s"]) - overlap_s)
        r = v.iloc[0]
        rows.append({
            "label": label, "victim": e["victim"], "op": e["op"], "channels": int(e["channels"]),
            "victim_grid": int(r["grid_x"] * r["grid_y"] * r["grid_z"]),
            "victim_threads": int(r["block_x"] * r["block_y"] * r["block_z"]),
            "victim_registers": int(r["registers_per_thread"]), "victim_smem_bytes": int(r["shared_mem_bytes"]),
            "victim_hbm_bytes": float(HARNESS_MEMORY_VICTIM_BYTES[e["victim"]]),
            "victim_alone_s": float(alone["duration_s"].median()),
            "victim_beside_s": float(beside["duration_s"].median()),
            "victims_beside": len(beside), "victim_delay_s": float(beside["start_s"].iloc[0]) - c0,
            "loop_threads": int(ch["block_x"] * ch["block_y"] * ch["block_z"]),
            "loop_registers": int(ch["registers_per_thread"]), "loop_smem_bytes": int(ch["shared_mem_bytes"]),
            "loop_hbm_bytes": float(bytes_c), "loop_alone_s": loop_alone_s, "loop_s": float(ch["duration_s"]),
            "victim_slowdown": float(beside["duration_s"].median() / alone["duration_s"].median()),
            "loop_slowdown_beside": ((bytes_c / loop_alone_s) / (moved_beside / overlap_s) if moved_beside > 0
                                     else math.inf),
        })
    return pd.DataFrame(rows)


def hbm_sharing_scenario(row: dict[str, Any], system: str, memory_wait: float, loop_memory_wait: float) -> Any:
    """One overlap experiment as a scenario: the copy loop, then the victims on another stream from
    their measured start, each kernel by its launch, HBM bytes and time alone, waiting on memory
    ``memory_wait`` (the victim) and ``loop_memory_wait`` (the loop) of their time alone."""
    from ovsim.scenario import Scenario

    victim = {"name": "victim", "kind": "kernel", "grid": row["victim_grid"], "threads": row["victim_threads"],
              "registers_per_thread": row["victim_registers"], "shared_mem_bytes": row["victim_smem_bytes"],
              "hbm_bytes": row["victim_hbm_bytes"], "duration_s": row["victim_alone_s"], "stream": "victim",
              "memory_wait": memory_wait}
    ops = [{"name": "loop", "kind": "kernel", "grid": row["channels"], "threads": row["loop_threads"],
            "registers_per_thread": row["loop_registers"], "shared_mem_bytes": row["loop_smem_bytes"],
            "hbm_bytes": row["loop_hbm_bytes"], "duration_s": row["loop_alone_s"], "stream": "loop",
            "memory_wait": loop_memory_wait},
           {**victim, "name": "victim_first", "delay_s": row["victim_delay_s"]}]
    if row["victims_beside"] > 1:
        ops.append({**victim, "repeat": row["victims_beside"] - 1})
    # Measured durations: no power-limit loop on top of the clock they ran at.
    return Scenario.model_validate({"name": row["label"], "system": system, "ranks": 1, "power": {"managed": False},
                                    "streams": {"loop": 0, "victim": 0}, "ops": ops})


def measured_hbm_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """Memory-bound kernels beside the harness's copy loops, predicted from their times alone: per
    data set of ``MEASURED_HBM`` and victim kernel, the MAPE of the victims' time beside the loops
    and of the loops' whole time, within 10% and at most a third of the naive MAPE (the victim as
    fast as alone) for the victims."""
    import numpy as np

    from ovsim.api import predict
    from ovsim.replay_score import mape_pct

    checks: list[Check] = []
    for i, (rel, gpu, system, comm_rel) in enumerate(MEASURED_HBM):
        if not all((folder / r / "experiments.jsonl").is_file() for r in (rel, comm_rel)):
            continue
        params = shipped_parameters(gpu)
        points = hbm_sharing_points(folder / rel, folder / comm_rel)
        # Each GPU's law is fitted on its first data set.
        group = MEASURED_HBM_FIT if all(m[1] != gpu for m in MEASURED_HBM[:i]) else MEASURED_HBM_HELD_OUT
        label = f"{gpu} {rel.rsplit('/', 1)[-1]}"
        for victim, rows in points.groupby("victim", sort=True):
            wait = 1.0 - params.memory_kind_clock_share.get(HARNESS_MEMORY_VICTIM_KIND[str(victim)], 0.0)
            pv, pl = [], []
            for rec in rows.to_dict("records"):
                row = {str(k): v for k, v in rec.items()}
                ops = predict(hbm_sharing_scenario(row, system, wait, params.hbm_latency_collective_wait),
                              counters=False).ops
                pv.append(float(np.median(ops.loc[ops["name"].str.startswith("victim"), "duration_s"])))
                pl.append(float(ops.loc[ops["name"] == "loop", "duration_s"].iloc[0]))
            meas_v = rows["victim_beside_s"].to_numpy(float)
            naive = mape_pct(rows["victim_alone_s"].to_numpy(float), meas_v)
            source = f"calibration/data/{rel} (overlap part, {len(rows)} experiments beside 1 copy or reduce loop)"
            checks.append(Check(f"{label}: {victim} beside copy loops: its time", group,
                                min(HBM_TOLERANCE_PCT, naive / 3), mape_pct(np.asarray(pv), meas_v), "% MAPE", 0.0,
                                source, rule="at_most",
                                note=f"naive {naive:.1f}%; median of the victims beside a loop, per experiment"))
            meas_l = rows["loop_s"].to_numpy(float)
            checks.append(Check(f"{label}: copy loops beside {victim}: their time", group, HBM_TOLERANCE_PCT,
                                mape_pct(np.asarray(pl), meas_l), "% MAPE", 0.0, source, rule="at_most",
                                note=f"as fast as alone: "
                                     f"{mape_pct(rows['loop_alone_s'].to_numpy(float), meas_l):.1f}%"))
    return checks


# The copy part's copies alone (a 1 GiB cudaMemcpyAsync, 3 in a row), by direction: the data set,
# its GPU and a system holding it.
MEASURED_COPY = sets("copy", "set", "gpu", "system")
COPY_DIRECTIONS = ("d2d", "h2d")
# What default.v4 assumes for both copy efficiencies, the baseline of the copy rows' notes.
COPY_ASSUMED_EFFICIENCY = 0.8
MEASURED_COPY_GROUP = "measured copies alone (calibration harness copy part; held out: the other GPU's fit)"


def measured_copy_times(folder: Path) -> dict[str, tuple[float, float]]:
    """Per direction, (bytes, median seconds) of the copy part's copies alone in ``folder`` (a data
    set), as far as it holds them."""
    out: dict[str, tuple[float, float]] = {}
    tables = experiments(folder, "copy")
    for direction in COPY_DIRECTIONS:
        b = tables.get(f"{direction}_alone")
        if b is None:
            continue
        t = b.kernels
        t = t[(t["kind"] == "copy") & (t["bytes"] > 0)]
        if not t.empty:
            out[direction] = (float(t["bytes"].median()), float(t["duration_s"].median()))
    return out


def copy_scenario_s(system: str, direction: str, size_bytes: float, calibration: Sequence[str] = ()) -> float:
    """``predict``'s time for one copy alone on one GPU of ``system``, with ``calibration`` files on
    top of the shipped ones."""
    from ovsim.api import predict
    from ovsim.scenario import Scenario

    sc = Scenario.model_validate({"name": f"{direction} copy", "system": system, "ranks": 1,
                                  "calibration": list(calibration),
                                  "ops": [{"name": "copy", "kind": "copy", "size_bytes": size_bytes,
                                           "direction": direction}]})
    return float(predict(sc, counters=False).summary()["makespan_s"])


def measured_copy_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """The copy part's copies alone, each GPU's predicted with the copy efficiencies fitted on the
    other GPU's (``ce_local_efficiency``, ``host_link_efficiency``: the fraction of achievable HBM
    bandwidth, counting read and write, and of the PCIe link a copy reaches). Within 10%."""
    import tempfile

    import yaml

    keys = {"d2d": "ce_local_efficiency", "h2d": "host_link_efficiency"}
    present = [(rel, gpu, system) for rel, gpu, system in MEASURED_COPY if measured_copy_times(folder / rel)]
    checks: list[Check] = []
    with tempfile.TemporaryDirectory() as tmp:

        def on_top(stem: str, values: dict[str, float], source: str) -> Path:
            # The copy efficiencies alone, as a calibration file a scenario stacks on the shipped ones.
            path = Path(tmp) / f"{stem}.v1.yaml"
            path.write_text(yaml.safe_dump({"schema": "ovsim.calib/1", "gpu": "*", "version": 1,
                                            "provenance": {"kind": source}, "parameters": values,
                                            "sources": dict.fromkeys(values, source)}))
            return path

        assumed = on_top("assumed", dict.fromkeys(keys.values(), COPY_ASSUMED_EFFICIENCY), "default.v4's assumption")
        for rel, gpu, system in present:
            others = [g for _, g, _ in present if g != gpu]
            if not others:
                continue
            other = shipped_parameters(others[0])
            path = on_top(f"{others[0]}-copies", {k: getattr(other, k) for k in keys.values()},
                          f"the {others[0]} fit")
            for direction, (size, t_s) in measured_copy_times(folder / rel).items():
                pred = copy_scenario_s(system, direction, size, (str(path),))
                before = copy_scenario_s(system, direction, size, (str(assumed),))
                checks.append(Check(
                    f"{gpu}: {direction} copy of {size / GIB:g} GiB alone", MEASURED_COPY_GROUP, t_s * 1e3,
                    pred * 1e3, "ms", 10.0, f"calibration/data/{rel} (copy part, {direction}_alone)",
                    note=f"{keys[direction]} {getattr(other, keys[direction]):.3f} fitted on {others[0]}; "
                         f"measured {size / t_s / GB:.0f} GB/s; at the {COPY_ASSUMED_EFFICIENCY:g} assumed before: "
                         f"{(before - t_s) / t_s * 100:+.1f}%"))
    return checks
