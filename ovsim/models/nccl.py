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

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ovsim.errors import OvsimError
from ovsim.hw.spec import GpuSpec, SystemSpec, check_domain
from ovsim.models import nccl_net
from ovsim.models.ir import BlockShape
from ovsim.models.nccl_net import Span
from ovsim.models.nccl_params import (
    _SEARCH_ORDER,
    ALGORITHMS,
    DEFAULT_PARAMS,
    NVLS_OPS,
    P2P_OPS,
    PROTOCOLS,
    Algorithm,
    CollectiveOp,
    NcclParams,
    Path,
    Protocol,
)
from ovsim.models.nccl_time import (
    Comm,
    algorithm_bw,
    check_op,
    check_ranks,
    hbm_bytes_per_bus_byte,
    latency_s,
    link_bytes_per_bus_byte,
    predicted_s,
    ring_bus_bw,
    tree_correction,
)
from ovsim.models.nccl_time import (
    bus_factor as bus_factor,
)

if TYPE_CHECKING:
    from ovsim.hw.calib import Parameters


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


def calibrated_plan(plan: CollectivePlan, params: Parameters) -> CollectivePlan:
    """``plan`` priced with a GPU's measured collectives on one node. A collective the calibration
    measured itself (``nccl_fitted``, keyed op/algorithm/protocol/ranks) takes its latency and bus
    bandwidth. Otherwise the node costs apply (``nccl_ring_added_latency_s`` and
    ``nccl_ring_bus_efficiency`` per protocol for rings, ``nccl_nvls_added_latency_s`` and
    ``nccl_nvls_bus_efficiency`` for NVLS): the time a collective takes beyond NCCL's model latency,
    and the share of the model's bus bandwidth reached, for collectives over as many ranks as they
    were measured on (``nccl_node_ranks``). NCCL's choice of algorithm and protocol stays its own
    model's. Trees, p2p, other communicator sizes and plans across nodes keep NCCL's model."""
    if plan.n_nodes > 1:
        return plan
    measured = params.nccl_fitted.get(f"{plan.op}/{plan.algorithm}/{plan.protocol}/{plan.n_ranks}")
    if measured is not None:
        return dataclasses.replace(plan, latency_s=measured["latency_s"],
                                   bus_bandwidth_bytes_per_s=measured["bus_bandwidth_bytes_per_s"])
    if plan.op in P2P_OPS or plan.n_ranks != params.nccl_node_ranks:
        return plan
    if plan.algorithm == "ring":
        added_s = params.nccl_ring_added_latency_s.get(plan.protocol, 0.0)
        efficiency = params.nccl_ring_bus_efficiency.get(plan.protocol, 1.0)
    elif plan.algorithm == "nvls":
        added_s, efficiency = params.nccl_nvls_added_latency_s, params.nccl_nvls_bus_efficiency
    else:
        return plan
    if added_s == 0.0 and efficiency == 1.0:
        return plan
    return dataclasses.replace(plan, latency_s=plan.latency_s + added_s,
                               bus_bandwidth_bytes_per_s=plan.bus_bandwidth_bytes_per_s * efficiency)


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


def _valid_algorithms(op: CollectiveOp) -> tuple[Algorithm, ...]:
    if op == "all_reduce":
        return ("ring", "tree", "nvls", "nvls_tree")
    if op in NVLS_OPS:
        return ("ring", "nvls")
    return ("ring",)


def _candidates(comm: Comm, size_bytes: float, algorithm: Algorithm | None,
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


def _max_threads(comm: Comm, algorithm: Algorithm, protocol: Protocol) -> int:
    """tuning.cc maxThreads[algorithm][protocol] before enqueue.cc trims it."""
    p = comm.params
    if algorithm in ("nvls", "nvls_tree", "tree") or comm.op in P2P_OPS:
        return p.max_threads
    if protocol == "ll":
        return p.ll_max_threads
    if protocol == "ll128":
        return p.ll128_max_threads
    if ring_bus_bw(comm, comm.ring_channels) <= p.slow_ring_bw_threshold_bytes_per_s:
        return p.slow_ring_threads
    return p.simple_max_threads


def _thread_threshold(comm: Comm, algorithm: Algorithm, protocol: Protocol) -> int:
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
                    ranks: Sequence[int] | None = None,
                    memo: dict[tuple[object, ...], CollectivePlan] | None = None) -> CollectivePlan:
    """NCCL's choice of algorithm, protocol and CTAs for one collective, and its predicted cost.

    ``size_bytes`` is S as nccl-tests defines it (all-gather and reduce-scatter: the whole gathered
    buffer). ``algorithm``/``protocol`` restrict the choice like NCCL_ALGO/NCCL_PROTO; ``channels``
    sets the communicator's CTA count like NCCL_MIN_CTAS = NCCL_MAX_CTAS. all_to_all and send_recv
    run NCCL's p2p kernels, reported as algorithm "ring". ``ranks`` places the communicator on
    the system's nodes (rank r on node r // GPUs per node); by default ranks 0..n_ranks-1, as
    nccl-tests places them. ``memo``: plans already made with the same ``gpu``, ``system`` and
    ``params`` (a workload's build plans thousands of collectives of a few kinds), keyed by what
    the plan depends on once the members are placed on nodes.
    """
    op = check_op(op)
    n_ranks = check_ranks(n_ranks)
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
    span = _span(members, n_nodes, node_ranks, arch, gpu, system, params)
    key = (op, size_bytes, n_ranks, algorithm, protocol, channels, n_nodes, node_ranks, span)
    if memo is not None and key in memo:
        return memo[key]
    plan = _plan(op, size_bytes, n_ranks, gpu, system, algorithm, protocol, channels, params, arch, n_nodes,
                 node_ranks, span)
    if memo is not None:
        memo[key] = plan
    return plan


