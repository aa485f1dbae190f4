"""NCCL's own isolated-cost model of a collective, and the blocks its kernels launch.

The time model is the one NCCL uses to pick an algorithm and protocol (``NVIDIA/nccl``
``src/graph/tuning.cc``, read at v2.30):

    time = latency[op][algorithm][protocol] + S / algorithm_bandwidth[op][algorithm][protocol]

and the choice is the argmin over the enabled (algorithm, protocol) pairs. Within a node it covers
NVSwitch, NVLink mesh and PCIe; across nodes joined by NICs, ring, tree and NVLS-tree
(docs/design.md, "Nodes joined by NICs"). NVLS runs within one node; CollNet (network SHARP),
PAT and PXN's routing are not modelled.

Where NCCL's numbers come from a topology search we do not run (``src/graph/search.cc``), the
search result is replaced by a rule stated next to the constant it uses, tagged [D] (our
derivation). Everything is SI inside: seconds, bytes, bytes per second.

Channels. NCCL's cost model multiplies per-*search*-channel speeds by the search channel count, and
launches two execution channels (CTAs) per search channel (``src/graph/connect.cc``). ovsim counts
CTAs, so:

* ring bus bandwidth = min(CTAs x ``ring_bw_per_channel``, NCCL's link total): fewer CTAs give
  proportionally less, more CTAs never exceed what the links carry;
* NCCL's per-search-channel caps (LL128, tree) are applied to CTAs / ``channels_per_search_channel``;
* NVLS bandwidth is NCCL's figure times min(1, CTAs / NCCL's default NVLS CTA count), because NCCL
  chose that default as the count that reaches peak ("NVLS should not need more than 16 channels
  to get peak BW", ``src/enqueue.cc``).

``channels=`` plays the part of ``NCCL_MIN_CTAS``/``NCCL_MAX_CTAS`` (it sets the communicator's
count, which the bandwidth is computed from). The per-operation small-message reduction of
``src/enqueue.cc`` then decides how many CTAs one launch really uses; as in NCCL it does not change
the modeled bandwidth, since it only triggers when every thread would have less than a few dozen
bytes to move, i.e. when the operation is latency-bound.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ovsim.errors import OvsimError
from ovsim.hw.spec import GpuSpec, SystemSpec, check_domain
from ovsim.models import nccl_net
from ovsim.models.ir import BlockShape
from ovsim.models.nccl_net import Span
from ovsim.models.nccl_params import (
    _PROTO_INDEX,
    _SEARCH_ORDER,
    _TREE_CORRECTION,
    ALGORITHMS,
    DEFAULT_PARAMS,
    NVLS_OPS,
    OPS,
    P2P_OPS,
    PROTOCOLS,
    REDUCING_OPS,
    Algorithm,
    CollectiveOp,
    NcclParams,
    Path,
    Protocol,
)


@dataclass(frozen=True)
class CollectivePlan:
    """How NCCL runs one collective on one communicator, and what its own model says it costs.

    ``channels`` is the number of CTAs the launch uses (one per SM: ``src/enqueue.cc``, NVIDIA/nccl #689), after
    NCCL's small-message reduction; the bandwidth is NCCL's model at the communicator's channel
    count. ``link_bytes_per_bus_byte`` and ``hbm_bytes_per_bus_byte`` are per rank and per byte of
    ``bus_bytes``; link bytes count the busier direction of the rank's GPU-to-GPU port.
    """

    op: CollectiveOp
    algorithm: Algorithm
    protocol: Protocol
    n_ranks: int
    size_bytes: float
    channels: int
    threads_per_block: int
    registers_per_thread: int
    shared_mem_per_block_bytes: int
    latency_s: float
    bus_bandwidth_bytes_per_s: float
    bus_bytes: float
    link_bytes_per_bus_byte: float
    hbm_bytes_per_bus_byte: float
    n_nodes: int = 1
    # Across nodes: bytes through each member's NICs per bus byte (link bytes are then NVLink's).
    net_bytes_per_bus_byte: float = 0.0

    @property
    def isolated_s(self) -> float:
        return self.latency_s + self.bus_bytes / self.bus_bandwidth_bytes_per_s

    @property
    def algorithm_bandwidth_bytes_per_s(self) -> float:
        """``size_bytes / isolated_s`` as nccl-tests reports it; infinite for a free operation."""
        t = self.isolated_s
        return self.size_bytes / t if t > 0 else math.inf

    @property
    def block(self) -> BlockShape:
        return BlockShape(self.threads_per_block, self.registers_per_thread, self.shared_mem_per_block_bytes)


def _check_op(op: str) -> CollectiveOp:
    if op not in OPS:
        raise OvsimError(f"unknown collective '{op}' (known: {', '.join(OPS)})", field="op")
    return op


def _check_ranks(n_ranks: int) -> int:
    try:
        n = operator.index(n_ranks)
    except TypeError:
        n = 0
    if n < 1 or isinstance(n_ranks, bool):
        raise OvsimError(f"must be an integer >= 1, got {n_ranks!r}", field="n_ranks")
    return n


def bus_factor(op: CollectiveOp, n_ranks: int) -> float:
    """nccl-tests' busbw / algbw factor (doc/PERFORMANCE.md)."""
    _check_op(op)
    n = _check_ranks(n_ranks)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _compute_capability(gpu: GpuSpec) -> int:
    if gpu.vendor != "nvidia":
        raise OvsimError(f"{gpu.name}: the NCCL model covers NVIDIA GPUs only (RCCL is not modeled)",
                         field="gpu")
    cc = gpu.compute_capability
    if cc is None:
        raise OvsimError(f"{gpu.name}: architecture '{gpu.architecture}' is not an smNN compute capability",
                         field="architecture")
    return cc


def _arch_index(gpu: GpuSpec) -> int:
    """Row of NCCL's per-architecture tables for this GPU."""
    cc = _compute_capability(gpu)
    if cc >= 100:
        return 3
    if cc >= 90:
        return 2
    if cc >= 80:
        return 1
    return 0


@dataclass(frozen=True)
class _Comm:
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


def _link_cap(op: CollectiveOp, n_ranks: int, arch: int, gpu: GpuSpec, system: SystemSpec,
              params: NcclParams) -> tuple[Path, float]:
    if system.topology == "pcie":
        return "pcie", gpu.pcie.bandwidth_bytes_per_s * params.pcie_bw_fraction
    if gpu.links.kind != "nvlink" or gpu.links.count == 0:
        raise OvsimError(f"{system.name}: topology '{system.topology}' needs NVLinks, {gpu.name} has none",
                         field="topology")
    per_link = params.nvlink_bw_per_link_bytes_per_s[arch]
    if _compute_capability(gpu) == 86:
        per_link = params.nvlink_bw_per_link_sm86_bytes_per_s
    if system.topology == "nvswitch":
        return "nvlink", gpu.links.count * per_link
    # Mesh: a transfer to one peer has only that pair's links; rings over different peer orders use
    # the links to all n-1 peers (as many as the GPU has).
    if op == "send_recv":
        return "nvlink", system.links_per_pair * per_link
    links = min(gpu.links.count, system.links_per_pair * max(n_ranks - 1, 1))
    return "nvlink", links * per_link


def _even_up(x: int) -> int:
    return x + (x % 2)


def default_ring_channels(op: CollectiveOp, n_ranks: int, gpu: GpuSpec, system: SystemSpec,
                          params: NcclParams = DEFAULT_PARAMS) -> int:
    """NCCL's default CTA count for ring/tree/p2p on this system.

    The system's published ``nccl_ring_channels`` if it has one; otherwise [D] the fewest CTAs whose
    per-CTA rate fills NCCL's link total, rounded up to even (NCCL launches 2 CTAs per search
    channel) and kept within [2, 32]. That gives 24 on A100 NVSwitch (NVIDIA/nccl-tests #100) and 32 on
    H100 NVSwitch (uccl-project/uccl #205), 16 on an 8-link H800 (NVIDIA/nccl #892) and 4 on a PCIe Gen4 node.
    """
    if system.nccl_ring_channels is not None:
        return system.nccl_ring_channels
    arch = _arch_index(gpu)
    _, cap = _link_cap(op, n_ranks, arch, gpu, system, params)
    # Rounding guards the ceil against 370.8/11.6 landing a hair above an integer.
    raw = math.ceil(round(cap / params.ring_bw_per_channel_bytes_per_s[arch], 6))
    return max(params.min_default_channels, min(params.default_max_channels, _even_up(raw)))


def node_span(ranks: Sequence[int], system: SystemSpec) -> tuple[int, int]:
    """(nodes the ranks span, the fewest of them on one node)."""
    per_node = Counter(system.node_of(r) for r in ranks)
    return len(per_node), min(per_node.values()) if per_node else 1


def _nics_under_members(members: Sequence[int], system: SystemSpec) -> float:
    """NICs under the communicator's members on the node that has fewest (that node sets the pace)."""
    by_node: dict[int, list[int]] = {}
    for r in members:
        by_node.setdefault(system.node_of(r), []).append(r)
    return min(system.nics_under(rs) for rs in by_node.values())


def _span(members: Sequence[int], n_nodes: int, node_ranks: int, arch: int, gpu: GpuSpec, system: SystemSpec,
          params: NcclParams) -> Span | None:
    net = system.network
    if n_nodes < 2 or net is None:
        return None
    n_ranks = len(members)
    # The GPU-to-NIC path carries the least of the NIC's line rate and PCIe as NCCL rates it.
    path = min(net.bandwidth_per_nic_bytes_per_s, gpu.pcie.bandwidth_bytes_per_s * params.pcie_bw_fraction)
    speed = nccl_net.channel_speed_bytes_per_s(path, path, arch)
    nics = _nics_under_members(members, system)
    return Span(arch=arch, n_ranks=n_ranks, n_nodes=n_nodes, node_ranks=node_ranks,
                channels=nccl_net.search_channels(nics, path, speed), speed_bytes_per_s=speed)


def _ring_bus_bw(comm: _Comm, channels: int) -> float:
    """A ring's (or p2p's) bus bandwidth within a node: NCCL's per-CTA rate up to its link total."""
    p = comm.params
    return min(channels * p.ring_bw_per_channel_bytes_per_s[comm.arch], comm.link_cap_bytes_per_s)


def _nvls_speed(comm: _Comm, gpus: int | None = None) -> float:
    """Per-channel speed the intra-node NVLS search settles on (one channel per GPU of the node)."""
    ladder = comm.params.nvls_speed_ladder_bytes_per_s
    gpus = comm.n_ranks if gpus is None else gpus
    fitting = [s for s in ladder if s * gpus <= comm.link_cap_bytes_per_s]
    return fitting[0] if fitting else ladder[-1]


def _nsteps(op: CollectiveOp, n: int) -> int:
    if op == "all_reduce":
        return 2 * (n - 1)
    if op in ("all_gather", "reduce_scatter"):
        return n - 1
    return n


def _link_bytes_per_bus_byte(op: CollectiveOp, algorithm: Algorithm, n: int) -> float:
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


def _hbm_bytes_per_bus_byte(op: CollectiveOp, algorithm: Algorithm, n: int, params: NcclParams,
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
        return per_link * _link_bytes_per_bus_byte(op, algorithm, n)
    if algorithm == "nvls_tree":
        return (_hbm_bytes_per_bus_byte(op, "nvls", n, params)
                + params.hbm_bytes_per_bus_byte_reduce * net_bytes_per_bus_byte)
    if algorithm == "nvls":
        if op == "all_reduce":
            per_rank_s = 2.0 if params.nvls_registered_buffers else 6.0
        else:
            per_rank_s = 1.0 + 1.0 / n if params.nvls_registered_buffers else 3.0 + 3.0 / n
        return per_rank_s / bus
    return ring


def _algorithm_bw(comm: _Comm, algorithm: Algorithm, protocol: Protocol, channels: int) -> float:
    """NCCL's algorithm bandwidth (size / time once latency is paid) for ``channels`` CTAs."""
    p = comm.params
    a = comm.arch
    n = comm.n_ranks
    op = comm.op
    if comm.span is not None:
        return _net_algorithm_bw(comm, algorithm, protocol, channels)
    search_channels = channels / p.channels_per_search_channel
    ring_bus = _ring_bus_bw(comm, channels)

    if algorithm == "nvls":
        eff = p.nvls_efficiency[a]
        graph_channels = n
        per_channel = _nvls_speed(comm) * eff * (graph_channels - 1) / graph_channels
        per_channel *= 2.0 if op == "all_reduce" else (n - 1) / n
        bw = graph_channels * per_channel * min(1.0, channels / max(p.nvls_channels[a], 1))
        # tuning.cc converts NVLS all-reduce like a ring; for all-gather/reduce-scatter the
        # figure already is the algorithm bandwidth.
        alg_bw = bw * n / _nsteps(op, n) if op == "all_reduce" else bw
        # Never faster than the rank's links can feed the switch.
        link_limit = comm.link_cap_bytes_per_s / (_link_bytes_per_bus_byte(op, "nvls", n) * bus_factor(op, n))
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
    return bus * n / _nsteps(op, n)


def _net_algorithm_bw(comm: _Comm, algorithm: Algorithm, protocol: Protocol, channels: int) -> float:
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
            intra = _nvls_speed(comm, m) * p.nvls_efficiency[comm.arch] * (m - 1) / m * 2.0
            alg = nccl_net.nvls_tree_bus_bw(span, intra) * n / _nsteps(op, n)
        # Never faster than the node's links carry the share that stays on them [D].
        nvlink_share = nccl_net.shares(op, algorithm, span)[0]
        if nvlink_share > 0:
            links = _ring_bus_bw(comm, comm.ring_channels) if algorithm == "tree" else comm.link_cap_bytes_per_s
            alg = min(alg, links / (nvlink_share * bus_factor(op, n)))
        return alg * scale
    bus = nccl_net.ring_bus_bw(span, protocol, _ring_bus_bw(comm, comm.ring_channels), op) * scale
    if op in P2P_OPS:
        return bus / bus_factor(op, n)
    return bus * n / _nsteps(op, n)


def _net_latency_s(comm: _Comm, algorithm: Algorithm, protocol: Protocol, size_bytes: float, ctas: int) -> float:
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
    return nccl_net.ring_latency_s(span, comm.op, i, _nsteps(comm.op, comm.n_ranks), p.ring_base_latency_s[i], hop,
                                   size_bytes, ctas)


def _latency_s(comm: _Comm, algorithm: Algorithm, protocol: Protocol, size_bytes: float = 0.0,
               ctas: int = 0) -> float:
    p = comm.params
    i = _PROTO_INDEX[protocol]
    n = comm.n_ranks
    op = comm.op
    pcie = comm.path == "pcie"
    if algorithm == "nvls":
        return p.nvls_base_latency_s + p.nvls_nvlink_latency_s
    if comm.span is not None and op not in P2P_OPS:
        return _net_latency_s(comm, algorithm, protocol, size_bytes, ctas)
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
        return base + _nsteps(op, n) * hop
    return base + _nsteps(op, n) * ring_hop


def _tree_correction(size_bytes: float, protocol: Protocol) -> float:
    table = _TREE_CORRECTION[_PROTO_INDEX[protocol]]
    units = int(size_bytes) >> 6
    log_size = units.bit_length() - 1 if units > 0 else 0
    return table[log_size] if log_size < len(table) else 1.0


def _predicted_s(comm: _Comm, algorithm: Algorithm, protocol: Protocol, size_bytes: float,
                 channels: int) -> float:
    bw = _algorithm_bw(comm, algorithm, protocol, channels)
    if algorithm == "tree":
        bw *= _tree_correction(size_bytes, protocol)
    if bw <= 0:
        return math.inf
    return _latency_s(comm, algorithm, protocol, size_bytes, channels) + size_bytes / bw


def _valid_algorithms(op: CollectiveOp) -> tuple[Algorithm, ...]:
    if op == "all_reduce":
        return ("ring", "tree", "nvls", "nvls_tree")
    if op in NVLS_OPS:
        return ("ring", "nvls")
    return ("ring",)


def _candidates(comm: _Comm, size_bytes: float, algorithm: Algorithm | None,
                protocol: Protocol | None) -> list[tuple[Algorithm, Protocol]]:
    op = comm.op
    valid = _valid_algorithms(op)
    if algorithm is not None:
        if algorithm not in ALGORITHMS:
            raise OvsimError(f"unknown algorithm '{algorithm}' (known: {', '.join(ALGORITHMS)})",
                             field="algorithm")
        if algorithm not in valid:
            raise OvsimError(f"{op} cannot use the {algorithm} algorithm (valid: {', '.join(valid)})",
                             field="algorithm")
        if algorithm == "nvls" and not comm.nvls:
            raise OvsimError("NVLS needs an sm90+ GPU on an NVSwitch system with nvls: true and "
                             "at least 2 ranks, on one node (across nodes: nvls_tree)", field="algorithm")
        if algorithm == "nvls_tree" and not comm.nvls_tree:
            if comm.span is not None and comm.span.node_ranks < 2 and comm.nvls_possible:
                raise OvsimError("NVLS-tree needs at least 2 members of the communicator on each node",
                                 field="algorithm")
            raise OvsimError("NVLS-tree needs nodes of sm90+ GPUs on NVSwitch with nvls: true, and a "
                             "communicator that spans them", field="algorithm")
    if protocol is not None and protocol not in PROTOCOLS:
        raise OvsimError(f"unknown protocol '{protocol}' (known: {', '.join(PROTOCOLS)})", field="protocol")
    if algorithm in ("nvls", "nvls_tree") and protocol not in (None, "simple"):
        raise OvsimError("NVLS runs the simple protocol only", field="protocol")
    if op in P2P_OPS:
        if protocol == "ll128":
            raise OvsimError(f"{op} runs the ll or simple protocol only", field="protocol")
        if protocol is not None:
            return [("ring", protocol)]
        per_peer = size_bytes / max(comm.n_ranks - 1, 1) if op == "all_to_all" else size_bytes
        return [("ring", "ll" if per_peer <= comm.params.p2p_ll_threshold_bytes else "simple")]

    out: list[tuple[Algorithm, Protocol]] = []
    for a in _SEARCH_ORDER:
        if a not in valid or (algorithm is not None and a != algorithm):
            continue
        if (a == "nvls" and not comm.nvls) or (a == "nvls_tree" and not comm.nvls_tree):
            continue
        for pr in PROTOCOLS:
            if protocol is not None and pr != protocol:
                continue
            if a in ("nvls", "nvls_tree") and pr != "simple":
                continue
            # LL128 is on by default only over NVLink; asking for it forces it, as NCCL_PROTO does.
            if pr == "ll128" and protocol is None and comm.path != "nvlink":
                continue
            out.append((a, pr))
    if not out:
        raise OvsimError(f"no {algorithm} algorithm runs {op} with the {protocol} protocol", field="protocol")
    return out


def _max_threads(comm: _Comm, algorithm: Algorithm, protocol: Protocol) -> int:
    """tuning.cc maxThreads[algorithm][protocol] before enqueue.cc trims it."""
    p = comm.params
    if algorithm in ("nvls", "nvls_tree", "tree") or comm.op in P2P_OPS:
        return p.max_threads
    if protocol == "ll":
        return p.ll_max_threads
    if protocol == "ll128":
        return p.ll128_max_threads
    if _ring_bus_bw(comm, comm.ring_channels) <= p.slow_ring_bw_threshold_bytes_per_s:
        return p.slow_ring_threads
    return p.simple_max_threads


def _thread_threshold(comm: _Comm, algorithm: Algorithm, protocol: Protocol) -> int:
    p = comm.params
    if protocol == "ll":
        return p.ll_thread_threshold_bytes * (comm.n_ranks if algorithm == "ring" else 1)
    if protocol == "ll128":
        return p.ll128_thread_threshold_bytes
    return p.simple_thread_threshold_bytes


def launch_shape(comm_channels: int, size_bytes: float, max_threads: int, threshold_bytes: int,
                 algorithm: Algorithm, protocol: Protocol, params: NcclParams = DEFAULT_PARAMS, *,
                 p2p: bool = False) -> tuple[int, int]:
    """(CTAs, threads per CTA) of one launch: enqueue.cc's small-message reduction.

    While the message is smaller than CTAs x threads x ``threshold_bytes``, drop a CTA (down to 1),
    then halve the threads while they stay a multiple of 128; Ring/Simple then adds a sync warp and
    Tree/Simple four, at least 3 warps; Tree always runs NCCL_MAX_NTHREADS. NVLS keeps its count.
    p2p kernels get no extra warps; applying the same size rule to them is our choice [D].
    """
    nc, nt = comm_channels, max_threads
    if algorithm != "nvls":
        while size_bytes < nc * nt * threshold_bytes and nc >= 2:
            nc -= 1
        while size_bytes < nc * nt * threshold_bytes and nt % 128 == 0:
            nt //= 2
    if protocol == "simple" and not p2p:
        if algorithm == "ring":
            nt += params.ring_simple_extra_warps * params.warp_size
        elif algorithm == "tree":
            nt += params.tree_simple_extra_warps * params.warp_size
    nt = max(nt, params.min_warps * params.warp_size)
    if algorithm == "tree":
        nt = params.max_threads
    return nc, nt


def nccl_shared_mem_per_block_bytes(gpu: GpuSpec, params: NcclParams = DEFAULT_PARAMS) -> int:
    """Dynamic scratch (sized for NCCL_MAX_NTHREADS whatever the launch) plus the static ncclShmem."""
    a = _arch_index(gpu)
    simple = (params.simple_unroll[a] * params.warp_size + 1) * 16
    per_warp = max(params.ll128_scratch_bytes_per_warp, simple, params.nvls_scratch_bytes_per_warp)
    dynamic = per_warp * (params.max_threads // params.warp_size)
    return dynamic + params.static_shared_mem_per_block_bytes[a]


def nccl_block_resources(algorithm: Algorithm, protocol: Protocol, gpu: GpuSpec, *,
                         threads: int | None = None, params: NcclParams = DEFAULT_PARAMS) -> BlockShape:
    """One NCCL CTA at full size: threads (with the extra sync warps), registers, shared memory.

    ``threads`` is NCCL's thread count before the extra warps; by default the NVLink-class maximum
    for the algorithm and protocol (512 Ring/Simple, 512 LL, 640 LL128, 640 NVLS and Tree).
    """
    if algorithm not in ALGORITHMS:
        raise OvsimError(f"unknown algorithm '{algorithm}'", field="algorithm")
    if protocol not in PROTOCOLS:
        raise OvsimError(f"unknown protocol '{protocol}'", field="protocol")
    if threads is None:
        if algorithm in ("nvls", "nvls_tree", "tree"):
            threads = params.max_threads
        else:
            threads = {"ll": params.ll_max_threads, "ll128": params.ll128_max_threads,
                       "simple": params.simple_max_threads}[protocol]
    _, nt = launch_shape(1, math.inf, threads, 0, algorithm, protocol, params)
    return BlockShape(nt, params.registers_per_thread, nccl_shared_mem_per_block_bytes(gpu, params))


def plan_collective(op: CollectiveOp, size_bytes: float, n_ranks: int, gpu: GpuSpec, system: SystemSpec, *,
                    algorithm: Algorithm | None = None, protocol: Protocol | None = None,
                    channels: int | None = None, params: NcclParams = DEFAULT_PARAMS,
                    ranks: Sequence[int] | None = None) -> CollectivePlan:
    """NCCL's choice of algorithm, protocol and CTAs for one collective, and its predicted cost.

    ``size_bytes`` is S as nccl-tests defines it (all-gather and reduce-scatter: the whole gathered
    buffer). ``algorithm``/``protocol`` restrict the choice like NCCL_ALGO/NCCL_PROTO; ``channels``
    sets the communicator's CTA count like NCCL_MIN_CTAS = NCCL_MAX_CTAS. all_to_all and send_recv
    run NCCL's p2p kernels, reported as algorithm "ring". ``ranks`` places the communicator on
    the system's nodes (rank r on node r // GPUs per node); by default ranks 0..n_ranks-1, as
    nccl-tests places them.
    """
    op = _check_op(op)
    n_ranks = _check_ranks(n_ranks)
    try:
        size = math.nan if isinstance(size_bytes, str) else float(size_bytes)
    except (TypeError, ValueError):
        size = math.nan
    if not (math.isfinite(size) and size >= 0):
        raise OvsimError(f"must be a finite number >= 0, got {size_bytes!r}", field="size_bytes")
    size_bytes = size
    if n_ranks > system.total_gpus:
        raise OvsimError(f"{n_ranks} ranks on {system.name}, which has {system.total_gpus} GPUs", field="n_ranks")
    members = list(range(n_ranks)) if ranks is None else list(ranks)
    if len(members) != n_ranks or len(set(members)) != n_ranks or not all(0 <= r < system.total_gpus for r in members):
        raise OvsimError(f"expected {n_ranks} distinct ranks of the {system.total_gpus}, got {members[:8]}",
                         field="ranks")
    check_domain(system, gpu)
    n_nodes, node_ranks = node_span(members, system)
    if channels is not None and (not isinstance(channels, int) or not 1 <= channels <= params.max_channels):
        raise OvsimError(f"must be an integer in 1..{params.max_channels}, got {channels!r}",
                         field="channels")
    arch = _arch_index(gpu)
    # Across nodes a mesh member reaches only the peers on its own node by NVLink.
    path, cap = _link_cap(op, n_ranks if n_nodes == 1 else node_ranks, arch, gpu, system, params)
    nvls = (system.nvls and system.topology == "nvswitch" and params.nvls_efficiency[arch] > 0
            and params.nvls_channels[arch] > 0 and n_ranks >= 2)
    span = _span(members, n_nodes, node_ranks, arch, gpu, system, params)
    # Across nodes the NVLink part is the node's default ring over its members (the links' cap, not
    # the launch's CTAs: NCCL's 16 CTAs carry 7/8 of 396 GB/s on an H100 node); a user's channel
    # count scales the whole collective once (_net_algorithm_bw).
    if span is None:
        ring_channels = channels or default_ring_channels(op, n_ranks, gpu, system, params)
    else:
        ring_channels = default_ring_channels(op, node_ranks, gpu, system, params)
    net_ctas = nccl_net.default_ctas(span) if span is not None else 0
    comm = _Comm(
        op=op, n_ranks=n_ranks, arch=arch, path=path, link_cap_bytes_per_s=cap, ring_channels=ring_channels,
        nvls_channels=channels if channels is not None else params.nvls_channels[arch],
        nvls=nvls and span is None, topology=system.topology, params=params, span=span,
        nvls_tree=nvls and span is not None and node_ranks >= 2, net_ctas=net_ctas, nvls_possible=nvls,
    )
    candidates = _candidates(comm, size_bytes, algorithm, protocol)

    if n_ranks == 1:
        # NCCL copies locally (or does nothing in place) without a kernel: nothing crosses a link.
        algo, proto = candidates[0]
        return CollectivePlan(
            op=op, algorithm=algo, protocol=proto, n_ranks=1, size_bytes=float(size_bytes), channels=0,
            threads_per_block=0, registers_per_thread=0, shared_mem_per_block_bytes=0, latency_s=0.0,
            bus_bandwidth_bytes_per_s=cap, bus_bytes=0.0,
            link_bytes_per_bus_byte=_link_bytes_per_bus_byte(op, algo, 1),
            hbm_bytes_per_bus_byte=_hbm_bytes_per_bus_byte(op, algo, 1, params),
        )

    def channels_for(a: Algorithm) -> int:
        if span is not None:
            return channels or net_ctas
        return comm.nvls_channels if a == "nvls" else comm.ring_channels

    best = min(candidates, key=lambda ap: _predicted_s(comm, ap[0], ap[1], size_bytes, channels_for(ap[0])))
    algo, proto = best
    comm_channels = channels_for(algo)
    alg_bw = _algorithm_bw(comm, algo, proto, comm_channels)
    if algo == "tree":
        alg_bw *= _tree_correction(size_bytes, proto)
    factor = bus_factor(op, n_ranks)
    link, net = (_link_bytes_per_bus_byte(op, algo, n_ranks), 0.0) if span is None else nccl_net.shares(op, algo, span)
    n_cta, n_threads = launch_shape(comm_channels, size_bytes, _max_threads(comm, algo, proto),
                                    _thread_threshold(comm, algo, proto), algo, proto, params,
                                    p2p=op in P2P_OPS)
    return CollectivePlan(
        op=op, algorithm=algo, protocol=proto, n_ranks=n_ranks, size_bytes=float(size_bytes),
        channels=n_cta, threads_per_block=n_threads, registers_per_thread=params.registers_per_thread,
        shared_mem_per_block_bytes=nccl_shared_mem_per_block_bytes(gpu, params),
        latency_s=_latency_s(comm, algo, proto, size_bytes, comm_channels),
        bus_bandwidth_bytes_per_s=alg_bw * factor,
        bus_bytes=size_bytes * factor,
        link_bytes_per_bus_byte=link, net_bytes_per_bus_byte=net,
        hbm_bytes_per_bus_byte=_hbm_bytes_per_bus_byte(op, algo, n_ranks, params, net), n_nodes=n_nodes,
    )
