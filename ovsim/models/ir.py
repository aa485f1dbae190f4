"""The resolved workload the engine runs: per-rank ops with their resource demands.

Cost functions (:mod:`ovsim.models.cost`) turn user-level ops (a GEMM shape, an all-reduce size)
into these records; the engine never sees a GEMM shape, only blocks, work and bytes. Every record is
frozen: schedules derive new graphs instead of editing old ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Literal

from ovsim.errors import OvsimError

if TYPE_CHECKING:
    import networkx as nx

KernelKind = Literal[
    "gemm", "attention", "elementwise", "norm", "softmax", "generic", "collective", "transfer", "delay"
]
Partition = Literal["any", "compute", "comm"]


@dataclass(frozen=True)
class BlockShape:
    """What one thread block asks of an SM."""

    threads: int
    registers_per_thread: int
    shared_mem_bytes: int


@dataclass(frozen=True)
class KernelDemand:
    """A kernel's grid and the work of one block, as the cost model priced it.

    One block alone at the kernel's own full residency takes ``block_time_s``; blocks of the kernel
    packed as tightly as the SM limits allow exactly fill the SM's issue throughput, so
    ``issue_fraction`` (the share of an SM one block uses) is ``intensity / blocks_per_sm``.
    """

    blocks: int
    block: BlockShape
    block_time_s: float
    issue_fraction: float
    hbm_bytes: float
    flops: float
    isolated_s: float
    # Compute-bound work slows with the SM clock; memory- and link-bound work does not.
    clock_sensitive: bool = True
    # The most of an SM one block uses when it has room to (fewer blocks of its kernel on the SM):
    # block_time_s is its time at issue_fraction, faster in proportion above it. None: issue_fraction.
    issue_cap: float | None = None
    # The most HBM bandwidth the kernel takes, whatever its blocks could pull. A memory-bound
    # kernel's blocks could move data faster than HBM lets all of them (memory_sm_headroom), so it
    # keeps its bandwidth on fewer SMs; infinite for a kernel whose blocks' pace sets its traffic.
    hbm_cap_bytes_per_s: float = float("inf")
    # The share of its time alone the kernel waits on memory, for HBM's latency law. None: from
    # its kind (RateSolver.memory_wait).
    memory_wait: float | None = None
    # The SM clock (a fraction of the compute clock) above which the kernel stops speeding up: a
    # GEMM of one's own whose tile reads from L2 bind there (cost.gemm's two rooflines meet). None:
    # its precision's, from the power model.
    saturation_clock_fraction: float | None = None
    # A persistent kernel (cuBLAS's Hopper GEMMs): this many blocks (CTAs, one wave) loop over the
    # ``blocks`` output tiles, which the engine runs as blocks of their own. A CTA that finds no
    # SM at launch runs its first tile only after the resident CTAs have run all the others
    # (dispatch.place); 0: an ordinary kernel, one block per tile.
    persistent_ctas: int = 0
    # CTAs per thread-block cluster (Hopper's cuBLAS GEMMs: 2). A cluster runs on SMs of one
    # placement unit, so beside SMs another kernel holds some free SMs may take none of its blocks
    # (dispatch.cluster_room).
    cluster_ctas: int = 1
    # The share of a block's time at full residency that goes with the fraction of the GPU's SMs
    # running blocks of such kernels (GEMM tiles loading through the shared memory system,
    # ``Parameters.gemm_load_share``): with blocks on fewer SMs each runs
    # 1 / (1 - load_share * (1 - fraction)) times faster. 0: its pace is its SM's alone. Only a
    # kernel of one block per SM keeps it (measured on those: cuBLAS's Hopper GEMMs).
    load_share: float = 0.0


# Not slots=True: FlowDemand.renamed and power_analytic._flow_key read its fields from __dict__.
@dataclass(frozen=True)
class FlowDemand:
    """Data movement shared by the ranks of one collective or copy.

    It moves ``bytes`` (bus bytes for a collective) after every member has arrived and a fixed
    ``latency_s`` has passed, at no more than ``rate_cap_bytes_per_s``. Per byte it uses
    ``link_coeff`` bytes of each member's link port (each direction) and ``hbm_coeff`` bytes of each
    member's HBM, with weight ``hbm_weight`` in HBM's max-min share.
    """

    group: str
    ranks: tuple[int, ...]
    bytes: float
    latency_s: float
    rate_cap_bytes_per_s: float
    link_coeff: float
    hbm_coeff: float
    hbm_weight: float = 1.0
    pattern: Literal["ring", "all_pairs", "p2p", "local", "host"] = "ring"
    # Flows on copy engines hold one engine per member; SM-based collectives hold their blocks.
    uses_copy_engine: bool = False
    # (src, dst) ranks for p2p; -1 stands for the host.
    endpoints: tuple[int, int] | None = None
    protocol: str = ""
    # Across nodes: bytes through each member's NICs per flow byte, link_coeff then being its
    # NVLink bytes. None: the pattern's share of link_coeff (ring 1/m, all-pairs (n - m)/(n - 1)).
    net_coeff: float | None = None
    # Members of the whole communicator where only some are simulated (rank symmetry); 0: len(ranks).
    group_size: int = 0

    @property
    def isolated_s(self) -> float:
        """Its time alone: the latency, then its bytes at its rate cap."""
        return self.latency_s + (self.bytes / self.rate_cap_bytes_per_s if self.bytes > 0 else 0.0)

    def renamed(self, group: str) -> FlowDemand:
        """This flow under another group name. A training iteration names 100,000s of collectives
        that differ only in their names: the copy takes this one's fields as they are, at a third
        of ``dataclasses.replace``'s cost. (It and ``power_analytic._flow_key`` read the fields
        from ``__dict__``: a FlowDemand keeps one, so not ``slots=True``.)"""
        flow = object.__new__(type(self))
        flow.__dict__.update(self.__dict__)
        flow.__dict__["group"] = group
        return flow


@dataclass(frozen=True, slots=True)
class Op:
    """One launch on one rank's stream."""

    id: str
    name: str
    kind: KernelKind
    rank: int
    stream: str
    deps: tuple[str, ...] = ()
    # Host-side gap between the op becoming ready and its launch (CPU launch overhead, replay gaps).
    delay_s: float = 0.0
    kernel: KernelDemand | None = None
    flow: FlowDemand | None = None
    partition: Partition = "any"
    # What the op was made from (shape, size, algorithm...), for reports.
    info: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def isolated_s(self) -> float:
        if self.kind == "delay":
            return self.delay_s
        if self.flow is not None:
            return self.flow.isolated_s
        assert self.kernel is not None
        return self.kernel.isolated_s


