"""What a schedule search (:mod:`ovsim.tune`) predicts of each candidate: the engine's summary
with where time was lost, the analytic fidelity's estimate with a time bound no engine prediction
beats, a digest of the workload the engine reads, and the objective a summary gives."""

from __future__ import annotations

import hashlib
import math
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ovsim.api import Result, build, memory_summary, power_config, predict
from ovsim.engine.analytic import Plan
from ovsim.engine.machine import GpuModel, gpu_model
from ovsim.engine.power import PowerConfig, op_power_class, rate_class
from ovsim.engine.state import block_shape, partitions
from ovsim.errors import OvsimError
from ovsim.gcpause import paused_gc
from ovsim.hw.calib import Parameters
from ovsim.hw.power import PowerSettings
from ovsim.hw.spec import GpuSpec
from ovsim.metrics import COMM_KINDS, NON_COMPUTE
from ovsim.models.ir import Op, Workload
from ovsim.models.occupancy import kept_load_share
from ovsim.scenario import Mode, Scenario

Objective = Literal["time", "energy", "edp"]
OBJECTIVE_FIELDS: dict[str, str] = {"time": "makespan_s", "energy": "energy_j", "edp": "energy_delay_j_s"}
# Where compute and communication lost time (the timeline's columns), as the why-lines name it.
LOST_TO = {"wait_sm_s": "waiting for SMs", "share_sm_s": "sharing SMs", "share_hbm_s": "sharing HBM",
           "share_link_s": "sharing links", "clock_s": "the clock"}


def summarize(sc: Scenario, mode: Mode, power: bool = True) -> dict[str, Any]:
    """The prediction's summary, with where compute and communication lost time per rank
    (``compute_lost_<column>``, ``comm_lost_<column>``: the timeline's columns; simulate mode) or,
    in analytic mode, the time ``bound_s`` (:mod:`ovsim.tune`'s docstring, step 2); an error's message under ``error``
    instead (an illegal value the scenario's schema lets through). ``power`` False: without the
    power-limit loop (and the scenario's power settings), every op at its calibrated rate."""
    try:
        if power:
            result = predict(sc, mode=mode, counters=False)
        else:
            result = predict(sc.model_copy(update={"power": None}), mode=mode, counters=False, power_managed=False)
    except OvsimError as e:
        return {"error": e.message}
    out = result.summary()
    if mode == "analytic":
        # No resource is shared there: nothing is lost to contention, and the why-lines read the
        # engine's summaries only.
        model = gpu_model(result.gpu, result.calibration.params, result.scenario.knobs.sm_carveout)
        out["bound_any_priority_s"], out["bound_s"], _ = _bounds_s(result.workload, result.power_config,
                                                                   Plan.of(result.workload), model)
        out["workload"] = workload_digest(result)
        return out
    # From the timeline's columns: no frame is made for a candidate.
    tl = result.timeline
    kind, on_rank = tl.op_column("kind"), tl.op_column("rank") >= 0
    n = max(1, out["simulated_ranks"])
    for what, rows in (("compute", on_rank & ~np.isin(kind, list(NON_COMPUTE))),
                       ("comm", on_rank & np.isin(kind, list(COMM_KINDS)))):
        for col in LOST_TO:
            out[f"{what}_lost_{col}"] = float(tl.op_column(col).astype(float)[rows].sum()) / n
    return out


