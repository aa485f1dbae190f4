"""What the engine keeps about a run in progress: launched kernels, the SMs' resident blocks (as
groups of identical SMs), GPUs, flows and their members, and streams.

These are plain records. The block dispatcher (:mod:`ovsim.engine.dispatch`) places and retires
blocks, the rate solver (:mod:`ovsim.engine.rates`) sets their rates, the power loop
(:mod:`ovsim.engine.power_loop`) sets each GPU's clock, and the engine (:mod:`ovsim.engine.sim`)
moves them through time.

Times are in seconds, rates of block work in block fractions per second, bandwidths in bytes per
second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ovsim.engine.machine import GpuModel
from ovsim.engine.power import ClockWindow, PowerConfig, op_power_class, rate_class
from ovsim.hw.power import MEMORY, TENSOR
from ovsim.models.ir import FlowDemand, KernelDemand, Op
from ovsim.models.occupancy import allocated_registers, kept_load_share

INF = float("inf")
# Room without a limit, in blocks (an int: block counts stay integers).
BIG = 1 << 62
# Work left below this many seconds at the current rate counts as finished (float round-off).
TIME_EPS = 1e-12


class KernelState:
    """A launched kernel (or the SM-resident part of a collective) on one GPU.

    Blocks: ``blocks`` in all, ``undispatched`` waiting for an SM, ``resident`` on SMs, ``batched``
    held by fast-forwarded waves, ``late_blocks`` a persistent kernel's first tiles held back;
    ``ctas`` its persistent CTAs; ``cluster`` CTAs per cluster. A block holds ``threads``, ``regs``
    and ``smem`` of an SM; ``blocks_per_sm_alone`` fit on an idle SM, ``max_resident`` on the GPU.

    Pace: ``block_time_s`` is a block's time alone; ``issue_share_asked`` the share of an SM's
    issue slots a block asks for, ``issue_share_cap`` the most it uses with room to spare,
    ``issue_fraction`` the kernel's own issue fraction; ``full_issue_blocks`` counts resident
    blocks weighted by the share of their ask they get. ``hbm_pace_share`` is the share of its
    blocks' pace that its HBM grant allows, ``hbm_pace_share_alone`` the share its own bandwidth
    cap allows (``bytes_per_block`` at most ``hbm_cap_bytes_per_s``); ``load_share`` is how much
    its pace goes with the SMs running such blocks; ``memory_wait_share`` the share of its time
    alone that waits on memory. ``clock_cls`` indexes the GPU's rate multipliers;
    ``on_tensor_cores`` is its power class, ``sm_weight_w`` that class's full-GPU dynamic watts
    (PowerModel.sm_weight_w) and ``busy_sms_per_block`` the SMs' worth of it a resident block keeps
    busy.

    Accounting (seconds lost): ``wait_sm_s`` without SMs, ``share_sm_s``, ``share_hbm_s`` and
    ``share_link_s`` to shares, ``wait_peers_s`` waiting for other ranks, ``clock_s`` to the clock.
    """

    __slots__ = (
        "batched", "block_time_s", "blocks", "blocks_per_sm_alone", "busy_sms_per_block", "bytes_per_block",
        "clock_cls", "clock_s", "clock_sensitive", "cluster", "ctas", "end_s", "flow", "full_issue_blocks", "gpu",
        "hbm_cap_bytes_per_s", "hbm_pace_share", "hbm_pace_share_alone", "id", "index", "issue_fraction",
        "issue_share_asked", "issue_share_cap", "late_blocks", "launch_s", "load_share", "max_resident",
        "memory_wait_share", "on_tensor_cores", "op", "paired", "partitions", "priority", "rank", "regs", "resident",
        "seq", "share_hbm_s", "share_link_s", "share_sm_s", "sm_weight_w", "smem", "start_s", "stream", "threads",
        "undispatched", "wait_peers_s", "wait_sm_s",
    )

    def __init__(self, op: Op, gpu: GpuState, priority: int, seq: int, now: float, spec: KernelSpec, index: int,
                 stream: StreamState | None) -> None:
        self.op = op
        self.id = op.id
        self.rank = op.rank
        # The op's index in the workload (its row in the results) and the stream that launched it
        # (None only where no engine runs it: the dispatcher's tests).
        self.index = index
        self.stream = stream
        self.gpu = gpu
        self.priority = priority
        self.seq = seq
        self.launch_s = now
        self.start_s = INF
        self.end_s = INF
        self.flow: FlowState | None = None
        # hbm_pace_share: the share of its blocks' pace the kernel's HBM grant allows;
        # hbm_pace_share_alone: the share its own bandwidth cap allows (a bandwidth-bound kernel
        # alone), so hbm_pace_share / hbm_pace_share_alone is what contention costs it.
        self.hbm_pace_share = 1.0
        self.hbm_pace_share_alone = 1.0
        # Resident blocks weighted by the share of their issue demand they get: that many at full issue.
        self.full_issue_blocks = 0.0
        self.wait_sm_s = self.share_sm_s = self.share_hbm_s = self.share_link_s = self.wait_peers_s = 0.0
        self.clock_s = 0.0
        self.blocks = spec.blocks
        self.undispatched = spec.blocks
        self.resident = 0
        self.batched = 0  # blocks of later waves held by a fast-forwarded entry (dispatch.batch)
        self.ctas = spec.ctas
        self.late_blocks = 0
        self.cluster = spec.cluster
        # Whether its blocks took SMs beside a running cluster kernel or as one left, SMs its
        # clusters free two of a unit at a time, rather than an idle GPU's, which it fills as a
        # plain launch does (dispatch.cluster_room).
        self.paired = False
        self.threads = spec.threads
        self.regs = spec.regs
        self.smem = spec.smem
        self.blocks_per_sm_alone = spec.blocks_per_sm_alone
        self.max_resident = spec.max_resident
        self.load_share = spec.load_share
        self.block_time_s = spec.block_time_s
        self.issue_fraction = spec.issue_fraction
        self.issue_share_asked = spec.issue_share_asked
        self.issue_share_cap = spec.issue_share_cap
        self.clock_sensitive = spec.clock_sensitive
        self.bytes_per_block = spec.bytes_per_block
        self.hbm_cap_bytes_per_s = spec.hbm_cap_bytes_per_s
        self.memory_wait_share = spec.memory_wait_share
        self.partitions = spec.partitions
        self.clock_cls = spec.clock_cls
        self.on_tensor_cores = spec.on_tensor_cores
        self.sm_weight_w = spec.sm_weight_w
        self.busy_sms_per_block = spec.busy_sms_per_block

    def sort_key(self) -> tuple[int, int]:
        return (self.priority, self.seq)


MAIN = ("main",)
BOTH = ("main", "reserved")


def partitions(op: Op) -> tuple[str, ...]:
    """The SM partitions the engine lets an op's blocks use: a compute op's the main SMs only."""
    return MAIN if op.partition == "compute" else BOTH


class KernelSpec:
    """What every launch of one kernel demand shares on one GPU model, as one op kind and
    precision on one partition: the fields of :class:`KernelState` that do not change while it
    runs. The engine works one out per such launch and copies it at each (Engine._launch): reading
    the models' records field by field at every launch cost the compiled engine about 6% of a run.

    ``memory_wait_share`` is given (RateSolver.memory_wait, 0 without the latency law)."""

    __slots__ = (
        "block_time_s", "blocks", "blocks_per_sm_alone", "busy_sms_per_block", "bytes_per_block", "clock_cls",
        "clock_sensitive", "cluster", "ctas", "hbm_cap_bytes_per_s", "issue_fraction", "issue_share_asked",
        "issue_share_cap", "load_share", "max_resident", "memory_wait_share", "on_tensor_cores", "partitions",
        "regs", "sm_weight_w", "smem", "threads",
    )

    def __init__(self, op: Op, model: GpuModel, nccl_issue: float, power: PowerConfig | None,
                 memory_wait_share: float) -> None:
        k = op.kernel
        assert k is not None
        self.blocks = k.blocks
        # A persistent kernel's CTAs (dispatch.place holds the first tiles of those that find no
        # SM back until the rest are done).
        self.ctas = k.persistent_ctas if 0 < k.persistent_ctas < k.blocks else 0
        # CTAs per cluster, where the GPU's placement units are known and its SMs one partition.
        self.cluster = k.cluster_ctas if k.cluster_ctas > 1 and model.unit_sms and not model.comm_reserved_sms \
            else 1
        shape = block_shape(k, model, op.partition == "compute")
        self.threads, self.regs, self.smem, self.blocks_per_sm_alone, self.max_resident = shape
        # Its blocks' count is then the SMs they keep busy (KernelDemand.load_share).
        self.load_share = kept_load_share(k.load_share, self.blocks_per_sm_alone) if op.flow is None else 0.0
        self.block_time_s = k.block_time_s
        self.issue_fraction = k.issue_fraction
        # NCCL blocks ask for a fixed share of an SM's issue slots, whatever the kernel says.
        self.issue_share_asked = nccl_issue if op.flow is not None else k.issue_fraction
        # The most of an SM a block uses with room to spare; it runs issue_share_cap / issue_share_asked
        # times its pace there.
        self.issue_share_cap = (self.issue_share_asked if op.flow is not None or k.issue_cap is None
                                else max(self.issue_share_asked, k.issue_cap))
        self.clock_sensitive = k.clock_sensitive
        self.bytes_per_block = k.hbm_bytes / k.blocks
        self.hbm_cap_bytes_per_s = k.hbm_cap_bytes_per_s
        self.memory_wait_share = memory_wait_share
        self.partitions = partitions(op)
        # Index into the GPU's rate multipliers: 0 not clock-bound, 1 CUDA cores, 2 and up tensor
        # cores (one class per saturation clock), then memory-bound kernels part of whose time
        # follows the clock (engine.power.rate_class).
        self.clock_cls = 1 if k.clock_sensitive and op.flow is None else 0
        self.on_tensor_cores = False
        self.sm_weight_w = 0.0
        self.busy_sms_per_block = 0.0
        if power is not None:
            cls, self.sm_weight_w = op_power_class(op, power.model)
            self.on_tensor_cores = cls == TENSOR
            self.clock_cls = rate_class(op, power.model, cls)
            # Compute blocks count by the issue share they use (occupancy shaping leaves SMs partly
            # idle); memory-bound blocks and NCCL's copy loops by the block slots they hold.
            self.busy_sms_per_block = 1.0 / self.blocks_per_sm_alone if cls == MEMORY else self.issue_fraction


def spec_key(op: Op, model: GpuModel, power: PowerConfig | None) -> tuple[int, int, str, bool, str, str | None]:
    """What a :class:`KernelSpec` depends on besides the run's own settings: the kernel demand and
    GPU model (by identity: the workload and the machine keep them alive through a run), the
    partition, whether the op is a collective's, its kind, and with power its precision."""
    precision = op.info.get("precision") if power is not None else None
    return (id(op.kernel), id(model), op.partition, op.flow is None, op.kind,
            precision if isinstance(precision, str) else None)


