"""Where a training iteration's ranks sit (:class:`Layout`) and the checks of a parallel layout
against its model and rank count (:func:`layout`), each error naming its field."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ovsim.errors import OvsimError
from ovsim.models.training_spec import (
    ModelShape,
    TrainingSpec,
    grad_bytes_per_rank,
    heads_split_over,
    rank_heads,
    rank_tokens,
)
from ovsim.units import MIB


@dataclass(frozen=True)
class Layout:
    """Where a training iteration's ranks sit. ``dp``: the ranks of a stage that hold the same
    parameters and reduce their gradients together, the data-parallel replicas times the
    context-parallel ranks (``cp``); a replica's index ``d`` below runs over them, its
    context-parallel rank ``d % cp``."""

    dp: int
    tp: int
    pp: int
    v: int
    # Data-parallel replicas, and tensor-parallel ranks of a group, whose own ops are made: None,
    # all; 1, the first, which stands for the rest (rank symmetry). Their collectives still list
    # every member of their groups.
    made_dp: int | None = None
    made_tp: int | None = None
    cp: int = 1
    # Pipeline stages outermost (ParallelSpec.rank_order "tp-cp-dp-pp"), else data parallelism.
    stages_outer: bool = True

    @property
    def replicas_made(self) -> int:
        return self.dp if self.made_dp is None else self.made_dp

    @property
    def tp_made(self) -> int:
        return self.tp if self.made_tp is None else self.made_tp

    def rank(self, d: int, s: int, i: int) -> int:
        if self.stages_outer:
            return (s * self.dp + d) * self.tp + i
        r, c = divmod(d, self.cp)
        return ((r * self.pp + s) * self.cp + c) * self.tp + i

    @property
    def block_ranks(self) -> int:
        """The ranks side by side that one replica's context-parallel group holds: a stage's
        (tp x cp) with stages outermost, else all its stages' (tp x cp x pp)."""
        return self.tp * self.cp * (1 if self.stages_outer else self.pp)

    def stage_ranks(self, s: int) -> list[int]:
        return [self.rank(d, s, i) for d in range(self.replicas_made) for i in range(self.tp_made)]

    def made_ranks(self) -> list[int]:
        """The ranks whose ops are made, ascending."""
        return sorted(r for s in range(self.pp) for r in self.stage_ranks(s))

    def stand_offsets(self) -> list[int]:
        """Offsets from a made rank of the ranks it stands for, 0 (itself) first."""
        if self.made_dp not in (None, 1) or self.made_tp not in (None, 1):
            raise ValueError("a made rank stands for others only where one of each is made (made_dp, made_tp 1)")
        dps = range(self.dp) if self.made_dp is not None else range(1)
        tps = range(self.tp) if self.made_tp is not None else range(1)
        return [self.rank(d, 0, i) for d in dps for i in tps]

    def tp_groups(self, s: int) -> list[list[int]]:
        """Stage ``s``'s tensor-parallel groups (of the replicas made), one list for every call:
        a training iteration asks 100,000s of times. Not to be changed."""
        return self._tp_groups[s]

    def dp_groups(self, s: int) -> list[list[int]]:
        """Stage ``s``'s data-parallel groups (of the tensor-parallel ranks made), as :meth:`tp_groups`."""
        return self._dp_groups[s]

    def cp_groups(self, s: int) -> list[list[int]]:
        """Stage ``s``'s context-parallel groups (of the replicas and tensor-parallel ranks made),
        as :meth:`tp_groups`."""
        return self._cp_groups[s]

    @cached_property
    def _cp_groups(self) -> list[list[list[int]]]:
        replicas = -(-self.replicas_made // self.cp)
        return [[[self.rank(r * self.cp + c, s, i) for c in range(self.cp)] for r in range(replicas)
                 for i in range(self.tp_made)] for s in range(self.pp)]

    @cached_property
    def _tp_groups(self) -> list[list[list[int]]]:
        return [[[self.rank(d, s, i) for i in range(self.tp)] for d in range(self.replicas_made)]
                for s in range(self.pp)]

    @cached_property
    def _dp_groups(self) -> list[list[list[int]]]:
        return [[[self.rank(d, s, i) for d in range(self.dp)] for i in range(self.tp_made)] for s in range(self.pp)]


def layout(spec: TrainingSpec, n_ranks: int) -> Layout:
    """Check the parallel layout against the model and the ranks; every error names its field."""
    p = spec.parallel
    m = spec.shape()
    model_ranks = p.tp * p.cp * p.pp
    split = f"tp {p.tp} x {'cp ' + str(p.cp) + ' x ' if p.cp > 1 else ''}pp {p.pp}"
    if n_ranks % model_ranks:
        raise OvsimError(f"{split} does not divide the {n_ranks} ranks", field="parallel")
    dp = p.dp if p.dp is not None else n_ranks // model_ranks
    if dp * model_ranks != n_ranks:
        raise OvsimError(f"dp {dp} x {split} = {dp * model_ranks} ranks, the scenario has {n_ranks}",
                         field="parallel.dp")
    _check_context_parallel(spec, m)
    if m.heads % p.tp:
        raise OvsimError(f"tensor-parallel degree {p.tp} does not divide the {m.heads} attention heads",
                         field="parallel.tp")
    if m.kv % p.tp:
        # Megatron-LM divides the query groups over the ranks (megatron/core/transformer/attention.py:
        # num_query_groups_per_partition = divide(num_query_groups, world_size)); none repeats them.
        raise OvsimError(f"tensor-parallel degree {p.tp} does not divide the {m.kv} key/value heads",
                         field="parallel.tp")
    if m.ffn % p.tp:
        raise OvsimError(f"tensor-parallel degree {p.tp} does not divide the MLP size {m.ffn}",
                         field="parallel.tp")
    v = p.virtual_stages
    if p.pipeline != "interleaved" and v != 1:
        raise OvsimError(f"virtual_stages {v} needs pipeline: interleaved", field="parallel.virtual_stages")
    if p.pp * v > m.layers:
        raise OvsimError(f"{p.pp * v} pipeline stages (pp {p.pp} x virtual {v}) for {m.layers} layers",
                         field="parallel.pp")
    if p.pipeline == "interleaved" and (p.pp < 2 or spec.micro_batches % p.pp):
        raise OvsimError(f"interleaved 1F1B needs pp >= 2 and micro_batches a multiple of pp (Megatron-LM); "
                         f"pp {p.pp}, micro_batches {spec.micro_batches}", field="parallel.pipeline")
    if p.distributed_optimizer and p.dp_mode != "ddp":
        raise OvsimError("distributed_optimizer shards DDP's optimizer state; FSDP already shards it",
                         field="parallel.distributed_optimizer")
    if p.overlap_param_gather and not (p.distributed_optimizer and p.overlap_grad_reduce):
        raise OvsimError("overlap_param_gather gathers the distributed optimizer's parameters: it needs "
                         "distributed_optimizer and overlap_grad_reduce (Megatron-LM's --overlap-param-gather)",
                         field="parallel.overlap_param_gather")
    if p.grad_reduce_fp32 is not None and p.dp_mode == "fsdp":
        raise OvsimError("grad_reduce_fp32 sets DDP's gradients; FSDP's reduce at the wire's width (its reduce "
                         "dtype is not modelled)", field="parallel.grad_reduce_fp32")
    if spec.optimizer_mode == "megatron" and p.dp_mode == "fsdp":
        raise OvsimError("Megatron-LM's optimizer runs with its own DDP (dp_mode: ddp); FSDP steps with "
                         "fused_adam", field="optimizer")
    if p.dp_mode == "fsdp" and not p.overlap_grad_reduce:
        raise OvsimError("overlap_grad_reduce is DDP's; FSDP reduce-scatters its gradients beside the backward",
                         field="parallel.overlap_grad_reduce")
    if p.dp_mode == "fsdp" and p.pp > 1:
        raise OvsimError("FSDP with pipeline parallelism is not modelled; use dp_mode: ddp with pp > 1",
                         field="parallel.dp_mode")
    if p.sequence_parallel and p.tp == 1:
        raise OvsimError("sequence_parallel needs tp > 1", field="parallel.sequence_parallel")
    _check_autocast(spec)
    if p.tp_overlap != "none" and p.tp == 1:
        raise OvsimError(f"tp_overlap: {p.tp_overlap} needs tp > 1", field="parallel.tp_overlap")
    if p.tp_overlap != "none" and not p.tp_dgrad_overlap:
        raise OvsimError(f"tp_overlap: {p.tp_overlap} overlaps the data gradient's reduction in pieces; "
                         "tp_dgrad_overlap: false runs it whole after the weight gradient",
                         field="parallel.tp_dgrad_overlap")
    tokens = rank_tokens(spec, m)
    chunks = p.tp_chunks or p.tp
    if chunks > tokens:
        raise OvsimError(f"{chunks} chunks for {tokens} tokens", field="parallel.tp_chunks")
    if p.sequence_parallel and tokens % p.tp:
        raise OvsimError(f"sequence parallelism splits {tokens} tokens over tp {p.tp} unevenly",
                         field="parallel.sequence_parallel")
    if p.dp_mode == "ddp" and dp * p.cp > 1:
        grad = grad_bytes_per_rank(spec, m, p.tp, p.pp)
        if p.bucket_bytes > grad:
            raise OvsimError(f"bucket of {p.bucket_bytes / MIB:.1f} MiB is larger than the {grad / MIB:.1f} MiB "
                             "of gradients a rank holds", field="parallel.bucket_bytes")
    return Layout(dp=dp * p.cp, tp=p.tp, pp=p.pp, v=v, cp=p.cp, stages_outer=p.rank_order == "tp-cp-dp-pp")


def _check_context_parallel(spec: TrainingSpec, m: ModelShape) -> None:
    """Refuse context parallelism where it is not modelled or cannot split the sequence."""
    p = spec.parallel
    if p.cp == 1:
        return
    if m.seq_len % (2 * p.cp):
        raise OvsimError(f"context parallelism splits each sequence into 2 x cp = {2 * p.cp} chunks; "
                         f"seq_len {m.seq_len} does not divide into them", field="parallel.cp")
    refused = [(spec.attention == "unfused", "attention", "unfused attention (it gathers keys for a fused kernel)"),
               (p.dp_mode == "fsdp", "parallel.dp_mode", "FSDP (use dp_mode: ddp)"),
               (spec.autocast, "precision", "PyTorch autocast (use bf16 or fp16)")]
    for bad, field, what in refused:
        if bad:
            raise OvsimError(f"context parallelism (cp {p.cp}) is modelled with a fused attention kernel, "
                             f"Megatron-LM's DDP and 16-bit weights, not with {what}", field=field)
    if p.cp_comm == "a2a" and not heads_split_over(m, p.tp, p.cp):
        heads, kv = rank_heads(m, p.tp)
        raise OvsimError(f"cp_comm a2a splits each tensor-parallel rank's heads over cp {p.cp}: {heads} query and "
                         f"{kv} key/value heads do not divide", field="parallel.cp_comm")


def _check_autocast(spec: TrainingSpec) -> None:
    """Refuse what autocast is not modelled with: it is PyTorch's recipe for a model replicated by
    DDP (or on one GPU); the tensor- and pipeline-parallel frameworks and FSDP's mixed precision
    hold 16-bit parameters (precision bf16 or fp16)."""
    if spec.loss == "pytorch" and not spec.autocast:
        raise OvsimError("loss: pytorch is PyTorch's cross entropy under autocast (precision amp_bf16 or amp_fp16); "
                         "without it use fused or megatron", field="loss")
    if not spec.autocast:
        return
    p = spec.parallel
    refused = [(p.tp > 1, "parallel.tp", "tensor parallelism"), (p.pp > 1, "parallel.pp", "pipeline parallelism"),
               (p.dp_mode == "fsdp", "parallel.dp_mode", "FSDP"),
               (spec.optimizer_mode == "megatron", "optimizer", "Megatron-LM's optimizer"),
               (p.distributed_optimizer, "parallel.distributed_optimizer", "Megatron-LM's distributed optimizer"),
               (spec.attention == "unfused", "attention", "unfused attention")]
    for bad, field, what in refused:
        if bad:
            raise OvsimError(f"{spec.precision} (PyTorch autocast) is modelled with DDP on whole replicas only, not "
                             f"with {what}; use bf16 or fp16 there", field=field)
