"""Nodes joined by NICs: the network as a contended resource of the engine (closed forms)."""

from __future__ import annotations

import pytest

from ovsim.engine.machine import build_machine
from ovsim.engine.sim import Engine
from ovsim.hw.calib import Calibration
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.models.ir import FlowDemand, Op, StreamSpec, Workload

NIC_BYTES_PER_S = 50e9  # one 400 Gb/s NIC per GPU


def _two_nodes(gpus_per_node: int = 8, nics: int = 8) -> SystemSpec:
    return SystemSpec.model_validate({
        "schema": "ovsim.system/1", "name": "test-2x8-h100", "gpu": "h100-sxm5-80gb", "gpu_count": gpus_per_node,
        "topology": "nvswitch", "nodes": 2,
        "network": {"kind": "infiniband", "nics_per_node": nics, "bandwidth_per_nic_bytes_per_s": NIC_BYTES_PER_S},
        "sources": {"topology": "test"}})


def _run(ops: list[Op], system: SystemSpec, gpu: GpuSpec, calib: Calibration, n_ranks: int):  # type: ignore[no-untyped-def]
    streams = sorted({(op.rank, op.stream) for op in ops})
    machine = build_machine(system, gpu, calib.params, n_ranks=n_ranks)
    wl = Workload(ops=tuple(ops), streams=tuple(StreamSpec(r, s) for r, s in streams), n_ranks=n_ranks)
    return Engine(wl, machine).run().ops.set_index("id")


def _p2p(name: str, src: int, dst: int, size: float) -> FlowDemand:
    return FlowDemand(group=name, ranks=(src,), bytes=size, latency_s=0.0, rate_cap_bytes_per_s=1e15,
                      link_coeff=1.0, hbm_coeff=0.0, pattern="p2p", endpoints=(src, dst), uses_copy_engine=True)


def test_a_transfer_between_nodes_runs_at_its_gpus_share_of_the_nics(h100: GpuSpec, h100_calib: Calibration) -> None:
    """8 NICs of 50 GB/s for 8 GPUs: a GPU sends to another node at 50 GB/s, not NVLink's 450."""
    out = _run([Op("x", "x", "transfer", 0, "s", flow=_p2p("x", 0, 8, 5e9))], _two_nodes(), h100, h100_calib, 16)
    assert out.loc["x", "duration_s"] == pytest.approx(5e9 / NIC_BYTES_PER_S, rel=1e-9)


def test_two_transfers_leaving_one_gpu_share_its_nic(h100: GpuSpec, h100_calib: Calibration) -> None:
    ops = [Op("a", "a", "transfer", 0, "s1", flow=_p2p("a", 0, 8, 5e9)),
           Op("b", "b", "transfer", 0, "s2", flow=_p2p("b", 0, 9, 5e9))]
    out = _run(ops, _two_nodes(), h100, h100_calib, 16)
    assert out.loc["a", "duration_s"] == pytest.approx(2 * 5e9 / NIC_BYTES_PER_S, rel=1e-9)
    assert out.loc["a", "slowed_by"] == "sharing links"


def test_transfers_from_different_gpus_use_their_own_nics(h100: GpuSpec, h100_calib: Calibration) -> None:
    ops = [Op("a", "a", "transfer", 0, "s", flow=_p2p("a", 0, 8, 5e9)),
           Op("b", "b", "transfer", 1, "s", flow=_p2p("b", 1, 9, 5e9))]
    out = _run(ops, _two_nodes(), h100, h100_calib, 16)
    assert out.loc["a", "duration_s"] == pytest.approx(5e9 / NIC_BYTES_PER_S, rel=1e-9)
    assert out.loc["b", "duration_s"] == pytest.approx(5e9 / NIC_BYTES_PER_S, rel=1e-9)


