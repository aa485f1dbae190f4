"""Prices and NCCL plans that many builds share: within :func:`reusing_builds`, a workload's build
takes the kernel demands and collective plans an earlier build made on the same GPU, system and
calibration (the same objects) instead of making them again.

A schedule search (:mod:`ovsim.tune`) builds hundreds of workloads that differ only in knobs: a
channel count changes the plans of the collectives and nothing else, a carve-out or an occupancy
padding the kernels' demands and nothing else, a stream priority no op at all. Each build already
prices a kernel once however many ops run it (:func:`ovsim.models.workload.build_workload`); this
carries those prices from one build to the next. A demand depends on the kernel's spec, the GPU,
the calibration's parameters, the carve-out and the occupancy padding
(``op_prices.kernel_demand`` reads nothing else), so demands are shared by those; a plan depends
on its collective, the GPU and the system (``nccl.plan_collective``'s key holds the rest). The
objects a memo was made for are held while it lives, so that their identities stay theirs.

A build of the same op list as the build before it (the same spec objects in the same order: a
training iteration's, which ``training.reusing_training_ops`` hands to each candidate of a
search) also takes the ops each spec expanded to there, where the knobs those ops read
(``workload._knob_classes``) are the same. In a search over stream priorities and channel
counts most specs are compute, whose ops neither changes. Ops are frozen, so two workloads can
hold the same ones. Beside the last list, one list :func:`keep_expansions` kept is held too (a
search keeps the one it will predict first with the engine). A build of another list takes the
ops of the specs it shares with the last (``workload._carried`` says which: another bucket size
or chunk count remakes a training iteration's specs, most of them equal); collectives' parts are
shared between builds (:func:`shared_parts`) so that those carried hold the objects the ops made
beside them hold, as in a build made alone.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.models.ir import KernelDemand, Op, Structure
from ovsim.models.nccl import CollectivePlan
from ovsim.models.op_prices import Parts
from ovsim.models.op_specs import Knobs

# Demands by the spec's key (workload._shared_info), plans by nccl.plan_collective's key.
Demands = dict[tuple[object, ...], KernelDemand]
Plans = dict[tuple[object, ...], CollectivePlan]
# The ops each spec of a list expanded to (None: not yet), by the spec's place in the list.
Table = list[list[Op] | None]
# Which spec of an old list each spec of a new one takes the ops of, by place (workload._carried).
Carry = Callable[[tuple[object, ...], tuple[object, ...], "dict[str, int] | None"], tuple[list[int], dict[str, int]]]
# A collective's members' parts (op_prices.collective_parts, its flow's group unnamed) by what
# they depend on (workload._expand's key: the spec's values and its members).
PartsMade = dict[tuple[object, ...], Parts]


@dataclass
class Expansions:
    """The ops the specs of one op list expanded to, one table for each class of spec and value
    of the knobs that class's ops read (``workload._knob_classes``)."""

    classes: list[int]  # each spec's class, by its place in the list
    tables: dict[tuple[int, tuple[object, ...]], Table] = field(default_factory=dict)
    # The ops the tables hold, counted by the builds that fill them (past ``cap`` no table starts,
    # so they hold at most one build's ops more).
    ops: int = 0
    # EXPANSIONS_MAX_OPS, halved while a list's expansions are kept beside the last's.
    cap: int = field(default_factory=lambda: EXPANSIONS_MAX_OPS)
    # Each spec's place by its name, where a carry made it (the next list's carry reads it).
    places: dict[str, int] | None = None
    # What no knob the tables are kept under changes (its op count, streams, analytic plan), once
    # a build of the list found it; later builds of the list take it.
    structure: Structure = field(default_factory=Structure)

    def carry(self, prev: Expansions, at: list[int]) -> None:
        """Take the ops ``prev`` (another list's) holds of the specs ``at`` maps there (each spec's
        place in that list, -1: none), for every value of the knobs ``prev`` has them under."""
        pairs: dict[int, list[tuple[int, int]]] = {}  # by the spec's class
        for i, j in enumerate(at):
            if j >= 0:
                pairs.setdefault(self.classes[i], []).append((i, j))
        if len(at) == len(prev.classes) and all(i == j for i, j in enumerate(at)):
            # Every spec equal to the one in its place there: the same list in value (a scenario's
            # ``ops:`` read again for each candidate), so the same structure.
            self.structure = prev.structure
        for (cls, knobs), old in prev.tables.items():
            if self.ops >= self.cap:
                return
            table: Table = [None] * len(self.classes)
            for i, j in pairs.get(cls, ()):
                made = old[j]
                if made is not None:
                    table[i] = made
                    self.ops += len(made)
            self.tables[(cls, knobs)] = table

    def table(self, cls: int, knobs: tuple[object, ...]) -> Table | None:
        """The table of the specs of class ``cls`` under these values of the knobs they read; a
        new one only while the tables hold fewer than ``cap`` ops (None past it: those specs' ops
        are made and not kept, and the tables there stay)."""
        t = self.tables.get((cls, knobs))
        if t is None and self.ops < self.cap:
            t = self.tables[(cls, knobs)] = [None] * len(self.classes)
        return t


