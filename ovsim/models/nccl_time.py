"""NCCL's time for one collective on a communicator: ``latency + size / algorithm bandwidth``
per (algorithm, protocol), as ``src/graph/tuning.cc`` tabulates it (read at v2.30), and the HBM
and link bytes each bus byte costs a rank. :mod:`ovsim.models.nccl` builds the communicator
(:class:`Comm`) and picks the fastest pair; the conventions ([D], CTAs against search channels)
are stated there."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from ovsim.errors import OvsimError
from ovsim.models import nccl_net
from ovsim.models.nccl_net import Span
from ovsim.models.nccl_params import (
    _PROTO_INDEX,
    _TREE_CORRECTION,
    OPS,
    P2P_OPS,
    REDUCING_OPS,
    Algorithm,
    CollectiveOp,
    NcclParams,
    Path,
    Protocol,
)


def check_op(op: str) -> CollectiveOp:
    if op not in OPS:
        raise OvsimError(f"unknown collective '{op}' (known: {', '.join(OPS)})", field="op")
    return op


def check_ranks(n_ranks: int) -> int:
    try:
        n = operator.index(n_ranks)
    except TypeError:
        n = 0
    if n < 1 or isinstance(n_ranks, bool):
        raise OvsimError(f"must be an integer >= 1, got {n_ranks!r}", field="n_ranks")
    return n


def bus_factor(op: CollectiveOp, n_ranks: int) -> float:
    """nccl-tests' busbw / algbw factor (doc/PERFORMANCE.md)."""
    check_op(op)
    n = check_ranks(n_ranks)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Comm:
    """What NCCL knows about a communicator when it builds its tuning tables."""

    op: CollectiveOp
    n_ranks: int
    arch: int
    path: Path
    # NCCL's bandwidth total for this op's pattern: what all of a rank's links can carry.
    link_cap_bytes_per_s: float
    ring_channels: int
    nvls_channels: int
    nvls: bool
    topology: str
    params: NcclParams
    # Across nodes: the communicator's span (None within one node), whether NVLS-tree may run, and
    # the CTAs a launch uses there.
    span: Span | None = None
    nvls_tree: bool = False
    net_ctas: int = 0
    # NVLS on this system (sm90+, NVSwitch with SHARP), whatever the communicator's shape.
    nvls_possible: bool = False

    @property
    def multi_node(self) -> bool:
        return self.span is not None


def ring_bus_bw(comm: Comm, channels: int) -> float:
    """A ring's (or p2p's) bus bandwidth within a node: NCCL's per-CTA rate up to its link total."""
    p = comm.params
    return min(channels * p.ring_bw_per_channel_bytes_per_s[comm.arch], comm.link_cap_bytes_per_s)


def nvls_speed(comm: Comm, gpus: int | None = None) -> float:
    """Per-channel speed the intra-node NVLS search settles on (one channel per GPU of the node)."""
    ladder = comm.params.nvls_speed_ladder_bytes_per_s
    gpus = comm.n_ranks if gpus is None else gpus
    fitting = [s for s in ladder if s * gpus <= comm.link_cap_bytes_per_s]
    return fitting[0] if fitting else ladder[-1]


def nsteps(op: CollectiveOp, n: int) -> int:
    if op == "all_reduce":
        return 2 * (n - 1)
    if op in ("all_gather", "reduce_scatter"):
        return n - 1
    return n


def link_bytes_per_bus_byte(op: CollectiveOp, algorithm: Algorithm, n: int) -> float:
    """Bytes through the busier direction of a rank's link port per bus byte [D].

    Ring, p2p, broadcast, reduce: each rank sends (and receives) exactly the bus bytes, 1.0.
    Tree all-reduce (a chain within a node): a middle rank sends S up and S down, 2S against
    2(n-1)/n S bus bytes -> n/(n-1).
    NVLS all-reduce: a rank's link carries its whole input to the switch for the reductions
    (multimem.ld_reduce reads every rank, itself included) plus its reduced shard S/n out for the
    multicast store; inbound, the reduced shard plus the multicast of all n shards: (1 + 1/n) S
    each way against 2(n-1)/n S -> (n+1)/(2(n-1)), 9/14 for 8 GPUs. NVLS all-gather receives all n
    shards (S) and reduce-scatter sends its whole input (S) against (n-1)/n S -> n/(n-1).
    """
    if n < 2:
        return 1.0
    if algorithm == "tree":
        return n / (n - 1)
    if algorithm == "nvls":
        if op == "all_reduce":
            return (n + 1) / (2 * (n - 1))
        return n / (n - 1)
    return 1.0


