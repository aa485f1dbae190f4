"""NCCL across nodes joined by NICs, and the systems that cannot exist.

Golden figures are closed forms from NCCL's own tables (the inter-node speed ladder, hwLat) and
the published per-NIC figures NVIDIA's maintainers quote; docs/design.md, "Nodes joined by NICs".
"""

from __future__ import annotations

import pytest

from ovsim.errors import OvsimError
from ovsim.hw.spec import SystemSpec, check_domain, load_gpu, load_system
from ovsim.models import nccl, nccl_net
from ovsim.models.nccl_net import NET_PARAMS

GIB = 2**30


def _nodes(name: str, nodes: int, **update: object) -> SystemSpec:
    return load_system(name).model_copy(update={"nodes": nodes, **update})


def _busbw_gb_s(plan: nccl.CollectivePlan) -> float:
    return plan.algorithm_bandwidth_bytes_per_s * nccl.bus_factor(plan.op, plan.n_ranks) / 1e9


@pytest.mark.parametrize(("system", "per_nic"), [("hgx-h100-ndr", 48.0), ("dgx-a100-hdr", 24.0)])
def test_a_ring_over_whole_nodes_runs_at_the_nics_rating(system: str, per_nic: float) -> None:
    """8 NICs per node: NCCL rates a 400 Gb/s NIC at 48 GB/s and a 200 Gb/s one at 24 GB/s
    (NVIDIA/nccl-tests #290 "46-48GB/s per NIC"; #119 "24GB/s ... per 200G NIC"); NVLink, carrying
    7/8 of each member's bytes, has room to spare. Large enough that latency is under 1%."""
    sys_ = _nodes(system, 4)
    gpu = load_gpu(sys_.gpu)
    plan = nccl.plan_collective("all_reduce", 64 * GIB, 32, gpu, sys_, algorithm="ring", protocol="simple")
    assert plan.bus_bandwidth_bytes_per_s == pytest.approx(8 * per_nic * 1e9, rel=1e-9)
    assert plan.n_nodes == 4
    assert _busbw_gb_s(plan) == pytest.approx(8 * per_nic, rel=0.01)


def test_half_the_nics_half_the_bandwidth() -> None:
    """4 NICs of 200 Gb/s for 8 A100s: 4 x 24 = 96 GB/s (nccl-tests #100 measured 91 on such nodes)."""
    base = load_system("dgx-a100-hdr")
    assert base.network is not None
    sys_ = base.model_copy(update={"network": base.network.model_copy(update={"nics_per_node": 4})})
    plan = nccl.plan_collective("all_reduce", 64 * GIB, 16, load_gpu(sys_.gpu), sys_, algorithm="ring")
    assert plan.bus_bandwidth_bytes_per_s == pytest.approx(96e9, rel=1e-9)


