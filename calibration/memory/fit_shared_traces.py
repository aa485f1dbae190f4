"""Fit the shipped per-kernel overhead (``kernel_overhead_s``, from tiny elementwise kernels) and
memory-bound kernel parameters (``memory_kernel_efficiency``, ``memory_kind_efficiency``, and
``hbm_achievable_fraction`` where streaming kernels were measured to reach more; priced on top of
the fitted overhead) on the shared real traces, and write each GPU's next calibration version.

Per GPU, the traces whose device it recorded and whose operators recorded input shapes and types
(``ovsim.validate.MEMORY_CASES``):

- h100-sxm5-80gb: the five TraceLens H100 inference traces (three have kernels large enough);
- a100-sxm4-80gb: HTA ``rank0`` (A100-SXM4-80GB). HTA ``sampled_rank-0`` is left out: it does not
  record its device, and whether it ran on a 40 GB (1.56 TB/s) or 80 GB (2.04 TB/s) A100 decides
  its bandwidth;
- v100-sxm2: HTA ``trace_diff/test`` (V100-SXM2-16GB).

The held-out figures (leave one trace out) come from ``ovsim validate --traces`` and
``python bench/memory_fit_holdout.py``.

    python calibration/memory/fit_shared_traces.py [--traces DIR] [--dry-run]

Writes nothing for a GPU whose newest file already holds the same fitted values.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ovsim.calibrate import calibrate, trace_input, write_shipped
from ovsim.validate import MEMORY_CASES

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument("--dry-run", action="store_true", help="print the fits, write nothing")
    args = ap.parse_args()
    for gpu, rels in MEMORY_CASES.items():
        inputs = [trace_input([args.traces / rel], gpu) for rel in rels if (args.traces / rel).exists()]
        if not inputs:
            print(f"{gpu}: no shared traces under {args.traces}", file=sys.stderr)
            return 1
        report = calibrate(inputs, gpu, quantities=["overhead", "memory"])
        print(json.dumps({"gpu": gpu, "parameters": report.parameters, "fits": report.fits}, indent=1))
        _, done = write_shipped(report, inputs, gpu, "python calibration/memory/fit_shared_traces.py",
                                dry_run=args.dry_run)
        print(f"{gpu}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
