"""The op specs a training iteration is made of, emitted part by part: a transformer layer forward
and backward (with tensor-parallel collectives, chunked or not), the embedding and LM head and
DDP's gradient buckets; FSDP's per-layer collectives are in :mod:`ovsim.models.training_fsdp`.
What each part holds, and why, is stated in :mod:`ovsim.models.training`, which orders the parts
into a schedule."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ovsim.models.op_specs import (
    AttentionOp,
    CollectiveKind,
    CollectiveOpSpec,
    GemmOp,
    MemoryOp,
    OpSpec,
    SpecCopy,
    Templates,
    made,
)
from ovsim.models.training_amp import (
    CAST_B,
    FP32_B,
    accumulate_grad,
    amp_layer_backward,
    amp_layer_forward,
    weight_grad_cast,
)
from ovsim.models.training_blocks import BlockCopies
from ovsim.models.training_cp import cp_attention
from ovsim.models.training_layout import Layout
from ovsim.models.training_spec import (
    TrainingSpec,
    act_elements,
    activation_element_bytes,
    gradient_element_bytes,
    holds_head,
    input_embedding_params,
    layer_matrices,
    layer_params,
    rank_tokens,
    wire_element_bytes,
)

# Megatron-LM's vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py) on the
# logits cast to FP32 (``output.float()`` unless --fp16-lm-cross-entropy): (pass, bytes an element of
# the rank's T x V/t logits; "cast" also reads the 16-bit logits, "cast_back" writes 16-bit ones).
# Forward: the cast, the row max, logits minus it in place, exp in place, the row sum, the division
# in place (the softmax kept for backward). Backward: the softmax times the loss gradient in place,
# and its cast back to 16 bits for the LM head's backward. The all-reduces of the row max, sum and
# target logits over the tensor-parallel group (T floats each) are left out.
LOSS_PASSES: dict[str, tuple[tuple[str, float], ...]] = {
    "forward": (("cast", 4.0), ("max", 4.0), ("sub", 8.0), ("exp", 8.0), ("sum", 4.0), ("div", 8.0)),
    "backward": (("mul", 8.0), ("cast_back", 4.0)),
}

# PyTorch's F.cross_entropy on 16-bit logits under autocast, as PyTorch 2.11 ran it on an H200
# (calibration/data/h200-sxm/2026-12-04-b, steps; read off its kernels and their types, nothing
# fitted): (pass, FP32 bytes an element of the T x V logits, 16-bit operands an element). Forward:
# log-softmax in 16 bits (cunn_SoftMaxForward<BFloat16, float, BFloat16>: FP32 accumulation), the
# log-probabilities cast to FP32 for NLL (one block, left out). Backward: the FP32 gradient zeroed,
# NLL's scatter (left out), its cast to 16 bits, log-softmax's backward (gradient and output in,
# gradient out, in 16 bits).
PYTORCH_LOSS_PASSES: dict[str, tuple[tuple[str, float, int], ...]] = {
    "forward": (("log_softmax", 0.0, 2), ("cast", 4.0, 1)),
    "backward": (("fill", 4.0, 0), ("cast", 4.0, 1), ("log_softmax_bwd", 0.0, 3)),
}


def optimizer_passes(spec: TrainingSpec, grad_b: int) -> list[tuple[str, float, float]]:
    """The optimizer step's memory-bound passes: (name, bytes a parameter of the rank's optimizer
    shard, bytes a parameter of all it holds), in the order they run. ``grad_b``: the gradients'
    width in their buffer (:func:`ovsim.models.training_spec.gradient_element_bytes`).

    fused_adam: one fused Adam pass, which reads and writes the FP32 master weight and both moments
    (24 B), reads the gradient and, with 16-bit weights, writes their working copy.

    megatron: Megatron-LM's mixed-precision optimizer (``megatron/core/optimizer/optimizer.py``,
    ``Float16OptimizerWithFloat16Params`` and ``DistributedOptimizer``; ``clip_grads.py``), each a
    separate pass over the shard: 16-bit main gradients copied to FP32 (``.float()``, which copies
    nothing where they are FP32 already), their unscaling and inf check with FP16's dynamic loss
    scale (``torch._amp_foreach_non_finite_check_and_unscale_``; BF16 runs without a loss scaler),
    the gradient norm for clipping (``multi_tensor_l2norm``, read once; the rescale runs only when
    the norm exceeds the clip and is not counted), fused Adam on the FP32 gradients, the FP32
    weights copied to the 16-bit ones (``_copy_main_params_to_model_params``), and the gradient
    buffer zeroed for the next iteration, whole on every rank (``zero_grad_buffer``). FP32 training
    runs none of the copies.

    composer: llm-foundry's step. Gradient-norm clipping (its MPT recipes' ``gradient_clipping``,
    FSDP's ``clip_grad_norm_``): the FP32 gradients read for their norm (4 B) and scaled in place
    whatever the norm (8 B). Then Composer's ``DecoupledAdamW.adamw``, PyTorch ops one parameter
    at a time, each a pass over FP32 tensors: the first moment scaled and the gradient added (8 +
    12 B), the second scaled and the gradient's square added (8 + 12), its square root, the bias
    correction's division and epsilon's addition, each writing the denominator (8 + 8 + 8), and
    the weight updated from the moment and denominator (16): 80 B. Decoupled weight decay would
    add a pass (8 B); the MPT recipes set it to 0 and it is not counted, and so is FP16's loss-scale
    unscale (the MPT recipes run BF16). FSDP casts the updated FP32 shard to 16 bits when it next
    gathers it, counted with its gathers (:class:`ovsim.models.training_fsdp.FsdpCollectives`)."""
    mode = spec.optimizer_mode
    if mode == "none":
        return []
    # Under autocast the parameters are FP32 themselves: no 16-bit copy to write. With FP16,
    # GradScaler checks the gradients for infinities (``_amp_foreach_non_finite_check_and_unscale_``,
    # read and written in place) even where the fused step takes the scale itself.
    mixed = spec.precision not in ("fp32", "tf32") and not spec.autocast
    scaler = [("unscale", 8.0, 0.0)] if spec.precision == "amp_fp16" else []
    if mode == "fused_adam":
        return [*scaler, ("optimizer", 24.0 + grad_b + (2.0 if mixed else 0.0), 0.0)]
    if mode == "composer":
        return [*scaler, ("grad_norm", 4.0, 0.0), ("grad_clip", 8.0, 0.0), ("optimizer", 80.0, 0.0)]
    passes: list[tuple[str, float, float]] = []
    if grad_b < 4:
        passes.append(("grad_copy", grad_b + 4.0, 0.0))
    if spec.precision == "fp16":
        passes.append(("unscale", 8.0, 0.0))
    passes += [("grad_norm", 4.0, 0.0), ("optimizer", 28.0, 0.0)]
    if mixed:
        passes.append(("param_copy", 6.0, 0.0))
    passes.append(("zero_grad", 0.0, float(grad_b)))
    return passes


@dataclass
class StageState:
    """One pipeline stage's ranks while ops are emitted: its last compute op, the communication its
    next compute op waits for, and its data-parallel buckets and reduce-scatters so far."""

    ranks: list[int]
    last: str | None = None
    pending: list[str] = field(default_factory=list)
    bucket_bytes: float = 0.0
    bucket_index: int = 0
    buckets: list[str] = field(default_factory=list)
    bucket_sizes: list[float] = field(default_factory=list)
    rs: list[str] = field(default_factory=list)


class LayerEmitter:
    """Emits the op specs of a training iteration's parts (layers forward and backward, embedding,
    head, gradient buckets) stage by stage; :func:`ovsim.models.training.training_ops` orders them."""

    def __init__(self, spec: TrainingSpec, lay: Layout, copy_blocks: bool = True) -> None:
        self.spec = spec
        self.m = spec.shape()
        self.lay = lay
        self.p = spec.parallel
        self.comm = spec.communication
        self.ops: list[OpSpec | SpecCopy] = []
        self.templates: Templates = {}
        self.peer: list[tuple[str, str, dict[int, int]]] = []
        self.p2p_items: dict[str, tuple[int, int, int, int]] = {}
        self.stages = [StageState(ranks=lay.stage_ranks(s)) for s in range(lay.pp)]
        self.gemm_precision = spec.compute_precision
        self.act_b = activation_element_bytes(spec.precision)
        self.comm_b = wire_element_bytes(spec.precision)
        # DDP's gradients (FSDP's are at the wire's width: Megatron-LM's optimizer is refused there).
        self.grad_b = gradient_element_bytes(spec)
        self.tokens = rank_tokens(spec, self.m)
        self.chunks = self.p.tp_chunks or self.p.tp
        # Layer blocks copied from the first of their kind (None: each emitted).
        self.blocks = BlockCopies() if copy_blocks else None
        # Under autocast: whether a backward accumulates into the gradients of an earlier
        # micro-batch (set by the caller for each backward).
        self.accumulating = False

    # basic emitters

    def compute(self, st: StageState, cls: type[GemmOp | MemoryOp | AttentionOp], **fields: Any) -> str:
        """A compute op of ``cls`` on the stage's ranks, after what the stage left pending. Made in
        one step: a training iteration makes hundreds of thousands, and a copy of each doubled the
        build's memory."""
        extra = list(st.pending)
        st.pending = []
        op = made(self.templates, cls, fields.pop("name"), {"after_any": extra}, st.ranks, stream="compute", **fields)
        self.ops.append(op)
        st.last = op.name
        return op.name

    def gemm(self, st: StageState, name: str, m: int, n: int, k: int) -> str:
        # No tile: each GEMM on the library kernel the cost model finds fastest for its shape.
        return self.compute(st, GemmOp, name=name, kind="gemm", m=m, n=n, k=k, precision=self.gemm_precision)

    def mem(self, st: StageState, name: str, nbytes: float, kind: Literal["elementwise", "norm", "softmax"]) -> str:
        return self.compute(st, MemoryOp, name=name, kind=kind, bytes=max(1.0, nbytes), grid_stride=True)

    def fp8_cast(self, st: StageState, name: str, elements: int, gathered: bool = False) -> None:
        """FP8 training (Transformer Engine): a linear's 16-bit operand quantized for its GEMMs, once
        row-wise and once transposed (TE's ``fp8_cast_transpose_fused`` for a forward input,
        ``fp8_cast_transpose_bgrad_fused`` for an output gradient): 2 bytes read and 1 + 1 written an
        element. A ``gathered`` input (sequence parallelism) is cast on the rank's 1/tp of the tokens
        before TE's FP8 all-gather (3 bytes an element of that share), and the whole gathered tensor
        transposed (2 bytes an element). Other precisions run no such kernel."""
        if self.spec.precision != "fp8":
            return
        nbytes = 3.0 * elements / self.lay.tp + 2.0 * elements if gathered else 4.0 * elements
        self.mem(st, f"{name}.fp8", nbytes, "elementwise")

    def side_mem(self, st: StageState, name: str, nbytes: float, stream: str, after: list[str],
                 after_any: list[str] | None = None) -> str:
        """A memory-bound kernel on a stream of its own (not the stage's compute), after ``after``
        (and ``after_any``: ops of other groups, each binding where it runs)."""
        self.ops.append(made(self.templates, MemoryOp, name, {"after": after, "after_any": after_any or []},
                             st.ranks, stream=stream, kind="elementwise", bytes=max(1.0, nbytes), grid_stride=True))
        return name

    def collective(self, st: StageState, name: str, kind: CollectiveKind, size: float, stream: str,
                   groups: list[list[int]], engine: Literal["sm", "copy_engine"] = "sm",
                   after: list[str] | None = None, after_each: list[str] | None = None) -> list[str]:
        """One collective per group, after the stage's last compute op (or ``after``), and each
        after its own item of ``after_each`` (one a group: its group's previous collective)."""
        names = []
        # Tensor-parallel groups are numbered by replica, and data-parallel ones by tensor-parallel
        # rank, whether or not every group's ops are made (rank symmetry).
        numbered = (len(groups) > 1 or (stream == "tp" and self.lay.dp > 1) or (stream == "dp" and self.lay.tp > 1)
                    or stream == "cp")
        for gi, ranks in enumerate(groups):
            nm = f"{name}.g{gi}" if numbered else name
            deps = list(after if after is not None else [st.last] if st.last else [])
            if after_each:
                deps.append(after_each[gi])
            self.ops.append(made(self.templates, CollectiveOpSpec, nm, {"after": deps}, ranks, kind=kind,
                                 size_bytes=size, stream=stream, engine=engine))
            names.append(nm)
        return names

    # tensor-parallel GEMMs with their communication

    def tp_gemm(self, st: StageState, s: int, name: str, m: int, n: int, k: int, *, pre: bool = False,
                post: Literal["rs", "ar"] | None = None, element_bytes: int | None = None) -> None:
        """A GEMM over the micro-batch's tokens (m rows), with an all-gather of its input before
        (``pre``) or a reduce-scatter / all-reduce of its output after (``post``), of
        ``element_bytes`` an element (default: the activations')."""
        tp_comm = self.comm and self.lay.tp > 1
        size = float(self.tokens * self.m.hidden * (element_bytes or self.act_b))
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

    def _buckets_filled(self) -> bool:
        """Whether the last micro-batch's gradients fill DDP's buckets."""
        return self.p.dp_mode == "ddp" and self.lay.dp > 1 and self.comm

    def grad_ready(self, st: StageState, s: int, nbytes: float, last_mb: bool) -> None:
        """DDP: a gradient tensor is ready after the stage's last op; close a bucket when full."""
        if not (last_mb and self._buckets_filled()):
            return
        st.bucket_bytes += nbytes
        cap = self.p.first_bucket_bytes if st.bucket_index == 0 else self.p.bucket_bytes
        # Without overlap every gradient waits for the flush after the stage's last backward.
        if st.bucket_bytes >= cap and self.p.overlap_grad_reduce:
            self.flush_bucket(st, s)

    def flush_bucket(self, st: StageState, s: int) -> None:
        if st.bucket_bytes <= 0:
            return
        # The distributed optimizer reduce-scatters each bucket (its parameters are gathered back
        # after the step); plain DDP all-reduces it.
        kind: CollectiveKind = "reduce_scatter" if self.p.distributed_optimizer else "all_reduce"
        st.buckets += self.collective(st, f"s{s}.bucket{st.bucket_index}", kind, st.bucket_bytes, "dp",
                                      self.lay.dp_groups(s))
        st.bucket_sizes.append(st.bucket_bytes)
        st.bucket_bytes = 0.0
        st.bucket_index += 1

    def start_param_gathers(self, s: int, units: list[tuple[str, int]]) -> dict[str, list[str]]:
        """The distributed optimizer's parameter gathers of stage ``s`` from the iteration's start, in
        forward order (``overlap_param_gather``): each unit's (a layer's, the embedding's, the head's)
        name and parameters on a rank, gathered at the parameters' own width; by unit, the gathers
        its first forward waits for."""
        st, b = self.stages[s], wire_element_bytes(self.spec.precision)
        return {unit: self.collective(st, f"s{s}.param_gather.{unit}", "all_gather", float(n * b), "dp",
                                      self.lay.dp_groups(s), after=[]) for unit, n in units}

    # a layer

    # A layer block (its forward or backward) is copied from the first of its kind
    # (training_blocks): what it emits may depend on the stage, on names made from ``pre``, and on
    # the stage's ``last`` and ``pending`` at entry, and it may change nothing but those two
    # (DDP's buckets, which a backward fills on the last micro-batch, excepted: that block is
    # emitted each time). Anything else that varies by layer or micro-batch goes into the key.

    def layer_forward(self, st: StageState, s: int, pre: str) -> None:
        """One layer's forward (``pre``: ``F{mb}.L{layer}``, or ``R{mb}.L{layer}`` recomputed)."""
        if self.blocks is None:
            self._layer_forward(st, s, pre)
        else:
            self.blocks.emit(self.ops, ("F", s), st, pre, lambda: self._layer_forward(st, s, pre))

    def _layer_forward(self, st: StageState, s: int, pre: str) -> None:
        if self.spec.autocast:
            amp_layer_forward(self, st, pre)
            return
        m, t = self.m, self.lay.tp
        T = self.tokens
        sp = self.p.sequence_parallel
        mats = layer_matrices(m, t)
        local = T // t if sp else T
        hb = local * m.hidden * self.act_b
        post: Literal["rs", "ar"] = "rs" if sp else "ar"
        self.mem(st, f"{pre}.norm1", 2 * hb, "norm")
        gathered = sp and t > 1
        # FP8 with sequence parallelism gathers the QKV and FC1 inputs in FP8 (Transformer Engine).
        gather_b = 1 if self.spec.precision == "fp8" else None
        self.fp8_cast(st, f"{pre}.qkv", T * mats["qkv"][0], gathered)
        self.tp_gemm(st, s, f"{pre}.qkv", T, mats["qkv"][1], mats["qkv"][0], pre=sp, element_bytes=gather_b)
        self.attention(st, f"{pre}.attn", backward=False, stage=s)
        self.fp8_cast(st, f"{pre}.proj", T * mats["proj"][0])
        self.tp_gemm(st, s, f"{pre}.proj", T, mats["proj"][1], mats["proj"][0], post=post)
        self.mem(st, f"{pre}.norm2", 4 * hb, "norm")
        self.fp8_cast(st, f"{pre}.fc1", T * mats["fc1"][0], gathered)
        self.tp_gemm(st, s, f"{pre}.fc1", T, mats["fc1"][1], mats["fc1"][0], pre=sp, element_bytes=gather_b)
        self.mem(st, f"{pre}.act", act_elements(m, T, mats["fc1"][1]) * self.act_b, "elementwise")
        self.fp8_cast(st, f"{pre}.fc2", T * mats["fc2"][0])
        self.tp_gemm(st, s, f"{pre}.fc2", T, mats["fc2"][1], mats["fc2"][0], post=post)
        self.mem(st, f"{pre}.residual", 3 * hb, "elementwise")

    def layer_backward(self, st: StageState, s: int, pre: str, last_mb: bool,
                       recompute_attention: bool = False) -> None:
        """One layer's backward (``pre``: ``B{mb}.L{layer}``); with ``recompute_attention`` the core
        attention's forward runs again (as ``R{mb}.L{layer}.attn``) where autograd reaches it, after
        the projection's gradients (selective recomputation)."""
        # Where its gradients fill DDP's buckets the block also closes some: emitted each time.
        if self.blocks is None or (last_mb and self._buckets_filled()):
            self._layer_backward(st, s, pre, last_mb, recompute_attention)
        else:
            self.blocks.emit(self.ops, ("B", s, recompute_attention, self.accumulating), st, pre,
                             lambda: self._layer_backward(st, s, pre, last_mb, recompute_attention))

    def _layer_backward(self, st: StageState, s: int, pre: str, last_mb: bool, recompute_attention: bool) -> None:
        if self.spec.autocast:
            amp_layer_backward(self, st, s, pre, last_mb, recompute_attention)
            return
        m, t = self.m, self.lay.tp
        T = self.tokens
        sp = self.p.sequence_parallel and self.comm
        mats = layer_matrices(m, t)
        local = T // t if self.p.sequence_parallel else T
        hb = local * m.hidden * self.act_b
        post: Literal["rs", "ar"] = "rs" if self.p.sequence_parallel else "ar"
        gb = self.grad_b
        gather_b = self._backward_gather_bytes()
        self.mem(st, f"{pre}.residual.bwd", 3 * hb, "elementwise")
        # Row-parallel FC2: with SP its output gradient is gathered first. In FP8 each linear's
        # output gradient is quantized first; FC1's inside the activation's backward (TE fuses it).
        self.fp8_cast(st, f"{pre}.fc2", T * mats["fc2"][1])
        self.tp_gemm(st, s, f"{pre}.fc2.dgrad", T, mats["fc2"][0], mats["fc2"][1], pre=sp, element_bytes=gather_b)
        self.gemm(st, f"{pre}.fc2.wgrad", mats["fc2"][0], mats["fc2"][1], T)
        self.grad_ready(st, s, mats["fc2"][0] * mats["fc2"][1] * gb, last_mb)
        self.mem(st, f"{pre}.act.bwd", 2 * act_elements(m, T, mats["fc1"][1]) * self.act_b, "elementwise")
        self._column_backward(st, s, f"{pre}.fc1", mats["fc1"], post, sp)
        self.grad_ready(st, s, mats["fc1"][0] * mats["fc1"][1] * gb, last_mb)
        self.mem(st, f"{pre}.norm2.bwd", 6 * hb, "norm")
        self.fp8_cast(st, f"{pre}.proj", T * mats["proj"][1])
        self.tp_gemm(st, s, f"{pre}.proj.dgrad", T, mats["proj"][0], mats["proj"][1], pre=sp,
                     element_bytes=gather_b)
        self.gemm(st, f"{pre}.proj.wgrad", mats["proj"][0], mats["proj"][1], T)
        self.grad_ready(st, s, mats["proj"][0] * mats["proj"][1] * gb, last_mb)
        if recompute_attention:
            self.attention(st, f"R{pre[1:]}.attn", backward=False, stage=s)
        self.attention(st, f"{pre}.attn.bwd", backward=True, stage=s)
        self.fp8_cast(st, f"{pre}.qkv", T * mats["qkv"][1])
        self._column_backward(st, s, f"{pre}.qkv", mats["qkv"], post, sp)
        self.mem(st, f"{pre}.norm1.bwd", 3 * hb, "norm")
        small = (layer_params(m, t) - sum(i * o for i, o in mats.values())) * gb
        self.grad_ready(st, s, mats["qkv"][0] * mats["qkv"][1] * gb + small, last_mb)

    def _backward_gather_bytes(self) -> int | None:
        """Bytes an element of the backward's sequence-parallel all-gathers (the row-parallel
        linears' output gradients, the column-parallel ones' inputs again for their weight
        gradients): 1 in FP8, as Transformer Engine gathers them (``grad_output_preprocess``
        casts the output gradient "for efficient gather" before gathering it; the column-parallel
        backward gathers the saved FP8 transposed input, ``gather_along_last_dim(inputmat_t)``;
        with overlapped TP communication its all-gather buffers are FP8 too, ``initialize_ub``);
        else the activations' width (None)."""
        return 1 if self.spec.precision == "fp8" else None

    def _column_backward(self, st: StageState, s: int, name: str, mat: tuple[int, int], post: Literal["rs", "ar"],
                         sp: bool) -> None:
        """Column-parallel linear backward as Megatron-LM overlaps it: the input's all-gather (SP)
        is issued first, the data gradient's reduction runs beside the weight-gradient GEMM."""
        T = self.tokens
        ag: list[str] = []
        if sp and self.lay.tp > 1:
            size = float(T * self.m.hidden * (self._backward_gather_bytes() or self.act_b))
            ag = self.collective(st, f"{name}.wgrad.ag", "all_gather", size, "tp", self.lay.tp_groups(s))
        if not self.p.tp_dgrad_overlap:
            self.gemm(st, f"{name}.dgrad", T, mat[0], mat[1])
            st.pending += ag
            self.gemm(st, f"{name}.wgrad", mat[0], mat[1], T)
            st.pending += self._dgrad_reduction(st, s, f"{name}.dgrad.{post}", post)
            return
        self.tp_gemm(st, s, f"{name}.dgrad", T, mat[0], mat[1], post=post)
        after_reduction = st.pending
        st.pending = list(ag)
        self.gemm(st, f"{name}.wgrad", mat[0], mat[1], T)
        st.pending = after_reduction

    def _dgrad_reduction(self, st: StageState, s: int, name: str, post: Literal["rs", "ar"]) -> list[str]:
        """A column-parallel linear's data-gradient reduction over its tensor-parallel group, after
        the stage's last op (none without TP communication)."""
        if not (self.comm and self.lay.tp > 1):
            return []
        kind: CollectiveKind = "reduce_scatter" if post == "rs" else "all_reduce"
        return self.collective(st, name, kind, float(self.tokens * self.m.hidden * self.act_b), "tp",
                               self.lay.tp_groups(s))

    def attention(self, st: StageState, name: str, backward: bool, stage: int = 0) -> None:
        """The core attention of one micro-batch on one tensor-parallel rank (its heads) of pipeline
        stage ``stage``; with context parallelism, of the rank's queries against the gathered
        sequence."""
        m, b = self.m, self.spec.micro_batch_size
        heads, s, d = m.heads // self.lay.tp, m.seq_len, m.hidden // m.heads
        if self.lay.cp > 1:  # (context parallelism runs a fused kernel: training_layout.layout)
            cp_attention(self, st, stage, name, backward)
            return
        if self.spec.attention != "unfused":
            self.compute(st, AttentionOp, name=name, kind="attention", batch=b, heads=heads, seq_len=s, head_dim=d,
                         precision=self.spec.attention_precision, backward=backward,
                         implementation=self.spec.attention_kernel)
            return
        # Unfused: every head's s x s scores go through HBM. The batched GEMMs are priced as one
        # GEMM of the same FLOPs and operand shapes (b x heads x s rows).
        rows = b * heads * s
        scores = float(b * heads * s * s)
        prec = self.spec.attention_precision
        eb = activation_element_bytes(prec)

        def bmm(part: str, n: int, k: int) -> None:
            self.compute(st, GemmOp, name=f"{name}.{part}", kind="gemm", m=rows, n=n, k=k, precision=prec)

        # Megatron-LM's fused scale-mask-softmax reads each score once and writes it once, forward
        # and backward: a streaming pass, priced as one. The kind "softmax" is calibrated on
        # PyTorch's eager softmax, which reads long rows several times (docs/calibration.md).
        if not backward:
            bmm("qk", s, d)
            self.mem(st, f"{name}.softmax", 2 * eb * scores, "elementwise")  # scores in, probabilities out
            self.mem(st, f"{name}.dropout", (2 * eb + 1) * scores, "elementwise")  # and its byte mask
            bmm("pv", d, s)
            return
        bmm("pv.dgrad", s, d)  # the probabilities' gradient
        bmm("pv.wgrad", d, s)  # V's
        self.mem(st, f"{name}.dropout", (2 * eb + 1) * scores, "elementwise")
        self.mem(st, f"{name}.softmax", 3 * eb * scores, "elementwise")  # probabilities and gradient in, out
        bmm("qk.dgrad", d, s)  # Q's
        bmm("qk.wgrad", d, s)  # K's

    # embedding and head

    def embedding(self, st: StageState, s: int, pre: str, backward: bool, last_mb: bool) -> None:
        m, t = self.m, self.lay.tp
        T = self.tokens
        # Under autocast the embedding's output, the residual stream, is FP32.
        hb = T * m.hidden * (FP32_B if self.spec.autocast else self.act_b)
        tp_comm = self.lay.tp > 1 and self.comm
        sp = self.p.sequence_parallel and tp_comm
        if not backward:
            self.mem(st, f"{pre}.embed", 2 * hb, "elementwise")
            if tp_comm:
                # Megatron-LM reduce-scatters the word embeddings into the sequence-parallel region
                # only without learned positions (``reduce_scatter_embeddings``); with them it
                # all-reduces, adds the positions and keeps its slice.
                kind: CollectiveKind = "reduce_scatter" if sp and not m.tied_embeddings else "all_reduce"
                st.pending += self.collective(st, f"{pre}.embed.{kind}", kind, float(hb), "tp",
                                              self.lay.tp_groups(s))
            return
        if sp:  # the backward of the scatter into the sequence-parallel region
            st.pending += self.collective(st, f"{pre}.embed.bwd.all_gather", "all_gather", float(hb), "tp",
                                          self.lay.tp_groups(s))
        amp, table = self.spec.autocast, m.vocab * m.hidden
        if amp:
            # The FP32 embedding's backward is dense: the table's whole FP32 gradient zeroed before
            # the tokens' rows are scattered into it (embedding_dense_backward; its sort and
            # scatter kernels are priced as embed.bwd).
            self.mem(st, f"{pre}.embed.grad.fill", FP32_B * table, "elementwise")
        self.mem(st, f"{pre}.embed.bwd", 2 * hb, "elementwise")
        if amp:
            if m.tied_embeddings:
                # Autograd sums the table's two FP32 gradients, the head's and the embedding's.
                self.mem(st, f"{pre}.embed.grad.sum", 3 * FP32_B * table, "elementwise")
            accumulate_grad(self, st, f"{pre}.embed.grad", table)
        # The table's gradient and the learned positions' (input_embedding_params).
        self.grad_ready(st, s, input_embedding_params(m, t) * self.grad_b, last_mb)

    def loss_passes(self, st: StageState, name: str, phase: str, elements: int) -> None:
        """The cross-entropy passes of ``phase`` over ``elements`` logits: PyTorch's
        (:data:`PYTORCH_LOSS_PASSES`) or Megatron-LM's (:data:`LOSS_PASSES`; FP32 training has its
        logits in FP32 already and casts nothing)."""
        if self.spec.loss == "pytorch":
            for step, fp32_b, sixteen_bit_operands in PYTORCH_LOSS_PASSES[phase]:
                self.mem(st, f"{name}.{step}", (fp32_b + sixteen_bit_operands * self.act_b) * elements, "elementwise")
            return
        for step, per_element in LOSS_PASSES[phase]:
            if step in ("cast", "cast_back"):
                if self.act_b == 4:
                    continue
                per_element += self.act_b
            self.mem(st, f"{name}.{step}", per_element * elements, "elementwise")

    def head(self, st: StageState, s: int, pre: str, backward: bool, last_mb: bool) -> None:
        m, t = self.m, self.lay.tp
        T = self.tokens
        vocab = m.vocab // t
        amp = self.spec.autocast
        if not backward:
            if amp:  # the FP32 stream and the FP32 head weight cast for the 16-bit GEMM
                self.mem(st, f"{pre}.head.cast", CAST_B * T * m.hidden, "elementwise")
                self.mem(st, f"{pre}.head.weight.cast", CAST_B * vocab * m.hidden, "elementwise")
            self.tp_gemm(st, s, f"{pre}.head", T, vocab, m.hidden, pre=self.p.sequence_parallel and self.comm)
            if self.spec.loss == "fused":
                self.mem(st, f"{pre}.loss", 3 * T * vocab * self.act_b, "softmax")
            else:
                self.loss_passes(st, f"{pre}.loss", "forward", T * vocab)
            return
        if self.spec.loss != "fused":
            self.loss_passes(st, f"{pre}.loss", "backward", T * vocab)
        # A column-parallel linear's backward, as Megatron-LM runs it (_column_backward): with SP
        # its input gathered again for the weight gradient, issued first; the data gradient's
        # reduction beside the weight gradient's GEMM, or after it (tp_dgrad_overlap).
        ag = (self.collective(st, f"{pre}.head.wgrad.ag", "all_gather", float(T * m.hidden * self.act_b), "tp",
                              self.lay.tp_groups(s))
              if self.lay.tp > 1 and self.comm and self.p.sequence_parallel else [])
        self.gemm(st, f"{pre}.head.dgrad", T, m.hidden, vocab)
        if amp:
            self.mem(st, f"{pre}.head.gcast", CAST_B * T * m.hidden, "elementwise")
        post: Literal["rs", "ar"] = "rs" if self.p.sequence_parallel else "ar"
        reduction = f"{pre}.head.{'reduce_scatter' if post == 'rs' else 'all_reduce'}"
        reduced = self._dgrad_reduction(st, s, reduction, post) if self.p.tp_dgrad_overlap else []
        st.pending += ag
        self.gemm(st, f"{pre}.head.wgrad", m.hidden, vocab, T)
        if amp:  # a head tied to the embedding has its gradient summed there (embedding) first
            weight_grad_cast(self, st, f"{pre}.head.wgrad", vocab * m.hidden, accumulates=not m.tied_embeddings)
        if not self.p.tp_dgrad_overlap:
            reduced = self._dgrad_reduction(st, s, reduction, post)
        if holds_head(m, self.lay.pp):
            self.grad_ready(st, s, m.hidden * vocab * self.grad_b, last_mb)
        st.pending += reduced