def test_a_transfer_within_a_node_stays_on_nvlink(h100: GpuSpec, h100_calib: Calibration) -> None:
    out = _run([Op("x", "x", "transfer", 0, "s", flow=_p2p("x", 0, 1, 4.5e9))], _two_nodes(), h100, h100_calib, 16)
    assert out.loc["x", "duration_s"] == pytest.approx(4.5e9 / 450e9, rel=1e-9)


def _ring(name: str, ranks: tuple[int, ...], bus_bytes: float) -> FlowDemand:
    return FlowDemand(group=name, ranks=ranks, bytes=bus_bytes, latency_s=0.0, rate_cap_bytes_per_s=1e15,
                      link_coeff=1.0, hbm_coeff=0.0, pattern="ring")


def test_a_ring_with_one_member_per_node_is_held_to_one_nic(h100: GpuSpec, h100_calib: Calibration) -> None:
    """A data-parallel group of one GPU per node: every ring edge crosses the network, at 50 GB/s."""
    ranks = (0, 8)
    ops = [Op(f"r{r}", "ring", "collective", r, "s", flow=_ring("g", ranks, 5e9)) for r in ranks]
    out = _run(ops, _two_nodes(), h100, h100_calib, 16)
    assert out.loc["r0", "duration_s"] == pytest.approx(5e9 / NIC_BYTES_PER_S, rel=1e-9)


def test_a_ring_over_whole_nodes_spreads_its_crossings_over_every_nic(h100: GpuSpec, h100_calib: Calibration) -> None:
    """16 ranks on 2 nodes of 8: a member's bytes cross its NIC 1/8 of the time, so the ring runs at
    8 x 50 = 400 GB/s (NVLink, carrying 7/8 of them, would allow 450 x 8/7). With 2 NICs per node
    the network holds it to 2 x 50 = 100 GB/s."""
    ranks = tuple(range(16))
    ops = [Op(f"r{r}", "ring", "collective", r, "s", flow=_ring("g", ranks, 4e9)) for r in ranks]
    out = _run(ops, _two_nodes(), h100, h100_calib, 16)
    assert out.loc["r0", "duration_s"] == pytest.approx(4e9 / (8 * NIC_BYTES_PER_S), rel=1e-9)
    out = _run(ops, _two_nodes(nics=2), h100, h100_calib, 16)
    assert out.loc["r0", "duration_s"] == pytest.approx(4e9 / (2 * NIC_BYTES_PER_S), rel=1e-9)


@pytest.mark.parametrize(("nodes", "algorithm"), [(2, None), (4, None), (4, "tree")])
def test_a_collective_alone_across_nodes_takes_what_nccls_model_says(nodes: int, algorithm: str | None) -> None:
    """The engine's NVLink ports and NICs leave an isolated collective at its plan (the closed forms
    of tests/models/test_nccl_multinode.py): every algorithm's shares fit under the raw links."""
    from ovsim.api import predict
    from ovsim.models import nccl
    from ovsim.scenario import Scenario

    op = {"name": "ar", "kind": "all_reduce", "size_bytes": 2**30, "algorithm": algorithm}
    sc = Scenario.model_validate({"system": "hgx-h100-ndr", "nodes": nodes, "ops": [op]})
    ops = predict(sc, power_managed=False).timeline.ops
    out = ops[ops["kind"] == "collective"]
    system = _two_nodes().model_copy(update={"nodes": nodes, "nvls": True})
    plan = nccl.plan_collective("all_reduce", 2**30, 8 * nodes, h100_spec(), system, algorithm=algorithm)  # type: ignore[arg-type]
    assert len(out) == 8 * nodes
    assert out["duration_s"].max() == pytest.approx(plan.isolated_s, rel=1e-6)


