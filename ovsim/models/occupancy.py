"""Occupancy: how many blocks of a kernel an SM holds (the CUDA occupancy calculator's rules), the
most of its SM one block can use, and how many block times a kernel takes alone. The cost model
(:mod:`ovsim.models.cost`) prices kernels on these; the engine places their blocks by them.
"""

from __future__ import annotations

import math

from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec
from ovsim.models.ir import BlockShape


def allocated_registers(threads: int, registers_per_thread: int, warp_size: int, alloc_unit: int) -> int:
    """Registers a block holds: allocated per warp, rounded up to the allocation granule."""
    warps = math.ceil(threads / warp_size)
    return warps * math.ceil(registers_per_thread * warp_size / alloc_unit) * alloc_unit


def registers_per_block(block: BlockShape, gpu: GpuSpec) -> int:
    return allocated_registers(block.threads, block.registers_per_thread, gpu.sm.warp_size,
                               gpu.sm.register_alloc_unit)


def shared_mem_per_block(block: BlockShape, gpu: GpuSpec) -> int:
    return block.shared_mem_bytes + gpu.sm.reserved_shared_mem_per_block_bytes


def check_block(block: BlockShape, gpu: GpuSpec) -> None:
    """A block that could never launch on this GPU is bad input, not a zero-occupancy kernel."""
    sm = gpu.sm
    if block.threads < 1 or block.threads > sm.max_threads_per_block:
        raise OvsimError(f"{block.threads} threads per block, {gpu.name} allows 1..{sm.max_threads_per_block}",
                         field="threads")
    if block.registers_per_thread < 0 or block.registers_per_thread > sm.max_registers_per_thread:
        raise OvsimError(f"{block.registers_per_thread} registers per thread, {gpu.name} allows at most "
                         f"{sm.max_registers_per_thread}", field="registers_per_thread")
    if block.shared_mem_bytes < 0 or block.shared_mem_bytes > sm.max_shared_mem_per_block_bytes:
        raise OvsimError(f"{block.shared_mem_bytes} B shared memory per block, {gpu.name} allows at most "
                         f"{sm.max_shared_mem_per_block_bytes}", field="shared_mem_bytes")
    if registers_per_block(block, gpu) > sm.registers_per_sm:
        raise OvsimError(f"block needs {registers_per_block(block, gpu)} registers, an SM has "
                         f"{sm.registers_per_sm}", field="registers_per_thread")


# Occupancies worked out, by the block and the SM spec's identity (each entry holds its spec, so
# that the identity stays its own): choosing a library GEMM asks for hundreds.
_OCCUPANCY: dict[tuple[BlockShape, int], tuple[object, int]] = {}
_OCCUPANCY_MAX = 4096


def clear_occupancies() -> None:
    """Forget the occupancies worked out so far (a benchmark starts each search from none)."""
    _OCCUPANCY.clear()


def blocks_per_sm(block: BlockShape, gpu: GpuSpec) -> int:
    """Occupancy: how many blocks of one kernel fit on an empty SM (CUDA occupancy calculator)."""
    sm = gpu.sm
    hit = _OCCUPANCY.get((block, id(sm)))
    if hit is not None and hit[0] is sm:
        return hit[1]
    check_block(block, gpu)
    if len(_OCCUPANCY) >= _OCCUPANCY_MAX:
        _OCCUPANCY.clear()
    occ = _OCCUPANCY[(block, id(sm))] = (sm, _blocks_per_sm(block, gpu))
    return occ[1]


def _blocks_per_sm(block: BlockShape, gpu: GpuSpec) -> int:
    sm = gpu.sm
    warps = math.ceil(block.threads / sm.warp_size)
    by_threads = sm.max_threads_per_sm // (warps * sm.warp_size)
    regs = registers_per_block(block, gpu)
    by_regs = sm.registers_per_sm // regs if regs else sm.max_blocks_per_sm
    smem = shared_mem_per_block(block, gpu)
    # GPUs without a per-block reservation (V100, AMD) let blocks with no shared memory stack freely.
    by_smem = sm.shared_mem_per_sm_bytes // smem if smem else sm.max_blocks_per_sm
    return max(0, min(by_threads, by_regs, by_smem, sm.max_blocks_per_sm))


def issue_cap(block: BlockShape, gpu: GpuSpec, params: Parameters, issue_fraction: float) -> float:
    """The most of an SM one block of a compute-bound kernel uses when fewer of its kernel's blocks
    share the SM: ``block_issue_share_per_warp`` per warp, at least its share at full residency and
    at most the SM; that share itself where the calibration measured none."""
    per_warp = params.block_issue_share_per_warp
    if per_warp is None:
        return issue_fraction
    warps = math.ceil(block.threads / gpu.sm.warp_size)
    return max(issue_fraction, min(1.0, warps * per_warp))


def kept_load_share(load_share: float, per_sm: int) -> float:
    """The load share (:attr:`KernelDemand.load_share`) a kernel of ``per_sm`` blocks per SM keeps:
    all of it at one block per SM (the kernels it was measured on), none with more, where the SMs
    running its blocks would not say how much of the memory system they load."""
    return load_share if per_sm == 1 else 0.0


def alone_block_times(blocks: int, per_sm: int, sms: int, issue_fraction: float, cap: float,
                      load_share: float = 0.0, total_sms: int | None = None) -> float:
    """How many block times (each at ``issue_fraction`` of its SM, with blocks on every one of the
    GPU's ``total_sms``, default ``sms``) a kernel takes alone with ``per_sm`` blocks resident per
    SM: its full waves, then a last wave spread over the SMs, a block running at min(``cap``, 1 /
    the blocks on its SM) of its SM, as the engine shares an SM, and ``1 / (1 - load_share * (1 -
    busy SMs / total_sms))`` times faster with blocks on fewer SMs (:attr:`KernelDemand.load_share`)."""
    slots = sms * per_sm
    waves = math.ceil(blocks / slots)
    last = blocks - (waves - 1) * slots
    total = total_sms if total_sms is not None else sms

    def pace(resident: int) -> float:
        return issue_fraction / max(issue_fraction, min(cap, 1.0 / resident))

    def load(busy: int) -> float:
        return 1.0 - load_share * (1.0 - min(busy, total) / total)

    # The last wave: `hi` blocks on `n_hi` SMs, one fewer on the others. Those finish first where a
    # block with room runs faster, and the rest then run on fewer busy SMs.
    hi = math.ceil(last / sms)
    n_hi = last - (hi - 1) * sms
    t_hi = pace(hi)
    if hi == 1:
        tail = t_hi * load(n_hi)
    else:
        t_lo = pace(hi - 1)
        tail = t_lo * load(sms) + (t_hi - t_lo) * load(n_hi)
    return (waves - 1) * pace(per_sm) * load(sms) + tail


def resident_warps(blocks: int, block: BlockShape, gpu: GpuSpec) -> int:
    """Warps of a kernel resident at once on an idle GPU: its first wave's blocks times their warps."""
    return min(blocks, gpu.sm.count * blocks_per_sm(block, gpu)) * -(-block.threads // 32)
