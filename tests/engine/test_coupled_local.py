"""GPUs an event changed, solved alone beside the collectives that couple them to others
(ovsim.engine.coupled): on random workloads of four GPUs (switched, directly linked, or two nodes
joined by NICs), with collectives over all of them and over pairs, copies between GPUs and kernels
that load HBM, every op's times and its slow-down
attribution are those of the run that shares the channels of every coupled GPU at every event, to
round-off, and the channels' limits hold at every event."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ovsim.engine.machine import build_machine
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.engine.state import TIME_EPS
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import SystemSpec, load_gpu
from ovsim.models.ir import BlockShape, FlowDemand, KernelDemand, Op, StreamSpec, Workload

GPU = load_gpu("h100-sxm5-80gb")
PARAMS = load_calibration(GPU, "h100-sxm5-80gb").params
RANKS = 4
_BASE = {"schema": "ovsim.system/1", "name": "t", "gpu": "h100-sxm5-80gb", "sources": {"t": "test"}}
# One node switched, one node of direct links, and two nodes of two GPUs joined by NICs (whose
# channels are named by port, not by GPU).
SYSTEMS = [
    SystemSpec.model_validate({**_BASE, "gpu_count": RANKS, "topology": "nvswitch"}),
    SystemSpec.model_validate({**_BASE, "gpu_count": RANKS, "topology": "mesh", "links_per_pair": 4}),
    SystemSpec.model_validate({**_BASE, "gpu_count": 2, "topology": "nvswitch", "nodes": 2,
                               "network": {"kind": "infiniband", "nics_per_node": 2,
                                           "bandwidth_per_nic_bytes_per_s": 5e10}}),
]
HBM = GPU.memory.bandwidth_bytes_per_s
GROUPS = [(0, 1, 2, 3), (0, 1), (2, 3), (1, 2, 3)]
EXAMPLES = int(os.environ.get("OVSIM_COUPLED_EXAMPLES", "40"))


def channel_kernel(channels: int) -> KernelDemand:
    return KernelDemand(blocks=channels, block=BlockShape(544, 96, 82240), block_time_s=1.0, issue_fraction=1.0,
                        hbm_bytes=0.0, flops=0.0, isolated_s=1.0, clock_sensitive=False)


@st.composite
def kernel(draw: Any) -> KernelDemand:
    blocks = draw(st.integers(1, 1200))
    block_s = draw(st.floats(1e-6, 5e-5))
    threads = draw(st.sampled_from([128, 256, 512]))
    waves = max(1, blocks // (GPU.sm.count * (2048 // threads)))
    iso = block_s * waves
    return KernelDemand(blocks=blocks, block=BlockShape(threads, 32, 0), block_time_s=block_s,
                        issue_fraction=draw(st.sampled_from([0.1, 0.3, 1.0])) / (2048 // threads),
                        hbm_bytes=draw(st.floats(0.0, 1.2)) * HBM * iso, flops=0.0, isolated_s=iso,
                        clock_sensitive=draw(st.booleans()))


@st.composite
def scenarios(draw: Any) -> tuple[SystemSpec, Workload]:
    return draw(st.sampled_from(SYSTEMS)), draw(workloads())


@st.composite
def workloads(draw: Any) -> Workload:
    ops: list[Op] = []
    for i in range(draw(st.integers(4, 24))):
        kind = draw(st.sampled_from(["kernel", "kernel", "kernel", "collective", "collective", "copy"]))
        stream = draw(st.sampled_from(["a", "b", "c"]))
        if kind == "kernel":
            k = draw(kernel())
            for r in draw(st.sampled_from(GROUPS)):
                ops.append(Op(f"k{i}@{r}", f"k{i}", "generic", r, stream, kernel=k,
                              delay_s=draw(st.sampled_from([0.0, 0.0, 2e-6 * r]))))
        elif kind == "collective":
            group = draw(st.sampled_from(GROUPS))
            flow = FlowDemand(group=f"c{i}", ranks=group, bytes=draw(st.floats(1e5, 5e8)),
                              latency_s=draw(st.sampled_from([0.0, 5e-6])),
                              rate_cap_bytes_per_s=draw(st.floats(5e10, 4e11)), link_coeff=1.5,
                              hbm_coeff=draw(st.sampled_from([0.0, 1.0, 3.0])),
                              protocol=draw(st.sampled_from(["", "simple"])))
            kd = channel_kernel(draw(st.integers(1, 32)))
            for r in group:
                ops.append(Op(f"c{i}@{r}", f"c{i}", "collective", r, stream, kernel=kd, flow=flow))
        else:
            src = draw(st.integers(0, RANKS - 1))
            dst = draw(st.integers(0, RANKS - 2))
            dst += dst >= src
            flow = FlowDemand(group=f"x{i}", ranks=(src,), bytes=draw(st.floats(1e5, 5e8)), latency_s=1e-6,
                              rate_cap_bytes_per_s=draw(st.floats(1e10, 4e11)), link_coeff=1.0, hbm_coeff=1.0,
                              pattern="p2p", endpoints=(src, dst), uses_copy_engine=True)
            ops.append(Op(f"x{i}", f"x{i}", "transfer", src, stream, flow=flow))
    streams = tuple(StreamSpec(r, s) for r in range(RANKS) for s in ("a", "b", "c"))
    return Workload(ops=tuple(ops), streams=streams, n_ranks=RANKS)


def run(system: SystemSpec, wl: Workload, keep: bool) -> tuple[pd.DataFrame, dict[tuple[int, str], float], Engine]:
    """The ops, each counter's integral over the run by (rank, counter), and the engine."""
    machine = build_machine(system, GPU, PARAMS, n_ranks=RANKS)
    engine = Engine(wl, machine, EngineOptions(check_invariants=True, keep_coupled=keep))
    timeline = engine.run()
    end = timeline.makespan_s
    integrals: dict[tuple[int, str], float] = {}
    for (rank, name), rows in timeline.counters.groupby(["rank", "counter"]):
        t = rows["time_s"].to_numpy()
        integrals[(int(rank), str(name))] = float(np.sum(rows["value"].to_numpy() * np.diff(t, append=end)))
    return timeline.ops.set_index("id").sort_index(), integrals, engine


LOCAL = {"runs": 0, "local": 0}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fresh_gpus_solved_alone_give_the_full_solves_timeline(scenario: tuple[SystemSpec, Workload]) -> None:
    system, wl = scenario
    kept, kept_counters, engine = run(system, wl, True)
    full, full_counters, _ = run(system, wl, False)
    LOCAL["runs"] += 1
    LOCAL["local"] += engine.coupled_local > 0
    for col in ("launch_s", "start_s", "end_s", "wait_sm_s", "share_sm_s", "share_hbm_s", "share_link_s",
                "wait_peers_s"):
        assert kept[col].to_numpy() == pytest.approx(full[col].to_numpy(), rel=1e-9, abs=TIME_EPS), col
    # The fresh GPUs' counters are sampled from their own channels; the others' did not move.
    assert kept_counters.keys() == full_counters.keys()
    for key, value in full_counters.items():
        assert kept_counters[key] == pytest.approx(value, rel=1e-7, abs=1e-12), key


def test_the_random_workloads_take_the_local_solve() -> None:
    """The property above is not vacuous: most of its workloads solve some event locally."""
    if LOCAL["runs"] == 0:
        test_fresh_gpus_solved_alone_give_the_full_solves_timeline()
    assert LOCAL["local"] >= LOCAL["runs"] // 4, LOCAL
