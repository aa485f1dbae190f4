"""Collectives within one node priced with a GPU's measured costs (rings and NVLS).

Golden figures are published nccl-tests sweeps of 8-GPU A100 and H100 nodes (ovsim/validate/node.py
names each source); each family's fit is on one all-reduce sweep and the others, all-gather and
reduce-scatter and an H200 node among them, are held out.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from ovsim.api import build
from ovsim.calibrate.collectives import fit_node_sweep
from ovsim.hw.calib import Parameters, shipped_parameters
from ovsim.hw.spec import load_gpu, load_system
from ovsim.models import nccl
from ovsim.scenario import Scenario
from ovsim.validate.node import SWEEPS

MIB = 2**20
ADDED = {"simple": 50e-6, "ll128": 30e-6}
EFF = {"simple": 0.9, "ll128": 0.8}
COSTS = Parameters(nccl_ring_added_latency_s=ADDED, nccl_ring_bus_efficiency=EFF, nccl_nvls_added_latency_s=20e-6,
                   nccl_nvls_bus_efficiency=0.95, nccl_node_ranks=8)


def _plan(op: str, size: float, n: int, system: str = "dgx-a100", nodes: int = 1) -> nccl.CollectivePlan:
    sys_ = load_system(system).model_copy(update={"nodes": nodes})
    return nccl.plan_collective(op, size, n, load_gpu(sys_.gpu), sys_)  # type: ignore[arg-type]


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_a_ring_pays_the_added_latency_and_reaches_its_share_of_the_bandwidth(op: str) -> None:
    plan = _plan(op, 256 * MIB, 8)
    assert plan.algorithm == "ring"
    cal = nccl.calibrated_plan(plan, COSTS)
    assert cal.latency_s == pytest.approx(plan.latency_s + ADDED[plan.protocol], rel=1e-12)
    assert cal.bus_bandwidth_bytes_per_s == pytest.approx(plan.bus_bandwidth_bytes_per_s * EFF[plan.protocol])
    assert (cal.algorithm, cal.protocol, cal.channels) == (plan.algorithm, plan.protocol, plan.channels)


def test_nvls_within_one_node_pays_its_own_costs() -> None:
    plan = _plan("all_reduce", 256 * MIB, 8, "hgx-h100")
    assert plan.algorithm == "nvls"
    cal = nccl.calibrated_plan(plan, COSTS)
    assert cal.latency_s == pytest.approx(plan.latency_s + 20e-6, rel=1e-12)
    assert cal.bus_bandwidth_bytes_per_s == pytest.approx(plan.bus_bandwidth_bytes_per_s * 0.95)


def test_only_a_ring_or_nvls_within_one_node_is_repriced() -> None:
    across = _plan("all_reduce", 256 * MIB, 16, "dgx-a100-hdr", nodes=2)
    nvls_tree = _plan("all_reduce", 256 * MIB, 16, "hgx-h100-ndr", nodes=2)
    p2p = _plan("send_recv", 256 * MIB, 2)
    assert across.n_nodes == 2 and nvls_tree.algorithm == "nvls_tree"
    for plan in (across, nvls_tree, p2p):
        assert nccl.calibrated_plan(plan, COSTS) is plan
    ring = _plan("all_reduce", 256 * MIB, 8)
    assert nccl.calibrated_plan(ring, Parameters()) is ring
    assert nccl.calibrated_plan(replace(ring, protocol="ll"), COSTS) == replace(ring, protocol="ll")


@pytest.mark.parametrize("ranks", [2, 4])
def test_communicators_of_other_sizes_keep_nccls_model(ranks: int) -> None:
    """The costs were measured over whole 8-GPU nodes; a 2- or 4-rank group is not priced with them."""
    for system in ("dgx-a100", "hgx-h100"):
        plan = _plan("all_reduce", 64 * MIB, ranks, system)
        assert nccl.calibrated_plan(plan, COSTS) is plan


FAMILIES = {"a100-sxm4-40gb": ("a100-sxm4-40gb", "a100-sxm4-80gb"), "h100-sxm5-80gb": ("h100-sxm5-80gb", "h200-sxm")}


@pytest.mark.parametrize("sweep", [sw for sw in SWEEPS if sw.fitted], ids=lambda sw: sw.gpu)
def test_the_shipped_costs_are_the_fit_on_their_sweep(sweep: object) -> None:
    """Each family's files hold what the fit gives on the sweep marked as its source (a consistency
    check of calibration/nccl/fit_published_sweeps.py's output, not a validation)."""
    from ovsim.validate.node import NodeSweep

    assert isinstance(sweep, NodeSweep)
    values, record = fit_node_sweep(sweep.scored(), sweep.plan)
    for gpu in FAMILIES[sweep.gpu]:
        params = shipped_parameters(gpu)
        for key, value in values.items():
            assert getattr(params, key) == value, (gpu, key)
    assert all(r["fit_mape_pct"] < r["model_mape_pct"] for r in record["groups"].values())


