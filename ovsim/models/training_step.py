"""A training iteration's end, and the distributed optimizer's parameter gathers: the last
gradient buckets, the optimizer step's passes and the gathers of the updated parameters, after the
step or (``overlap_param_gather``) from the next iteration's start, beside its forward pass."""

from __future__ import annotations

from ovsim.models.op_specs import CollectiveOpSpec, generated
from ovsim.models.training_emit import LayerEmitter, optimizer_passes
from ovsim.models.training_layout import Layout
from ovsim.models.training_spec import (
    TrainingSpec,
    holds_head,
    input_embedding_params,
    layer_params,
    params_per_rank,
    wire_element_bytes,
)


def step_ops(g: LayerEmitter, spec: TrainingSpec, lay: Layout, *, fsdp: bool, distributed: bool,
             gathered_early: bool) -> None:
    """Each stage's last bucket, then (after its buckets and reduce-scatters) the optimizer's passes:
    over ``1/dp`` of the optimizer state where FSDP or the ``distributed`` optimizer shards it;
    with the distributed optimizer, unless its parameters were ``gathered_early``, the gathers of
    the updated parameters, after the step and exposed."""
    sharded = fsdp or distributed
    for s, st in enumerate(g.stages):
        g.flush_bucket(st, s)
    tied_embedding_sum(g, spec, lay)
    for s, st in enumerate(g.stages):
        st.pending += st.buckets + st.rs
        passes = optimizer_passes(spec, g.grad_b)
        if not passes:
            continue
        held = params_per_rank(spec, g.m, lay.tp, lay.pp, s)
        shard = held / (lay.dp if sharded else 1)
        zero = [ps for ps in passes if ps[0] == "zero_grad"]
        for name, shard_b, held_b in passes:
            if name != "zero_grad":
                g.mem(st, f"s{s}.{name}", shard * shard_b + held * held_b, "elementwise")
        if distributed and not gathered_early:
            # Each rank's updated shard is gathered back, a bucket at a time, at the parameters'
            # width (Megatron-LM gathers them into a view of the gradient buffer in the parameters'
            # type). The next iteration zeroes its gradients after them.
            for i, size in enumerate(st.bucket_sizes):
                gathered = g.collective(st, f"s{s}.param_gather{i}", "all_gather",
                                        size * wire_element_bytes(spec.precision) / g.grad_b, "dp", lay.dp_groups(s))
                st.pending += gathered if zero else []
        for name, shard_b, held_b in zero:
            g.mem(st, f"s{s}.{name}", shard * shard_b + held * held_b, "elementwise")


def tied_embedding_sum(g: LayerEmitter, spec: TrainingSpec, lay: Layout) -> None:
    """A tied embedding's two copies, the first stage's input embedding and the last stage's head,
    learn from the sum of their gradients: Megatron-LM all-reduces the word embedding's gradient
    over each pair of first and last pipeline ranks (its embedding group) once the data-parallel
    reduction is done, before the step (``_allreduce_embedding_grads``), at the width the
    gradients were reduced at. On stream ``dp``, after the stage's buckets; each step waits for it."""
    p = lay.pp
    if p < 2 or not (spec.embedding_and_head and g.m.tied_embeddings and g.comm):
        return
    first, last = g.stages[0], g.stages[p - 1]
    size = float(g.m.vocab * g.m.hidden // lay.tp * g.grad_b)
    deps = [x for x in (first.last, last.last) if x]
    for d in range(lay.replicas_made):
        for i in range(lay.tp_made):
            name = f"embedding_grad_sum.d{d}t{i}"
            g.ops.append(generated(CollectiveOpSpec(name=name, kind="all_reduce", size_bytes=size, stream="dp",
                                                    ranks=[lay.rank(d, 0, i), lay.rank(d, p - 1, i)],
                                                    after_any=deps)))
            first.buckets.append(name)
            last.buckets.append(name)


def overlapped_gathers(g: LayerEmitter, spec: TrainingSpec, lay: Layout, chunk_starts: list[int],
                       chunk_sizes: list[int]) -> dict[tuple[int, str], list[str]]:
    """The parameter gathers of ``overlap_param_gather``, made at the iteration's start (the
    previous step's parameters, in Megatron-LM dispatched after it): by (stage, unit), each unit's
    (``embed``, ``L{layer}``, ``head``), in each stage's forward order over its chunks, on stream
    ``dp`` at the parameters' width. A stage gathers what it holds (``stage_embedding_params``:
    the embedding and learned positions on the first stage, the head or a tied head's copy on
    the last). Megatron-LM gathers a bucket at a time, each before the first forward that uses it;
    here a layer is the unit."""
    m, p, t = g.m, lay.pp, lay.tp
    out: dict[tuple[int, str], list[str]] = {}
    for s in range(p):
        units: list[tuple[str, int]] = []
        for c in range(lay.v):
            vs = c * p + s
            if vs == 0 and spec.embedding_and_head:
                units.append(("embed", input_embedding_params(m, t)))
            first = chunk_starts[vs]
            units += [(f"L{layer}", layer_params(m, t)) for layer in range(first, first + chunk_sizes[vs])]
            if vs == p * lay.v - 1 and spec.embedding_and_head and holds_head(m, p):
                units.append(("head", m.vocab * m.hidden // t))
        out.update({(s, unit): names for unit, names in g.start_param_gathers(s, units).items()})
    return out