def block_shape(k: KernelDemand, m: GpuModel, main_only: bool) -> tuple[int, int, int, int, int]:
    """A kernel's block on a GPU: threads, registers and shared memory it holds, blocks per SM and
    blocks resident at once with the kernel alone on the SMs it may use."""
    threads = math.ceil(k.block.threads / m.warp_size) * m.warp_size
    regs = allocated_registers(k.block.threads, k.block.registers_per_thread, m.warp_size, m.register_alloc_unit)
    smem = k.block.shared_mem_bytes + m.reserved_smem_per_block_bytes
    per_sm = max(1, blocks_fit(m.threads_per_sm, m.registers_per_sm, m.shared_mem_per_sm_bytes, m.blocks_per_sm,
                         threads, regs, smem))
    allowed = m.sm_count - (m.comm_reserved_sms if main_only else 0)
    return threads, regs, smem, per_sm, allowed * per_sm


def blocks_fit(threads: int, regs: int, smem: int, blocks: int, k_threads: int, k_regs: int, k_smem: int) -> int:
    n = threads // k_threads
    if blocks < n:
        n = blocks
    if k_regs and regs // k_regs < n:
        n = regs // k_regs
    if k_smem and smem // k_smem < n:
        n = smem // k_smem
    return n if n > 0 else 0


