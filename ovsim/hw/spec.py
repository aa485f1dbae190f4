"""GPU and system specifications, loaded from YAML files.

One YAML file describes one GPU part (``specs/gpus/<name>.yaml``) or one system
(``specs/systems/<name>.yaml``). Specs hold only published or measured hardware facts, each with
its source; efficiency factors and contention weights belong to calibration files (see
:mod:`ovsim.hw.calib`). A user adds a part by writing one more YAML file, either in the package's
spec folders or in a folder named by the ``OVSIM_SPEC_PATH`` environment variable (``:``-separated),
or by giving a scenario the file's path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from ovsim.errors import OvsimError
from ovsim.hw.inputs import InputModel
from ovsim.hw.validation import validation_error

SPEC_DIR = Path(__file__).parent / "specs"

Precision = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"]

# Attention kernels known by name, each priced at its authors' published efficiency on the GPUs
# they give one for (calib.Parameters.attention_impl_efficiency): FlashAttention (Dao et al.,
# 2022) and FlashAttention-2 (Dao, 2023). Both run in 16 bits.
AttentionImplementation = Literal["flash1", "flash2"]


class Spec(InputModel):
    """Frozen, and unknown keys are errors: a typo in a spec file must fail loudly. No number is
    .nan or .inf: either would flow into every time computed from it."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class PlacementSpec(Spec):
    """Where the block scheduler puts blocks, as far as thread-block clusters care.

    A cluster's CTAs run at once on SMs of one placement unit (a GPC), so SMs another kernel holds
    can leave a unit with free SMs no whole cluster fits on. ``unit_tpcs`` gives each unit's TPCs
    (two SMs each, SM 2k and 2k+1). A kernel launched plainly on an idle GPU fills the units tier by
    tier (``fill_tiers``, lists of unit indices): within a tier, one SM of each TPC round-robin over
    the tier's units, then the TPCs' second SMs the same way."""

    unit_tpcs: list[PositiveInt]
    fill_tiers: list[list[NonNegativeInt]]
    sms_per_tpc: PositiveInt = 2

    @model_validator(mode="after")
    def _tiers_cover_units(self) -> PlacementSpec:
        named = sorted(u for tier in self.fill_tiers for u in tier)
        if named != list(range(len(self.unit_tpcs))):
            raise ValueError(f"fill_tiers must name each of the {len(self.unit_tpcs)} units once")
        return self

    def unit_sms(self) -> tuple[int, ...]:
        return tuple(t * self.sms_per_tpc for t in self.unit_tpcs)

    def plain_fill(self) -> tuple[int, ...]:
        """The unit of each successive block of a kernel launched plainly on an idle GPU, one block
        per SM, until every SM has one."""
        order: list[int] = []
        for tier in self.fill_tiers:
            for _ in range(self.sms_per_tpc):
                left = {u: self.unit_tpcs[u] for u in tier}
                while any(left.values()):
                    for u in tier:
                        if left[u]:
                            left[u] -= 1
                            order.append(u)
        return tuple(order)


class SmSpec(Spec):
    """Streaming multiprocessors (compute units on AMD) and the per-SM residency limits."""

    count: PositiveInt
    max_threads_per_sm: PositiveInt
    max_blocks_per_sm: PositiveInt
    max_threads_per_block: PositiveInt = 1024
    registers_per_sm: PositiveInt
    max_registers_per_thread: PositiveInt = 255
    # Registers are allocated per warp in units of this many registers (CUDA occupancy calculator).
    register_alloc_unit: PositiveInt = 256
    shared_mem_per_sm_bytes: PositiveInt
    max_shared_mem_per_block_bytes: PositiveInt
    # The runtime reserves this much shared memory per resident block (1 KiB from sm80 on).
    reserved_shared_mem_per_block_bytes: NonNegativeInt = 1024
    warp_size: PositiveInt = 32
    # Cluster placement units (measured; None: not known, clusters placed as plain blocks).
    placement: PlacementSpec | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SmSpec:
        if self.placement is not None:
            sms = sum(self.placement.unit_sms())
            if sms != self.count:
                raise ValueError(f"placement units hold {sms} SMs, not the {self.count} of count")
        if self.max_shared_mem_per_block_bytes > self.shared_mem_per_sm_bytes:
            raise ValueError("max_shared_mem_per_block_bytes exceeds shared_mem_per_sm_bytes")
        if self.max_threads_per_block > self.max_threads_per_sm:
            raise ValueError("max_threads_per_block exceeds max_threads_per_sm")
        return self


