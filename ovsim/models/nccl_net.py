"""NCCL across nodes: its cost model where a communicator spans nodes joined by NICs.

Read from ``NVIDIA/nccl`` at v2.29 (``src/graph/tuning.cc``, ``search.cc``, ``connect.cc``); as in
:mod:`ovsim.models.nccl`, [D] marks our derivations, [R] values not re-read, [F] a value fitted on
published measurements. What NCCL's model does across nodes, and what ovsim takes from it:

* The inter-node search gives every channel the fastest speed of a ladder (``speedArrayInter``)
  that the GPU's path to its NIC carries: the NIC's line rate or, below it, the PCIe link as NCCL
  rates it. A 400 Gb/s NIC behind PCIe Gen5 counts 48 GB/s, a 200 Gb/s one behind Gen4 24 GB/s,
  the per-NIC figures NVIDIA's maintainers quote (NVIDIA/nccl-tests #290, #119). A channel
  takes one NIC's budget, so the search finds one channel per NIC under the communicator's GPUs
  on a node, and the bus bandwidth is ``channels x speed`` with the per-channel caps of
  ``tuning.cc``'s tables at 2 and at 4+ nodes.
* Latency: ring steps that cross the network pay ``hwLat[NET]`` (``nInterSteps``), the others
  the NVLink hop raised to NCCL's network overhead (1 us, x3 for Simple; Intel hosts assumed);
  tree pays the chain within a node and ``log2(nodes)`` network hops each way; NVLS-tree one NVLS
  hop and ``2 log2(nodes)`` network hops.
* NVLS-tree's pipeline: a message of a few chunks per channel and NVLS head pays the stages
  beyond the slowest once, a time NCCL's model lacks; ovsim adds it to the latency after NCCL's
  choice (:func:`nvls_tree_fill_s`) [F].
* NVLS needs SHARP (CollNet) across nodes, which ovsim does not model; NVLS-tree runs without it
  (all-reduce, Simple, sm90+ nodes with NVSwitch SHARP). CollNet and PAT are not modelled.

Where a member's bytes go (``shares``) is ours [D]: the engine charges each member's NVLink port
and NICs with them, so concurrent collectives share the network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# (2 nodes, 4+ nodes) columns of tuning.cc's per-node-count tables.
PerNodes = tuple[float, float]


@dataclass(frozen=True)
class NetParams:
    """NCCL's inter-node constants (tuning.cc and search.cc, v2.29.2)."""

    # hwLat[NCCL_HW_NET], per protocol (LL, LL128, Simple).
    ring_net_hop_latency_s: tuple[float, float, float] = (2.7e-6, 4.0e-6, 14.0e-6)
    tree_net_hop_latency_s: tuple[float, float, float] = (5.0e-6, 8.5e-6, 14.0e-6)
    nvls_tree_net_latency_s: float = 20.9e-6
    # hwLat[NCCL_HW_NVLINK][NVLS_TREE][Simple].
    nvls_tree_nvlink_latency_s: float = 25.0e-6
    # getNetOverhead: 1 us on Intel x86 hosts (2 on AMD), x3 for Simple; a ring's intra-node hop
    # costs at least that once the communicator spans nodes.
    net_overhead_s: float = 1.0e-6
    net_overhead_simple_factor: float = 3.0
    # ncclTopoGetAlgoTime: a multi-node Ring/Simple all-reduce with at least 64 B per channel and
    # rank pays its latency x1.4 (x1.9 before sm80).
    ring_plateau_latency_factor: float = 1.4
    ring_plateau_latency_factor_pre_sm80: float = 1.9
    ring_plateau_min_bytes: float = 64.0
    # search.cc speedArrayInter (Volta, Ampere), sm90SpeedArrayInter, sm100SpeedArrayInter, GB/s.
    speed_ladder_inter: tuple[tuple[float, ...], ...] = (
        (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
        (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12),
        (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
        (96.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24,
         0.12),
    )
    # llMaxBws for multi-node communicators, Intel host row (2 nodes, 4+), GB/s.
    ll_max_bw_gb_s: PerNodes = (39.0, 20.4)
    # perChMaxRingLL128Bws, perChMaxTreeBws, perChMaxTreeLL128Bws, perChMaxNVLSTreeBws per
    # architecture (Volta, Ampere, Hopper, Blackwell), columns (2 nodes, 4+), GB/s per search channel.
    ring_ll128_max_gb_s: tuple[PerNodes, ...] = ((20.0, 20.0), (20.0, 20.0), (36.7, 36.7), (34.6, 34.5))
    tree_max_gb_s: tuple[PerNodes, ...] = ((18.5, 10.0), (23.6, 17.8), (41.4, 36.0), (42.8, 24.0))
    tree_ll128_max_gb_s: tuple[PerNodes, ...] = ((20.0, 20.0), (20.0, 20.0), (36.7, 29.0), (31.67, 20.0))
    nvls_tree_max_gb_s: tuple[PerNodes, ...] = ((0.0, 0.0), (0.0, 0.0), (57.7, 45.5), (96.0, 43.8))
    # NVLS-tree's pipeline (enqueue.cc calcCollChunking): the NVLS chunk (NCCL_NVLS_CHUNKSIZE), held
    # to 64 KiB from 4 nodes (NCCL_NVLSTREE_MAX_CHUNKSIZE's default), then halved for messages of
    # fewer than 4 and 1 chunks per channel and NVLS head.
    nvls_chunk_bytes: int = 131072
    nvls_tree_chunk_cap_bytes: int = 65536
    nvls_tree_chunk_cap_from_nodes: int = 4
    # [F] The stages of that pipeline beyond its slowest, in units of the slowest's time per step:
    # a chunk passes scatter, NVLS reduce, the network up and down, NVLS broadcast and gather
    # (all_reduce.h), a whole chunk at a time, and a message of a few chunks a channel pays them
    # once. Fitted (least mean relative error, 0.05 steps) on NVIDIA/nccl-tests #309's 2-node
    # H100 sweep at its 11 sizes from 16 MiB, where each channel's head takes two chunks or more
    # (1.8% there); held out on two more sweeps (docs/design.md, "Nodes joined by NICs").
    nvls_tree_fill_stages: float = 1.85
    # Hopper and later settle on the simpler (unbalanced) tree pattern, which tuning.cc charges x0.85.
    tree_pattern_factor: float = 0.85
    # connect.cc: two CTAs per search channel, and on sm90+ two more when the intra-node speed is
    # above 45 GB/s and there are fewer than 16.
    ctas_per_search_channel: int = 2
    sm90_extra_cta_speed_gb_s: float = 45.0
    sm90_extra_cta_below: int = 16


NET_PARAMS = NetParams()


@dataclass(frozen=True)
class Span:
    """A communicator across nodes, as NCCL's model sees it."""

    arch: int  # row of the per-architecture tables (0 Volta .. 3 Blackwell)
    n_ranks: int
    n_nodes: int
    # Its fewest members on one node: the node with the fewest NICs under it sets the pace.
    node_ranks: int
    # Search channels (one per NIC under those members) and the speed NCCL gives each, bytes/s.
    channels: int
    speed_bytes_per_s: float

    @property
    def column(self) -> int:
        return 0 if self.n_nodes <= 2 else 1


def channel_speed_bytes_per_s(nic_bytes_per_s: float, pcie_bytes_per_s: float, arch: int,
                              params: NetParams = NET_PARAMS) -> float:
    """The ladder speed NCCL's inter-node search gives a channel through one NIC: the fastest that
    the NIC and the GPU's PCIe path (at NCCL's rating of it) both carry."""
    most = min(nic_bytes_per_s, pcie_bytes_per_s) / 1e9
    fitting = [x for x in params.speed_ladder_inter[arch] if x <= most]
    return (fitting[0] if fitting else most) * 1e9


def search_channels(nics_under_members: float, path_bytes_per_s: float, speed_bytes_per_s: float) -> int:
    """Channels the search fits: as many per NIC as the GPU-to-NIC path (the least of the NIC's
    line rate and PCIe as NCCL rates it) holds at the speed, at least one."""
    per_nic = max(1, math.floor(path_bytes_per_s / speed_bytes_per_s + 1e-9))
    return max(1, math.floor(nics_under_members * per_nic + 1e-9))


def default_ctas(span: Span, params: NetParams = NET_PARAMS) -> int:
    """CTAs a launch uses across nodes (connect.cc)."""
    ctas = params.ctas_per_search_channel * span.channels
    if span.arch >= 2 and span.speed_bytes_per_s > params.sm90_extra_cta_speed_gb_s * 1e9 and \
            ctas < params.sm90_extra_cta_below:
        ctas *= 2
    return min(ctas, 64)


def ring_bus_bw(span: Span, protocol: str, intra_bus_bytes_per_s: float, op: str,
                params: NetParams = NET_PARAMS) -> float:
    """Ring (or p2p) bus bandwidth across nodes: NCCL's channels x speed with its protocol caps,
    and never beyond what NVLink carries of the share that stays on it (``intra_bus_bytes_per_s``
    is the communicator's ring rate within one node) [D]."""
    bus = span.channels * span.speed_bytes_per_s
    if protocol == "ll":
        bus = min(params.ll_max_bw_gb_s[span.column] * 1e9, 0.5 * bus)
    elif protocol == "ll128":
        bus = min(0.92 * bus, span.channels * params.ring_ll128_max_gb_s[span.arch][span.column] * 1e9)
    nvlink_share, net_share = shares(op, "ring", span)
    per_member_net = span.channels * span.speed_bytes_per_s / span.node_ranks
    if op in ("all_to_all", "send_recv"):
        bus = min(bus, per_member_net / net_share)
    if nvlink_share > 0:
        bus = min(bus, intra_bus_bytes_per_s / nvlink_share)
    return bus


def tree_bus_bw(span: Span, protocol: str, params: NetParams = NET_PARAMS) -> float:
    """Tree all-reduce's bus bandwidth as tuning.cc defines it (2x the algorithm bandwidth). Up to
    2 nodes NCCL rates a channel at the tree graph's intra-node speed, which its search raises to
    twice the inter-node one [D: we take that bound]."""
    speed = span.speed_bytes_per_s * (2.0 if span.n_nodes <= 2 else 1.0)
    bus = span.channels * speed
    bus = min(0.92 * bus, span.channels * params.tree_max_gb_s[span.arch][span.column] * 1e9)
    if protocol == "ll":
        bus = min(bus / 3.8, params.ll_max_bw_gb_s[span.column] * 1e9)
    elif protocol == "ll128":
        bus = min(bus * 120.0 / 128.0, span.channels * params.tree_ll128_max_gb_s[span.arch][span.column] * 1e9)
    if span.arch >= 2:
        bus *= params.tree_pattern_factor
    return bus


def nvls_tree_bus_bw(span: Span, nvls_intra_bytes_per_s: float, params: NetParams = NET_PARAMS) -> float:
    """NVLS-tree all-reduce's bus bandwidth: per channel the least of NVLS within the node
    (``nvls_intra_bytes_per_s``: speed x efficiency x (c - 1)/c x 2, as within one node), the
    network (doubled up to 2 nodes) and tuning.cc's per-channel cap."""
    inter = span.speed_bytes_per_s * (2.0 if span.n_nodes <= 2 else 1.0)
    cap = params.nvls_tree_max_gb_s[span.arch][span.column] * 1e9
    return span.channels * min(nvls_intra_bytes_per_s, inter, cap)


def ring_latency_s(span: Span, op: str, protocol: int, nsteps: int, base_s: float, nvlink_hop_s: float,
                   size_bytes: float, ctas: int, params: NetParams = NET_PARAMS, plateau: bool = True) -> float:
    """NCCL's model latency of a ring across nodes. ``plateau``: with tuning.cc's factor for a
    multi-node Simple all-reduce ("plateau effect of ring"), which steers NCCL's choice; the time
    leaves it out (published sweeps, docs/design.md, "Nodes joined by NICs")."""
    if op in ("broadcast", "reduce"):
        # tuning.cc: a pipelined chain whose channels all follow one ring pays one (network) hop.
        return base_s + params.ring_net_hop_latency_s[protocol]
    overhead = params.net_overhead_s * (params.net_overhead_simple_factor if protocol == 2 else 1.0)
    intra = max(nvlink_hop_s, overhead)
    # One member per node: every hop crosses the network, at the tree's network latency.
    inter = (params.tree_net_hop_latency_s if span.node_ranks == 1 else params.ring_net_hop_latency_s)[protocol]
    if op == "all_reduce":
        inter_steps = 2 * (span.n_nodes - 1)
    elif op in ("all_gather", "reduce_scatter"):
        inter_steps = span.n_nodes - 1
    else:
        inter_steps = span.n_nodes
    inter_steps = min(inter_steps, nsteps)
    lat = base_s + (nsteps - inter_steps) * intra + inter_steps * inter
    per_channel_rank = size_bytes / max(ctas * span.n_ranks, 1)
    if plateau and op == "all_reduce" and protocol == 2 and per_channel_rank >= params.ring_plateau_min_bytes:
        lat *= params.ring_plateau_latency_factor if span.arch >= 1 else params.ring_plateau_latency_factor_pre_sm80
    return lat


def tree_latency_s(span: Span, protocol: int, base_s: float, nvlink_hop_s: float,
                   params: NetParams = NET_PARAMS) -> float:
    depth = (span.node_ranks - 1) * nvlink_hop_s + _log2i(span.n_nodes) * params.tree_net_hop_latency_s[protocol]
    return base_s + 2 * depth


def nvls_tree_chunk_bytes(size_bytes: float, span: Span, channels: int, params: NetParams = NET_PARAMS) -> int:
    """The chunk NCCL's NVLS-tree all-reduce moves per channel and NVLS head (one per GPU of a
    node): enqueue.cc's rules for ``size_bytes`` on ``channels`` channels."""
    chunk = params.nvls_chunk_bytes
    if span.n_nodes >= params.nvls_tree_chunk_cap_from_nodes:
        chunk = min(chunk, params.nvls_tree_chunk_cap_bytes)
    ops = channels * span.node_ranks
    for times, to in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
        if size_bytes < times * ops * chunk and chunk > to:
            chunk = to
    return chunk


def nvls_tree_fill_s(size_bytes: float, span: Span, channels: int, algorithm_bw_bytes_per_s: float,
                     params: NetParams = NET_PARAMS) -> float:
    """What NVLS-tree's pipeline adds to its latency: the stages beyond the slowest, each a step of
    every channel and head at the algorithm bandwidth [F]. A step moves a chunk, or all there is
    where a channel's head has less. Being latency, it does not stretch when the flow shares its
    NICs or links."""
    heads = channels * span.node_ranks
    step_bytes = min(float(heads * nvls_tree_chunk_bytes(size_bytes, span, channels, params)), size_bytes)
    return params.nvls_tree_fill_stages * step_bytes / algorithm_bw_bytes_per_s


def nvls_tree_latency_s(span: Span, params: NetParams = NET_PARAMS) -> float:
    return params.nvls_tree_nvlink_latency_s + 2 * _log2i(span.n_nodes) * params.nvls_tree_net_latency_s


def shares(op: str, algorithm: str, span: Span) -> tuple[float, float]:
    """(NVLink port bytes, NIC bytes) of each member per bus byte [D].

    Ring: a pass leaves each node once, and NCCL spreads its rings over the NICs of the node's m
    members: 1/m of a member's bytes cross its NIC, (m - 1)/m stay on NVLink. Tree and NVLS-tree
    move each node's data once up and once down the tree across nodes, 2(N - 1)/N S per node
    against the 2(n - 1)/n S of the bus, spread over its m members; within the node the tree's
    chain and NVLS move what they do on one node. All-to-all sends (n - m)/(n - 1) of a member's
    bytes to other nodes, a send/recv between nodes all of them.
    """
    n, m, nodes = span.n_ranks, span.node_ranks, span.n_nodes
    if op == "all_to_all":
        return (m - 1) / (n - 1), (n - m) / (n - 1)
    if op == "send_recv":
        return 0.0, 1.0
    if algorithm in ("tree", "nvls_tree"):
        net = (nodes - 1) / nodes * n / (n - 1) / m
        if algorithm == "tree":
            return n / (n - 1) * (m - 1) / m, net
        return (1.0 + 1.0 / m) * n / (2.0 * (n - 1)), net
    return (m - 1) / m, 1.0 / m


def _log2i(n: int) -> int:
    return max(n, 1).bit_length() - 1