_new_object = object.__new__
# Each field's slot, set through its own descriptor: object.__setattr__ would look each up by
# name, and the frozen dataclass's __init__ goes through that for every field.
(_set_id, _set_name, _set_kind, _set_rank, _set_stream, _set_deps, _set_delay_s, _set_kernel, _set_flow,
 _set_partition, _set_info) = (Op.__dict__[f].__set__ for f in (
    "id", "name", "kind", "rank", "stream", "deps", "delay_s", "kernel", "flow", "partition", "info"))


def new_op(id: str, name: str, kind: KernelKind, rank: int, stream: str, deps: tuple[str, ...], delay_s: float,
           kernel: KernelDemand | None, flow: FlowDemand | None, partition: Partition,
           info: dict[str, object]) -> Op:
    """``Op(...)`` with every field given, made without the frozen dataclass's ``__init__`` (which
    sets each field through a checked call): the same op in 0.95 against 1.5 us, for a build that
    makes 100,000s of them. (A named tuple is made in 0.16 us, but its fields read about twice as
    slowly as slots, which Python specialises: the analytic passes gave the saving back.)"""
    op = _new_object(Op)
    _set_id(op, id)
    _set_name(op, name)
    _set_kind(op, kind)
    _set_rank(op, rank)
    _set_stream(op, stream)
    _set_deps(op, deps)
    _set_delay_s(op, delay_s)
    _set_kernel(op, kernel)
    _set_flow(op, flow)
    _set_partition(op, partition)
    _set_info(op, info)
    return op


def id_index(ops: Sequence[Op]) -> dict[str, int]:
    """Each op's place in ``ops`` by its id (the last, where an id repeats), made in C rather than
    by the interpreter's loop (a build and the analytic passes make it over a million ops)."""
    return dict(zip(map(_OP_ID, ops), range(len(ops)), strict=True))


_OP_ID = attrgetter("id")


@dataclass(frozen=True)
class StreamSpec:
    rank: int
    name: str
    # CUDA convention: a lower number is a higher priority.
    priority: int = 0


class Structure:
    """What workloads built of one op list share whatever the knobs (within
    ``build_memo.reusing_builds``): their ops' ids, dependencies, ranks, streams, launch delays and
    kinds of delay, and their collectives' members, are the same, in the same order. What the
    first of them found is kept for the next: the ops the list expands to (``n_ops``, -1: not
    counted yet), once a workload validated its ops' (rank, stream) pairs (``stream_pairs``), and
    what the analytic fidelity works out of the order (``plan``, ``engine.analytic.Plan``'s), and
    a digest of what the ops share (``digest``, ``tune_predictions``'). Not carried to another
    process."""

    __slots__ = ("digest", "n_ops", "plan", "stream_pairs")

    def __init__(self) -> None:
        self.n_ops = -1
        self.stream_pairs: list[tuple[int, str]] | None = None
        self.plan: object = None
        self.digest = b""

    def __reduce__(self) -> tuple[type[Structure], tuple[()]]:
        return Structure, ()