class ClockSpec(Spec):
    # The SM clock at which the published peak rates are reached.
    compute_clock_hz: PositiveFloat
    max_sm_clock_hz: PositiveFloat
    min_sm_clock_hz: PositiveFloat

    @model_validator(mode="after")
    def _ordered(self) -> ClockSpec:
        if not self.min_sm_clock_hz <= self.compute_clock_hz <= self.max_sm_clock_hz:
            raise ValueError("need min_sm_clock_hz <= compute_clock_hz <= max_sm_clock_hz")
        return self


class ComputeSpec(Spec):
    """Dense peak math rates (no structured sparsity) at ``compute_clock_hz``."""

    peak_flops_per_s: dict[Precision, PositiveFloat]
    # Which precisions run on tensor cores (matrix cores on AMD).
    tensor_precisions: list[Precision] = Field(default_factory=list)

    @model_validator(mode="after")
    def _has_fp32(self) -> ComputeSpec:
        if "fp32" not in self.peak_flops_per_s:
            raise ValueError("peak_flops_per_s must give fp32")
        return self


class MemorySpec(Spec):
    kind: str
    capacity_bytes: PositiveFloat
    bandwidth_bytes_per_s: PositiveFloat
    l2_bytes: PositiveFloat


class CopyEngineSpec(Spec):
    # CUDA's asyncEngineCount (concurrent copy queues), not the physical engine count.
    count: PositiveInt


