"""Property tests over random workloads (hypothesis): resource limits hold at every event, the
makespan respects the lower bounds, an added op changes nothing before it is ready and slows
single-stream SM-bound programs only, fast-forwarding waves and leaving coupled GPUs as they are
change nothing, runs are deterministic.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ovsim.engine.analytic import analytic_timeline
from ovsim.engine.machine import build_machine
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import SystemSpec, load_gpu
from ovsim.models.ir import BlockShape, FlowDemand, KernelDemand, Op, StreamSpec, Workload
from ovsim.models.occupancy import alone_block_times

GPU = load_gpu("h100-sxm5-80gb")
PARAMS = load_calibration(GPU, "h100-sxm5-80gb").params
SYSTEM = SystemSpec.model_validate({"schema": "ovsim.system/1", "name": "t", "gpu": "h100-sxm5-80gb",
                                    "gpu_count": 4, "topology": "nvswitch", "sources": {"t": "test"}})
N_RANKS = 2
HBM = GPU.memory.bandwidth_bytes_per_s * PARAMS.hbm_achievable_fraction
TOL_S = 1e-9


@st.composite
def kernels(draw: Any, hbm: bool = True) -> KernelDemand:
    threads = draw(st.sampled_from([64, 128, 256, 512, 1024]))
    regs = draw(st.sampled_from([16, 32, 64, 96, 128]))
    while threads * regs > 65536:
        regs //= 2
    smem = draw(st.sampled_from([0, 8192, 49152, 100_000, 200_000]))
    blocks = draw(st.integers(1, 600))
    block_time = draw(st.floats(1e-6, 1e-4))
    mem_bound = draw(st.booleans())
    occ = max(1, min(2048 // threads, 65536 // max(1, threads * regs), 233472 // (smem + 1024), 32))
    issue = (0.2 if mem_bound else 1.0) / occ
    # Tiles faster on fewer busy SMs (KernelDemand.load_share): alone, its last wave's count too.
    load = draw(st.sampled_from([0.0, 0.0, 0.2])) if occ == 1 else 0.0
    iso = block_time * alone_block_times(blocks, occ, GPU.sm.count, issue, issue, load, GPU.sm.count)
    hbm_bytes = draw(st.floats(0.0, 0.95)) * HBM * iso if hbm else 0.0
    # Clusters of CTAs find fewer SMs beside held ones (the H100's placement units).
    cluster = draw(st.sampled_from([1, 1, 1, 2, 4]))
    return KernelDemand(blocks=blocks, block=BlockShape(threads, regs, smem), block_time_s=block_time,
                        issue_fraction=issue, hbm_bytes=hbm_bytes, flops=0.0, isolated_s=iso,
                        clock_sensitive=not mem_bound, cluster_ctas=cluster, load_share=load)


@st.composite
def workloads(draw: Any, kinds: tuple[str, ...] = ("kernel", "kernel", "collective", "copy"),
              stream_names: tuple[str, ...] = ("a", "b", "c"), hbm: bool = True) -> Workload:
    ops: list[Op] = []
    streams = [StreamSpec(r, s, draw(st.sampled_from([0, 0, -1]))) for r in range(N_RANKS) for s in ("a", "b", "c")]
    n = draw(st.integers(1, 8))
    for i in range(n):
        kind = draw(st.sampled_from(kinds))
        stream = draw(st.sampled_from(stream_names))
        delay = draw(st.sampled_from([0.0, 0.0, 5e-6, 3e-5]))
        if kind == "kernel":
            k = draw(kernels(hbm))
            for r in range(N_RANKS):
                ops.append(Op(f"k{i}@{r}", f"k{i}", "generic", r, stream, kernel=k, delay_s=delay * r))
        elif kind == "collective":
            ch = draw(st.integers(1, 32))
            flow = FlowDemand(group=f"c{i}", ranks=tuple(range(N_RANKS)), bytes=draw(st.floats(1e5, 1e9)),
                              latency_s=draw(st.floats(0.0, 3e-5)), rate_cap_bytes_per_s=draw(st.floats(5e10, 4e11)),
                              link_coeff=1.0, hbm_coeff=draw(st.floats(0.0, 3.0)) if hbm else 0.0)
            kd = KernelDemand(blocks=ch, block=BlockShape(544, 96, 82240), block_time_s=1.0, issue_fraction=1.0,
                              hbm_bytes=0.0, flops=0.0, isolated_s=1.0, clock_sensitive=False)
            for r in range(N_RANKS):
                ops.append(Op(f"c{i}@{r}", f"c{i}", "collective", r, stream, kernel=kd, flow=flow,
                              delay_s=delay * r))
        else:
            r = draw(st.integers(0, N_RANKS - 1))
            flow = FlowDemand(group=f"x{i}", ranks=(r,), bytes=draw(st.floats(1e5, 1e9)), latency_s=1e-6,
                              rate_cap_bytes_per_s=draw(st.floats(1e10, 4e11)), link_coeff=1.0, hbm_coeff=1.0,
                              pattern="p2p", endpoints=(r, 1 - r), uses_copy_engine=True)
            ops.append(Op(f"x{i}", f"x{i}", "transfer", r, stream, flow=flow, delay_s=delay))
    return Workload(ops=tuple(ops), streams=tuple(streams), n_ranks=N_RANKS)


def simulate(wl: Workload, fast_forward: bool = True, keep_coupled: bool = True) -> pd.DataFrame:
    machine = build_machine(SYSTEM, GPU, PARAMS, n_ranks=N_RANKS)
    return Engine(wl, machine, EngineOptions(check_invariants=True, fast_forward=fast_forward,
                                             keep_coupled=keep_coupled)).run().ops


def kd(blocks: int, threads: int, regs: int, smem: int, block_s: float, issue: float, iso_s: float) -> KernelDemand:
    """A kernel of ``blocks`` blocks of the shape given, each ``block_s`` alone, moving no HBM."""
    return KernelDemand(blocks=blocks, block=BlockShape(threads, regs, smem), block_time_s=block_s,
                        issue_fraction=issue, hbm_bytes=0.0, flops=0.0, isolated_s=iso_s, clock_sensitive=True)


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(workloads())
def test_limits_hold_and_makespan_respects_lower_bounds(wl: Workload) -> None:
    ops = simulate(wl)  # raises if an SM limit or channel is ever over-subscribed
    per_rank = ops[ops["rank"] >= 0]
    makespan = float(per_rank["end_s"].max())
    # Critical path: the no-contention (analytic) schedule is a lower bound.
    bound = analytic_timeline(wl).ops
    # Completions are detected within a picosecond of work, so bounds hold to a nanosecond.
    assert makespan >= float(bound[bound["rank"] >= 0]["end_s"].max()) - TOL_S
    # Busiest resource: each rank's SM work and HBM traffic need at least this long.
    for r in range(N_RANKS):
        sm_seconds = sum(op.kernel.blocks * op.kernel.block_time_s * op.kernel.issue_fraction
                         for op in wl.ops if op.rank == r and op.kernel is not None and op.flow is None)
        hbm_bytes = sum(op.kernel.hbm_bytes for op in wl.ops if op.rank == r and op.kernel is not None)
        assert makespan >= sm_seconds / GPU.sm.count - TOL_S
        assert makespan >= hbm_bytes / HBM - TOL_S
    # Nothing finishes faster than it would alone.
    assert (per_rank["duration_s"] >= per_rank["isolated_s"] - TOL_S).all()


@SETTINGS
@given(workloads(), kernels(), st.sampled_from([0.0, 1e-6, 2e-5, 1e-4, 3e-4]))
def test_an_added_op_changes_nothing_before_it_is_ready(wl: Workload, extra: KernelDemand, ready_s: float) -> None:
    """Causality: the engine never looks ahead, so an op that becomes ready at ``ready_s`` cannot
    move anything that started before then, nor anything that ended before then.

    The general property, "adding an op never makes another finish earlier", is false for this
    model and for real GPUs alike, and is asserted only where it holds (next test). Hypothesis finds,
    for example, an added kernel that fills every SM, so that a queued HBM-heavy kernel on rank 0 waits, and a
    concurrent HBM-heavy kernel on another stream gets the whole of HBM and finishes 13 us instead
    of 15 us after launch. Greedy list scheduling has the same anomalies (Graham, 1969).
    """
    base = simulate(wl).set_index("id")
    more = Workload(ops=(*wl.ops, Op("extra", "extra", "generic", 0, "d", kernel=extra, delay_s=ready_s)),
                    streams=(*wl.streams, StreamSpec(0, "d")), n_ranks=N_RANKS)
    after = simulate(more).set_index("id")
    started_before = base.index[base["start_s"] < ready_s - TOL_S]
    ended_before = base.index[base["end_s"] < ready_s - TOL_S]
    assert ((after.loc[started_before, "start_s"] - base.loc[started_before, "start_s"]).abs() <= TOL_S).all()
    assert ((after.loc[ended_before, "end_s"] - base.loc[ended_before, "end_s"]).abs() <= TOL_S).all()


@SETTINGS
@given(workloads(kinds=("kernel", "kernel", "collective"), stream_names=("a",), hbm=False), kernels(hbm=False),
       st.sampled_from([0.0, 1e-6, 2e-5, 1e-4]))
def test_a_concurrent_op_never_speeds_up_a_single_stream_program(wl: Workload, extra: KernelDemand,
                                                                 ready_s: float) -> None:
    """Where monotonicity does hold: each rank runs one stream of kernels and collectives that
    contend for SMs only, so nothing but the added op competes with a rank's work.

    Outside this domain hypothesis finds real counterexamples, so it is not asserted there: with
    HBM traffic, a memory-bound kernel with fewer blocks resident (the added kernel holds SMs) gets
    the same bandwidth on fewer blocks and its tail wave ends 23 ns earlier; with several streams,
    a kernel delayed by the added one leaves issue slots to a third kernel, which ends 0.7 us earlier.
    """
    base = simulate(wl).set_index("id")
    more = Workload(ops=(*wl.ops, Op("extra", "extra", "generic", 0, "d", kernel=extra, delay_s=ready_s)),
                    streams=(*wl.streams, StreamSpec(0, "d")), n_ranks=N_RANKS)
    after = simulate(more).set_index("id")
    assert (after.loc[base.index, "end_s"] >= base.loc[base.index, "end_s"] - TOL_S).all()


@SETTINGS
@given(workloads())
def test_runs_are_deterministic(wl: Workload) -> None:
    assert simulate(wl).equals(simulate(wl))


@SETTINGS
@given(workloads(kinds=("kernel", "kernel", "kernel", "collective", "copy")))
def test_fast_forwarding_waves_changes_no_timeline(wl: Workload) -> None:
    """Waves taken in one event are an optimisation only: every op's times and its slow-down
    attribution are those of the event-per-wave run, to float round-off."""
    fast = simulate(wl).set_index("id").sort_index()
    slow = simulate(wl, fast_forward=False).set_index("id").sort_index()
    for col in ("launch_s", "start_s", "end_s", "duration_s", "wait_sm_s", "share_sm_s", "share_hbm_s",
                "share_link_s", "wait_peers_s"):
        assert fast[col].to_numpy() == pytest.approx(slow[col].to_numpy(), rel=1e-9, abs=1e-15), col


@SETTINGS
@given(workloads(kinds=("kernel", "kernel", "collective", "collective", "copy")))
def test_leaving_coupled_gpus_as_they_are_changes_no_timeline(wl: Workload) -> None:
    """A GPU that a moving collective only couples to an event's GPU is left as it is where its
    rates do not move (RateSolver.solve_beside): every op's times and its slow-down attribution
    are those of the run that brings every coupled GPU up to date at every event, to round-off."""
    kept = simulate(wl).set_index("id").sort_index()
    full = simulate(wl, keep_coupled=False).set_index("id").sort_index()
    for col in ("launch_s", "start_s", "end_s", "duration_s", "wait_sm_s", "share_sm_s", "share_hbm_s",
                "share_link_s", "wait_peers_s"):
        assert kept[col].to_numpy() == pytest.approx(full[col].to_numpy(), rel=1e-9, abs=1e-15), col


def test_a_kernel_behind_a_fast_forwarded_one_dispatches_when_the_last_blocks_do() -> None:
    """Found by the property above: k2's waves were fast-forwarded up to its very last blocks, so
    nothing happened at the moment it had none left waiting, and k1 (same priority, launched later,
    held back by the leftover policy) started one wave late. It must start then, as without
    fast-forwarding."""
    ks = {"k0": ("a", kd(1, 64, 16, 0, 2.0**-14, 1 / 32, 2.0**-14)),
          "k1": ("a", kd(1, 64, 16, 0, 1e-6, 1 / 32, 1e-6)),
          "k2": ("c", kd(419, 64, 16, 200_000, 2.0935e-05, 1.0, 8.374e-05)),
          "k3": ("b", kd(384, 256, 96, 0, 2.0**-14, 0.5, 2.0**-13))}
    wl = Workload(ops=tuple(Op(n, n, "generic", 0, s, kernel=k) for n, (s, k) in ks.items()),
                  streams=(StreamSpec(0, "a", 0), StreamSpec(0, "b", -1), StreamSpec(0, "c", 0)), n_ranks=1)
    fast, slow = simulate(wl), simulate(wl, fast_forward=False)
    for col in ("start_s", "end_s"):
        assert fast[col].to_numpy() == pytest.approx(slow[col].to_numpy(), rel=1e-9, abs=1e-15), col


def test_a_wave_that_ends_at_an_event_leaves_the_layout_stepping_leaves() -> None:
    """Found by the local-solve property (test_coupled_local.py), reduced to one GPU: k8's waves,
    fast-forwarded, kept the entry of a wave that began at the event where k5's blocks left, so
    the blocks placed in k5's room became an entry of their own; stepped, they join the wave's
    blocks, and the SM groups merge. The groups' sizes decide where k8's last wave goes, and with
    it whether x (one 544-thread block with 82 KB of shared memory) finds an SM when k6 leaves:
    fast-forwarded it waited 14 us for k8's end. It must start when stepped, with k6's end."""
    # The drawn example's times (a 1-block k6 of 24.0 us, 1,188-block k5 and k8 of 38.0 us a wave).
    big = kd(1188, 512, 32, 0, 3.8045607641376125e-05, 0.025, 7.609121528275225e-05)
    ks = {"k0": ("a", kd(524, 128, 32, 0, 2.297987754162614e-05, 0.00625, 2.297987754162614e-05)),
          "c1": ("c", kd(10, 544, 96, 82240, 3.9e-4, 1.0, 3.9e-4)),
          "k3": ("b", kd(564, 128, 32, 0, 1.3914956454593353e-05, 0.00625, 1.3914956454593353e-05)),
          "k5": ("a", big), "k6": ("a", kd(1, 128, 32, 0, 2.399855326848475e-05, 0.00625, 2.399855326848475e-05)),
          "k8": ("b", big), "x": ("a", kd(1, 544, 96, 82240, 1e-5, 1.0, 1e-5))}
    wl = Workload(ops=tuple(Op(n, n, "generic", 0, s, kernel=k) for n, (s, k) in ks.items()),
                  streams=tuple(StreamSpec(0, s) for s in "abc"), n_ranks=1)
    fast, slow = simulate(wl), simulate(wl, fast_forward=False)
    for col in ("start_s", "end_s"):
        assert fast[col].to_numpy() == pytest.approx(slow[col].to_numpy(), rel=1e-9, abs=1e-15), col


@pytest.mark.parametrize("before_s", [1e-13, 5e-13, 9e-13])
def test_a_kernel_launched_just_before_a_wave_ends_gets_its_room_first(before_s: float) -> None:
    """The other side of the rule above: a fast-forwarded wave that ends a hair after an event
    (within the completion tolerance) ends at it, and a kernel of higher priority launched then
    takes the room its blocks leave, as stepped; it must not wait a whole wave (10 us) for it."""
    wave_s = 1e-5
    for waves in (3, 5):
        wl = Workload(ops=(Op("k", "k", "generic", 0, "a", kernel=kd(132 * 2 * 10, 1024, 32, 0, wave_s, 0.01, wave_s)),
                           Op("K", "K", "generic", 0, "h", kernel=kd(1, 1024, 32, 0, 2e-6, 0.01, 2e-6),
                              delay_s=waves * wave_s - before_s)),
                      streams=(StreamSpec(0, "a", 0), StreamSpec(0, "h", -1)), n_ranks=1)
        fast, slow = simulate(wl), simulate(wl, fast_forward=False)
        for col in ("start_s", "end_s"):
            assert fast[col].to_numpy() == pytest.approx(slow[col].to_numpy(), rel=1e-9, abs=1e-15), col
