"""Engine behaviour of GEMM tiles beside SMs another kernel holds (docs/design.md, "Kernels and
SMs"): persistent GEMMs' late CTAs, 2-CTA clusters stranded by held SMs, and tiles on fewer SMs
running faster by their load share. Expected values are closed forms computed here, as in
test_sim.py.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from test_sim import run

from ovsim.hw.calib import Calibration
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.models import cost
from ovsim.models.ir import BlockShape, KernelDemand, Op, StreamSpec


def _holding_kernel(sms: int, duration_s: float) -> KernelDemand:
    """One small block per SM with all of the SM's shared memory: no GEMM block fits beside it."""
    block = BlockShape(threads=32, registers_per_thread=16, shared_mem_bytes=227 * 1024)
    return KernelDemand(blocks=sms, block=block, block_time_s=duration_s, issue_fraction=0.01, hbm_bytes=0.0,
                        flops=0.0, isolated_s=duration_s)


TILE_S = 1e-5


def _persistent_gemm(tiles: int) -> KernelDemand:
    """cuBLAS's Hopper GEMM as the engine sees it: one 384-thread block per SM, 132 CTAs looping
    over ``tiles`` tiles of TILE_S each."""
    block = BlockShape(threads=384, registers_per_thread=168, shared_mem_bytes=200 * 1024)
    return KernelDemand(blocks=tiles, block=block, block_time_s=TILE_S, issue_fraction=1.0, hbm_bytes=0.0,
                        flops=0.0, isolated_s=math.ceil(tiles / 132) * TILE_S, persistent_ctas=132)


@pytest.mark.parametrize(("tiles", "held", "rounds"), [
    (512, 0, 4),  # alone: ceil(512 / 132)
    (512, 1, 5),  # ceil(511 / 131) = 4, then the late CTA's first tile
    (512, 8, 6),  # ceil(504 / 124) = 5, then one more round
    (384, 1, 4),  # ceil(383 / 131) = 3, then one more
    (128, 1, 1),  # 128 CTAs fit on 131 SMs: none late
])
def test_a_persistent_gemm_runs_the_first_tiles_of_ctas_that_found_no_sm_after_the_rest(
        tiles: int, held: int, rounds: int, h100: GpuSpec, h100_calib: Calibration, h100_node: SystemSpec) -> None:
    """Closed form of the rule the engine keeps for persistent kernels (KernelDemand.persistent_ctas):
    the resident CTAs share the tiles in rounds over the SMs they hold, and each CTA that found no SM
    runs its first tile after them. Measured on cuBLAS's Hopper GEMMs beside SM-holding kernels:
    4096^3 (512 tiles) x1.25 with one SM held, 2048x6144x2048 (384 tiles) x1.33
    (calibration/data/h100-sxm5-80gb/2026-11-27-b, h200-sxm/2026-11-27-c)."""
    ops = [Op("g", "g", "gemm", 0, "compute", kernel=_persistent_gemm(tiles), delay_s=1e-6)]
    if held:
        ops.append(Op("h", "h", "generic", 0, "hold", kernel=_holding_kernel(held, 1.0)))
    out = run(ops, [StreamSpec(0, "compute"), StreamSpec(0, "hold")], h100_node, h100, h100_calib)
    assert out.loc["g", "duration_s"] == pytest.approx(rounds * TILE_S, rel=1e-6)


def test_a_late_cta_that_finds_an_sm_freed_midway_joins_the_rest(h100: GpuSpec, h100_calib: Calibration,
                                                                 h100_node: SystemSpec) -> None:
    """A hold that ends during the second round frees its SM for the late CTA, which runs its first
    tile among the others: the 4 rounds of the GEMM alone, where a hold for the whole GEMM costs a
    fifth (the test above)."""
    ops = [Op("h", "h", "generic", 0, "hold", kernel=_holding_kernel(1, 1.5 * TILE_S)),
           Op("g", "g", "gemm", 0, "compute", kernel=_persistent_gemm(512), delay_s=1e-9)]
    out = run(ops, [StreamSpec(0, "compute"), StreamSpec(0, "hold")], h100_node, h100, h100_calib)
    assert out.loc["g", "duration_s"] == pytest.approx(4 * TILE_S, rel=1e-3)


def _cluster_kernel(blocks: int, cluster: int, block_s: float = TILE_S) -> KernelDemand:
    """One 384-thread block per SM in clusters of ``cluster`` (cuBLAS's Hopper GEMMs launch 2)."""
    block = BlockShape(threads=384, registers_per_thread=168, shared_mem_bytes=200 * 1024)
    return KernelDemand(blocks=blocks, block=block, block_time_s=block_s, issue_fraction=1.0, hbm_bytes=0.0,
                        flops=0.0, isolated_s=math.ceil(blocks / 132) * block_s, cluster_ctas=cluster)