class LinkSpec(Spec):
    """GPU-to-GPU links; bandwidths are per direction."""

    kind: Literal["nvlink", "xgmi", "none"]
    count: NonNegativeInt
    bandwidth_per_link_bytes_per_s: float = Field(ge=0)
    # The most GPUs of this part one NVLink/xGMI domain (a switched or meshed node) has held in a
    # product; a system that puts more in one domain is refused. None: not checked.
    max_domain_gpus: PositiveInt | None = None

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Total GPU-to-GPU bandwidth per direction."""
        return self.count * self.bandwidth_per_link_bytes_per_s


class PcieSpec(Spec):
    generation: PositiveInt
    lanes: PositiveInt
    # Per direction, theoretical.
    bandwidth_bytes_per_s: PositiveFloat


class PowerSpec(Spec):
    tdp_w: PositiveFloat
    min_power_limit_w: PositiveFloat
    idle_w: PositiveFloat

    @model_validator(mode="after")
    def _ordered(self) -> PowerSpec:
        if not self.idle_w < self.min_power_limit_w <= self.tdp_w:
            raise ValueError("need idle_w < min_power_limit_w <= tdp_w")
        return self


GPU_SECTIONS = ("sm", "clocks", "compute", "memory", "copy_engines", "links", "pcie", "power")


class GpuSpec(Spec):
    """One GPU device as the CUDA/HIP runtime sees it (an MI250X GCD is one device)."""

    schema_id: Literal["ovsim.gpu/1"] = Field(alias="schema")
    name: str
    aliases: list[str] = Field(default_factory=list)
    vendor: Literal["nvidia", "amd"]
    # Compute capability as "sm80"/"sm90"/..., or the AMD gfx target.
    architecture: str
    sm: SmSpec
    clocks: ClockSpec
    compute: ComputeSpec
    memory: MemorySpec
    copy_engines: CopyEngineSpec
    links: LinkSpec
    pcie: PcieSpec
    power: PowerSpec
    # Where every number came from: one entry per section above, more are welcome.
    sources: dict[str, str]

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _every_section_sourced(self) -> GpuSpec:
        missing = [s for s in GPU_SECTIONS if not self.sources.get(s, "").strip()]
        if missing:
            raise ValueError(f"sources must cite every section; missing {', '.join(missing)}")
        return self

    @property
    def compute_capability(self) -> int | None:
        """The NVIDIA compute capability of an "smNN" architecture (80, 90, 100; "sm90a" is 90);
        None for others."""
        digits = "".join(ch for ch in self.architecture if ch.isdigit())
        return int(digits) if self.architecture.startswith("sm") and digits else None

    def peak_flops_per_s(self, precision: str) -> float:
        """Peak dense rate for `precision` at the compute clock."""
        try:
            return self.compute.peak_flops_per_s[precision]  # type: ignore[index]
        except KeyError:
            known = ", ".join(sorted(self.compute.peak_flops_per_s))
            raise OvsimError(
                f"{self.name} has no {precision} rate (known: {known})", field="precision"
            ) from None


Topology = Literal["nvswitch", "mesh", "pcie"]


class NetworkSpec(Spec):
    """The NICs that join a system's nodes, through a non-blocking (full-bisection) fabric.

    Bandwidth is per NIC and direction, at the line rate (400 Gb/s NDR InfiniBand: 50e9). Each GPU
    sends through the NICs nearest it, so a GPU's share of the network is ``nics_per_node x
    bandwidth / gpus per node`` (rail-optimised HGX nodes have one NIC per GPU).
    """

    kind: Literal["infiniband", "roce", "ethernet"]
    nics_per_node: PositiveInt
    bandwidth_per_nic_bytes_per_s: PositiveFloat


class SystemSpec(Spec):
    """``nodes`` identical nodes, each of ``gpu_count`` identical GPUs, and how they are connected.

    Within a node: ``nvswitch``: every GPU has one port into a non-blocking switch; a transfer from
    a to b uses a's egress and b's ingress. ``mesh``: direct links between every pair
    (links_per_pair of the GPU's links each). ``pcie``: GPUs talk through PCIe only. Between nodes:
    the ``network``'s NICs. Rank r lives on node r // gpu_count.
    """

    schema_id: Literal["ovsim.system/1"] = Field(alias="schema")
    name: str
    description: str = ""
    gpu: str
    # GPUs per node.
    gpu_count: PositiveInt
    topology: Topology
    links_per_pair: NonNegativeInt = 0
    # NCCL's default number of ring channels for collectives on this node, where published.
    nccl_ring_channels: PositiveInt | None = None
    nvls: bool = False
    nodes: PositiveInt = 1
    network: NetworkSpec | None = None
    sources: dict[str, str]

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _topology_fields(self) -> SystemSpec:
        if self.topology == "mesh" and self.links_per_pair == 0:
            raise ValueError("a mesh topology needs links_per_pair")
        if self.nodes > 1 and self.network is None:
            raise ValueError(f"{self.nodes} nodes need a network (nics_per_node, bandwidth_per_nic_bytes_per_s)")
        if not self.sources:
            raise ValueError("sources must cite the system's topology")
        return self

    @property
    def total_gpus(self) -> int:
        return self.gpu_count * self.nodes

    def node_of(self, rank: int) -> int:
        return rank // self.gpu_count

    @property
    def nic_bytes_per_s_per_gpu(self) -> float:
        """A GPU's share of its node's NICs, per direction (0 on one node without a network)."""
        if self.network is None:
            return 0.0
        return self.network.nics_per_node * self.network.bandwidth_per_nic_bytes_per_s / self.gpu_count

    @property
    def _gpus_share_nics(self) -> bool:
        return self.network is not None and self.network.nics_per_node < self.gpu_count

    def nic_port_of(self, rank: int) -> int:
        """The network port a rank's traffic leaves by: its own NICs where each GPU has at least
        one, else the NIC it shares with its neighbours on the node (GPUs split evenly over NICs)."""
        if self.network is None or not self._gpus_share_nics:
            return rank
        nics = self.network.nics_per_node
        return self.node_of(rank) * nics + (rank % self.gpu_count) * nics // self.gpu_count

    @property
    def nic_port_bytes_per_s(self) -> float:
        """One port's bandwidth per direction: a shared NIC's line rate, or a GPU's own NICs."""
        if self.network is None:
            return 0.0
        if self._gpus_share_nics:
            return self.network.bandwidth_per_nic_bytes_per_s
        return self.nic_bytes_per_s_per_gpu

    def nics_under(self, ranks: Sequence[int]) -> float:
        """NICs that carry these ranks' traffic, counted in NICs' worth of bandwidth."""
        if self.network is None:
            return 0.0
        if self._gpus_share_nics:
            return float(len({self.nic_port_of(r) for r in ranks}))
        return len(ranks) * self.network.nics_per_node / self.gpu_count


def check_domain(system: SystemSpec, gpu: GpuSpec) -> None:
    """Refuse a node that puts more GPUs in one NVLink/xGMI domain than any product of this GPU has."""
    most = gpu.links.max_domain_gpus
    if system.topology == "pcie" or most is None or system.gpu_count <= most:
        return
    raise OvsimError(
        f"{system.gpu_count} {gpu.name} GPUs in one {system.topology} domain: no {gpu.name} system joins more "
        f"than {most} by {gpu.links.kind}; describe the rest as nodes joined by a network "
        "(gpu_count per node, nodes, network)", field="gpu_count")


def _spec_dirs(kind: str) -> list[Path]:
    dirs = [SPEC_DIR / kind]
    for entry in os.environ.get("OVSIM_SPEC_PATH", "").split(os.pathsep):
        if entry:
            if not Path(entry).is_dir():
                # A mistyped folder would otherwise be skipped, and the user's part reported unknown.
                raise OvsimError(f"'{entry}' is not a folder", source="environment", field="OVSIM_SPEC_PATH")
            dirs.extend([Path(entry), Path(entry) / kind])
    return dirs


_SCHEMA_IDS = {"gpus": "ovsim.gpu/1", "systems": "ovsim.system/1"}


def _yaml_files(kind: str) -> Iterator[Path]:
    for d in _spec_dirs(kind):
        if d.is_dir():
            for path in sorted(d.glob("*.yaml")):
                # A flat OVSIM_SPEC_PATH folder holds both kinds: there the `schema` line decides (a file
                # with an unknown schema is kept, so that loading it reports the error).
                if d.name == kind or _schema_of(path) in (_SCHEMA_IDS[kind], None):
                    yield path


def _schema_of(path: Path) -> str | None:
    """The file's spec schema id if it is one ovsim knows, else None."""
    data = read_yaml(path)
    schema = data.get("schema") if isinstance(data, dict) else None
    return schema if schema in _SCHEMA_IDS.values() else None


# libyaml's parser where PyYAML was built with it: the same safe constructors, several times faster
# on the spec and calibration files every run reads.
_BASE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE_LOADER):  # type: ignore[misc]
    """The safe loader, stricter where YAML 1.1 surprises people: a key given twice in one mapping
    is an error (YAML 1.1 keeps the last silently), and ``8e3`` or ``1e-6`` is a number (YAML 1.1
    wants a dot and a signed exponent, so it read them as text, and a count of ``8e3`` failed)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key '{key}' is given twice",
                                                            key_node.start_mark)
                seen.add(key)
            except TypeError:
                pass  # an unhashable key: the base constructor reports it
        return super().construct_mapping(node, deep)  # type: ignore[no-any-return]


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))
_YAML_LOADER: Any = _Loader


def read_yaml(path: Path) -> object:
    """Parse a YAML file; a missing file or a syntax error becomes a one-line OvsimError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OvsimError("file not found", source=str(path)) from None
    except OSError as e:
        raise OvsimError(f"cannot read: {e.strerror}", source=str(path)) from None
    except UnicodeDecodeError as e:
        if e.object[:2] == b"\x1f\x8b":
            raise OvsimError("gzip-compressed, not a YAML file; a trace is replayed with `ovsim replay`",
                             source=str(path)) from None
        raise OvsimError(f"not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); is it a YAML file?",
                         source=str(path)) from None
    try:
        return yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise OvsimError(f"YAML error: {problem}", source=str(path), field=where) from None


