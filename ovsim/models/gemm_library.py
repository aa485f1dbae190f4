"""The GEMM a library would run for a problem: the kernels ovsim knows cuBLAS and CUTLASS pick among
(output tiles, block shapes, K splits), each priced by :func:`ovsim.models.cost.gemm`, and the
fastest that launches. Scenarios' GEMMs without a kernel of their own are priced this way; the GEMM
efficiency and time per wave shipped for Hopper were fitted through this very choice."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np

from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec
from ovsim.models.cost import (
    GemmTime,
    element_bytes,
    gemm_demand,
    gemm_isolated_s,
    gemm_isolated_times,
    gemm_main_loop,
    gemm_rate,
    gemm_time,
)
from ovsim.models.ir import BlockShape, KernelDemand
from ovsim.models.occupancy import blocks_per_sm


class GemmKernel(NamedTuple):
    """A library GEMM kernel as the cost model sees it: its tiles and its block."""

    tile: tuple[int, int, int]
    threads: int
    registers_per_thread: int
    stages: int
    # One wave of blocks looping over the tiles (cost.gemm's ``persistent``).
    persistent: bool = False
    # CTAs per thread-block cluster (cost.gemm's ``cluster_ctas``).
    cluster: int = 1


# Output tiles CUTLASS and cuBLAS pick among.
_TILES_MN = ((128, 256), (256, 128), (128, 192), (192, 128), (128, 128), (64, 256), (256, 64), (128, 64), (64, 128))
# And on Hopper, as measured there: cuBLAS (CUDA 13.0) runs products of 1 to 32 rows on tiles named
# 64x8, 64x16 and 64x32, and of about 128 rows on 64x64 (its kernel names on the H100,
# calibration/data/h100-sxm5-80gb/2026-11-26-f). Other GPUs' libraries were not measured.
_HOPPER_TILES_MN = ((64, 64), (8, 64), (16, 64), (32, 64), (64, 8), (64, 16), (64, 32))
# Tiles narrower than this along a dimension are run only where they cover all of it.
_NARROW = 64
# A main-loop stage reads 128 bytes of K per row (the shared-memory swizzle width): K tiles of 64
# 16-bit, 128 8-bit or 32 32-bit elements (CUTLASS's Ampere and Hopper tile shapes).
_K_TILE_BYTES = 128
# (threads, registers per thread, stages, persistent, CTAs per cluster) of a block. Ampere-style
# multistage kernels: 8 warps.
# Hopper's warp-specialized cooperative kernels (cuBLAS's on sm90, 384 threads in every kernel the
# harness's GEMMs ran): a producer and two consumer warpgroups holding the SM's registers, one
# block per SM, a deeper pipeline; persistent (launched as 66 clusters of 2 blocks on the H100
# and H200 whatever the tile count: calibration/data/h100-sxm5-80gb/2026-11-27-b, h200-sxm/2026-11-27-c;
# clusters of 2, "1x2" or "2x1" in the name of every GEMM the smloss and overlap parts ran).
_MULTISTAGE = (256, 128, 3, False, 1)
_WARP_SPECIALIZED = (384, 168, 4, True, 2)


def library_gemm_kernels(gpu: GpuSpec, precision: str) -> list[GemmKernel]:
    """The library kernels ovsim knows for a GEMM on ``gpu``: every output tile of ``_TILES_MN``
    as a multistage kernel and, from compute capability 9.0, with ``_HOPPER_TILES_MN``, as a
    multistage and a warp-specialized one."""
    tk = max(1, _K_TILE_BYTES // element_bytes(precision))
    cc = gpu.compute_capability
    hopper = cc is not None and cc >= 90
    # Where both price the same, the library's own kind first (best_gemm keeps the first of a tie):
    # every GEMM measured on Hopper ran a warp-specialized kernel.
    blocks = [_WARP_SPECIALIZED, _MULTISTAGE] if hopper else [_MULTISTAGE]
    tiles = _TILES_MN + (_HOPPER_TILES_MN if hopper else ())
    return [GemmKernel((tm, tn, tk), threads, regs, stages, persistent, cluster) for tm, tn in tiles
            for threads, regs, stages, persistent, cluster in blocks]


# The refusals of a kernel that does not launch on the GPU (or with the padding), as against bad
# problem dimensions, which every kernel refuses.
_DOES_NOT_LAUNCH = ("tile", "extra_shared_mem_bytes", "shared_mem_bytes", "threads", "registers_per_thread")


# The K splits a library chooses among for a GEMM whose tiles leave SMs idle.
LIBRARY_SPLITS_K = (1, 2, 4, 8, 16)
# _least_s works on arrays only where every whole number it divides or multiplies (sizes, blocks,
# bytes moved, partial sums') stays below this: float64 holds them exactly there, so a quotient
# is Python's correctly rounded int / int.
_EXACT_FLOAT = 2**53


# best_gemm's answers, by its arguments and the content of the GPU spec and parameters: a sweep or
# a schedule search builds the same GEMMs over and over (a GPT-3 1.3B iteration's build spent 37%
# of its time choosing among the library's kernels), and both inputs are frozen models.
_BEST_GEMMS: dict[tuple[object, ...], KernelDemand] = {}
_BEST_GEMMS_MAX = 4096
# _least_s's unpadded occupancy of each kernel, by kernel, element size, padding and the GPU spec's
# fingerprint: a library choice asks for some 20 kernels', at a tenth of a millisecond the choice.
_OCCUPANCIES: dict[tuple[GemmKernel, int, int, str], int] = {}
# Fingerprints of the specs and parameters seen, by id; each keeps its object alive so that the id
# is not reused while its entry lives.
_FINGERPRINTS: dict[int, tuple[object, str]] = {}


def _fingerprint(model: GpuSpec | Parameters) -> str:
    hit = _FINGERPRINTS.get(id(model))
    if hit is None or hit[0] is not model:
        if len(_FINGERPRINTS) >= 64:
            _FINGERPRINTS.clear()
        hit = (model, model.model_dump_json())
        _FINGERPRINTS[id(model)] = hit
    return hit[1]


def clear_choices() -> None:
    """Forget the GEMMs chosen so far (a benchmark starts each search from none)."""
    _BEST_GEMMS.clear()
    _FINGERPRINTS.clear()
    _OCCUPANCIES.clear()


def best_gemm(m: int, n: int, k: int, precision: str, gpu: GpuSpec, params: Parameters, *,
              extra_shared_mem_bytes: int = 0, batch: int = 1, split_k: int | None = None,
              sm_count: int | None = None) -> KernelDemand:
    """The GEMM on the fastest of :func:`library_gemm_kernels` that launches with
    ``extra_shared_mem_bytes`` on ``sm_count`` SMs, as a library's heuristic would pick it
    (cuBLAS chooses among its kernels per shape; the GEMM efficiency and time per wave shipped
    for Hopper are fitted on measured cuBLAS GEMMs through this very choice). ``split_k`` None:
    the library also chooses among ``LIBRARY_SPLITS_K`` (splits of at least one K tile each)."""
    key = (m, n, k, precision, extra_shared_mem_bytes, batch, split_k, sm_count, _fingerprint(gpu),
           _fingerprint(params))
    hit = _BEST_GEMMS.get(key)
    if hit is None:
        if len(_BEST_GEMMS) >= _BEST_GEMMS_MAX:
            _BEST_GEMMS.clear()
        hit = _BEST_GEMMS[key] = _best_gemm(m, n, k, precision, gpu, params, extra_shared_mem_bytes,
                                            batch, split_k, sm_count)
    return hit


def _best_gemm(m: int, n: int, k: int, precision: str, gpu: GpuSpec, params: Parameters,
               extra_shared_mem_bytes: int, batch: int, split_k: int | None, sm_count: int | None) -> KernelDemand:
    # Chosen by their time alone; only the fastest's demand is made. Each kernel and split is
    # priced in order of the least time it can take (_least_s), and none whose least is above the
    # best time found: the choice is the one pricing them all in the listed order would make
    # (ties to the first listed), at a fraction of the pricing (about 70 kernels and splits a GEMM).
    price = partial(_priced, m, n, k, precision, gpu, params, extra_shared_mem_bytes, batch, sm_count)
    if not all(isinstance(v, int) and v >= 1 for v in (m, n, k, batch, 1 if split_k is None else split_k)):
        # A problem every kernel refuses: gemm_time says why, as the first kernel priced did.
        raise _refusal([(library_gemm_kernels(gpu, precision)[0], 1 if split_k is None else split_k)], price)
    pairs = _pairs(m, n, k, gpu, precision, split_k)
    least = _least_s(pairs, m, n, k, precision, gpu, params, extra_shared_mem_bytes, batch, sm_count)
    best: tuple[GemmTime, GemmKernel] | None = None
    best_at = -1
    refused: set[GemmKernel] = set()
    for i in sorted(range(len(pairs)), key=lambda j: (least[j], j)):
        if best is not None and least[i] > best[0].isolated_s:
            break
        kern, split = pairs[i]
        if kern in refused:
            continue
        try:
            t = price(kern, split)
        except OvsimError as e:
            if e.field not in _DOES_NOT_LAUNCH:
                raise
            refused.add(kern)  # a kernel launches at every split or at none
            continue
        if best is None or (t.isolated_s, i) < (best[0].isolated_s, best_at):
            best, best_at = (t, kern), i
    if best is None:
        raise _refusal(pairs, price)
    t, kern = best
    return gemm_demand(t, gpu, params, persistent=kern.persistent, cluster_ctas=kern.cluster)


def _pairs(m: int, n: int, k: int, gpu: GpuSpec, precision: str,
           split_k: int | None) -> list[tuple[GemmKernel, int]]:
    """The kernels and K splits a library chooses among for an m x n x k GEMM, in order."""
    splits = LIBRARY_SPLITS_K if split_k is None else (split_k,)
    out: list[tuple[GemmKernel, int]] = []
    for kern in library_gemm_kernels(gpu, precision):
        tm, tn, tk = kern.tile
        if (tm < _NARROW and m > tm) or (tn < _NARROW and n > tn):
            # A narrow tile reloads the other operand's panel for every few rows: a library runs
            # one only where it covers the whole of that dimension.
            continue
        out.extend((kern, split) for split in splits if split_k is not None or split == 1 or k >= split * tk)
    return out


def _least_s(pairs: list[tuple[GemmKernel, int]], m: int, n: int, k: int, precision: str, gpu: GpuSpec,
             params: Parameters, extra_shared_mem_bytes: int, batch: int, sm_count: int | None) -> list[float]:
    """For each kernel and split, a time :func:`gemm_time` never prices it below: its time alone
    as gemm_time works it out, unpadded. 0 where padding leaves fewer blocks an SM (a stretch that
    one block's load share can make a speed-up) and where the problem or the kernel is refused
    (gemm_time says why)."""
    sms = sm_count if sm_count is not None else gpu.sm.count
    try:
        rate = gemm_rate(n, k, precision, gpu, params, None)
    except OvsimError:
        return [0.0] * len(pairs)
    eb = element_bytes(precision)
    fingerprint = _fingerprint(gpu)
    mine: dict[GemmKernel, int] = {}
    for kern, _ in pairs:
        if kern not in mine:
            mine[kern] = _occupancy(kern, gpu, fingerprint, eb, extra_shared_mem_bytes)
    occ = np.array([mine[kern] for kern, _ in pairs], dtype=np.int64)
    # Above every product: two reads of each operand plus C at the element size, or the FP32
    # partial sums (8 bytes a split and an element, written and read back).
    largest = batch * (m * k + k * n + m * n) * max(eb, 8) * 2 * max((split for _, split in pairs), default=1)
    if largest >= _EXACT_FLOAT:
        # Each pair as gemm_isolated_s prices it, in Python's whole numbers.
        return [0.0 if o == 0 else gemm_isolated_s(
            m, n, k, kern.tile, batch, split, eb, gemm_main_loop(m, n, k, kern.tile, o, batch, split, sms, *rate)[4],
            gpu, params)[0] for (kern, split), o in zip(pairs, occ.tolist(), strict=True)]
    tiles = np.array([kern.tile[:2] for kern, _ in pairs], dtype=np.int64).reshape(-1, 2)
    splits = np.array([split for _, split in pairs], dtype=np.int64)
    least = gemm_isolated_times(m, n, k, tiles, np.maximum(occ, 1), batch, splits, sms, *rate, eb, gpu, params)
    out: list[float] = np.where(occ == 0, 0.0, least).tolist()
    return out


def _occupancy(kern: GemmKernel, gpu: GpuSpec, fingerprint: str, element_size: int, extra_shared_mem_bytes: int) -> int:
    """:func:`_occupancy_unpadded`, each kernel's worked out once for a GPU (``fingerprint``: its
    spec's)."""
    key = (kern, element_size, extra_shared_mem_bytes, fingerprint)
    hit = _OCCUPANCIES.get(key)
    if hit is None:
        if len(_OCCUPANCIES) >= _BEST_GEMMS_MAX:
            _OCCUPANCIES.clear()
        hit = _OCCUPANCIES[key] = _occupancy_unpadded(kern, gpu, element_size, extra_shared_mem_bytes)
    return hit


def _occupancy_unpadded(kern: GemmKernel, gpu: GpuSpec, element_size: int, extra_shared_mem_bytes: int) -> int:
    """Blocks of ``kern`` an SM holds unpadded, where the padding leaves it as many; 0 where it
    leaves fewer, or the kernel does not launch (its least time is then unknown)."""
    tm, tn, tk = kern.tile
    smem = kern.stages * (tm * tk + tn * tk) * element_size
    natural = BlockShape(threads=kern.threads, registers_per_thread=kern.registers_per_thread,
                         shared_mem_bytes=smem)
    padded = BlockShape(threads=kern.threads, registers_per_thread=kern.registers_per_thread,
                        shared_mem_bytes=smem + extra_shared_mem_bytes)
    try:
        occ = blocks_per_sm(natural, gpu)
        return occ if extra_shared_mem_bytes == 0 or blocks_per_sm(padded, gpu) == occ else 0
    except OvsimError:
        return 0


def _priced(m: int, n: int, k: int, precision: str, gpu: GpuSpec, params: Parameters, extra_shared_mem_bytes: int,
            batch: int, sm_count: int | None, kern: GemmKernel, split: int) -> GemmTime:
    """The GEMM's time on library kernel ``kern`` at K split ``split`` (:func:`gemm_time`)."""
    return gemm_time(m, n, k, precision, gpu, params, tile=kern.tile, threads=kern.threads,
                     registers_per_thread=kern.registers_per_thread, stages=kern.stages,
                     extra_shared_mem_bytes=extra_shared_mem_bytes, batch=batch, split_k=split, sm_count=sm_count)


def _refusal(pairs: list[tuple[GemmKernel, int]], price: Callable[[GemmKernel, int], GemmTime]) -> OvsimError:
    """Why no kernel launches: the first kernel's refusal, in the listed order (``price``:
    :func:`_priced` of the GEMM)."""
    for kern, split in pairs:
        try:
            price(kern, split)
        except OvsimError as e:
            return e
    return OvsimError("no library kernel for this GEMM", field="tile")
