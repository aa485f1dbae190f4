"""The calibration harness's GEMMs beside SM-holding blocks and its block-dispatch probes."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ovsim.workers import worker_pool

if TYPE_CHECKING:

    from ovsim.traces.table import TraceBundle


from ovsim.validate.check import Check
from ovsim.validate.datasets import experiments, fitted, read_experiment, sets
from ovsim.validate.measured import HARNESS_SM_FRACTION, MEASURED_DATA, replay_row
from ovsim.validate.measured_memory import harness_experiments

# Data sets whose smloss part the SM-loss checks replay, and their GPU spec: cuBLAS's GEMMs beside a
# kernel that only holds SMs (every set held out: nothing is fitted on their GEMMs).
MEASURED_SMLOSS = sets("smloss", "set", "gpu")
MEASURED_SMLOSS_GROUP = "measured GEMMs beside SM-holding blocks (calibration harness smloss part; held out)"
# The smloss data set of each GPU that its ``gemm_load_share`` is fitted on (marked "fit" in the
# registry; calibration/harness/fit_measured.py); its rows are a fit, reported as a group of their own.
SMLOSS_LOAD_FIT = fitted("smloss")
MEASURED_SMLOSS_FIT_GROUP = ("measured GEMMs beside SM-holding blocks (calibration harness smloss part; "
                             "the data set gemm_load_share is fitted on)")
_HOLD_KERNEL = "ovsim_probe_first"
# The smloss part's default hold outlasts its victims' repeats (calibration/harness/run.py).
_WHOLE_HOLD = 1.5


def smloss_bundle(source: Path | TraceBundle) -> TraceBundle:
    """One smloss experiment's table (a file, or the run read), its holding kernel a collective
    that moves nothing and holds all of its blocks for its measured time."""
    import dataclasses

    bundle = read_experiment(source) if isinstance(source, Path) else source
    kernels = bundle.kernels.copy()
    kernels.loc[kernels["name"] == _HOLD_KERNEL, "kind"] = "collective"
    return dataclasses.replace(bundle, kernels=kernels)


def smloss_scored(path: Path | TraceBundle, gpu: str,
                  overrides: dict[str, Any] | None = None) -> tuple[list[float], list[float], list[float]]:
    """(measured, predicted, isolated) durations of the GEMMs of one smloss experiment (a table,
    or :func:`smloss_bundle` of one) that ran beside the holding kernel, replayed with the shipped
    calibration and ``overrides``. The GEMMs' isolated times are their repeats before the hold
    (the replay's ``signature`` source), so only how held SMs cost them is predicted."""
    from ovsim.replay import replay

    bundle = smloss_bundle(path) if isinstance(path, Path) else path
    k = replay(bundle, gpu=gpu, counters=False,
               overrides={"replay_collective_sm_fraction": HARNESS_SM_FRACTION, **(overrides or {})}).kernels
    sel = k["overlapped"] & (k["isolated_source"] == "signature") & (k["kind"] == "gemm")
    return (k.loc[sel, "measured_duration_s"].tolist(), k.loc[sel, "predicted_duration_s"].tolist(),
            k.loc[sel, "isolated_s"].tolist())


def measured_smloss_checks(folder: Path = MEASURED_DATA, workers: int = 1) -> list[Check]:
    """cuBLAS's GEMMs beside a kernel that holds 1 to 66 SMs and moves no data (the harness's
    smloss part), replayed with the shipped calibration: on Hopper a persistent GEMM whose CTAs
    do not all find an SM runs their first tiles after the rest (``KernelDemand.persistent_ctas``),
    and its clusters of 2 CTAs find no room on the SMs the held ones strand
    (``KernelDemand.cluster_ctas``), and tiles on fewer busy SMs run faster
    (``KernelDemand.load_share``, fitted on the data set ``SMLOSS_LOAD_FIT`` names for each GPU,
    whose rows are a group of their own). One row per data set, victim and hold (for the whole run,
    or ending among the repeats), pooling the held counts; it passes at 10% or less and at most a
    third of the naive MAPE, as the overlap rows do."""
    jobs: list[tuple[str, str, str, bool, TraceBundle]] = []
    for rel, gpu in MEASURED_SMLOSS:
        found = experiments(folder / rel, "smloss", "gemm_*")
        if not found:
            continue
        exps = harness_experiments(folder / rel)
        for label, bundle in found.items():
            e = exps.get(label, {})
            whole = float(e.get("hold_fraction", _WHOLE_HOLD)) >= 1
            jobs.append((rel, gpu, str(e.get("victim", label.split("__", 1)[0])), whole, smloss_bundle(bundle)))
    if not jobs:
        return []
    n = min(workers, len(jobs))
    pool = worker_pool(n)
    with pool or nullcontext():
        run = pool.map if pool is not None else map
        scored = list(run(smloss_scored, [j[4] for j in jobs], [j[1] for j in jobs]))
    rows: dict[tuple[str, str, str, bool], list[list[float]]] = {}
    for (rel, gpu, victim, whole, _), series in zip(jobs, scored, strict=True):
        acc = rows.setdefault((rel, gpu, victim, whole), [[], [], []])
        for a, xs in zip(acc, series, strict=True):
            a.extend(xs)
    checks: list[Check] = []
    for (rel, gpu, victim, whole), pooled in rows.items():
        row = replay_row(pooled)
        if row is None:
            continue
        n, mape, naive, bar = row
        # "gemm_bf16_4096x4096x4096" -> "4096x4096x4096 bf16": the table keeps the name's start.
        _, prec, shape = [*victim.split("_", 2), "", ""][:3]
        fit = SMLOSS_LOAD_FIT.get(gpu) == rel
        checks.append(Check(f"{gpu} {rel.rsplit('/', 1)[-1]}: {shape} {prec}, {'whole' if whole else 'part'} run",
                            MEASURED_SMLOSS_FIT_GROUP if fit else MEASURED_SMLOSS_GROUP, bar, mape, "% MAPE", 0.0,
                            f"calibration/data/{rel} (smloss part)", rule="at_most",
                            note=f"{victim}, SMs held for {'the whole' if whole else 'part of the'} run, {n} kernels; "
                                 f"naive {naive:.1f}%; shipped calibration, "
                                 + ("gemm_load_share fitted on these GEMMs" if fit else
                                    "nothing fitted on these GEMMs")))
    return checks


# The dispatch part's probes (a kernel of many blocks, then a second one launched on another stream
# at equal or higher priority), by data set, GPU and a system holding it.
MEASURED_DISPATCH = sets("dispatch", "set", "gpu", "system")
MEASURED_DISPATCH_GROUP = "measured block dispatch (calibration harness dispatch part; predicted, nothing fitted)"
_DISPATCH_FIRST = "ovsim_probe_first"


def _dispatch_kernel(name: str, row: dict[str, Any], duration_s: float, stream: str,
                     delay_s: float = 0.0) -> dict[str, Any]:
    return {"name": name, "kind": "kernel", "grid": int(row["grid_x"] * row["grid_y"] * row["grid_z"]),
            "threads": int(row["block_x"] * row["block_y"] * row["block_z"]),
            "registers_per_thread": int(row["registers_per_thread"]),
            "shared_mem_bytes": int(row["shared_mem_bytes"]), "duration_s": duration_s, "stream": stream,
            "delay_s": delay_s}


def measured_dispatch_checks(folder: Path = MEASURED_DATA) -> list[Check]:
    """The dispatch part's probes replayed: each probe's two kernels as traced kernels with their
    launch shapes, the second launched when the trace says (after the first's start) on a stream of
    the measured priority. The first kernel takes its time from the same probe at equal priority
    (where nothing disturbs it); the second its time alone (its blocks' spin, or its own time where
    it ran alone after the first). The row is the second kernel's start after the first's, within
    10%: when the block scheduler let it in."""

    from ovsim.api import predict
    from ovsim.scenario import Scenario

    checks: list[Check] = []
    for rel, gpu, system in MEASURED_DISPATCH:
        if not (folder / rel / "experiments.jsonl").is_file():
            continue
        exps = [e for e in harness_experiments(folder / rel).values() if e.get("part") == "dispatch"]
        # Per probe, its kernels' records by name (the harness's own kernels, not PyTorch's).
        tables: dict[str, dict[str, dict[str, Any]]] = {}
        found = experiments(folder / rel, "dispatch")
        for e in exps:
            if e["label"] in found:
                kernels = found[e["label"]].kernels
                kernels = kernels[kernels["name"].str.startswith("ovsim_")]
                tables[e["label"]] = {str(r["name"]): {str(k): v for k, v in r.items()}
                                      for r in kernels.to_dict("records")}
        for e in exps:
            label = e["label"]
            if label not in tables:
                continue
            probe = tables[label]
            first = probe[_DISPATCH_FIRST]
            second_name = next(n for n in probe if n != _DISPATCH_FIRST)
            second = probe[second_name]
            equal = tables.get(label.rsplit("_", 1)[0] + "_equal", probe)
            t_first = float(equal[_DISPATCH_FIRST]["duration_s"])
            # A probe's second kernel spins for a set time a block; a channel kernel ran alone
            # after the persistent kernel, so its measured time is its time alone.
            t_second = (e["second_spin_ns"] * 1e-9 if "second_spin_ns" in e
                        else float(equal[second_name]["duration_s"]))
            delay = max(0.0, float(second["launch_s"] - first["start_s"]))
            sc = Scenario.model_validate({
                "name": f"dispatch {label}", "system": system, "ranks": 1,
                # Measured durations: no power-limit loop on top of the clock they ran at.
                "power": {"managed": False},
                "streams": {"first": 0, "second": -1 if e["priority"] == "high" else 0},
                "ops": [_dispatch_kernel("first", first, t_first, "first"),
                        _dispatch_kernel("second", second, t_second, "second", delay)]})
            ops = predict(sc, counters=False).ops
            predicted = float(ops.loc[ops["name"] == "second", "start_s"].iloc[0])
            measured = float(second["start_s"] - first["start_s"]) * 1e6
            checks.append(Check(
                f"{gpu}: {label}: second kernel's start", MEASURED_DISPATCH_GROUP, measured,
                predicted * 1e6, "us", 10.0,
                f"calibration/data/{rel} (dispatch part, {label}: {int(first['grid_x'])} blocks, then "
                f"{int(second['grid_x'])} launched {delay * 1e6:.0f} us after their start)",
                note=f"after the first kernel's start; launched at {delay * 1e6:.0f} us"))
    return checks
