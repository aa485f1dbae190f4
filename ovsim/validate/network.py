"""Checks of collectives across nodes joined by NICs, against published nccl-tests figures.

Each row plans the collective with NCCL's model (:mod:`ovsim.models.nccl`) on the system the
source describes and compares nccl-tests' bus bandwidth; each sweep row compares the all-reduce's
time at every size of a published sweep from 1 MiB up (the sizes training's collectives have).
The NICs' rating is NCCL's own speed ladder. The rows the model was shaped on are calibration
sources: the run NVLS-tree's pipeline fill is fitted on, and the sweeps on which the ring's time was
decided to leave out NCCL's plateau factor. Where a source does not say which
algorithm NCCL ran, the row lets the model choose as NCCL would; sources that reported a
misconfigured or underperforming fabric are left out (docs/design.md, "Nodes joined by NICs").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ovsim.hw.spec import SystemSpec, load_gpu, load_system
from ovsim.models import nccl

if TYPE_CHECKING:
    from ovsim.hw.calib import Parameters
    from ovsim.validate.check import Check

NETWORK_GROUP = "published (across nodes, not fitted)"
# Rows the model was shaped on: the run NVLS-tree's pipeline fill (NetParams.nvls_tree_fill_stages)
# is fitted on, and the sweeps the ring's time was decided on (leaving the plateau factor out).
NETWORK_FIT_GROUP = "published (across nodes, calibration source)"
GIB = 2**30


def _system(name: str, nodes: int, nics_per_node: int | None = None, gpu: str | None = None) -> SystemSpec:
    base = load_system(name)
    update: dict[str, object] = {"nodes": nodes, "gpu": gpu or base.gpu}
    if nics_per_node is not None and base.network is not None:
        update["network"] = base.network.model_copy(update={"nics_per_node": nics_per_node})
    return base.model_copy(update=update)


def busbw_gb_s(op: str, size_bytes: float, system: SystemSpec, algorithm: str | None = None,
               params: Parameters | None = None) -> float:
    """nccl-tests' bus bandwidth (GB/s) of ``op`` over every GPU of ``system``, as NCCL's model
    plans it, priced with ``params``' measured costs within a node where given
    (:func:`ovsim.models.nccl.calibrated_plan`; across nodes they change nothing)."""
    gpu = load_gpu(system.gpu)
    plan = nccl.plan_collective(op, size_bytes, system.total_gpus, gpu, system,  # type: ignore[arg-type]
                                algorithm=algorithm)  # type: ignore[arg-type]
    if params is not None:
        plan = nccl.calibrated_plan(plan, params)
    return plan.algorithm_bandwidth_bytes_per_s * nccl.bus_factor(plan.op, plan.n_ranks) / 1e9


@dataclass(frozen=True)
class _Row:
    """One published all-reduce figure and the system it was measured on."""

    name: str
    reference_gb_s: float
    size_bytes: float
    system: str
    nodes: int
    source: str
    algorithm: str | None = None
    nics_per_node: int | None = None
    gpu: str | None = None
    # The model was shaped on this row (NETWORK_FIT_GROUP).
    fitted: bool = False
    # The sizes of an nccl-tests sweep whose "Avg bus bandwidth" (the mean over its sizes) the
    # reference is; empty: the reference is the busbw at ``size_bytes``.
    sweep: tuple[float, ...] = ()

    def predicted_gb_s(self) -> float:
        system = _system(self.system, self.nodes, self.nics_per_node, self.gpu)
        sizes = self.sweep or (self.size_bytes,)
        return sum(busbw_gb_s("all_reduce", s, system, self.algorithm) for s in sizes) / len(sizes)


# nccl-tests -b 8 -e 128M -i 1048576: 8 B, then 1 MiB steps up to 128 MiB.
_SWEEP_128M = (8.0, *(8.0 + i * 2**20 for i in range(1, 128)))
_H100, _A100 = "hgx-h100-ndr", "dgx-a100-hdr"
ROWS: tuple[_Row, ...] = (
    _Row("NCCL all-reduce busbw, ring, 2x 8 H100, 8x 400G IB, 8 GiB", 396.0, 8 * GIB, _H100, 2,
         "NVIDIA/nccl-tests #319 (NVIDIA maintainer: 'around 48GB/s from each CX7 NIC at 400Gbps ... up to "
         "~396GB/s with the RING protocol'; 2 nodes with NCCL_ALGO=RING)", algorithm="ring"),
    _Row("NCCL all-reduce busbw, 2x 8 H100, 8x 400G IB, 16 GiB", 470.0, 16 * GIB, _H100, 2,
         "NVIDIA/nccl-tests #309 (Dell XE9680 nodes: 'each 2 nodes with 16 pairs can still get 470 GB/s'; "
         "NCCL's default, NVLS-tree at 2 nodes; the run NVLS-tree's pipeline fill is fitted on)", fitted=True),
    _Row("NCCL all-reduce busbw, 4x 8 H100, 8x 400G IB, 8 GiB", 390.33, 8 * GIB, _H100, 4,
         "jingchaozhang.github.io, 'Debugging InfiniBand performance degradation' (Azure H100 nodes, 8 "
         "ConnectX-7 NICs each, 32 GPUs, NCCL 2.22.3 with 32 channels: 390.33 GB/s at 8 GiB)"),
    _Row("NCCL all-reduce busbw, 4x 8 H100, 8x 400G IB (VMs), 16 GiB", 365.84, 16 * GIB, _H100, 4,
         "NVIDIA/nccl-tests #309 (Dell XE9680, 8x H100 and 8x CX-7 400G IB per node, NCCL 2.26.2: "
         "'4 nodes on 32 GPU-NIC pairs ... max busbw can get 365.84 GB/s')"),
    _Row("NCCL all-reduce busbw, 248x 8 H200, 8 NICs, 512 MiB", 350.0, 512 * 2**20, _H100, 248,
         "NVIDIA/nccl-tests #283 (1,984 H200 on 248 nodes of 8 HCAs, NCCL's default: '~350' GB/s at 512 MB, "
         "'sometimes <300'; 400 Gb/s NICs assumed)", gpu="h200-sxm"),
    _Row("NCCL all-reduce busbw, DGX A100 nodes, 8x 200G IB", 192.0, 8 * GIB, _A100, 4,
         "NVIDIA/nccl #812 (NVIDIA maintainer: 'On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards "
         "and we measure 192GB/s AllReduce BusBW'; node count not stated, 4 assumed)"),
    _Row("NCCL all-reduce busbw, 2x 8 A100, 4x 200G IB, 1-8 GiB", 91.0, 8 * GIB, _A100, 2,
         "NVIDIA/nccl-tests #100 (2 HGX A100 80GB nodes, 4 ConnectX-6 200G NICs each: 91 GB/s)", nics_per_node=4),
    _Row("NCCL all-reduce busbw, 3x 8 A100, 4x 200G IB, 125 MiB", 96.45, 8.0 + 125 * 2**20, _A100, 3,
         "NVIDIA/nccl-tests #119 (3 nodes of 8 A100-SXM4-40GB, 4 HDR NICs each: out-of-place busbw 96.45 GB/s "
         "at 131,072,008 B, the sweep's peak; NVIDIA maintainer: 'it's perfect'; the ring's time was decided "
         "on it)", nics_per_node=4, gpu="a100-sxm4-40gb", fitted=True),
    _Row("NCCL all-reduce busbw, 3x 8 A100, 4x 200G IB, mean over 8 B-128 MiB", 84.8558, 128 * 2**20, _A100, 3,
         "NVIDIA/nccl-tests #119 (as above: 'Avg bus bandwidth : 84.8558' over -b 8 -e 128M in 1 MiB steps)",
         nics_per_node=4, gpu="a100-sxm4-40gb", sweep=_SWEEP_128M, fitted=True),
)


@dataclass(frozen=True)
class _Sweep:
    """A published all_reduce_perf sweep: (size in bytes, out-of-place time in us) from 1 MiB up."""

    name: str
    source: str
    system: str
    nodes: int
    rows: tuple[tuple[float, float], ...]
    algorithm: str | None = None
    # The NVLS-tree pipeline's fill was fitted on this sweep.
    fitted: bool = False

    def errors(self) -> list[tuple[float, float]]:
        """(size, predicted time over measured - 1) at each size."""
        system = _system(self.system, self.nodes)
        gpu = load_gpu(system.gpu)
        out = []
        for size, time_us in self.rows:
            plan = nccl.plan_collective("all_reduce", size, system.total_gpus, gpu, system,
                                        algorithm=self.algorithm)  # type: ignore[arg-type]
            out.append((size, plan.isolated_s * 1e6 / time_us - 1.0))
        return out


def doubling(first: int, values: tuple[float, ...]) -> tuple[tuple[float, float], ...]:
    """(size, value) rows of a sweep whose sizes double from ``first`` bytes (nccl-tests' -f 2)."""
    return tuple((float(first * 2**i), v) for i, v in enumerate(values))


SWEEPS: tuple[_Sweep, ...] = (
    _Sweep("NCCL all-reduce time, 2x 8 H100, 8x 400G IB, NCCL's default, 1 MiB-16 GiB",
           "NVIDIA/nccl-tests #309 (Dell XE9680, 8 ConnectX-7 400G IB a node, NCCL 2.26.2, -b 8 -e 16g -f 2; "
           "469 GB/s busbw at 16 GiB: NVLS-tree; NVLS-tree's pipeline fill fitted on its 16 MiB-16 GiB)", _H100, 2,
           doubling(2**20, (71.93, 76.24, 94.38, 132.6, 185.4, 267.9, 466.1, 748.3, 1282.8, 2357.6, 4484.9,
                             8729.8, 17262.0, 34381.0, 68652.0)), fitted=True),
    _Sweep("NCCL all-reduce time, 2x 8 H100, 8x 400G IB, NCCL's default, 1 MiB-8 GiB, a second cluster",
           "NVIDIA/nccl-tests #309 (a second cluster of 8 H100 and 8 400G IB NICs a node, 2 of its 8 nodes, "
           "-b 1M -e 8G -f 2; 466.7 GB/s busbw at 8 GiB)", _H100, 2,
           doubling(2**20, (93.25, 94.22, 110.9, 151.6, 201.6, 274.8, 477.2, 750.7, 1296.2, 2376.5, 4497.4,
                             8766.9, 17290.0, 34508.0))),
    _Sweep("NCCL all-reduce time, 4x 8 H100, 8x 400G IB (VMs), NCCL's default, 1 MiB-16 GiB",
           "NVIDIA/nccl-tests #309 (as above, 4 nodes in VMs; 365.84 GB/s busbw at 16 GiB, which an NVIDIA "
           "maintainer called a good number)", _H100, 4,
           doubling(2**20, (82.17, 191.3, 151.1, 217.3, 259.6, 376.0, 579.1, 990.7, 1768.0, 3109.0, 5808.8,
                             11508.0, 22890.0, 45606.0, 90986.0))),
    _Sweep("NCCL all-reduce time, 2x 8 H100, 8x 400G IB, ring, 1 MiB-8 GiB",
           "NVIDIA/nccl-tests #309 (a second cluster of 8 H100 and 8 400G IB NICs a node: NCCL_ALGO=Ring "
           "NCCL_MIN_CTAS=24 NCCL_IB_QPS_PER_CONNECTION=2, as an NVIDIA maintainer advised; 392.7 GB/s at 8 GiB; "
           "the ring's time was decided on it)", _H100, 2,
           doubling(2**20, (156.9, 156.6, 178.1, 177.8, 199.3, 274.2, 433.8, 795.8, 1355.9, 2649.9, 5236.2,
                             10340.0, 20575.0, 41015.0)), algorithm="ring", fitted=True),
)


def sweep_check(name: str, group: str, source: str, errors: list[tuple[float, float]], note: str = "") -> Check:
    """A sweep's row: the MAPE of (size, predicted over measured - 1) ``errors``, passing at or
    below 10%, with its signed mean and extremes (and ``note``) in the row's note."""
    from ovsim.validate.check import Check

    rel = [e for _, e in errors]
    mape = sum(abs(e) for e in rel) / len(rel) * 100
    lo, hi = min(errors, key=lambda x: x[1]), max(errors, key=lambda x: x[1])
    mib = 2**20
    return Check(name, group, 10.0, mape, "% MAPE", 0.0, source, rule="at_most",
                 note=f"signed mean {sum(rel) / len(rel) * 100:+.1f}%; from {lo[1] * 100:+.1f}% at "
                      f"{lo[0] / mib:g} MiB to {hi[1] * 100:+.1f}% at {hi[0] / mib:g} MiB; {note}"
                      "passes at or below 10%")


def network_checks() -> list[Check]:
    from ovsim.validate.check import Check

    rows = [Check(r.name, NETWORK_FIT_GROUP if r.fitted else NETWORK_GROUP, r.reference_gb_s, r.predicted_gb_s(),
                  "GB/s", 10.0, r.source) for r in ROWS]
    return rows + [sweep_check(sw.name, NETWORK_FIT_GROUP if sw.fitted else NETWORK_GROUP, sw.source, sw.errors())
                   for sw in SWEEPS]