def hbm_bytes_per_bus_byte(op: CollectiveOp, algorithm: Algorithm, n: int, params: NcclParams,
                            net_bytes_per_bus_byte: float = 0.0) -> float:
    """Local HBM bytes per bus byte, per rank.

    Ring and p2p follow NVIDIA/nccl #1428 (3 per link byte when the step reduces, 2 when it
    copies). Tree all-reduce reduces on the way up and copies on the way down: the mean of the two
    per link byte, times its n/(n-1) link bytes per bus byte.
    NVLS [D]: the switch does the arithmetic, so the rank's HBM serves the switch's reads (S) and
    absorbs its multicast writes (S) for all-reduce; unregistered buffers add a local copy into
    NVLS's buffer (read + write S) and one back out (read + write S): 6S against 2(n-1)/n S, or 2S
    when registered. All-gather: multicast lands S and the copies add ~2S + 2S/n, reduce-scatter
    symmetric; registered, S + S/n.
    NVLS-tree [D]: NVLS's figure within the node, plus a reducing ring's 3 HBM bytes per byte the
    member sends across nodes (``net_bytes_per_bus_byte``).
    """
    ring = params.hbm_bytes_per_bus_byte_reduce if op in REDUCING_OPS else params.hbm_bytes_per_bus_byte_copy
    if n < 2:
        return ring
    bus = bus_factor(op, n)
    if algorithm == "tree":
        per_link = 0.5 * (params.hbm_bytes_per_bus_byte_reduce + params.hbm_bytes_per_bus_byte_copy)
        return per_link * link_bytes_per_bus_byte(op, algorithm, n)
    if algorithm == "nvls_tree":
        return (hbm_bytes_per_bus_byte(op, "nvls", n, params)
                + params.hbm_bytes_per_bus_byte_reduce * net_bytes_per_bus_byte)
    if algorithm == "nvls":
        if op == "all_reduce":
            per_rank_s = 2.0 if params.nvls_registered_buffers else 6.0
        else:
            per_rank_s = 1.0 + 1.0 / n if params.nvls_registered_buffers else 3.0 + 3.0 / n
        return per_rank_s / bus
    return ring


def algorithm_bw(comm: Comm, algorithm: Algorithm, protocol: Protocol, channels: int) -> float:
    """NCCL's algorithm bandwidth (size / time once latency is paid) for ``channels`` CTAs."""
    p = comm.params
    a = comm.arch
    n = comm.n_ranks
    op = comm.op
    if comm.span is not None:
        return net_algorithm_bw(comm, algorithm, protocol, channels)
    search_channels = channels / p.channels_per_search_channel
    ring_bus = ring_bus_bw(comm, channels)

    if algorithm == "nvls":
        eff = p.nvls_efficiency[a]
        graph_channels = n
        per_channel = nvls_speed(comm) * eff * (graph_channels - 1) / graph_channels
        per_channel *= 2.0 if op == "all_reduce" else (n - 1) / n
        bw = graph_channels * per_channel * min(1.0, channels / max(p.nvls_channels[a], 1))
        # tuning.cc converts NVLS all-reduce like a ring; for all-gather/reduce-scatter the
        # figure already is the algorithm bandwidth.
        alg_bw = bw * n / nsteps(op, n) if op == "all_reduce" else bw
        # Never faster than the rank's links can feed the switch.
        link_limit = comm.link_cap_bytes_per_s / (link_bytes_per_bus_byte(op, "nvls", n) * bus_factor(op, n))
        return min(alg_bw, link_limit)

    if algorithm == "tree":
        bus = min(p.tree_bw_fraction * ring_bus,
                  search_channels * p.tree_max_bw_per_search_channel_bytes_per_s[a])
        if protocol == "ll":
            bus = min(bus / p.tree_ll_bw_divisor, p.ll_max_bw_bytes_per_s[a])
        elif protocol == "ll128":
            bus = min(bus * p.tree_ll128_bw_fraction,
                      search_channels * p.tree_ll128_max_bw_per_search_channel_bytes_per_s[a])
        return bus * p.tree_algorithm_bw_ratio

    bus = ring_bus
    if protocol == "ll":
        bus = min(p.ll_max_bw_bytes_per_s[a], p.ll_bw_fraction * bus)
    elif protocol == "ll128":
        bus = min(p.ll128_bw_fraction * bus,
                  search_channels * p.ring_ll128_max_bw_per_search_channel_bytes_per_s[a])
    if op in P2P_OPS:
        # [D] p2p moves its bus bytes at the ring rate; convert with nccl-tests' factor.
        return bus / bus_factor(op, n)
    return bus * n / nsteps(op, n)


