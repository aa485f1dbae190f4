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


@dataclass(frozen=True)
class KernelResource:
    """A per-GPU resource that kernels load in proportion to their HBM traffic.

    ``name`` keys its channel, ``(name, rank)``, and its counter; it may not be ``"hbm"``.
    ``bytes_per_s`` gives its capacity on a GPU; ``per_hbm_byte`` the bytes of it one HBM byte of a
    kernel costs (0: the kernel does not use it). Both are called once per GPU or kernel and must
    not change during a run."""

    name: str
    bytes_per_s: Callable[[GpuModel], float]
    per_hbm_byte: Callable[[KernelDemand], float]

    def __post_init__(self) -> None:
        if not self.name or self.name == "hbm":
            raise ValueError(f"a kernel resource needs a name other than 'hbm', got {self.name!r}")
