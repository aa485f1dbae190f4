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
  the memory-bound ops twice over; with ``recompute`` the layer's forward runs again first;
* the embedding on the first pipeline stage, the LM head and loss on the last;
* an optimizer step: fused Adam over this rank's parameters (memory-bound).

Communication (sizes as nccl-tests counts them, NVIDIA/nccl-tests doc/PERFORMANCE.md):

* DDP: gradients bucketed in the order backward produces them (``bucket_bytes``, the first bucket
  ``first_bucket_bytes``, PyTorch's 25 MiB / 1 MiB), one all-reduce per bucket on the ``dp``
  stream as soon as its last gradient is ready, only on the last micro-batch (``no_sync``
  before it: gradient accumulation);
* FSDP / ZeRO-3: per layer an all-gather of its parameters before forward and again before
  backward, ``fsdp_prefetch`` layers ahead, and a reduce-scatter of its gradients after
  backward, every micro-batch; all on the ``dp`` stream, because they share one process group
  and NCCL runs a communicator's collectives one at a time, in the order issued (NCCL adds CUDA
  events to enforce it, NVIDIA/nccl#574; ProcessGroupNCCL issues a group's collectives on one
  internal stream), even when FSDP issues them from different CUDA streams;
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

from dataclasses import dataclass, field, replace
from typing import Literal

from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.limits import MAX_OPS
from ovsim.models.ir import StreamSpec, Workload
from ovsim.models.pipeline import exchange_steps, merge_stages, stage_order

# PRESETS and ModelShape (below) are re-exported: callers imported them from here before the
# description of a model had its own module.
from ovsim.models.training_spec import PRESETS as PRESETS
from ovsim.models.training_spec import (
    Layout,
    TrainingSpec,
    activation_element_bytes,
    embedding_params,
    layer_matrices,
    layer_params,
    layout,
    params_per_rank,
    wire_element_bytes,
)
from ovsim.models.training_spec import ModelShape as ModelShape
from ovsim.models.workload import (
    AttentionOp,
    CollectiveKind,
    CollectiveOpSpec,
    GemmOp,
    Knobs,
    MemoryOp,
    OpSpec,
    Schedule,
    SendRecvOp,
    build_workload,
)

# -- emission --------------------------------------------------------------------------------------


@dataclass
class _Stage:
    ranks: list[int]
    last: str | None = None
    pending: list[str] = field(default_factory=list)
    bucket_bytes: float = 0.0
    bucket_index: int = 0
    buckets: list[str] = field(default_factory=list)
    rs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TrainingOps:
    ops: list[OpSpec]
    # (op name, name of an op on other ranks it waits for) with no transfer between them.
    peer_deps: list[tuple[str, str, dict[int, int]]]
    layout: Layout
    # Pipeline send/recv op name -> (sender stage, its item's index, receiver stage, its item's
    # index), items in stage order.
    p2p_items: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    stage_lasts: list[list[str]] = field(default_factory=list)  # each stage's items' last ops
    stage_steps: list[list[int]] = field(default_factory=list)  # each item's exchange step


