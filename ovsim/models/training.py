"""Training iterations as ops: transformer models under data, tensor and pipeline parallelism,
with the schedules that overlap their communication with compute.

A :class:`TrainingSpec` names a model (a preset or its dimensions), the batch, the precision and
the parallel layout; :func:`training_ops` turns it into the op specs of
:mod:`ovsim.models.workload`, so that knobs (priority, occupancy shaping, channels, carve-out,
copy-engine offload), both schedules (``overlapped``, ``sequential``) and both fidelities apply
unchanged. :func:`build_training_workload` adds the one thing op specs cannot say: with
communication switched off, a pipeline stage still waits for the previous stage's work.

What a layer is made of (per tensor-parallel rank, T = micro-batch x sequence tokens, t = TP
degree, the Megatron-LM layout; Narayanan et al., SC'21):

* forward: norm, QKV GEMM (T x (h + 2h*kv/a)/t x h), fused attention, output projection
  (T x h x h/t), residual + norm, FC1 (T x f*g/t x h; g = 2 for a gated MLP), activation,
  FC2 (T x h x f/t), residual;
* backward: for every linear a data-gradient GEMM and a weight-gradient GEMM, attention backward,
  the memory-bound ops twice over; with full recomputation the layer's forward runs again first
  (selective: its core attention, before the attention's backward);
* the embedding on the first pipeline stage, the LM head and loss on the last;
* an optimizer step over this rank's parameters (memory-bound): one fused Adam pass, or the
  passes of Megatron-LM's mixed-precision optimizer (``optimizer: megatron``) or of Composer's
  AdamW (``composer``; :func:`ovsim.models.training_emit.optimizer_passes`).

Communication (sizes as nccl-tests counts them, NVIDIA/nccl-tests doc/PERFORMANCE.md):

* DDP: gradients bucketed in the order backward produces them (``bucket_bytes``, the first bucket
  ``first_bucket_bytes``, PyTorch's 25 MiB / 1 MiB), one all-reduce per bucket on the ``dp``
  stream as soon as its last gradient is ready, only on the last micro-batch (``no_sync``
  before it: gradient accumulation), or, without ``overlap_grad_reduce``, all of a stage's
  gradients in one after its last backward; with ``distributed_optimizer`` (Megatron-LM's, ZeRO-1) each
  bucket is reduce-scattered instead, the optimizer steps 1/dp of the parameters, and they are
  all-gathered a bucket at a time after the step;
* FSDP / ZeRO-3: per layer an all-gather of its parameters before forward and again before
  backward, ``fsdp_prefetch`` layers ahead, and a reduce-scatter of its gradients after
  backward, every micro-batch; all on the ``dp`` stream, because they share one process group
  and NCCL runs a communicator's collectives one at a time, in the order issued (NCCL adds CUDA
  events to enforce it, NVIDIA/nccl#574; ProcessGroupNCCL issues a group's collectives on one
  internal stream), even when FSDP issues them from different CUDA streams; around them the
  implementation's copy kernels (``fsdp_impl``; :class:`ovsim.models.training_fsdp.FsdpCollectives`),
  the post-backward ones on the ``dp_post`` stream, and with DeepSpeed's (``zero3``) one
  reduce-scatter a bucket of gradients and its parameters rebuilt on the ``dp_gather`` stream;
* tensor parallelism: all-reduce after the row-parallel GEMMs (output projection, FC2) and after
  the data-gradient GEMMs of the column-parallel ones (QKV, FC1); with sequence parallelism
  all-gather before and reduce-scatter after instead (Korthikanti et al., 2022). ``tp_overlap:
  chunked`` splits each all-gather + GEMM and GEMM + reduce-scatter/all-reduce into
  ``tp_chunks`` pieces so that piece i's communication runs beside piece i+1's GEMM (Wang et al.,
  ASPLOS 2023); ``copy_engine`` also moves the all-gather pieces to copy engines (the finer-grain
  DMA variant; reductions stay on SMs, copy engines cannot add);
* pipeline parallelism: GPipe, 1F1B and interleaved 1F1B (``virtual_stages``), with send/recv of
  activations and their gradients between stages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import cast

from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.limits import MAX_OPS
from ovsim.models.build_memo import drop_expansions, keep_expansions, reusing_builds_now
from ovsim.models.ir import Workload
from ovsim.models.op_specs import (
    SIXTEEN_BIT,
    CollectiveOpSpec,
    Knobs,
    OpSpec,
    Schedule,
    SendRecvOp,
    SpecCopy,
    generated,
    spec_of,
)
from ovsim.models.pipeline import exchange_steps, merge_stages, stage_order
from ovsim.models.training_emit import LayerEmitter
from ovsim.models.training_fsdp import FsdpCollectives
from ovsim.models.training_layout import Layout, layout
from ovsim.models.training_p2p import blocking_sends

# PRESETS and ModelShape (below) are re-exported: callers imported them from here before the
# description of a model had its own module.
from ovsim.models.training_spec import PRESETS as PRESETS
from ovsim.models.training_spec import ModelShape as ModelShape
from ovsim.models.training_spec import TrainingSpec, chunk_layers
from ovsim.models.training_step import overlapped_gathers, step_ops
from ovsim.models.workload import build_workload
from ovsim.models.workload_copies import op_id


@dataclass(frozen=True)
class TrainingOps:
    # The iteration's specs in order, those of copied blocks as copies (SpecCopy, a build makes
    # their ops without making them); ``ops`` makes them.
    specs: list[OpSpec | SpecCopy]
    # (op name, name of an op on other ranks it waits for) with no transfer between them.
    peer_deps: list[tuple[str, str, dict[int, int]]]
    layout: Layout
    # Pipeline send/recv op name -> (sender stage, its item's index, receiver stage, its item's
    # index), items in stage order.
    p2p_items: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    stage_lasts: list[list[str]] = field(default_factory=list)  # each stage's items' last ops
    stage_steps: list[list[int]] = field(default_factory=list)  # each item's exchange step
    # Blocks of ``specs`` copied from an earlier one: (first spec's index, its source's, spec count).
    copies: list[tuple[int, int, int]] = field(default_factory=list)

    @cached_property
    def ops(self) -> list[OpSpec]:
        """The specs, copies made (once: a schedule search's builds compare specs by identity and
        by their fields, build_memo)."""
        return [cast(OpSpec, spec_of(s)) for s in self.specs]


# Within reusing_training_ops(): the last iteration's op specs, by what made them. A set of more
# specs than this is not held: it would keep gigabytes through what follows the build (made, as a
# search's builds take them, about 0.8 KB a spec: 149 MiB on Megatron-LM's 145.6B row, about 2.6
# GB on its 1T row).
REUSE_MAX_SPECS = 500_000


@dataclass
class _Held:
    # (what made them, the specs): the last made, and one set kept beside it (keep_training_build).
    last: tuple[str, TrainingOps] | None = None
    kept: tuple[str, TrainingOps] | None = None


_REUSED: ContextVar[_Held | None] = ContextVar("_REUSED", default=None)


@contextlib.contextmanager
def reusing_training_ops() -> Iterator[None]:
    """Within it, a workload built from the same training spec (and ranks) as the one built just
    before takes that one's op specs instead of making them again: a schedule search or a sweep
    builds many workloads that differ only in knobs, and making the specs is 40% of a build (the
    specs are frozen and nothing edits the lists). One set is held (of at most ``REUSE_MAX_SPECS``
    specs), and one that :func:`keep_training_build` kept; released on leaving (with the ops the
    build memo kept of it, should an outer ``reusing_builds`` outlive this)."""
    held = _Held()
    token = _REUSED.set(held)
    try:
        yield
    finally:
        _REUSED.reset(token)
        if held.kept is not None:
            keep_expansions(False)


def keep_training_build() -> None:
    """Keep the op specs made last within :func:`reusing_training_ops`, and the ops built of them
    (``build_memo.keep_expansions``), beside those of the lists made after, until this is asked
    again: a schedule search keeps the iteration of the candidate it will predict first with the
    engine. A set of more than half of ``REUSE_MAX_SPECS`` specs is not kept, and while one is kept
    the last is held only within what it leaves of ``REUSE_MAX_SPECS``."""
    held = _REUSED.get()
    if held is None or (held.last is not None and held.last is held.kept):
        return
    kept = held.last if held.last is not None and len(held.last[1].specs) * 2 <= REUSE_MAX_SPECS else None
    held.kept = kept  # none where the last was not held: the one kept before goes
    keep_expansions(kept is not None)


def release_training_build() -> None:
    """Let the op specs made last within :func:`reusing_training_ops`, and the ops built of them,
    go, but those kept (:func:`keep_training_build`)."""
    held = _REUSED.get()
    if held is not None and held.last is not held.kept:
        held.last = None
        drop_expansions()


def _training_ops_reused(spec: TrainingSpec, n_ranks: int, replicas_made: int | None,
                         tp_made: int | None) -> TrainingOps:
    held = _REUSED.get()
    if held is None:
        return training_ops(spec, n_ranks, replicas_made=replicas_made, tp_made=tp_made)
    key = f"{n_ranks}|{replicas_made}|{tp_made}|{spec.model_dump_json()}"
    for entry in (held.last, held.kept):
        if entry is not None and entry[0] == key:
            held.last = entry
            return entry[1]
    # The previous set goes before the next is made (one set at most, not two, but the one kept).
    # The ops a build made of it stay until the next build has taken those of specs the two sets
    # share (build_memo.shared_expansions).
    held.last = None
    gen = training_ops(spec, n_ranks, replicas_made=replicas_made, tp_made=tp_made)
    if len(gen.specs) <= REUSE_MAX_SPECS - (len(held.kept[1].specs) if held.kept is not None else 0):
        held.last = (key, gen)
    return gen


def training_ops(spec: TrainingSpec, n_ranks: int, *, replicas_made: int | None = None,
                 tp_made: int | None = None, copy_blocks: bool = True) -> TrainingOps:
    """The op specs of one training iteration on ``n_ranks`` ranks; with ``replicas_made`` and
    ``tp_made``, only the first replicas' and the first tensor-parallel ranks' own ops (their
    collectives still list every member). ``copy_blocks``: layer blocks copied from the first of
    their kind (:mod:`ovsim.models.training_blocks`), the same specs, else each emitted."""
    lay = replace(layout(spec, n_ranks), made_dp=replicas_made, made_tp=tp_made)
    g = LayerEmitter(spec, lay, copy_blocks=copy_blocks)
    m = g.m
    p, v, mbs = lay.pp, lay.v, spec.micro_batches
    chunk_sizes = chunk_layers(m.layers, p * v)
    chunk_starts = [sum(chunk_sizes[:i]) for i in range(p * v)]
    n_virtual = p * v
    fsdp = spec.parallel.dp_mode == "fsdp" and lay.dp > 1 and spec.communication
    distributed = spec.parallel.distributed_optimizer and lay.dp > 1 and spec.communication
    orders = [stage_order(spec.parallel.pipeline, p, s, mbs, v) for s in range(p)]
    steps = [exchange_steps(spec.parallel.pipeline, p, s, mbs, v) for s in range(p)]
    # The item that ends the exchange step before each item's, by stage (None: the first step).
    posted_after = [[_before_step(stage_steps, k) for k in range(len(stage_steps))] for stage_steps in steps]
    b_cost = 3.0 if spec.recompute_mode == "full" else 2.0
    merged = merge_stages(orders, p, v, b_cost)
    # Each stage's items by their place in its order (a pipeline transfer names both ends' places).
    place = [{item: k for k, item in enumerate(order)} for order in orders]
    # Last compute op of each (phase, micro-batch, virtual stage), for send/recv and peer deps.
    item_last: dict[tuple[str, int, int], str] = {}
    full_act_bytes = float(g.tokens * m.hidden * g.act_b)
    # Each tensor-parallel rank sends its 1/tp of the activation where sequence parallelism split it
    # already, or where Megatron-LM's scatter-gather splits it, and the receiving group gathers it.
    gather = spec.parallel.pipeline_scatter_gather and lay.tp > 1 and not spec.parallel.sequence_parallel
    act_bytes = full_act_bytes / (lay.tp if spec.parallel.sequence_parallel or gather else 1)
    last_b = {(s, c): max(mb for ph, mb, cc in orders[s] if ph == "B" and cc == c) for s in range(p)
              for c in range(v)}
    # The backward each stage's chunk runs first: later ones add to the gradients it leaves.
    first_b = {(s, c): next(mb for ph, mb, cc in orders[s] if ph == "B" and cc == c) for s in range(p)
               for c in range(v)}
    fsdp_state = FsdpCollectives(g, m.layers) if fsdp else None
    # Where the distributed optimizer gathers the parameters beside the forward pass, each chunk's
    # first forward micro-batch waits for its layers' gathers.
    gathers = (overlapped_gathers(g, spec, lay, chunk_starts, chunk_sizes)
               if distributed and spec.parallel.overlap_param_gather else {})
    first_f = {(s, c): next(mb for ph, mb, cc in orders[s] if ph == "F" and cc == c) for s in range(p)
               for c in range(v)}

    for s, (ph, mb, c) in merged:
        st = g.stages[s]
        vs = c * p + s
        src_vs = vs - 1 if ph == "F" else vs + 1
        # The receive is posted at the exchange that ends the receiver's previous step (Megatron-LM
        # posts both of an interleaved step's receives together, before its forward).
        before = posted_after[s][place[s][(ph, mb, c)]]
        receiver_ready = None
        if before is not None:
            b_ph, b_mb, b_c = orders[s][before]
            receiver_ready = item_last[(b_ph, b_mb, b_c * p + s)] or None
        # A peer wait with no transfer (communication off): (sending item's last op, rank map).
        peer_wait: tuple[str, dict[int, int]] | None = None
        if 0 <= src_vs < n_virtual:
            src_stage = src_vs % p
            sender = item_last[(ph, mb, src_vs)]
            if spec.communication and src_stage != s:
                ends = (src_stage, place[src_stage][(ph, mb, src_vs // p)], s, place[s][(ph, mb, c)])
                for d in range(lay.replicas_made):
                    received = []
                    for i in range(lay.tp_made):
                        a, b = lay.rank(d, src_stage, i), lay.rank(d, s, i)
                        name = f"{ph}{mb}.v{src_vs}to{vs}.d{d}t{i}"
                        deps = [sender] + ([receiver_ready] if receiver_ready else [])
                        g.ops.append(generated(SendRecvOp(name=name, kind="send_recv", size_bytes=act_bytes, src=a,
                                                          dst=b, stream=f"pp{src_stage}>{s}", after_any=deps)))
                        received.append(name)
                        g.p2p_items[name] = ends
                    if gather:
                        # gather_split_1d_tensor: the whole activation, after the receive and the
                        # stage's previous work (Megatron-LM runs it on the compute stream).
                        gname = f"{ph}{mb}.v{src_vs}to{vs}.d{d}.gather"
                        g.ops.append(generated(CollectiveOpSpec(name=gname, kind="all_gather",
                                                                size_bytes=full_act_bytes, stream="tp",
                                                                ranks=lay.tp_groups(s)[d],
                                                                after=[st.last] if st.last else [],
                                                                after_any=received)))
                        received = [gname]
                    st.pending += received
            elif src_stage != s:
                mapping = {lay.rank(d, s, i): lay.rank(d, src_stage, i) for d in range(lay.replicas_made)
                           for i in range(lay.tp_made)}
                peer_wait = (sender, mapping)
        first_index = len(g.ops)
        layers = range(chunk_starts[vs], chunk_starts[vs] + chunk_sizes[vs])
        last_mb = mb == last_b[(s, c)]
        if ph == "F":
            waits = gathers if mb == first_f[(s, c)] else {}
            if vs == 0 and spec.embedding_and_head:
                if fsdp_state:
                    fsdp_state.gather_embedding(st)
                st.pending += waits.get((s, "embed"), [])
                g.embedding(st, s, f"F{mb}", backward=False, last_mb=last_mb)
            for layer in layers:
                if fsdp_state:
                    fsdp_state.before_forward(st, layer, mb)
                st.pending += waits.get((s, f"L{layer}"), [])
                g.layer_forward(st, s, f"F{mb}.L{layer}")
            if vs == n_virtual - 1 and spec.embedding_and_head:
                st.pending += waits.get((s, "head"), [])
                g.head(st, s, f"F{mb}", backward=False, last_mb=last_mb)
        else:
            # Autocast's FP32 weight gradients add to those of the chunk's first backward.
            g.accumulating = spec.autocast and mb != first_b[(s, c)]
            if vs == n_virtual - 1 and spec.embedding_and_head:
                g.head(st, s, f"B{mb}", backward=True, last_mb=last_mb)
            for layer in reversed(layers):
                if fsdp_state:
                    fsdp_state.before_backward(st, layer, mb)
                if spec.recompute_mode == "full":
                    g.layer_forward(st, s, f"R{mb}.L{layer}")
                g.layer_backward(st, s, f"B{mb}.L{layer}", last_mb,
                                 recompute_attention=spec.recompute_mode == "selective")
                if fsdp_state:
                    fsdp_state.after_backward(st, layer, mb)
            if vs == 0 and spec.embedding_and_head:
                g.embedding(st, s, f"B{mb}", backward=True, last_mb=last_mb)
                if fsdp_state:
                    fsdp_state.reduce_embedding(st, mb)
            if fsdp_state:
                fsdp_state.end_backward(st)
        if peer_wait is not None:
            first = next(op.name for op in g.ops[first_index:] if op.stream == "compute")
            g.peer.append((first, *peer_wait))
        item_last[(ph, mb, vs)] = st.last or ""

    step_ops(g, spec, lay, fsdp=fsdp, distributed=distributed, gathered_early=bool(gathers))
    return TrainingOps(specs=g.ops, peer_deps=g.peer, layout=lay, p2p_items=g.p2p_items,
                       stage_lasts=[[item_last[(ph, mb, c * p + s)] for ph, mb, c in orders[s]] for s in range(p)],
                       stage_steps=steps, copies=g.blocks.copies if g.blocks is not None else [])


def _before_step(steps: list[int], k: int) -> int | None:
    """The index of the last item of the exchange step before item ``k``'s (None: none)."""
    j = k
    while j >= 0 and steps[j] == steps[k]:
        j -= 1
    return j if j >= 0 else None


