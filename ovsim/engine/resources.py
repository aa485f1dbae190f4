"""Resources that kernels use beside HBM: the rate solver's registry.

The rate solver (:mod:`ovsim.engine.rates`) shares each GPU's HBM among its kernels and the flows
moving data, and the links among the flows. A further per-GPU resource that kernels load (an L2's
or a crossbar's bandwidth, say) is a :class:`KernelResource` in ``MachineModel.kernel_resources``:
a capacity per GPU and, per kernel, the bytes of it each HBM byte the kernel moves costs. The solver
then shares it with the same weighted max-min as HBM, and the engine counts its load as the counter
``<name>_bytes_per_s``; nothing else changes. A kernel that moves no HBM bytes does not use it, and
a kernel held back by one is charged to ``share_hbm_s`` (the memory system's share), as HBM is.

A resource that flows cross (a port, a switch, a NIC) is not registered here: it is a capacity in
``MachineModel.links`` under its own key, and the key with its bytes per flow byte in
:func:`ovsim.engine.routing.flow_usage`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ovsim.engine.machine import GpuModel
    from ovsim.models.ir import KernelDemand


# Names the engine's own channels and counters use (HBM, the links' kinds, the link counter).
RESERVED = frozenset({"hbm", "link", "egress", "ingress", "pcie_out", "pcie_in", "nic_out", "nic_in", "link_out"})


@dataclass(frozen=True)
class KernelResource:
    """A per-GPU resource that kernels load in proportion to their HBM traffic.

    ``name`` keys its channel, ``(name, rank)``, and its counter ``<name>_bytes_per_s``; it may not
    be one of the engine's own (``RESERVED``). ``bytes_per_s`` gives its capacity on a GPU (asked at
    every solve); ``per_hbm_byte`` the bytes of it one HBM byte of a kernel costs, 0 where the
    kernel does not use it (asked once per kernel). Neither may change during a run."""

    name: str
    bytes_per_s: Callable[[GpuModel], float]
    per_hbm_byte: Callable[[KernelDemand], float]

    def __post_init__(self) -> None:
        if not self.name or self.name in RESERVED:
            raise ValueError(f"a kernel resource needs a name of its own, not one of {sorted(RESERVED)}: "
                             f"got {self.name!r}")


def check_resources(resources: tuple[KernelResource, ...]) -> None:
    """Raise where two resources share a name (they would share one channel)."""
    names = [r.name for r in resources]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"kernel resource '{dup[0]}' is registered twice")