def _plan(op: CollectiveOp, size_bytes: float, n_ranks: int, gpu: GpuSpec, system: SystemSpec,
          algorithm: Algorithm | None, protocol: Protocol | None, channels: int | None, params: NcclParams,
          arch: int, n_nodes: int, node_ranks: int, span: Span | None) -> CollectivePlan:
    """:func:`plan_collective` once the communicator is checked and placed on nodes."""
    # Across nodes a mesh member reaches only the peers on its own node by NVLink.
    path, cap = _link_cap(op, n_ranks if n_nodes == 1 else node_ranks, arch, gpu, system, params)
    nvls = (system.nvls and system.topology == "nvswitch" and params.nvls_efficiency[arch] > 0
            and params.nvls_channels[arch] > 0 and n_ranks >= 2)
    # Across nodes the NVLink part is the node's default ring over its members (the links' cap, not
    # the launch's CTAs: NCCL's 16 CTAs carry 7/8 of 396 GB/s on an H100 node); a user's channel
    # count scales the whole collective once (net_algorithm_bw).
    if span is None:
        ring_channels = channels or default_ring_channels(op, n_ranks, gpu, system, params)
    else:
        ring_channels = default_ring_channels(op, node_ranks, gpu, system, params)
    net_ctas = nccl_net.default_ctas(span) if span is not None else 0
    comm = Comm(
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
            link_bytes_per_bus_byte=link_bytes_per_bus_byte(op, algo, 1),
            hbm_bytes_per_bus_byte=hbm_bytes_per_bus_byte(op, algo, 1, params),
        )

    def channels_for(a: Algorithm) -> int:
        if span is not None:
            return channels or net_ctas
        return comm.nvls_channels if a == "nvls" else comm.ring_channels

    best = min(candidates, key=lambda ap: predicted_s(comm, ap[0], ap[1], size_bytes, channels_for(ap[0])))
    algo, proto = best
    comm_channels = channels_for(algo)
    alg_bw = algorithm_bw(comm, algo, proto, comm_channels)
    if algo == "tree":
        alg_bw *= tree_correction(size_bytes, proto)
    factor = bus_factor(op, n_ranks)
    link, net = (link_bytes_per_bus_byte(op, algo, n_ranks), 0.0) if span is None else nccl_net.shares(op, algo, span)
    n_cta, n_threads = launch_shape(comm_channels, size_bytes, _max_threads(comm, algo, proto),
                                    _thread_threshold(comm, algo, proto), algo, proto, params,
                                    p2p=op in P2P_OPS)
    # The time NCCL's choice is made on, less what only steers it (the ring's plateau factor), plus
    # NVLS-tree's pipeline fill, which its model lacks (docs/design.md, "Nodes joined by NICs").
    latency = latency_s(comm, algo, proto, size_bytes, comm_channels, plateau=False)
    if algo == "nvls_tree" and span is not None:
        latency += nccl_net.nvls_tree_fill_s(size_bytes, span, comm.nvls_channels, alg_bw)
    return CollectivePlan(
        op=op, algorithm=algo, protocol=proto, n_ranks=n_ranks, size_bytes=float(size_bytes),
        channels=n_cta, threads_per_block=n_threads, registers_per_thread=params.registers_per_thread,
        shared_mem_per_block_bytes=nccl_shared_mem_per_block_bytes(gpu, params),
        latency_s=latency,
        bus_bandwidth_bytes_per_s=alg_bw * factor,
        bus_bytes=size_bytes * factor,
        link_bytes_per_bus_byte=link, net_bytes_per_bus_byte=net,
        hbm_bytes_per_bus_byte=hbm_bytes_per_bus_byte(op, algo, n_ranks, params, net), n_nodes=n_nodes,
    )
