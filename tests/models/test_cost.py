"""Occupancy closed forms (the CUDA occupancy calculator's rules) on shipped specs, and the GEMM
cost's alignment rule and wave form."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters, load_calibration
from ovsim.hw.spec import GpuSpec, load_gpu
from ovsim.models.cost import gemm, gemm_aligned
from ovsim.models.gemm_library import best_gemm, library_gemm_kernels
from ovsim.models.ir import BlockShape, KernelDemand
from ovsim.models.occupancy import blocks_per_sm


@pytest.mark.parametrize(("gpu", "block", "expected"), [
    # V100: 2048 threads / 256 = 8; 65536 registers / (256 x 32) = 8; no shared memory and no
    # per-block reservation, so shared memory sets no limit.
    ("v100-sxm2", BlockShape(256, 32, 0), 8),
    # A100: 64-thread blocks stop at the 32-block limit before threads (32) or registers (64) do.
    ("a100-sxm4-40gb", BlockShape(64, 16, 0), 32),
    # H100: 100 KB + 1 KB reserved per block in 228 KB: two blocks.
    ("h100-sxm5-80gb", BlockShape(128, 32, 100_000), 2),
])
def test_blocks_per_sm(gpu: str, block: BlockShape, expected: int) -> None:
    assert blocks_per_sm(block, load_gpu(gpu)) == expected


@pytest.mark.parametrize(("n", "k", "precision", "aligned"), [
    (4096, 4096, "bf16", True),
    (3137, 64, "bf16", False),  # TimeSformer's attention bmm: n is 6,274 bytes
    (64, 3137, "bf16", False),
    (4100, 4096, "bf16", False),  # 8,200 bytes: on 8, not 16
    (4, 4, "tf32", True),  # 16 bytes
    (16, 32, "fp8", True),
    (8, 32, "fp8", False),
])
def test_gemm_alignment_is_n_and_k_on_16_bytes(n: int, k: int, precision: str, aligned: bool) -> None:
    assert gemm_aligned(n, k, precision) is aligned


def test_an_unaligned_gemm_runs_at_the_unaligned_efficiency_where_one_is_calibrated() -> None:
    """8192 x 4096 tiles of 128 x 256, one per H100 SM: 1,024 tiles in ceil(1024 / 132) = 8 waves;
    k = 516 is 1,032 bytes (not on 16), k = 520 is 1,040 (on 16)."""
    h100 = load_gpu("h100-sxm5-80gb")
    base = load_calibration(h100, "h100-sxm5-80gb").params.merged(
        {"gemm_efficiency": {"bf16": 0.8}, "gemm_tile_overhead_s": {"bf16": 2e-6}})
    p = base.merged({"gemm_unaligned_efficiency": {"bf16": 0.1}})
    per_sm = h100.peak_flops_per_s("bf16") / h100.sm.count

    def expected(k: int, eff: float) -> float:
        return p.kernel_overhead_s + 8 * (2.0 * 128 * 256 * k / (per_sm * eff) + 2e-6)

    odd = gemm(8192, 4096, 516, "bf16", h100, p, tile=(128, 256, 64))
    assert odd.isolated_s == pytest.approx(expected(516, 0.1), rel=1e-12)
    assert gemm(8192, 4096, 520, "bf16", h100, p, tile=(128, 256, 64)).isolated_s == pytest.approx(
        expected(520, 0.8), rel=1e-12)
    # Without an unaligned efficiency for the precision, the aligned one prices it.
    plain = base.merged({"gemm_unaligned_efficiency": {"fp16": 0.1}})
    assert gemm(8192, 4096, 516, "bf16", h100, plain, tile=(128, 256, 64)).isolated_s == pytest.approx(
        expected(516, 0.8), rel=1e-12)


def test_hopper_kernels_join_the_library_only_on_hopper() -> None:
    a100 = library_gemm_kernels(load_gpu("a100-sxm4-80gb"), "bf16")
    h100 = library_gemm_kernels(load_gpu("h100-sxm5-80gb"), "fp8")
    assert {kern.threads for kern in a100} == {256}
    assert {kern.threads for kern in h100} == {256, 384}
    assert {kern.tile[2] for kern in a100} == {64} and {kern.tile[2] for kern in h100} == {128}
    # The narrow and 64 x 64 tiles were measured on the H100's cuBLAS only.
    assert min(min(kern.tile[:2]) for kern in a100) == 64 and all(kern.tile[:2] != (64, 64) for kern in a100)
    assert {kern.tile[:2] for kern in h100} >= {(8, 64), (64, 8), (64, 64)}


def test_best_gemm_is_the_fastest_library_kernel_that_launches() -> None:
    """A 1024^3 BF16 GEMM on an H100 with no time per wave: 64 x 128 tiles make 128 blocks, one
    wave on 132 SMs, each block one tile of 2 x 64 x 128 x 1024 FLOPs at its SM's rate, unless the
    cost model's HBM traffic (A and B read twice, C written once) takes longer; no library tile
    makes more than 132 blocks of a shorter tile time (128 x 128: 64 blocks), so that is the
    closed-form best. With padding, only the kernels it leaves room for remain."""
    h100 = load_gpu("h100-sxm5-80gb")
    p = load_calibration(h100, "h100-sxm5-80gb").params.merged(
        {"gemm_efficiency": {"bf16": 0.8}, "gemm_tile_overhead_s": {"bf16": 0.0}})
    per_sm = h100.peak_flops_per_s("bf16") / h100.sm.count * 0.8
    d = best_gemm(1024, 1024, 1024, "bf16", h100, p)
    assert d.blocks == 128
    hbm_s = 2 * (2 * (2 * 1024 * 1024) + 1024 * 1024) / (h100.memory.bandwidth_bytes_per_s * p.hbm_achievable_fraction)
    assert d.isolated_s == pytest.approx(p.kernel_overhead_s + max(2.0 * 64 * 128 * 1024 / per_sm, hbm_s), rel=1e-12)
    every = [gemm(1024, 1024, 1024, "bf16", h100, p, tile=kern.tile, threads=kern.threads,
                  registers_per_thread=kern.registers_per_thread, stages=kern.stages).isolated_s
             for kern in library_gemm_kernels(h100, "bf16")]
    assert d.isolated_s == min(every)
    padded = best_gemm(1024, 1024, 1024, "bf16", h100, p, extra_shared_mem_bytes=150_000)
    launching = []
    for kern in library_gemm_kernels(h100, "bf16"):
        try:
            launching.append(gemm(1024, 1024, 1024, "bf16", h100, p, tile=kern.tile, threads=kern.threads,
                                  registers_per_thread=kern.registers_per_thread, stages=kern.stages,
                                  extra_shared_mem_bytes=150_000))
        except OvsimError:
            continue
    assert 0 < len(launching) < len(every)
    assert padded.isolated_s == min(d.isolated_s for d in launching)
    assert padded.block.shared_mem_bytes + 1024 <= h100.sm.shared_mem_per_sm_bytes
    with pytest.raises(OvsimError, match="shared memory"):
        best_gemm(1024, 1024, 1024, "bf16", h100, p, extra_shared_mem_bytes=230_000)
    # A problem every kernel refuses is named, before any kernel is priced.
    for kwargs, field in (({"split_k": 0}, "split_k"), ({"batch": 0}, "batch")):
        with pytest.raises(OvsimError) as e:
            best_gemm(1024, 1024, 1024, "bf16", h100, p, **kwargs)
        assert e.value.field == field


def test_split_k_pays_for_its_partial_sums() -> None:
    """Parallel split-K: the splits write FP32 partial tiles that a reduction kernel reads back,
    one more launch. A 128 x 128 x 8192 GEMM on one 128 x 128 tile is compute-bound alone and in
    each of 4 splits (one wave either way), so in closed form split 4 takes a quarter of the
    tile's math, the fixed times, and 2 x 4 x 128 x 128 x 4 bytes at the achievable bandwidth."""
    h100 = load_gpu("h100-sxm5-80gb")
    p = load_calibration(h100, "h100-sxm5-80gb").params
    tile = (128, 128, 64)
    one = gemm(128, 128, 8192, "bf16", h100, p, tile=tile)
    four = gemm(128, 128, 8192, "bf16", h100, p, tile=tile, split_k=4)
    occ = blocks_per_sm(BlockShape(256, 128, 3 * (128 * 64 + 128 * 64) * 2), h100)
    per_sm = h100.peak_flops_per_s("bf16") / h100.sm.count * p.gemm_eff("bf16")
    math_s = occ * 2.0 * 128 * 128 * 8192 / per_sm
    bw = h100.memory.bandwidth_bytes_per_s * p.hbm_achievable_fraction
    assert one.isolated_s == pytest.approx(math_s + p.gemm_tile_s("bf16") + p.kernel_overhead_s, rel=1e-12)
    assert four.blocks == 4
    assert four.isolated_s == pytest.approx(math_s / 4 + p.gemm_tile_s("bf16") + 2 * p.kernel_overhead_s
                                            + 2 * 4 * 128 * 128 * 4 / bw, rel=1e-12)


