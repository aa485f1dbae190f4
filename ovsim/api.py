"""The public API: ``predict`` a scenario and get a :class:`Result` back.

>>> import ovsim
>>> result = ovsim.predict("examples/gemm-allreduce-a100x4-overlapped.yaml")  # doctest: +SKIP
>>> result.timeline.ops[["name", "rank", "duration_s", "slowed_by"]]           # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import ValidationError

from ovsim.engine.machine import MachineModel, build_machine
from ovsim.engine.power import POWER_COLUMNS, PowerConfig, power_rows, power_table
from ovsim.engine.power_loop import same_start
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.engine.timeline import OP_COLUMNS, Timeline, on_ranks
from ovsim.errors import OvsimError
from ovsim.gcpause import paused_gc
from ovsim.hw.calib import Calibration, load_calibration
from ovsim.hw.power import PowerSettings, check_settings, power_model
from ovsim.hw.spec import GpuSpec, SystemSpec, check_domain, gpu_file, load_gpu, load_system
from ovsim.hw.validation import validation_error
from ovsim.metrics import COMM_KINDS, NON_COMPUTE, rank_overlap, stream_busy, stream_busy_rows
from ovsim.models.ir import Workload
from ovsim.models.workload import build_workload
from ovsim.models.workload_copies import RANK_MARK, op_id
from ovsim.scenario import InlineSystem, Mode, Scenario, check_mode, load_scenario

if TYPE_CHECKING:
    import pandas as pd

    from ovsim.models.memory import MemoryEstimate

__all__ = ["Result", "accounted_sequential_s", "compare", "load_scenario", "predict"]


# NVML's power readings on an H100 move every ~100 ms (calibration/data, power.csv of the clock part).
SENSOR_WINDOW_S = 0.1


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
    # The power model and settings the prediction ran with (None: power not tracked).
    power_config: PowerConfig | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        # The fields' own reprs (the scenario, specs and calibration) run to kilobytes: a notebook
        # cell showing a result would be flooded. What it is, and where the rest is.
        ranks = self.workload.total_ranks
        return (f"Result(scenario={self.scenario.name!r}, mode={self.mode!r}, gpu={self.gpu.name!r}, "
                f"ranks={ranks}, makespan_s={self.timeline.makespan_s:.6g}; .summary() for the figures)")

    @property
    def ops(self) -> pd.DataFrame:
        return self.timeline.ops

    def memory(self) -> MemoryEstimate | None:
        """The peak memory of one GPU of a training scenario, estimated in closed form
        (:mod:`ovsim.models.memory`: model states, FSDP buffers, activations, logits; not the CUDA
        context, workspaces or fragmentation); None for a list of ops."""
        if self.scenario.training is None:
            return None
        from ovsim.models.memory import memory_estimate

        return memory_estimate(self.scenario.training, self.workload.total_ranks)

    def _memory_summary(self) -> dict[str, Any]:
        est = self.memory()
        return {} if est is None else _memory_fields(est.total_bytes, self.gpu)

    def power(self, window_s: float = 0.0) -> pd.DataFrame:
        """Per GPU over the iteration: average and peak power, energy, average and lowest SM clock;
        with ``window_s``, also the peak of power averaged over windows of that length."""
        if self.power_config is None:
            raise OvsimError("this prediction did not track power", field="power")
        m = self.power_config.model
        return power_table(self.timeline, self.workload.ranks_in_job, m.idle_w, m.compute_clock_hz,
                           window_s=window_s)

    def _power_summary(self) -> dict[str, Any]:
        if self.power_config is None:
            return {}
        pc = self.power_config
        settings = pc.settings
        m = pc.model
        rows = power_rows(self.timeline, self.workload.ranks_in_job, m.idle_w, m.compute_clock_hz,
                          window_s=SENSOR_WINDOW_S)
        t = {c: np.array([r[c] for r in rows], dtype=float) for c in (*POWER_COLUMNS[1:], "peak_window_power_w")}
        # Every replica a simulated rank stands for spends what it spends.
        energy = float(t["energy_j"].sum()) * self.workload.replicas
        return {
            "power_managed": pc.managed,
            "power_cap_w": settings.cap_w,
            # The limit the loop held: the cap, or the board's default limit (None: no loop).
            "power_limit_w": pc.cap_w if pc.managed else None,
            "sm_clock_lock_hz": settings.sm_clock_hz,
            "power_start": settings.start if pc.managed else None,
            "avg_power_w": float(t["avg_power_w"].mean()),
            "peak_power_w": float(t["peak_power_w"].max()),
            # What a power sensor shows at its peak; a run shorter than the window, repeated, its average.
            "peak_100ms_power_w": float(t["peak_window_power_w"].max()),
            "energy_j": energy,
            "energy_delay_j_s": energy * self.timeline.makespan_s,
            "avg_sm_clock_hz": float(t["avg_sm_clock_hz"].mean()),
            "min_sm_clock_hz": float(t["min_sm_clock_hz"].min()),
        }

    def summary(self) -> dict[str, Any]:
        tl = self.timeline
        ranks = rank_overlap(tl)
        # Masks over the columns' arrays, not filtered copies of a frame (a schedule search
        # summarizes thousands of small predictions), and no frame at all: pandas is not imported.
        kind = tl.op_column("kind")
        per_rank = tl.op_column("rank") >= 0
        compute = per_rank & ~np.isin(kind, list(NON_COMPUTE))
        comm = per_rank & np.isin(kind, list(COMM_KINDS))

        def total(column: str, rows: np.ndarray) -> float:
            return float(tl.op_column(column).astype(float)[rows].sum())

        n = max(1, len(ranks))
        compute_s = total("duration_s", compute) / n
        compute_iso_s = total("isolated_s", compute) / n
        compute_clock_s = total("clock_s", compute) / n
        return {
            "scenario": self.scenario.name,
            "mode": self.mode,
            "schedule": self.scenario.schedule,
            "system": self.system.name,
            "gpu": self.gpu.name,
            "ranks": len(ranks) * self.workload.replicas,
            # Rank symmetry: the ranks simulated, each standing for ranks / simulated_ranks replicas.
            "simulated_ranks": len(ranks),
            "makespan_s": self.timeline.makespan_s,
            "compute_s": compute_s,
            "compute_isolated_s": compute_iso_s,
            "compute_slowdown": compute_s / compute_iso_s - 1 if compute_iso_s > 0 else 0.0,
            # The part of it lost to an SM clock below the one the isolated times assume (the power
            # loop, a locked clock), or gained above it; the rest is contention.
            "compute_clock_slowdown": compute_clock_s / compute_iso_s if compute_iso_s > 0 else 0.0,
            "comm_s": total("duration_s", comm) / n,
            "exposed_comm_s": sum(r.exposed_comm_s for r in ranks) / n,
            "hidden_comm_s": sum(r.overlapped_s for r in ranks) / n,
            "comm_hidden_fraction": (sum(r.overlapped_s for r in ranks) / sum(r.comm_busy_s for r in ranks)
                                     if any(r.comm_busy_s for r in ranks) else 0.0),
            # Busy and idle time are sums of intervals: within round-off of 0 (a part in a billion
            # of the span, the error of summing a million ops' intervals), they are 0.
            "idle_s": _above_round_off(sum(r.idle_s for r in ranks) / n, self.timeline.makespan_s),
            **self._power_summary(),
            **self._memory_summary(),
            "calibration_files": list(self.calibration.files),
        }

    def streams(self) -> pd.DataFrame:
        return stream_busy(self.timeline)

    def stream_rows(self) -> list[dict[str, Any]]:
        """:meth:`streams` as records, without pandas."""
        return stream_busy_rows(self.timeline)

    def expanded_ops(self) -> pd.DataFrame:
        """The timeline's ops on every rank of the job: where rank symmetry simulated some ranks
        (``workload.replicas`` > 1: one data-parallel replica, one rank of each tensor-parallel
        group), each simulated rank r's rows stand for ranks r + offset for each of
        ``workload.stand_offsets``, each id's ``@r`` suffix renamed to match. Names, groups and
        streams are the simulated ranks' (a collective's group name, a sequential pipeline's
        ``p2p0>1`` stream), so where a name carries a replica or tensor-parallel index (a
        transfer's ``d0t0``, a group's ``g0``) the ids differ from a full simulation's: join the
        two by rank, stream and time, not by id. Flows (rank -1) appear once."""
        return self._expanded(self.timeline.ops, ids=True)

    def expanded_timeline(self) -> Timeline:
        """The timeline on every rank of the job: :meth:`expanded_ops`, and each simulated rank's
        counters (power, clock) for every rank it stands for."""
        return Timeline(ops=self.expanded_ops(), counters=self._expanded(self.timeline.counters, ids=False))

    @property
    def expanded_rows(self) -> int:
        """Rows of :meth:`expanded_ops`, without making them."""
        per_rank = int((self.timeline.op_column("rank") >= 0).sum())
        return self.timeline.n_ops + per_rank * (self.workload.replicas - 1)

    def _expanded(self, df: pd.DataFrame, *, ids: bool) -> pd.DataFrame:
        import pandas as pd

        if self.workload.replicas == 1 or df.empty:
            return df
        per_rank = df[df["rank"] >= 0]
        parts = [df]
        for offset in self.workload.stand_offsets[1:]:
            copy = per_rank.copy()
            copy["rank"] = copy["rank"] + offset
            if ids:
                names = (i.rsplit(RANK_MARK, 1)[0] for i in copy["id"])
                copy["id"] = [op_id(name, r) for name, r in zip(names, copy["rank"], strict=True)]
            parts.append(copy)
        return pd.concat(parts, ignore_index=True)

    def to_json(self, *, all_ranks: bool = False) -> dict[str, Any]:
        """The summary, streams, ops and per-GPU power as plain data; ``all_ranks``: streams, ops
        and power of every rank of the job (:meth:`expanded_ops`), not only the simulated ones'."""
        ops = self.expanded_ops() if all_ranks else None
        streams = stream_busy(ops) if ops is not None else self.streams()
        # Without all_ranks, the timeline's own columns: its frame took 0.4 s of 150,000 ops.
        records = (json_records(list(ops.columns), lambda c: ops[c].to_numpy()) if ops is not None
                   else json_records(OP_COLUMNS, self.timeline.op_column))
        out = {"summary": self.summary(), "streams": streams.to_dict(orient="records"), "ops": records}
        if self.power_config is not None:
            power = self.power()
            out["power"] = (self._expanded(power, ids=False) if all_ranks else power).to_dict(orient="records")
        return out


