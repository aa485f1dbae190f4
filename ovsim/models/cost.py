"""Isolated cost of ops on one GPU: GEMM, attention, memory-bound and generic kernels, copies (their
blocks' occupancy: :mod:`ovsim.models.occupancy`). Pure functions of (op parameters, GPU spec,
calibration).

Both fidelities use these: ``analytic`` mode takes ``isolated_s`` as is, and the engine turns the
same :class:`KernelDemand` into blocks whose waves reproduce ``isolated_s`` exactly when a kernel
runs alone. Formulas: the CUDA occupancy calculator (occupancy) and NVIDIA's Matrix Multiplication
Background User's Guide (tiles and waves); docs/design.md, "Kernels and SMs".
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec
from ovsim.models.ir import BlockShape, KernelDemand
from ovsim.models.occupancy import alone_block_times, blocks_per_sm, issue_cap, kept_load_share
from ovsim.units import BYTES_PER_ELEMENT


def _positive(value: float, field: str) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise OvsimError(f"must be a positive number, got {value}", field=field)


def element_bytes(precision: str) -> int:
    try:
        return BYTES_PER_ELEMENT[precision]
    except KeyError:
        raise OvsimError(f"unknown precision '{precision}'", field="precision") from None


def demand_from_time(
    *,
    blocks: int,
    block: BlockShape,
    isolated_s: float,
    flops: float,
    hbm_bytes: float,
    gpu: GpuSpec,
    issue_intensity: float,
    clock_sensitive: bool,
    sm_count: int | None = None,
    issue_fraction: float | None = None,
    cap: float | None = None,
    load_share: float = 0.0,
) -> KernelDemand:
    """Spread an isolated duration over the kernel's waves.

    ``issue_intensity`` is the share of an SM's issue throughput the kernel uses when its blocks fill
    the SM; 1 for compute-bound kernels. ``cap`` is the most of an SM one block uses with fewer of
    them on it (:func:`issue_cap`). The engine reproduces ``isolated_s`` exactly for a kernel running
    alone: every full wave takes ``block_time_s`` and a last wave of fewer blocks per SM what
    :func:`alone_block_times` counts for it. ``load_share``: :attr:`KernelDemand.load_share`, as much
    of it as :func:`kept_load_share` keeps.
    """
    if blocks < 1:
        raise OvsimError(f"grid must have at least one block, got {blocks}", field="grid")
    _positive(isolated_s, "duration_s")
    occ = blocks_per_sm(block, gpu)
    sms = sm_count if sm_count is not None else gpu.sm.count
    ask = issue_fraction if issue_fraction is not None else min(1.0, max(issue_intensity, 1e-3)) / occ
    most = max(ask, cap) if cap is not None else ask
    load_share = kept_load_share(load_share, occ)
    return KernelDemand(
        blocks=blocks,
        block=block,
        block_time_s=isolated_s / alone_block_times(blocks, occ, sms, ask, most, load_share, gpu.sm.count),
        issue_fraction=ask,
        hbm_bytes=hbm_bytes,
        flops=flops,
        isolated_s=isolated_s,
        clock_sensitive=clock_sensitive,
        issue_cap=most if most > ask else None,
        load_share=load_share,
    )


def bandwidth_bound(d: KernelDemand, gpu: GpuSpec, params: Parameters, sm_count: int | None = None) -> KernelDemand:
    """A memory-bound kernel priced so that it keeps its bandwidth on fewer SMs.

    Its isolated time is its HBM bandwidth's, not its blocks' pace: each resident block could pull
    ``memory_sm_headroom`` times its share of that bandwidth, and the kernel never takes more than
    it reached alone (``hbm_cap_bytes_per_s``). Alone it then takes ``d.isolated_s`` exactly: its
    waves move their bytes at the cap, and a last wave too small to reach the cap takes one
    block's time; a kernel whose isolated time asks more than HBM's achievable bandwidth is capped
    at that bandwidth and takes the time it gives. With a headroom of 1 the kernel is ``d``
    unchanged (its time follows its SMs)."""
    headroom = params.memory_sm_headroom
    if headroom <= 1.0 or d.hbm_bytes <= 0:
        return d
    slots = (sm_count if sm_count is not None else gpu.sm.count) * blocks_per_sm(d.block, gpu)
    waves = math.ceil(d.blocks / slots)
    last = d.blocks - (waves - 1) * slots
    per_block = d.hbm_bytes / d.blocks
    # Alone: (blocks - last) * per_block at the cap, then the last wave at the cap or, with fewer
    # blocks than slots / headroom, at their own pace, which moves slots / headroom blocks' bytes.
    cap = per_block * ((d.blocks - last) + max(last, slots / headroom)) / d.isolated_s
    hbm = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction
    if cap <= hbm:
        return replace(d, block_time_s=per_block * slots / (headroom * cap), hbm_cap_bytes_per_s=cap)
    # A last wave too small to use the headroom would need more than HBM gives in the others: they
    # run at HBM's rate, and the last wave takes what is left of the isolated time at its pace,
    # provided the full waves still outpace HBM at that pace (else the blocks' pace sets it all).
    t_block = d.isolated_s - per_block * (d.blocks - last) / hbm
    if last * per_block / hbm <= t_block <= slots * per_block / hbm:
        return replace(d, block_time_s=t_block, hbm_cap_bytes_per_s=hbm)
    # Faster alone than HBM's achievable rate allows (a measured time a little under bytes / rate):
    # the channel carries it at that rate, and its blocks keep their headroom. Falling back to
    # time-follows-SMs here made a kernel 0.1% faster alone run 1.5x slower beside 32 held SMs.
    return replace(d, block_time_s=per_block * slots / (headroom * hbm), hbm_cap_bytes_per_s=hbm)


def alone_time_s(d: KernelDemand, slots: int) -> float:
    """How long ``d`` takes alone with ``slots`` blocks resident at once: each wave at its blocks'
    pace, or, for a kernel with an HBM cap, no faster than the cap moves the wave's bytes."""
    waves = math.ceil(d.blocks / slots)
    last = d.blocks - (waves - 1) * slots
    per_block = d.hbm_bytes / d.blocks
    cap = d.hbm_cap_bytes_per_s
    return ((waves - 1) * max(d.block_time_s, slots * per_block / cap)
            + max(d.block_time_s, last * per_block / cap))


