"""Prices and NCCL plans that many builds share: within :func:`reusing_builds`, a workload's build
takes the kernel demands and collective plans an earlier build made on the same GPU, system and
calibration (the same objects) instead of making them again.

A schedule search (:mod:`ovsim.tune`) builds hundreds of workloads that differ only in knobs: a
channel count changes the plans of the collectives and nothing else, a carve-out or an occupancy
padding the kernels' demands and nothing else. Each build already prices a kernel once however
many ops run it (:func:`ovsim.models.workload.build_workload`); this carries those prices from one
build to the next. A demand depends on the kernel's spec, the GPU, the calibration's parameters,
the carve-out and the occupancy padding (``workload._kernel_demand`` reads nothing else), so demands
are shared by those; a plan depends on its collective, the GPU and the system
(``nccl.plan_collective``'s key holds the rest). The objects a memo was made for are held while it
lives, so that their identities stay theirs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from ovsim.hw.calib import Parameters
from ovsim.hw.spec import GpuSpec, SystemSpec
from ovsim.models.ir import KernelDemand
from ovsim.models.nccl import CollectivePlan
from ovsim.models.op_specs import Knobs

# Demands by the spec's key (workload._shared_info), plans by nccl.plan_collective's key.
Demands = dict[tuple[object, ...], KernelDemand]
Plans = dict[tuple[object, ...], CollectivePlan]


@dataclass
class _Memo:
    # Every object whose identity keys an entry, by that identity.
    held: dict[int, object] = field(default_factory=dict)
    demands: dict[tuple[object, ...], Demands] = field(default_factory=dict)
    plans: dict[tuple[int, int], Plans] = field(default_factory=dict)

    def trimmed(self) -> _Memo:
        """This memo, emptied first where it holds more than ``MEMO_MAX_ENTRIES``."""
        n = sum(map(len, self.demands.values())) + sum(map(len, self.plans.values()))
        if n > MEMO_MAX_ENTRIES:
            self.held.clear()
            self.demands.clear()
            self.plans.clear()
        return self

    def hold(self, *objs: object) -> tuple[int, ...]:
        for o in objs:
            self.held.setdefault(id(o), o)
        return tuple(id(o) for o in objs)


_MEMO: ContextVar[_Memo | None] = ContextVar("_MEMO", default=None)
# A memo holding more demands and plans than this is emptied before the next build takes from it:
# a sweep over kernel shapes adds new ones with every build (about a kilobyte each).
MEMO_MAX_ENTRIES = 200_000


@contextlib.contextmanager
def reusing_builds() -> Iterator[None]:
    """Within it, builds share kernel demands and NCCL plans (module docstring); released on
    leaving. Nested, the outer memo serves."""
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