def json_records(names: Sequence[str], column: Callable[[str], np.ndarray]) -> list[dict[str, Any]]:
    """Rows of the columns ``names`` (each read by ``column``) as dicts of Python values, a float
    that is not finite (a slowdown against a zero isolated time) and a missing value as None, as
    JSON takes them. Column by column in C (``tolist``): pandas' records and a walk over them took
    4 of the 8 s of a 150,000-op prediction's ``--json``."""
    import pandas as pd

    columns: list[list[Any]] = []
    for name in names:
        values = np.asarray(column(name))
        out = values.tolist()
        missing = ~np.isfinite(values) if values.dtype.kind == "f" else (
            pd.isna(values) if values.dtype.kind == "O" else np.zeros(len(values), dtype=bool))
        for i in np.flatnonzero(missing).tolist():
            out[i] = None
        columns.append(out)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def _resolve_system(sc: Scenario, source: str) -> tuple[SystemSpec, GpuSpec, str]:
    try:
        system = _system_once(sc.system) if isinstance(sc.system, InlineSystem) else load_system(sc.system)
        gpu = load_gpu(system.gpu)
        check_domain(system, gpu)
    except ValidationError as e:
        # An inline system that passed its own fields but not the system schema (a mesh without links).
        err = validation_error(e, source)
        raise OvsimError(err.message, source=source, field=".".join(p for p in ("system", err.field) if p)) from None
    except OvsimError as e:
        # A system or GPU file of the user's own keeps its name and field in the message.
        if e.source:
            message = ": ".join(p for p in (e.source, e.field, e.message) if p)
            raise OvsimError(message, source=source, field="system") from None
        field = "system" if e.field in ("", "system") else f"system.{e.field}"
        raise OvsimError(e.message, source=source, field=field) from None
    if sc.nodes is not None and sc.nodes != system.nodes:
        if system.network is None:
            raise OvsimError(f"{sc.nodes} nodes of {system.name}, which has no network to join them "
                             "(use a system with a network)", source=source, field="nodes")
        system = _system_once(system, sc.nodes)
    return system, gpu, gpu_file(system.gpu).stem