# The widest (128-bit) loads of A and B need leading dimensions on this many bytes; libraries run
# other GEMMs on narrower-load kernels (CUTLASS's alignN names say which).
GEMM_ALIGN_BYTES = 16


def gemm_aligned(n: int, k: int, precision: str) -> bool:
    """Whether a GEMM's leading dimensions fit the widest loads: k (A is m x k, a linear layer's
    weight n x k) and n (B k x n, and C) on multiples of ``GEMM_ALIGN_BYTES``; m is never one. On
    the shared H100 traces this tells the align1/align2 kernels from the others for all 1,869
    GEMMs with recorded shapes."""
    eb = element_bytes(precision)
    return (n * eb) % GEMM_ALIGN_BYTES == 0 and (k * eb) % GEMM_ALIGN_BYTES == 0


# Bytes of a split-K partial sum: GEMMs accumulate in FP32 whatever their operands.
_ACCUMULATOR_BYTES = 4


def gemm_blocks(m: int, n: int, tile_m: int, tile_n: int, batch: int = 1, split_k: int = 1) -> int:
    return math.ceil(m / tile_m) * math.ceil(n / tile_n) * batch * split_k


def gemm(
    m: int,
    n: int,
    k: int,
    precision: str,
    gpu: GpuSpec,
    params: Parameters,
    *,
    tile: tuple[int, int, int] = (128, 128, 32),
    threads: int = 256,
    registers_per_thread: int = 128,
    stages: int = 3,
    extra_shared_mem_bytes: int = 0,
    batch: int = 1,
    split_k: int = 1,
    sm_count: int | None = None,
    persistent: bool = False,
    cluster_ctas: int = 1,
    efficiency: float | None = None,
    l2_bytes_per_s: float | None = None,
    l2_sm_bytes_per_s: float | None = None,
) -> KernelDemand:
    """A tiled tensor-core GEMM: output tiles are blocks, each block computes one tile.

    Time is the roofline per tile (tensor rate per SM times the calibrated efficiency, plus the
    calibrated fixed time of a wave of tiles, or the tile's share of HBM) times the number of waves,
    so tile and wave quantization emerge from the grid. A GEMM whose leading dimensions are not on
    16 bytes (:func:`gemm_aligned`) runs at ``gemm_unaligned_efficiency`` where the calibration
    has one.
    ``sm_count`` plans the grid for fewer SMs (cuBLASLt's SM_COUNT_TARGET); the block count is
    unchanged, only the waves are. ``extra_shared_mem_bytes`` shapes occupancy: the padded blocks
    do the same work at the same per-block speed, but fewer fit on an SM, so the SM is less busy and
    the kernel takes more waves. ``persistent``: launched as one wave of blocks that loop over the
    tiles (cuBLAS's Hopper kernels), the same time alone; the engine runs it differently beside
    kernels that hold SMs (:attr:`KernelDemand.persistent_ctas`). ``cluster_ctas``: CTAs per
    thread-block cluster, which beside held SMs find fewer SMs (:attr:`KernelDemand.cluster_ctas`).
    ``efficiency``: the main loop's share of the tensor peak, in place of the library's
    (``gemm_efficiency``): a kernel of one's own. ``l2_bytes_per_s``: the L2 bandwidth its blocks
    read their operand tiles at (each block K x (BM + BN) elements), a second roofline on the main
    loop (a kernel of one's own: ``own_gemm_l2_bytes_per_s``); ``l2_sm_bytes_per_s``: each SM's own
    path for them, in series with it (``own_gemm_l2_sm_bytes_per_s``).
    """
    t = gemm_time(m, n, k, precision, gpu, params, tile=tile, threads=threads,
                  registers_per_thread=registers_per_thread, stages=stages,
                  extra_shared_mem_bytes=extra_shared_mem_bytes, batch=batch, split_k=split_k, sm_count=sm_count,
                  efficiency=efficiency, l2_bytes_per_s=l2_bytes_per_s, l2_sm_bytes_per_s=l2_sm_bytes_per_s)
    return gemm_demand(t, gpu, params, persistent=persistent, cluster_ctas=cluster_ctas)