class BlockEntry:
    """Blocks of one kernel, ``per_sm`` on every SM of a group, all with the same work left.

    A fast-forwarded entry also holds its kernel's next ``extra`` waves on the same SMs:
    ``remaining`` then counts their work too (one unit per wave)."""

    __slots__ = ("extra", "kernel", "per_sm", "rate", "remaining", "share")

    def __init__(self, kernel: KernelState, per_sm: int, remaining: float) -> None:
        self.kernel = kernel
        self.per_sm = per_sm
        self.remaining = remaining  # fraction of one block's work (plus ``extra`` whole blocks)
        self.extra = 0
        self.rate = 0.0  # block fractions per second
        self.share = 1.0  # issue share granted / issue share asked


class SmGroup:
    """``n_sms`` identical SMs: same partition, same free resources, same resident blocks."""

    __slots__ = ("blocks", "entries", "n_sms", "part", "regs", "smem", "threads")

    def __init__(self, n_sms: int, part: str, threads: int, regs: int, smem: int, blocks: int) -> None:
        self.n_sms = n_sms
        self.part = part
        self.threads = threads
        self.regs = regs
        self.smem = smem
        self.blocks = blocks
        self.entries: list[BlockEntry] = []

    def clone(self, n_sms: int) -> SmGroup:
        g = SmGroup(n_sms, self.part, self.threads, self.regs, self.smem, self.blocks)
        entries = g.entries
        for src in self.entries:
            dst = BlockEntry(src.kernel, src.per_sm, src.remaining)
            dst.rate, dst.share = src.rate, src.share
            entries.append(dst)
        return g

    def key(self) -> tuple[Any, ...]:
        return (self.part, self.threads, self.regs, self.smem, self.blocks,
                tuple((id(e.kernel), e.per_sm, e.remaining) for e in self.entries))

    def same(self, o: SmGroup) -> bool:
        """``self.key() == o.key()`` without building the keys."""
        if (self.part != o.part or self.threads != o.threads or self.regs != o.regs or self.smem != o.smem
                or self.blocks != o.blocks or len(self.entries) != len(o.entries)):
            return False
        mine, theirs = self.entries, o.entries
        for i in range(len(mine)):
            a, b = mine[i], theirs[i]
            if a.kernel is not b.kernel or a.per_sm != b.per_sm or a.remaining != b.remaining:
                return False
        return True


