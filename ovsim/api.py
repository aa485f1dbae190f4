"""The public API: ``predict`` a scenario and get a :class:`Result` back.

>>> import ovsim
>>> result = ovsim.predict("examples/gemm-allreduce-a100x4-overlapped.yaml")  # doctest: +SKIP
>>> result.timeline.ops[["name", "rank", "duration_s", "slowed_by"]]           # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ovsim.engine.analytic import analytic_timeline
from ovsim.engine.machine import build_machine
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.engine.timeline import Timeline
from ovsim.errors import OvsimError
from ovsim.hw.calib import Calibration, load_calibration
from ovsim.hw.spec import GpuSpec, SystemSpec, gpu_file, load_gpu, load_system
from ovsim.metrics import COMM_KINDS, NON_COMPUTE, rank_overlap, stream_busy
from ovsim.models.ir import Workload
from ovsim.models.training import build_training_workload
from ovsim.models.workload import build_workload
from ovsim.scenario import InlineSystem, Mode, Scenario, load_scenario

__all__ = ["Result", "compare", "load_scenario", "predict"]


@dataclass(frozen=True)
class Result:
    """A prediction: the Timeline plus what it was computed from and the headline numbers."""

    scenario: Scenario
    mode: Mode
    system: SystemSpec
    gpu: GpuSpec
    calibration: Calibration
    timeline: Timeline
    workload: Workload = field(repr=False)

    @property
    def ops(self) -> pd.DataFrame:
        return self.timeline.ops

    def summary(self) -> dict[str, Any]:
        ops = self.timeline.ops
        ranks = rank_overlap(ops)
        per_rank = ops[ops["rank"] >= 0]
        compute = per_rank[~per_rank["kind"].isin(NON_COMPUTE)]
        comm = per_rank[per_rank["kind"].isin(COMM_KINDS)]
        n = max(1, len(ranks))
        compute_s = float(compute["duration_s"].sum()) / n
        compute_iso_s = float(compute["isolated_s"].sum()) / n
        return {
            "scenario": self.scenario.name,
            "mode": self.mode,
            "schedule": self.scenario.schedule,
            "system": self.system.name,
            "gpu": self.gpu.name,
            "ranks": len(ranks),
            "makespan_s": self.timeline.makespan_s,
            "compute_s": compute_s,
            "compute_isolated_s": compute_iso_s,
            "compute_slowdown": compute_s / compute_iso_s - 1 if compute_iso_s > 0 else 0.0,
            "comm_s": float(comm["duration_s"].sum()) / n,
            "exposed_comm_s": sum(r.exposed_comm_s for r in ranks) / n,
            "comm_hidden_fraction": (sum(r.overlapped_s for r in ranks) / sum(r.comm_busy_s for r in ranks)
                                     if any(r.comm_busy_s for r in ranks) else 0.0),
            "idle_s": sum(r.idle_s for r in ranks) / n,
            "calibration_files": list(self.calibration.files),
        }

    def streams(self) -> pd.DataFrame:
        return stream_busy(self.timeline.ops)

    def to_json(self) -> dict[str, Any]:
        ops = self.timeline.ops.replace([float("inf")], None)
        return {"summary": self.summary(), "streams": self.streams().to_dict(orient="records"),
                "ops": ops.to_dict(orient="records")}


def _resolve_system(sc: Scenario, source: str) -> tuple[SystemSpec, GpuSpec, str]:
    try:
        system = sc.system.to_spec() if isinstance(sc.system, InlineSystem) else load_system(sc.system)
        gpu = load_gpu(system.gpu)
    except OvsimError as e:
        raise OvsimError(e.message, source=source, field=e.field or "system") from None
    return system, gpu, gpu_file(system.gpu).stem


def build(sc: Scenario, source: str = "") -> tuple[Workload, SystemSpec, GpuSpec, Calibration]:
    """Resolve a scenario into the workload both fidelities run."""
    system, gpu, stem = _resolve_system(sc, source)
    try:
        calib = load_calibration(gpu, stem, tuple(sc.calibration))
    except OvsimError as e:
        raise e.located(source) from None
    n_ranks = sc.ranks or system.gpu_count
    if n_ranks > system.gpu_count:
        raise OvsimError(f"{n_ranks} ranks on a {system.gpu_count}-GPU system", source=source, field="ranks")
    if sc.training is not None:
        wl = build_training_workload(sc.training, gpu=gpu, system=system, params=calib.params, n_ranks=n_ranks,
                                     schedule=sc.schedule, knobs=sc.knobs, streams=sc.streams, source=source)
    else:
        wl = build_workload(list(sc.ops), gpu=gpu, system=system, params=calib.params, n_ranks=n_ranks,
                            schedule=sc.schedule, knobs=sc.knobs, streams=sc.streams, source=source)
    return wl, system, gpu, calib


def predict(scenario: str | Path | Scenario, *, mode: Mode | None = None, counters: bool = True) -> Result:
    """Predict a scenario (a file path or a :class:`Scenario`); ``mode`` overrides the file's."""
    source = str(scenario) if not isinstance(scenario, Scenario) else scenario.name
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    use_mode: Mode = mode or sc.mode
    wl, system, gpu, calib = build(sc, source)
    if use_mode == "analytic":
        timeline = analytic_timeline(wl)
    else:
        machine = build_machine(system, gpu, calib.params, n_ranks=wl.n_ranks, sm_carveout=sc.knobs.sm_carveout)
        try:
            timeline = Engine(wl, machine, EngineOptions(counters=counters)).run()
        except OvsimError as e:
            raise e.located(source) from None
    return Result(scenario=sc, mode=use_mode, system=system, gpu=gpu, calibration=calib, timeline=timeline,
                  workload=wl)


def compare(scenarios: Sequence[str | Path | Scenario], *, mode: Mode | None = None) -> pd.DataFrame:
    """Predict several scenarios and line up their summaries, one row each, in the order given.

    ``vs_first`` is each makespan relative to the first scenario's (-0.2: 20% less time), so
    the first is the baseline: sequential vs overlapped vs overlapped with priority, say.
    """
    if not scenarios:
        raise OvsimError("give at least one scenario to compare", field="scenarios")
    rows = []
    for sc in scenarios:
        s = predict(sc, mode=mode, counters=False).summary()
        s["source"] = sc.name if isinstance(sc, Scenario) else str(sc)
        rows.append(s)
    df = pd.DataFrame(rows)
    base = float(df["makespan_s"].iloc[0])
    df["vs_first"] = df["makespan_s"] / base - 1 if base > 0 else 0.0
    return df
