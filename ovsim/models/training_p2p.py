"""Blocking pipeline transfers: Megatron-LM's batched send/recv, which both ends wait for.

Megatron-LM exchanges a pipeline's activations and gradients with ``batch_isend_irecv``, waits
for the requests, and then (``batch_p2p_sync``, true by default) synchronizes the device
(``megatron/core/pipeline_parallel/p2p_communication.py``; in 2021, ``megatron/p2p_communication.py``
did the same). So a transfer starts once its sender's work is done and its receiver has reached
the exchange that posts it, and neither rank launches anything more until the transfer and all
the work it issued before it are done. Only the interleaved schedule can overlap its transfers
with compute instead (``--overlap-p2p-communication``, NVIDIA/Megatron-LM pull request 331,
May 2023; the non-interleaved schedule refuses it), which is ``parallel.overlap_p2p_comm``.

Under ``schedule: sequential`` every op of a rank is on one stream, and the transfers always
block. Under ``overlapped`` they block where ``overlap_p2p_comm`` is false: the device
synchronization then holds each of the rank's streams at the exchange.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from ovsim.models.ir import Op, StreamSpec, Workload, id_index, new_op
from ovsim.models.op_specs import SendRecvOp, base_spec, spec_of
from ovsim.models.workload_copies import op_id

if TYPE_CHECKING:
    from ovsim.models.training import TrainingOps


class _Program:
    """Around each exchange's anchor op (the last op a rank runs before it), in the order the rank
    issues its ops, its pipeline transfers left out: per stream of the rank, the first op it runs
    after the anchor, and the last it ran up to it (the anchor included). Found in one pass over
    the ops, each anchor's first ops filled in as the rank's streams reach them. A stream that
    runs nothing over several exchanges (the data-parallel one through a pipeline's micro-batches)
    has its next op given to the latest of them only: it would otherwise wait for every exchange
    since its last op, thousands at scale, all but the latest already behind it."""

    def __init__(self, wl: Workload, transfers: Mapping[str, object], anchors: set[str]) -> None:
        # Per anchor: {stream: [first op after it, last op up to it]}.
        self.at: dict[str, dict[str, list[str | None]]] = {}
        last: dict[int, dict[str, str]] = {}  # per rank: each stream's last op so far
        placed: dict[int, list[str]] = {}  # per rank: its anchors so far, in order
        given: dict[tuple[int, str], int] = {}  # per rank and stream: how many of them have its first op
        for op in wl.ops:
            if op.name in transfers:
                continue
            rank, stream = op.rank, op.stream
            mine = placed.get(rank)
            if mine is not None:
                key = (rank, stream)
                if given.get(key, 0) < len(mine):
                    # The latest anchor only: each earlier one is on the compute stream before it,
                    # whose first op after that exchange already waited for it.
                    self.at[mine[-1]].setdefault(stream, [None, None])[0] = op.id
                    given[key] = len(mine)
            streams = last.get(rank)
            if streams is None:
                streams = last[rank] = {}
            streams[stream] = op.id
            if op.id in anchors:
                self.at[op.id] = {st: [None, i] for st, i in streams.items()}
                placed.setdefault(rank, []).append(op.id)

    def around(self, anchor: str) -> list[tuple[str | None, str | None]]:
        """Per stream of ``anchor``'s rank: the op it runs first after ``anchor``, and the last it
        ran up to it; None where there is none. A device synchronization there holds each first op
        for the other streams' last."""
        return [(first, last) for first, last in self.at[anchor].values()]


def blocking_sends(wl: Workload, gen: TrainingOps, priorities: dict[str, int], source: str, *,
                   interleaved: bool, sequential: bool) -> Workload:
    """``wl`` with its pipeline transfers blocking, as Megatron-LM runs them without
    ``overlap_p2p_comm`` (the module's docstring). Listing the transfers in the rank's op order
    instead would order each rank's sends and receives by the list, not by the rank's own
    schedule, and make a stage wait for a peer whose transfer is listed behind work it does not
    need.

    GPipe and 1F1B (Megatron's non-interleaved schedule) exchange after every item: a receive is
    posted when the receiver's previous item is done, and a send is batched with a receive only
    from the same peer (``send_forward_recv_backward``, ``send_backward_recv_forward``); the
    warm-up and cool-down receive from one neighbour after sending to the other, so a rank's
    transfer with one peer waits for those it issued before with the other. The interleaved
    schedule exchanges with both neighbours at once after each of its steps
    (:func:`ovsim.models.pipeline.exchange_steps`;
    ``send_forward_backward_recv_forward_backward``): a transfer starts once the sender's step and
    the step before the receiver's are done, and each rank's next step waits for its whole
    exchange. (As blocking transfers one item at a time, its ring of stages could each wait on a
    send the next cannot receive yet.)

    ``sequential``: the ranks' ops are on one stream, and each transfer goes on a stream of its
    own per pair of ranks and direction (priority: the generator's stream's in ``priorities``);
    otherwise the transfers keep their streams."""
    # A pipeline's transfers stay within a data-parallel replica: those of replicas the simulated
    # one stands for (rank symmetry) have no ops.
    made = set(wl.ranks_in_job)
    specs: dict[str, SendRecvOp] = {}
    for o in gen.specs:
        held = base_spec(o)
        if isinstance(held, SendRecvOp) and held.src in made:
            specs[o.name] = cast(SendRecvOp, spec_of(o))
    after = _anchors(gen, specs)
    program = _Program(wl, gen.p2p_items, {op_id(at, rank) for name, ends in after.items()
                                            for rank, at in zip((specs[name].src, specs[name].dst), ends, strict=True)
                                            if at is not None})
    extra = _waits(after, specs, program, interleaved)
    ops = []
    for op in wl.ops:
        if op.name in gen.p2p_items:
            rank = wl.job_rank(op.rank)
            o = specs[op.name]
            at = after[op.name][0 if rank == o.src else 1]
            op = _with(op, (op_id(at, rank),) if at is not None else (),
                       f"p2p{o.src}>{o.dst}" if sequential else op.stream)
        waits = extra.get(op.id)
        if waits is not None:
            op = _with(op, op.deps + tuple(d for d in waits if d not in op.deps), op.stream)
        ops.append(op)
    out = replace(wl, ops=tuple(_in_wait_order(ops)), streams=_streams(wl, ops, specs, priorities), structure=None)
    out.validate(source)
    return out


def _with(op: Op, deps: tuple[str, ...], stream: str) -> Op:
    """``op`` with other dependencies and stream (``new_op``: a third of ``dataclasses.replace``'s
    time, for the hundreds of thousands of ops an exchange holds at scale)."""
    return new_op(op.id, op.name, op.kind, op.rank, stream, deps, op.delay_s, op.kernel, op.flow, op.partition,
                  op.info)


def _in_wait_order(ops: list[Op]) -> list[Op]:
    """``ops`` reordered so that each comes after what it waits for (its stream's previous op and
    its dependencies), and a collective's members after what any of them waits for, otherwise in
    their order: what an op waits for and is listed later (an exchange's transfer, listed with its
    receiver's item) moves up to just before it, with what that waits for in turn. Validation and
    the analytic plan then take the list's order for a topological one, where they would each
    sort the ops (on Megatron-LM's 1T row, 3.3 million ops: 1.2 GiB of successor lists at the
    peak). Ops in a cycle are left after what they wait for, for validation to name."""
    n = len(ops)
    # An unknown dependency is passed over here, for validation to name.
    at = id_index(ops).get
    members: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        if op.flow is not None:
            members.setdefault(op.flow.group, []).append(i)
    previous = [-1] * n  # each op's stream predecessor
    last: dict[tuple[int, str], int] = {}
    for i, op in enumerate(ops):
        key = (op.rank, op.stream)
        previous[i] = last.get(key, -1)
        last[key] = i
    state = bytearray(n)  # 0: not reached; 1: waiting to be listed; 2: listed
    out: list[int] = []

    def unit_of(i: int) -> list[int]:
        flow = ops[i].flow
        return members[flow.group] if flow is not None else [i]

    def waits_of(unit: list[int]) -> Iterator[int]:
        inside = set(unit)
        return iter([q for m in unit for q in (previous[m], *(at(d, -1) for d in ops[m].deps))
                     if q >= 0 and q not in inside])

    for i, op in enumerate(ops):
        if state[i] == 2:
            continue
        p = previous[i]
        unit = members[op.flow.group] if op.flow is not None else None
        if (unit is None or len(unit) == 1) and (p < 0 or state[p] == 2) and all(
                state[at(d, i)] == 2 for d in op.deps):
            state[i] = 2  # most ops: listed where they were
            out.append(i)
            continue
        # Depth first: what the unit waits for and is not listed yet, then the unit.
        root = unit or [i]
        for m in root:
            state[m] = 1
        stack = [(root, waits_of(root))]
        while stack:
            current, waits = stack[-1]
            for q in waits:
                if state[q] == 0:
                    nxt = unit_of(q)
                    for m in nxt:
                        state[m] = 1
                    stack.append((nxt, waits_of(nxt)))
                    break
                # 1: on the stack, a cycle (left for validation); 2: listed
            else:
                stack.pop()
                for m in current:
                    state[m] = 2
                    out.append(m)
    return [ops[i] for i in out]


def _anchors(gen: TrainingOps, specs: dict[str, SendRecvOp]) -> dict[str, tuple[str | None, str | None]]:
    """Per transfer, the op each end waits for before it (None: nothing): the sender's step's
    last, and the last of the step before the receiver's."""
    ends = [{step: lasts[k] for k, step in enumerate(steps)} for steps, lasts in zip(gen.stage_steps,
                                                                                     gen.stage_lasts, strict=True)]

    def step_last(stage: int, step: int) -> str | None:
        return ends[stage][step] if step >= 0 else None

    return {name: (step_last(ss, gen.stage_steps[ss][si]), step_last(ds, gen.stage_steps[ds][di] - 1))
            for name, (ss, si, ds, di) in gen.p2p_items.items() if name in specs}


def _waits(after: dict[str, tuple[str | None, str | None]], specs: dict[str, SendRecvOp], program: _Program,
           interleaved: bool) -> dict[str, dict[str, None]]:
    """What each op waits for beyond its own dependencies (an ordered set): the first op each
    stream of a rank runs after an exchange waits for the exchange's transfers on that rank and
    for the last op each stream ran before it."""
    extra: dict[str, dict[str, None]] = {}
    sent: dict[tuple[str, int], list[SendRecvOp]] = {}
    for name, (at_src, at_dst) in after.items():
        o = specs[name]
        for rank, at in ((o.src, at_src), (o.dst, at_dst)):
            if at is None:
                continue
            streams = program.around(op_id(at, rank))
            for k, (nxt, _) in enumerate(streams):
                if nxt is None:
                    continue
                waits = extra.setdefault(nxt, {})
                waits[op_id(name, rank)] = None
                # Its own stream's last runs before it anyway.
                waits.update(dict.fromkeys(last for j, (_, last) in enumerate(streams) if j != k and last))
        if at_src is not None:
            sent.setdefault((at_src, o.src), []).append(o)
    if not interleaved:
        for name, (_, at_dst) in after.items():
            o = specs[name]
            if at_dst is not None:
                extra.setdefault(op_id(name, o.dst), {}).update(
                    dict.fromkeys(op_id(x.name, o.dst) for x in sent.get((at_dst, o.dst), []) if x.dst != o.src))
    return extra


def _streams(wl: Workload, ops: list[Op], specs: dict[str, SendRecvOp], priorities: dict[str, int]
             ) -> tuple[StreamSpec, ...]:
    """The workload's streams, with those its transfers were moved to."""
    specs_stream = {f"p2p{o.src}>{o.dst}": o.stream for o in specs.values()}
    streams = {(st.rank, st.name): st for st in wl.streams}
    for op in ops:
        if (op.rank, op.stream) not in streams:
            streams[(op.rank, op.stream)] = StreamSpec(rank=op.rank, name=op.stream,
                                                       priority=priorities.get(specs_stream.get(op.stream, ""), 0))
    return tuple(streams[k] for k in sorted(streams))