class _Gen:
    def __init__(self, spec: TrainingSpec, lay: Layout) -> None:
        self.spec = spec
        self.m = spec.shape()
        self.lay = lay
        self.p = spec.parallel
        self.comm = spec.communication
        self.ops: list[OpSpec] = []
        self.peer: list[tuple[str, str, dict[int, int]]] = []
        self.p2p_items: dict[str, tuple[int, int, int, int]] = {}
        self.stages = [_Stage(ranks=lay.stage_ranks(s)) for s in range(lay.pp)]
        self.gemm_precision = spec.precision
        self.act_b = activation_element_bytes(spec.precision)
        self.comm_b = wire_element_bytes(spec.precision)
        self.tokens = spec.micro_batch_size * self.m.seq_len
        self.chunks = self.p.tp_chunks or self.p.tp

    # basic emitters

    def compute(self, st: _Stage, op: OpSpec) -> str:
        extra = list(st.pending)
        st.pending = []
        op = op.model_copy(update={"ranks": st.ranks, "stream": "compute", "after_any": extra})
        self.ops.append(op)
        st.last = op.name
        return op.name

    def gemm(self, st: _Stage, name: str, m: int, n: int, k: int) -> str:
        # No tile: each GEMM on the library kernel the cost model finds fastest for its shape.
        return self.compute(st, GemmOp(name=name, kind="gemm", m=m, n=n, k=k, precision=self.gemm_precision))

    def mem(self, st: _Stage, name: str, nbytes: float, kind: Literal["elementwise", "norm", "softmax"]) -> str:
        return self.compute(st, MemoryOp(name=name, kind=kind, bytes=max(1.0, nbytes), grid_stride=True))

    def collective(self, st: _Stage, name: str, kind: CollectiveKind, size: float, stream: str,
                   groups: list[list[int]], engine: Literal["sm", "copy_engine"] = "sm") -> list[str]:
        """One collective per group, after the stage's last compute op."""
        names = []
        # Tensor-parallel groups are numbered by replica whether or not every replica's are made.
        numbered = len(groups) > 1 or (stream == "tp" and self.lay.dp > 1)
        for gi, ranks in enumerate(groups):
            nm = f"{name}.g{gi}" if numbered else name
            self.ops.append(CollectiveOpSpec(name=nm, kind=kind, size_bytes=size, stream=stream, ranks=ranks,
                                             after=[st.last] if st.last else [], engine=engine))
            names.append(nm)
        return names

    # tensor-parallel GEMMs with their communication

    def tp_gemm(self, st: _Stage, s: int, name: str, m: int, n: int, k: int, *, pre: bool = False,
                post: Literal["rs", "ar"] | None = None) -> None:
        """A GEMM over the micro-batch's tokens (m rows), with an all-gather of its input before
        (``pre``) or a reduce-scatter / all-reduce of its output after (``post``)."""
        tp_comm = self.comm and self.lay.tp > 1
        size = float(self.tokens * self.m.hidden * self.act_b)
        groups = self.lay.tp_groups(s)
        if not tp_comm or (not pre and post is None):
            self.gemm(st, name, m, n, k)
            return
        chunks = self.chunks if self.p.tp_overlap != "none" else 1
        engine: Literal["sm", "copy_engine"] = "copy_engine" if self.p.tp_overlap == "copy_engine" else "sm"
        kind: CollectiveKind = "reduce_scatter" if post == "rs" else "all_reduce"
        rows = [m // chunks + (1 if i < m % chunks else 0) for i in range(chunks)]
        if pre:
            ags = [self.collective(st, f"{name}.ag{i}" if chunks > 1 else f"{name}.ag", "all_gather",
                                   size / chunks, "tp", groups, engine) for i in range(chunks)]
            for i in range(chunks):
                st.pending += ags[i]
                self.gemm(st, f"{name}.{i}" if chunks > 1 else name, rows[i], n, k)
            return
        posts: list[str] = []
        for i in range(chunks):
            self.gemm(st, f"{name}.{i}" if chunks > 1 else name, rows[i], n, k)
            posts += self.collective(st, f"{name}.{post}{i}" if chunks > 1 else f"{name}.{post}", kind,
                                     size / chunks, "tp", groups)
        st.pending += posts

    # data parallelism

    def grad_ready(self, st: _Stage, s: int, nbytes: float, last_mb: bool) -> None:
        """DDP: a gradient tensor is ready after the stage's last op; close a bucket when full."""
        if self.p.dp_mode != "ddp" or self.lay.dp == 1 or not self.comm or not last_mb:
            return
        st.bucket_bytes += nbytes
        cap = self.p.first_bucket_bytes if st.bucket_index == 0 else self.p.bucket_bytes
        if st.bucket_bytes >= cap:
            self.flush_bucket(st, s)

    def flush_bucket(self, st: _Stage, s: int) -> None:
        if st.bucket_bytes <= 0:
            return
        st.buckets += self.collective(st, f"s{s}.bucket{st.bucket_index}", "all_reduce", st.bucket_bytes, "dp",
                                      self.lay.dp_groups(s))
        st.bucket_bytes = 0.0
        st.bucket_index += 1

    # a layer

    def layer_forward(self, st: _Stage, s: int, pre: str) -> None:
        m, t = self.m, self.lay.tp
        T = self.tokens
        sp = self.p.sequence_parallel
        mats = layer_matrices(m, t)
        local = T // t if sp else T
        hb = local * m.hidden * self.act_b
        post: Literal["rs", "ar"] = "rs" if sp else "ar"
        self.mem(st, f"{pre}.norm1", 2 * hb, "norm")
        self.tp_gemm(st, s, f"{pre}.qkv", T, mats["qkv"][1], mats["qkv"][0], pre=sp)
        self.attention(st, f"{pre}.attn", backward=False)
        self.tp_gemm(st, s, f"{pre}.proj", T, mats["proj"][1], mats["proj"][0], post=post)
        self.mem(st, f"{pre}.norm2", 4 * hb, "norm")
        self.tp_gemm(st, s, f"{pre}.fc1", T, mats["fc1"][1], mats["fc1"][0], pre=sp)
        f_local = T * mats["fc1"][1]
        self.mem(st, f"{pre}.act", (f_local + f_local // (2 if m.gated_mlp else 1)) * self.act_b, "elementwise")
        self.tp_gemm(st, s, f"{pre}.fc2", T, mats["fc2"][1], mats["fc2"][0], post=post)
        self.mem(st, f"{pre}.residual", 3 * hb, "elementwise")

    def layer_backward(self, st: _Stage, s: int, pre: str, last_mb: bool) -> None:
        m, t = self.m, self.lay.tp
        T = self.tokens
        sp = self.p.sequence_parallel and self.comm
        mats = layer_matrices(m, t)
        local = T // t if self.p.sequence_parallel else T
        hb = local * m.hidden * self.act_b
        post: Literal["rs", "ar"] = "rs" if self.p.sequence_parallel else "ar"
        gb = self.comm_b
        self.mem(st, f"{pre}.residual.bwd", 3 * hb, "elementwise")
        # Row-parallel FC2: with SP its output gradient is gathered first.
        self.tp_gemm(st, s, f"{pre}.fc2.dgrad", T, mats["fc2"][0], mats["fc2"][1], pre=sp)
        self.gemm(st, f"{pre}.fc2.wgrad", mats["fc2"][0], mats["fc2"][1], T)
        self.grad_ready(st, s, mats["fc2"][0] * mats["fc2"][1] * gb, last_mb)
        f_local = T * mats["fc1"][1]
        self.mem(st, f"{pre}.act.bwd", 2 * (f_local + f_local // (2 if m.gated_mlp else 1)) * self.act_b,
                 "elementwise")
        self._column_backward(st, s, f"{pre}.fc1", mats["fc1"], post, sp)
        self.grad_ready(st, s, mats["fc1"][0] * mats["fc1"][1] * gb, last_mb)
        self.mem(st, f"{pre}.norm2.bwd", 6 * hb, "norm")
        self.tp_gemm(st, s, f"{pre}.proj.dgrad", T, mats["proj"][0], mats["proj"][1], pre=sp)
        self.gemm(st, f"{pre}.proj.wgrad", mats["proj"][0], mats["proj"][1], T)
        self.grad_ready(st, s, mats["proj"][0] * mats["proj"][1] * gb, last_mb)
        self.attention(st, f"{pre}.attn.bwd", backward=True)
        self._column_backward(st, s, f"{pre}.qkv", mats["qkv"], post, sp)
        self.mem(st, f"{pre}.norm1.bwd", 3 * hb, "norm")
        small = (layer_params(m, t) - sum(i * o for i, o in mats.values())) * gb
        self.grad_ready(st, s, mats["qkv"][0] * mats["qkv"][1] * gb + small, last_mb)

    def _column_backward(self, st: _Stage, s: int, name: str, mat: tuple[int, int], post: Literal["rs", "ar"],
                         sp: bool) -> None:
        """Column-parallel linear backward as Megatron-LM overlaps it: the input's all-gather (SP)
        is issued first, the data gradient's reduction runs beside the weight-gradient GEMM."""
        T = self.tokens
        ag: list[str] = []
        if sp and self.lay.tp > 1:
            ag = self.collective(st, f"{name}.wgrad.ag", "all_gather", float(T * self.m.hidden * self.act_b),
                                 "tp", self.lay.tp_groups(s))
        self.tp_gemm(st, s, f"{name}.dgrad", T, mat[0], mat[1], post=post)
        after_reduction = st.pending
        st.pending = list(ag)
        self.gemm(st, f"{name}.wgrad", mat[0], mat[1], T)
        st.pending = after_reduction

    def attention(self, st: _Stage, name: str, backward: bool) -> None:
        """The core attention of one micro-batch on one tensor-parallel rank (its heads)."""
        m, b = self.m, self.spec.micro_batch_size
        heads, s, d = m.heads // self.lay.tp, m.seq_len, m.hidden // m.heads
        if self.spec.attention == "flash":
            self.compute(st, AttentionOp(name=name, kind="attention", batch=b, heads=heads, seq_len=s, head_dim=d,
                                         precision=self._attn_precision(), backward=backward))
            return
        # Unfused: every head's s x s scores go through HBM. The batched GEMMs are priced as one
        # GEMM of the same FLOPs and operand shapes (b x heads x s rows).
        rows = b * heads * s
        scores = float(b * heads * s * s)
        prec = self._attn_precision()
        eb = activation_element_bytes(prec)

        def bmm(part: str, n: int, k: int) -> None:
            self.compute(st, GemmOp(name=f"{name}.{part}", kind="gemm", m=rows, n=n, k=k, precision=prec))

        if not backward:
            bmm("qk", s, d)
            self.mem(st, f"{name}.softmax", 2 * eb * scores, "softmax")  # scores in, probabilities out
            self.mem(st, f"{name}.dropout", (2 * eb + 1) * scores, "elementwise")  # and its byte mask
            bmm("pv", d, s)
            return
        bmm("pv.dgrad", s, d)  # the probabilities' gradient
        bmm("pv.wgrad", d, s)  # V's
        self.mem(st, f"{name}.dropout", (2 * eb + 1) * scores, "elementwise")
        self.mem(st, f"{name}.softmax", 3 * eb * scores, "softmax")  # probabilities and gradient in, out
        bmm("qk.dgrad", d, s)  # Q's
        bmm("qk.wgrad", d, s)  # K's

    def _attn_precision(self) -> Literal["fp32", "tf32", "fp16", "bf16"]:
        # FP8 recipes (Transformer Engine) keep attention in 16 bits.
        return "bf16" if self.spec.precision == "fp8" else self.spec.precision

    # embedding and head

    def embedding(self, st: _Stage, s: int, pre: str, backward: bool, last_mb: bool) -> None:
        m, t = self.m, self.lay.tp
        T = self.tokens
        hb = T * m.hidden * self.act_b
        if not backward:
            self.mem(st, f"{pre}.embed", 2 * hb, "elementwise")
            if self.lay.tp > 1 and self.comm:
                kind: CollectiveKind = "reduce_scatter" if self.p.sequence_parallel else "all_reduce"
                st.pending += self.collective(st, f"{pre}.embed.{kind}", kind, float(hb), "tp",
                                              self.lay.tp_groups(s))
            return
        self.mem(st, f"{pre}.embed.bwd", 2 * hb, "elementwise")
        self.grad_ready(st, s, m.vocab * m.hidden // t * self.comm_b, last_mb)

    def head(self, st: _Stage, s: int, pre: str, backward: bool, last_mb: bool) -> None:
        m, t = self.m, self.lay.tp
        T = self.tokens
        vocab = m.vocab // t
        if not backward:
            self.tp_gemm(st, s, f"{pre}.head", T, vocab, m.hidden, pre=self.p.sequence_parallel and self.comm)
            self.mem(st, f"{pre}.loss", 3 * T * vocab * self.act_b, "softmax")
            return
        self.gemm(st, f"{pre}.head.dgrad", T, m.hidden, vocab)
        self.gemm(st, f"{pre}.head.wgrad", m.hidden, vocab, T)
        if not m.tied_embeddings:
            self.grad_ready(st, s, m.hidden * vocab * self.comm_b, last_mb)
        if self.lay.tp > 1 and self.comm:
            kind: CollectiveKind = "reduce_scatter" if self.p.sequence_parallel else "all_reduce"
            st.pending += self.collective(st, f"{pre}.head.{kind}", kind,
                                          float(T * m.hidden * self.act_b), "tp", self.lay.tp_groups(s))


def training_ops(spec: TrainingSpec, n_ranks: int, *, replicas_made: int | None = None) -> TrainingOps:
    """The op specs of one training iteration on ``n_ranks`` ranks; with ``replicas_made``, only the
    first replicas' own ops (their data-parallel collectives still list every member)."""
    lay = replace(layout(spec, n_ranks), made_dp=replicas_made)
    g = _Gen(spec, lay)
    m = g.m
    p, v, mbs = lay.pp, lay.v, spec.micro_batches
    per_chunk = m.layers // (p * v)
    n_virtual = p * v
    fsdp = spec.parallel.dp_mode == "fsdp" and lay.dp > 1 and spec.communication
    orders = [stage_order(spec.parallel.pipeline, p, s, mbs, v) for s in range(p)]
    b_cost = 3.0 if spec.recompute else 2.0
    merged = merge_stages(orders, p, v, b_cost)
    # Last compute op of each (phase, micro-batch, virtual stage), for send/recv and peer deps.
    item_last: dict[tuple[str, int, int], str] = {}
    act_bytes = float(spec.micro_batch_size * m.seq_len * m.hidden * g.act_b
                      / (lay.tp if spec.parallel.sequence_parallel else 1))
    last_b = {(s, c): max(mb for ph, mb, cc in orders[s] if ph == "B" and cc == c) for s in range(p)
              for c in range(v)}
    fsdp_state = _FsdpState(g, m.layers) if fsdp else None

    for s, (ph, mb, c) in merged:
        st = g.stages[s]
        vs = c * p + s
        src_vs = vs - 1 if ph == "F" else vs + 1
        prev_last = st.last
        # A peer wait with no transfer (communication off): (sending item's last op, rank map).
        peer_wait: tuple[str, dict[int, int]] | None = None
        if 0 <= src_vs < n_virtual:
            src_stage = src_vs % p
            sender = item_last[(ph, mb, src_vs)]
            if spec.communication and src_stage != s:
                for d in range(lay.replicas_made):
                    for i in range(lay.tp):
                        a, b = lay.rank(d, src_stage, i), lay.rank(d, s, i)
                        name = f"{ph}{mb}.v{src_vs}to{vs}.d{d}t{i}"
                        lo, hi = sorted((src_stage, s))
                        deps = [sender] + ([prev_last] if prev_last else [])
                        g.ops.append(SendRecvOp(name=name, kind="send_recv", size_bytes=act_bytes, src=a, dst=b,
                                                stream=f"pp{lo}-{hi}", after_any=deps))
                        st.pending.append(name)
                        g.p2p_items[name] = (src_stage, orders[src_stage].index((ph, mb, src_vs // p)), s,
                                             orders[s].index((ph, mb, c)))
            elif src_stage != s:
                mapping = {lay.rank(d, s, i): lay.rank(d, src_stage, i) for d in range(lay.replicas_made)
                           for i in range(lay.tp)}
                peer_wait = (sender, mapping)
        first_index = len(g.ops)
        layers = range(vs * per_chunk, (vs + 1) * per_chunk)
        last_mb = mb == last_b[(s, c)]
        if ph == "F":
            if vs == 0 and spec.embedding_and_head:
                if fsdp_state:
                    fsdp_state.gather_embedding(st)
                g.embedding(st, s, f"F{mb}", backward=False, last_mb=last_mb)
            for layer in layers:
                if fsdp_state:
                    fsdp_state.before_forward(st, layer, mb)
                g.layer_forward(st, s, f"F{mb}.L{layer}")
            if vs == n_virtual - 1 and spec.embedding_and_head:
                g.head(st, s, f"F{mb}", backward=False, last_mb=last_mb)
        else:
            if vs == n_virtual - 1 and spec.embedding_and_head:
                g.head(st, s, f"B{mb}", backward=True, last_mb=last_mb)
            for layer in reversed(layers):
                if fsdp_state:
                    fsdp_state.before_backward(st, layer, mb)
                if spec.recompute:
                    g.layer_forward(st, s, f"R{mb}.L{layer}")
                g.layer_backward(st, s, f"B{mb}.L{layer}", last_mb)
                if fsdp_state:
                    fsdp_state.after_backward(st, layer, mb)
            if vs == 0 and spec.embedding_and_head:
                g.embedding(st, s, f"B{mb}", backward=True, last_mb=last_mb)
                if fsdp_state:
                    fsdp_state.reduce_embedding(st, mb)
        if peer_wait is not None:
            first = next(op.name for op in g.ops[first_index:] if op.stream == "compute")
            g.peer.append((first, *peer_wait))
        item_last[(ph, mb, vs)] = st.last or ""

    for s, st in enumerate(g.stages):
        g.flush_bucket(st, s)
        if spec.optimizer:
            st.pending += st.buckets + st.rs
            local = params_per_rank(spec, m, lay.tp, p) / (lay.dp if fsdp else 1)
            grad_b = g.comm_b
            # Fused Adam reads and writes fp32 master weights and both moments (24 B), reads the
            # gradient, and writes the 16-bit working copy in mixed precision.
            per_param = 24 + grad_b + (2 if g.act_b == 2 else 0)
            g.mem(st, f"s{s}.optimizer", local * per_param, "elementwise")
        elif st.buckets or st.rs:
            st.pending += st.buckets + st.rs
    return TrainingOps(ops=g.ops, peer_deps=g.peer, layout=lay, p2p_items=g.p2p_items,
                       stage_lasts=[[item_last[(ph, mb, c * p + s)] for ph, mb, c in orders[s]] for s in range(p)],
                       stage_steps=[exchange_steps(spec.parallel.pipeline, p, s, mbs, v) for s in range(p)])


class _FsdpState:
    """FSDP / ZeRO-3 per-layer all-gathers (prefetched) and reduce-scatters."""

    def __init__(self, g: _Gen, layers: int) -> None:
        self.g = g
        self.layers = layers
        self.groups = g.lay.dp_groups(0)
        self.layer_bytes = float(layer_params(g.m, g.lay.tp) * g.comm_b * g.lay.dp)
        self.emb_bytes = float(embedding_params(g.m, g.lay.tp) * g.comm_b * g.lay.dp)
        self.names: dict[tuple[str, int, int], list[str]] = {}

    def _gather(self, st: _Stage, phase: str, layer: int, mb: int) -> None:
        key = (phase, layer, mb)
        if key in self.names or not 0 <= layer < self.layers:
            return
        self.names[key] = self.g.collective(st, f"{phase}{mb}.L{layer}.fsdp.ag", "all_gather", self.layer_bytes,
                                            "dp", self.groups)

    def gather_embedding(self, st: _Stage) -> None:
        if ("E", -1, 0) in self.names:
            return
        self.names[("E", -1, 0)] = self.g.collective(st, "fsdp.embed.ag", "all_gather", self.emb_bytes, "dp",
                                                     self.groups)
        st.pending += self.names[("E", -1, 0)]

    def _ahead(self) -> range:
        # Prefetching more layers than the model has is prefetching all of them.
        return range(min(self.g.p.fsdp_prefetch, self.g.m.layers) + 1)

    def before_forward(self, st: _Stage, layer: int, mb: int) -> None:
        for ahead in self._ahead():
            self._gather(st, "F", layer + ahead, mb)
        st.pending += self.names[("F", layer, mb)]

    def before_backward(self, st: _Stage, layer: int, mb: int) -> None:
        for ahead in self._ahead():
            self._gather(st, "B", layer - ahead, mb)
        st.pending += self.names[("B", layer, mb)]

    def after_backward(self, st: _Stage, layer: int, mb: int) -> None:
        st.rs += self.g.collective(st, f"B{mb}.L{layer}.fsdp.rs", "reduce_scatter", self.layer_bytes, "dp",
                                   self.groups)

    def reduce_embedding(self, st: _Stage, mb: int) -> None:
        st.rs += self.g.collective(st, f"B{mb}.fsdp.embed.rs", "reduce_scatter", self.emb_bytes, "dp",
                                   self.groups)


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
        simulated = _replica_ranks(spec, n_ranks, system, knobs)
        _check_training_size(spec, simulated or n_ranks, limit, source)
        gen = training_ops(spec, n_ranks, replicas_made=1 if simulated else None)
    except OvsimError as e:
        if e.source:
            raise
        raise OvsimError(e.message, source=source, field=f"training.{e.field}".rstrip(".")) from None
    wl = build_workload(gen.ops, gpu=gpu, system=system, params=params, n_ranks=n_ranks, schedule=schedule,
                        knobs=knobs, streams=streams, source=source, max_ops=max_ops, simulated_ranks=simulated)
    if schedule == "sequential" and gen.p2p_items:
        wl = _blocking_sends(wl, gen, streams or {}, source, interleaved=spec.parallel.pipeline == "interleaved")
    if not gen.peer_deps:
        return wl
    # Stage-to-stage waits with no transfer (communication off): the receiving rank's first op of
    # the item waits for the matching rank's last op of the sending item.
    extra: dict[str, list[str]] = {}
    for name, dep, mapping in gen.peer_deps:
        for dst, src in mapping.items():
            extra.setdefault(f"{name}@r{dst}", []).append(f"{dep}@r{src}")
    ops = tuple(replace(op, deps=op.deps + tuple(extra[op.id])) if op.id in extra else op for op in wl.ops)
    out = replace(wl, ops=ops)
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


def _replica_ranks(spec: TrainingSpec, n_ranks: int, system: SystemSpec, knobs: Knobs | None) -> int | None:
    """Ranks of one data-parallel replica (rank = (dp x pp + stage) x tp + tp index, so replica 0
    is ranks 0..tp x pp - 1), where the replicas can stand for each other: every GPU's links, NIC
    and memory are its own, so identical replicas meet identical rates. None: simulate every rank
    (asked for, one replica, or a mesh, whose links join particular pairs)."""
    if knobs is not None and not knobs.rank_symmetry:
        return None
    lay = layout(spec, n_ranks)
    if lay.dp < 2 or system.topology == "mesh":
        return None
    k = lay.tp * lay.pp
    # A replica that straddles nodes unevenly meets the network differently from its neighbours.
    if k % system.gpu_count and system.gpu_count % k:
        return None
    # Nor may one NIC serve two replicas: the unsimulated one's traffic would be missing from it.
    if system.network is not None and system.nic_port_of(k - 1) == system.nic_port_of(k):
        return None
    return k


def _blocking_sends(wl: Workload, gen: TrainingOps, priorities: dict[str, int], source: str, *,
                    interleaved: bool) -> Workload:
    """The sequential pipeline as Megatron-LM runs it by default (``batch_p2p_sync``, a device
    synchronize after each batched send/recv; ``megatron/core/model_parallel_config.py``): a
    transfer starts once its sender's work is done and its receiver has reached the exchange that
    posts it, and both ends wait for it before going on. Listing the transfers on the ranks' one
    stream instead would order each rank's sends and receives by the list, not by the rank's own
    schedule, and make a stage wait for a peer whose transfer is listed behind work it does not
    need.

    GPipe and 1F1B (Megatron's non-interleaved schedule) exchange after every item: a receive is
    posted when the receiver's previous item is done, and a send is batched with a receive only
    from the same peer (``send_forward_recv_backward``, ``send_backward_recv_forward``); the
    warm-up and cool-down receive from one neighbour after sending to the other, so a rank's
    transfer with one peer waits for those it issued before with the other. The interleaved
    schedule exchanges with both neighbours at once after each of its steps
    (:func:`exchange_steps`; ``send_forward_backward_recv_forward_backward``): a transfer starts
    once the sender's step and the step before the receiver's are done, and each rank's next step
    waits for its whole exchange. (As blocking transfers one item at a time, its ring of stages
    could each wait on a send the next cannot receive yet.)"""
    # A pipeline's transfers stay within a data-parallel replica: those of replicas the simulated
    # one stands for (rank symmetry) have no ops.
    specs = {o.name: o for o in gen.ops if isinstance(o, SendRecvOp) and o.src < wl.n_ranks}
    main: dict[int, list[str]] = {}
    for op in wl.ops:
        if op.stream == "main" and op.name not in gen.p2p_items:
            main.setdefault(op.rank, []).append(op.id)
    after_in_main = {i: (seq[k + 1] if k + 1 < len(seq) else None) for seq in main.values() for k, i in enumerate(seq)}

    # The last op of each stage's exchange steps.
    ends = [{step: lasts[k] for k, step in enumerate(steps)} for steps, lasts in zip(gen.stage_steps,
                                                                                     gen.stage_lasts, strict=True)]

    def step_last(stage: int, step: int) -> str | None:
        return ends[stage][step] if step >= 0 else None

    # Each transfer's end on each rank waits for that rank's op named here (None: nothing), and
    # the rank's next op on its one stream waits for the end.
    after: dict[str, tuple[str | None, str | None]] = {}
    for name, (ss, si, ds, di) in gen.p2p_items.items():
        if name not in specs:
            continue
        after[name] = (step_last(ss, gen.stage_steps[ss][si]), step_last(ds, gen.stage_steps[ds][di] - 1))
    extra: dict[str, list[str]] = {}
    sent: dict[tuple[str, int], list[SendRecvOp]] = {}
    for name, (at_src, at_dst) in after.items():
        o = specs[name]
        for rank, at in ((o.src, at_src), (o.dst, at_dst)):
            nxt = after_in_main[f"{at}@r{rank}"] if at is not None else None
            if nxt is not None:
                extra.setdefault(nxt, []).append(f"{name}@r{rank}")
        if at_src is not None:
            sent.setdefault((at_src, o.src), []).append(o)
    if not interleaved:
        for name, (_, at_dst) in after.items():
            o = specs[name]
            if at_dst is not None:
                extra.setdefault(f"{name}@r{o.dst}", []).extend(
                    f"{x.name}@r{o.dst}" for x in sent.get((at_dst, o.dst), []) if x.dst != o.src)
    ops = []
    for op in wl.ops:
        if op.name in gen.p2p_items:
            # A stream a direction: a rank's sends and receives to one peer go in the rank's own
            # order, which the list keeps within a direction only.
            at = after[op.name][0 if op.rank == specs[op.name].src else 1]
            op = replace(op, stream=f"p2p{specs[op.name].src}>{specs[op.name].dst}",
                         deps=(f"{at}@r{op.rank}",) if at is not None else ())
        if op.id in extra:
            op = replace(op, deps=op.deps + tuple(extra[op.id]))
        ops.append(op)
    specs_stream = {f"p2p{o.src}>{o.dst}": o.stream for o in specs.values()}
    streams = {(st.rank, st.name): st for st in wl.streams}
    for op in ops:
        if (op.rank, op.stream) not in streams:
            streams[(op.rank, op.stream)] = StreamSpec(rank=op.rank, name=op.stream,
                                                       priority=priorities.get(specs_stream.get(op.stream, ""), 0))
    out = replace(wl, ops=tuple(ops), streams=tuple(streams[k] for k in sorted(streams)))
    out.validate(source)
    return out
