"""NCCL's constants and the names of its operations, algorithms and protocols.

The tables and :class:`NcclParams` that :mod:`ovsim.models.nccl`'s cost model reads: NCCL's own
values (``NVIDIA/nccl`` source at v2.30, file named beside each), [D] our derivations where NCCL's
come from a topology search we do not run, [R] values recalled but not re-read. Everything is SI:
seconds, bytes, bytes per second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

CollectiveOp = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv"
]
Algorithm = Literal["ring", "tree", "nvls", "nvls_tree"]
Protocol = Literal["ll", "ll128", "simple"]
Path = Literal["nvlink", "pcie"]

OPS: tuple[CollectiveOp, ...] = get_args(CollectiveOp)
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)

REDUCING_OPS: frozenset[str] = frozenset({"all_reduce", "reduce_scatter", "reduce"})
P2P_OPS: frozenset[str] = frozenset({"all_to_all", "send_recv"})
NVLS_OPS: frozenset[str] = frozenset({"all_reduce", "all_gather", "reduce_scatter"})

# Per-protocol tables are ordered like NCCL's: (LL, LL128, Simple).
PerProto = tuple[float, float, float]
# Per-architecture tables are indexed like NCCL's compute-capability tables:
# (Volta sm70, Ampere sm80, Hopper sm90, Blackwell sm100).
PerArch = tuple[float, float, float, float]
PerArchInt = tuple[int, int, int, int]

_PROTO_INDEX: dict[str, int] = {"ll": 0, "ll128": 1, "simple": 2}
# NCCL's tuning loop visits Tree before Ring before NVLS and breaks ties by keeping the first.
_SEARCH_ORDER: tuple[Algorithm, ...] = ("tree", "ring", "nvls", "nvls_tree")

# tuning.cc treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B .. 512 MiB: trees are slower
# than their model at medium sizes, NCCL corrects the bandwidth by this table. [R] The 24-entry
# table is taken from a third-party port of current tuning.cc; NCCL 2.8's 22-entry table differs
# slightly. Only forced or PCIe tree choices see it: on one node NCCL's tree never wins.
_TREE_CORRECTION: tuple[tuple[float, ...], ...] = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0,
     1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
     1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9,
     .9),
)


@dataclass(frozen=True)
class NcclParams:
    """NCCL's constants, the calibratable knobs of this model.

    Unless tagged otherwise, each value is NCCL's own (v2.30 source, file named in the comment).
    [D] marks our derivations, [R] values recalled but not re-read.
    """

    # -- Latencies (tuning.cc baseLat and hwLat, microseconds there), per protocol (LL, LL128,
    # Simple). Ring and tree pay base + steps x per-hop; NVLS pays one fixed hop.
    ring_base_latency_s: PerProto = (6.6e-6, 14.0e-6, 8.4e-6)
    tree_base_latency_s: PerProto = (6.8e-6, 14.0e-6, 8.4e-6)
    nvls_base_latency_s: float = 0.0
    ring_nvlink_hop_latency_s: PerProto = (0.6e-6, 1.9e-6, 3.4e-6)
    ring_pcie_hop_latency_s: PerProto = (1.0e-6, 2.5e-6, 5.7e-6)
    tree_nvlink_hop_latency_s: PerProto = (0.6e-6, 1.25e-6, 4.0e-6)
    tree_pcie_hop_latency_s: PerProto = (1.0e-6, 1.9e-6, 4.0e-6)
    nvls_nvlink_latency_s: float = 25.0e-6

    # -- Link totals NCCL's topology search works with.
    # topo.h SM70/SM80/SM90/SM100_NVLINK_BW: NCCL's usable rate per NVLink (below the 25/50 GB/s
    # line rate: protocol overhead, NVIDIA/nccl-tests #212).
    nvlink_bw_per_link_bytes_per_s: PerArch = (20.0e9, 20.0e9, 20.6e9, 40.1e9)
    # topo.h SM86_NVLINK_BW: the sm86 parts (A40, RTX A6000) have slower NVLink bridges.
    nvlink_bw_per_link_sm86_bytes_per_s: float = 12.0e9
    # topo.cc kvDictPciGen: NCCL rates a PCIe link at width x speed / 80 GB/s, e.g. Gen4 x16 = 24
    # GB/s, i.e. 75 % of the 32 GB/s per-direction line rate.
    pcie_bw_fraction: float = 0.75

    # -- Per-CTA ring rate [D]. Ampere: NCCL's search settles on 20 GB/s per search channel for
    # 12 x 20 GB/s NVLinks (speed ladder + ncclTopoDupChannels) and launches 2 CTAs per search
    # channel -> 10 GB/s per CTA; 24 CTAs then reach 240 GB/s, the observed default (nccl-tests
    # #100). Volta: same ladder, 6 links -> 10 GB/s. Hopper: 370.8 GB/s / 32 CTAs, the count
    # commonly used for peak on DGX H100 (uccl-project/uccl #205); an 8-link H800 at 16 CTAs
    # (NVIDIA/nccl #892) implies a similar 10.3 GB/s. Blackwell: 18 x 40.1 GB/s over the pre-2.28
    # default of 32 CTAs, uncalibrated.
    ring_bw_per_channel_bytes_per_s: PerArch = (10.0e9, 10.0e9, 11.6e9, 22.6e9)
    # connect.cc: "nChannels = min(MAXCHANNELS, nChannels*2)" after the search.
    channels_per_search_channel: int = 2

    # -- Protocol and algorithm refinements (tuning.cc ncclTopoTuneModel).
    # llMaxBws, single node, indexed by GPU architecture.
    ll_max_bw_bytes_per_s: PerArch = (39.0e9, 87.7e9, 141.0e9, 282.0e9)
    # LL sends a 4 B flag with every 4 B of data.
    ll_bw_fraction: float = 0.5
    # LL128 carries 120 B of data per 128 B line; NCCL rounds to 0.92.
    ll128_bw_fraction: float = 0.92
    # perChMaxRingLL128Bws (per search channel, single node).
    ring_ll128_max_bw_per_search_channel_bytes_per_s: PerArch = (20.0e9, 20.0e9, 36.7e9, 40.0e9)
    # Tree all-reduce: busBw = min(0.92 x busBw, nChannels x perChMaxTreeBws); LL then / 3.8,
    # LL128 x 7/9 on one node capped by perChMaxTreeLL128Bws; algorithm bandwidth = busBw x 0.5.
    tree_bw_fraction: float = 0.92
    tree_max_bw_per_search_channel_bytes_per_s: PerArch = (26.5e9, 24.0e9, 38.7e9, 70.0e9)
    tree_ll_bw_divisor: float = 3.8
    tree_ll128_bw_fraction: float = 7.0 / 9.0
    tree_ll128_max_bw_per_search_channel_bytes_per_s: PerArch = (20.0e9, 20.0e9, 36.7e9, 55.6e9)
    tree_algorithm_bw_ratio: float = 0.5

    # -- NVLS (NVLink SHARP, src/tuning/nvls.cc and search.cc).
    # nvlsEfficiency; 0 means the architecture has no NVLS.
    nvls_efficiency: PerArch = (0.0, 0.0, 0.85, 0.74)
    # search.cc sm90SpeedArrayIntra. The intra-node NVLS search uses exactly one channel per GPU
    # ("Force intra-node NVLS algorithm to pull evenly from all GPUs": minChannels = maxChannels =
    # GPU count) at the fastest ladder speed whose total fits the GPU's NVLink bandwidth [D: we
    # assume the first speed that fits is the one found]. 8 x H100 -> 8 x 40 GB/s, giving
    # 8 x 40 x 0.85 x 7/8 x 2 = 476 GB/s, the value an NVIDIA maintainer called "expected"
    # (NVIDIA/nccl-tests #290).
    nvls_speed_ladder_bytes_per_s: tuple[float, ...] = (
        60.0e9, 50.0e9, 40.0e9, 30.0e9, 24.0e9, 20.0e9, 15.0e9, 12.0e9, 11.0e9, 6.0e9, 3.0e9,
    )
    # nvls.cc NVLS_NCHANNELS_SM90 = 16, SM100 = 24 (single NVLink domain): CTAs an NVLS launch uses.
    nvls_channels: PerArchInt = (0, 0, 16, 24)
    # Without registration (nccl-tests' default) NVLS stages user buffers through its own
    # buffers, which costs extra local copies (see hbm_bytes_per_bus_byte below).
    nvls_registered_buffers: bool = False

    # -- Channels and threads.
    # device.h MAXCHANNELS (64 since 2.25): the most CTAs an override may ask for.
    max_channels: int = 64
    # The pre-2.28 default CTA cap (2.28.3 release note: "Decreased max CTA count from 32 to 16
    # on Blackwell"), which also bounds our derived default.
    default_max_channels: int = 32
    min_default_channels: int = 2
    # device.h NCCL_SIMPLE_MAX_NTHREADS, NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS,
    # NCCL_MAX_NTHREADS (NVLS and tree always use the maximum; p2p kernels too [R]).
    simple_max_threads: int = 512
    ll_max_threads: int = 512
    ll128_max_threads: int = 640
    max_threads: int = 640
    # tuning.cc: Ring/Simple runs 256 threads when bwIntra x nChannels <= PCI_BW (12 GB/s).
    slow_ring_threads: int = 256
    slow_ring_bw_threshold_bytes_per_s: float = 12.0e9
    # enqueue.cc: Ring/Simple adds one sync warp, Tree/Simple four; at least 3 warps.
    ring_simple_extra_warps: int = 1
    tree_simple_extra_warps: int = 4
    min_warps: int = 3
    warp_size: int = 32
    # comm.h NCCL_LL/LL128/SIMPLE_THREAD_THRESHOLD: bytes per thread below which enqueue.cc gives
    # a launch fewer CTAs, then fewer threads. Ring LL multiplies by the rank count (tuning.cc).
    ll_thread_threshold_bytes: int = 8
    ll128_thread_threshold_bytes: int = 8
    simple_thread_threshold_bytes: int = 64
    # makefiles/common.mk -maxrregcount=96, so that 640-thread CTAs can launch.
    registers_per_thread: int = 96
    # device.h ncclShmemScratchWarpSize: per-warp dynamic scratch = max(LL128: 8 x 32 x 8 B,
    # Simple: (unroll x 32 + 1) x 16 B, NVLS: 32 x 64 + 16 B), times NCCL_MAX_NTHREADS / 32 warps
    # whatever the launch's thread count. Unroll is 8 on sm80/sm90 [V], 4 on Volta and 8 on
    # Blackwell [R].
    ll128_scratch_bytes_per_warp: int = 8 * 32 * 8
    nvls_scratch_bytes_per_warp: int = 32 * 64 + 16
    simple_unroll: PerArchInt = (4, 8, 8, 8)
    # Static ncclShmem (src/device/common.h) [D, our arithmetic; measure with ncu]: 16 groups
    # (NCCL_MAX_GROUPS) of connection and src/dst pointer arrays sized by NCCL_MAX_ARITY (32 =
    # NCCL_MAX_NVLS_ARITY from sm90 on, 7 = NCCL_MAX_DIRECT_ARITY before) ~ 1.2 KiB / 0.33 KiB
    # each, plus 1 KiB work storage, reduction arguments and comm/channel copies (~2.5 KiB).
    static_shared_mem_per_block_bytes: PerArchInt = (8192, 8192, 22528, 22528)

    # -- Memory traffic. NVIDIA/nccl #1428 (maintainer): NCCL traffic costs at least 2x, up to 3x
    # its link rate in local memory traffic. A ring step that reduces writes the received data,
    # reads it back and reads the local input (3); a step that only copies writes and reads (2).
    hbm_bytes_per_bus_byte_reduce: float = 3.0
    hbm_bytes_per_bus_byte_copy: float = 2.0

    # -- Point-to-point (all_to_all, send_recv) [R]: NCCL_P2P_LL_THRESHOLD, per-peer bytes up to
    # which p2p uses LL.
    p2p_ll_threshold_bytes: int = 16384


DEFAULT_PARAMS = NcclParams()
