"""Checks of collectives within one node, against published nccl-tests sweeps.

NCCL's own cost model, which ovsim plans collectives with (:mod:`ovsim.models.nccl`), is fast at
the sizes training's collectives have: on an 8-GPU A100 node its ring all-reduce time is off by
18-25% (MAPE over 4 MiB to 2 GiB of three sweeps), on an H100 node its NVLS all-reduce's is short
by 26-34% at 4-32 MiB and 9-17% at 64-256 MiB. A GPU's calibration can carry its measured costs within a node
(``nccl_ring_added_latency_s``, ``nccl_ring_bus_efficiency``, ``nccl_nvls_added_latency_s``,
``nccl_nvls_bus_efficiency`` for ``nccl_node_ranks`` ranks: :func:`ovsim.models.nccl.calibrated_plan`),
fitted on one published sweep per GPU family (:func:`ovsim.calibrate.collectives.fit_node_sweep`,
run by calibration/nccl/fit_published_sweeps.py). Each row here is one sweep's MAPE of the
collective's time over its sizes from 64 KiB (or its first) to 2 GiB, priced as a scenario prices
it, with the shipped calibration; the rows not fitted are held out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ovsim.hw.calib import Parameters, shipped_parameters
from ovsim.hw.spec import load_gpu, load_system
from ovsim.models import nccl
from ovsim.validate.network import doubling, sweep_check

if TYPE_CHECKING:
    from ovsim.validate.check import Check

NODE_GROUP = "published (one node, not fitted)"
NODE_FIT_GROUP = "published (one node, calibration source)"
MIB = 2**20
# The sizes a row scores and a fit uses: from small buckets and scalars' reductions (where the sweep
# has them) to FSDP's largest layers.
SMALLEST, LARGEST = 64 * 1024, 2048 * MIB


@dataclass(frozen=True)
class NodeSweep:
    """A published nccl-tests sweep on one node: (size in bytes, bus bandwidth in GB/s)."""

    name: str
    source: str
    system: str
    gpu: str
    rows: tuple[tuple[float, float], ...]
    # The GPU family's costs within a node were fitted on this sweep (NODE_FIT_GROUP).
    fitted: bool = False
    # nccl-tests' collective; its size is nccl-tests' (all-gather, reduce-scatter: the whole buffer).
    op: str = "all_reduce"

    def scored(self) -> tuple[tuple[float, float], ...]:
        return tuple((s, b) for s, b in self.rows if SMALLEST <= s <= LARGEST)

    def plan(self, size_bytes: float, params: Parameters | None = None) -> nccl.CollectivePlan:
        """The collective of ``size_bytes`` over the node, as NCCL's model plans it, priced with
        ``params`` (None: NCCL's model alone)."""
        system = load_system(self.system).model_copy(update={"gpu": self.gpu})
        plan = nccl.plan_collective(self.op, size_bytes, system.total_gpus, load_gpu(self.gpu),  # type: ignore[arg-type]
                                    system)
        if params is None:
            return plan
        return nccl.calibrated_plan(plan, params)

    def errors(self, params: Parameters | None) -> list[tuple[float, float]]:
        """(size, predicted time over measured - 1) at each scored size."""
        out = []
        for size, busbw in self.scored():
            plan = self.plan(size, params)
            measured_s = size * nccl.bus_factor(plan.op, plan.n_ranks) / (busbw * 1e9)
            out.append((size, plan.isolated_s / measured_s - 1.0))
        return out


_DGX_A100 = "dgx-a100"
SWEEPS: tuple[NodeSweep, ...] = (
    NodeSweep("NCCL all-reduce time, 8x A100 SXM4 40 GB (OCI BM.GPU4.8), 64 KiB-2 GiB",
              "oracle-japan/ocitutorials, 'GPUクラスタを構築する' (Horovod version): all_reduce_perf -b 64 -e 10G -f 2 "
              "-t 1 -g 8 on one BM.GPU4.8 (8 A100-SXM4-40GB), CUDA 11.3, out-of-place busbw; the A100's ring "
              "costs are fitted on it", _DGX_A100, "a100-sxm4-40gb",
              doubling(64 * 1024, (3.24, 5.96, 10.15, 15.56, 23.92, 32.66, 54.57, 79.02, 119.81, 147.46, 199.23,
                                    197.17, 221.38, 223.26, 230.08, 231.52)), fitted=True),
    NodeSweep("NCCL all-reduce time, 8x A100 SXM4 80 GB (Azure ND A100 v4), 4 MiB-2 GiB",
              "Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md (NCCL 2.18.5, CUDA 12.5; "
              "all_reduce_perf -b 8 -e 8G -f 2 -n 40 on all 8 GPUs, in-place busbw; its script sets NCCL_ALGO=NVLS, "
              "which A100s do not support, and the figures are a ring's)", _DGX_A100, "a100-sxm4-80gb",
              doubling(4 * MIB, (71.43, 89.99, 109.22, 132.77, 166.63, 174.18, 213.87, 221.58, 228.10, 230.22))),
    NodeSweep("NCCL all-reduce time, 8x A100 SXM4 80 GB (NCCL 2.16.2), 32 MiB-1 GiB",
              "theap06/gcm (a fork of facebookresearch/gcm) gcm/tests/health_checks_tests/test_check_nccl.py, "
              "sample_single_success_output: 8 A100-SXM4-80GB on one host, NCCL 2.16.2+cuda11.6, -b 32M -e 1G -f 2 "
              "-g 1 under MPI, out-of-place busbw", _DGX_A100, "a100-sxm4-80gb",
              doubling(32 * MIB, (170.31, 210.68, 204.26, 223.05, 226.63, 231.72))),
    NodeSweep("NCCL all-reduce time, 8x A100 SXM4 40 GB (Galvatron), 4 MiB-1 GiB",
              "AFDWang/Hetu-Galvatron tests/profiler/test_hardware_profile.py (nccl-tests output of 8 "
              "A100-SXM4-40GB on one host, -b 1M -e 1G -f 2 -g 8, out-of-place busbw)", _DGX_A100, "a100-sxm4-40gb",
              doubling(4 * MIB, (55.97, 80.04, 99.99, 141.27, 178.69, 186.91, 200.85, 202.00, 230.84))),
    NodeSweep("NCCL all-gather time, 8x A100 SXM4 40 GB (SuperBench), 4 MiB-2 GiB",
              "microsoft/superbenchmark tests/data/nccl_allgather.log (all_gather_perf -b 1 -e 8G -f 2 -g 8 -c 0 on "
              "8 A100-SXM4-40GB in one process, out-of-place busbw)", _DGX_A100, "a100-sxm4-40gb",
              doubling(4 * MIB, (36.43, 59.44, 87.52, 110.46, 154.65, 168.12, 197.01, 203.88, 212.88, 217.01)),
              op="all_gather"),
    NodeSweep("NCCL reduce-scatter time, 8x A100 SXM4 40 GB (SuperBench), 4 MiB-2 GiB",
              "microsoft/superbenchmark tests/data/nccl_reducescatter.log (reduce_scatter_perf, the same machine and "
              "flags, out-of-place busbw)", _DGX_A100, "a100-sxm4-40gb",
              doubling(4 * MIB, (33.72, 49.84, 96.34, 122.06, 164.89, 190.01, 211.84, 216.58, 223.54, 224.85)),
              op="reduce_scatter"),
    NodeSweep("NCCL all-reduce time, 8x H100 SXM (Voltage Park), 64 KiB-2 GiB",
              "ZiyanIshani/vpbenchmarking results/nccl/nccl_allreduce_20260224_223444.txt (a Voltage Park bare-metal "
              "node of 8 H100 80GB HBM3 SXM5, NCCL 2.24.3, nccl-tests 2.17.9, -b 8 -e 8G -f 2 -g 8, out-of-place "
              "busbw; NCCL's default, NVLS); the H100's and H200's NVLS costs are fitted on it", "hgx-h100",
              "h100-sxm5-80gb",
              doubling(64 * 1024, (3.41, 6.69, 13.09, 24.82, 47.37, 84.89, 131.77, 173.79, 233.25, 293.02, 357.44,
                                    399.19, 422.38, 436.40, 468.53, 474.62)), fitted=True),
    NodeSweep("NCCL all-reduce time, 8x H100 SXM (Azure ND H100 v5), 4 MiB-2 GiB",
              "Azure/AI-benchmarking-guide 'Azure Results/ND_H100_v5_results.md' (NCCL 2.18.5, CUDA 12.6; "
              "NCCL_ALGO=NVLS all_reduce_perf -b 8 -e 8G -f 2 -n 40 on the node's 8 GPUs, in-place busbw)",
              "hgx-h100", "h100-sxm5-80gb",
              doubling(4 * MIB, (128.73, 172.13, 234.45, 295.53, 361.78, 400.61, 423.38, 438.46, 466.35, 472.36))),
    NodeSweep("NCCL all-reduce time, 8x H100 SXM, 128 MiB-2 GiB",
              "NVIDIA/nccl-tests #290 (8 H100 80GB HBM3 on one node, -b 128M -e 4G -f 2 -g 8, two iterations, "
              "out-of-place busbw; an NVIDIA maintainer: 476 GB/s 'in the expected range for H100')",
              "hgx-h100", "h100-sxm5-80gb", doubling(128 * MIB, (382.99, 412.35, 431.81, 465.25, 468.57))),
    NodeSweep("NCCL reduce-scatter time, 8x H100 SXM, ring, 128 MiB-2 GiB",
              "NVIDIA/nccl #1047 (one H100 server, 8 H100 80GB HBM3: the issue's ring table, out-of-place busbw); "
              "the H100 has no ring costs, so this is NCCL's model alone", "hgx-h100", "h100-sxm5-80gb",
              doubling(128 * MIB, (311.34, 330.94, 340.94, 349.36, 354.81)), op="reduce_scatter"),
    NodeSweep("NCCL all-reduce time, 8x H200 SXM (Azure ND H200 v5), 4 MiB-2 GiB",
              "Azure/AI-benchmarking-guide Azure_Results/ND_H200_v5_results.md (NCCL 2.20.5; the same script, "
              "in-place busbw); the H200 takes the H100's fit (the same NVLink 4 and NVSwitch)", "hgx-h200", "h200-sxm",
              doubling(4 * MIB, (138.44, 181.94, 240.41, 300.91, 368.11, 412.45, 432.24, 442.72, 467.58, 472.57))),
)


def _sweep_check(sw: NodeSweep) -> Check:
    err = sw.errors(shipped_parameters(sw.gpu))
    before = sum(abs(e) for _, e in sw.errors(None)) / len(err) * 100
    return sweep_check(sw.name, NODE_FIT_GROUP if sw.fitted else NODE_GROUP, sw.source, err,
                       note=f"NCCL's model alone: {before:.1f}%; ")


def node_checks() -> list[Check]:
    return [_sweep_check(sw) for sw in SWEEPS]
