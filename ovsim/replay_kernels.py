"""A measured run's kernels for replay: the kernel table as arrays, which compute kernels overlapped
communication, their isolated durations, and the demand each puts on the engine
(:mod:`ovsim.replay` rebuilds the run from them).

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
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec
from ovsim.models import cost, occupancy
from ovsim.models.ir import BlockShape, KernelDemand, KernelKind
from ovsim.traces.aten import gemm_problem
from ovsim.traces.table import gemm_cluster, gemm_tile

# Clean instances of a signature whose 90th percentile exceeds this multiple of their 10th are not
# one problem size; kernels matched to them are not scored.
SIGNATURE_SPREAD = 1.5
# Registers per thread assumed when a trace does not record them.
DEFAULT_REGISTERS = 32
COMPUTE_KINDS = ("gemm", "attention", "elementwise", "norm", "other")
MEMORY_KINDS = ("elementwise", "norm")
_ENGINE_KIND: dict[str, KernelKind] = {"gemm": "gemm", "attention": "attention", "elementwise": "elementwise",
                                       "norm": "norm", "other": "generic"}


def engine_kind(kind: str, name: str) -> KernelKind:
    """The engine's kind of a traced kernel: the table's, with softmax told apart from the norms
    the table files it under (its share of time following the clock, and so waiting on memory,
    is its own: ``memory_kind_clock_share``)."""
    if kind == "norm" and "softmax" in name.lower():
        return "softmax"
    return _ENGINE_KIND.get(kind, "generic")


@dataclass(frozen=True)
class KernelColumns:
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
    def of(df: pd.DataFrame) -> KernelColumns:
        def f(c: str) -> np.ndarray:
            return df[c].to_numpy(dtype=float, na_value=np.nan)

        def s(c: str) -> list[str]:
            return [str(x) for x in df[c].tolist()]

        return KernelColumns(
            rank=df["rank"].to_numpy(dtype=np.int64), stream=df["stream"].to_numpy(dtype=np.int64),
            start=f("start_s"), dur=f("duration_s"), launch=f("launch_s"), correlation=f("correlation"),
            name=s("name"), kind=s("kind"), collective=s("collective"), copy_kind=s("copy_kind"),
            process_group=s("process_group"), host_op=s("host_op"), protocol=s("protocol"),
            algorithm=s("algorithm"), seq=f("seq"), group_size=f("group_size"),
            message_bytes=f("message_bytes"), bytes=f("bytes"),
            grid=np.stack([f("grid_x"), f("grid_y"), f("grid_z")], axis=1),
            block=np.stack([f("block_x"), f("block_y"), f("block_z")], axis=1),
            registers=f("registers_per_thread"), smem=f("shared_mem_bytes"))


def overlap_flags(c: KernelColumns) -> np.ndarray:
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


def signatures(c: KernelColumns) -> list[str]:
    """Per row, what makes instances of a kernel one problem: name, grid, block and launching
    operator (with its input shapes where the trace records them, which tell apart problem sizes
    that share a kernel and launch shape)."""
    return [f"{n}|{g}|{b}|{h}" for n, g, b, h in zip(c.name, c.grid.tolist(), c.block.tolist(), c.host_op,
                                                     strict=True)]


def isolated_durations(c: KernelColumns, overlapped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Isolated duration and its source for every row (see the module docstring)."""
    iso = c.dur.copy()
    is_compute = np.array([k in COMPUTE_KINDS for k in c.kind], dtype=bool)
    src = np.where(is_compute, "self", "measured").astype(object)
    sig = signatures(c)
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


def sms_measured_on(c: KernelColumns, src: np.ndarray, gpu: GpuSpec, params: Parameters) -> np.ndarray:
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
        held = np.array([held_blocks(kernel_launch(c, int(j), gpu)[0], params) for j in colls], dtype=np.float64)
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


