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

Isolated durations of compute kernels never come from their own overlapped measurement:
``self`` (the kernel did not overlap communication), ``signature`` (median of the same name, grid,
block and launching operator with its input shapes where the trace records them, that did not
overlap, same rank first), ``ambiguous`` (such instances exist but disagree
by more than ``SIGNATURE_SPREAD``: one launch shape, several problem sizes) or ``none``. Only
``signature`` kernels are scored; ``none`` kernels run at their measured duration and ``ambiguous``
ones at the median, and both are counted.

Contention inputs a trace does not carry are assumptions, stated here: memory-bound kinds
(elementwise, norm) move ``(isolated time - kernel_overhead_s) x achievable HBM bandwidth x
memory_kernel_efficiency`` bytes (the cost model's form read backwards); GEMM, attention and
other kernels move ``replay_hbm_fraction`` of what that bandwidth moves in the same time (0 unless
fitted); NCCL traffic uses ``hbm_bytes_per_bus_byte`` of the NCCL model when the message size is known and no HBM
otherwise; links are not a constraint (each collective's rate is its measured one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ovsim.engine.machine import build_machine
from ovsim.engine.power import PowerConfig
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.engine.timeline import Timeline
from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters, load_calibration
from ovsim.hw.power import PowerSettings, power_model
from ovsim.hw.spec import GpuSpec, SystemSpec, gpu_file, load_gpu
from ovsim.metrics import RankOverlap, rank_overlap
from ovsim.models import cost, nccl, nccl_params
from ovsim.models.ir import BlockShape, FlowDemand, KernelDemand, KernelKind, Op, StreamSpec, Workload
from ovsim.traces.aten import gemm_problem
from ovsim.traces.table import TraceBundle, gemm_cluster, gemm_tile

# A kernel that starts this soon after another stream's activity ends was waiting for it.
DEP_WINDOW_S = 3e-6
# Clean instances of a signature whose 90th percentile exceeds this multiple of their 10th are not
# one problem size; kernels matched to them are not scored.
SIGNATURE_SPREAD = 1.5
# Registers per thread assumed when a trace does not record them.
DEFAULT_REGISTERS = 32
# The longest run a table may span (about 11.6 days). Profiled runs last seconds to hours; a longer
# span is a corrupt timestamp or files on different clocks, and the simulation's float seconds
# would no longer resolve a kernel's microseconds that far from its start.
MAX_SPAN_S = 1e6
# A kernel replayed at its own overlapped measurement that comes out further than this from it is
# replayed again with the contention the first replay gave it taken out of its isolated time.
OWN_MEASUREMENT_TOLERANCE = 0.005
COMPUTE_KINDS = ("gemm", "attention", "elementwise", "norm", "other")
MEMORY_KINDS = ("elementwise", "norm")
_ENGINE_KIND: dict[str, KernelKind] = {"gemm": "gemm", "attention": "attention", "elementwise": "elementwise",
                                       "norm": "norm", "other": "generic"}
NCCL_OPS = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"}


def engine_kind(kind: str, name: str) -> KernelKind:
    """The engine's kind of a traced kernel: the table's, with softmax told apart from the norms
    the table files it under (its share of time following the clock, and so waiting on memory,
    is its own: ``memory_kind_clock_share``)."""
    if kind == "norm" and "softmax" in name.lower():
        return "softmax"
    return _ENGINE_KIND.get(kind, "generic")


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


@dataclass(frozen=True)
class _Cols:
    """The kernel table as plain arrays (row i of every array is row i of the table)."""

    rank: np.ndarray
    stream: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    launch: np.ndarray
    correlation: np.ndarray
    name: list[str]
    kind: list[str]
    collective: list[str]
    copy_kind: list[str]
    process_group: list[str]
    host_op: list[str]
    protocol: list[str]
    algorithm: list[str]
    seq: np.ndarray
    group_size: np.ndarray
    message_bytes: np.ndarray
    bytes: np.ndarray
    grid: np.ndarray  # (n, 3)
    block: np.ndarray  # (n, 3)
    registers: np.ndarray
    smem: np.ndarray

    @property
    def end(self) -> np.ndarray:
        end: np.ndarray = self.start + self.dur
        return end

    @staticmethod
    def of(df: pd.DataFrame) -> _Cols:
        def f(c: str) -> np.ndarray:
            return df[c].to_numpy(dtype=float, na_value=np.nan)

        def s(c: str) -> list[str]:
            return [str(x) for x in df[c].tolist()]

        return _Cols(
            rank=df["rank"].to_numpy(dtype=np.int64), stream=df["stream"].to_numpy(dtype=np.int64),
            start=f("start_s"), dur=f("duration_s"), launch=f("launch_s"), correlation=f("correlation"),
            name=s("name"), kind=s("kind"), collective=s("collective"), copy_kind=s("copy_kind"),
            process_group=s("process_group"), host_op=s("host_op"), protocol=s("protocol"),
            algorithm=s("algorithm"), seq=f("seq"), group_size=f("group_size"),
            message_bytes=f("message_bytes"), bytes=f("bytes"),
            grid=np.stack([f("grid_x"), f("grid_y"), f("grid_z")], axis=1),
            block=np.stack([f("block_x"), f("block_y"), f("block_z")], axis=1),
            registers=f("registers_per_thread"), smem=f("shared_mem_bytes"))


def _overlap_flags(c: _Cols) -> np.ndarray:
    """Per row: a compute kernel whose interval intersects a collective's on the same rank."""
    flags = np.zeros(len(c.start), dtype=bool)
    is_comm = np.array([k == "collective" for k in c.kind], dtype=bool)
    is_compute = np.array([k in COMPUTE_KINDS for k in c.kind], dtype=bool)
    for r in np.unique(c.rank):
        on = c.rank == r
        comm = np.flatnonzero(on & is_comm)
        if len(comm) == 0:
            continue
        order = comm[np.argsort(c.start[comm], kind="stable")]
        cs = c.start[order]
        ce = np.maximum.accumulate(c.end[order])
        comp = np.flatnonzero(on & is_compute)
        # The last collective starting before the kernel ends reaches furthest right of all that do.
        i = np.searchsorted(cs, c.end[comp], side="left") - 1
        flags[comp] = (i >= 0) & (ce[np.clip(i, 0, None)] > c.start[comp])
    return flags


def isolated_durations(c: _Cols, overlapped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Isolated duration and its source for every row (see the module docstring)."""
    iso = c.dur.copy()
    is_compute = np.array([k in COMPUTE_KINDS for k in c.kind], dtype=bool)
    src = np.where(is_compute, "self", "measured").astype(object)
    # The launching operator's input shapes, where recorded, tell apart problem sizes that share a
    # kernel and launch shape.
    sig = [f"{n}|{g}|{b}|{h}" for n, g, b, h in zip(c.name, c.grid.tolist(), c.block.tolist(), c.host_op,
                                                    strict=True)]
    clean: dict[tuple[str, int], list[float]] = {}
    clean_any: dict[str, list[float]] = {}
    for i in np.flatnonzero(is_compute & ~overlapped):
        clean.setdefault((sig[i], int(c.rank[i])), []).append(float(c.dur[i]))
        clean_any.setdefault(sig[i], []).append(float(c.dur[i]))
    for i in np.flatnonzero(is_compute & overlapped):
        same = clean.get((sig[i], int(c.rank[i]))) or clean_any.get(sig[i])
        if not same:
            src[i] = "none"
            continue
        iso[i] = float(np.median(same))
        lo, hi = np.percentile(same, [10, 90])
        # Clean instances that disagree widely are different problems behind one launch shape (a
        # grid does not fix the problem size); their median is no isolated duration.
        src[i] = "signature" if hi <= SIGNATURE_SPREAD * lo else "ambiguous"
    return iso, src


def held_blocks(grid: int, params: Parameters) -> int:
    """Blocks a collective kernel of ``grid`` blocks holds in replay: ``replay_collective_sm_fraction``
    of them."""
    return math.ceil(grid * params.replay_collective_sm_fraction - 1e-9)


def sms_measured_on(c: _Cols, src: np.ndarray, gpu: GpuSpec, params: Parameters) -> np.ndarray:
    """Per row, the SMs the kernel's isolated duration was measured on.

    A kernel that runs at its own overlapped measurement (``none``) ran beside the collectives of
    its rank, whose held blocks (:func:`held_blocks`, one per SM) it did not have: its time is
    priced on the SMs left, averaged over its measured interval, so that a replay beside the same
    collectives gives it back its measured time instead of slowing it a second time. That is the
    case of communication resident on a fixed share of the SMs for a whole step (expert-parallel
    dispatch and combine kernels beside grouped GEMMs), where nearly every kernel overlaps and has
    no clean instance. Every other kernel's isolated duration comes from instances that did not
    overlap, on the whole GPU."""
    sms = np.full(len(c.start), gpu.sm.count, dtype=np.int64)
    is_coll = np.array([k == "collective" for k in c.kind], dtype=bool)
    for r in np.unique(c.rank):
        rows = np.flatnonzero((src == "none") & (c.rank == r))
        colls = np.flatnonzero(is_coll & (c.rank == r))
        if len(rows) == 0 or len(colls) == 0:
            continue
        held = np.array([held_blocks(_block(c, int(j), gpu)[0], params) for j in colls], dtype=np.float64)
        if not held.any():
            continue
        # SMs held over time as a step function (+held at a collective's start, -held at its end)
        # and its running integral: a kernel's held SM-seconds are the integral's rise over its
        # interval, for all kernels at once.
        t = np.concatenate([c.start[colls], c.end[colls]])
        order = np.argsort(t, kind="stable")
        t = t[order]
        level = np.cumsum(np.concatenate([held, -held])[order])
        integral = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(t))])

        def area(x: np.ndarray, t: np.ndarray = t, level: np.ndarray = level,
                 integral: np.ndarray = integral) -> np.ndarray:
            k = np.searchsorted(t, x, side="right") - 1
            inside = k >= 0
            out = np.zeros(len(x))
            out[inside] = integral[k[inside]] + level[k[inside]] * (x[inside] - t[k[inside]])
            return out

        s, e = c.start[rows], c.end[rows]
        mean_held = (area(e) - area(s)) / np.maximum(e - s, 1e-12)
        sms[rows] = np.maximum(1, gpu.sm.count - np.minimum(np.round(mean_held), gpu.sm.count - 1)).astype(np.int64)
    return sms


def _block(c: _Cols, i: int, gpu: GpuSpec) -> tuple[int, BlockShape]:
    def val(x: float, default: int) -> int:
        return default if not math.isfinite(x) else int(x)

    sm = gpu.sm
    grid = max(1, math.prod(val(x, 1) for x in c.grid[i]))
    threads = min(max(1, math.prod(val(x, 1) for x in c.block[i])), sm.max_threads_per_block)
    regs = min(val(c.registers[i], DEFAULT_REGISTERS) or DEFAULT_REGISTERS, sm.max_registers_per_thread)
    smem = min(val(c.smem[i], 0), sm.max_shared_mem_per_block_bytes)
    # A launch this GPU cannot hold (a trace from a bigger GPU, or bad metadata): keep the grid,
    # drop what does not fit so the kernel still runs one block per SM.
    shape = BlockShape(threads=threads, registers_per_thread=regs, shared_mem_bytes=smem)
    while regs > 0 and cost.registers_per_block(shape, gpu) > sm.registers_per_sm:
        regs -= 1
        shape = BlockShape(threads=threads, registers_per_thread=regs, shared_mem_bytes=smem)
    if cost.blocks_per_sm(shape, gpu) == 0:
        shape = BlockShape(threads=threads, registers_per_thread=regs, shared_mem_bytes=0)
    return grid, shape


def data_moving_s(iso_s: float, params: Parameters) -> float:
    """The part of a kernel's isolated time that moves data: the cost model read backwards (a
    kernel takes the fixed ``kernel_overhead_s`` plus its bytes at its bandwidth), since the
    overhead (launch, prologue, tail) moves none of them."""
    return max(0.0, iso_s - params.kernel_overhead_s)


def persistent_tiles(c: _Cols, i: int, grid: int, shape: BlockShape, gpu: GpuSpec) -> int | None:
    """The output tiles of a GEMM launched as a persistent kernel, or None for any other launch.

    A persistent kernel (cuBLAS's Hopper GEMMs: one block per SM, each looping over output tiles)
    is recognized by a grid of exactly one full wave and more tiles than blocks, the tiles counted
    from the launching operator's shapes and the tile in the kernel's name. Its blocks are not its
    work: held alone, they would make every block that finds its SM taken a second wave (x2.0),
    where the resident blocks in fact share the tiles (measured on an H100 with 8 to 66 SMs held,
    calibration/data/README.md)."""
    if c.kind[i] != "gemm" or grid != gpu.sm.count * cost.blocks_per_sm(shape, gpu):
        return None
    problem, tile = gemm_problem(c.host_op[i]), gemm_tile(c.name[i])
    if problem is None or tile is None:
        return None
    m, n, _, batch = problem
    a, b = tile
    # Libraries may compute the transposed product: the orientation with fewer tiles.
    tiles = batch * min(math.ceil(m / a) * math.ceil(n / b), math.ceil(m / b) * math.ceil(n / a))
    return tiles if tiles > grid else None


def _kernel_demand(c: _Cols, i: int, iso_s: float, gpu: GpuSpec, params: Parameters,
                   sm_count: int | None = None) -> KernelDemand:
    """The kernel's demand, its isolated time ``iso_s`` measured on ``sm_count`` SMs (all of them
    unless given: :func:`sms_measured_on`)."""
    grid, shape = _block(c, i, gpu)
    sms = gpu.sm.count if sm_count is None else sm_count
    iso_s = max(iso_s, 1e-9)
    memory = c.kind[i] in MEMORY_KINDS
    bw = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction
    fraction = params.memory_kernel_efficiency if memory else params.replay_hbm_fraction.get(c.kind[i], 0.0)
    rate = bw * fraction
    if memory and params.memory_warp_bytes_per_s > 0:
        # Little's law: a kernel of few warps cannot keep enough bytes in flight to reach HBM's rate.
        rate = min(rate, cost.resident_warps(grid, shape, gpu) * params.memory_warp_bytes_per_s)
    # A persistent GEMM replays as its tiles, one block each on the kernel's footprint: alone it
    # takes the rounds of tiles it was measured in, and with SMs taken the rounds its resident
    # blocks need.
    tiles = persistent_tiles(c, i, grid, shape, gpu)
    d = cost.demand_from_time(blocks=tiles or grid, block=shape, isolated_s=iso_s, flops=0.0,
                              hbm_bytes=data_moving_s(iso_s, params) * rate, gpu=gpu, sm_count=sms,
                              issue_intensity=params.memory_issue_floor if memory else 1.0, clock_sensitive=not memory,
                              cap=None if memory else cost.issue_cap(shape, gpu, params,
                                                                     1.0 / cost.blocks_per_sm(shape, gpu)),
                              load_share=params.gemm_load_share if c.kind[i] == "gemm" else 0.0)
    d = replace(d, persistent_ctas=grid if tiles else 0,
                cluster_ctas=gemm_cluster(c.name[i]) if c.kind[i] == "gemm" else 1)
    if not memory:
        # GEMMs keep the bytes replay_hbm_fraction was fitted with (on the H100's harness data).
        return d
    d = cost.bandwidth_bound(d, gpu, params, sm_count=sms)
    return _within_rate(d, rate, gpu, sms) if math.isinf(d.hbm_cap_bytes_per_s) else d


def _within_rate(d: KernelDemand, rate_bytes_per_s: float, gpu: GpuSpec, sm_count: int) -> KernelDemand:
    """``d`` with its bytes lowered, where needed, so that no wave asks more than the rate they
    were read backwards at. A kernel whose time follows its blocks (no HBM headroom in the
    calibration) moves its bytes block by block: with a partial last wave, its full waves carry
    more than their share of the time's bytes (1.35x for 1.48 waves), more than HBM gives, and the
    kernel ran 15% over its own measured time alone (the Adam step of a real A100 trace)."""
    if d.hbm_bytes <= 0 or rate_bytes_per_s <= 0:
        return d
    resident = min(d.blocks, sm_count * cost.blocks_per_sm(d.block, gpu))
    peak = d.hbm_bytes / d.blocks * resident / d.block_time_s
    return replace(d, hbm_bytes=d.hbm_bytes * rate_bytes_per_s / peak) if peak > rate_bytes_per_s else d


def _collective_groups(c: _Cols) -> dict[int, str]:
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


def _flows(c: _Cols, groups: dict[int, str], rank_ix: dict[int, int], params: Parameters) -> dict[str, FlowDemand]:
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


def trace_ranks(c: _Cols) -> list[int]:
    """The trace's rank numbers in the engine's order: the engine numbers its ranks 0..n-1."""
    return sorted(int(r) for r in set(c.rank.tolist()))


def _on_trace_ranks(tl: Timeline, ranks: list[int]) -> Timeline:
    """The timeline with the trace's rank numbers in place of the engine's (flows keep -1)."""
    lookup = np.asarray(ranks, dtype=np.int64)

    def renumbered(df: pd.DataFrame) -> pd.DataFrame:
        if df.empty:
            return df
        r = df["rank"].to_numpy(dtype=np.int64)
        return df.assign(rank=np.where(r >= 0, lookup[np.clip(r, 0, None)], r))

    return Timeline(ops=renumbered(tl.ops), counters=renumbered(tl.counters))


def build_replay_workload(c: _Cols, iso: np.ndarray, gpu: GpuSpec, params: Parameters,
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
            grid, shape = _block(c, i, gpu)
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
            kd = _kernel_demand(c, i, float(iso[i]), gpu, params, None if sms is None else int(sms[i]))
            ops.append(Op(kind=engine_kind(kind, c.name[i]), kernel=kd, **common))
    wl = Workload(ops=tuple(ops), streams=tuple(StreamSpec(r, s) for r, s in sorted(streams)), n_ranks=len(rank_ix))
    return wl, op_ids


def _dependencies(c: _Cols, syncs: pd.DataFrame | None) -> dict[int, list[int]]:
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


def _explicit_dependencies(c: _Cols, syncs: pd.DataFrame, deps: dict[int, list[int]]) -> None:
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
    cols = _Cols.of(df)
    overlapped = _overlap_flags(cols)
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
        timeline = _on_trace_ranks(sim, trace_ranks(cols))
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


def _mape(pred: np.ndarray, meas: np.ndarray) -> float:
    ok = meas > 0
    return float(np.mean(np.abs(pred[ok] - meas[ok]) / meas[ok]) * 100) if ok.any() else math.nan


def _weighted_error(pred: np.ndarray, meas: np.ndarray) -> float:
    """100 x sum |pred - meas| / sum meas over the kernels _mape scores: long kernels weigh more."""
    ok = meas > 0
    total = float(meas[ok].sum())
    return float(np.abs(pred[ok] - meas[ok]).sum() / total * 100) if total > 0 else math.nan


def _comm_figures(ranks: list[RankOverlap], which: str) -> dict[str, float]:
    """Exposed communication summed over ranks, and HTA's hidden share over all ranks (overlapped
    time over communication time, both summed over ranks); NaN with no communication."""
    comm_s = sum(r.comm_busy_s for r in ranks)
    hidden_s = sum(r.overlapped_s for r in ranks)
    return {f"exposed_comm_{which}_s": comm_s - hidden_s,
            f"hidden_pct_{which}": hidden_s / comm_s * 100 if comm_s > 0 else math.nan}


def comm_summary(measured: pd.DataFrame, predicted: pd.DataFrame) -> dict[str, float]:
    """Communication not under compute, measured (the trace's kernel table) and predicted (the
    replay's timeline ops), by :func:`ovsim.metrics.rank_overlap` on each."""
    return {**_comm_figures(rank_overlap(measured), "measured"), **_comm_figures(rank_overlap(predicted), "predicted")}


def summarize(out: pd.DataFrame, bundle: TraceBundle, gpu_name: str) -> dict[str, Any]:
    sel = out["overlapped"] & out["isolated_source"].isin(["signature"])
    meas = out.loc[sel, "measured_duration_s"].to_numpy(float)
    pred = out.loc[sel, "predicted_duration_s"].to_numpy(float)
    naive = out.loc[sel, "isolated_s"].to_numpy(float)
    m_span = float((out["measured_start_s"] + out["measured_duration_s"]).max() - out["measured_start_s"].min())
    p_span = float((out["predicted_start_s"] + out["predicted_duration_s"]).max() - out["predicted_start_s"].min())
    return {
        "gpu": gpu_name,
        "ranks": int(out["rank"].nunique()),
        "kernels": len(out),
        "compute_kernels": int(out["kind"].isin(COMPUTE_KINDS).sum()),
        "collective_kernels": int((out["kind"] == "collective").sum()),
        "overlapped_compute_kernels": int(out["overlapped"].sum()),
        "scored_kernels": int(sel.sum()),
        "unscored_no_isolated_source": int((out["overlapped"] & (out["isolated_source"] == "none")).sum()),
        "unscored_ambiguous_signature": int((out["overlapped"] & (out["isolated_source"] == "ambiguous")).sum()),
        "mape_pct": _mape(pred, meas),
        "naive_mape_pct": _mape(naive, meas),
        "weighted_error_pct": _weighted_error(pred, meas),
        "naive_weighted_error_pct": _weighted_error(naive, meas),
        "measured_span_s": m_span,
        "predicted_span_s": p_span,
        "span_error_pct": (p_span - m_span) / m_span * 100 if m_span > 0 else math.nan,
        "skipped": dict(bundle.skipped),
        "sources": {str(k): v for k, v in bundle.sources.items()},
    }


def replay_files(paths: Sequence[str | Path], *, gpu: str | None = None, counters: bool = True) -> ReplayResult:
    from ovsim.traces.load import load_trace

    return replay(load_trace(paths), gpu=gpu, counters=counters)