# One spec for each inline system, and one copy of each system at another node count (its
# source held beside it, so that the identity keying it stays its own): builds on it then share
# the NCCL plans, collectives' parts and ops made for it (build_memo keys them by the system's
# identity), where each build made its own.
_SYSTEMS: dict[tuple[int, int | None], tuple[InlineSystem | SystemSpec, SystemSpec]] = {}


def _system_once(source: InlineSystem | SystemSpec, nodes: int | None = None) -> SystemSpec:
    key = (id(source), nodes)
    hit = _SYSTEMS.get(key)
    if hit is None:
        if len(_SYSTEMS) >= 64:
            _SYSTEMS.clear()
        made = source.to_spec() if isinstance(source, InlineSystem) else source.model_copy(update={"nodes": nodes})
        hit = _SYSTEMS[key] = (source, made)
    return hit[1]


def _above_round_off(seconds: float, span_s: float) -> float:
    """``seconds``, or 0 where it is within round-off (a billionth of ``span_s``) of 0 or below."""
    return seconds if seconds > 1e-9 * span_s else 0.0


def _memory_fields(per_gpu_bytes: float, gpu: GpuSpec) -> dict[str, Any]:
    return {"memory_per_gpu_bytes": per_gpu_bytes, "memory_capacity_bytes": gpu.memory.capacity_bytes,
            "fits_memory": per_gpu_bytes <= gpu.memory.capacity_bytes}