class GemmTime(NamedTuple):
    """What :func:`gemm` works out before its demand: enough to choose among kernels by their
    time alone (:mod:`ovsim.models.gemm_library`) and to make the chosen one's demand
    (:func:`gemm_demand`)."""

    isolated_s: float
    blocks: int
    block: BlockShape
    occ: int  # blocks per SM, with any padding
    sms: int
    ask: float  # a block's share of its SM at natural occupancy
    most: float  # issue_cap's
    flops: float
    hbm_bytes: float
    memory_wait: float | None
    saturation: float | None


def gemm_time(
    m: int,
    n: int,
    k: int,
    precision: str,
    gpu: GpuSpec,
    params: Parameters,
    *,
    tile: tuple[int, int, int] = (128, 128, 32),
    threads: int = 256,
    registers_per_thread: int = 128,
    stages: int = 3,
    extra_shared_mem_bytes: int = 0,
    batch: int = 1,
    split_k: int = 1,
    sm_count: int | None = None,
    efficiency: float | None = None,
    l2_bytes_per_s: float | None = None,
    l2_sm_bytes_per_s: float | None = None,
) -> GemmTime:
    """:func:`gemm`'s time alone and what its demand is made from (its arguments: :func:`gemm`)."""
    for name, v in (("m", m), ("n", n), ("k", k), ("batch", batch), ("split_k", split_k)):
        if not isinstance(v, int) or v < 1:
            raise OvsimError(f"must be a positive integer, got {v}", field=name)
    if split_k > k:
        # Each split would still be charged a whole K element: more work than the GEMM has.
        raise OvsimError(f"split_k {split_k} is more than k {k}: some splits would have no K to reduce",
                         field="split_k")
    tm, tn, tk = tile
    if min(tm, tn, tk) < 1:
        raise OvsimError(f"tile dimensions must be positive, got {tile}", field="tile")
    if extra_shared_mem_bytes < 0:
        raise OvsimError(f"must not be negative, got {extra_shared_mem_bytes}", field="extra_shared_mem_bytes")
    eb = element_bytes(precision)
    smem = stages * (tm * tk + tn * tk) * eb
    natural = BlockShape(threads=threads, registers_per_thread=registers_per_thread, shared_mem_bytes=smem)
    block = BlockShape(threads=threads, registers_per_thread=registers_per_thread,
                       shared_mem_bytes=smem + extra_shared_mem_bytes)
    occ_natural = blocks_per_sm(natural, gpu)
    occ = blocks_per_sm(block, gpu)
    if occ_natural == 0:
        raise OvsimError(f"a {tm}x{tn}x{tk} tile with {stages} stages does not fit on one {gpu.name} SM",
                         field="tile")
    if occ == 0:
        raise OvsimError(f"{extra_shared_mem_bytes} B of extra shared memory leaves no room for one block",
                         field="extra_shared_mem_bytes")
    sms = sm_count if sm_count is not None else gpu.sm.count
    per_sm_rate, tile_s = gemm_rate(n, k, precision, gpu, params, efficiency)
    blocks, k_per_block, t_issue, waves, compute_s = gemm_main_loop(m, n, k, tile, occ_natural, batch, split_k, sms,
                                                                    per_sm_rate, tile_s)
    saturation: float | None = None
    if l2_bytes_per_s is not None:
        # The operand tiles every block reads from L2: a small tile reads each byte for few FLOPs.
        # L2 does not follow the SM clock, so the kernel speeds up with the clock only until the
        # tensor issue's time falls to the L2 reads' (it is calibrated at the reference clock).
        l2_s = blocks * k_per_block * (tm + tn) * eb * (
            1.0 / l2_bytes_per_s + (1.0 / (sms * l2_sm_bytes_per_s) if l2_sm_bytes_per_s is not None else 0.0))
        saturation = params.power_tensor_reference_clock_fraction * waves * t_issue / l2_s
        compute_s = max(waves * t_issue, l2_s) + waves * tile_s
    ask = 1.0 / occ_natural
    most = issue_cap(block, gpu, params, ask)
    memory_wait: float | None = None
    added_s = 0.0
    if occ < occ_natural:
        # Shaped: the same blocks at the same pace, fewer to an SM; a block with room runs up to
        # `most` of its SM, so the SM loses less than in proportion.
        def count(per_sm: int) -> float:
            load = kept_load_share(params.gemm_load_share, per_sm)
            return alone_block_times(blocks, per_sm, sms, ask, most, load, gpu.sm.count)

        stretch = count(occ) / count(occ_natural)
        added_s = compute_s * (stretch - 1.0)
        compute_s *= stretch
    flops = 2.0 * m * n * k * batch
    isolated, hbm_bytes, compute_bound = gemm_isolated_s(m, n, k, tile, batch, split_k, eb, compute_s, gpu, params)
    if added_s > 0 and compute_bound:
        # What fewer warps an SM no longer hide is latency, most of it memory's: the time the
        # shaping added waits on memory, and stretches with HBM's loaded latency (the latency law).
        memory_wait = added_s / isolated
    return GemmTime(isolated, blocks, block, occ, sms, ask, most, flops, hbm_bytes, memory_wait, saturation)