def test_the_library_splits_k_only_where_tiles_leave_sms_idle() -> None:
    """An 8 x 128 x 65536 GEMM (2 output tiles even 8 rows tall, on 132 SMs, each a long K loop) splits
    its K; a 4096^3 one (hundreds of tiles) does not; a scenario's own split is kept."""
    h100 = load_gpu("h100-sxm5-80gb")
    p = load_calibration(h100, "h100-sxm5-80gb").params
    skinny = best_gemm(8, 128, 65536, "bf16", h100, p)
    unsplit = best_gemm(8, 128, 65536, "bf16", h100, p, split_k=1)
    assert skinny.blocks > unsplit.blocks and skinny.isolated_s < unsplit.isolated_s
    square = best_gemm(4096, 4096, 4096, "bf16", h100, p)
    assert square.isolated_s == best_gemm(4096, 4096, 4096, "bf16", h100, p, split_k=1).isolated_s
    assert best_gemm(8, 128, 65536, "bf16", h100, p, split_k=2).blocks == 2 * unsplit.blocks


def test_a_gemm_reads_an_operand_at_most_once_per_tile_that_needs_it() -> None:
    """The GEMM's HBM bytes: A is needed by each column tile and B by each row tile, read at most
    twice (the rest hit L2), C written once. With 128 x 128 tiles, 4096^3 reads both twice; 1 x
    8192 x 8192 (one row tile) reads B once and A twice (64 column tiles); 8192 x 64 x 8192 (one
    column tile) reads A once."""
    h100 = load_gpu("h100-sxm5-80gb")
    p = load_calibration(h100, "h100-sxm5-80gb").params
    tile = (128, 128, 64)
    for (m, n, k), (reads_a, reads_b) in (((4096, 4096, 4096), (2, 2)), ((1, 8192, 8192), (2, 1)),
                                          ((8192, 64, 8192), (1, 2))):
        d = gemm(m, n, k, "bf16", h100, p, tile=tile)
        assert d.hbm_bytes == 2 * (reads_a * m * k + reads_b * k * n + m * n)