def memory_summary(sc: Scenario, source: str = "") -> dict[str, Any]:
    """A training scenario's memory fields of :meth:`Result.summary` (the closed-form estimate on
    the job's ranks), without building its workload: a schedule search skips the analysis of a
    candidate that cannot fit. Empty for a list of ops."""
    if sc.training is None:
        return {}
    from ovsim.models.memory import memory_estimate

    system, gpu, _ = _resolve_system(sc, source)
    return _memory_fields(memory_estimate(sc.training, sc.ranks or system.total_gpus).total_bytes, gpu)


def _given_in(path: str, given: Sequence[str]) -> bool:
    """Whether file ``path`` is one of the ``given`` calibration paths or in one of those folders."""
    if not path or not given:
        return False
    p = Path(path).resolve()
    return any(q == p or q in p.parents for q in (Path(g).resolve() for g in given))


def build(sc: Scenario, source: str = "", max_ops: int | None = None) -> tuple[Workload, SystemSpec, GpuSpec,
                                                                                Calibration]:
    """Resolve a scenario into the workload both fidelities run; ``max_ops``: the most ops it may
    expand to (default ``ovsim.models.workload.MAX_OPS``)."""
    system, gpu, stem = _resolve_system(sc, source)
    try:
        calib = load_calibration(gpu, stem, tuple(sc.calibration))
    except OvsimError as e:
        # One of the files a scenario file lists: named under that file and its field (a Scenario
        # object, its source its name, keeps the file's name first, as a sweep's points are).
        if source and source != sc.name and _given_in(e.source, sc.calibration):
            inner = f"{e.field}: {e.message}" if e.field else e.message
            raise OvsimError(f"{e.source}: {inner}", source=source, field="calibration") from None
        raise e.located(source) from None
    n_ranks = sc.ranks or system.total_gpus
    if n_ranks > system.total_gpus:
        raise OvsimError(f"{n_ranks} ranks on a {system.total_gpus}-GPU system", source=source, field="ranks")
    # A million ops' specs, demands and dependency lists hold no reference cycles: the cyclic
    # collector's passes over the growing heap only cost time (40% of a GPT-3 175B build).
    with paused_gc():
        if sc.training is not None:
            from ovsim.models.training import build_training_workload

            wl = build_training_workload(sc.training, gpu=gpu, system=system, params=calib.params, n_ranks=n_ranks,
                                         schedule=sc.schedule, knobs=sc.knobs, streams=sc.streams, source=source,
                                         max_ops=max_ops)
        else:
            wl = build_workload(list(sc.ops), gpu=gpu, system=system, params=calib.params, n_ranks=n_ranks,
                                schedule=sc.schedule, knobs=sc.knobs, streams=sc.streams, source=source,
                                max_ops=max_ops)
    return wl, system, gpu, calib


