"""Replay a measured run: rebuild its workload from the kernel table, simulate it with contention,
and compare every kernel with what was measured (docs/replay.md).

Reconstruction
- Each (rank, stream) runs its activities in measured start order.
- A kernel waits for an activity of another stream of its rank when the trace records the event
  wait (``TraceBundle.syncs``); without such records, when it started within ``DEP_WINDOW_S`` of that
  activity's end while its own stream had been idle longer (it was queued behind something else).
- Whatever of a measured gap those two do not explain is kept as a host delay before the launch.
- A collective is one flow over the ranks the bundle has: matched by (process group, ``seq``) where
  the trace numbers them, otherwise the k-th collective kernel of a rank matches the k-th on every
  other rank. Its transfer takes the shortest member's measured duration (the last rank to arrive
  waited least); the member kernels hold ``replay_collective_sm_fraction`` of their measured grid
  of blocks (fitted with the contention parameters; none at 0) until it completes.
- Copies and memsets are copy-engine flows at their measured rate.
- A GEMM launched as a persistent kernel (a grid of one full wave whose blocks loop over more output
  tiles than there are blocks, :func:`persistent_tiles`) is simulated as its tiles, one block each,
  so that the SMs another kernel holds cost it rounds of tiles, not a second wave of blocks.


How each kernel's isolated duration and demand are read from the table: :mod:`ovsim.replay_kernels`;
the figures a replay reports: :mod:`ovsim.replay_score`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ovsim.engine.machine import build_machine
from ovsim.engine.power import PowerConfig
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.engine.timeline import Timeline, on_ranks
from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters, load_calibration
from ovsim.hw.power import PowerSettings, power_model
from ovsim.hw.spec import GpuSpec, SystemSpec, gpu_file, load_gpu
from ovsim.models import nccl, nccl_params
from ovsim.models.ir import FlowDemand, KernelDemand, Op, StreamSpec, Workload
from ovsim.replay_kernels import (
    KernelColumns,
    engine_kind,
    held_blocks,
    isolated_durations,
    kernel_demand,
    kernel_launch,
    overlap_flags,
    sms_measured_on,
)
from ovsim.replay_score import comm_summary, summarize
from ovsim.traces.table import TraceBundle

# A kernel that starts this soon after another stream's activity ends was waiting for it.
DEP_WINDOW_S = 3e-6
# The longest run a table may span (about 11.6 days). Profiled runs last seconds to hours; a longer
# span is a corrupt timestamp or files on different clocks, and the simulation's float seconds
# would no longer resolve a kernel's microseconds that far from its start.
MAX_SPAN_S = 1e6
# A kernel replayed at its own overlapped measurement that comes out further than this from it is
# replayed again with the contention the first replay gave it taken out of its isolated time.
OWN_MEASUREMENT_TOLERANCE = 0.005
NCCL_OPS = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"}


@dataclass
class ReplayResult:
    """Per-kernel comparison (``kernels``), the summary, and the simulated timeline, all with the
    trace's rank numbers; ``workload`` is the engine's input, its ranks numbered 0..n-1 in the
    order of the trace's (:func:`trace_ranks`)."""

    kernels: pd.DataFrame
    summary: dict[str, Any]
    timeline: Timeline
    workload: Workload = field(repr=False)
    # Trace time = simulation time + this (the timeline starts at 0, the trace at its own clock).
    clock_offset_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        recs = self.kernels.replace({np.nan: None}).to_dict(orient="records")
        return {"summary": self.summary, "kernels": recs}


def _collective_groups(c: KernelColumns) -> dict[int, str]:
    """Row -> flow group name; the rows of one group are one collective across ranks."""
    coll = [i for i, k in enumerate(c.kind) if k == "collective"]
    coll.sort(key=lambda i: c.start[i])
    if not coll:
        return {}
    if all(math.isfinite(c.seq[i]) for i in coll):
        return {i: f"pg{c.process_group[i]}:seq{int(c.seq[i])}" for i in coll}
    groups: dict[int, str] = {}
    count: dict[int, int] = {}
    for i in coll:
        r = int(c.rank[i])
        groups[i] = f"coll{count.get(r, 0)}"
        count[r] = count.get(r, 0) + 1
    if len(set(count.values())) > 1 and len(set(c.rank.tolist())) > 1:
        raise OvsimError(f"ranks ran different numbers of collectives ({dict(sorted(count.items()))}) and the trace "
                         "has no sequence numbers to match them", field="seq")
    return groups


def protocol_key(name: str) -> str:
    """The calibration key of a trace's protocol column (LL, LL128, Simple; anything else is
    "default")."""
    p = name.strip().lower()
    return p if p in ("ll", "ll128", "simple") else "default"