def test_the_weight_once_rule_reads_b_once_up_to_its_row_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """``WEIGHT_ONCE_ROW_TILES`` (0 ships: bench/gemm_weight_reads.py scores others) reads B once
    where the GEMM has at most that many row tiles, in both the scalar and the array pricing: 512 x
    8192 x 8192 on 128 x 128 tiles has four, 640 x 8192 x 8192 five."""
    from ovsim.models import cost, gemm_library

    h100 = load_gpu("h100-sxm5-80gb")
    p = load_calibration(h100, "h100-sxm5-80gb").params
    tile = (128, 128, 64)
    monkeypatch.setattr(cost, "WEIGHT_ONCE_ROW_TILES", 4)
    gemm_library.clear_choices()
    try:
        for m, reads_b in ((512, 1), (640, 2)):
            n = k = 8192
            assert gemm(m, n, k, "bf16", h100, p, tile=tile).hbm_bytes == 2 * (2 * m * k + reads_b * k * n + m * n)
        # The arrays' pricing (the library's bound on each kernel) agrees with the scalar one.
        rate = cost.gemm_rate(8192, 8192, "bf16", h100, p, None)
        one = cost.gemm_isolated_times(512, 8192, 8192, np.array([[128, 128]]), np.array([1]), 1, np.array([1]),
                                       h100.sm.count, *rate, 2, h100, p)
        main_loop = cost.gemm_main_loop(512, 8192, 8192, tile, 1, 1, 1, h100.sm.count, *rate)[4]
        assert one[0] == pytest.approx(cost.gemm_isolated_s(512, 8192, 8192, tile, 1, 1, 2, main_loop, h100, p)[0])
    finally:
        gemm_library.clear_choices()