def gemm_rate(n: int, k: int, precision: str, gpu: GpuSpec, params: Parameters,
              efficiency: float | None) -> tuple[float, float]:
    """A GEMM main loop's tensor rate per SM (FLOP/s) and the fixed time of a wave of its tiles
    (:func:`gemm`'s arguments)."""
    eff = efficiency if efficiency is not None else params.gemm_eff(precision, gemm_aligned(n, k, precision))
    if not 0.0 < eff <= 1.0:
        raise OvsimError(f"must be in (0, 1], got {eff}", field="efficiency")
    return gpu.peak_flops_per_s(precision) / gpu.sm.count * eff, params.gemm_tile_s(precision)


def gemm_main_loop(m: int, n: int, k: int, tile: tuple[int, int, int], occ_natural: int, batch: int, split_k: int,
                   sms: int, per_sm_rate: float, tile_s: float) -> tuple[int, int, float, int, float]:
    """A GEMM's blocks, K elements per block, a tile's issue time at natural occupancy
    ``occ_natural`` (blocks per SM), waves on ``sms`` SMs and main-loop time, at
    :func:`gemm_rate`'s rate and time per wave. Co-resident tiles share the SM's tensor
    throughput: at its natural occupancy a block takes ``occ_natural`` tile-times and uses
    1/occ_natural of the SM. The fill and epilogue of a wave's tiles add a fixed time (calibrated;
    co-resident tiles overlap theirs)."""
    tm, tn, _ = tile
    blocks = gemm_blocks(m, n, tm, tn, batch, split_k)
    k_per_block = math.ceil(k / split_k)
    t_issue = occ_natural * (2.0 * tm * tn * k_per_block) / per_sm_rate
    waves = math.ceil(blocks / (sms * occ_natural))
    return blocks, k_per_block, t_issue, waves, waves * (t_issue + tile_s)