@dataclass
class _Memo:
    # Every object whose identity keys an entry, by that identity.
    held: dict[int, object] = field(default_factory=dict)
    demands: dict[tuple[object, ...], Demands] = field(default_factory=dict)
    plans: dict[tuple[int, int], Plans] = field(default_factory=dict)
    parts: dict[tuple[object, ...], PartsMade] = field(default_factory=dict)
    # The op list and the build's other inputs the expansions below were made for.
    expanded_from: tuple[object, ...] = ()
    expanded_for: tuple[object, ...] = ()
    expansions: Expansions | None = None
    # The same of a list kept beside the last (keep_expansions).
    kept: tuple[tuple[object, ...], tuple[object, ...], Expansions] | None = None

    def drop_expansions(self) -> None:
        self.expanded_from, self.expanded_for, self.expansions = (), (), None

    def carried_from(self, inputs: tuple[object, ...]) -> tuple[tuple[object, ...], Expansions] | None:
        """The list (and its expansions) a new list takes ops from: the last built, else the one
        kept, where built from the same other ``inputs`` (:func:`_same_inputs`)."""
        if self.expansions is not None and _same_inputs(self.expanded_for, inputs):
            return self.expanded_from, self.expansions
        if self.kept is not None and _same_inputs(self.kept[1], inputs):
            return self.kept[0], self.kept[2]
        return None

    def trimmed(self) -> _Memo:
        """This memo, emptied first where it holds more than ``MEMO_MAX_ENTRIES``."""
        n = sum(sum(map(len, d.values())) for d in (self.demands, self.plans, self.parts))
        if n > MEMO_MAX_ENTRIES:
            self.held.clear()
            self.demands.clear()
            self.plans.clear()
            self.parts.clear()
            self.drop_expansions()
            self.kept = None
        return self

    def hold(self, *objs: object) -> tuple[int, ...]:
        for o in objs:
            self.held.setdefault(id(o), o)
        return tuple(id(o) for o in objs)


_MEMO: ContextVar[_Memo | None] = ContextVar("_MEMO", default=None)
# A memo holding more demands and plans than this is emptied before the next build takes from it:
# a sweep over kernel shapes adds new ones with every build (about a kilobyte each).
MEMO_MAX_ENTRIES = 200_000
# Expansions holding this many ops start no new table, and a list of more specs is not held (an
# op is a few hundred bytes; a build of more ops than this takes seconds).
EXPANSIONS_MAX_OPS = 200_000


@contextlib.contextmanager
def reusing_builds() -> Iterator[None]:
    """Within it, builds share kernel demands, NCCL plans and the ops of an op list built again
    (module docstring); released on leaving. Nested, the outer memo serves. Within it no op spec
    may be changed in place, its lists (``ranks``, ``after``) included, which pydantic's frozen
    models do not freeze: a list built again is recognised by its specs' identities."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set(_Memo())
    try:
        yield
    finally:
        _MEMO.reset(token)


def reusing_builds_now() -> bool:
    """Whether a build now runs within :func:`reusing_builds`."""
    return _MEMO.get() is not None


def shared_demands(gpu: GpuSpec, params: Parameters, knobs: Knobs) -> Demands:
    """The demands earlier builds priced for this GPU, calibration, carve-out and padding (a new
    dict outside :func:`reusing_builds`)."""
    memo = _MEMO.get()
    if memo is None:
        return {}
    memo = memo.trimmed()
    key = (*memo.hold(gpu, params), knobs.sm_carveout, knobs.occupancy_shaping_smem_bytes)
    return memo.demands.setdefault(key, {})


def shared_plans(gpu: GpuSpec, system: SystemSpec) -> Plans:
    """The NCCL plans earlier builds made on this GPU and system (a new dict outside
    :func:`reusing_builds`)."""
    memo = _MEMO.get()
    if memo is None:
        return {}
    gpu_id, system_id = memo.hold(gpu, system)
    return memo.plans.setdefault((gpu_id, system_id), {})


def shared_parts(gpu: GpuSpec, system: SystemSpec, params: Parameters, knobs: Knobs,
                 simulated: tuple[int, ...] | None) -> PartsMade:
    """The collectives' parts earlier builds made on this GPU, system and calibration, with these
    channels and copy-engine offload and these simulated ranks (what ``collective_parts`` and
    the narrowing to simulated ranks read beside the spec and its members; a new dict outside
    :func:`reusing_builds`). Ops carried from another list's build (:meth:`Expansions.carry`)
    hold these parts, so the ops made beside them share them as a build's own would."""
    memo = _MEMO.get()
    if memo is None:
        return {}
    key = (*memo.hold(gpu, system, params), knobs.nccl_channels, knobs.ce_offload, simulated)
    return memo.parts.setdefault(key, {})