@pytest.mark.parametrize(("held", "cluster", "blocks", "waves"), [
    (4, 1, 128, 1),  # 128 SMs for 128 blocks
    (4, 2, 128, 2),  # the 4 held SMs strand their 4 TPC partners: 124 SMs, a second wave
    (4, 2, 124, 1),
    (8, 2, 124, 1),  # the next 4 fill those TPCs: nothing stranded, 124 SMs
    (16, 2, 116, 2),  # 8 more, one in each GPC: 8 stranded, 108 SMs
    (16, 2, 108, 1),
])
def test_sms_held_by_a_kernel_launched_on_an_idle_gpu_strand_sms_for_clusters(
        held: int, cluster: int, blocks: int, waves: int, h100: GpuSpec, h100_calib: Calibration,
        h100_node: SystemSpec) -> None:
    """Measured on an H200 (calibration/data/README.md, "Where 2-block clusters go"): a kernel holding
    1-4 SMs launched plainly on an idle GPU takes one SM in each of four single-TPC units, and
    2-CTA clusters lose the other SM of each; cuBLAS's 128-tile GEMMs ran x1.8-1.9 beside 4 held
    SMs (calibration/data/h200-sxm/2026-11-27-c)."""
    ops = [Op("h", "h", "generic", 0, "hold", kernel=_holding_kernel(held, 1.0)),
           Op("g", "g", "gemm", 0, "compute", kernel=_cluster_kernel(blocks, cluster), delay_s=1e-6)]
    out = run(ops, [StreamSpec(0, "compute"), StreamSpec(0, "hold")], h100_node, h100, h100_calib)
    assert out.loc["g", "duration_s"] == pytest.approx(waves * TILE_S, rel=1e-6)


def test_a_kernel_that_took_sms_a_cluster_kernel_left_strands_none(h100: GpuSpec, h100_calib: Calibration,
                                                                   h100_node: SystemSpec) -> None:
    """A 4-block kernel launched while a cluster kernel fills every SM starts on SMs its clusters
    free, two of a TPC at a time: the next 128-block cluster kernel finds 128 SMs, one wave."""
    ops = [Op("a", "a", "gemm", 0, "compute", kernel=_cluster_kernel(132, 2)),
           Op("h", "h", "generic", 0, "hold", kernel=_holding_kernel(4, 1.0), delay_s=0.5 * TILE_S),
           Op("g", "g", "gemm", 0, "compute", kernel=_cluster_kernel(128, 2))]
    out = run(ops, [StreamSpec(0, "compute"), StreamSpec(0, "hold")], h100_node, h100, h100_calib)
    assert out.loc["h", "start_s"] == pytest.approx(out.loc["a", "end_s"])
    assert out.loc["g", "duration_s"] == pytest.approx(TILE_S, rel=1e-6)


LOAD = 0.2


@pytest.mark.parametrize("held", [1, 8, 33, 66])
def test_tiles_on_fewer_sms_run_faster_by_their_load_share(held: int, h100: GpuSpec, h100_calib: Calibration,
                                                          h100_node: SystemSpec) -> None:
    """Closed form of KernelDemand.load_share: 132 blocks of one per SM beside a kernel that holds
    ``held`` SMs for the whole run. The first wave, on 132 - held SMs, runs 1 / (1 - s * held / 132)
    times faster than a full one; the second, its ``held`` blocks alone on as many SMs,
    1 / (1 - s * (132 - held) / 132): together (2 - s) block times, whatever is held."""
    gemm = replace(_cluster_kernel(132, 1), load_share=LOAD)
    ops = [Op("h", "h", "generic", 0, "hold", kernel=_holding_kernel(held, 1.0)),
           Op("g", "g", "gemm", 0, "compute", kernel=gemm, delay_s=1e-6)]
    out = run(ops, [StreamSpec(0, "compute"), StreamSpec(0, "hold")], h100_node, h100, h100_calib)
    assert out.loc["g", "duration_s"] == pytest.approx((2 - LOAD) * TILE_S, rel=1e-6)


def test_tiles_of_two_kernels_count_each_others_sms(h100: GpuSpec, h100_calib: Calibration,
                                                    h100_node: SystemSpec) -> None:
    """The load is the SMs running any such kernel's blocks: two 66-block kernels side by side keep
    every SM busy and run at a full wave's pace, where one alone on 66 SMs runs 1 / (1 - s / 2)
    times faster."""
    half = replace(_cluster_kernel(66, 1), load_share=LOAD)
    both = run([Op("a", "a", "gemm", 0, "s1", kernel=half), Op("b", "b", "gemm", 0, "s2", kernel=half)],
               [StreamSpec(0, "s1"), StreamSpec(0, "s2")], h100_node, h100, h100_calib)
    one = run([Op("a", "a", "gemm", 0, "s1", kernel=half)], [StreamSpec(0, "s1")], h100_node, h100, h100_calib)
    assert both.loc["a", "duration_s"] == pytest.approx(TILE_S, rel=1e-6)
    assert both.loc["b", "duration_s"] == pytest.approx(TILE_S, rel=1e-6)
    assert one.loc["a", "duration_s"] == pytest.approx((1 - LOAD / 2) * TILE_S, rel=1e-6)


@pytest.mark.parametrize("blocks", [132, 200, 264, 301])
def test_a_kernel_with_a_load_share_alone_takes_its_isolated_time(blocks: int, h100: GpuSpec,
                                                                  h100_calib: Calibration,
                                                                  h100_node: SystemSpec) -> None:
    """cost.demand_from_time spreads the isolated time so that the last wave's faster tiles are
    counted: alone the kernel takes exactly its isolated time."""
    block = BlockShape(threads=384, registers_per_thread=168, shared_mem_bytes=200 * 1024)
    d = cost.demand_from_time(blocks=blocks, block=block, isolated_s=1e-3, flops=0.0, hbm_bytes=0.0, gpu=h100,
                              issue_intensity=1.0, clock_sensitive=True, load_share=LOAD)
    out = run([Op("g", "g", "gemm", 0, "s", kernel=d)], [StreamSpec(0, "s")], h100_node, h100, h100_calib)
    assert out.loc["g", "duration_s"] == pytest.approx(1e-3, rel=1e-9)
