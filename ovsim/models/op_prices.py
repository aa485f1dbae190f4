"""What an op spec costs on a GPU and a system, before any schedule places it: a kernel's demand
(its grid and the work of a block, :mod:`ovsim.models.cost`), a collective's flow and its members'
kernels (NCCL's plan, :mod:`ovsim.models.nccl`, or copy engines), a copy's flow.
:mod:`ovsim.models.workload` expands specs over ranks and repeats with these.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.models import cost, gemm_library, nccl, occupancy
from ovsim.models.ir import BlockShape, FlowDemand, KernelDemand
from ovsim.models.op_specs import (
    GEMM_BLOCK_FIELDS,
    AttentionOp,
    CollectiveOpSpec,
    CopyOp,
    GemmOp,
    KernelOp,
    Knobs,
    MemoryOp,
    SendRecvOp,
    _OpBase,
)

# Each member's kernel (None on copy engines), the collective's shared flow and the op kind, by member.
Parts = dict[int, tuple[KernelDemand | None, FlowDemand, str]]


def kernel_demand(spec: _OpBase, gpu: GpuSpec, params: Parameters, knobs: Knobs) -> KernelDemand:
    """A compute spec's kernel on ``gpu``, priced for the SMs the carve-out leaves it and with the
    occupancy padding: a GEMM without a tile as the library would run it, one with a tile as given."""
    extra = knobs.occupancy_shaping_smem_bytes
    sms = gpu.sm.count - knobs.sm_carveout
    if isinstance(spec, GemmOp):
        if spec.tile is None:
            return gemm_library.best_gemm(spec.m, spec.n, spec.k, spec.precision, gpu, params,
                                          extra_shared_mem_bytes=extra, batch=spec.batch, split_k=spec.split_k,
                                          sm_count=sms)
        # The block fields not given take cost.gemm's defaults.
        given = {f: getattr(spec, f) for f in GEMM_BLOCK_FIELDS if getattr(spec, f) is not None}
        # A kernel of one's own: its efficiency (a measured rate, whatever bound it), else a plain
        # WMMA kernel's, held to its tiles' L2 reads as well; a library kernel of this tile: the
        # library's.
        aligned = cost.gemm_aligned(spec.n, spec.k, spec.precision)
        l2 = l2_sm = None
        if spec.efficiency == "library":
            eff = params.gemm_eff(spec.precision, aligned)
        elif spec.efficiency is None:
            eff = params.own_gemm_eff(spec.precision, aligned)
            l2, l2_sm = params.own_gemm_l2_bytes_per_s, params.own_gemm_l2_sm_bytes_per_s
        else:
            eff = spec.efficiency
        return cost.gemm(spec.m, spec.n, spec.k, spec.precision, gpu, params, tile=spec.tile,
                         extra_shared_mem_bytes=extra, batch=spec.batch, split_k=spec.split_k or 1, sm_count=sms,
                         efficiency=eff, l2_bytes_per_s=l2, l2_sm_bytes_per_s=l2_sm, **given)
    if isinstance(spec, AttentionOp):
        base = _attention(spec, gpu, params)
    elif isinstance(spec, MemoryOp):
        blocks = spec.blocks
        if spec.grid_stride:
            if blocks is not None:
                raise OvsimError("give blocks or grid_stride, not both", field="grid_stride")
            blocks = (gpu.sm.count - knobs.sm_carveout) * occupancy.blocks_per_sm(BlockShape(spec.threads, 32, 0), gpu)
        base = cost.memory_bound(spec.bytes, gpu, params, flops=spec.flops, threads=spec.threads, blocks=blocks,
                                 kind=spec.kind)
    else:
        assert isinstance(spec, KernelOp)
        block = BlockShape(spec.threads, spec.registers_per_thread, spec.shared_mem_bytes)
        base = cost.generic(spec.grid, block, gpu, params, flops=spec.flops, hbm_bytes=spec.hbm_bytes,
                            precision=spec.precision, duration_s=spec.duration_s)
        if spec.memory_wait is not None:
            base = dataclasses.replace(base, memory_wait=spec.memory_wait)
        # A kernel described by its launch keeps its shared memory as given: the shaping knob pads
        # the kernels ovsim prices (give a described kernel's padding in its shared_mem_bytes).
        extra = 0
    if not extra and sms == gpu.sm.count:
        return base
    shaped = BlockShape(base.block.threads, base.block.registers_per_thread, base.block.shared_mem_bytes + extra)
    return _reshape(base, shaped, gpu, sms)


def _attention(spec: AttentionOp, gpu: GpuSpec, params: Parameters) -> KernelDemand:
    """A fused attention's kernel; a ring step's (:attr:`AttentionOp.ring_step`) the slower of its
    two shapes: which one is, the waves its blocks fill decide as much as its loop's length."""
    eff = None if spec.implementation is None else params.attention_eff(spec.implementation, gpu.name)
    shapes = [(spec.seq_len, spec.kv_len)]
    if spec.ring_step:
        assert spec.kv_len is not None
        shapes.append((2 * spec.seq_len, spec.kv_len // 2))
    made = [cost.attention(spec.batch, spec.heads, q, spec.head_dim, spec.precision, gpu, params, causal=spec.causal,
                           backward=spec.backward, kv_len=k, efficiency=eff) for q, k in shapes]
    return max(made, key=lambda d: d.isolated_s)


def _reshape(base: KernelDemand, block: BlockShape, gpu: GpuSpec, sms: int) -> KernelDemand:
    """The same kernel with a padded block or an SM budget: each block does the same work at the same
    pace at its share of an SM; the waves follow the new residency, and a block with room on its SM
    runs up to the kernel's issue cap."""
    occ_new = occupancy.blocks_per_sm(block, gpu)
    if occ_new == 0:
        raise OvsimError("occupancy shaping leaves no room for one block", field="occupancy_shaping_smem_bytes")
    if math.isfinite(base.hbm_cap_bytes_per_s):
        # A bandwidth-bound kernel: its blocks keep their pace and its cap, fewer SMs cost it only
        # what its pace on them can no longer move.
        return dataclasses.replace(base, block=block, isolated_s=cost.alone_time_s(base, sms * occ_new))
    ask = base.issue_fraction
    most = base.issue_cap if base.issue_cap is not None else ask
    isolated = (occupancy.alone_block_times(base.blocks, occ_new, sms, ask, most, base.load_share, gpu.sm.count)
                * base.block_time_s)
    return cost.demand_from_time(blocks=base.blocks, block=block, isolated_s=isolated, flops=base.flops,
                                 hbm_bytes=base.hbm_bytes, gpu=gpu, issue_intensity=1.0,
                                 clock_sensitive=base.clock_sensitive, sm_count=sms, issue_fraction=ask, cap=most,
                                 load_share=base.load_share)


def collective_parts(spec: CollectiveOpSpec | SendRecvOp, group: str, ranks: Sequence[int], gpu: GpuSpec,
                    system: SystemSpec, params: Parameters, knobs: Knobs,
                    plans: dict[tuple[object, ...], nccl.CollectivePlan] | None = None) -> Parts:
    """Each member's kernel (None on copy engines), the shared flow and the op kind; ``plans``:
    NCCL plans made so far in this build (nccl.plan_collective's ``memo``)."""
    channels = spec.channels or knobs.nccl_channels
    if isinstance(spec, SendRecvOp):
        plan = nccl.plan_collective("send_recv", spec.size_bytes, 2, gpu, system, channels=channels,
                                    ranks=(spec.src, spec.dst), memo=plans)
        flow = _plan_flow(plan, group, (spec.src, spec.dst), params, "p2p", endpoints=(spec.src, spec.dst))
        k = _nccl_kernel(plan)
        return {spec.src: (k, flow, "collective"), spec.dst: (k, flow, "collective")}
    if spec.kind == "ring_exchange":
        return _ring_exchange_parts(spec, group, ranks, gpu, system, params, channels, plans)
    # The knob offloads what copy engines can move (within a node); an explicit engine is checked.
    spans_nodes = len({system.node_of(r) for r in ranks}) > 1
    offload = spec.engine == "copy_engine" or (
        knobs.ce_offload and spec.kind in ("all_gather", "all_to_all") and not spans_nodes)
    if offload:
        if spec.kind not in ("all_gather", "all_to_all"):
            raise OvsimError(f"copy engines cannot run {spec.kind} (no reductions); only all_gather and "
                             "all_to_all", field="engine")
        if spans_nodes:
            raise OvsimError("copy engines move data within a node; this collective spans nodes (run it on "
                             "NCCL's kernels)", field="engine")
        n = len(ranks)
        bus = spec.size_bytes * (n - 1) / n
        link_bw = peer_bandwidth(gpu, system) * params.ce_link_efficiency
        flow = FlowDemand(group=group, ranks=tuple(ranks), bytes=bus, latency_s=params.ce_latency_s,
                          rate_cap_bytes_per_s=link_bw, link_coeff=1.0, hbm_coeff=2.0,
                          pattern="all_pairs", uses_copy_engine=True, protocol="ce")
        # A collective on the copy engines is still communication (metrics.COMM_KINDS); a CopyOp
        # and a trace's memcpy are copies ("transfer"), which HTA counts as neither.
        return {r: (None, flow, "collective") for r in ranks}
    plan = nccl.plan_collective(spec.kind, spec.size_bytes, len(ranks), gpu, system, algorithm=spec.algorithm,
                                protocol=spec.protocol, channels=channels, ranks=ranks, memo=plans)
    # What the calibration measured within a node replaces or corrects NCCL's model.
    plan = nccl.calibrated_plan(plan, params)
    flow = _plan_flow(plan, group, ranks, params, "all_pairs" if spec.kind == "all_to_all" else "ring")
    k = _nccl_kernel(plan)
    return {r: (k, flow, "collective") for r in ranks}


def _ring_exchange_parts(spec: CollectiveOpSpec, group: str, ranks: Sequence[int], gpu: GpuSpec,
                         system: SystemSpec, params: Parameters, channels: int | None,
                         plans: dict[tuple[object, ...], nccl.CollectivePlan] | None) -> Parts:
    """Every member sends ``size_bytes`` to the next and receives as many from the one before, at
    once: a send/recv of each neighbouring pair, all priced as the slowest pair's (one that
    crosses nodes where the group spans them), whose NIC share every member is charged."""
    if spec.engine == "copy_engine":
        raise OvsimError("a ring exchange runs on NCCL's kernels", field="engine")
    if spec.algorithm not in (None, "ring"):
        raise OvsimError("a ring exchange runs NCCL's send/recv kernels (algorithm ring)", field="algorithm")
    if len(ranks) < 2:
        raise OvsimError("a ring exchange needs at least 2 members", field="ranks")
    pairs = [(ranks[i], ranks[(i + 1) % len(ranks)]) for i in range(len(ranks))]
    pair = next((p for p in pairs if system.node_of(p[0]) != system.node_of(p[1])), pairs[0])
    plan = nccl.plan_collective("send_recv", spec.size_bytes, 2, gpu, system, protocol=spec.protocol,
                                channels=channels, ranks=pair, memo=plans)
    flow = _plan_flow(plan, group, ranks, params, "ring")
    k = _nccl_kernel(plan)
    return {r: (k, flow, "collective") for r in ranks}


def _plan_flow(plan: nccl.CollectivePlan, group: str, ranks: Sequence[int], params: Parameters,
               pattern: Literal["ring", "all_pairs", "p2p"], endpoints: tuple[int, int] | None = None) -> FlowDemand:
    """The flow an NCCL plan moves among ``ranks``: its bus bytes after its latency at its rate,
    charging links, HBM (weighted by the protocol's calibrated weight) and, across nodes, NICs as
    the plan puts them per bus byte."""
    return FlowDemand(group=group, ranks=tuple(ranks), bytes=plan.bus_bytes, latency_s=plan.latency_s,
                      rate_cap_bytes_per_s=plan.bus_bandwidth_bytes_per_s, link_coeff=plan.link_bytes_per_bus_byte,
                      hbm_coeff=plan.hbm_bytes_per_bus_byte, hbm_weight=params.nccl_hbm_weight.get(plan.protocol, 1.0),
                      pattern=pattern, endpoints=endpoints, protocol=plan.protocol,
                      net_coeff=plan.net_bytes_per_bus_byte if plan.n_nodes > 1 else None)


def _nccl_kernel(plan: nccl.CollectivePlan) -> KernelDemand:
    # The blocks only hold SMs; their progress is the flow's.
    return KernelDemand(blocks=plan.channels,
                        block=BlockShape(plan.threads_per_block, plan.registers_per_thread,
                                         plan.shared_mem_per_block_bytes),
                        block_time_s=plan.isolated_s, issue_fraction=1.0, hbm_bytes=0.0, flops=0.0,
                        isolated_s=plan.isolated_s, clock_sensitive=False)


def peer_bandwidth(gpu: GpuSpec, system: SystemSpec) -> float:
    if system.topology == "nvswitch":
        return gpu.links.bandwidth_bytes_per_s
    if system.topology == "mesh":
        return system.links_per_pair * gpu.links.bandwidth_per_link_bytes_per_s
    return gpu.pcie.bandwidth_bytes_per_s


def copy_flow(spec: CopyOp, group: str, rank: int, gpu: GpuSpec, system: SystemSpec, n_ranks: int,
               params: Parameters) -> FlowDemand:
    hbm = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction
    if spec.direction == "d2d":
        return FlowDemand(group=group, ranks=(rank,), bytes=spec.size_bytes, latency_s=params.kernel_overhead_s,
                          rate_cap_bytes_per_s=hbm * params.ce_local_efficiency / 2, link_coeff=0.0,
                          hbm_coeff=2.0, pattern="local", uses_copy_engine=True, protocol="ce")
    if spec.direction in ("h2d", "d2h"):
        ends = (-1, rank) if spec.direction == "h2d" else (rank, -1)
        return FlowDemand(group=group, ranks=(rank,), bytes=spec.size_bytes, latency_s=params.kernel_overhead_s,
                          rate_cap_bytes_per_s=gpu.pcie.bandwidth_bytes_per_s * params.host_link_efficiency,
                          link_coeff=1.0, hbm_coeff=1.0, pattern="host", endpoints=ends, uses_copy_engine=True,
                          protocol="ce")
    if spec.peer is None or spec.peer >= n_ranks or spec.peer == rank:
        raise OvsimError(f"copy '{spec.name}' needs a peer rank other than {rank} below {n_ranks}", field="peer")
    if system.node_of(spec.peer) != system.node_of(rank):
        raise OvsimError(f"copy '{spec.name}': rank {spec.peer} is on another node; a peer copy runs within one "
                         "(use a send_recv)", field="peer")
    return FlowDemand(group=group, ranks=(rank,), bytes=spec.size_bytes, latency_s=params.kernel_overhead_s,
                      rate_cap_bytes_per_s=peer_bandwidth(gpu, system) * params.ce_link_efficiency,
                      link_coeff=1.0, hbm_coeff=1.0, pattern="p2p", endpoints=(rank, spec.peer),
                      uses_copy_engine=True, protocol="ce")