@dataclass(frozen=True)
class Workload:
    """Ops of every rank, in launch order per stream, with their streams."""

    ops: tuple[Op, ...]
    streams: tuple[StreamSpec, ...]
    # Ranks simulated, numbered 0..n_ranks-1 in ops, streams and flows.
    n_ranks: int
    # Rank symmetry (docs/design.md): the job's rank of each simulated one (empty: the same
    # number), and the offsets from it of the job's ranks it stands for, 0 (itself) first
    # (empty: itself alone). Op ids name the job's rank (``name@r{job rank}``).
    job_ranks: tuple[int, ...] = ()
    stand_offsets: tuple[int, ...] = ()
    # Shared with the workloads of the same structure (:class:`Structure`); None: none known. A
    # copy with other ops (``dataclasses.replace``) must leave it None.
    structure: Structure | None = field(default=None, compare=False, repr=False)

    @property
    def replicas(self) -> int:
        """Job ranks each simulated rank stands for (itself included)."""
        return len(self.stand_offsets) or 1

    @property
    def total_ranks(self) -> int:
        return self.n_ranks * self.replicas

    def job_rank(self, rank: int) -> int:
        """The job's rank of simulated rank ``rank``."""
        return self.job_ranks[rank] if self.job_ranks else rank

    @property
    def ranks_in_job(self) -> tuple[int, ...]:
        """The job's rank of each simulated rank, in order."""
        return self.job_ranks or tuple(range(self.n_ranks))

    def graph(self) -> nx.DiGraph:
        """Dependencies as a DAG: explicit deps plus stream order."""
        # Imported here: networkx costs every command a twentieth of a second at start, and only
        # this graph (a cycle's report, users' own analyses) needs it.
        import networkx as nx

        g = nx.DiGraph()
        last: dict[tuple[int, str], str] = {}
        for op in self.ops:
            g.add_node(op.id)
            key = (op.rank, op.stream)
            if key in last:
                g.add_edge(last[key], op.id)
            last[key] = op.id
            for d in op.deps:
                g.add_edge(d, op.id)
        return g

    def successors(self) -> list[list[int]]:
        """The same DAG as :meth:`graph` on op indices: each op's successors (an edge may repeat)."""
        index = id_index(self.ops)
        succ: list[list[int]] = [[] for _ in self.ops]
        last: dict[tuple[int, str], int] = {}
        for i, op in enumerate(self.ops):
            key = (op.rank, op.stream)
            p = last.get(key)
            if p is not None:
                succ[p].append(i)
            last[key] = i
            for d in op.deps:
                succ[index[d]].append(i)
        return succ

    def validate(self, source: str = "") -> None:
        """Reject unknown dependencies, cycles and collectives a member rank never joins."""
        index = id_index(self.ops)
        if len(index) < len(self.ops):
            seen: set[str] = set()
            for op in self.ops:
                if op.id in seen:
                    raise OvsimError(f"duplicate op id '{op.id}'", source=source, field="ops")
                seen.add(op.id)
        # Stream order runs forward in ``ops``; where every dependency does too, the ops' own
        # order is a topological one and no cycle can exist (a generator lists ops so): the
        # successor lists and the sort (most of a training build's validation: Megatron-LM's
        # 145.6B row 0.75 -> 0.17 s) are skipped.
        forward = True
        for i, op in enumerate(self.ops):
            for d in op.deps:
                j = index.get(d)
                if j is None:
                    raise OvsimError(f"op '{op.id}' depends on unknown op '{d}'", source=source, field="after")
                if j >= i:
                    forward = False
        streams = {(s.rank, s.name) for s in self.streams}
        for op in self.ops:
            if (op.rank, op.stream) not in streams:
                raise OvsimError(f"op '{op.id}' uses undeclared stream '{op.stream}' on rank {op.rank}",
                                 source=source, field="stream")
        if not forward and topological_order(self.successors()) is None:
            import networkx as nx

            cycle = nx.find_cycle(self.graph())
            path = " -> ".join(str(u) for u, _ in cycle)
            raise OvsimError(f"dependency cycle: {path} -> {cycle[0][0]}", source=source, field="after")
        members: dict[str, set[int]] = {}
        groups: dict[str, FlowDemand] = {}
        for op in self.ops:
            if op.flow is not None:
                members.setdefault(op.flow.group, set()).add(op.rank)
                groups[op.flow.group] = op.flow
        for name, flow in groups.items():
            missing = sorted(set(flow.ranks) - members[name])
            if missing:
                raise OvsimError(
                    f"collective '{name}' is never joined by rank(s) {missing}", source=source, field="ranks"
                )


def topological_order(succ: list[list[int]]) -> list[int] | None:
    """Nodes ``0..len(succ)-1`` with every node after its predecessors (Kahn's algorithm; a
    networkx graph of a million ops costs seconds to build); None where a cycle leaves some out."""
    indeg = [0] * len(succ)
    for out in succ:
        for v in out:
            indeg[v] += 1
    ready = [v for v, d in enumerate(indeg) if d == 0]
    order: list[int] = []
    while ready:
        v = ready.pop()
        order.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return order if len(order) == len(succ) else None
