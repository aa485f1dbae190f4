"""Routing: which HBMs, links and NICs a flow's bytes cross, and how many bytes per byte moved."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ovsim.engine.machine import MachineModel
from ovsim.models.ir import FlowDemand

# Channels that belong to one GPU, named by it as the key's second item: every flow that uses one
# has that GPU among its ranks. (A NIC port's key names the port.)
RANK_KEYED = ("hbm", "egress", "ingress", "link", "pcie_in", "pcie_out")


def flow_usage(machine: MachineModel, d: FlowDemand) -> list[tuple[Any, float]]:
    """The resources a flow uses and the bytes it moves through each per byte of the flow:
    ("hbm", rank), or a link key of ``machine.links`` (NVLink ports or mesh links, PCIe, NICs)."""
    use: dict[Any, float] = {}

    def add(key: Any, c: float) -> None:
        if c > 0 and (key in machine.links or key[0] == "hbm"):
            use[key] = use.get(key, 0.0) + c

    ranks = list(d.ranks)
    mesh = machine.topology == "mesh"
    node = machine.node_of
    if d.pattern == "local":
        add(("hbm", ranks[0]), d.hbm_coeff)
    elif d.pattern == "host":
        assert d.endpoints is not None
        src, dst = d.endpoints
        dev = dst if src < 0 else src
        add(("hbm", dev), d.hbm_coeff)
        add(("pcie_in", dst, -1) if src < 0 else ("pcie_out", src, -1), d.link_coeff)
    elif d.pattern == "p2p":
        assert d.endpoints is not None
        src, dst = d.endpoints
        add(("hbm", src), d.hbm_coeff)
        add(("hbm", dst), d.hbm_coeff)
        if node(src) != node(dst):
            net = d.link_coeff if d.net_coeff is None else d.net_coeff
            add(("nic_out", machine.nic_port(src), -1), net)
            add(("nic_in", machine.nic_port(dst), -1), net)
        elif mesh:
            add(("link", src, dst), d.link_coeff)
        else:
            add(("egress", src, -1), d.link_coeff)
            add(("ingress", dst, -1), d.link_coeff)
    else:
        _group_usage(machine, d, ranks, add)
    return list(use.items())

def _group_usage(machine: MachineModel, d: FlowDemand, ranks: list[int], add: Callable[[Any, float], None]) -> None:
    """A collective's links: of a rank's link bytes, the share that leaves its node crosses its
    NICs. A ring crosses to the next node once per node and ring, and NCCL spreads its rings
    over the NICs of the node's m members: 1/m of a member's bytes. All-pairs traffic goes to
    the n - m members elsewhere: (n - m)/(n - 1)."""
    n = d.group_size or len(ranks)
    node = machine.node_of
    members = Counter(node(r) for r in ranks)
    multi = len(members) > 1
    mesh = machine.topology == "mesh"
    for i, r in enumerate(ranks):
        add(("hbm", r), d.hbm_coeff)
        if n < 2:
            continue
        m = members[node(r)]
        intra = d.link_coeff
        port = machine.nic_port(r)
        if d.net_coeff is not None:
            add(("nic_out", port, -1), d.net_coeff)
            add(("nic_in", port, -1), d.net_coeff)
        elif multi:
            net = (n - m) / (n - 1) if d.pattern == "all_pairs" else 1.0 / m
            add(("nic_out", port, -1), d.link_coeff * net)
            add(("nic_in", port, -1), d.link_coeff * net)
            intra = d.link_coeff * (1.0 - net)
        if not mesh:
            add(("egress", r, -1), intra)
            add(("ingress", r, -1), intra)
            continue
        peers = [s for s in ranks if s != r and node(s) == node(r)]
        if d.pattern == "all_pairs" or multi:
            for s in peers:
                add(("link", r, s), intra / len(peers))
        else:
            add(("link", r, ranks[(i + 1) % len(ranks)]), intra)