def _check_attention(spec: TrainingSpec, params: Parameters, gpu_name: str) -> None:
    """A named attention implementation the GPU has no figure for, refused under the scenario's
    field rather than under the first attention op's."""
    kernel = spec.attention_kernel
    if kernel is None:
        return
    if spec.attention_precision not in SIXTEEN_BIT:
        raise OvsimError(f"{kernel} runs in fp16 or bf16, not {spec.precision} (flash: a fused kernel at "
                         "the calibration's attention_efficiency)", field="attention")
    try:
        params.attention_eff(kernel, gpu_name)
    except OvsimError as e:
        raise OvsimError(e.message, field="attention") from None


def build_training_workload(
    spec: TrainingSpec,
    *,
    gpu: GpuSpec,
    system: SystemSpec,
    params: Parameters,
    n_ranks: int,
    schedule: Schedule = "overlapped",
    knobs: Knobs | None = None,
    streams: dict[str, int] | None = None,
    source: str = "",
    max_ops: int | None = None,
) -> Workload:
    """The workload of one training iteration, priced and scheduled like any op list."""
    limit = MAX_OPS if max_ops is None else max_ops
    if n_ranks > limit:
        # Every rank is listed in its collectives' groups, so a rank costs at least an op.
        raise OvsimError(f"{n_ranks:,} ranks, over the limit of {limit:,} ops (every rank is at least one op in "
                         "its groups); to run it anyway, pass a larger --max-ops (Python: max_ops=)",
                         source=source, field="ranks")
    try:
        _check_attention(spec, params, gpu.name)
        lay = _symmetric(layout(spec, n_ranks), system, knobs)
        made = lay.made_ranks()
        _check_training_size(spec, len(made), limit, source)
        gen = _training_ops_reused(spec, n_ranks, lay.made_dp, lay.made_tp)
    except OvsimError as e:
        if e.source:
            raise
        raise OvsimError(e.message, source=source, field=f"training.{e.field}".rstrip(".")) from None
    symmetric = lay.made_dp is not None or lay.made_tp is not None
    # A schedule search's builds compare specs by identity and fields (build_memo): made, once.
    specs = gen.ops if reusing_builds_now() else gen.specs
    blocking = bool(gen.p2p_items) and (schedule == "sequential" or not spec.parallel.overlap_p2p_comm)
    wl = build_workload(specs, gpu=gpu, system=system, params=params, n_ranks=n_ranks, schedule=schedule,
                        knobs=knobs, streams=streams, source=source, max_ops=max_ops,
                        simulated=made if symmetric else None,
                        stand_offsets=lay.stand_offsets() if symmetric else (), copies=gen.copies,
                        validate=not blocking)
    if blocking:
        wl = blocking_sends(wl, gen, streams or {}, source, interleaved=spec.parallel.pipeline == "interleaved",
                            sequential=schedule == "sequential")
    if not gen.peer_deps:
        return wl
    # Stage-to-stage waits with no transfer (communication off): the receiving rank's first op of
    # the item waits for the matching rank's last op of the sending item.
    extra: dict[str, list[str]] = {}
    for name, dep, mapping in gen.peer_deps:
        for dst, src in mapping.items():
            extra.setdefault(op_id(name, dst), []).append(op_id(dep, src))
    ops = tuple(replace(op, deps=op.deps + tuple(extra[op.id])) if op.id in extra else op for op in wl.ops)
    out = replace(wl, ops=ops, structure=None)
    out.validate(source)
    return out


