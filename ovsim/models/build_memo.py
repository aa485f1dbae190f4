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
(``workload._knobs_read``) are the same. In a search over stream priorities and channel
counts most specs are compute, whose ops neither changes. Ops are frozen, so two workloads can
hold the same ones.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.models.ir import KernelDemand, Op
from ovsim.models.nccl import CollectivePlan
from ovsim.models.op_specs import Knobs

# Demands by the spec's key (workload._shared_info), plans by nccl.plan_collective's key.
Demands = dict[tuple[object, ...], KernelDemand]
Plans = dict[tuple[object, ...], CollectivePlan]
# The ops a spec expanded to, by the spec's place in its list and the knobs its ops read.
Expansions = dict[tuple[int, tuple[object, ...]], list[Op]]


@dataclass
class _Memo:
    # Every object whose identity keys an entry, by that identity.
    held: dict[int, object] = field(default_factory=dict)
    demands: dict[tuple[object, ...], Demands] = field(default_factory=dict)
    plans: dict[tuple[int, int], Plans] = field(default_factory=dict)
    # The op list and the build's other inputs the expansions below were made for, the
    # expansions, and how many ops they hold.
    expanded_from: tuple[object, ...] = ()
    expanded_for: tuple[object, ...] = ()
    expansions: Expansions = field(default_factory=dict)
    expanded_ops: int = 0

    def trimmed(self) -> _Memo:
        """This memo, emptied first where it holds more than ``MEMO_MAX_ENTRIES``."""
        n = sum(map(len, self.demands.values())) + sum(map(len, self.plans.values()))
        if n > MEMO_MAX_ENTRIES:
            self.held.clear()
            self.demands.clear()
            self.plans.clear()
            self.expansions, self.expanded_ops = {}, 0
        return self

    def hold(self, *objs: object) -> tuple[int, ...]:
        for o in objs:
            self.held.setdefault(id(o), o)
        return tuple(id(o) for o in objs)


_MEMO: ContextVar[_Memo | None] = ContextVar("_MEMO", default=None)
# A memo holding more demands and plans than this is emptied before the next build takes from it:
# a sweep over kernel shapes adds new ones with every build (about a kilobyte each).
MEMO_MAX_ENTRIES = 200_000
# Expansions holding more ops than this take no more (an op is a few hundred bytes; a build of
# more ops than this takes seconds, against which the expansion saved is little).
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


def shared_expansions(specs: tuple[object, ...], inputs: tuple[object, ...]) -> Expansions | None:
    """The ops the build before this one expanded ``specs`` to, if it built the same list (the
    same objects in the same order, held here) from equal other ``inputs`` (the GPU, system,
    calibration, ranks and schedule, as the caller names them); an empty dict to fill otherwise.
    None outside :func:`reusing_builds`."""
    memo = _MEMO.get()
    if memo is None:
        return None
    if len(specs) > EXPANSIONS_MAX_OPS:
        # Too many to keep their ops: neither is the list held (a scenario's own specs would stay
        # alive through the next build, about a kilobyte each).
        memo.expanded_from, memo.expanded_for = (), ()
        memo.expansions, memo.expanded_ops = {}, 0
        return None
    # By identity: comparing equal specs of two lists by value walks a shared prefix at a few
    # microseconds a spec (0.2 s of a 3.7 s build of the 145.6B row whose lists differ at the end).
    held = memo.expanded_from
    same = len(held) == len(specs) and all(map(operator.is_, held, specs))
    if not same or memo.expanded_for != inputs:
        memo.expanded_from, memo.expanded_for = specs, inputs
        memo.expansions, memo.expanded_ops = {}, 0
    return memo.expansions


def keep_expansion(expansions: Expansions, key: tuple[int, tuple[object, ...]], ops: list[Op]) -> None:
    """Keep a spec's ops for the next build (:func:`shared_expansions`), while the memo holds
    fewer than ``EXPANSIONS_MAX_OPS``."""
    memo = _MEMO.get()
    if memo is None or memo.expansions is not expansions or memo.expanded_ops + len(ops) > EXPANSIONS_MAX_OPS:
        return
    expansions[key] = ops
    memo.expanded_ops += len(ops)
