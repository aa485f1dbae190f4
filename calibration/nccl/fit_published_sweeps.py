"""Fit the A100's and the H100's collectives within one node to published nccl-tests sweeps.

Run from the repository root: ``python calibration/nccl/fit_published_sweeps.py`` (``--dry-run``
prints without writing). It writes each fit as the next version of its GPUs' calibrations, when it
differs from the newest. Nothing here is imported by ovsim.

NCCL's own cost model, which ovsim plans collectives with, is fast below 1 GiB: an 8-GPU A100
node's ring all-reduce reaches 55-120 GB/s of bus bandwidth at 4-16 MiB where the model gives
99-169 GB/s, and 230 GB/s only from 1 GiB; an H100 node's NVLS all-reduce 130-290 GB/s at 4-32 MiB
where the model gives 180-400. The fit
(:func:`ovsim.calibrate.collectives.fit_node_sweep`) keeps NCCL's choice of algorithm and protocol
and, per algorithm and protocol, adds a latency to the model's and scales the model's bus bandwidth,
on the sweep of :data:`ovsim.validate.node.SWEEPS` marked as each family's fit:

- A100: oracle-japan's BM.GPU4.8 tutorial (8 A100-SXM4-40GB, CUDA 11.3), rings; both A100 parts take
  it (the same GA100 die and NVLink 3 through NVSwitch).
- H100: a Voltage Park node (8 H100 SXM5, NCCL 2.24.3), NVLS and rings on LL; the H200 takes it too
  (the same NVLink 4 and NVSwitch; its own published sweep is held out).

Both sweeps are of whole 8-GPU nodes, and the costs hold for 8-rank communicators only
(``nccl_node_ranks``).

The other sweeps there, on other nodes, NCCL versions and collectives, are held out (``ovsim validate``).
"""

from __future__ import annotations

import argparse
import sys

from ovsim.calibrate import FitReport, write_shipped
from ovsim.calibrate.collectives import fit_node_sweep
from ovsim.validate.node import SWEEPS

COMMAND = "python calibration/nccl/fit_published_sweeps.py"
# The GPU family of each fitted sweep's GPU, and the calibration files that take its fit.
FAMILIES = {"a100-sxm4-40gb": ("a100-sxm4-40gb", "a100-sxm4-80gb"), "h100-sxm5-80gb": ("h100-sxm5-80gb", "h200-sxm")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fits, write nothing")
    args = ap.parse_args()
    for sweep in (sw for sw in SWEEPS if sw.fitted):
        values, record = fit_node_sweep(sweep.scored(), sweep.plan)
        print(sweep.name)
        for key, r in record["groups"].items():
            print(f"  {key}: {r}")
        print(f"  {values}")
        source = (f"fit: {sweep.op.replace('_', '-')} of 8 GPUs on one node, {sweep.source}, sizes 64 KiB-2 GiB, per "
                  f"algorithm and protocol over the sizes NCCL's model gives them "
                  f"(ovsim.calibrate.collectives.fit_node_sweep); {COMMAND}")
        report = FitReport(parameters=values, sources={k: source for k in values},
                           fits={"node_sweep": {**record, "sweep": sweep.name}})
        for stem in FAMILIES[sweep.gpu]:
            _, done = write_shipped(report, [], stem, COMMAND, dry_run=args.dry_run)
            print(f"  {stem}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