def shared_expansions(specs: tuple[object, ...], inputs: tuple[object, ...],
                      classes: Callable[[tuple[object, ...]], list[int]],
                      carry: Carry | None = None) -> Expansions | None:
    """The ops the build before this one expanded ``specs`` to, if it built the same list (the
    same objects in the same order, held here) from equal other ``inputs`` (the GPU, system,
    calibration, ranks and schedule, as the caller names them), or those of the list kept
    (:func:`keep_expansions`) if it is that one; else tables for them, each spec of the class
    ``classes`` gives it, holding what ``carry(old, specs, places)`` says the last list built (or
    else the kept one) from equal ``inputs`` made of the same specs: each spec's place in ``old``
    (-1: none), with each spec's place by name in ``specs`` (``places``: the same of ``old``, if
    known). None outside :func:`reusing_builds`, and for a list too long to keep."""
    memo = _MEMO.get()
    if memo is None:
        return None
    if len(specs) > EXPANSIONS_MAX_OPS:
        # Too many to keep their ops: neither is the list held (a scenario's own specs would stay
        # alive through the next build, about a kilobyte each).
        memo.drop_expansions()
        return None
    if memo.expansions is not None and _same(memo.expanded_from, specs) and _same_inputs(memo.expanded_for, inputs):
        return memo.expansions
    if memo.kept is not None and _same(memo.kept[0], specs) and _same_inputs(memo.kept[1], inputs):
        memo.expanded_from, memo.expanded_for, memo.expansions = memo.kept
        return memo.expansions
    prev = memo.carried_from(inputs) if carry is not None else None
    memo.drop_expansions()  # the list before goes, but for the ops the new list takes of it below
    memo.expanded_from, memo.expanded_for = specs, inputs
    memo.expansions = Expansions(classes(specs), cap=EXPANSIONS_MAX_OPS // (2 if memo.kept is not None else 1))
    if prev is not None:
        assert carry is not None
        at, memo.expansions.places = carry(prev[0], specs, prev[1].places)
        memo.expansions.carry(prev[1], at)
    return memo.expansions


def _same_inputs(held: tuple[object, ...], inputs: tuple[object, ...]) -> bool:
    """Whether two builds' other inputs are the same: plain values equal, objects (the GPU, system,
    calibration) the very same, as the memos of demands, plans and parts key them. Ops carried
    from another list then hold the parts the ops made beside them take, as one build's would."""
    return len(held) == len(inputs) and all(
        a is b or (isinstance(a, int | float | str | tuple) and a == b) for a, b in zip(held, inputs, strict=True))


def _same(held: tuple[object, ...], specs: tuple[object, ...]) -> bool:
    # By identity: comparing equal specs of two lists by value walks a shared prefix at a few
    # microseconds a spec (0.2 s of a 3.7 s build of the 145.6B row whose lists differ at the end).
    return len(held) == len(specs) and all(map(operator.is_, held, specs))


def keep_expansions(keep: bool = True) -> None:
    """Keep the expansions of the last list built beside those of the lists built after it (until
    asked again; ``keep`` False: keep none), if they hold at most half of ``EXPANSIONS_MAX_OPS``
    ops; while kept, each list's tables hold at most half (so the two stay within it)."""
    memo = _MEMO.get()
    if memo is None:
        return
    e = memo.expansions
    memo.kept = None
    if keep and e is not None and e.ops <= EXPANSIONS_MAX_OPS // 2:
        e.cap = EXPANSIONS_MAX_OPS // 2
        memo.kept = (memo.expanded_from, memo.expanded_for, e)
    elif e is not None:
        e.cap = EXPANSIONS_MAX_OPS


def drop_expansions() -> None:
    """Let the last list's expansions go (``training.release_training_build``: a search lets its
    last list go before the engine's confirmations), those kept (:func:`keep_expansions`) stay."""
    memo = _MEMO.get()
    if memo is not None:
        memo.drop_expansions()