def _check_training_size(spec: TrainingSpec, n_ranks: int, max_ops: int, source: str) -> None:
    """Refuse, before any op is made, an iteration that surely expands past ``max_ops``: every
    micro-batch runs each layer's forward and backward on each rank of the layer's stage, at least
    two ops each, on the ``n_ranks`` whose ops are made (one data-parallel replica under rank
    symmetry)."""
    try:
        layers = spec.shape().layers
    except OvsimError as e:
        raise OvsimError(e.message, source=source, field=f"training.{e.field}".rstrip(".")) from None
    per_stage = max(1, n_ranks // spec.parallel.pp)
    least = 2 * layers * spec.micro_batches * per_stage
    if least > max_ops:
        raise OvsimError(f"the training iteration expands to at least {least:,} ops (2 x {layers} layers x "
                         f"{spec.micro_batches:,} micro-batches x {per_stage:,} ranks a stage), over the limit of "
                         f"{max_ops:,}; to run it anyway, pass a larger --max-ops (Python: max_ops=)",
                         source=source, field="training")


def _symmetric(lay: Layout, system: SystemSpec, knobs: Knobs | None) -> Layout:
    """``lay`` with the ranks whose ops are made where others can stand for them: one data-parallel
    replica (its stages' first tp x cp ranks) and one rank of each tensor-parallel group (tp index 0). Every
    GPU's links, NIC and memory are its own, so identical ranks meet identical rates. All are made
    where asked (``rank_symmetry: false``) and on a mesh, whose links join particular pairs."""
    if (knobs is not None and not knobs.rank_symmetry) or system.topology == "mesh":
        return lay
    return replace(lay, made_dp=1 if _replicas_alike(lay, system) else None,
                   made_tp=1 if _tp_ranks_alike(lay, system) else None)


def _replicas_alike(lay: Layout, system: SystemSpec) -> bool:
    """Whether one replica's first context-parallel rank stands for every replica's every one."""
    if lay.dp < 2 or not _cp_ranks_alike(lay, system):
        return False
    k, node = lay.block_ranks, system.gpu_count
    # A replica that straddles nodes unevenly meets the network differently from its neighbours,
    # and so does one whose stage shares a node with another stage's ranks where its neighbour's
    # does not (stages outermost: each stage's replicas, dp x tp ranks, tile the nodes too).
    if k % node and node % k:
        return False
    stage = lay.dp * lay.tp
    if lay.stages_outer and stage % node and node % stage:
        return False
    # Where GPUs share NICs, replicas must start on a NIC's first GPU: else one NIC serves two
    # replicas (the unsimulated one's traffic would be missing from it), or replicas group their
    # ranks onto NICs differently (8 GPUs on 5 NICs: ports 0,0,1,1,2,3,3,4).
    net = system.network
    return net is None or net.nics_per_node >= system.gpu_count or k * net.nics_per_node % system.gpu_count == 0


def _cp_ranks_alike(lay: Layout, system: SystemSpec) -> bool:
    """A replica's context-parallel ranks (each ``tp`` ranks on from the one before; the same
    work, by their chunks' balance) stand for each other where their tensor-parallel groups tile
    the nodes evenly and, where two share a node, no two GPUs share a NIC."""
    if lay.cp == 1:
        return True
    group, node = lay.tp * lay.cp, system.gpu_count
    if group % node and node % group:
        return False
    return lay.tp % node == 0 or system.network is None or system.nic_port_of(0) != system.nic_port_of(1)


def _tp_ranks_alike(lay: Layout, system: SystemSpec) -> bool:
    """A tensor-parallel group's ranks stand for each other where the groups tile the nodes (each
    inside one node) and no two GPUs share a NIC (a group's traffic off the node, its pipeline
    transfers and data-parallel collectives, would otherwise meet the others' on it)."""
    if lay.tp < 2 or system.gpu_count % lay.tp:
        return False
    return system.network is None or system.nic_port_of(0) != system.nic_port_of(1)
