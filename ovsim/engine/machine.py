"""The contended resources of a node, as numbers the engine works with."""

from __future__ import annotations

from dataclasses import dataclass, field

from ovsim.engine.resources import KernelResource, check_resources
from ovsim.errors import OvsimError
from ovsim.hw.calib import Parameters, collective_pressure
from ovsim.hw.spec import GpuSpec, SystemSpec

# ("egress"|"ingress"|"link"|"pcie_out"|"pcie_in"|"nic_out"|"nic_in", a, b)
LinkKey = tuple[str, int, int]


@dataclass(frozen=True)
class GpuModel:
    sm_count: int
    threads_per_sm: int
    registers_per_sm: int
    shared_mem_per_sm_bytes: int
    blocks_per_sm: int
    # SMs kept free of compute kernels (an SM carve-out for communication).
    comm_reserved_sms: int
    hbm_bytes_per_s: float
    copy_engines: int
    # The HBM peak, the scale of the latency law's utilizations (hbm_bytes_per_s is what any mix
    # of traffic can reach).
    hbm_peak_bytes_per_s: float = 0.0
    warp_size: int = 32
    register_alloc_unit: int = 256
    reserved_smem_per_block_bytes: int = 1024
    # SMs of each cluster placement unit, and the unit each successive block of a plain launch on
    # an idle GPU lands in (PlacementSpec); empty where the GPU's placement is not known.
    unit_sms: tuple[int, ...] = ()
    fill_units: tuple[int, ...] = ()

    def stranded_sms(self, held: int, cluster: int) -> int:
        """Free SMs no whole cluster of ``cluster`` CTAs fits on beside ``held`` SMs another kernel
        holds, its blocks placed as a plain launch on an idle GPU places them: in each unit, the
        free SMs beyond a multiple of the cluster. 0 where the placement is not known."""
        if cluster <= 1 or not self.unit_sms:
            return 0
        free = list(self.unit_sms)
        for u in self.fill_units[:max(0, held)]:
            free[u] -= 1
        return sum(f % cluster for f in free)


@dataclass(frozen=True)
class MachineModel:
    gpus: tuple[GpuModel, ...]
    topology: str
    links: dict[LinkKey, float]
    nccl_issue_fraction: float
    hbm_mix_efficiency: float
    # Share of a GPU's HBM channel a resident SM collective keeps busy beyond its data (flag polling,
    # L2 and crossbar traffic), per NCCL protocol ("default" for any other), and its weight there.
    nccl_memory_pressure: dict[str, float] = field(default_factory=dict)
    nccl_hbm_weight: dict[str, float] = field(default_factory=dict)
    # HBM's loaded-latency law (capacity as a multiple of the peak, 0: none; exponent) and the
    # share of their time alone that SM collectives and memory-bound kernels (by kind: 1 - the
    # clock share) wait on memory (Parameters.hbm_latency_*).
    hbm_latency_capacity: float = 0.0
    hbm_latency_exponent: float = 1.0
    collective_memory_wait: float = 0.5
    memory_clock_share: dict[str, float] = field(default_factory=dict)
    # Parameters.copy_engine_hbm_weight: under 1, copy-engine flows yield HBM to kernels.
    copy_engine_hbm_weight: float = 1.0
    # Ranks per node (rank r is on node r // gpus_per_node) or, under rank symmetry, each simulated
    # rank's node; and each rank's network port: the ("nic_out"|"nic_in", port, -1) link, its own
    # NICs or a NIC it shares (SystemSpec.nic_port_of).
    gpus_per_node: int = 1 << 30
    rank_nodes: tuple[int, ...] = ()
    nic_ports: tuple[int, ...] = ()
    # Each port's lowest simulated rank: the GPU that stands for the port where flows are coupled
    # (a port's number is not a rank's: under rank symmetry, or where GPUs share NICs).
    nic_hubs: dict[int, int] = field(default_factory=dict)
    # Resources kernels use beside HBM (ovsim.engine.resources), each shared like HBM.
    kernel_resources: tuple[KernelResource, ...] = ()

    def __post_init__(self) -> None:
        check_resources(self.kernel_resources)

    def node_of(self, rank: int) -> int:
        return self.rank_nodes[rank] if self.rank_nodes else rank // self.gpus_per_node

    def nic_port(self, rank: int) -> int:
        return self.nic_ports[rank] if self.nic_ports else rank

    def pressure_of(self, protocol: str) -> tuple[float, float]:
        """(share of HBM capacity, max-min weight) of a resident collective of ``protocol``."""
        return collective_pressure(self.nccl_memory_pressure, self.nccl_hbm_weight, protocol)

    @property
    def n_ranks(self) -> int:
        return len(self.gpus)