def analyze(sc: Scenario, objective: Objective = "time", memory_first: bool = True) -> dict[str, Any]:
    """The analytic summary of :func:`summarize`, with its time bound. A time search needs no
    power loop for it (the bound does not depend on the clock the loop picks): without it the
    analytic prediction costs a third as much (Llama 2 70B, two TP layers on 8 H100: 13 ms, not
    41). Nor does it need the rest of the summary, only the time, the bound and whether the
    memory fits, and so neither a timeline nor power counters: the analytic fidelity's plan gives
    both times (Cui & Pericas's GEMM beside an all-reduce on 4 H100: 0.44 ms, where the
    prediction with its timeline and power counters took 1.31, measured the same day).

    With ``memory_first``, a training candidate whose memory estimate (closed form, no build) does
    not fit the GPU is not analysed: its memory fields alone, which keep it out of the ranking
    (Llama 3 405B on 16,384 H100, over 80 GB by the estimate: refused in 26 s, where the analyses
    of every sample had not ended in 15 minutes; docs/tune.md). Without it (what an analysis
    costs, to pace a time budget), it is analysed all the same."""
    memory = _memory(sc)
    if memory_first and memory.get("fits_memory") is False:
        return memory
    if objective != "time":
        return summarize(sc, "analytic")
    try:
        wl, _, gpu, calib = build(sc.model_copy(update={"power": None}), sc.name)
        model = _gpu_model(gpu, calib.params, sc.knobs.sm_carveout)
    except OvsimError as e:
        return {"error": e.message}
    with paused_gc():  # as predict's analytic fidelity: plain lists over the ops, no cycles
        plan = Plan.of(wl)
        iso = [op.isolated_s for op in wl.ops]
        free, waiting, at_isolated = _bounds_s(wl, power_config(wl, gpu, calib, PowerSettings(managed=False)), plan,
                                             model, iso)
        out: dict[str, Any] = {"makespan_s": free if at_isolated else plan.makespan_s(iso),
                               "bound_s": waiting, "bound_any_priority_s": free, "workload": _digest(wl)}
    if "fits_memory" in memory:
        out["fits_memory"] = memory["fits_memory"]
    return out


def _memory(sc: Scenario) -> dict[str, Any]:
    """A training scenario's memory fields (:func:`memory_summary`: the estimate on the job's
    ranks, as its build's); empty for a list of ops, and where the scenario's system or layout is
    refused, which its build then reports."""
    try:
        return memory_summary(sc, sc.name)
    except OvsimError:
        return {}


def workload_digest(result: Result) -> str:
    """A digest of what the engine reads of a prediction's workload: its ops (their demands, not
    their descriptions), streams and ranks. Equal digests, equal workloads (a 128-bit hash; pickled,
    so the same in every worker process)."""
    return _digest(result.workload)


def _digest(wl: Workload) -> str:
    # What every workload of one structure shares (ids, ranks, streams, dependencies, delays:
    # most of the bytes) is digested once for all of them (ir.Structure).
    known = wl.structure
    shared = known.digest if known is not None else b""
    if not shared:
        shared = _hash(tuple((op.id, op.rank, op.stream, op.deps, op.delay_s) for op in wl.ops)).digest()
        if known is not None:
            known.digest = shared
    return _hash((shared, tuple((op.kind, op.kernel, op.flow, op.partition) for op in wl.ops), wl.streams,
                  wl.n_ranks, wl.job_ranks, wl.stand_offsets)).hexdigest()


def _hash(body: object) -> hashlib.blake2b:
    return hashlib.blake2b(pickle.dumps(body, protocol=5), digest_size=16)


def time_bound_s(result: Result) -> float:
    """A time no engine prediction of the workload beats: its longest path with every op at its
    isolated time sped up as much as the top SM clock speeds that op (its rate class's multiplier:
    none for flows, delays and work that does not follow the clock; a tensor kernel only up to
    its saturation clock). Contention only adds time, and the clock is the only thing that speeds
    an op up. Tighter than one factor for all (the most the clock speeds any op): a GEMM that
    saturates below the top clock gains nothing from it. Kernels wait for the SMs the engine's
    dispatcher cannot give them yet (:func:`dispatch_release_s`)."""
    model = gpu_model(result.gpu, result.calibration.params, result.scenario.knobs.sm_carveout)
    return _bounds_s(result.workload, result.power_config, Plan.of(result.workload), model)[1]