# A GPU's power inputs (PowerLoop.activity): tensor and other SM watts, fixed and clock-following HBM
# bytes/s, link bytes/s, busy SM fractions of three classes, and saturating tensor HBM traffic.
Activity = tuple[float, float, float, float, float, float, float, float, tuple[tuple[float, float], ...]]


class GpuState:
    __slots__ = ("batched", "ce_free", "ce_waiting", "clock_factor", "clock_frac", "clock_window", "cluster_freed_s",
                 "flows", "groups", "hbm_demand", "last_t", "model", "n_partitions", "pending", "rank",
                 "rate_multipliers", "running", "throttled", "timer", "timer_at")

    def __init__(self, rank: int, model: GpuModel) -> None:
        self.rank = rank
        self.model = model
        self.clock_factor = 1.0
        # Rate multipliers by rate class (KernelState.clock_cls): not clock-bound, CUDA-core,
        # tensor-core work (PowerConfig.multipliers has more classes); the SM clock as a
        # fraction of the compute clock, where a power policy sets it; whether any multiplier is not 1.
        self.rate_multipliers = [1.0, 1.0, 1.0]
        self.clock_frac = 1.0
        self.throttled = False
        m = model
        main = m.sm_count - m.comm_reserved_sms
        self.groups = [SmGroup(main, "main", m.threads_per_sm, m.registers_per_sm, m.shared_mem_per_sm_bytes,
                              m.blocks_per_sm)]
        self.n_partitions = 2 if m.comm_reserved_sms else 1
        if m.comm_reserved_sms:
            self.groups.append(SmGroup(m.comm_reserved_sms, "reserved", m.threads_per_sm, m.registers_per_sm,
                                      m.shared_mem_per_sm_bytes, m.blocks_per_sm))
        self.pending: list[KernelState] = []
        self.running: list[KernelState] = []  # launched compute kernels not finished
        self.flows: list[FlowState] = []  # unfinished flows that use this GPU's HBM or links, or have a member here
        self.ce_free = m.copy_engines
        self.ce_waiting: list[FlowMember] = []
        self.last_t = 0.0  # the GPU's state is up to date to this time
        self.timer = 0  # version of the GPU's pending completion timer
        self.timer_at = INF  # when it fires
        self.batched = False  # some entry holds later waves (dispatch.batch)
        self.clock_window: ClockWindow | None = None  # the power-limit loop's window, where it runs one
        self.cluster_freed_s = -INF  # when a cluster kernel's blocks last left SMs
        # The HBM bytes/s each kernel asked for at the last rate solve (RateSolver.solve_beside).
        self.hbm_demand: dict[KernelState, float] = {}