def test_a_one_row_gemm_streams_its_weight_once_as_measured() -> None:
    """A BF16 1 x 32768 x 8192 product (a decode step's MLP up-projection) is bound by reading its
    537 MB weight once: in closed form the kernel overhead plus the weight, the one-row input read
    twice and the output at the achievable HBM bandwidth. The H100 measured 175.2 us for it
    (median of 12, at the top clock; calibration/data/h100-sxm5-80gb/2026-11-26-f, shapes part):
    within 3%. Reading the weight twice, as every GEMM was once priced, gave 352 us."""
    h100 = load_gpu("h100-sxm5-80gb")
    p = load_calibration(h100, "h100-sxm5-80gb").params
    m, n, k = 1, 32768, 8192
    d = best_gemm(m, n, k, "bf16", h100, p)
    bw = h100.memory.bandwidth_bytes_per_s * p.hbm_achievable_fraction
    assert d.isolated_s == pytest.approx(p.kernel_overhead_s + 2 * (k * n + 2 * m * k + m * n) / bw, rel=1e-9)
    assert d.isolated_s == pytest.approx(175.2e-6, rel=0.03)


def test_a_narrow_product_runs_on_a_narrow_tile() -> None:
    """cuBLAS runs 1- to 32-row products on 64 x 8 to 64 x 32 tiles (its kernel names on the H100,
    calibration/data/h100-sxm5-80gb/2026-11-26-f); the cost model's library has them, so an 8 x
    1024 x 1024 BF16 GEMM runs faster on one of them than on any tile 64 or more wide each way."""
    h100 = load_gpu("h100-sxm5-80gb")
    p = load_calibration(h100, "h100-sxm5-80gb").params
    narrow = best_gemm(8, 1024, 1024, "bf16", h100, p)
    wide = min(gemm(8, 1024, 1024, "bf16", h100, p, tile=kern.tile, threads=kern.threads,
                    registers_per_thread=kern.registers_per_thread, stages=kern.stages).isolated_s
               for kern in library_gemm_kernels(h100, "bf16") if min(kern.tile[:2]) >= 64)
    assert min(narrow.block_time_s, wide) > 0 and narrow.isolated_s < wide


def test_hopper_library_gemms_are_persistent_and_ampere_ones_are_not() -> None:
    """cuBLAS's Hopper GEMMs run warp-specialized kernels launched as one wave of 132 blocks (the
    harness's kernel tables: grid 2 x 66, 384 threads, whatever the shape); where a warp-specialized
    and a multistage kernel price the same, the library's own is chosen, in clusters of 2. A GEMM of no more tiles
    than SMs is one block per tile either way; the A100's kernels are a block per tile."""
    h100, a100 = load_gpu("h100-sxm5-80gb"), load_gpu("a100-sxm4-80gb")
    d = best_gemm(4096, 4096, 4096, "bf16", h100, load_calibration(h100, "h100-sxm5-80gb").params)
    assert d.block.threads == 384 and d.persistent_ctas == 132 and d.blocks > 132 and d.cluster_ctas == 2
    small = best_gemm(1024, 1024, 1024, "bf16", h100, load_calibration(h100, "h100-sxm5-80gb").params)
    assert small.blocks <= 132 and small.persistent_ctas == 0
    amp = best_gemm(4096, 4096, 4096, "bf16", a100, load_calibration(a100, "a100-sxm4-80gb").params)
    assert amp.persistent_ctas == 0 and amp.blocks > a100.sm.count and amp.cluster_ctas == 1


