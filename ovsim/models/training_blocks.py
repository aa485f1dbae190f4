"""A training iteration's repeated blocks copied rather than emitted again.

A layer's forward (or backward) on one pipeline stage emits the same op specs in every layer and
micro-batch but for their names, which start with the block's prefix (``F3.L7``), and for what the
block's first ops follow (the stage's last op and pending communication when it starts). So the
first block of each kind is emitted and recorded, and the others copy it: each spec's fields as
they are, its name under the new prefix and its dependencies mapped, inside the block by place and
outside it to what the stage holds when the new block starts. A copied spec is held as a
:class:`~ovsim.models.op_specs.SpecCopy` (its source, name and dependencies); made, a copy is the
list the emitter would have made, spec for spec (tests/models/test_training_blocks.py builds
both). It costs a small object a spec where emitting one went through the generator's helpers
(docs/design.md, "Building a workload", says what it saves).

Each copy is also listed (:attr:`BlockCopies.copies`) so that the build can make a copied spec's
ops from its source's (:func:`ovsim.models.workload.build_workload`'s ``copies``) without making
the spec.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from ovsim.models.op_specs import OpSpec, SpecCopy, _OpBase, base_spec


class _Stage(Protocol):
    """What a block reads and leaves of its pipeline stage
    (:class:`ovsim.models.training_emit.StageState`)."""

    last: str | None
    pending: list[str]


# A name's place: >= 0, the block's spec at that index; < 0, the name the stage held at entry at
# index -1 - ref (its last op first, where it had one, then its pending communication).
_Ref = int


class _Part(NamedTuple):
    """A spec of a block as first emitted."""

    spec: OpSpec | SpecCopy
    recomputed: bool  # named under the recomputation prefix ("R...")
    rest: str  # the name after the prefix
    after: list[_Ref]
    after_any: list[_Ref]


@dataclass(slots=True)
class _Block:
    """A block as first emitted: where its specs start in the list, each spec's part, and what
    the stage holds after it."""

    start: int
    parts: list[_Part]
    last: _Ref | None
    pending: list[_Ref]
    held: list[_OpBase] = field(init=False)  # each part's spec's fields (base_spec), made once

    def __post_init__(self) -> None:
        self.held = [base_spec(part.spec) for part in self.parts]


class _NotABlock(Exception):
    """A block names something neither its own nor the stage's at entry: never copied."""


_UNSEEN = object()  # a kind of block not seen yet


@dataclass
class BlockCopies:
    """The blocks recorded so far (None: a kind that cannot be copied) and the copies made, each
    (first spec's index, its source's, spec count)."""

    blocks: dict[Hashable, _Block | None] = field(default_factory=dict)
    copies: list[tuple[int, int, int]] = field(default_factory=list)

    def emit(self, ops: list[OpSpec | SpecCopy], key: Hashable, st: _Stage, prefix: str,
             body: Callable[[], None]) -> None:
        """Append to ``ops`` the block ``body`` emits under ``prefix`` on stage ``st``: a copy of
        the first block of ``key`` (what besides the names decides the block's specs) where there
        is one, else ``body``'s own, recorded for the next. Names made under ``R`` + the prefix's
        rest (a selective recomputation's attention in a backward block ``B...``) are renamed too."""
        entry = [st.last, *st.pending] if st.last is not None else list(st.pending)
        full_key = (key, st.last is None, len(st.pending))
        block = self.blocks.get(full_key, _UNSEEN)
        # An entry naming one op twice would map two places to one name: emitted (and, first of
        # its kind, never copied).
        distinct = len(set(entry)) == len(entry)
        if isinstance(block, _Block) and distinct:
            self._copy(ops, block, st, prefix, entry)
            return
        start = len(ops)
        body()
        if block is _UNSEEN:
            try:
                self.blocks[full_key] = _record(ops, start, prefix, entry, st) if distinct else None
            except _NotABlock:
                self.blocks[full_key] = None

    def _copy(self, ops: list[OpSpec | SpecCopy], block: _Block, st: _Stage, prefix: str, entry: list[str]) -> None:
        recompute = "R" + prefix[1:]
        # Every name a place can hold: the block's own, then the entry's from its end (place -1
        # is the entry's first name, so at index len(names) + len(entry) - 1).
        names = [(recompute if part.recomputed else prefix) + part.rest for part in block.parts]
        names += reversed(entry)
        first = len(ops)
        # An empty list may stay the source's object: no spec's list is changed after it is made.
        ops.extend([SpecCopy(held, name, [names[r] for r in after] if after else src.after,
                             [names[r] for r in after_any] if after_any else src.after_any)
                    for (src, _, _, after, after_any), held, name in zip(block.parts, block.held, names, strict=False)])
        st.last = names[block.last] if block.last is not None else None
        st.pending = [names[r] for r in block.pending]
        self.copies.append((first, block.start, len(block.parts)))


def _record(ops: list[OpSpec | SpecCopy], start: int, prefix: str, entry: list[str], st: _Stage) -> _Block:
    """The block of ``ops[start:]``, emitted under ``prefix`` from a stage that held ``entry``
    (each op once) and now holds ``st``."""
    recompute = "R" + prefix[1:]
    places: dict[str, _Ref] = {n: -1 - i for i, n in enumerate(entry)}
    rests: list[tuple[bool, str]] = []
    for k, spec in enumerate(ops[start:]):
        if spec.name.startswith(prefix):
            rests.append((False, spec.name[len(prefix):]))
        elif spec.name.startswith(recompute):
            rests.append((True, spec.name[len(recompute):]))
        else:
            raise _NotABlock
        places[spec.name] = k

    def refs(names: list[str]) -> list[_Ref]:
        try:
            return [places[n] for n in names]
        except KeyError:
            raise _NotABlock from None

    parts = [_Part(s, r, rest, refs(s.after), refs(s.after_any))
             for s, (r, rest) in zip(ops[start:], rests, strict=True)]
    return _Block(start=start, parts=parts, last=refs([st.last])[0] if st.last is not None else None,
                  pending=refs(st.pending))
