"""Ops made from another spec's: a spec that copies an earlier one but for its name and what it
follows (a training iteration's layer blocks, :mod:`ovsim.models.training_blocks`) gets the
earlier spec's ops renamed, rather than expanded and priced again. The copy is taken only where
it is exact: the two specs agree in every other field, and each op they follow runs where the
other's does (so each rank keeps the same dependencies), else the spec is expanded as any is.

A whole block copied (``build_workload``'s ``copies``) is made from its source block's template:
the source's ops with each name they hold by its place (a spec of the block, or a name the block
follows from outside), so a copy is checked once per spec and renamed by list lookups, not through
a name map per spec (docs/design.md, "Blocks made by template")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, cast

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
    """Makes copied specs' ops from their sources' (:meth:`copy_from`) within one build, keeping by
    source spec what a copy is checked against. ``by_name``: the build's specs by name, each
    :class:`SpecCopy` as its source; ``specs``, the build's list; ``source_of`` and ``kept``, as
    :func:`copy_sources` gives them (``kept`` filled in by the build as it makes each source's ops)."""

    def __init__(self, by_name: Mapping[str, _OpBase], specs: Sequence[_OpBase | SpecCopy], source_of: list[int],
                 kept: dict[int, list[Op] | None], copies: Sequence[tuple[int, int, int]] = ()) -> None:
        self.by_name = by_name
        self.specs = specs
        self.source_of = source_of
        self.kept = kept
        # Each block by its first spec (the last given there), and the templates of the blocks
        # copied, by source and spec count (None: a source block copied spec by spec).
        self._blocks = {first: (source, count) for first, source, count in copies}
        self._templates: dict[tuple[int, int], _Template | None] = {}
        # By source spec's id (the build's specs outlive the copier): its fields but the name and
        # dependencies, and the getter of them; None where its ops are not copied.
        self._sources: dict[int, tuple[tuple[object, ...], itemgetter[Any]] | None] = {}

    def copy_from(self, first: int, limit: int, out: list[Op]) -> int:
        """Append to ``out`` the ops of the specs from index ``first`` on, each made from its
        source's, up to ``limit`` or the first spec that is not an exact copy of its source but for
        its name and dependencies (:data:`_COPYABLE` only, neither repeated); the index it stopped
        at. Either spec may be a :class:`SpecCopy`: its fields are its source's. A block of
        ``copies`` starting on the way is made whole by its source block's template where it can
        be (:meth:`_block`); the rest spec by spec."""
        specs, source_of, kept, sources, blocks = self.specs, self.source_of, self.kept, self._sources, self._blocks
        i = first
        while i < limit:
            block = blocks.get(i)
            if block is not None and i + block[1] <= limit and self._block(i, *block, out):
                i += block[1]
                continue
            j = source_of[i]
            source_ops = kept[j] if j >= 0 else None
            if source_ops is None:
                break
            spec, source = specs[i], specs[j]
            entry = sources.get(id(source), _UNKNOWN)
            if entry is _UNKNOWN:
                entry = sources[id(source)] = _source_entry(source, source_ops)
            if entry is None:
                break
            names = self._names(spec, source, entry)
            if names is None:
                break
            start = len(out)
            _renamed_ops(source_ops, spec.name, len(source.name), names, out)
            if i in kept:
                kept[i] = out[start:]
            i += 1
        return i

    def _block(self, first: int, source: int, count: int, out: list[Op]) -> bool:
        """Append to ``out`` the ops of the ``count`` specs from ``first``, a copy of those from
        ``source``, made by the source block's template, where the whole block copies so (each
        spec holds its source's very spec, and each name it follows is its source's in the copy:
        inside the block, the copy's spec in the same place); False, with nothing appended, where
        one does not (the block is then copied spec by spec, as any)."""
        specs, kept = self.specs, self.kept
        # A block overridden in part by a later one, or overlapping its source, goes spec by spec.
        if self.source_of[first:first + count] != list(range(source, source + count)) or source + count > first:
            return False
        key = (source, count)
        tpl = self._templates.get(key, _UNKNOWN)
        if tpl is _UNKNOWN:
            tpl = self._templates[key] = _Template.of(specs, source, count, kept)
        if tpl is None:
            return False
        copy = specs[first:first + count]
        names = [s.name for s in copy]
        outside = tpl.outside_at(copy, names, self.by_name)
        if outside is None:
            return False
        start = len(out)
        tpl.make(names + outside, out)
        for k in tpl.kept_in(first, kept):
            kept[first + k] = out[start + tpl.offsets[k]:start + tpl.offsets[k + 1]]
        return True

    def _names(self, spec: _OpBase | SpecCopy, source: _OpBase | SpecCopy,
               entry: tuple[tuple[object, ...], itemgetter[Any]]) -> dict[str, str] | None:
        """The names ``source``'s dependencies take in ``spec`` (empty where neither has any), or
        None where ``spec`` is no exact copy of ``source`` (``entry``: its fields and their getter)."""
        values, kept = entry
        held = spec.source if type(spec) is SpecCopy else spec
        was_held = source.source if type(source) is SpecCopy else source
        # Specs of one class hold the same fields: pydantic keeps each in the dict. A copy of the
        # very spec the source holds agrees with it by construction.
        if held is not was_held and (type(held) is not type(was_held) or kept(held.__dict__) != values):
            return None
        was_after, was_any, now_after, now_any = source.after, source.after_any, spec.after, spec.after_any
        if not (was_after or was_any or now_after or now_any):
            return _NO_NAMES
        if len(now_after) != len(was_after) or len(now_any) != len(was_any):
            return None
        return _renames(was_after + was_any, now_after + now_any, self.by_name)


_UNKNOWN: Any = object()  # a source not looked at yet
_NO_NAMES: dict[str, str] = {}  # read only


class _Template:
    """A source block's ops, each with the place of its spec in the block and its dependencies by
    place (a spec of the block, else a name it follows from outside, after the block's): a copy of
    the block names them by the copy's names (:meth:`make`). ``refs``: per spec, each name it
    follows (``after``, then ``after_any``) by place; ``offsets``: where each spec's ops start."""

    __slots__ = ("count", "deps", "holds", "n_after", "offsets", "ops", "outside", "places", "refs", "tails")

    def __init__(self) -> None:
        self.count = 0
        self.holds: list[_OpBase] = []  # each spec's held spec (a copy must hold the very one)
        self.n_after: list[int] = []  # each spec's count of ``after`` names (then ``after_any``)
        self.outside: list[str] = []
        self.refs: list[list[int]] = []
        self.offsets: list[int] = [0]
        self.ops: list[Op] = []
        self.places: list[int] = []
        self.tails: list[str] = []
        self.deps: list[list[int] | None] = []

    @staticmethod
    def of(specs: Sequence[_OpBase | SpecCopy], source: int, count: int, kept: Mapping[int, list[Op] | None]
           ) -> _Template | None:
        """The template of the ``count`` specs from ``source`` (their ops in ``kept``), or None
        where one of them is not copied (:func:`_source_entry`) or follows a repeated op."""
        tpl = _Template()
        tpl.count = count
        block = specs[source:source + count]
        places = {s.name: k for k, s in enumerate(block)}
        for k, spec in enumerate(block):
            ops = kept[source + k]
            if ops is None or _source_entry(spec, ops) is None:
                return None
            tpl.holds.append(base_spec(spec))
            tpl.n_after.append(len(spec.after))
            tpl.refs.append([tpl.place(d, places) for d in (*spec.after, *spec.after_any)])
            cut = len(spec.name)
            for op in ops:
                tail = op.id[cut:]
                n = len(tail)
                refs = [tpl.known(d[:-n], places) for d in op.deps] if op.deps else None
                if refs is not None and min(refs) < 0:
                    return None  # a repeat's op ("name#3"): its spec's name is not it
                tpl.ops.append(op)
                tpl.places.append(k)
                tpl.tails.append(tail)
                tpl.deps.append(refs)
            tpl.offsets.append(len(tpl.ops))
        return tpl

    def known(self, name: str, places: dict[str, int]) -> int:
        """The place of ``name`` in a copy's names (:meth:`place`), or -1 where it has none."""
        k = places.get(name)
        if k is not None:
            return k
        return self.count + self.outside.index(name) if name in self.outside else -1

    def place(self, name: str, places: dict[str, int]) -> int:
        """The place of ``name`` in a copy's names: its spec's in the block (``places``), else
        after the block, among the names the block follows from outside (added if new)."""
        k = self.known(name, places)
        if k < 0:
            self.outside.append(name)
            k = self.count + len(self.outside) - 1
        return k

    def outside_at(self, copy: Sequence[_OpBase | SpecCopy], names: list[str], by_name: Mapping[str, _OpBase]
                   ) -> list[str] | None:
        """The names the ``copy`` (its specs' ``names``) follows from outside in place of the
        source's, or None where it is not an exact copy of the block: a spec holding another
        than its source's, a name inside the block other than the copy's in its place, or a
        name outside that runs otherwise than the source's (:func:`_renames`)."""
        count, holds = self.count, self.holds
        now_outside: list[str | None] = [None] * len(self.outside)
        for k, spec in enumerate(copy):
            if (spec.source if type(spec) is SpecCopy else spec) is not holds[k]:
                return None
            refs = self.refs[k]
            if not refs:
                if spec.after or spec.after_any:
                    return None
                continue
            now = (*spec.after, *spec.after_any)
            if len(now) != len(refs) or len(spec.after) != self.n_after[k]:
                return None
            for ref, name in zip(refs, now, strict=True):
                if ref < count:
                    if names[ref] != name:
                        return None
                    continue
                was = now_outside[ref - count]
                if was is None:
                    now_outside[ref - count] = name
                elif was != name:
                    return None
        found = _renames(self.outside, cast(list[str], now_outside), by_name)
        return None if found is None else cast(list[str], now_outside)

    def make(self, names: list[str], out: list[Op]) -> None:
        """Append to ``out`` the block's ops under ``names`` (the copy's specs', then the names
        it follows from outside)."""
        # A spec's ops share its flow (a collective's members): renamed once for them.
        was: FlowDemand | None = None
        now: FlowDemand | None = None
        for k, tail, refs, op in zip(self.places, self.tails, self.deps, self.ops, strict=True):
            name = names[k]
            deps = tuple([names[r] + tail for r in refs]) if refs is not None else op.deps
            flow = op.flow
            if flow is not None:
                if flow is not was or now is None or now.group != name:
                    was, now = flow, flow.renamed(name)
                flow = now
            out.append(new_op(name + tail, name, op.kind, op.rank, op.stream, deps, op.delay_s, op.kernel, flow,
                              op.partition, op.info))

    def kept_in(self, first: int, kept: Mapping[int, object]) -> list[int]:
        """The places of the block's specs (a copy from ``first``) whose ops a later copy reads."""
        return [k for k in range(self.count) if first + k in kept] if kept else []


def _renamed_ops(source_ops: Sequence[Op], name: str, cut: int, names: dict[str, str], out: list[Op]) -> None:
    """Append to ``out`` ``source_ops`` under spec name ``name`` (theirs: ``cut`` characters),
    their dependencies' names mapped by ``names``."""
    flows: dict[int, FlowDemand] | None = None
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