def predict(scenario: str | Path | Scenario, *, mode: Mode | None = None, counters: bool = True,
            power_cap_w: float | None = None, sm_clock_hz: float | None = None,
            power_start: Literal["steady", "idle"] | None = None, power_managed: bool | None = None,
            max_ops: int | None = None, progress: Callable[[int, int], None] | None = None) -> Result:
    """Predict a scenario (a file path or a :class:`Scenario`); ``mode`` overrides the file's.

    The prediction runs the board's power-limit loop (docs/power.md) at the GPU's default limit,
    from the steady state of the workload repeated. ``power_cap_w`` (board power limit, as
    ``nvidia-smi -pl``), ``sm_clock_hz`` (locked SM clock, as ``nvidia-smi -lgc``),
    ``power_start`` ("idle": from an idle GPU) and ``power_managed`` (False: no loop, every kernel
    at its calibrated rate) override the scenario's ``power`` settings. Power and energy are
    reported either way. ``max_ops``: the most ops the scenario may expand to (default
    ``ovsim.models.workload.MAX_OPS``, a million); a larger one is refused before any work.
    ``progress(done, total)`` is called as the engine finishes ops (simulate mode)."""
    check_mode(mode)
    source = str(scenario) if not isinstance(scenario, Scenario) else scenario.name
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    use_mode: Mode = mode or sc.mode
    wl, system, gpu, calib = build(sc, source, max_ops)
    base = sc.power or PowerSettings()
    try:
        settings = PowerSettings(cap_w=power_cap_w if power_cap_w is not None else base.cap_w,
                                 sm_clock_hz=sm_clock_hz if sm_clock_hz is not None else base.sm_clock_hz,
                                 start=power_start if power_start is not None else base.start,
                                 managed=power_managed if power_managed is not None else base.managed)
    except ValidationError as e:
        raise validation_error(e, source) from None
    check_settings(settings, gpu, source)
    power = power_config(wl, gpu, calib, settings)
    if use_mode == "analytic":
        with paused_gc():  # as the build: plain arrays and lists over the ops, no cycles
            timeline = _analytic(wl, gpu, power)
    else:
        machine = build_machine(system, gpu, calib.params, n_ranks=wl.n_ranks, sm_carveout=sc.knobs.sm_carveout,
                                job_ranks=wl.job_ranks)
        try:
            timeline = _simulate(wl, gpu, machine, EngineOptions(counters=counters, power=power, progress=progress))
        except OvsimError as e:
            raise e.located(source) from None
    if wl.job_ranks:
        # Rank symmetry simulated some of the job's ranks: the timeline names them as the job does.
        timeline = on_ranks(timeline, wl.job_ranks)
    return Result(scenario=sc, mode=use_mode, system=system, gpu=gpu, calibration=calib, timeline=timeline,
                  workload=wl, power_config=power)


def power_config(wl: Workload, gpu: GpuSpec, calib: Calibration, settings: PowerSettings) -> PowerConfig:
    """The board's power model for ``wl`` under ``settings``: with rate classes for the kernels
    that saturate at a clock of their own (GEMMs of one's own)."""
    model = power_model(gpu, calib.params).with_kernel_saturations(
        {id(op.kernel): op.kernel.saturation_clock_fraction for op in wl.ops if op.kernel is not None}.values())
    return PowerConfig(model=model, settings=settings)


