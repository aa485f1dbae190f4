"""Fit the shipped contention parameters (``nccl_memory_pressure``, ``replay_hbm_fraction``) on the
shared real traces and write them as the next version of ``ovsim/hw/calib/default``.

Every trace with compute kernels measured both alone and beside a collective takes part (A100,
V100 and MI300X runs; ``ovsim.validate.TRACE_CASES``). The parameters are GPU-independent shares
(of HBM capacity, of achievable bandwidth), so one fit over all of them goes into the file that
applies to every GPU. The held-out figures (each trace replayed with parameters fitted on the
others) come from ``ovsim validate --traces``.

    python calibration/contention/fit_shared_traces.py [--traces DIR] [--dry-run]

Writes nothing when the newest default file already holds the same fitted values.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ovsim.calibrate import calibrate, trace_input, write_shipped
from ovsim.validate import TRACE_CASES

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = ap.parse_args()
    inputs = [trace_input([args.traces / rel], gpu) for rel, gpu in TRACE_CASES if (args.traces / rel).exists()]
    if not inputs:
        print(f"no shared traces under {args.traces}", file=sys.stderr)
        return 1
    report = calibrate(inputs, "*", quantities=["contention"])
    print(json.dumps({"parameters": report.parameters, "fit": report.fits["contention"]}, indent=1))
    _, done = write_shipped(report, inputs, "*", "python calibration/contention/fit_shared_traces.py",
                            dry_run=args.dry_run)
    print(done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