def kernel_launch(c: KernelColumns, i: int, gpu: GpuSpec) -> tuple[int, BlockShape]:
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
    while regs > 0 and occupancy.registers_per_block(shape, gpu) > sm.registers_per_sm:
        regs -= 1
        shape = BlockShape(threads=threads, registers_per_thread=regs, shared_mem_bytes=smem)
    if occupancy.blocks_per_sm(shape, gpu) == 0:
        shape = BlockShape(threads=threads, registers_per_thread=regs, shared_mem_bytes=0)
    return grid, shape


def data_moving_s(iso_s: float, params: Parameters) -> float:
    """The part of a kernel's isolated time that moves data: the cost model read backwards (a
    kernel takes the fixed ``kernel_overhead_s`` plus its bytes at its bandwidth), since the
    overhead (launch, prologue, tail) moves none of them."""
    return max(0.0, iso_s - params.kernel_overhead_s)


def persistent_tiles(c: KernelColumns, i: int, grid: int, shape: BlockShape, gpu: GpuSpec) -> int | None:
    """The output tiles of a GEMM launched as a persistent kernel, or None for any other launch.

    A persistent kernel (cuBLAS's Hopper GEMMs: one block per SM, each looping over output tiles)
    is recognized by a grid of exactly one full wave and more tiles than blocks, the tiles counted
    from the launching operator's shapes and the tile in the kernel's name. Its blocks are not its
    work: held alone, they would make every block that finds its SM taken a second wave (x2.0),
    where the resident blocks in fact share the tiles (measured on an H100 with 8 to 66 SMs held,
    calibration/data/README.md)."""
    if c.kind[i] != "gemm" or grid != gpu.sm.count * occupancy.blocks_per_sm(shape, gpu):
        return None
    problem, tile = gemm_problem(c.host_op[i]), gemm_tile(c.name[i])
    if problem is None or tile is None:
        return None
    m, n, _, batch = problem
    a, b = tile
    # Libraries may compute the transposed product: the orientation with fewer tiles.
    tiles = batch * min(math.ceil(m / a) * math.ceil(n / b), math.ceil(m / b) * math.ceil(n / a))
    return tiles if tiles > grid else None


def kernel_demand(c: KernelColumns, i: int, iso_s: float, gpu: GpuSpec, params: Parameters,
                   sm_count: int | None = None) -> KernelDemand:
    """The kernel's demand, its isolated time ``iso_s`` measured on ``sm_count`` SMs (all of them
    unless given: :func:`sms_measured_on`)."""
    grid, shape = kernel_launch(c, i, gpu)
    sms = gpu.sm.count if sm_count is None else sm_count
    iso_s = max(iso_s, 1e-9)
    memory = c.kind[i] in MEMORY_KINDS
    bw = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction
    fraction = params.memory_kernel_efficiency if memory else params.replay_hbm_fraction.get(c.kind[i], 0.0)
    rate = bw * fraction
    if memory and params.memory_warp_bytes_per_s > 0:
        # Little's law: a kernel of few warps cannot keep enough bytes in flight to reach HBM's rate.
        rate = min(rate, occupancy.resident_warps(grid, shape, gpu) * params.memory_warp_bytes_per_s)
    # A persistent GEMM replays as its tiles, one block each on the kernel's footprint: alone it
    # takes the rounds of tiles it was measured in, and with SMs taken the rounds its resident
    # blocks need.
    tiles = persistent_tiles(c, i, grid, shape, gpu)
    d = cost.demand_from_time(blocks=tiles or grid, block=shape, isolated_s=iso_s, flops=0.0,
                              hbm_bytes=data_moving_s(iso_s, params) * rate, gpu=gpu, sm_count=sms,
                              issue_intensity=params.memory_issue_floor if memory else 1.0, clock_sensitive=not memory,
                              cap=None if memory else occupancy.issue_cap(shape, gpu, params,
                                                                     1.0 / occupancy.blocks_per_sm(shape, gpu)),
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
    resident = min(d.blocks, sm_count * occupancy.blocks_per_sm(d.block, gpu))
    peak = d.hbm_bytes / d.blocks * resident / d.block_time_s
    return replace(d, hbm_bytes=d.hbm_bytes * rate_bytes_per_s / peak) if peak > rate_bytes_per_s else d
