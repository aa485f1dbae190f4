"""Sweep throughput: scenarios predicted per second, on the GPT-3 1.3B FSDP example, analytic and simulate.

The grid varies the power cap (100-400 W), the micro-batch (1, 2, 4, 8), the FSDP prefetch (0, 1),
the communication stream's priority and NCCL's channels (2-32): 10,000 combinations by default,
fewer with ``--scenarios`` (a multiple of 80). Each mode's sweep is timed whole, as `ovsim sweep`
runs it (grid built and validated, predictions in ``--workers`` processes or on a Dask cluster).

    python bench/sweep_bench.py                                  # 10,000 a mode, one process
    python bench/sweep_bench.py --scenarios 800 --workers 2
    python bench/sweep_bench.py --scheduler tcp://host:8786      # on a Dask cluster
    python bench/sweep_bench.py --results /tmp/r                 # keeping results as they finish
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

from ovsim.sweep import sweep

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml"
FIXED: dict[str, list[object]] = {"training.micro_batch_size": [1, 2, 4, 8], "training.parallel.fsdp_prefetch": [0, 1],
         "knobs.comm_priority": ["normal", "high"], "knobs.nccl_channels": [2, 4, 8, 16, 32]}
PER_CAP = 80  # combinations of the fixed axes


def axes(n: int) -> dict[str, list[object]]:
    caps = max(1, n // PER_CAP)
    return {"power.cap_w": [round(float(x), 3) for x in np.linspace(100.0, 400.0, caps)], **FIXED}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", type=int, default=10_000, help="combinations a mode (rounded down to 80s)")
    ap.add_argument("--modes", nargs="+", default=["analytic", "simulate"], choices=["analytic", "simulate"])
    ap.add_argument("--workers", type=int, default=1, help="processes (0: one per core)")
    ap.add_argument("--scheduler", help="a Dask scheduler's address")
    ap.add_argument("--results", help="a folder to keep results in (emptied first, one subfolder a mode)")
    args = ap.parse_args()
    grid = axes(args.scenarios)
    n = int(np.prod([len(v) for v in grid.values()]))
    print(f"{n:,} scenarios of {EXAMPLE.name}, workers={args.workers}"
          f"{', scheduler ' + args.scheduler if args.scheduler else ''}")
    for mode in args.modes:
        folder = None
        if args.results:
            folder = Path(args.results) / mode
            shutil.rmtree(folder, ignore_errors=True)
        t0 = time.perf_counter()
        df = sweep(EXAMPLE, grid, mode=mode, workers=args.workers, scheduler=args.scheduler,
                   max_combinations=n, results=folder)
        wall = time.perf_counter() - t0
        print(f"  {mode:<9} {wall:8.1f} s  {n / wall:8.1f} scenarios/s  "
              f"(iteration {df['makespan_s'].min() * 1e3:.0f}-{df['makespan_s'].max() * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