def _simulate(wl: Workload, gpu: GpuSpec, machine: MachineModel, opts: EngineOptions) -> Timeline:
    """The engine's timeline of ``wl``. A long workload under the power loop's steady start runs
    from the window the analytic fidelity's loop leaves (power_analytic.steady_window) rather than
    after a warm-up run; where that window starts a GPU more than a clock step away from the one
    the run itself leaves (contention the analytic fidelity does not see, at the iteration's end),
    the run is made again from the window it left (docs/power.md, "Steady state")."""
    power = opts.power
    history = None
    if power is not None and power.managed and power.settings.start == "steady":
        from ovsim.engine.power_analytic import steady_window

        with paused_gc():
            history = steady_window(wl, gpu, power)
    engine = Engine(wl, machine, opts, power_history=history)
    timeline = engine.run()
    if history is None or power is None:
        return timeline
    left = engine.left_window()
    if same_start(power, history, left):
        return timeline
    del engine, timeline  # before the second run, which would otherwise hold both at its peak
    return Engine(wl, machine, opts, power_history=left).run()


def _analytic(wl: Workload, gpu: GpuSpec, power: PowerConfig) -> Timeline:
    """The analytic fidelity's timeline of ``wl``, its clocks under ``power``'s policy, with power
    counters."""
    from ovsim.engine.analytic import Plan, analytic_timeline
    from ovsim.engine.power_analytic import OpTerms, throttled_timeline
    from ovsim.engine.power_counters import analytic_power

    plan = Plan.of(wl)
    terms = OpTerms.of(wl, gpu, power.model)
    if power.managed:
        timeline, clocks = throttled_timeline(wl, gpu, power, plan, terms)
        del plan  # before the power counters are made: 0.15 GB of Megatron-LM's 1T row
    else:
        clocks = None
        timeline = analytic_timeline(wl, plan=plan)
    return timeline.with_counters(analytic_power(timeline, wl, gpu, power, clocks, terms))


def compare(scenarios: Sequence[str | Path | Scenario], *, mode: Mode | None = None,
            max_ops: int | None = None) -> pd.DataFrame:
    """Predict several scenarios and line up their summaries, one row each, in the order given.

    ``vs_first`` is each makespan relative to the first scenario's (-0.2: 20% less time), so
    the first is the baseline: sequential vs overlapped vs overlapped with priority, say.
    ``compute_vs_first`` is each compute time (kernel time summed, per rank) relative to the
    first's. With a sequential run first, it is the overlap studies' compute slowdown, measured
    against compute that ran at the same power limit or clock; ``compute_slowdown`` measures
    against the cost model's isolated times at the full clock, so it counts the clock the power
    loop sets too (``compute_clock_slowdown`` is that part).
    Also with a sequential run first, ``accounted_sequential_s`` is each scenario's sequential
    time by the overlap study's accounting (:func:`accounted_sequential_s`).
    """
    import pandas as pd

    if not scenarios:
        raise OvsimError("give at least one scenario to compare", field="scenarios")
    rows = []
    for sc in scenarios:
        s = predict(sc, mode=mode, counters=False, max_ops=max_ops).summary()
        s["source"] = sc.name if isinstance(sc, Scenario) else str(sc)
        rows.append(s)
    df = pd.DataFrame(rows)
    # Against a baseline of zero (a first scenario with no compute, say) a change is undefined:
    # NaN, not a 0% that reads as "no change".
    base = float(df["makespan_s"].iloc[0])
    df["vs_first"] = df["makespan_s"] / base - 1 if base > 0 else math.nan
    base_compute = float(df["compute_s"].iloc[0])
    df["compute_vs_first"] = df["compute_s"] / base_compute - 1 if base_compute > 0 else math.nan
    df["accounted_sequential_s"] = [accounted_sequential_s(row, rows[0]) for row in rows]
    return df


def accounted_sequential_s(overlapped: dict[str, Any], sequential: dict[str, Any]) -> float:
    """The sequential iteration time as Lee et al. (arXiv 2507.03114) account for it from an
    overlapped run, given the two runs' :meth:`Result.summary`: the overlapped iteration less its
    compute slowdown time (overlapped compute less sequential compute, per rank) is the ideal
    iteration; adding back the communication time that overlapped compute gives the sequential one.

    It differs from simulating the sequential schedule wherever running in program order on one
    stream costs more than the hidden communication: blocking send/recv in a pipeline waits for
    its peer, which the accounting does not count."""
    slowdown_s = overlapped["compute_s"] - sequential["compute_s"]
    return float(overlapped["makespan_s"] - slowdown_s + overlapped["hidden_comm_s"])