# Row tiles up to which a GEMM reads its weight (B) from HBM once, its tiles that share a column
# panel running side by side and sharing its reads in L2. 0, the rule that ships: twice from two row
# tiles on. bench/gemm_weight_reads.py scores other values on the measured shapes
# (docs/calibration.md, "How often a GEMM reads its weight"). Whoever changes it calls
# gemm_library.clear_choices(): the library keeps the kernels it chose under the value before.
WEIGHT_ONCE_ROW_TILES = 0


def gemm_isolated_s(m: int, n: int, k: int, tile: tuple[int, int, int], batch: int, split_k: int,
                    element_size: int, compute_s: float, gpu: GpuSpec, params: Parameters) -> tuple[float, float, bool]:
    """A GEMM's time alone from its main loop's ``compute_s``, the HBM bytes it moves, and whether
    its main loop outlasts its traffic."""
    # Each row panel of A is read by every column tile and each column panel of B by every row
    # tile; past the first two readers the re-reads hit L2 (an assumption for GEMMs of several
    # tiles each way, where it only matters when HBM is contended). A skinny GEMM, m within one
    # tile, reads its weight once: a BF16 1x32768x8192 product moves 537 MB in 175 us on an H100,
    # 92% of the peak (calibration/data/h100-sxm5-80gb/2026-11-26-f), which reading it twice
    # would price at twice that. C is written once.
    tm, tn, _ = tile
    row_tiles = math.ceil(m / tm)
    reads_a, reads_b = min(math.ceil(n / tn), 2), 1 if row_tiles <= WEIGHT_ONCE_ROW_TILES else min(row_tiles, 2)
    hbm_bytes = float(batch * element_size * (reads_a * m * k + reads_b * k * n + m * n))
    bw = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction
    isolated = max(compute_s, hbm_bytes / bw) + params.kernel_overhead_s
    compute_bound = compute_s > hbm_bytes / bw
    if split_k > 1:
        # Parallel split-K (CUTLASS's GemmSplitKParallel, cuBLAS's split-K kernels): each split
        # writes its partial tile in FP32 to a workspace and a reduction kernel sums them into C,
        # one more launch reading the partials back.
        partial_bytes = float(2 * split_k * batch * m * n * _ACCUMULATOR_BYTES)
        hbm_bytes += partial_bytes
        isolated += partial_bytes / bw + params.kernel_overhead_s
    return isolated, hbm_bytes, compute_bound


def gemm_isolated_times(m: int, n: int, k: int, tiles: np.ndarray, occ_natural: np.ndarray, batch: int,
                        splits: np.ndarray, sms: int, per_sm_rate: float, tile_s: float, element_size: int,
                        gpu: GpuSpec, params: Parameters) -> np.ndarray:
    """:func:`gemm_isolated_s` of :func:`gemm_main_loop`'s time for each of several kernels at once:
    ``tiles`` (one (m, n) row each), ``occ_natural`` and ``splits`` per kernel, the same operations
    in the same order on arrays, so the same numbers (a library's choice prices some 70 kernels
    and splits a GEMM)."""
    tm, tn = tiles[:, 0], tiles[:, 1]
    row_tiles, col_tiles = np.ceil(m / tm).astype(np.int64), np.ceil(n / tn).astype(np.int64)
    blocks = row_tiles * col_tiles * batch * splits
    k_per_block = np.ceil(k / splits).astype(np.int64)
    t_issue = occ_natural * (2.0 * tm * tn * k_per_block) / per_sm_rate
    waves = np.ceil(blocks / (sms * occ_natural)).astype(np.int64)
    compute_s = waves * (t_issue + tile_s)
    reads_a = np.minimum(col_tiles, 2)
    reads_b = np.where(row_tiles <= WEIGHT_ONCE_ROW_TILES, 1, np.minimum(row_tiles, 2))
    hbm_bytes = (batch * element_size * (reads_a * m * k + reads_b * k * n + m * n)).astype(float)
    bw = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction
    isolated = np.maximum(compute_s, hbm_bytes / bw) + params.kernel_overhead_s
    partial_bytes = (2 * splits * batch * m * n * _ACCUMULATOR_BYTES).astype(float)
    out: np.ndarray = np.where(splits > 1, isolated + (partial_bytes / bw + params.kernel_overhead_s), isolated)
    return out