def _flows(c: KernelColumns, groups: dict[int, str], rank_ix: dict[int, int],
           params: Parameters) -> dict[str, FlowDemand]:
    members: dict[str, list[int]] = {}
    for i, g in groups.items():
        members.setdefault(g, []).append(i)
    p = nccl_params.DEFAULT_PARAMS
    flows: dict[str, FlowDemand] = {}
    for gname, rows in members.items():
        dur = max(float(min(c.dur[i] for i in rows)), 1e-9)
        op = c.collective[rows[0]]
        size = float(np.nanmax(c.message_bytes[rows])) if np.isfinite(c.message_bytes[rows]).any() else math.nan
        n = int(c.group_size[rows[0]]) if math.isfinite(c.group_size[rows[0]]) else len(rows)
        if op in NCCL_OPS and math.isfinite(size) and size > 0 and n > 1:
            bus = size * nccl.bus_factor(op, n)  # type: ignore[arg-type]
            hbm = p.hbm_bytes_per_bus_byte_reduce if op in nccl_params.REDUCING_OPS else p.hbm_bytes_per_bus_byte_copy
        else:
            bus, hbm = 1.0, 0.0
        proto = protocol_key(c.protocol[rows[0]])
        flows[gname] = FlowDemand(group=gname, ranks=tuple(sorted(rank_ix[int(c.rank[i])] for i in rows)), bytes=bus,
                                  latency_s=0.0, rate_cap_bytes_per_s=bus / dur, link_coeff=0.0, hbm_coeff=hbm,
                                  hbm_weight=params.nccl_hbm_weight.get(proto, 1.0), protocol=proto)
    return flows


def trace_ranks(c: KernelColumns) -> list[int]:
    """The trace's rank numbers in the engine's order: the engine numbers its ranks 0..n-1."""
    return sorted(int(r) for r in set(c.rank.tolist()))


def build_replay_workload(c: KernelColumns, iso: np.ndarray, gpu: GpuSpec, params: Parameters,
                          syncs: pd.DataFrame | None = None,
                          sms: np.ndarray | None = None) -> tuple[Workload, list[str]]:
    """The workload that replays the table; returns it and the op id of every row. ``sms``: per
    row, the SMs its isolated duration was measured on (:func:`sms_measured_on`; all if None)."""
    rank_ix = {r: i for i, r in enumerate(trace_ranks(c))}
    groups = _collective_groups(c)
    flows = _flows(c, groups, rank_ix, params)
    n = len(c.start)
    op_ids = [f"r{int(c.rank[i])}:s{int(c.stream[i])}:{i}" for i in range(n)]
    end = c.end
    has_launch = np.isfinite(c.launch)
    t0 = float(min(c.start.min(), c.launch[has_launch].min() if has_launch.any() else np.inf)) if n else 0.0
    deps = _dependencies(c, syncs)
    ops: list[Op] = []
    streams: set[tuple[int, str]] = set()
    # The host's launch calls happen when they were measured to: a chain of delays per rank that
    # each GPU activity waits for, so a GPU running late or early moves only what was queued.
    host_of: dict[int, str] = {}
    for r, ix in rank_ix.items():
        rows = np.flatnonzero((c.rank == r) & has_launch)
        prev = t0
        for i in (int(x) for x in rows[np.argsort(c.launch[rows], kind="stable")]):
            host_of[i] = f"host{r}:{i}"
            ops.append(Op(id=host_of[i], name="launch", kind="delay", rank=ix, stream="host",
                          delay_s=max(0.0, float(c.launch[i]) - prev)))
            prev = max(prev, float(c.launch[i]))
        if len(rows):
            streams.add((ix, "host"))
    prev_end: dict[tuple[int, int], float] = {}
    for i in (int(x) for x in np.argsort(c.start, kind="stable")):
        rank, stream = rank_ix[int(c.rank[i])], int(c.stream[i])
        sname = f"stream {stream}"
        streams.add((rank, sname))
        ready = max([prev_end.get((rank, stream), t0), *(float(end[d]) for d in deps.get(i, ())),
                     float(c.launch[i]) if has_launch[i] else t0])
        prev_end[(rank, stream)] = float(end[i])
        dep_ids = tuple(op_ids[d] for d in deps.get(i, ())) + ((host_of[i],) if i in host_of else ())
        common: dict[str, Any] = {"id": op_ids[i], "name": c.name[i][:200], "rank": rank, "stream": sname,
                                  "deps": dep_ids, "delay_s": max(0.0, float(c.start[i]) - ready)}
        kind = c.kind[i]
        dur = max(float(c.dur[i]), 1e-9)
        if kind == "collective":
            grid, shape = kernel_launch(c, i, gpu)
            held = held_blocks(grid, params)
            kd = KernelDemand(blocks=held, block=shape, block_time_s=1.0, issue_fraction=1.0, hbm_bytes=0.0,
                              flops=0.0, isolated_s=dur, clock_sensitive=False) if held > 0 else None
            ops.append(Op(kind="collective", kernel=kd, flow=flows[groups[i]], **common))
        elif kind in ("copy", "memset"):
            size = float(c.bytes[i]) if math.isfinite(c.bytes[i]) and c.bytes[i] > 0 else 0.0
            writes_only = kind == "memset" or c.copy_kind[i] in ("HtoD", "DtoH")
            moved = size if size > 0 else 1.0
            flow = FlowDemand(group=op_ids[i], ranks=(rank,), bytes=moved, latency_s=0.0,
                              rate_cap_bytes_per_s=moved / dur, link_coeff=0.0,
                              hbm_coeff=(1.0 if writes_only else 2.0) if size > 0 else 0.0, pattern="local",
                              uses_copy_engine=True)
            ops.append(Op(kind="transfer", flow=flow, **common))
        else:
            kd = kernel_demand(c, i, float(iso[i]), gpu, params, None if sms is None else int(sms[i]))
            ops.append(Op(kind=engine_kind(kind, c.name[i]), kernel=kd, **common))
    wl = Workload(ops=tuple(ops), streams=tuple(StreamSpec(r, s) for r, s in sorted(streams)), n_ranks=len(rank_ix))
    return wl, op_ids