def gpu_model(gpu: GpuSpec, params: Parameters, sm_carveout: int = 0) -> GpuModel:
    """The model of one GPU of ``gpu``'s kind under ``params``, with ``sm_carveout`` SMs reserved
    for communication (every rank of a machine has it)."""
    if not 0 <= sm_carveout < gpu.sm.count:
        raise OvsimError(f"carve-out of {sm_carveout} SMs on a {gpu.sm.count}-SM GPU", field="sm_carveout")
    return GpuModel(
        sm_count=gpu.sm.count,
        threads_per_sm=gpu.sm.max_threads_per_sm,
        registers_per_sm=gpu.sm.registers_per_sm,
        shared_mem_per_sm_bytes=gpu.sm.shared_mem_per_sm_bytes,
        blocks_per_sm=gpu.sm.max_blocks_per_sm,
        comm_reserved_sms=sm_carveout,
        hbm_bytes_per_s=gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction,
        copy_engines=gpu.copy_engines.count,
        hbm_peak_bytes_per_s=gpu.memory.bandwidth_bytes_per_s,
        warp_size=gpu.sm.warp_size,
        register_alloc_unit=gpu.sm.register_alloc_unit,
        reserved_smem_per_block_bytes=gpu.sm.reserved_shared_mem_per_block_bytes,
        unit_sms=gpu.sm.placement.unit_sms() if gpu.sm.placement else (),
        fill_units=gpu.sm.placement.plain_fill() if gpu.sm.placement else (),
    )


def build_machine(
    system: SystemSpec, gpu: GpuSpec, params: Parameters, *, n_ranks: int | None = None, sm_carveout: int = 0,
    job_ranks: tuple[int, ...] = (),
) -> MachineModel:
    """The machine of ranks 0..n_ranks-1; ``job_ranks``: the system's GPU each one is (rank
    symmetry simulates some of a job's ranks; empty: the same number)."""
    ranks = n_ranks if n_ranks is not None else system.total_gpus
    if not 1 <= ranks <= system.total_gpus:
        raise OvsimError(f"{ranks} ranks on a {system.total_gpus}-GPU system", field="ranks")
    where = job_ranks or tuple(range(ranks))
    if len(where) != ranks or not all(0 <= r < system.total_gpus for r in where):
        raise OvsimError(f"{ranks} ranks placed off the {system.total_gpus}-GPU system", field="ranks")
    g = gpu_model(gpu, params, sm_carveout)
    links: dict[LinkKey, float] = {}
    pcie = gpu.pcie.bandwidth_bytes_per_s
    nic = system.nic_port_bytes_per_s
    for r in range(ranks):
        links[("pcie_out", r, -1)] = pcie
        links[("pcie_in", r, -1)] = pcie
        if nic > 0:
            links[("nic_out", system.nic_port_of(where[r]), -1)] = nic
            links[("nic_in", system.nic_port_of(where[r]), -1)] = nic
        if system.topology == "nvswitch":
            links[("egress", r, -1)] = gpu.links.bandwidth_bytes_per_s
            links[("ingress", r, -1)] = gpu.links.bandwidth_bytes_per_s
        elif system.topology == "pcie":
            links[("egress", r, -1)] = pcie
            links[("ingress", r, -1)] = pcie
        else:
            per_pair = system.links_per_pair * gpu.links.bandwidth_per_link_bytes_per_s
            for s in range(ranks):
                if s != r and system.node_of(where[s]) == system.node_of(where[r]):
                    links[("link", r, s)] = per_pair
    ports = tuple(system.nic_port_of(r) for r in where)
    return MachineModel(
        gpus=tuple(g for _ in range(ranks)),
        topology=system.topology,
        links=links,
        nccl_issue_fraction=params.nccl_issue_fraction,
        hbm_mix_efficiency=params.hbm_mix_efficiency,
        nccl_memory_pressure=dict(params.nccl_memory_pressure),
        nccl_hbm_weight=dict(params.nccl_hbm_weight),
        hbm_latency_capacity=params.hbm_latency_capacity,
        hbm_latency_exponent=params.hbm_latency_exponent,
        collective_memory_wait=params.hbm_latency_collective_wait,
        memory_clock_share=dict(params.memory_kind_clock_share),
        copy_engine_hbm_weight=params.copy_engine_hbm_weight,
        gpus_per_node=system.gpu_count,
        rank_nodes=tuple(system.node_of(r) for r in where) if job_ranks else (),
        nic_ports=ports,
        nic_hubs={port: r for r, port in reversed(list(enumerate(ports)))},
    )