def _bounds_s(wl: Workload, pc: PowerConfig | None, plan: Plan, model: GpuModel,
              isolated_s: list[float] | None = None) -> tuple[float, float, bool]:
    """:func:`time_bound_s` of ``wl`` under ``pc``, on its analytic ``plan`` and ``model`` (every
    rank's GPU): without the waits for SMs (a bound at any stream priority) and with them; and
    whether the first is also the plan's makespan at the ops' isolated times (no op was sped up).
    ``isolated_s``: those times, where the caller has them already."""
    iso = isolated_s if isolated_s is not None else [op.isolated_s for op in wl.ops]
    if pc is None:
        free = plan.makespan_s(iso)
        return free, free, True
    top = pc.multipliers(pc.model.max_clock_fraction)
    memo: dict[tuple[int, str, str | None], float] = {}

    def speedup(op: Op) -> float:
        """The most the top clock speeds ``op`` (a kernel of its own, not a collective's): by its
        demand, kind and precision, as the engine's rate class (engine.state.spec_key)."""
        k = op.kernel
        assert k is not None
        precision = op.info.get("precision")
        key = (id(k), op.kind, precision if isinstance(precision, str) else None)
        if key not in memo:
            memo[key] = max(1.0, top[rate_class(op, pc.model, op_power_class(op, pc.model)[0])])
        return memo[key]

    dur = []
    for op in wl.ops:  # speedup's memo read inline, under speedup's key: a pass over every op
        k = op.kernel
        if k is None or op.flow is not None:
            dur.append(op.isolated_s)
            continue
        precision = op.info.get("precision")
        gain = memo.get((id(k), op.kind, precision if isinstance(precision, str) else None))
        dur.append(op.isolated_s / (gain if gain is not None else speedup(op)))
    launch, start, end, _, _ = plan.times(dur)
    free = plan.span(launch, end)
    at_isolated = dur == iso
    release, slowed = dispatch_release_s(wl, model, start, speedup)
    if not any(release) and not slowed:
        return free, free, at_isolated
    # With the waits, each kernel takes the least time the volume of its work allows
    # (_least_s), not its isolated time: one that starts beside another's last wave can beat
    # that by a little in the engine, which the bound without the waits has room for. The larger
    # of the two bounds holds.
    least = [_least_s(op, model, speedup(op)) if op.kernel is not None and op.flow is None and op.kind != "delay"
             else d for op, d in zip(wl.ops, dur, strict=True)]
    return free, max(free, plan.makespan_s(least, release, slowed)), at_isolated