def test_a_nic_faster_than_pcie_is_held_to_pcie() -> None:
    """A 400 Gb/s NIC behind an A100's PCIe Gen4 x16: NCCL's path is PCIe, rated 24 GB/s, and fits
    one channel of that speed per NIC, not two (the NIC's 50 GB/s would hold two)."""
    base = load_system("dgx-a100-hdr")
    assert base.network is not None
    sys_ = base.model_copy(update={"network": base.network.model_copy(
        update={"bandwidth_per_nic_bytes_per_s": 50e9})})
    plan = nccl.plan_collective("all_reduce", 64 * GIB, 16, load_gpu(sys_.gpu), sys_, algorithm="ring",
                                protocol="simple")
    assert plan.bus_bandwidth_bytes_per_s == pytest.approx(8 * 24e9, rel=1e-9)


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_half_nccls_ctas_across_nodes_give_half_the_bandwidth(algorithm: str) -> None:
    """2 nodes of 8 H100s launch 16 CTAs (2 per NIC channel); asking for 8 halves the rate, once
    (the NVLink part is not cut again by the smaller count)."""
    sys_ = _nodes("hgx-h100-ndr", 2)
    gpu = load_gpu(sys_.gpu)
    full = nccl.plan_collective("all_reduce", 64 * GIB, 16, gpu, sys_, algorithm=algorithm, protocol="simple")
    half = nccl.plan_collective("all_reduce", 64 * GIB, 16, gpu, sys_, algorithm=algorithm, protocol="simple",
                                channels=full.channels // 2)
    assert full.channels == 16
    assert half.bus_bandwidth_bytes_per_s == pytest.approx(full.bus_bandwidth_bytes_per_s / 2, rel=1e-9)


def test_a_group_of_one_gpu_per_node_gets_one_nic() -> None:
    """Data parallelism across 4 nodes with TP inside: the ring's every edge is a NIC of 48 GB/s."""
    sys_ = _nodes("hgx-h100-ndr", 4)
    plan = nccl.plan_collective("all_reduce", 64 * GIB, 4, load_gpu(sys_.gpu), sys_, algorithm="ring",
                                protocol="simple", ranks=[3, 11, 19, 27])
    assert plan.bus_bandwidth_bytes_per_s == pytest.approx(48e9, rel=1e-9)


def test_a_send_between_nodes_runs_at_one_nic() -> None:
    sys_ = _nodes("hgx-h100-ndr", 2)
    gpu = load_gpu(sys_.gpu)
    across = nccl.plan_collective("send_recv", 1 * GIB, 2, gpu, sys_, protocol="simple", ranks=[0, 8])
    within = nccl.plan_collective("send_recv", 1 * GIB, 2, gpu, sys_, protocol="simple", ranks=[0, 1])
    assert across.bus_bandwidth_bytes_per_s == pytest.approx(48e9, rel=1e-9)
    assert within.bus_bandwidth_bytes_per_s > 5 * across.bus_bandwidth_bytes_per_s


def test_all_to_all_across_nodes_is_held_by_the_share_that_leaves_the_node() -> None:
    """16 ranks on 2 nodes: 8 of a rank's 15 peers are elsewhere, so its NIC (48 GB/s) carries
    8/15 of its bus bytes: bus bandwidth 48 x 15/8 = 90 GB/s."""
    sys_ = _nodes("hgx-h100-ndr", 2)
    plan = nccl.plan_collective("all_to_all", 16 * GIB, 16, load_gpu(sys_.gpu), sys_, protocol="simple")
    assert plan.bus_bandwidth_bytes_per_s == pytest.approx(48e9 * 15 / 8, rel=1e-9)


def test_ring_latency_pays_the_network_hop_on_the_steps_that_cross_it() -> None:
    """tuning.cc (v2.29): base + (nsteps - nInterSteps) x max(NVLink hop, 3 x 1 us of network
    overhead) + nInterSteps x hwLat[NET]; an all-reduce over 2 nodes of 8 crosses 2 x (2 - 1) of
    its 30 steps, and with at least 64 B per CTA and rank Ring/Simple pays x1.4 in the model that
    chooses the algorithm; the plan's time leaves that factor out (published sweeps)."""
    sys_ = _nodes("hgx-h100-ndr", 2)
    p, net = nccl.DEFAULT_PARAMS, NET_PARAMS
    plan = nccl.plan_collective("all_reduce", 1 * GIB, 16, load_gpu(sys_.gpu), sys_, algorithm="ring",
                                protocol="simple")
    assert plan.channels == 16  # 8 NIC channels x 2 CTAs (connect.cc)
    want = p.ring_base_latency_s[2] + 28 * max(p.ring_nvlink_hop_latency_s[2], 3e-6) + 2 * 14e-6
    assert net.ring_net_hop_latency_s[2] == 14e-6
    assert plan.latency_s == pytest.approx(want, rel=1e-12)
    comm_choice = nccl_net.ring_latency_s(nccl_net.Span(2, 16, 2, 8, 8, 48e9), "all_reduce", 2, 30,
                                          p.ring_base_latency_s[2], p.ring_nvlink_hop_latency_s[2], GIB, 16)
    assert comm_choice == pytest.approx(1.4 * want, rel=1e-12)
    small = nccl.plan_collective("all_reduce", 1024, 16, load_gpu(sys_.gpu), sys_, algorithm="ring", protocol="ll")
    assert small.latency_s == pytest.approx(p.ring_base_latency_s[0] + 28 * 1e-6 + 2 * 2.7e-6, rel=1e-12)


def test_broadcast_and_all_to_all_pay_the_network_only_where_they_cross_it() -> None:
    """tuning.cc: a broadcast whose channels follow one ring pays one hop, hwLat[NET] across nodes;
    an all-to-all [D] pays a hop per peer, 7 over NVLink and 8 over the network on 2 nodes of 8."""
    sys_ = _nodes("hgx-h100-ndr", 2)
    gpu = load_gpu(sys_.gpu)
    p, net = nccl.DEFAULT_PARAMS, NET_PARAMS
    bcast = nccl.plan_collective("broadcast", 1024, 16, gpu, sys_, protocol="ll")
    assert bcast.latency_s == pytest.approx(p.ring_base_latency_s[0] + net.ring_net_hop_latency_s[0], rel=1e-12)
    a2a = nccl.plan_collective("all_to_all", 1024, 16, gpu, sys_, protocol="ll")
    want = p.ring_base_latency_s[0] + 7 * p.ring_nvlink_hop_latency_s[0] + 8 * net.ring_net_hop_latency_s[0]
    assert a2a.latency_s == pytest.approx(want, rel=1e-12)


def test_one_member_per_node_pays_the_trees_network_latency() -> None:
    """With one rank per node every ring hop crosses the network, at hwLat[NET][Tree]."""
    sys_ = _nodes("hgx-h100-ndr", 4)
    plan = nccl.plan_collective("all_reduce", 1024, 4, load_gpu(sys_.gpu), sys_, algorithm="ring", protocol="ll",
                                ranks=[0, 8, 16, 24])
    assert plan.latency_s == pytest.approx(nccl.DEFAULT_PARAMS.ring_base_latency_s[0] + 6 * 5.0e-6, rel=1e-12)


def test_nvls_tree_joins_nodes_of_nvswitch_sharp() -> None:
    """2 nodes of 8 H100: NVLS within (40 GB/s x 0.85 x 7/8 x 2 = 59.5 per channel), the tree across
    (48 x 2), capped at tuning.cc's 57.7 GB/s per channel for 2 nodes: 8 x 57.7 = 461.6 GB/s, where
    nccl-tests #309 measured 470 by default. At 4 nodes the cap is 45.5: 364 GB/s, below the ring's
    384, and NCCL's model turns to the ring for large sizes."""
    gpu = load_gpu("h100-sxm5-80gb")
    two = nccl.plan_collective("all_reduce", 8 * GIB, 16, gpu, _nodes("hgx-h100-ndr", 2))
    assert (two.algorithm, two.protocol) == ("nvls_tree", "simple")
    assert two.bus_bandwidth_bytes_per_s / 1e9 == pytest.approx(461.6, rel=1e-3)
    assert _busbw_gb_s(two) == pytest.approx(461.6, rel=0.006)  # latency and the pipeline's fill: 0.6%
    four = nccl.plan_collective("all_reduce", 8 * GIB, 32, gpu, _nodes("hgx-h100-ndr", 4), algorithm="nvls_tree")
    assert _busbw_gb_s(four) == pytest.approx(364.0, rel=0.005)  # latency: 0.2%
    assert nccl.plan_collective("all_reduce", 8 * GIB, 32, gpu, _nodes("hgx-h100-ndr", 4)).algorithm == "ring"
    with pytest.raises(OvsimError, match="NVLS-tree needs"):
        nccl.plan_collective("all_reduce", GIB, 16, load_gpu("a100-sxm4-80gb"), _nodes("dgx-a100-hdr", 2),
                             algorithm="nvls_tree")


def test_nvls_tree_with_one_member_per_node_says_so() -> None:
    sys_ = _nodes("hgx-h100-ndr", 2)
    with pytest.raises(OvsimError, match="at least 2 members of the communicator on each node"):
        nccl.plan_collective("all_reduce", GIB, 2, load_gpu(sys_.gpu), sys_, algorithm="nvls_tree", ranks=[0, 8])


def test_copy_engine_offload_leaves_collectives_across_nodes_to_nccl() -> None:
    """The ce_offload knob moves what copy engines can (a node's all-gather); an all-gather across
    nodes stays on NCCL's kernels. Asked for explicitly, copy engines across nodes are refused."""
    from ovsim.api import predict
    from ovsim.scenario import Scenario

    ops = [{"name": "ag", "kind": "all_gather", "size_bytes": 2**28, "ranks": list(range(8))},
           {"name": "ag2", "kind": "all_gather", "size_bytes": 2**28, "ranks": [0, 8]}]
    sc = Scenario.model_validate({"system": "hgx-h100-ndr", "knobs": {"ce_offload": True}, "ops": ops})
    out = predict(sc, mode="analytic").timeline.ops
    on_sms = out[out["rank"] >= 0].groupby("name")["blocks"].max()
    assert on_sms["ag"] == 0 and on_sms["ag2"] > 0
    ops[1]["engine"] = "copy_engine"
    with pytest.raises(OvsimError, match="spans nodes"):
        predict(Scenario.model_validate({"system": "hgx-h100-ndr", "ops": ops}), mode="analytic")


def test_nvls_tree_reads_hbm_as_nvls_within_the_node_and_a_ring_across() -> None:
    """[D] 16 ranks on 2 nodes, unregistered buffers: NVLS's 6 S per rank against 2 x 15/16 S of bus
    bytes, plus 3 HBM bytes per byte sent across nodes (1/2 x 16/15 / 8 per bus byte)."""
    sys_ = _nodes("hgx-h100-ndr", 2)
    plan = nccl.plan_collective("all_reduce", 8 * GIB, 16, load_gpu(sys_.gpu), sys_, algorithm="nvls_tree")
    p = nccl.DEFAULT_PARAMS
    assert not p.nvls_registered_buffers
    net = 0.5 * 16 / 15 / 8
    assert plan.net_bytes_per_bus_byte == pytest.approx(net, rel=1e-12)
    assert plan.hbm_bytes_per_bus_byte == pytest.approx(6.0 / (2 * 15 / 16) + p.hbm_bytes_per_bus_byte_reduce * net,
                                                        rel=1e-12)


def test_nvls_stays_within_a_node() -> None:
    sys_ = _nodes("hgx-h100-ndr", 2)
    gpu = load_gpu(sys_.gpu)
    assert nccl.plan_collective("all_reduce", 4 * GIB, 8, gpu, sys_).algorithm == "nvls"
    assert nccl.plan_collective("all_reduce", 4 * GIB, 16, gpu, sys_).algorithm != "nvls"
    with pytest.raises(OvsimError, match="one node"):
        nccl.plan_collective("all_reduce", 4 * GIB, 16, gpu, sys_, algorithm="nvls")


def test_ranks_must_be_distinct_and_on_the_system() -> None:
    sys_ = _nodes("hgx-h100-ndr", 2)
    gpu = load_gpu(sys_.gpu)
    with pytest.raises(OvsimError, match="distinct ranks"):
        nccl.plan_collective("all_reduce", GIB, 2, gpu, sys_, ranks=[0, 16])
    with pytest.raises(OvsimError, match="distinct ranks"):
        nccl.plan_collective("all_reduce", GIB, 2, gpu, sys_, ranks=[1, 1])


def _one_domain(gpu: str, count: int) -> SystemSpec:
    return SystemSpec.model_validate({"schema": "ovsim.system/1", "name": f"{count}x {gpu}", "gpu": gpu,
                                      "gpu_count": count, "topology": "nvswitch", "sources": {"topology": "test"}})


@pytest.mark.parametrize(("gpu", "count", "ok"), [
    ("h100-sxm5-80gb", 8, True), ("h100-sxm5-80gb", 16, False),  # HGX H100: 8
    ("a100-sxm4-80gb", 16, True), ("a100-sxm4-80gb", 17, False),  # two HGX A100 boards back to back: 16
    ("b200", 72, True), ("b200", 144, False),  # GB200 NVL72
])
def test_a_domain_larger_than_any_product_is_refused(gpu: str, count: int, ok: bool) -> None:
    system, spec = _one_domain(gpu, count), load_gpu(gpu)
    if ok:
        check_domain(system, spec)
        return
    with pytest.raises(OvsimError, match=f"no {spec.name} system joins more than") as e:
        nccl.plan_collective("all_reduce", GIB, 8, spec, system)
    assert e.value.field == "gpu_count"


def test_several_nodes_need_a_network() -> None:
    with pytest.raises(ValueError, match="need a network"):
        SystemSpec.model_validate({"schema": "ovsim.system/1", "name": "x", "gpu": "h100-sxm5-80gb", "gpu_count": 8,
                                   "topology": "nvswitch", "nodes": 2, "sources": {"topology": "test"}})


def test_published_multi_node_bus_bandwidths() -> None:
    """ovsim validate's rows across nodes (sources in ovsim/validate/network.py). The 2-node 470 GB/s
    run is the one NVLS-tree's fill is fitted on, and the ring's time was decided on the #119 rows;
    the others are held out. The closest are the 3-node A100 sweep of nccl-tests #119 at and below
    128 MiB, where NCCL's model latency (207 us for this ring without the plateau factor its choice
    adds, 290 with it) holds the busbw at 125 MiB to 89 GB/s (86 with it); the run reached 96.45."""
    from ovsim.validate.network import network_checks

    checks = network_checks()
    rows = [c for c in checks if c.unit == "GB/s"]
    assert [round(c.reference) for c in rows] == [396, 470, 390, 366, 350, 192, 91, 96, 85]
    assert all(c.passed for c in rows), [(c.name, c.error_pct) for c in rows]
    # Below, not above: the model's latency, not its bandwidth (the same nodes at 1-8 GiB: +5.4%).
    assert all(-10.0 < c.error_pct < -7.0 for c in rows[-2:])
    # The sweep's mean is below its peak, as measured (84.9 against 96.45).
    assert rows[-1].predicted < rows[-2].predicted


def test_published_multi_node_sweeps() -> None:
    """The all-reduce's time at every size of nccl-tests #309's H100 sweeps (measured; NVLS-tree's
    pipeline depth fitted on the first, the ring's time decided on the last). Within 5% at their
    largest size (NCCL's bandwidth over the NICs); with the pipeline's fill, within 10% at 16 MiB-1
    GiB under NVLS-tree on the two held-out sweeps too, where NCCL's model alone was 17-33% fast;
    the forced ring, which the fill
    does not touch, stays off by up to half at 1-8 MiB."""
    from ovsim.validate.network import SWEEPS, network_checks

    for sw in SWEEPS:
        assert abs(sw.errors()[-1][1]) < 0.05, (sw.name, sw.errors()[-1])
    fit_2, second_2, held_4, ring_2 = (dict(sw.errors()) for sw in SWEEPS)
    assert [sw.fitted for sw in SWEEPS] == [True, False, False, True]
    mid = [2.0**k for k in range(24, 31)]  # 16 MiB-1 GiB
    assert all(abs(d[s]) < 0.10 for d in (fit_2, second_2, held_4) for s in mid), [
        [round(d[s], 3) for s in mid] for d in (fit_2, second_2, held_4)]
    assert ring_2[2.0**20] < -0.4 and ring_2[2.0**26] > 0.1
    sweeps = [c for c in network_checks() if c.unit == "% MAPE"]
    assert [c.passed for c in sweeps] == [True, True, True, False], [c.predicted for c in sweeps]
    # Simple from 128 MiB: without the ring's plateau factor in its time, within 7% (10% with it).
    assert all(abs(ring_2[s]) < 0.07 for s in ring_2 if s >= 2.0**27)
    assert [c.group == sweeps[0].group for c in sweeps] == [True, False, False, True]  # calibration sources


def test_nvls_tree_pays_its_pipelines_fill_by_nccls_chunk_rules() -> None:
    """NVLS-tree moves a chunk per channel and NVLS head at a time (enqueue.cc calcCollChunking:
    128 KiB, at most 64 KiB from 4 nodes, 64 KiB below 4 chunks a channel and head, 32 KiB below
    one), and a message of a few chunks pays the pipeline's other stages once: 1.85 steps of 16
    channels x 8 heads (a chunk each, or all a head has) at the algorithm bandwidth, on top of
    NCCL's latency."""

    gpu = load_gpu("h100-sxm5-80gb")
    kib, mib = 1024, 2**20
    cases = ((2, 2 * mib, 32 * kib), (2, 7 * mib, 32 * kib), (2, 8 * mib, 64 * kib), (2, 16 * mib, 64 * kib),
             (2, 64 * mib, 128 * kib), (2, GIB, 128 * kib), (4, 4 * mib, 32 * kib), (4, 16 * mib, 64 * kib),
             (4, GIB, 64 * kib))
    for nodes, size, chunk in cases:
        system = _nodes("hgx-h100-ndr", nodes)
        plan = nccl.plan_collective("all_reduce", size, 8 * nodes, gpu, system, algorithm="nvls_tree")
        nccl_latency = NET_PARAMS.nvls_tree_nvlink_latency_s + 2 * (nodes.bit_length() - 1) * \
            NET_PARAMS.nvls_tree_net_latency_s
        alg_bw = plan.bus_bandwidth_bytes_per_s / nccl.bus_factor("all_reduce", 8 * nodes)
        step = min(16 * 8 * chunk, size)
        assert plan.latency_s == pytest.approx(nccl_latency + 1.85 * step / alg_bw, rel=1e-9), (nodes, size)
    # The fill is the time's, not the choice's: NCCL's model, which chooses, has no such term. With
    # the fill in the choice these would turn to the tree or the ring.
    for nodes, size in ((2, 8 * mib), (2, 16 * mib), (4, 16 * mib), (4, 32 * mib)):
        plan = nccl.plan_collective("all_reduce", size, 8 * nodes, gpu, _nodes("hgx-h100-ndr", nodes))
        assert plan.algorithm == "nvls_tree", (nodes, size, plan.algorithm)
    assert nccl_net.nvls_tree_chunk_bytes(64 * mib, nccl_net.Span(2, 16, 2, 8, 8, 48e9), 16) == 128 * kib


def test_the_rings_plateau_factor_steers_the_choice_not_the_time() -> None:
    """tuning.cc's x1.4 on a multi-node Ring/Simple all-reduce stays in NCCL's choice: without it,
    A100 rings of 2 and 3 nodes at 32 and 64 MiB would turn from LL128 to Simple. The chosen plan's
    time leaves it out: a Simple ring's latency is NCCL's sum of steps, not 1.4 times it."""
    a100 = load_gpu("a100-sxm4-80gb")
    for nodes, size in ((2, 32 * 2**20), (3, 64 * 2**20)):
        plan = nccl.plan_collective("all_reduce", size, 8 * nodes, a100, _nodes("dgx-a100-hdr", nodes))
        assert (plan.algorithm, plan.protocol) == ("ring", "ll128"), (nodes, plan.algorithm, plan.protocol)
    simple = nccl.plan_collective("all_reduce", GIB, 24, a100, _nodes("dgx-a100-hdr", 3), algorithm="ring",
                                  protocol="simple")
    p = nccl.DEFAULT_PARAMS
    # 46 steps, 4 across the network (2 x (3 - 1)): the NVLink hop raised to 3 x 1 us of overhead.
    want = p.ring_base_latency_s[2] + 42 * max(p.ring_nvlink_hop_latency_s[2], 3e-6) + 4 * 14e-6
    assert simple.latency_s == pytest.approx(want, rel=1e-12)
