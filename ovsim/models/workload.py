"""How a schedule turns op specs (:mod:`ovsim.models.op_specs`) into the per-rank
:class:`~ovsim.models.ir.Workload` the engine runs: ops expanded over ranks and repeats, each
priced once, communication planned over its whole group. Schedule knobs are applied here, once,
so that both fidelities see the same workload.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from operator import attrgetter, itemgetter
from typing import Literal, cast

from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.limits import MAX_OP_S, MAX_OPS
from ovsim.models import nccl
from ovsim.models.build_memo import (
    Table,
    reusing_builds_now,
    shared_demands,
    shared_expansions,
    shared_parts,
    shared_plans,
)
from ovsim.models.ir import FlowDemand, KernelDemand, Op, Partition, StreamSpec, Workload, new_op
from ovsim.models.op_prices import Parts, collective_parts, copy_flow, kernel_demand

# The specs and knobs live in op_specs; importers that name them here keep working.
from ovsim.models.op_specs import (
    COMPUTE_KINDS,
    FRAMEWORK_STREAMS,
    GEMM_BLOCK_FIELDS,
    GEMM_TILE_FIELDS,
    AttentionOp,
    CollectiveKind,
    CollectiveOpSpec,
    CopyOp,
    DelayOp,
    GemmOp,
    KernelOp,
    Knobs,
    MemoryOp,
    OpSpec,
    Schedule,
    SendRecvOp,
    SpecCopy,
    _OpBase,
    spec_of,
)
from ovsim.models.workload_copies import OpCopier
from ovsim.models.workload_copies import copy_sources as _copy_sources
from ovsim.models.workload_copies import op_id as _op_id
from ovsim.models.workload_copies import placement as _placement

__all__ = ["COMPUTE_KINDS", "GEMM_BLOCK_FIELDS", "GEMM_TILE_FIELDS", "AttentionOp", "CollectiveKind",
           "CollectiveOpSpec", "CopyOp", "DelayOp", "GemmOp", "KernelOp", "Knobs", "MemoryOp", "OpSpec", "Schedule",
           "SendRecvOp", "build_workload"]


_NAME = attrgetter("name")  # a spec's or a SpecCopy's
# Ranks lists as sets, by the list's identity (the list kept beside its set, so that the identity
# stays its own while the build runs): a training iteration names the same lists over and over.
_RankSets = dict[int, tuple[object, frozenset[int]]]
# A spec's ranks list (kept, so that its identity stays its own while the build runs), the ranks
# it names, and those of them simulated (all of them without rank symmetry).
_Placed = tuple[object, Sequence[int], Sequence[int]]


def _ranks(spec: _OpBase, n_ranks: int, sim: dict[int, int] | None,
           checked: dict[int, _Placed]) -> tuple[Sequence[int], Sequence[int]]:
    """The ranks ``spec`` runs on, checked, and those of them simulated (ascending where the spec
    runs on all). ``checked`` keeps each ranks list's: a training iteration names the same lists
    in 100,000s of specs. Specs with the same list get the same sequences, which are not to be
    changed."""
    known = checked.get(id(spec.ranks))
    if known is not None:
        return known[1], known[2]
    if spec.ranks == "all":
        ranks: Sequence[int] = range(n_ranks)
    else:
        bad = [r for r in spec.ranks if r >= n_ranks]
        if bad:
            raise OvsimError(f"op '{spec.name}' names rank {bad[0]}, the system has {n_ranks}", field="ranks")
        if len(set(spec.ranks)) != len(spec.ranks):
            raise OvsimError(f"op '{spec.name}' lists a rank twice", field="ranks")
        ranks = list(spec.ranks)
    # Every rank's op on a few simulated ranks of thousands: the simulated ones.
    simulated = ranks if sim is None else list(sim) if isinstance(ranks, range) else [r for r in ranks if r in sim]
    checked[id(spec.ranks)] = (spec.ranks, ranks, simulated)
    return ranks, simulated


def _count_ops(distinct: Mapping[int, _OpBase], times: Counter[int], n_ranks: int, sim: dict[int, int] | None) -> int:
    """The ops specs expand to on the simulated ranks (``sim``'s job ranks; None: all
    ``n_ranks``): each of ``distinct`` (by its id) as often as ``times`` counts it."""
    total = 0
    # A training iteration names the same ranks lists over and over (by identity): counted once each.
    counted: dict[int, int] = {}
    for key, spec in distinct.items():
        if isinstance(spec, SendRecvOp):
            on = sum(1 for r in (spec.src, spec.dst) if r < n_ranks and (sim is None or r in sim))
        elif spec.ranks == "all":
            on = n_ranks if sim is None else len(sim)
        else:
            on = counted.get(id(spec.ranks), -1)
            if on < 0:
                on = counted[id(spec.ranks)] = sum(1 for r in spec.ranks if r < n_ranks and (sim is None or r in sim))
        total += on * spec.repeat * times[key]
    return total


def _check_size(total: int, max_ops: int, source: str) -> None:
    """Refuse a scenario that expands to more than ``max_ops`` ops (``total``)."""
    if total > max_ops:
        raise OvsimError(f"the scenario expands to {total:,} ops (ranks x repeat), over the limit of {max_ops:,}; "
                         f"to run it anyway, pass --max-ops {total} (Python: max_ops={total})",
                         source=source, field="ops")


def _is_comm(spec: _OpBase) -> bool:
    return spec.kind not in COMPUTE_KINDS and spec.kind != "delay"  # type: ignore[attr-defined]


def build_workload(
    specs: Sequence[OpSpec | SpecCopy],
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
    simulated: Sequence[int] | None = None,
    stand_offsets: Sequence[int] = (),
    copies: Sequence[tuple[int, int, int]] = (),
    validate: bool = True,
) -> Workload:
    """Expand op specs over ranks and repeats, price them, and apply the schedule and knobs.

    ``streams`` maps stream names to CUDA priorities (lower is higher). Under ``sequential`` every
    op of a rank runs on one stream in the order listed. ``simulated``: ops only for these ranks
    (ascending), numbered 0.. in the workload, each standing for itself plus each of
    ``stand_offsets`` (rank symmetry, docs/design.md); collectives are still planned over their
    whole groups. ``copies``: blocks of specs that copy an earlier block but for their names and
    dependencies, each (first spec's index, its source's, spec count): a copied spec's ops are
    made from its source's where the two agree in every other field and in where what they
    follow runs (:class:`OpCopier`), else as any spec's. A copied spec may come as a
    :class:`SpecCopy` (a training iteration's do), made only where its ops are not copied.
    ``validate``: False where the caller validates what it makes of the workload (a training
    iteration whose pipeline transfers block adds dependencies, then validates).
    """
    if simulated is not None and (list(simulated) != sorted(set(simulated)) or not all(0 <= r < n_ranks
                                                                                       for r in simulated)):
        raise OvsimError(f"simulated ranks must be distinct, ascending and below {n_ranks}", source=source,
                         field="ranks")
    sim = {r: j for j, r in enumerate(simulated)} if simulated is not None else None
    if sim is not None and len(sim) * max(1, len(stand_offsets)) != n_ranks:
        raise OvsimError(f"{len(sim)} simulated ranks standing for {len(stand_offsets)} each are not the {n_ranks}",
                         source=source, field="ranks")
    knobs = knobs or Knobs()
    if knobs.sm_carveout >= gpu.sm.count:
        raise OvsimError(f"carve-out of {knobs.sm_carveout} SMs on a {gpu.sm.count}-SM GPU", source=source,
                         field="knobs.sm_carveout")
    # The memos compare specs by identity and by their fields (build_memo): copies made there (a
    # training iteration's builds hand them made already, once for the iteration).
    if reusing_builds_now() and any(type(s) is SpecCopy for s in specs):
        specs = [cast(OpSpec, spec_of(s)) for s in specs]
    # What each spec holds but its name and dependencies: a copy's source, whose fields it has.
    held = cast(list[OpSpec], [s.source if type(s) is SpecCopy else s for s in specs])
    by_name = dict(zip(map(_NAME, specs), held, strict=True))
    # Each spec held, once (a training iteration's 188,000 specs hold a few thousand), and how often.
    distinct = dict(zip(map(id, held), held, strict=True))
    if len(by_name) < len(specs):  # a name given twice: counted only then
        dup = sorted(n for n, count in Counter(s.name for s in specs).items() if count > 1)
        raise OvsimError(f"op name '{dup[0]}' is used twice", source=source, field="ops")
    # A training iteration repeats each layer's kernels: price each distinct kernel once.
    # Within reusing_builds() (a schedule search), those of the builds before it too.
    demands = shared_demands(gpu, params, knobs)
    plans = shared_plans(gpu, system)
    # A collective's members' parts by what they depend on (spec and members), their flow's group
    # unnamed; within reusing_builds(), those of the builds before it with the same knobs too.
    parts_made = shared_parts(gpu, system, params, knobs, None if simulated is None else tuple(simulated))
    # Within reusing_builds(), the ops the build before made of the same specs: a table for each
    # class of spec under the values of the knobs its ops read (_knob_classes). Taken after the
    # memos above, which empty the expansions too when they pass their size (the ops carried then
    # hold the very demands and parts the ops made here do).
    expansions = shared_expansions(tuple(specs), (gpu, system, params, n_ranks, schedule == "sequential",
                                                  None if simulated is None else tuple(simulated)), _knob_classes,
                                   _carried)
    structure = expansions.structure if expansions is not None else None
    n_ops = (structure.n_ops if structure is not None and structure.n_ops >= 0
             else _count_ops(distinct, Counter(map(id, held)), n_ranks, sim))
    _check_size(n_ops, MAX_OPS if max_ops is None else max_ops, source)
    if structure is not None:
        structure.n_ops = n_ops
    # A priority for a stream no op runs on, beside ops on a stream given none, is a typo: it would
    # silently leave the ops' stream at priority 0. (A declared stream may go unused: one streams
    # section serves several variants of a scenario.)
    used = sorted({s.stream for s in distinct.values()})
    unused = sorted(set(streams or {}) - set(used))
    undeclared = sorted(set(used) - set(streams or {}) - FRAMEWORK_STREAMS)
    if unused and undeclared and schedule != "sequential":
        raise OvsimError(f"stream '{unused[0]}' has a priority but no op runs on it, while ops run on "
                         f"'{undeclared[0]}', which has none", source=source, field=f"streams.{unused[0]}")
    priorities: dict[str, int] = dict(streams or {})
    if knobs.comm_priority == "high":
        top = min(priorities.values(), default=0)
        for st in {s.stream for s in distinct.values() if _is_comm(s)}:
            priorities[st] = min(priorities.get(st, 0), top - 1)
    ops: list[Op] = []
    rank_sets: _RankSets = {}
    checked: dict[int, _Placed] = {}
    ctx = _Context(by_name=by_name, gpu=gpu, system=system, params=params, knobs=knobs, n_ranks=n_ranks,
                   sequential=schedule == "sequential", demands=demands, sim=sim, rank_sets=rank_sets,
                   plans=plans, parts_made=parts_made, infos={},
                   at=sim.__getitem__ if sim is not None else int, carved=knobs.sm_carveout != 0)
    tables: list[Table | None] = []
    classes: list[int] = []
    if expansions is not None:
        tables = [expansions.table(cls, read) for cls, read in enumerate(_knobs_read(knobs))]
        classes = expansions.classes
    added = 0
    source_of, kept = _copy_sources(copies, len(specs))
    copier = OpCopier(by_name, specs, source_of, kept, copies)
    i, n = 0, len(specs)
    while i < n:
        table = tables[classes[i]] if tables else None
        made = table[i] if table is not None else None
        if made is None and source_of and source_of[i] >= 0:
            # Copies made from their sources' ops, as many in a row as are exact (one within a
            # table, which keeps each spec's ops).
            start = len(ops)
            stop = copier.copy_from(i, n if table is None else i + 1, ops)
            if stop > i:
                if table is not None:
                    table[i] = ops[start:]
                    added += len(ops) - start
                i = stop
                continue
        fresh = made is None
        if made is None:
            made = _expanded(cast(OpSpec, spec_of(specs[i])), n_ranks, sim, checked, ctx, source)
        ops.extend(made)
        if i in kept:
            kept[i] = made
        if fresh and table is not None:
            table[i] = made
            added += len(made)
        i += 1
    if expansions is not None:
        expansions.ops += added
    # Another build of the list validated ops with the same ids, dependencies, ranks, streams and
    # collectives' members: no knob a table is kept under changes them.
    known = structure.stream_pairs if structure is not None else None
    pairs = known if known is not None else sorted({(op.rank, op.stream) for op in ops})
    stream_specs = tuple(StreamSpec(rank=r, name=s, priority=priorities.get(s, 0)) for r, s in pairs)
    wl = Workload(ops=tuple(ops), streams=stream_specs, n_ranks=len(sim) if sim is not None else n_ranks,
                  job_ranks=tuple(sim) if sim is not None and list(sim) != list(range(len(sim))) else (),
                  stand_offsets=tuple(stand_offsets) if sim is not None else (),
                  structure=structure)
    if known is None and validate:
        wl.validate(source)
        if structure is not None:
            structure.stream_pairs = pairs
    return wl


def _expanded(spec: OpSpec, n_ranks: int, sim: dict[int, int] | None, checked: dict[int, _Placed], ctx: _Context,
              source: str) -> list[Op]:
    """The ops of ``spec`` (:func:`_expand`), its dependencies checked first; errors under the
    spec's field of ``source``."""
    for field_name, deps in (("after", spec.after), ("after_any", spec.after_any)):
        for dep in deps:
            if dep not in ctx.by_name:
                raise OvsimError(f"op '{spec.name}' follows unknown op '{dep}'", source=source, field=field_name)
    try:
        ranks, simulated_ranks = _ranks(spec, n_ranks, sim, checked)
        return _expand(spec, ranks, simulated_ranks, ctx)
    except OvsimError as e:
        raise OvsimError(e.message, source=source, field=f"ops.{spec.name}.{e.field}".rstrip(".")) from None


def _carried(old_specs: Sequence[object], new_specs: Sequence[object],
             old_at: dict[str, int] | None = None) -> tuple[list[int], dict[str, int]]:
    """For each spec of ``new_specs``, the place in ``old_specs`` of one :func:`_expand` makes the
    same ops of (-1: none): equal in value, and each op it follows alike in what an expansion
    reads of that op (its class, repeats and ranks); and each new spec's place by its name
    (``old_at``: the same of ``old_specs``, where known: a dict of 190,000 names takes 0.1 s). A
    training iteration made again with another bucket size or chunk count keeps most of its
    specs; a scenario's candidates all of theirs."""
    old, new = cast(Sequence[_OpBase], old_specs), cast(Sequence[_OpBase], new_specs)
    at = old_at if old_at is not None else {s.name: j for j, s in enumerate(old)}
    new_at: dict[str, int] = {}
    equal: list[int] = []  # each spec's place in ``old`` where equal in value there, else -1
    for i, s in enumerate(new):
        new_at[s.name] = i
        j = at.get(s.name, -1)
        if j >= 0:
            o = old[j]
            if o is not s and (type(o) is not type(s) or o.__dict__ != s.__dict__):
                j = -1
        equal.append(j)
    alike: dict[str, bool] = {}  # by name, whether an op others follow is placed as before

    def placed_alike(name: str) -> bool:
        known = alike.get(name)
        if known is None:
            i, j = new_at.get(name, -1), at.get(name, -1)
            # A spec equal in value is placed alike, whatever it follows itself.
            known = alike[name] = i >= 0 and j >= 0 and (equal[i] >= 0 or _placement(new[i]) == _placement(old[j]))
        return known

    return [j if j < 0 or not (s.after or s.after_any)
            or all(map(placed_alike, itertools.chain(s.after, s.after_any))) else -1
            for s, j in zip(new, equal, strict=True)], new_at


def _knob_classes(specs: Sequence[object]) -> list[int]:
    """Each spec's class by the knobs :func:`_expand` reads for its ops (build_memo's tables; the
    values :func:`_knobs_read` gives, in the same order): 0, a kernel's; 1, a collective's; 2, none."""
    return [0 if getattr(s, "kind", None) in COMPUTE_KINDS else 1 if isinstance(s, CollectiveOpSpec | SendRecvOp)
            else 2 for s in specs]


def _knobs_read(knobs: Knobs) -> tuple[tuple[object, ...], ...]:
    """The values of the knobs each class of :func:`_knob_classes` reads: a kernel's carve-out and
    occupancy padding (its demand and partition), a collective's channel count and copy-engine
    offload (its plan and engine), none."""
    return (knobs.sm_carveout, knobs.occupancy_shaping_smem_bytes), (knobs.nccl_channels, knobs.ce_offload), ()


@dataclasses.dataclass(slots=True)
class _Context:
    """What every spec's expansion in one build reads: the build's inputs and memos, each spec by
    name, the simulated ranks' numbers (``sim``; ``at`` maps a job rank to its number) and whether
    a carve-out splits the SMs (``carved``). One object, not 15 arguments a spec: a training
    iteration expands 100,000s."""

    by_name: dict[str, OpSpec]
    gpu: GpuSpec
    system: SystemSpec
    params: Parameters
    knobs: Knobs
    n_ranks: int
    sequential: bool
    demands: dict[tuple[object, ...], KernelDemand]
    sim: dict[int, int] | None
    rank_sets: _RankSets
    plans: dict[tuple[object, ...], nccl.CollectivePlan]
    parts_made: dict[tuple[object, ...], Parts]
    infos: dict[tuple[object, ...], dict[str, object]]
    at: Callable[[int], int]
    carved: bool


def _expand(spec: OpSpec, members: Sequence[int], ranks: Sequence[int], ctx: _Context) -> list[Op]:
    """The ops of ``spec`` on ``ranks``, those of its ``members`` that ``ctx.sim`` numbers (all of
    them, as they are, without rank symmetry); their ids name the job's ranks."""
    out: list[Op] = []
    by_name, n_ranks, rank_sets, sim, at = ctx.by_name, ctx.n_ranks, ctx.rank_sets, ctx.sim, ctx.at
    # Interned: a workload's digest pickles the ops, and pickle writes a string once per object,
    # so equal streams must be one object whether an op was made here or carried from a build
    # of another list (build_memo.Expansions.carry).
    stream = "main" if ctx.sequential else sys.intern(spec.stream)
    compute = spec.kind in COMPUTE_KINDS
    partition: Partition = "compute" if compute and ctx.carved else "any"
    # Nothing changes an op's info after the build, so its ranks and repeats share one, and ops
    # made from alike specs (a layer's GEMM in every layer and micro-batch) share one too.
    info, key = _shared_info(spec, ctx.infos)
    kernel = None
    if compute:
        kernel = ctx.demands.get(key)
        if kernel is None:
            kernel = kernel_demand(spec, ctx.gpu, ctx.params, ctx.knobs)
            _check_op_time(kernel.isolated_s)  # before it is kept: a later build takes it unchecked
            ctx.demands[key] = kernel
    send_recv = isinstance(spec, SendRecvOp)
    on = [spec.src, spec.dst] if send_recv else members  # type: ignore[union-attr]
    if spec.after_any:
        # ``members`` is one sequence for all specs of a ranks list (_ranks), so its set is made once.
        on_set = frozenset(on) if send_recv else _rank_set(members, rank_sets)
        for d in spec.after_any:
            if not _runs_on_any(by_name[d], on_set, n_ranks, rank_sets):
                raise OvsimError(f"op '{spec.name}' follows '{d}', which runs on none of its ranks",
                                 field="after_any")
    # ``ranks`` holds the simulated members already; a send/recv's are its two ends.
    if sim is not None and not (any(r in sim for r in on) if send_recv else ranks):
        return out  # an op of ranks the simulated ones stand for
    for i in range(spec.repeat):
        suffix = f"#{i}" if spec.repeat > 1 else ""
        deps = _deps_of(spec, i, by_name)
        # Most ops of a training iteration follow others; those that follow none skip the call.
        dep_ids = partial(_dep_ids, spec.name, deps, n_ranks, rank_sets) if deps else _no_deps
        name = spec.name + suffix
        if isinstance(spec, DelayOp):
            _check_op_time(spec.duration_s)
            for r in ranks:
                out.append(Op(id=_op_id(name, r), name=name, kind="delay", rank=at(r), stream=stream,
                              deps=dep_ids(r), delay_s=spec.duration_s))
        elif kernel is not None:
            op_kind = _kind(spec.kind)
            for r in ranks:
                out.append(new_op(_op_id(name, r), name, op_kind, at(r), stream, dep_ids(r), spec.delay_s, kernel,
                                  None, partition, info))
        elif isinstance(spec, CollectiveOpSpec | SendRecvOp):
            if isinstance(spec, SendRecvOp):
                for end in (spec.src, spec.dst):
                    if end >= n_ranks:
                        raise OvsimError(f"rank {end} does not exist", field="src" if end == spec.src else "dst")
                if spec.src == spec.dst:
                    raise OvsimError("send and receive ranks must differ", field="dst")
            made_key = (key, members if isinstance(members, range) else tuple(members))
            made = ctx.parts_made.get(made_key)
            if made is None:
                made = collective_parts(spec, "", members, ctx.gpu, ctx.system, ctx.params, ctx.knobs, ctx.plans)
                for _, flow, _ in made.values():
                    _check_op_time(flow.isolated_s)
                if sim is not None:
                    made = _simulated_parts(made, sim, spec.name)
                ctx.parts_made[made_key] = made
            parts = _named(made, name)
            for r, (kd, flow, kind) in parts.items():
                out.append(new_op(_op_id(name, r), name, kind, at(r), stream, dep_ids(r),  # type: ignore[arg-type]
                                  spec.delay_s, kd, flow, "any", info))
        else:
            assert isinstance(spec, CopyOp)
            for r in ranks:
                group = f"{name}@r{r}"
                flow = copy_flow(spec, group, r, ctx.gpu, ctx.system, n_ranks, ctx.params)
                _check_op_time(flow.isolated_s)
                if sim is not None:
                    flow = _renumbered(flow, sim, spec.name)
                out.append(Op(id=_op_id(name, r), name=name, kind="transfer", rank=at(r), stream=stream,
                              deps=dep_ids(r), delay_s=spec.delay_s, flow=flow, info=info))
    return out


def _check_op_time(seconds: float) -> None:
    """Refuse an op that takes longer alone than ovsim times (``limits.MAX_OP_S``): a mistyped size.
    The caller names the op."""
    if not seconds <= MAX_OP_S:
        raise OvsimError(f"takes {seconds:.3g} s alone, over the longest op ovsim times ({MAX_OP_S:.0e} s); "
                         "is a size mistyped?")


def _named(parts: Parts, group: str) -> Parts:
    """``parts`` with their shared flow named ``group``."""
    if not parts:
        return parts
    flow = next(iter(parts.values()))[1].renamed(group)
    return {r: (kd, flow, kind) for r, (kd, _, kind) in parts.items()}


def _simulated_parts(parts: Parts, sim: dict[int, int], name: str) -> Parts:
    """A collective's members among the simulated ranks (by job rank), its flow on their simulated
    numbers and still priced for its whole group (``group_size``)."""
    kept = {r: part for r, part in parts.items() if r in sim}
    if not kept:
        return {}
    flow = next(iter(kept.values()))[1]
    narrowed = _renumbered(flow, sim, name, group_size=flow.group_size or len(flow.ranks))
    return {r: (kd, narrowed, kind) for r, (kd, _, kind) in kept.items()}


def _renumbered(flow: FlowDemand, at: dict[int, int], name: str, group_size: int = 0) -> FlowDemand:
    """``flow`` on the simulated members' numbers (``at``: job rank -> simulated; the host, -1,
    stays), with ``group_size`` where given. A transfer between a simulated rank and one it stands
    for cannot be simulated."""
    ends = flow.endpoints
    if ends is not None and any(e >= 0 and e not in at for e in ends):
        raise OvsimError(f"'{name}' joins a simulated rank to one it stands for; run without rank symmetry",
                         field="ranks")
    ranks = tuple(at[r] for r in flow.ranks if r in at)
    if ends is not None:
        ends = (at.get(ends[0], ends[0]), at.get(ends[1], ends[1]))
    size = group_size or flow.group_size
    if ranks == flow.ranks and ends == flow.endpoints and size == flow.group_size:
        return flow
    return dataclasses.replace(flow, ranks=ranks, endpoints=ends, group_size=size)


def _runs_on_any(spec: OpSpec, ranks: frozenset[int], n_ranks: int, rank_sets: _RankSets) -> bool:
    """Whether ``spec`` runs on any of ``ranks``; ``rank_sets`` keeps each op's ranks as a set
    (a training iteration asks about an op on every rank once per op that follows it)."""
    if isinstance(spec, SendRecvOp):
        return spec.src in ranks or spec.dst in ranks
    if spec.ranks == "all":
        return any(r < n_ranks for r in ranks)
    return not _rank_set(spec.ranks, rank_sets).isdisjoint(ranks)


def _runs_on(spec: OpSpec, rank: int, n_ranks: int, rank_sets: _RankSets) -> bool:
    if isinstance(spec, SendRecvOp):
        return rank in (spec.src, spec.dst)
    if spec.ranks == "all":
        return rank < n_ranks
    return rank in _rank_set(spec.ranks, rank_sets)


# A dependency of one repeat of a spec: the name it was given, the id of the op it names less its
# rank, the spec it names and whether it must run on every rank of the op (``after``) or only
# binds where it does (``after_any``).
_Dep = tuple[str, str, "OpSpec", bool]


def _deps_of(spec: _OpBase, i: int, by_name: dict[str, OpSpec]) -> list[_Dep]:
    """The dependencies of repeat ``i`` of ``spec``: each names the other op's repeat ``i`` where
    it repeats as often, else its last."""
    deps: list[_Dep] = []
    for names, required in ((spec.after, True), (spec.after_any, False)):
        for d in names:
            other = by_name[d]
            j = i if other.repeat == spec.repeat else other.repeat - 1
            deps.append((d, d + (f"#{j}" if other.repeat > 1 else ""), other, required))
    return deps


def _dep_ids(name: str, deps: list[_Dep], n_ranks: int, rank_sets: _RankSets,
             rank: int) -> tuple[str, ...]:
    """The ids the op of ``name`` on ``rank`` depends on (:func:`_deps_of`)."""
    ids = []
    for d, other_id, other, required in deps:
        if _runs_on(other, rank, n_ranks, rank_sets):
            ids.append(_op_id(other_id, rank))
        elif required:
            raise OvsimError(f"op '{name}' on rank {rank} follows '{d}', which does not run on rank {rank}",
                             field="after")
    return tuple(ids)


def _rank_set(ranks: Sequence[int], rank_sets: _RankSets) -> frozenset[int]:
    """``ranks`` as a set, made once for each list: a training iteration names the same lists (by
    identity) in 100,000s of specs. The list is kept with its set, so that its identity is not
    another's while the build runs."""
    known = rank_sets.get(id(ranks))
    if known is None:
        known = rank_sets[id(ranks)] = (ranks, frozenset(ranks))
    return known[1]


def _no_deps(rank: int) -> tuple[str, ...]:
    return ()


def _kind(kind: str) -> Literal["gemm", "attention", "elementwise", "norm", "softmax", "generic"]:
    return "generic" if kind == "kernel" else sys.intern(kind)  # type: ignore[return-value]


_NOT_INFO = frozenset({"name", "stream", "ranks", "after", "after_any", "delay_s", "repeat"})


# Each spec class's info fields, in order, and a getter of their values from a spec's __dict__.
_INFO_FIELDS: dict[type, tuple[tuple[str, ...], Callable[[dict[str, object]], tuple[object, ...]]]] = {}


def _shared_info(spec: _OpBase, infos: dict[tuple[object, ...], dict[str, object]]
                 ) -> tuple[dict[str, object], tuple[object, ...]]:
    """What the op was made from (its shape, size, algorithm...): its fields but the placement's,
    the one dict in ``infos`` where an alike spec left it, and its key (its class and the values:
    a class's info fields are always the same ones). Every field of a spec is a plain value, so
    its ``__dict__`` holds its ``model_dump``; the values are taken from it in C, since a
    training build asks for 100,000s."""
    cls = type(spec)
    known = _INFO_FIELDS.get(cls)
    if known is None:
        names = tuple(k for k in cls.model_fields if k not in _NOT_INFO)
        # itemgetter of two or more names gives a tuple (every spec class has two: kind and more).
        assert len(names) > 1, cls
        known = _INFO_FIELDS[cls] = (names, itemgetter(*names))
    names, get = known
    values = get(spec.__dict__)
    key: tuple[object, ...] = (cls, values)
    try:
        info = infos.get(key)
    except TypeError:  # an unhashable value (no spec field holds one today)
        key = (cls, repr(values))
        info = infos.get(key)
    if info is None:
        info = infos[key] = dict(zip(names, values, strict=True))
    return info, key
