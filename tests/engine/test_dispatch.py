"""The block dispatcher as a part of its own (ovsim.engine.dispatch): placement, retirement and
fast-forwarded waves on one GPU's SMs, without the event loop.

Expected values are closed forms from the H100's SM limits (132 SMs; 2048 threads, 65,536
registers, 228 KB of shared memory and 32 blocks per SM), not outputs of the dispatcher.
"""

from __future__ import annotations

from ovsim.engine import dispatch
from ovsim.engine.machine import build_machine
from ovsim.engine.state import GpuState, KernelSpec, KernelState, check_sms
from ovsim.hw.calib import Calibration
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.models.ir import BlockShape, KernelDemand, Op


def _gpu(system: SystemSpec, gpu: GpuSpec, calib: Calibration) -> GpuState:
    return GpuState(0, build_machine(system, gpu, calib.params, n_ranks=1).gpus[0])


def _kernel(g: GpuState, name: str, blocks: int, threads: int, seq: int, priority: int = 0) -> KernelState:
    demand = KernelDemand(blocks=blocks, block=BlockShape(threads=threads, registers_per_thread=32,
                                                          shared_mem_bytes=0),
                          block_time_s=1e-3, issue_fraction=0.25, hbm_bytes=0.0, flops=1.0, isolated_s=1e-3)
    op = Op(name, name, "generic", 0, "s", kernel=demand)
    k = KernelState(op, g, priority, seq, 0.0, KernelSpec(op, g.model, 1.0, None, 0.0), 0, None)
    g.pending.append(k)
    g.running.append(k)
    return k


def test_a_grid_fills_every_sm_to_its_thread_limit_and_waits_for_the_rest(
        h100: GpuSpec, h100_calib: Calibration, h100_node: SystemSpec) -> None:
    """1024-thread blocks: 2048 / 1024 = 2 per SM, so 264 of 600 blocks resident at once."""
    g = _gpu(h100_node, h100, h100_calib)
    k = _kernel(g, "a", 600, 1024, 1)
    dispatch.dispatch(g, 0.0)
    assert (k.resident, k.undispatched) == (2 * 132, 600 - 2 * 132)
    check_sms(g)


def test_a_later_kernel_waits_while_an_earlier_one_has_blocks_waiting(
        h100: GpuSpec, h100_calib: Calibration, h100_node: SystemSpec) -> None:
    """1536-thread blocks of a fit once per SM and leave 512 threads free, room for two of b's
    256-thread blocks per SM: b takes them only once a has no block left waiting."""
    g = _gpu(h100_node, h100, h100_calib)
    a = _kernel(g, "a", 1000, 1536, 1)
    b = _kernel(g, "b", 1000, 256, 2)
    dispatch.dispatch(g, 0.0)
    assert (a.resident, b.resident) == (132, 0)

    g = _gpu(h100_node, h100, h100_calib)
    a = _kernel(g, "a", 100, 1536, 1)
    b = _kernel(g, "b", 1000, 256, 2)
    dispatch.dispatch(g, 0.0)
    # a on 100 SMs; b fills the 32 idle SMs (2048 / 256 = 8 each) and 2 beside each of a's.
    assert (a.resident, b.resident) == (100, 32 * 8 + 100 * 2)
    check_sms(g)


def test_retire_frees_finished_blocks_and_reports_the_finished_kernel(
        h100: GpuSpec, h100_calib: Calibration, h100_node: SystemSpec) -> None:
    g = _gpu(h100_node, h100, h100_calib)
    k = _kernel(g, "a", 100, 256, 1)
    dispatch.dispatch(g, 0.0)
    assert dispatch.retire(g, 1.0, 1e-12) is None  # no rate yet: nothing can have finished
    for grp in g.groups:
        for e in grp.entries:
            e.rate, e.remaining = 1.0, 0.0
    assert dispatch.retire(g, 1.0, 1e-12) == [k]
    assert k.resident == 0 and g.running == []
    assert sum(grp.n_sms for grp in g.groups) == 132 and all(not grp.entries for grp in g.groups)
    check_sms(g)


def test_interleave_hands_out_whole_waves_in_the_order_they_end() -> None:
    """Groups of 10 and 20 SMs whose current waves end at 1 s and 2 s, then every 1 s and 2 s:
    waves are given in the order they end, up to the first end that finds too few blocks
    (counted by hand below)."""
    # 45 blocks: t=1 group 0 takes 10 (35 left); t=2 both end: 30 needed, 5 left after;
    # t=3 group 0 needs 10 > 5: stop. Group 0 got 2 waves, group 1 one.
    assert dispatch.interleave([10, 20], [1.0, 2.0], [1.0, 2.0], 45, keep_last=False) == [2, 1]
    # keep_last: the wave that would take exactly the last blocks is left to an event.
    assert dispatch.interleave([10], [1.0], [1.0], 30, keep_last=True) == [2]
    assert dispatch.interleave([10], [1.0], [1.0], 30, keep_last=False) == [3]


def test_the_closed_form_skip_matches_wave_by_wave_counting() -> None:
    sizes, first, period = [7, 13], [0.3, 0.9], [1.0, 1.7]
    blocks = 100_000
    given, ends, left = dispatch.skip_waves(sizes, first, period, blocks)
    assert sum(n * w for n, w in zip(sizes, given, strict=True)) == blocks - left
    # Every skipped wave ends before any that the loop still settles.
    assert all(e >= f + (w - 1) * p for e, f, w, p in zip(ends, first, given, period, strict=True))
    # The result equals counting one wave end at a time.
    assert dispatch.interleave(sizes, first, period, blocks) == _slow_interleave(sizes, first, period, blocks)


def _slow_interleave(sizes: list[int], first: list[float], period: list[float], blocks: int) -> list[int]:
    given = [0] * len(sizes)
    ends = list(first)
    while True:
        t = min(ends)
        tie = [i for i, x in enumerate(ends) if x <= t + 1e-9 * max(t, 1e-9)]
        need = sum(sizes[i] for i in tie)
        if need >= blocks:
            return given
        blocks -= need
        for i in tie:
            given[i] += 1
            ends[i] += period[i]