@pytest.mark.parametrize(("blocks", "per_sm", "sms", "total", "expected"), [
    (200, 1, 100, 100, 2.0),  # two full waves: every SM busy in both
    (150, 1, 100, 100, 1 + (1 - 0.2 * 0.5)),  # the last wave on half the SMs
    (130, 2, 100, 100, 1.0),  # one wave spread one block per SM first: all 100 busy
    (60, 2, 100, 100, 1 - 0.2 * 0.4),  # one wave on 60 SMs
    (100, 1, 80, 100, 1 - 0.2 * 0.2 + 1 - 0.2 * 0.8),  # 80 of 100 SMs (a carve-out), then 20
])
def test_alone_block_times_counts_the_faster_tiles_on_fewer_sms(blocks: int, per_sm: int, sms: int, total: int,
                                                               expected: float) -> None:
    """Closed form of the load share (KernelDemand.load_share, s = 0.2): a wave with blocks on b of
    the GPU's SMs takes 1 - s * (1 - b / total) block times."""
    from ovsim.models.occupancy import alone_block_times

    assert alone_block_times(blocks, per_sm, sms, 1.0, 1.0, 0.2, total) == pytest.approx(expected)


def test_alone_block_times_runs_a_last_wave_on_fewer_sms_once_its_lighter_sms_finish() -> None:
    """150 blocks of 2 per SM on 100 SMs, each block at half its SM (cap 1): 50 SMs hold 2 blocks
    (1 block time) and 50 hold 1, which runs at the whole SM and finishes in half that. Then 50 of
    100 SMs are busy: the second half runs 1 - 0.2 * 0.5 as long. 0.5 + 0.45 block times."""
    from ovsim.models.occupancy import alone_block_times

    assert alone_block_times(150, 2, 100, 0.5, 1.0, 0.2, 100) == pytest.approx(0.5 + 0.45)
    assert alone_block_times(150, 2, 100, 0.5, 1.0) == pytest.approx(1.0)


def test_only_a_kernel_of_one_block_per_sm_keeps_its_load_share() -> None:
    """KernelDemand.load_share counts SMs running blocks, which says how much of the memory system a
    kernel loads only where it runs one block per SM (as cuBLAS's Hopper GEMMs, on which it was
    measured); with more, two blocks on one SM would run faster than one on each of two."""
    from ovsim.models.cost import demand_from_time

    h100 = load_gpu("h100-sxm5-80gb")
    one = BlockShape(threads=384, registers_per_thread=168, shared_mem_bytes=200 * 1024)
    two = BlockShape(threads=256, registers_per_thread=128, shared_mem_bytes=100 * 1024)
    assert (blocks_per_sm(one, h100), blocks_per_sm(two, h100)) == (1, 2)
    kw = {"blocks": 200, "isolated_s": 1e-3, "flops": 0.0, "hbm_bytes": 0.0, "gpu": h100, "issue_intensity": 1.0,
          "clock_sensitive": True, "load_share": 0.2}
    assert demand_from_time(block=one, **kw).load_share == 0.2  # type: ignore[arg-type]
    assert demand_from_time(block=two, **kw).load_share == 0.0  # type: ignore[arg-type]


def test_a_shaped_gemm_counts_the_load_share_only_at_one_block_per_sm() -> None:
    """64x64 tiles (5 a H100 SM) padded to one a SM, 700 tiles on 132 SMs, s = 0.2, no fixed tile
    time. A lone tile runs at min(cap, 1) of its SM instead of 1/5, so it takes p1 = 0.2 / min(cap, 1)
    of a full wave's time. Natural: a full wave of 5 a SM, then 40 lone tiles (no load share at 5
    a SM): 1 + p1 wave times. Shaped: 5 full waves of lone tiles, then 40 on 40 of 132 SMs,
    1 - 0.2 * 92/132 as long: (5 + 1 - 0.2 * 92/132) * p1 wave times."""
    h100 = load_gpu("h100-sxm5-80gb")
    p = load_calibration(h100, "h100-sxm5-80gb").params.merged(
        {"gemm_efficiency": {"fp16": 0.8}, "gemm_tile_overhead_s": {"fp16": 0.0}, "gemm_load_share": 0.2})
    kw = {"tile": (64, 64, 32), "threads": 128, "registers_per_thread": 96, "stages": 3}
    natural = gemm(64 * 28, 64 * 25, 8192, "fp16", h100, p, **kw)  # type: ignore[arg-type]
    shaped = gemm(64 * 28, 64 * 25, 8192, "fp16", h100, p, extra_shared_mem_bytes=92160, **kw)  # type: ignore[arg-type]
    assert (blocks_per_sm(natural.block, h100), blocks_per_sm(shaped.block, h100), natural.blocks) == (5, 1, 700)
    cap = shaped.issue_cap if shaped.issue_cap is not None else shaped.issue_fraction
    p1 = 0.2 / max(0.2, min(cap, 1.0))
    ratio = (5 + 1 - 0.2 * 92 / 132) * p1 / (1 + p1)
    # Compute-bound: 5 tiles of 2*64*64*8192 FLOP a wave beside 117 MB of operands.
    assert (shaped.isolated_s - p.kernel_overhead_s) == pytest.approx(
        (natural.isolated_s - p.kernel_overhead_s) * ratio, rel=1e-9)


