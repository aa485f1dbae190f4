"""Ops made from another spec's: a spec that copies an earlier one but for its name and what it
follows (a training iteration's layer blocks, :mod:`ovsim.models.training_blocks`) gets the
earlier spec's ops renamed, rather than expanded and priced again. The copy is taken only where
it is exact: the two specs agree in every other field, and each op they follow runs where the
other's does (so each rank keeps the same dependencies), else the spec is expanded as any is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from ovsim.models.ir import FlowDemand, Op, new_op
from ovsim.models.op_specs import (
    AttentionOp,
    CollectiveOpSpec,
    GemmOp,
    KernelOp,
    MemoryOp,
    SpecCopy,
    _OpBase,
    base_spec,
)

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


# A spec's fields besides its name and dependencies, by class: what a copy agrees in with its source.
_NOT_COPIED = frozenset({"name", "after", "after_any"})
_KEPT_FIELDS: dict[type, itemgetter[Any]] = {}


class OpCopier:
    """Makes a copied spec's ops from its source's (:meth:`copied`) within one build, keeping by
    source spec what a copy is checked against. ``by_name``: the build's specs by name, each
    :class:`SpecCopy` as its source."""

    def __init__(self, by_name: Mapping[str, _OpBase]) -> None:
        self.by_name = by_name
        # By source spec's id (the build's specs outlive the copier): its fields but the name and
        # dependencies, and the getter of them; None where its ops are not copied.
        self._sources: dict[int, tuple[tuple[object, ...], itemgetter[Any]] | None] = {}

    def copied(self, spec: _OpBase | SpecCopy, source: _OpBase | SpecCopy, source_ops: Sequence[Op]
               ) -> list[Op] | None:
        """The ops of ``spec`` made from ``source``'s (``source_ops``), or None where ``spec`` is
        not an exact copy of it but for its name and dependencies (:data:`_COPYABLE` only, neither
        repeated). Either may be a :class:`SpecCopy`: its fields are its source's."""
        try:
            entry = self._sources[id(source)]
        except KeyError:
            entry = self._sources[id(source)] = _source_entry(source, source_ops)
        if entry is None:
            return None
        values, kept = entry
        held = spec.source if type(spec) is SpecCopy else spec
        was_held = source.source if type(source) is SpecCopy else source
        # Specs of one class hold the same fields: pydantic keeps each in the dict. A copy of the
        # very spec the source holds agrees with it by construction.
        if held is not was_held and (type(held) is not type(was_held) or kept(held.__dict__) != values):
            return None
        was_after, was_any, now_after, now_any = source.after, source.after_any, spec.after, spec.after_any
        names: dict[str, str] = {}  # the source's dependencies' names: the copy's
        if was_after or was_any or now_after or now_any:
            if len(now_after) != len(was_after) or len(now_any) != len(was_any):
                return None
            found = _renames(was_after + was_any, now_after + now_any, self.by_name)
            if found is None:
                return None
            names = found
        name, old_name = spec.name, source.name
        cut = len(old_name)
        flows: dict[int, FlowDemand] | None = None
        out: list[Op] = []
        for op in source_ops:
            tail = op.id[cut:]  # RANK_MARK and the job rank, as its dependencies' ids end
            deps = op.deps
            if deps:
                k = len(tail)
                deps = tuple([names[d[:-k]] + tail for d in deps])
            flow = op.flow
            if flow is not None:
                if flows is None:
                    flows = {}
                flow = flows.get(id(flow)) or flows.setdefault(id(flow), flow.renamed(name))
            out.append(new_op(name + tail, name, op.kind, op.rank, op.stream, deps, op.delay_s, op.kernel, flow,
                              op.partition, op.info))
        return out


def _source_entry(source: _OpBase | SpecCopy, source_ops: Sequence[Op]
                  ) -> tuple[tuple[object, ...], itemgetter[Any]] | None:
    """What a copy of ``source`` is checked against (:attr:`OpCopier._sources`), or None where
    its ops cannot be copied: a class not :data:`_COPYABLE`, a repeat, or ids made otherwise
    than :func:`op_id` (nothing to rename by)."""
    held = base_spec(source)
    old = held.__dict__
    cls = type(held)
    if cls not in _COPYABLE or old["repeat"] != 1:
        return None
    if source_ops and not source_ops[0].id.startswith(RANK_MARK, len(source.name)):
        return None
    kept = _KEPT_FIELDS.get(cls)
    if kept is None:
        kept = _KEPT_FIELDS[cls] = itemgetter(*[k for k in old if k not in _NOT_COPIED])
    return kept(old), kept


def _renames(was: list[str], now: list[str], by_name: Mapping[str, _OpBase]) -> dict[str, str] | None:
    """The names a source follows (``was``), each the copy's in its place (``now``, as long), or
    None where one of the copy's runs elsewhere than the source's (or repeats: it would be named
    with its repeat's suffix). ``by_name`` holds a :class:`SpecCopy`'s source under its name, so a
    copy of the spec the source follows is that very spec."""
    names: dict[str, str] = {}
    for was_name, now_name in zip(was, now, strict=True):
        a, b = by_name.get(now_name), by_name.get(was_name)
        if a is None or b is None or b.repeat != 1 or (a is not b and placement(a) != placement(b)):
            return None
        if names.setdefault(was_name, now_name) != now_name:
            return None
    return names