def net_algorithm_bw(comm: Comm, algorithm: Algorithm, protocol: Protocol, channels: int) -> float:
    """Algorithm bandwidth across nodes (:mod:`ovsim.models.nccl_net`); fewer CTAs than NCCL's
    default give proportionally less [D]."""
    span = comm.span
    assert span is not None
    p = comm.params
    op, n = comm.op, comm.n_ranks
    scale = min(1.0, channels / max(comm.net_ctas, 1))
    if algorithm in ("tree", "nvls_tree"):
        if algorithm == "tree":
            alg = nccl_net.tree_bus_bw(span, protocol) * p.tree_algorithm_bw_ratio
        else:
            m = span.node_ranks
            intra = nvls_speed(comm, m) * p.nvls_efficiency[comm.arch] * (m - 1) / m * 2.0
            alg = nccl_net.nvls_tree_bus_bw(span, intra) * n / nsteps(op, n)
        # Never faster than the node's links carry the share that stays on them [D].
        nvlink_share = nccl_net.shares(op, algorithm, span)[0]
        if nvlink_share > 0:
            links = ring_bus_bw(comm, comm.ring_channels) if algorithm == "tree" else comm.link_cap_bytes_per_s
            alg = min(alg, links / (nvlink_share * bus_factor(op, n)))
        return alg * scale
    bus = nccl_net.ring_bus_bw(span, protocol, ring_bus_bw(comm, comm.ring_channels), op) * scale
    if op in P2P_OPS:
        return bus / bus_factor(op, n)
    return bus * n / nsteps(op, n)


def net_latency_s(comm: Comm, algorithm: Algorithm, protocol: Protocol, size_bytes: float, ctas: int,
                  plateau: bool = True) -> float:
    span = comm.span
    assert span is not None
    p = comm.params
    i = _PROTO_INDEX[protocol]
    pcie = comm.path == "pcie"
    if algorithm == "tree":
        hop = (p.tree_pcie_hop_latency_s if pcie else p.tree_nvlink_hop_latency_s)[i]
        return nccl_net.tree_latency_s(span, i, p.tree_base_latency_s[i], hop)
    if algorithm == "nvls_tree":
        return nccl_net.nvls_tree_latency_s(span)
    hop = (p.ring_pcie_hop_latency_s if pcie else p.ring_nvlink_hop_latency_s)[i]
    return nccl_net.ring_latency_s(span, comm.op, i, nsteps(comm.op, comm.n_ranks), p.ring_base_latency_s[i], hop,
                                   size_bytes, ctas, plateau=plateau)


def latency_s(comm: Comm, algorithm: Algorithm, protocol: Protocol, size_bytes: float = 0.0,
              ctas: int = 0, plateau: bool = True) -> float:
    """NCCL's model latency of ``algorithm``/``protocol``; ``plateau=False`` leaves out the factor
    NCCL's choice charges a multi-node Simple ring (``nccl_net.ring_latency_s``), for the time."""
    p = comm.params
    i = _PROTO_INDEX[protocol]
    n = comm.n_ranks
    op = comm.op
    pcie = comm.path == "pcie"
    if algorithm == "nvls":
        return p.nvls_base_latency_s + p.nvls_nvlink_latency_s
    if comm.span is not None and op not in P2P_OPS:
        return net_latency_s(comm, algorithm, protocol, size_bytes, ctas, plateau)
    if algorithm == "tree":
        hop = (p.tree_pcie_hop_latency_s if pcie else p.tree_nvlink_hop_latency_s)[i]
        return p.tree_base_latency_s[i] + 2 * (n - 1) * hop
    ring_hop = (p.ring_pcie_hop_latency_s if pcie else p.ring_nvlink_hop_latency_s)[i]
    base = p.ring_base_latency_s[i]
    net_hop = nccl_net.NET_PARAMS.ring_net_hop_latency_s[i]
    if op == "send_recv":
        # [D] one hop (across the network when the pair spans nodes); NCCL's tuning tables do not
        # cover p2p.
        return base + (net_hop if comm.span is not None else ring_hop)
    if op == "all_to_all":
        # [D] one hop per peer: the node's other members over NVLink, the rest over the network.
        if comm.span is None:
            return base + (n - 1) * ring_hop
        local = comm.span.node_ranks - 1
        return base + local * ring_hop + (n - 1 - local) * net_hop
    if op in ("broadcast", "reduce"):
        # tuning.cc: a pipelined chain pays one hop when all channels follow the same ring (NVSwitch
        # and PCIe rings repeat one GPU order [D]); otherwise nsteps hops, Simple at the tree's rate.
        if comm.topology != "mesh":
            return base + ring_hop
        tree_hop = (p.tree_pcie_hop_latency_s if pcie else p.tree_nvlink_hop_latency_s)[i]
        hop = tree_hop if protocol == "simple" else ring_hop
        return base + nsteps(op, n) * hop
    return base + nsteps(op, n) * ring_hop


def tree_correction(size_bytes: float, protocol: Protocol) -> float:
    table = _TREE_CORRECTION[_PROTO_INDEX[protocol]]
    units = int(size_bytes) >> 6
    log_size = units.bit_length() - 1 if units > 0 else 0
    return table[log_size] if log_size < len(table) else 1.0


def predicted_s(comm: Comm, algorithm: Algorithm, protocol: Protocol, size_bytes: float,
                 channels: int) -> float:
    bw = algorithm_bw(comm, algorithm, protocol, channels)
    if algorithm == "tree":
        bw *= tree_correction(size_bytes, protocol)
    if bw <= 0:
        return math.inf
    return latency_s(comm, algorithm, protocol, size_bytes, channels) + size_bytes / bw