def test_the_fit_recovers_known_costs_from_a_synthetic_sweep() -> None:
    """Times made with 30 us added to NCCL's latency and 0.8 of its bandwidth, per protocol, give
    those values back; a sweep faster than NCCL's bandwidth has its efficiency held at 1 and only
    the latency fitted."""
    sizes = [float(64 * 1024 * 2**i) for i in range(16)]

    def sweep(added_s: float, efficiency: float) -> list[tuple[float, float]]:
        out = []
        for size in sizes:
            plan = _plan("all_reduce", size, 8)
            t = plan.latency_s + added_s + plan.bus_bytes / (plan.bus_bandwidth_bytes_per_s * efficiency)
            out.append((size, plan.bus_bytes / t / 1e9))
        return out

    values, _ = fit_node_sweep(sweep(30e-6, 0.8), lambda s: _plan("all_reduce", s, 8))
    assert values["nccl_node_ranks"] == 8
    for proto in ("ll", "ll128", "simple"):
        assert values["nccl_ring_added_latency_s"][proto] == pytest.approx(30e-6, rel=1e-3)
        assert values["nccl_ring_bus_efficiency"][proto] == pytest.approx(0.8, rel=1e-3)
    # 2% faster than NCCL's bandwidth: held at 1, the latency takes up what it can (less than 30 us).
    fast, _ = fit_node_sweep(sweep(30e-6, 1.02), lambda s: _plan("all_reduce", s, 8))
    assert set(fast["nccl_ring_bus_efficiency"].values()) == {1.0}
    assert all(0 <= a < 30e-6 for a in fast["nccl_ring_added_latency_s"].values())


@pytest.mark.parametrize("sweep", [sw for sw in SWEEPS if not sw.fitted], ids=lambda sw: sw.name)
def test_held_out_sweeps_come_within_ten_percent(sweep: object) -> None:
    """Other nodes' published sweeps (other NCCL versions, both A100 memory sizes, all-gather and
    reduce-scatter beside all-reduce, an H200 node on the H100's fit), none fitted: within the 10%
    MAPE bar, and closer than NCCL's model alone."""
    from ovsim.validate.node import NodeSweep

    assert isinstance(sweep, NodeSweep)
    params = shipped_parameters(sweep.gpu)
    after = [abs(e) for _, e in sweep.errors(params)]
    before = [abs(e) for _, e in sweep.errors(None)]
    assert sum(after) / len(after) <= 0.10
    repriced = any(sweep.plan(size, params) != sweep.plan(size) for size, _ in sweep.scored())
    # A sweep whose collectives the GPU has no costs for (the H100's ring) is NCCL's model alone.
    assert sum(after) < sum(before) if repriced else after == before


def test_a_scenario_prices_its_tensor_parallel_all_reduce_with_the_measured_costs() -> None:
    """A 100 MiB all-reduce over a node's 8 GPUs runs as the calibrated plan says: a ring on a DGX
    A100, NVLS on an HGX H100."""
    for system, gpu in (("dgx-a100", "a100-sxm4-80gb"), ("hgx-h100", "h100-sxm5-80gb")):
        sc = Scenario.model_validate({"name": "ar", "system": system, "ranks": 8, "ops": [
            {"name": "ar", "kind": "all_reduce", "size_bytes": 100 * MIB}]})
        wl = build(sc)[0]
        flow = next(op.flow for op in wl.ops if op.flow is not None)
        plan = _plan("all_reduce", 100 * MIB, 8, system)
        expected = nccl.calibrated_plan(plan, shipped_parameters(gpu))
        assert expected is not plan
        assert flow.latency_s == pytest.approx(expected.latency_s, rel=1e-12)
        assert flow.rate_cap_bytes_per_s == pytest.approx(expected.bus_bandwidth_bytes_per_s, rel=1e-12)


@pytest.mark.parametrize(("field", "value"), [
    ("nccl_ring_added_latency_s", {"simpel": 1e-6}), ("nccl_ring_added_latency_s", {"simple": -1e-6}),
    ("nccl_ring_bus_efficiency", {"ll128": 1.2}), ("nccl_ring_bus_efficiency", {"simple": 0.0}),
    ("nccl_nvls_bus_efficiency", 1.5), ("nccl_nvls_added_latency_s", -1e-6),
])
def test_costs_outside_their_meaning_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=next(iter(value)) if isinstance(value, dict) else field):
        Parameters.model_validate({field: value})