def _dependencies(c: KernelColumns, syncs: pd.DataFrame | None) -> dict[int, list[int]]:
    """Cross-stream waits: inferred from timing, then replaced by recorded event waits where the
    trace has them."""
    deps: dict[int, list[int]] = {}
    end = c.end
    for r in np.unique(c.rank):
        rows = np.flatnonzero(c.rank == r)
        recent: list[tuple[float, int, int]] = []  # (end, stream, row) of the latest activities
        last_on_stream: dict[int, float] = {}
        for i in (int(x) for x in rows[np.argsort(c.start[rows], kind="stable")]):
            s = int(c.stream[i])
            idle_since = last_on_stream.get(s, -math.inf)
            best: tuple[float, int] | None = None
            for e, other, j in recent:
                if (other != s and e <= c.start[i] + 1e-12 and c.start[i] - e <= DEP_WINDOW_S
                        and e > idle_since + 1e-12 and not (math.isfinite(c.launch[i]) and c.launch[i] > e)
                        and (best is None or e > best[0])):
                    best = (e, j)
            if best is not None:
                deps[i] = [best[1]]
            recent.append((float(end[i]), s, i))
            if len(recent) > 64:
                recent = sorted(recent)[-32:]
            last_on_stream[s] = float(end[i])
    if syncs is not None and len(syncs):
        _explicit_dependencies(c, syncs, deps)
    return deps


def _explicit_dependencies(c: KernelColumns, syncs: pd.DataFrame, deps: dict[int, list[int]]) -> None:
    """A recorded event wait makes the first activity its stream launches after the wait depend on
    the activity the event was recorded after."""
    by_corr = {(int(c.rank[i]), int(c.correlation[i])): i for i in range(len(c.start))
               if math.isfinite(c.correlation[i])}
    when = np.where(np.isfinite(c.launch), c.launch, c.start)
    for rank, stream, after_s, corr in zip(syncs["rank"].tolist(), syncs["waiting_stream"].tolist(),
                                          syncs["waiting_after_s"].tolist(), syncs["recorded_correlation"].tolist(),
                                          strict=True):
        src = by_corr.get((int(rank), int(corr)))
        if src is None:
            continue
        cand = np.flatnonzero((c.rank == rank) & (c.stream == stream) & (when >= float(after_s)))
        if len(cand):
            first = int(cand[np.argmin(when[cand])])
            if c.start[first] >= c.start[src]:
                deps[first] = [src]


def _system_for(gpu_name: str, n_ranks: int) -> SystemSpec:
    return SystemSpec.model_validate({
        "schema": "ovsim.system/1", "name": f"replay-{gpu_name}-x{n_ranks}", "gpu": gpu_name,
        "gpu_count": max(n_ranks, 1), "topology": "nvswitch",
        "sources": {"topology": "replay: links are not a constraint (collectives run at their measured rates)"},
    })