def test_best_gemm_answers_by_the_content_of_its_inputs() -> None:
    """best_gemm remembers its answers: the same shape on equal parameters (a new object, as every
    prediction loads them) gives the answer of a fresh search, and parameters that differ give
    their own."""
    from ovsim.models.gemm_library import _best_gemm

    h100 = load_gpu("h100-sxm5-80gb")
    p = load_calibration(h100, "h100-sxm5-80gb").params
    first = best_gemm(4096, 3584, 8192, "bf16", h100, p)
    again = best_gemm(4096, 3584, 8192, "bf16", h100, load_calibration(h100, "h100-sxm5-80gb").params)
    assert again == first == _best_gemm(4096, 3584, 8192, "bf16", h100, p, 0, 1, None, None)
    slower = p.merged({"gemm_efficiency": {k: v / 2 for k, v in p.gemm_efficiency.items()}})
    assert best_gemm(4096, 3584, 8192, "bf16", h100, slower).isolated_s > first.isolated_s


@pytest.mark.parametrize(("gpu", "shape"), [
    ("h100-sxm5-80gb", (4096, 4096, 4096)), ("h100-sxm5-80gb", (16, 8192, 8192)),
    ("h100-sxm5-80gb", (512, 512, 65536)), ("a100-sxm4-80gb", (8192, 1024, 4096)),
    ("a100-sxm4-80gb", (256, 256, 32768))])
def test_best_gemm_is_the_demand_gemm_makes_of_its_kernel(gpu: str, shape: tuple[int, int, int]) -> None:
    """The library's choice is made on the kernels' times alone; the demand it returns is the one
    cost.gemm makes of the chosen kernel, persistence, clusters and K split included."""
    spec = load_gpu(gpu)
    p = load_calibration(spec, gpu).params
    m, n, k = shape
    d = best_gemm(m, n, k, "bf16", spec, p)
    made = [gemm(m, n, k, "bf16", spec, p, tile=kern.tile, threads=kern.threads,
                 registers_per_thread=kern.registers_per_thread, stages=kern.stages, split_k=split,
                 persistent=kern.persistent, cluster_ctas=kern.cluster)
            for kern in library_gemm_kernels(spec, "bf16") for split in (1, 2, 4, 8, 16) if k >= split * kern.tile[2]]
    assert d in made


def test_an_occupancy_asked_again_is_refused_again() -> None:
    h100 = load_gpu("h100-sxm5-80gb")
    bad = BlockShape(2048, 32, 0)  # more threads than a block may have
    for _ in range(2):
        with pytest.raises(OvsimError, match="threads per block"):
            blocks_per_sm(bad, h100)
    assert blocks_per_sm(BlockShape(128, 32, 100_000), h100) == blocks_per_sm(BlockShape(128, 32, 100_000), h100) == 2


