"""Fit the A100's ring collectives within one node to a published nccl-tests sweep.

Run from the repository root: ``python calibration/nccl/fit_published_sweeps.py`` (``--dry-run``
prints without writing). It writes the fit as the next version of both A100 calibrations, when it
differs from the newest. Nothing here is imported by ovsim.

NCCL's own cost model, which ovsim plans collectives with, gives an 8-GPU A100 node's all-reduce
220-240 GB/s of bus bandwidth from 4 MiB up; measured, it reaches 55-120 GB/s at 4-16 MiB and 230
GB/s only from 1 GiB. The fit (:func:`ovsim.calibrate.collectives.fit_ring_sweep`) keeps NCCL's
choice of protocol and, per protocol, adds a time per ring step to the model's latency and scales
the model's bus bandwidth, on the first sweep of :data:`ovsim.node_checks.SWEEPS` (oracle-japan's
BM.GPU4.8 tutorial: 8 A100-SXM4-40GB, CUDA 11.3, 4 MiB-2 GiB). The other sweeps there, on other
nodes, NCCL versions and both memory sizes, are held out (``ovsim validate``). The 40 GB and 80
GB parts take the same values: the same GA100 die and NVLink 3 through NVSwitch.
"""

from __future__ import annotations

import argparse
import sys

from ovsim.calibrate import FitReport, write_shipped
from ovsim.calibrate.collectives import fit_ring_sweep
from ovsim.node_checks import SWEEPS

COMMAND = "python calibration/nccl/fit_published_sweeps.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = ap.parse_args()
    sweep = next(sw for sw in SWEEPS if sw.fitted)
    values, record = fit_ring_sweep(sweep.scored(), sweep.plan)
    for proto, r in record["protocols"].items():
        print(f"{proto}: {r}")
    print(values)
    source = (f"fit: all-reduce of 8 A100s on one node, {sweep.source}, sizes 4 MiB-2 GiB, per protocol over "
              f"the sizes NCCL's model gives it (ovsim.calibrate.collectives.fit_ring_sweep); {COMMAND}")
    report = FitReport(parameters=values, sources={k: source for k in values},
                       fits={"ring_sweep": {**record, "sweep": sweep.name}})
    for stem in ("a100-sxm4-40gb", "a100-sxm4-80gb"):
        _, done = write_shipped(report, [], stem, COMMAND, dry_run=args.dry_run)
        print(f"{stem}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