def _load(path: Path, model: type[Spec]) -> Spec:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise OvsimError("expected a mapping at the top level", source=str(path))
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e, str(path)) from None


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


@cache
def _index(kind: str, spec_path_env: str) -> dict[str, Path]:
    index: dict[str, Path] = {}
    for path in _yaml_files(kind):
        index.setdefault(_norm(path.stem), path)
        data = read_yaml(path)
        if isinstance(data, dict):
            for alias in [data.get("name", ""), *(data.get("aliases") or [])]:
                if isinstance(alias, str) and alias:
                    index.setdefault(_norm(alias), path)
    return index


def _find(kind: str, name: str) -> Path:
    if name.endswith((".yaml", ".yml")):
        return Path(name)
    index = _index(kind, os.environ.get("OVSIM_SPEC_PATH", ""))
    key = _norm(name)
    if key in index:
        return index[key]
    known = ", ".join(sorted({p.stem for p in index.values()}))
    raise OvsimError(f"unknown {kind[:-1]} '{name}' (known: {known})", field=kind[:-1])


@cache
def _load_gpu_path(path: Path) -> GpuSpec:
    spec = _load(path, GpuSpec)
    assert isinstance(spec, GpuSpec)
    return spec


@cache
def _load_system_path(path: Path) -> SystemSpec:
    spec = _load(path, SystemSpec)
    assert isinstance(spec, SystemSpec)
    return spec


def gpu_file(name: str) -> Path:
    """The YAML file that defines GPU `name` (its stem keys the GPU's calibration files)."""
    return _find("gpus", name)


def load_gpu(name: str) -> GpuSpec:
    """The GPU spec called `name` (file stem, name or alias, case- and punctuation-blind), or a path."""
    return _load_gpu_path(_find("gpus", name))


def load_system(name: str) -> SystemSpec:
    """The system spec called `name`, or the one at a path."""
    return _load_system_path(_find("systems", name))


def known_gpus() -> list[str]:
    return sorted({p.stem for p in _yaml_files("gpus")})


def known_systems() -> list[str]:
    return sorted({p.stem for p in _yaml_files("systems")})