def _least_s(op: Op, model: GpuModel, speedup: float) -> float:
    """The least time kernel ``op`` takes in the engine from its start on ``model``, at
    ``speedup`` (the top clock's): its HBM traffic at its own bandwidth cap, its blocks' issue
    volume spread over every SM it may use, and its blocks one after another in the slots it
    holds, none faster than at its most issue share and on the fewest busy SMs (:func:`_pace`)."""
    k = op.kernel
    assert k is not None
    least = k.hbm_bytes / (k.hbm_cap_bytes_per_s * speedup) if 0 < k.hbm_cap_bytes_per_s < math.inf else 0.0
    if k.issue_fraction <= 0:
        return least
    held, block_s, ask, cap, sms = _pace(op, model, speedup)
    rounds = -(-k.blocks // held) if held > 0 else 0
    return max(least, rounds * block_s * ask / cap, k.blocks * ask * block_s / sms)


# GPU models by the identities of the GPU and the parameters (held beside them) and the carve-out:
# a search analyses hundreds of candidates on one GPU.
_MODELS: dict[tuple[int, int, int], tuple[GpuSpec, Parameters, GpuModel]] = {}


def _gpu_model(gpu: GpuSpec, params: Parameters, sm_carveout: int) -> GpuModel:
    key = (id(gpu), id(params), sm_carveout)
    if key not in _MODELS:
        if len(_MODELS) >= 64:
            _MODELS.clear()
        _MODELS[key] = (gpu, params, gpu_model(gpu, params, sm_carveout))
    return _MODELS[key][2]


def dispatch_release_s(wl: Workload, model: GpuModel, start_s: Sequence[float],
                       speedup: Callable[[Op], float]) -> tuple[list[float], dict[int, list[tuple[float, float]]]]:
    """What the engine's block dispatcher surely withholds from each op: a time before which it
    gets no SM (one per op), and for a collective's kernel that gets some SMs before then, that
    time with the share of its blocks it can hold until it (by op index; a collective moves data
    no faster than that share of its rate, engine.rates.sm_factor). ``model``: every rank's GPU.

    The dispatcher places a kernel's blocks only on SM partitions where no kernel before it (in
    stream priority, then launch order) still has blocks waiting (docs/design.md). A kernel A that
    launches at 0 (the first op of its stream, with no dependency and no delay: launches at one
    instant go in workload order) keeps blocks waiting until its last wave has SMs
    (:func:`_drained_s`). A kernel B of the same rank, on another stream, of no higher priority,
    that surely launches after A (its stream's first op comes after A in the workload, or even its
    bound starts it after 0, ``start_s``) gets no SM of A's partitions before then: none at all
    where its SMs all lie in them, else only those a carve-out reserves.

    Without this the bound took a normal-priority all-reduce beside a GEMM of 16 waves as
    overlapping it, where the engine runs it after the GEMM's blocks drain (docs/tune.md)."""
    ops = wl.ops
    release = [0.0] * len(ops)
    slowed: dict[int, list[tuple[float, float]]] = {}
    priority: dict[tuple[int, str], int] = {}
    for st in wl.streams:  # the first declaration of a stream holds, as in the engine
        priority.setdefault((st.rank, st.name), st.priority)
    first: dict[tuple[int, str], int] = {}
    on_rank: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        first.setdefault((op.rank, op.stream), i)
        if op.kernel is not None and op.kind != "delay":
            on_rank.setdefault(op.rank, []).append(i)
    for a, op in enumerate(ops):
        if (op.kernel is None or op.flow is not None or op.deps or op.delay_s > 0 or op.kind == "delay"
                or first[(op.rank, op.stream)] != a):
            continue
        drained = _drained_s(op, model, speedup(op))
        if drained <= 0:
            continue
        a_parts = partitions(op)
        a_priority = priority.get((op.rank, op.stream), 0)
        for b in on_rank[op.rank]:
            other = ops[b]
            k = other.kernel
            assert k is not None
            if (other.stream == op.stream or priority.get((other.rank, other.stream), 0) < a_priority
                    or not (first[(other.rank, other.stream)] > a or start_s[b] > 0)):
                continue
            free = [p for p in partitions(other) if p not in a_parts and (p == "main" or model.comm_reserved_sms)]
            if not free:
                release[b] = max(release[b], drained)
            elif free == ["reserved"] and other.flow is not None and not other.flow.uses_copy_engine:
                held = model.comm_reserved_sms * block_shape(k, model, False)[3]
                if held < k.blocks:
                    slowed.setdefault(b, []).append((drained, held / k.blocks))
    return release, slowed


def _drained_s(op: Op, model: GpuModel, speedup: float) -> float:
    """When kernel ``op``, launched at 0 on ``model``, can have placed its last blocks at the
    earliest (0: not known, or at once). Its blocks run one after another in each of the slots it
    holds, none faster than its fastest block (:func:`_pace`), and no SM issues more for them than
    all of its slots: so no sooner than (waves - 1) fastest blocks, nor than (blocks - those
    resident at once) x issue share x fastest block / SMs. A persistent kernel's tiles are its
    blocks here, as in the engine (a CTA that finds no SM holds its first tile back, which only
    delays it); a cluster kernel holds no more blocks at once than alone. Not known for a
    collective's kernel, whose blocks end with its flow."""
    k = op.kernel
    assert k is not None
    if k.issue_fraction <= 0:
        return 0.0
    held, block_s, ask, cap, sms = _pace(op, model, speedup)
    if held <= 0 or k.blocks <= held:
        return 0.0
    return max((-(-k.blocks // held) - 1) * block_s * ask / cap, (k.blocks - held) * ask * block_s / sms)


def _pace(op: Op, model: GpuModel, speedup: float) -> tuple[int, float, float, float, int]:
    """Kernel ``op``'s blocks on ``model`` at ``speedup``: how many it holds at once alone, its
    shortest block time at its asked issue share, the issue share it asks and the most it can
    use, and the SMs it may use. Blocks whose pace grows on fewer busy SMs (GEMM tiles,
    ``load_share``) run at most 1 / (1 - load share) times their calibrated pace (all SMs idle but
    theirs: engine.rates)."""
    k = op.kernel
    assert k is not None
    main_only = op.partition == "compute"
    ask = k.issue_fraction
    cap = ask if k.issue_cap is None else max(ask, k.issue_cap)
    shape = block_shape(k, model, main_only)
    block_s = k.block_time_s * (1.0 - kept_load_share(k.load_share, shape[3])) / speedup
    sms = model.sm_count - (model.comm_reserved_sms if main_only else 0)
    return shape[4], block_s, ask, cap, sms


def objective_value(summary: Mapping[str, Any], objective: Objective) -> float:
    """The summary's objective; infinite for a failed prediction or one that does not fit memory."""
    if "error" in summary or summary.get("fits_memory") is False:
        return math.inf
    return float(summary[OBJECTIVE_FIELDS[objective]])
