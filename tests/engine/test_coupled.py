"""GPUs that a moving collective only couples to an event's GPU are left as they are where their
rates do not move (RateSolver.solve_beside): the same timeline as bringing every one of them up to
date at every event, with and without the power-limit loop."""

from __future__ import annotations

import pandas as pd
import pytest

from ovsim.engine.machine import build_machine
from ovsim.engine.power import PowerConfig
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.hw.calib import load_calibration
from ovsim.hw.power import PowerSettings, power_model
from ovsim.hw.spec import SystemSpec, load_gpu
from ovsim.models.ir import BlockShape, FlowDemand, KernelDemand, Op, StreamSpec, Workload

GPU = load_gpu("h100-sxm5-80gb")
PARAMS = load_calibration(GPU, "h100-sxm5-80gb").params
RANKS = 4
# An NCCL kernel's blocks (16 channels); its flow moves the data.
NCCL = KernelDemand(blocks=16, block=BlockShape(544, 96, 82240), block_time_s=1.0, issue_fraction=1.0,
                    hbm_bytes=0.0, flops=0.0, isolated_s=1.0, clock_sensitive=False)
SYSTEM = SystemSpec.model_validate({"schema": "ovsim.system/1", "name": "t", "gpu": "h100-sxm5-80gb",
                                    "gpu_count": RANKS, "topology": "nvswitch", "sources": {"t": "test"}})


def kernel(blocks: int, block_s: float, hbm_bytes: float) -> KernelDemand:
    return KernelDemand(blocks=blocks, block=BlockShape(256, 64, 0), block_time_s=block_s, issue_fraction=0.5,
                        hbm_bytes=hbm_bytes, flops=0.0, isolated_s=block_s * blocks / (4 * 132),
                        clock_sensitive=hbm_bytes == 0)


def workload() -> Workload:
    """Each rank runs its own mix of short kernels (a rank's kernels differ in size, so ranks drift
    apart) while all-reduces, each after a few kernels, move data across all four."""
    ops: list[Op] = []
    for r in range(RANKS):
        prev = ""
        for i in range(24):
            if i % 6 == 5:
                flow = FlowDemand(group=f"ar{i}", ranks=tuple(range(RANKS)), bytes=64e6, latency_s=5e-6,
                                  rate_cap_bytes_per_s=1.5e11, link_coeff=1.5, hbm_coeff=3.0)
                ops.append(Op(f"ar{i}@{r}", "allreduce", "collective", r, "comm", deps=(prev,), kernel=NCCL,
                              flow=flow))
                continue
            k = kernel(528 * (1 + (i + r) % 3), 2e-6 * (1 + r % 2), 2e8 * ((i + r) % 2))
            prev = f"k{i}@{r}"
            ops.append(Op(prev, f"k{i}", "generic", r, "compute", kernel=k, delay_s=1e-6 * r * (i % 4 == 0)))
    streams = tuple(StreamSpec(r, s) for r in range(RANKS) for s in ("compute", "comm"))
    return Workload(ops=tuple(ops), streams=streams, n_ranks=RANKS)


def run(keep: bool, power: bool) -> tuple[pd.DataFrame, Engine]:
    machine = build_machine(SYSTEM, GPU, PARAMS, n_ranks=RANKS)
    pc = PowerConfig(model=power_model(GPU, PARAMS), settings=PowerSettings()) if power else None
    engine = Engine(workload(), machine, EngineOptions(check_invariants=True, keep_coupled=keep, power=pc))
    return engine.run().ops.set_index("id").sort_index(), engine


