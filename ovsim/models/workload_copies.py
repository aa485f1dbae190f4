"""Ops made from another spec's: a spec that copies an earlier one but for its name and what it
follows (a training iteration's layer blocks, :mod:`ovsim.models.training_blocks`) gets the
earlier spec's ops renamed, rather than expanded and priced again. The copy is taken only where
it is exact: the two specs agree in every other field, and each op they follow runs where the
other's does (so each rank keeps the same dependencies), else the spec is expanded as any is."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from ovsim.models.ir import FlowDemand, Op, new_op
from ovsim.models.op_specs import AttentionOp, CollectiveOpSpec, GemmOp, KernelOp, MemoryOp, _OpBase

# An op's id: its name and its job rank after this mark. A dependency's id is the op it follows on
# the same rank, so a copy renames both by the name and keeps the rank's part.
RANK_MARK = "@r"


def op_id(name: str, rank: int) -> str:
    """The id of op ``name`` on job rank ``rank``."""
    return f"{name}{RANK_MARK}{rank}"


# The specs whose ops copy: one op a rank, named after the spec, its flow (a collective's) named so
# too. A copy's (per-rank flow names) and a send/recv's (two ends) would need more than a rename.
_COPYABLE = frozenset({GemmOp, MemoryOp, AttentionOp, KernelOp, CollectiveOpSpec})


def copy_sources(copies: Sequence[tuple[int, int, int]], n_specs: int
                 ) -> tuple[list[int], dict[int, list[Op] | None]]:
    """From ``copies`` (each block's first spec's index, its source's, spec count; a later block
    over the same specs overrides an earlier): each spec's source (-1: none; an empty list without
    copies), and the sources whose ops are to be kept. A block that does not follow its source
    within the ``n_specs`` is a caller's error (ovsim's generator makes none)."""
    if not copies:
        return [], {}
    source_of = [-1] * n_specs
    kept: dict[int, list[Op] | None] = {}
    for first, source, count in copies:
        if not (0 <= source < first and count > 0 and first + count <= n_specs):
            raise ValueError(f"a copy of {count} specs from {source} at {first} does not follow them within "
                             f"{n_specs} specs")
        source_of[first:first + count] = range(source, source + count)
        kept.update(dict.fromkeys(range(source, source + count)))
    return source_of, kept


def placement(spec: _OpBase) -> tuple[object, ...]:
    """What an op's expansion reads of an op it follows (where it runs and how often). From its
    fields' dict: pydantic answers a missing attribute slowly."""
    fields = spec.__dict__
    return type(spec), fields["repeat"], fields.get("ranks"), fields.get("src"), fields.get("dst")


def copied_ops(spec: _OpBase, source: _OpBase, source_ops: Sequence[Op], by_name: Mapping[str, _OpBase],
               copied_from: dict[str, str]) -> list[Op] | None:
    """The ops of ``spec`` made from ``source``'s (``source_ops``), or None where ``spec`` is not
    an exact copy of it but for its name and dependencies (:data:`_COPYABLE` only, neither
    repeated). ``copied_from`` holds the copies made so far and takes this one."""
    new, old = spec.__dict__, source.__dict__
    cls = type(spec)
    if cls is not type(source) or cls not in _COPYABLE or old["repeat"] != 1:
        return None
    was_after, was_any, now_after, now_any = old["after"], old["after_any"], new["after"], new["after_any"]
    if {**new, "name": old["name"], "after": was_after, "after_any": was_any} != old:
        return None
    names: dict[str, str] = {}  # the source's dependencies' names: the copy's
    if was_after or was_any or now_after or now_any:
        if len(now_after) != len(was_after) or len(now_any) != len(was_any):
            return None
        found = _renames(was_after, was_any, now_after, now_any, by_name, copied_from)
        if found is None:
            return None
        names = found
    name = new["name"]
    cut = len(old["name"])
    if source_ops and not source_ops[0].id.startswith(RANK_MARK, cut):
        return None  # ids made otherwise than op_id: nothing to rename by
    copied_from[name] = old["name"]
    flows: dict[int, FlowDemand] = {}
    out: list[Op] = []
    for op in source_ops:
        tail = op.id[cut:]  # RANK_MARK and the job rank, as its dependencies' ids end
        deps = op.deps
        if deps:
            k = len(tail)
            deps = tuple([names[d[:-k]] + tail for d in deps])
        flow = op.flow
        if flow is not None:
            flow = flows.get(id(flow)) or flows.setdefault(id(flow), flow.renamed(name))
        out.append(new_op(name + tail, name, op.kind, op.rank, op.stream, deps, op.delay_s, op.kernel, flow,
                          op.partition, op.info))
    return out


def _renames(was_after: list[str], was_any: list[str], now_after: list[str], now_any: list[str],
             by_name: Mapping[str, _OpBase], copied_from: dict[str, str]) -> dict[str, str] | None:
    """The names a source follows, each the copy's in its place, or None where one of the copy's
    runs elsewhere than the source's (or repeats: it would be named with its repeat's suffix)."""
    names: dict[str, str] = {}
    for was, now in zip(itertools.chain(was_after, was_any), itertools.chain(now_after, now_any), strict=True):
        if copied_from.get(now) != was:
            a, b = by_name.get(now), by_name.get(was)
            if a is None or b is None or b.repeat != 1 or placement(a) != placement(b):
                return None
        if names.setdefault(was, now) != now:
            return None
    return names
