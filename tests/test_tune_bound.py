"""The time bound ``ovsim tune`` prunes with (ovsim.tune_predictions): below every engine
prediction, and as tight as the waits for SMs the engine's dispatcher imposes let it be."""

from __future__ import annotations

from pathlib import Path

import pytest

from ovsim.api import predict
from ovsim.scenario import load_scenario
from ovsim.tune import analyze, candidates

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
H100 = EXAMPLES / "gemm-allreduce-h100x4-overlapped.yaml"


@pytest.mark.parametrize("scenario", sorted(EXAMPLES.glob("gemm-*.yaml")), ids=lambda p: p.stem)
def test_the_time_bound_is_below_the_engine(scenario: Path) -> None:
    """What the pruning rests on: contention (shared SMs, HBM, links) only adds time to ops that each
    take their isolated time, and no clock is above the top one, so no schedule the engine predicts,
    power-limit loop and caps included, is faster than its bound."""
    space = {"knobs.comm_priority": ["normal", "high"], "knobs.sm_carveout": [0, 16], "power.cap_w": [None, 300]}
    for c in candidates(scenario, space)[0]:
        engine = predict(c.scenario, mode="simulate", counters=False).timeline.makespan_s
        assert analyze(c.scenario)["bound_s"] <= engine * (1 + 1e-9), c.point


@pytest.mark.parametrize("second_priority", [0, -1], ids=["same-priority", "higher-priority"])
def test_a_kernel_waits_in_the_bound_for_the_sms_an_earlier_kernel_holds(second_priority: int) -> None:
    """A GEMM of many waves and a streaming kernel on another stream launch together on one H100.
    At the same priority the dispatcher gives the second kernel no SM until the GEMM's last wave
    has its SMs, and the bound says so (tune_predictions.dispatch_release_s): the engine starts it
    no earlier than the bound's release, which is most of the GEMM's time (more than all of it
    less two waves). At a higher priority it takes SMs as the first wave frees them, and the bound
    releases it at once."""
    from ovsim.engine.machine import build_machine
    from ovsim.engine.sim import Engine
    from ovsim.hw.calib import load_calibration
    from ovsim.hw.spec import load_gpu, load_system
    from ovsim.models import cost
    from ovsim.models.ir import Op, StreamSpec, Workload
    from ovsim.tune_predictions import dispatch_release_s

    gpu = load_gpu("h100-sxm5-80gb")
    params = load_calibration(gpu, "h100-sxm5-80gb").params
    gemm = cost.gemm(8192, 8192, 8192, "bf16", gpu, params)
    ops = (Op("g", "g", "gemm", 0, "a", kernel=gemm), Op("e", "e", "elementwise", 0, "b",
                                                         kernel=cost.memory_bound(1e8, gpu, params)))
    wl = Workload(ops=ops, streams=(StreamSpec(0, "a"), StreamSpec(0, "b", second_priority)), n_ranks=1)
    machine = build_machine(load_system("hgx-h100"), gpu, params, n_ranks=1)
    release, slowed = dispatch_release_s(wl, machine.gpus[0], [0.0, 0.0], lambda op: 1.0)
    assert not slowed
    tl = Engine(wl, machine).run().ops.set_index("id")
    assert release[0] == 0.0
    if second_priority == 0:
        wave_s = gemm.block_time_s
        assert tl.loc["g", "duration_s"] - 2 * wave_s < release[1] <= tl.loc["e", "start_s"]
    else:
        assert release[1] == 0.0 and tl.loc["e", "start_s"] < 0.5 * tl.loc["g", "duration_s"]


@pytest.mark.parametrize("carveout", [0, 8])
def test_an_all_reduce_behind_a_gemm_is_bound_by_the_sms_it_can_hold(carveout: int) -> None:
    """The H100 example at normal priority: its all-reduce gets no SM the GEMM's 16 waves hold
    until their last wave has SMs. With no carve-out it waits for that; with 8 SMs reserved it
    holds 8 of its 32 channels there and moves data at no more than a quarter of its rate until
    then. Either way the bound stays below the engine's time and closes most of the gap the bound
    without the wait leaves (it charged the all-reduce as if it overlapped the GEMM freely)."""
    sc = load_scenario(H100)
    sc = sc.model_copy(update={"knobs": sc.knobs.model_copy(update={"sm_carveout": carveout})})
    assert sc.knobs.comm_priority == "normal"
    a = analyze(sc)
    engine = predict(sc, mode="simulate", counters=False).timeline.makespan_s
    free = a["bound_any_priority_s"]
    assert free + 0.8 * (engine - free) < a["bound_s"] <= engine * (1 + 1e-9)


@pytest.mark.parametrize("kind", ["softmax", "elementwise", "norm"])
def test_a_kernel_released_beside_a_last_wave_is_bound_by_its_volume(kind: str) -> None:
    """Found by review: a bandwidth-bound kernel that the dispatcher releases beside another
    kernel's last wave can end sooner than its isolated time in the engine (its waves fall
    differently), so with the waits for SMs the bound takes each kernel's least time from the
    volume of its work (tune_predictions._least_s) rather than its isolated time. A kernel of 500
    one-per-SM blocks (4 waves) and a 100 MB memory-bound kernel on another stream, one H100."""
    from ovsim.scenario import Scenario

    sc = Scenario.model_validate({
        "schema": "ovsim.scenario/1", "name": "tail", "system": "hgx-h100", "ranks": 1, "schedule": "overlapped",
        "streams": {"compute": 0, "aux": 0},
        "ops": [{"name": "k", "kind": "kernel", "grid": 500, "threads": 128, "registers_per_thread": 128,
                 "shared_mem_bytes": 200000, "duration_s": 1.0e-4, "stream": "compute"},
                {"name": "m", "kind": kind, "bytes": 1.0e8, "stream": "aux"}]})
    a = analyze(sc)
    assert a["bound_any_priority_s"] < a["bound_s"] <= predict(sc, mode="simulate").timeline.makespan_s * (1 + 1e-9)


def test_a_collective_waits_in_the_bound_behind_a_persistent_clustered_gemm() -> None:
    """Llama 3 8B's FC2 GEMM before its reduce-scatter on 8 H100 (a benchmark case): cuBLAS's
    Hopper GEMM runs 132 persistent CTAs in clusters of 2 over 512 tiles, each tile faster on
    fewer busy SMs (load share). At normal priority the reduce-scatter gets no SM until the last
    tiles have theirs. The bound charges that wait with each tile at its fastest pace (all other
    SMs idle): 161 us against the engine's 173, where without it the bound was the collective's
    111 us alone."""
    from ovsim.api import build

    cases = Path(__file__).resolve().parents[1] / "bench" / "tune_cases"
    case = cases / "tpgemm-llama3-8b-4096-reducescatter-h100.yaml"
    sc = load_scenario(case)
    sc = sc.model_copy(update={"knobs": sc.knobs.model_copy(update={"sm_carveout": 0, "comm_priority": "normal"})})
    gemm = next(op.kernel for op in build(sc, "case")[0].ops if op.kind == "gemm")
    assert gemm is not None and 0 < gemm.persistent_ctas < gemm.blocks and gemm.cluster_ctas == 2
    assert gemm.load_share > 0
    a = analyze(sc)
    engine = predict(sc, mode="simulate", counters=False).timeline.makespan_s
    free = a["bound_any_priority_s"]
    assert free + 0.7 * (engine - free) < a["bound_s"] <= engine * (1 + 1e-9)
