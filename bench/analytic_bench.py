"""Analytic-fidelity throughput at many ranks, on engine_bench's synthetic data-parallel iteration.

Every rank runs the same compute stream with a gradient all-reduce over all ranks after every ~20
kernels; the analytic fidelity (ovsim.engine.analytic) orders the ops and joins each collective's
members. Only ``analytic_timeline`` is timed; with ``--engine`` the engine (``Engine.run``, no
counters, no power loop) runs the same workload too and the ratio of the two times is printed.

    python bench/analytic_bench.py                    # 100,000 kernels on 64, 256 and 512 ranks
    python bench/analytic_bench.py --kernels 20000 --ranks 1024
    python bench/analytic_bench.py --kernels 20000 --ranks 8 64 512 --engine
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_bench import build

from ovsim.engine.analytic import analytic_timeline
from ovsim.engine.machine import build_machine
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import load_gpu, load_system


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=100_000, help="total kernels (all ranks)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 512])
    ap.add_argument("--engine", action="store_true", help="also time the engine on each workload")
    args = ap.parse_args(argv)
    gpu = load_gpu("h100-sxm5-80gb")
    # Nodes of 8 H100s joined by eight 400 Gb/s NICs each (the shipped hgx-h100-ndr).
    system = load_system("hgx-h100-ndr").model_copy(update={"nodes": -(-max(args.ranks) // 8), "nvls": False})
    params = load_calibration(gpu, "h100-sxm5-80gb").params
    engine_cols = f" {'engine s':>9} {'engine/analytic':>15}" if args.engine else ""
    print(f"{'ranks':>6} {'kernels':>9} {'collectives':>11} {'build s':>8} {'analytic s':>10} {'kernels/s':>10}"
          + engine_cols)
    for n in args.ranks:
        t0 = time.perf_counter()
        wl = build(args.kernels, n, gpu, system, params)
        t1 = time.perf_counter()
        tl = analytic_timeline(wl)
        t2 = time.perf_counter()
        groups = len({op.flow.group for op in wl.ops if op.flow is not None})
        assert len(tl.ops) > 0
        row = f"{n:>6} {len(wl.ops):>9} {groups:>11} {t1 - t0:>8.2f} {t2 - t1:>10.2f} {len(wl.ops) / (t2 - t1):>10.0f}"
        if args.engine:
            machine = build_machine(system, gpu, params, n_ranks=n)
            t3 = time.perf_counter()
            Engine(wl, machine, EngineOptions(counters=False)).run()
            t_engine = time.perf_counter() - t3
            row += f" {t_engine:>9.2f} {t_engine / (t2 - t1):>15.1f}"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