def gemm_demand(t: GemmTime, gpu: GpuSpec, params: Parameters, *, persistent: bool = False,
                cluster_ctas: int = 1) -> KernelDemand:
    """The demand of a GEMM of time ``t`` (:func:`gemm_time`), launched ``persistent`` or not, in
    clusters of ``cluster_ctas``."""
    d = demand_from_time(blocks=t.blocks, block=t.block, isolated_s=t.isolated_s, flops=t.flops,
                         hbm_bytes=t.hbm_bytes, gpu=gpu, issue_intensity=1.0, clock_sensitive=True, sm_count=t.sms,
                         issue_fraction=t.ask, cap=t.most, load_share=params.gemm_load_share)
    ctas = t.sms * t.occ
    return replace(d, persistent_ctas=ctas if persistent and t.blocks > ctas else 0, cluster_ctas=cluster_ctas,
                   memory_wait=t.memory_wait, saturation_clock_fraction=t.saturation)


def memory_bound(
    bytes_moved: float,
    gpu: GpuSpec,
    params: Parameters,
    *,
    flops: float = 0.0,
    threads: int = 256,
    items_per_thread: int = 4,
    element_size_bytes: int = 2,
    registers_per_thread: int = 32,
    shared_mem_bytes: int = 0,
    blocks: int | None = None,
    kind: str = "elementwise",
) -> KernelDemand:
    """A streaming kernel (elementwise, norm, softmax: ``kind``, whose bandwidth efficiency it
    takes): HBM-bound unless it does much math."""
    _positive(bytes_moved, "bytes")
    if flops < 0:
        raise OvsimError(f"must not be negative, got {flops}", field="flops")
    block = BlockShape(threads=threads, registers_per_thread=registers_per_thread, shared_mem_bytes=shared_mem_bytes)
    if blocks is None:
        elements = bytes_moved / element_size_bytes
        blocks = max(1, math.ceil(elements / (threads * items_per_thread)))
    bw = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction * params.memory_eff(kind)
    t_mem = bytes_moved / bw
    t_math = flops / gpu.peak_flops_per_s("fp32")
    body = max(t_mem, t_math)
    intensity = max(params.memory_issue_floor, t_math / body) if body > 0 else 1.0
    compute = t_math >= t_mem
    d = demand_from_time(blocks=blocks, block=block, isolated_s=body + params.kernel_overhead_s, flops=flops,
                         hbm_bytes=bytes_moved, gpu=gpu, issue_intensity=intensity, clock_sensitive=compute,
                         cap=issue_cap(block, gpu, params, 1.0 / blocks_per_sm(block, gpu)) if compute else None)
    return d if compute else bandwidth_bound(d, gpu, params)


def attention(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    precision: str,
    gpu: GpuSpec,
    params: Parameters,
    *,
    causal: bool = True,
    backward: bool = False,
    kv_len: int | None = None,
    tile_q: int = 128,
    threads: int = 256,
    registers_per_thread: int = 192,
    shared_mem_bytes: int | None = None,
    efficiency: float | None = None,
) -> KernelDemand:
    """Fused (flash) attention: one block per (batch, head, query tile) looping over the keys, each
    at ``efficiency`` of an SM's tensor peak (a named kernel's published rate), or where None at
    the calibration's (:func:`fused_attention_efficiency`), its head rounded up to its tiles'.
    The backward's blocks are the keys' tiles instead, each looping over the queries (it makes
    each key block's gradients in one block: FlashAttention-2, arXiv 2307.08691, section 3.2; so
    do cuDNN's and FlashAttention-3's). ``seq_len`` queries against ``kv_len`` keys (None: as
    many; a context-parallel rank's queries against more or fewer keys: where they differ, the
    side a block loops over sets its efficiency); causal, half the products are masked (a
    context-parallel rank's two chunks together, :class:`ovsim.models.op_specs.AttentionOp`)."""
    kv = seq_len if kv_len is None else kv_len
    for name, v in (("batch", batch), ("heads", heads), ("seq_len", seq_len), ("head_dim", head_dim),
                    ("kv_len", kv)):
        if v < 1:
            raise OvsimError(f"must be a positive integer, got {v}", field=name)
    eb = element_bytes(precision)
    # QK^T and PV: 2 matmuls of 2*Sq*Skv*D FLOPs per head; backward does 2.5x the forward's work.
    flops = 4.0 * batch * heads * seq_len * kv * head_dim * (0.5 if causal else 1.0)
    if backward:
        flops *= 2.5
    # Q and the output over the queries, K and V over the keys (twice as much backward).
    hbm_bytes = float(2 * batch * heads * (seq_len + kv) * head_dim * eb * (2 if backward else 1))
    smem = shared_mem_bytes if shared_mem_bytes is not None else min(
        gpu.sm.max_shared_mem_per_block_bytes, 3 * tile_q * head_dim * eb * 2)
    block = BlockShape(threads=threads, registers_per_thread=registers_per_thread, shared_mem_bytes=smem)
    rows, loop = (kv, seq_len) if backward else (seq_len, kv)
    blocks = batch * heads * math.ceil(rows / tile_q)
    occ = blocks_per_sm(block, gpu)
    if occ == 0:
        raise OvsimError("an attention block does not fit on one SM", field="head_dim")
    eff, padded = efficiency, 1.0
    if eff is None:
        eff = fused_attention_efficiency(params, loop, causal, backward)
        multiple = params.attention_head_dim_multiple
        padded = math.ceil(head_dim / multiple) * multiple / head_dim
    per_sm = gpu.peak_flops_per_s(precision) / gpu.sm.count * eff
    flops_block = flops * padded / blocks
    waves = math.ceil(blocks / (gpu.sm.count * occ))
    t_math = waves * occ * flops_block / per_sm
    t_mem = hbm_bytes / (gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction)
    return demand_from_time(blocks=blocks, block=block, isolated_s=max(t_math, t_mem) + params.kernel_overhead_s,
                            flops=flops, hbm_bytes=hbm_bytes, gpu=gpu, issue_intensity=1.0,
                            clock_sensitive=t_math >= t_mem, cap=issue_cap(block, gpu, params, 1.0 / occ))