@dataclass
class FlowMember:
    """One rank's op in a flow."""

    op: Op
    rank: int
    kernel: KernelState | None  # SM-based collectives hold blocks; copy-engine flows do not
    launch_s: float
    index: int  # the op's index in the workload, its row in the results
    stream: StreamState  # the stream that launched it
    arrived: bool = False
    has_ce: bool = False
    start_s: float = INF
    end_s: float = INF
    wait_sm_s: float = 0.0
    wait_peers_s: float = 0.0
    share_sm_s: float = 0.0
    share_hbm_s: float = 0.0
    share_link_s: float = 0.0


@dataclass
class FlowState:
    demand: FlowDemand
    members: dict[int, FlowMember] = field(default_factory=dict)
    latency_left_s: float = 0.0
    remaining_bytes: float = 0.0
    phase: str = "waiting"  # waiting -> latency -> data -> done
    rate: float = 0.0  # bytes/s
    # Its cap at the last solve: demand.rate_cap_bytes_per_s times sm_factor, over latency_slow.
    effective_cap_bytes_per_s: float = 0.0
    bottleneck: str = ""
    sm_factor: float = 1.0
    sm_lowest: int = -1  # the member whose issue share set sm_factor (RateSolver.sm_factor)
    # Seconds each member has lost, while moving data, to SM issue, HBM and link shares
    # (progress._attribute_flow): the same for every member.
    share_sm_s: float = 0.0
    share_hbm_s: float = 0.0
    share_link_s: float = 0.0
    latency_slow: float = 1.0  # what HBM's loaded latency took off its cap (RateSolver.latency)
    start_s: float = INF
    end_s: float = INF
    last_t: float = 0.0
    usage: list[tuple[Any, float]] = field(default_factory=list)
    # GPUs whose HBM or links the flow uses, and the ranks of its members: all touched together.
    ranks: tuple[int, ...] = ()
    seq: int = 0  # flows created before it
    # Its usage by the GPU a channel belongs to (HBM, NVLink ports and mesh links; not NICs or
    # PCIe), and its HBM bytes per byte by GPU: what a solve of some of its GPUs needs of it.
    usage_at: dict[int, list[tuple[Any, float]]] = field(default_factory=dict)
    hbm_at: dict[int, float] = field(default_factory=dict)
    # At the last solve of all its GPUs: the GPU whose HBM froze it (-1: a link or its cap), and
    # its loaded-latency slowdown on each GPU where above 1 (ovsim.engine.coupled).
    bottleneck_hbm: int = -1
    moving_at: int = -1  # Flows.moving_changes at that solve: no flow started or stopped moving since
    slow_at: dict[int, float] = field(default_factory=dict)
    slow_at_largest: int = 0  # how many GPUs' slowdowns equal latency_slow


class StreamState:
    """A stream's ops in launch order, each op's index in the workload (its row in the results),
    and where the stream is."""

    __slots__ = ("busy", "idx", "indexes", "key", "ops", "priority", "slept")

    def __init__(self, key: tuple[int, str], ops: list[Op], indexes: list[int], priority: int) -> None:
        self.key = key
        self.ops = ops
        self.indexes = indexes
        self.priority = priority
        self.idx = 0
        self.busy = False  # an op of the stream is launched or sleeping its host delay
        self.slept = False  # the op at idx has served its delay

def check_sms(gpu: GpuState) -> None:
    """Raise where a GPU's SM groups do not cover its SMs or any SM's limits are over-subscribed
    or lost (the engine's invariant checks)."""
    m = gpu.model
    if sum(g.n_sms for g in gpu.groups) != m.sm_count:
        raise RuntimeError(f"rank {gpu.rank}: SM groups cover {sum(g.n_sms for g in gpu.groups)} SMs")
    for g in gpu.groups:
        used_threads = sum(e.per_sm * e.kernel.threads for e in g.entries)
        used_regs = sum(e.per_sm * e.kernel.regs for e in g.entries)
        used_smem = sum(e.per_sm * e.kernel.smem for e in g.entries)
        used_blocks = sum(e.per_sm for e in g.entries)
        if (min(g.threads, g.regs, g.smem, g.blocks) < 0 or used_threads > m.threads_per_sm
                or used_regs > m.registers_per_sm or used_smem > m.shared_mem_per_sm_bytes
                or used_blocks > m.blocks_per_sm
                or g.threads + used_threads != m.threads_per_sm or g.blocks + used_blocks != m.blocks_per_sm):
            raise RuntimeError(f"rank {gpu.rank}: an SM's limits are over-subscribed or lost")
    for k in gpu.running:
        if k.resident < 0 or k.undispatched < 0:
            raise RuntimeError(f"kernel {k.id}: negative block count")