@pytest.mark.parametrize("power", [False, True])
def test_coupled_gpus_left_as_they_are_give_the_same_timeline(power: bool) -> None:
    kept, engine = run(True, power)
    full, reference = run(False, power)
    # Both ways were taken: GPUs left as they were, and brought in where a flow's rate moved.
    assert engine.coupled_kept > 0 and engine.coupled_solved > 0
    assert reference.coupled_kept == 0
    for col in ("start_s", "end_s", "wait_sm_s", "share_sm_s", "share_hbm_s", "share_link_s", "wait_peers_s"):
        assert kept[col].to_numpy() == pytest.approx(full[col].to_numpy(), rel=1e-9, abs=1e-15), col


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("rank_first", [0, 1])
def test_what_a_coupled_gpu_releases_at_an_instant_launches_in_program_order(keep: bool, rank_first: int) -> None:
    """K ends on both ranks at the same instant while an all-reduce couples them. On rank 1, Y (a
    full GPU of blocks, after K@1 on its stream) and X (after K@0, on another stream) are released
    then; Y comes first in the program, so Y launches first and takes the SMs, whichever rank's
    timer fires first (the engine's rule: ops released at one instant launch in workload order).
    Found by review: rank 0's releases once launched before rank 1's K was retired."""
    flow = FlowDemand(group="ar", ranks=(0, 1), bytes=4e9, latency_s=0.0, rate_cap_bytes_per_s=1.5e11,
                      link_coeff=1.5, hbm_coeff=3.0)
    ops: list[Op] = []
    for r in (rank_first, 1 - rank_first):
        ops.append(Op(f"K@{r}", "k", "generic", r, "compute", kernel=kernel(100, 1e-5, 0.0)))
        ops.append(Op(f"ar@{r}", "allreduce", "collective", r, "comm", kernel=NCCL, flow=flow))
    ops.append(Op("Y", "y", "generic", 1, "compute", kernel=kernel(132 * 40, 1e-5, 0.0)))
    ops.append(Op("X", "x", "generic", 1, "x", deps=("K@0",), kernel=kernel(132 * 40, 2e-5, 0.0)))
    wl = Workload(ops=tuple(ops), streams=tuple(StreamSpec(r, s) for r in (0, 1) for s in ("compute", "comm", "x")),
                  n_ranks=2)
    machine = build_machine(SYSTEM, GPU, PARAMS, n_ranks=2)
    t = Engine(wl, machine, EngineOptions(check_invariants=True, keep_coupled=keep)).run().ops.set_index("id")
    assert t.loc["Y", "start_s"] == pytest.approx(t.loc["K@1", "end_s"], abs=1e-12)
    assert t.loc["X", "start_s"] > t.loc["Y", "start_s"] + 1e-5


def test_a_finished_engine_is_freed_without_the_cyclic_collector() -> None:
    """The engine's objects form no reference cycle once a run is over (its flows' callbacks into
    it are dropped), so reference counting frees it, and all it holds, at once."""
    import gc

    # Counted among the collector's tracked objects, not by a weak reference: a compiled Engine
    # (OVSIM_COMPILE=1, docs/design.md) takes none.
    gc.collect()
    gc.disable()
    try:
        _, engine = run(keep=True, power=False)
        assert sum(isinstance(o, Engine) for o in gc.get_objects()) == 1
        del engine
        assert sum(isinstance(o, Engine) for o in gc.get_objects()) == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("power", [False, True])
def test_a_run_leaves_no_garbage_for_the_cyclic_collector(power: bool) -> None:
    """Whatever an engine made (kernels, flows, their members, events) is freed by reference
    counting as it finishes: nothing is left in reference cycles for the cyclic collector, whose
    pass over them cost about 8% of a run once the run paused it (bench/engine_bench.py: 65,000
    objects of 5,000 collectives). Found by profiling: a finished flow's members held its kernels,
    which held the flow."""
    import gc

    gc.collect()
    gc.disable()
    try:
        run(keep=True, power=power)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_flows_through_one_nic_port_share_it_under_rank_symmetry() -> None:
    """Two transfers between nodes, on different simulated GPUs that share a NIC (4 NICs for 8
    GPUs a node), run through one port whose number (8) is not a simulated rank's (4 are
    simulated, standing for ranks 8, 9, 16 and 17). Each alone would take 12.5 ms; the two move
    1 GB through one 50 GB/s port, which takes at least 20 ms (found by review: the port was left
    out of the flows' coupling, and each ran as if it had the port alone, done at 13.5 ms)."""
    system = SystemSpec.model_validate({
        "schema": "ovsim.system/1", "name": "t", "gpu": "h100-sxm5-80gb", "gpu_count": 8, "topology": "nvswitch",
        "nodes": 3, "sources": {"t": "test"},
        "network": {"kind": "infiniband", "nics_per_node": 4, "bandwidth_per_nic_bytes_per_s": 5e10}})
    machine = build_machine(system, GPU, PARAMS, n_ranks=4, job_ranks=(8, 9, 16, 17))
    ops: list[Op] = []
    for group, (src, dst) in {"f": (0, 2), "g": (1, 3)}.items():
        flow = FlowDemand(group=group, ranks=(src, dst), bytes=5e8, latency_s=0.0, rate_cap_bytes_per_s=4e10,
                          link_coeff=1.0, hbm_coeff=1.0, pattern="p2p", endpoints=(src, dst))
        for r in (src, dst):
            ops.append(Op(f"{group}@{r}", group, "collective", r, "comm", kernel=NCCL, flow=flow,
                          delay_s=1e-3 if group == "g" else 0.0))
    wl = Workload(ops=tuple(ops), streams=tuple(StreamSpec(r, "comm") for r in range(4)), n_ranks=4)
    for keep in (True, False):
        t = Engine(wl, machine, EngineOptions(check_invariants=True, keep_coupled=keep)).run().ops.set_index("id")
        assert t.loc["g@1", "end_s"] >= 0.020
        assert t.loc["f@0", "end_s"] > 0.0125 + 1e-3