def test_a_tree_across_pcie_nodes_is_held_to_pcie_within_them() -> None:
    """Nodes of 8 PCIe GPUs: the tree's chain within a node crosses PCIe, which the plan, like the
    engine's ports, holds it to (NCCL rates PCIe Gen5 x16 at 48 GB/s)."""
    from ovsim.api import predict
    from ovsim.models import nccl
    from ovsim.scenario import Scenario

    inline = {"gpu": "h100-sxm5-80gb", "gpu_count": 8, "topology": "pcie", "nodes": 2, "network": {
        "kind": "infiniband", "nics_per_node": 8, "bandwidth_per_nic_bytes_per_s": NIC_BYTES_PER_S}}
    sc = Scenario.model_validate({"system": inline, "ops": [
        {"name": "ar", "kind": "all_reduce", "size_bytes": 2**30, "algorithm": "tree", "protocol": "simple"}]})
    ops = predict(sc, power_managed=False).timeline.ops
    system = SystemSpec.model_validate({"schema": "ovsim.system/1", "name": "pcie-nodes", **inline,
                                        "sources": {"topology": "test"}})
    plan = nccl.plan_collective("all_reduce", 2**30, 16, h100_spec(), system, algorithm="tree",
                                protocol="simple")
    nvlink_share = 16 / 15 * 7 / 8
    assert plan.bus_bandwidth_bytes_per_s <= 48e9 / nvlink_share * (1 + 1e-9)
    assert ops[ops["kind"] == "collective"]["duration_s"].max() == pytest.approx(plan.isolated_s, rel=1e-6)


def h100_spec() -> GpuSpec:
    from ovsim.hw.spec import load_gpu

    return load_gpu("h100-sxm5-80gb")


def test_two_gpus_behind_one_nic_share_it_only_when_both_send(h100: GpuSpec, h100_calib: Calibration) -> None:
    """4 NICs for 8 GPUs (GPUs 0-1 behind NIC 0, 2-3 behind NIC 1): a GPU sending alone has its
    NIC's whole line rate; two behind the same NIC split it; two behind different NICs do not."""
    system = _two_nodes(nics=4)
    alone = _run([Op("a", "a", "transfer", 0, "s", flow=_p2p("a", 0, 8, 5e9))], system, h100, h100_calib, 16)
    assert alone.loc["a", "duration_s"] == pytest.approx(5e9 / NIC_BYTES_PER_S, rel=1e-9)
    for peer, share in ((1, 2.0), (2, 1.0)):
        ops = [Op("a", "a", "transfer", 0, "s", flow=_p2p("a", 0, 8, 5e9)),
               Op("b", "b", "transfer", peer, "s", flow=_p2p("b", peer, 8 + peer, 5e9))]
        out = _run(ops, system, h100, h100_calib, 16)
        assert out.loc["a", "duration_s"] == pytest.approx(share * 5e9 / NIC_BYTES_PER_S, rel=1e-9), peer


def test_a_ring_of_one_gpu_per_node_behind_a_shared_nic_runs_at_nccls_plan() -> None:
    """One member per node on 4-NIC nodes of 8 GPUs: NCCL's search finds one NIC under the member
    (one channel at its ladder speed), and the engine leaves that NIC to it alone."""
    from ovsim.api import predict
    from ovsim.models import nccl
    from ovsim.scenario import Scenario

    system = _two_nodes(nics=4)
    sc = Scenario.model_validate({
        "system": {"gpu": "h100-sxm5-80gb", "gpu_count": 8, "nodes": 2, "network": {
            "kind": "infiniband", "nics_per_node": 4, "bandwidth_per_nic_bytes_per_s": NIC_BYTES_PER_S}},
        "ops": [{"name": "ar", "kind": "all_reduce", "size_bytes": 2**30, "ranks": [0, 8]}]})
    ops = predict(sc, power_managed=False).timeline.ops
    plan = nccl.plan_collective("all_reduce", 2**30, 2, h100_spec(), system, ranks=(0, 8))
    assert plan.bus_bandwidth_bytes_per_s <= NIC_BYTES_PER_S
    assert ops[ops["kind"] == "collective"]["duration_s"].max() == pytest.approx(plan.isolated_s, rel=1e-6)