def replay(bundle: TraceBundle, *, gpu: str | None = None, counters: bool = True,
           progress: Callable[[int, int], None] | None = None, calibration: Sequence[str | Path] = (),
           overrides: dict[str, Any] | None = None, power: bool = False) -> ReplayResult:
    """Replay a measured run (see the module docstring); ``gpu`` names a GPU spec when the trace's
    device name is unknown or to override it. ``calibration`` files go on top of the shipped ones,
    and ``overrides`` (parameter values, as in a calibration file) on top of those. ``power`` tracks
    power (no cap: the run's kernels keep their measured rates) for comparison with a power log."""
    df = bundle.kernels.reset_index(drop=True)
    if df.empty:
        raise OvsimError("the trace has no GPU activity to replay", field="kernels")
    _check_span(df, bundle)
    gpu_name = gpu if gpu is not None else bundle_gpu(bundle)
    spec = load_gpu(gpu_name)
    calib = load_calibration(spec, gpu_file(gpu_name).stem, tuple(str(p) for p in calibration))
    params = calib.params.merged(overrides) if overrides else calib.params
    cols = KernelColumns.of(df)
    overlapped = overlap_flags(cols)
    iso, src = isolated_durations(cols, overlapped)
    sms = sms_measured_on(cols, src, spec, params)
    # The trace's durations already hold whatever clock the run's own power loop gave each kernel:
    # no second loop on top of them.
    power_config = (PowerConfig(model=power_model(spec, params), settings=PowerSettings(managed=False))
                    if power else None)

    def run(iso: np.ndarray) -> tuple[Workload, Timeline, pd.DataFrame]:
        wl, op_ids = build_replay_workload(cols, iso, spec, params, bundle.syncs, sms)
        machine = build_machine(_system_for(gpu_name, wl.n_ranks), spec, params, n_ranks=wl.n_ranks)
        sim = Engine(wl, machine, EngineOptions(counters=counters, progress=progress, power=power_config)).run()
        timeline = on_ranks(sim, trace_ranks(cols))
        return wl, timeline, timeline.ops.set_index("id").loc[op_ids]

    wl, timeline, pred = run(iso)
    # A kernel replayed at its own overlapped measurement beside collectives that hold SMs already
    # carries the contention it ran under: replayed beside them it would pay it twice. Its isolated
    # time is its measurement less the slowdown the first replay gave it (docs/replay.md says why
    # only beside held SMs).
    own = np.flatnonzero((src == "none") & overlapped & (sms < spec.sm.count))
    ratio = pred["duration_s"].to_numpy(dtype=float)[own] / np.maximum(cols.dur[own], 1e-12)
    if np.any(np.abs(ratio - 1.0) > OWN_MEASUREMENT_TOLERANCE):
        iso = iso.copy()
        iso[own] = iso[own] / ratio
        wl, timeline, pred = run(iso)
    p_start = pred["start_s"].to_numpy(dtype=float)
    clock_offset_s = float(cols.start.min()) - float(p_start.min())
    out = pd.DataFrame({
        "name": df["name"], "kind": df["kind"], "rank": df["rank"], "stream": df["stream"],
        "measured_start_s": df["start_s"], "measured_duration_s": df["duration_s"],
        # The simulation starts at 0; put it on the trace's clock.
        "predicted_start_s": p_start + clock_offset_s,
        "predicted_duration_s": pred["duration_s"].to_numpy(dtype=float),
        "overlapped": overlapped, "isolated_s": iso, "isolated_source": src,
    })
    summary = {**summarize(out, bundle, gpu_name), **comm_summary(df, timeline.ops)}
    summary["calibration_files"] = list(calib.files) + (["(overrides)"] if overrides else [])
    return ReplayResult(kernels=out, summary=summary, timeline=timeline, workload=wl, clock_offset_s=clock_offset_s)


def _check_span(df: pd.DataFrame, bundle: TraceBundle) -> None:
    start = df["start_s"].to_numpy(dtype=float)
    end = start + df["duration_s"].to_numpy(dtype=float)
    first, last = int(np.argmin(start)), int(np.argmax(end))
    span = float(end[last] - start[first])
    if span > MAX_SPAN_S:
        ranks = [int(df["rank"].iloc[j]) for j in (first, last)]
        files = list(dict.fromkeys(bundle.sources.get(r, "") for r in ranks))
        raise OvsimError(f"activities span {span:.3g} s (rank {ranks[0]} from {start[first]:.6g} s, rank {ranks[1]} "
                         f"to {end[last]:.6g} s), more than {MAX_SPAN_S:g} s: a timestamp is corrupt or the files "
                         "are on different clocks", source=", ".join(f for f in files if f), field="start_s")


def bundle_gpu(bundle: TraceBundle) -> str:
    """The GPU spec a trace's recorded device names point at."""
    from ovsim.traces.devices import spec_for_device_name

    names = {spec_for_device_name(n) for n in bundle.gpu_names.values()}
    names.discard(None)
    if len(names) != 1:
        seen = sorted(set(bundle.gpu_names.values())) or ["none recorded"]
        raise OvsimError(f"cannot tell the GPU from the trace (device names: {', '.join(seen)}); "
                         "name a GPU spec with --gpu", field="deviceProperties")
    return str(names.pop())


def replay_files(paths: Sequence[str | Path], *, gpu: str | None = None, counters: bool = True) -> ReplayResult:
    from ovsim.traces.load import load_trace

    return replay(load_trace(paths), gpu=gpu, counters=counters)
