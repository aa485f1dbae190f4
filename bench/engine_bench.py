"""Engine throughput benchmark on a synthetic, training-like iteration.

Every rank runs the same program (data parallel): a compute stream cycling through GEMMs of a few
shapes (1-4 waves on H100) and memory-bound elementwise/norm kernels, with a small host gap now and
then, and a comm stream that all-reduces a gradient bucket after every ~20 compute kernels. Each
all-reduce depends on the compute kernel just before it, so it overlaps the compute that follows;
that is the case the engine is built for (SM, HBM and link sharing at every event).

The workload is built directly as a :class:`~ovsim.models.ir.Workload` (no scenario parsing), and
only ``Engine(...).run()`` is timed; the build is reported separately.

    python bench/engine_bench.py                       # full run (headline + both sweeps)
    python bench/engine_bench.py --kernels 50000 --ranks 4
    python bench/engine_bench.py --quick               # CI smoke, a few seconds
    python bench/engine_bench.py --power track         # also track power, with no power-limit loop
    python bench/engine_bench.py --power limit         # the loop at the default limit (what predict does)
    python bench/engine_bench.py --power 500           # the loop under a 500 W cap

With the loop the engine first runs the workload to find its steady state (docs/power.md), so such
a run simulates it two to four times; "events" counts the reported run's.

"Kernels" counts every op on every rank: compute kernels and each rank's all-reduce kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import resource
import sys
import time
from dataclasses import dataclass

from ovsim.engine import compiled_modules
from ovsim.engine.machine import MachineModel, build_machine
from ovsim.engine.power import PowerConfig
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.hw.calib import Parameters, load_calibration
from ovsim.hw.power import PowerSettings, power_model
from ovsim.hw.spec import GpuSpec, SystemSpec, load_gpu, load_system
from ovsim.models import cost
from ovsim.models.ir import FlowDemand, KernelDemand, KernelKind, Op, StreamSpec, Workload
from ovsim.models.op_prices import collective_parts
from ovsim.models.workload import CollectiveOpSpec, Knobs

GPU_NAME = "h100-sxm5-80gb"
# The rank sweep's largest run: 8 nodes of 8.
MAX_RANKS = 64
COMPUTE_STREAM = "compute"
COMM_STREAM = "comm"
# One all-reduce after this many compute kernels (a DDP gradient bucket per ~20 backward kernels).
COMPUTE_PER_COLLECTIVE = 20
BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb
# Every HOST_GAP_EVERY-th compute kernel waits a few microseconds on the host (launch jitter, a
# Python-side op); drawn per rank so ranks drift apart and collectives wait for their slowest peer.
HOST_GAP_EVERY = 8
HOST_GAP_S = (2e-6, 8e-6)
SEED = 1234

KERNEL_SWEEP = (10_000, 25_000, 50_000, 100_000)
KERNEL_SWEEP_RANKS = 8
RANK_SWEEP = (1, 2, 4, 8, 16, 32, 64)
RANK_SWEEP_PER_RANK = 1_000

QUICK_HEADLINE = (2_000, 2)
QUICK_KERNEL_SWEEP = (500, 1_000)
QUICK_RANK_SWEEP = (1, 2, 4)
QUICK_PER_RANK = 200


def bench_system() -> SystemSpec:
    """Nodes of 8 H100s joined by eight 400 Gb/s NICs each (the shipped hgx-h100-ndr), as many as
    the rank sweep needs; NVLS off so every rank count plans a ring or tree collective."""
    return load_system("hgx-h100-ndr").model_copy(update={"nodes": -(-MAX_RANKS // 8), "nvls": False})


@dataclass(frozen=True)
class Recipe:
    """One compute kernel of the cycle: its IR kind, a display name and its priced demand."""

    kind: KernelKind
    name: str
    demand: KernelDemand


def compute_cycle(gpu: GpuSpec, params: Parameters) -> list[Recipe]:
    """A transformer-layer-like mix; demands are priced once and shared by every op, as
    ``build_workload`` does for repeats (ops are frozen, sharing is safe)."""

    def gemm(m: int, n: int, k: int) -> KernelDemand:
        # GemmOp's default launch (128x256x64 tiles, 1 block/SM on H100): 132 blocks per wave.
        return cost.gemm(m, n, k, "bf16", gpu, params, tile=(128, 256, 64), threads=256,
                         registers_per_thread=128, stages=3)

    tokens, hidden = 4096, 4096
    act = tokens * hidden * 2  # one bf16 activation tensor
    wave = gpu.sm.count * 8  # resident 256-thread, 32-register blocks per wave (8 per SM)

    def streaming(bytes_moved: float, *, blocks: int | None = None, items_per_thread: int = 4) -> KernelDemand:
        return cost.memory_bound(bytes_moved, gpu, params, blocks=blocks, items_per_thread=items_per_thread)

    # GEMMs take 1-4 waves; streaming kernels mix a one-block-per-row norm, grid-stride launches
    # (a few waves, as fused/Triton kernels do) and one natural grid with a long wave train, so
    # the average compute kernel is about four engine events.
    return [
        Recipe("norm", "layernorm", streaming(2 * act, blocks=tokens)),  # 4 waves
        Recipe("gemm", "qkv_proj", gemm(tokens, 3 * hidden // 4, hidden)),  # 3 waves
        Recipe("gemm", "out_proj", gemm(tokens, hidden, hidden)),  # 4 waves
        Recipe("elementwise", "residual_add", streaming(3 * act, items_per_thread=16)),  # 12 waves
        Recipe("norm", "layernorm", streaming(2 * act, blocks=tokens)),
        Recipe("gemm", "mlp_up", gemm(tokens // 2, hidden, hidden)),  # 2 waves
        Recipe("elementwise", "gelu", streaming(2 * act, blocks=2 * wave)),  # 2 waves
        Recipe("gemm", "mlp_down", gemm(tokens // 4, hidden, hidden)),  # 1 wave
        Recipe("elementwise", "dropout_add", streaming(3 * act, blocks=4 * wave)),  # 4 waves
        Recipe("gemm", "grad_weight", gemm(tokens, 2 * hidden // 4, hidden)),  # 2 waves
    ]


def allreduce_parts(n_ranks: int, gpu: GpuSpec, system: SystemSpec,
                    params: Parameters) -> tuple[KernelDemand | None, FlowDemand]:
    """The NCCL kernel and flow of one bucket all-reduce, from the same code path scenarios use."""
    spec = CollectiveOpSpec(name="grad_allreduce", kind="all_reduce", size_bytes=BUCKET_BYTES)
    parts = collective_parts(spec, "template", list(range(n_ranks)), gpu, system, params, Knobs())
    kernel, flow, _ = parts[0]
    return kernel, flow


def build(total_kernels: int, n_ranks: int, gpu: GpuSpec, system: SystemSpec, params: Parameters) -> Workload:
    per_rank = max(1, total_kernels // n_ranks)
    cycle = compute_cycle(gpu, params)
    ar_kernel, ar_flow = allreduce_parts(n_ranks, gpu, system, params)
    if ar_kernel is not None and ar_kernel.blocks == 0:
        # A 1-rank all-reduce launches no NCCL kernel (plan_collective: channels=0); a zero-block
        # kernel would divide by zero in the engine, so that rank only joins the flow.
        ar_kernel = None
    # Collective flows are shared by every rank of a group: one per bucket, made once.
    flows: list[FlowDemand] = []
    ops: list[Op] = []
    for rank in range(n_ranks):
        rng = random.Random(SEED * 1_000_003 + rank)
        n_compute = 0
        n_coll = 0
        prev = ""
        for _ in range(per_rank):
            if n_compute and n_compute % COMPUTE_PER_COLLECTIVE == 0 and n_coll < n_compute // COMPUTE_PER_COLLECTIVE:
                if n_coll == len(flows):
                    flows.append(dataclasses.replace(ar_flow, group=f"ar{n_coll}"))
                ops.append(Op(id=f"ar{n_coll}@r{rank}", name="grad_allreduce", kind="collective", rank=rank,
                              stream=COMM_STREAM, deps=(prev,), kernel=ar_kernel, flow=flows[n_coll]))
                n_coll += 1
                continue
            r = cycle[n_compute % len(cycle)]
            delay = rng.uniform(*HOST_GAP_S) if n_compute % HOST_GAP_EVERY == HOST_GAP_EVERY - 1 else 0.0
            prev = f"k{n_compute}@r{rank}"
            ops.append(Op(id=prev, name=r.name, kind=r.kind, rank=rank, stream=COMPUTE_STREAM, delay_s=delay,
                          kernel=r.demand))
            n_compute += 1
    streams = tuple(StreamSpec(rank=r, name=s) for r in range(n_ranks) for s in (COMPUTE_STREAM, COMM_STREAM))
    return Workload(ops=tuple(ops), streams=streams, n_ranks=n_ranks)


@dataclass(frozen=True)
class Run:
    kernels: int
    ranks: int
    build_s: float
    sim_s: float
    makespan_s: float
    events: int
    # Events at which a collective coupled GPUs the event did not touch, the share of them that
    # left those GPUs as they were (Engine.coupled_kept), and the share decided on the event's GPUs
    # alone (Engine.coupled_local, ovsim.engine.coupled).
    coupled: int = 0
    kept_pct: float = 0.0
    local_pct: float = 0.0

    @property
    def rate(self) -> float:
        return self.kernels / self.sim_s if self.sim_s > 0 else float("inf")


def run_once(total_kernels: int, n_ranks: int, gpu: GpuSpec, system: SystemSpec, params: Parameters,
             machines: dict[int, MachineModel], power: PowerConfig | None = None) -> Run:
    t0 = time.perf_counter()
    wl = build(total_kernels, n_ranks, gpu, system, params)
    build_s = time.perf_counter() - t0
    if n_ranks not in machines:
        machines[n_ranks] = build_machine(system, gpu, params, n_ranks=n_ranks)
    t0 = time.perf_counter()
    engine = Engine(wl, machines[n_ranks], EngineOptions(counters=False, power=power))
    timeline = engine.run()
    sim_s = time.perf_counter() - t0
    coupled = engine.coupled_kept + engine.coupled_solved
    return Run(kernels=len(wl.ops), ranks=n_ranks, build_s=build_s, sim_s=sim_s,
               makespan_s=timeline.makespan_s, events=engine.resolves, coupled=coupled,
               kept_pct=100.0 * engine.coupled_kept / coupled if coupled else 0.0,
               local_pct=100.0 * engine.coupled_local / coupled if coupled else 0.0)


def maxrss_mib() -> float:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def table(title: str, runs: list[Run]) -> None:
    print(f"\n{title}")
    print(f"{'kernels':>9} {'ranks':>5} {'build s':>8} {'sim s':>8} {'kernels/s':>10} {'us/kernel':>9} "
          f"{'events':>8} {'makespan ms':>11} {'coupled':>8} {'kept %':>6} {'local %':>7}")
    for r in runs:
        print(f"{r.kernels:>9} {r.ranks:>5} {r.build_s:>8.2f} {r.sim_s:>8.2f} {r.rate:>10.0f} "
              f"{1e6 / r.rate:>9.1f} {r.events:>8} {r.makespan_s * 1e3:>11.2f} {r.coupled:>8} {r.kept_pct:>6.1f} "
              f"{r.local_pct:>7.1f}")


def engine_build() -> str:
    """Whether the engine runs compiled (setup.py, OVSIM_COMPILE=1) or as Python."""
    names = compiled_modules()
    if names:
        return f"compiled with mypyc ({len(names)} modules)"
    return "pure Python (OVSIM_COMPILE=1 python setup.py build_ext --inplace compiles it)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--kernels", type=int, default=100_000, help="total kernels of the headline run (all ranks)")
    ap.add_argument("--ranks", type=int, default=8, help="ranks of the headline run")
    ap.add_argument("--quick", action="store_true", help="small subset for CI smoke")
    ap.add_argument("--no-sweeps", action="store_true", help="headline run only")
    ap.add_argument("--power", default="off", metavar="off|track|limit|WATTS",
                    help="off (default): no power; track: power counters, no power-limit loop; limit: the loop at "
                         "the default limit (what predict runs); a number: the loop under a cap in watts")
    args = ap.parse_args(argv)
    if not 1 <= args.ranks <= MAX_RANKS:
        ap.error(f"--ranks must be in 1..{MAX_RANKS}")
    if args.kernels < args.ranks:
        ap.error("--kernels must be at least --ranks")

    gpu = load_gpu(GPU_NAME)
    params = load_calibration(gpu, GPU_NAME).params
    power: PowerConfig | None = None
    if args.power != "off":
        if args.power == "track":
            settings = PowerSettings(managed=False)
        elif args.power == "limit":
            settings = PowerSettings()
        else:
            try:
                settings = PowerSettings(cap_w=float(args.power))
            except ValueError:
                ap.error(f"--power must be off, track, limit or a positive number of watts, got '{args.power}'")
        power = PowerConfig(model=power_model(gpu, params), settings=settings)
    system = bench_system()
    machines: dict[int, MachineModel] = {}
    kernel_sweep: tuple[int, ...]
    rank_sweep: tuple[int, ...]
    if args.quick:
        headline_cfg = QUICK_HEADLINE
        kernel_sweep, rank_sweep, per_rank = QUICK_KERNEL_SWEEP, QUICK_RANK_SWEEP, QUICK_PER_RANK
    else:
        headline_cfg = (args.kernels, args.ranks)
        kernel_sweep, rank_sweep, per_rank = KERNEL_SWEEP, RANK_SWEEP, RANK_SWEEP_PER_RANK
    sweep_ranks = headline_cfg[1] if args.quick else KERNEL_SWEEP_RANKS

    rss_start = maxrss_mib()
    # The headline runs first so that the process's peak RSS right after it is its own.
    head = run_once(*headline_cfg, gpu, system, params, machines, power)
    rss_head = maxrss_mib()
    print(f"headline: {head.kernels} kernels on {head.ranks} ranks ({GPU_NAME}, counters off)")
    print(f"  engine                      : {engine_build()}")
    print(f"  Engine(...).run() wall time : {head.sim_s:.2f} s")
    print(f"  kernels simulated per second: {head.rate:,.0f}")
    print(f"  workload build time         : {head.build_s:.2f} s (not timed above)")
    print(f"  simulated makespan          : {head.makespan_s * 1e3:.2f} ms, {head.events} engine events")
    print(f"  peak memory (getrusage ru_maxrss, whole process): {rss_head:.0f} MiB "
          f"(before the run: {rss_start:.0f} MiB, so about {rss_head - rss_start:.0f} MiB for build + run)")
    if args.no_sweeps:
        return 0

    done = {(head.kernels, head.ranks): head}
    by_kernels = []
    for n in kernel_sweep:
        key = (n - n % sweep_ranks, sweep_ranks)
        by_kernels.append(done.get(key) or run_once(n, sweep_ranks, gpu, system, params, machines, power))
        done[(by_kernels[-1].kernels, sweep_ranks)] = by_kernels[-1]
    table(f"time vs kernels ({sweep_ranks} ranks)", by_kernels)
    by_ranks = []
    for r in rank_sweep:
        key = (per_rank * r, r)
        by_ranks.append(done.get(key) or run_once(per_rank * r, r, gpu, system, params, machines, power))
    table(f"time vs ranks ({per_rank} kernels per rank)", by_ranks)
    print(f"\npeak memory (getrusage ru_maxrss, whole process, all runs): {maxrss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