def _every_kernel_priced(m: int, n: int, k: int, spec: GpuSpec, p: Parameters, extra: int,
                         sm_count: int | None) -> KernelDemand:
    """The choice made by pricing every library kernel and split in the listed order, the first of
    the least time kept (best_gemm prices only those that can win)."""
    best = None
    for kern in library_gemm_kernels(spec, "bf16"):
        tm, tn, tk = kern.tile
        if (tm < 64 and m > tm) or (tn < 64 and n > tn):
            continue
        for split in (1, 2, 4, 8, 16):
            if split > 1 and k < split * tk:
                continue
            try:
                d = gemm(m, n, k, "bf16", spec, p, tile=kern.tile, threads=kern.threads,
                         registers_per_thread=kern.registers_per_thread, stages=kern.stages, split_k=split,
                         extra_shared_mem_bytes=extra, sm_count=sm_count, persistent=kern.persistent,
                         cluster_ctas=kern.cluster)
            except OvsimError:
                break
            if best is None or d.isolated_s < best.isolated_s:
                best = d
    assert best is not None
    return best


@pytest.mark.parametrize("gpu", ["h100-sxm5-80gb", "a100-sxm4-80gb"])
def test_best_gemm_prices_only_what_can_win_and_chooses_as_pricing_all_would(gpu: str) -> None:
    """Over shapes from one row to many waves, skinny and deep, padded (which can leave kernels
    fewer blocks an SM, or none) and planned for fewer SMs, the kernel best_gemm picks is the one
    pricing every kernel and split would pick, ties to the first listed."""
    from ovsim.models.gemm_library import _best_gemm

    spec = load_gpu(gpu)
    p = load_calibration(spec, gpu).params
    dims = (1, 17, 64, 128, 1000, 4096, 12288)
    for i, (m, n, k) in enumerate(itertools.product(dims, dims, (64, 4096, 65536))):
        extra = (0, 0, 40_000, 60_000)[i % 4]
        sm_count = (None, None, None, 100)[i // 4 % 4]
        assert _best_gemm(m, n, k, "bf16", spec, p, extra, 1, None, sm_count) == _every_kernel_priced(
            m, n, k, spec, p, extra, sm_count), (m, n, k, extra, sm_count)


@pytest.mark.parametrize("gpu_name", ["a100-sxm4-80gb", "h100-sxm5-80gb"])
def test_the_library_bounds_on_arrays_are_the_scalar_formulas_to_the_bit(gpu_name: str) -> None:
    """The lower bounds a library choice prices every kernel and split with, worked out on arrays
    (gemm_isolated_times), are gemm_isolated_s of gemm_main_loop, pair by pair, bit for bit: the
    choice must not depend on which of the two ran. Shapes: powers of two, odd sizes, one row,
    batches, splits of K the library chooses or is given, extra shared memory and a carve-out's
    fewer SMs; and a K past 2**53, where float64 quotients are not Python's."""
    from ovsim.models import gemm_library as gl
    from ovsim.models.cost import element_bytes, gemm_isolated_s, gemm_main_loop, gemm_rate

    gpu = load_gpu(gpu_name)
    params = load_calibration(gpu, gpu_name).params
    shapes = [(4096, 4096, 4096), (1, 32768, 8192), (8192, 1280, 5120), (77, 1000, 333), (16384, 6144, 768),
              (96, 96, 65536), (3, 7, 11), (1, 1, 24747656999474707)]
    checked = 0
    for (m, n, k), precision, batch, extra, sms, split_k in itertools.product(
            shapes, ["bf16", "fp32", "fp8"] if gpu_name.startswith("h100") else ["bf16", "fp32"],
            [1, 3], [0, 40_000], [None, 100], [None, 3]):
        pairs = gl._pairs(m, n, k, gpu, precision, split_k)
        got = gl._least_s(pairs, m, n, k, precision, gpu, params, extra, batch, sms)
        rate = gemm_rate(n, k, precision, gpu, params, None)
        eb = element_bytes(precision)
        for (kern, split), least in zip(pairs, got, strict=True):
            occ = gl._occupancy_unpadded(kern, gpu, eb, extra)
            want = 0.0 if occ == 0 else gemm_isolated_s(
                m, n, k, kern.tile, batch, split, eb,
                gemm_main_loop(m, n, k, kern.tile, occ, batch, split, sms or gpu.sm.count, *rate)[4], gpu, params)[0]
            assert least == want, (m, n, k, precision, kern, split)
            checked += 1
    assert checked > 1000