# Keys a tile of a fused attention kernel's loop takes (attention_block_overhead_tiles counts in them).
ATTENTION_KEY_TILE = 128


def fused_attention_efficiency(params: Parameters, loop_len: int, causal: bool, backward: bool) -> float:
    """The calibration's efficiency of a fused attention kernel, forward or backward, whose blocks
    each loop over ``loop_len`` tokens (forward: keys; backward: queries; half of them on average
    under the causal mask): its efficiency over long loops, times the share of a block's time
    its loop takes beside what it spends once (``attention_block_overhead_tiles``)."""
    eff = params.attention_eff(None, backward=backward)
    tiles = loop_len * (0.5 if causal else 1.0) / ATTENTION_KEY_TILE
    overhead = params.attention_block_overhead_tiles
    return eff * tiles / (tiles + overhead) if overhead > 0 else eff


def generic(
    grid: int,
    block: BlockShape,
    gpu: GpuSpec,
    params: Parameters,
    *,
    flops: float = 0.0,
    hbm_bytes: float = 0.0,
    precision: str = "fp32",
    duration_s: float | None = None,
) -> KernelDemand:
    """A kernel known only by its launch and totals (as a trace or ncu reports it).

    With a measured ``duration_s`` that is its isolated time (never shorter than its HBM traffic
    allows); without one, the roofline of its FLOPs and bytes.
    """
    if flops < 0 or hbm_bytes < 0:
        raise OvsimError("flops and hbm_bytes must not be negative", field="flops" if flops < 0 else "hbm_bytes")
    occ = blocks_per_sm(block, gpu)
    if occ == 0:
        raise OvsimError(f"block ({block.threads} threads, {block.registers_per_thread} regs, "
                         f"{block.shared_mem_bytes} B smem) does not fit on one {gpu.name} SM", field="block")
    bw = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction
    t_mem = hbm_bytes / bw
    rate = gpu.peak_flops_per_s(precision)
    if precision in gpu.compute.tensor_precisions:
        rate *= params.gemm_eff(precision)
    t_math = flops / rate
    if duration_s is not None:
        _positive(duration_s, "duration_s")
        isolated = max(duration_s, t_mem)
    else:
        isolated = max(t_math, t_mem) + params.kernel_overhead_s
    body = max(t_math, t_mem)
    intensity = 1.0 if body == 0 or t_math >= t_mem else max(params.memory_issue_floor, t_math / body)
    compute = t_math >= t_mem
    d = demand_from_time(blocks=grid, block=block, isolated_s=isolated, flops=flops, hbm_bytes=hbm_bytes,
                         gpu=gpu, issue_intensity=intensity, clock_sensitive=compute,
                         cap=issue_cap(block, gpu, params, 1.0 / occ) if compute else None)
    return d if compute else bandwidth_bound(d, gpu, params)
