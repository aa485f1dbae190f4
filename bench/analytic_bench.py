"""Analytic-fidelity throughput at many ranks, on engine_bench's synthetic data-parallel iteration.

Every rank runs the same compute stream with a gradient all-reduce over all ranks after every ~20
kernels; the analytic fidelity (ovsim.engine.analytic) orders the ops and joins each collective's
members. ``analytic_timeline`` is timed; with ``--power`` also what a whole analytic prediction
adds on every rank (the windowed power-limit loop's passes, its timeline and the power and clock
counters); with ``--engine`` the engine (``Engine.run``, no counters, no power loop) runs the same
workload too and the ratio of its time to ``analytic_timeline``'s is printed. The workload is
made op by op, each rank with host gaps of its own: every rank is worked out (no rank symmetry).

    python bench/analytic_bench.py                    # 100,000 kernels on 64, 256 and 512 ranks
    python bench/analytic_bench.py --kernels 20000 --ranks 1024
    python bench/analytic_bench.py --kernels 20000 --ranks 8 64 512 --engine
    python bench/analytic_bench.py --kernels 200000 --ranks 512 2048 8192 --power
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_bench import build

from ovsim.api import power_config
from ovsim.engine.analytic import Plan, analytic_timeline
from ovsim.engine.machine import build_machine
from ovsim.engine.power_analytic import OpTerms, throttled_timeline
from ovsim.engine.power_counters import analytic_power
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.hw.calib import Calibration, load_calibration
from ovsim.hw.power import PowerSettings
from ovsim.hw.spec import GpuSpec, load_gpu, load_system
from ovsim.models.ir import Workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=100_000, help="total kernels (all ranks)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 512])
    ap.add_argument("--engine", action="store_true", help="also time the engine on each workload")
    ap.add_argument("--power", action="store_true",
                    help="also time the power-limit loop and counters a whole analytic prediction adds")
    args = ap.parse_args(argv)
    gpu = load_gpu("h100-sxm5-80gb")
    # Nodes of 8 H100s joined by eight 400 Gb/s NICs each (the shipped hgx-h100-ndr).
    system = load_system("hgx-h100-ndr").model_copy(update={"nodes": -(-max(args.ranks) // 8), "nvls": False})
    calib = load_calibration(gpu, "h100-sxm5-80gb")
    params = calib.params
    engine_cols = f" {'engine s':>9} {'engine/analytic':>15}" if args.engine else ""
    power_cols = f" {'power loop s':>12} {'counters s':>10}" if args.power else ""
    print(f"{'ranks':>6} {'kernels':>9} {'collectives':>11} {'build s':>8} {'analytic s':>10} {'kernels/s':>10}"
          + power_cols + engine_cols)
    for n in args.ranks:
        t0 = time.perf_counter()
        wl = build(args.kernels, n, gpu, system, params)
        t1 = time.perf_counter()
        tl = analytic_timeline(wl)
        t2 = time.perf_counter()
        groups = len({op.flow.group for op in wl.ops if op.flow is not None})
        assert len(tl.ops) > 0
        row = f"{n:>6} {len(wl.ops):>9} {groups:>11} {t1 - t0:>8.2f} {t2 - t1:>10.2f} {len(wl.ops) / (t2 - t1):>10.0f}"
        if args.power:
            row += " " + _power_times(wl, gpu, calib)
        if args.engine:
            machine = build_machine(system, gpu, params, n_ranks=n)
            t3 = time.perf_counter()
            Engine(wl, machine, EngineOptions(counters=False)).run()
            t_engine = time.perf_counter() - t3
            row += f" {t_engine:>9.2f} {t_engine / (t2 - t1):>15.1f}"
        print(row, flush=True)
    return 0


def _power_times(wl: Workload, gpu: GpuSpec, calib: Calibration) -> str:
    """The seconds a whole analytic prediction spends, after its plan and terms, in the windowed
    power-limit loop with its timeline, then in the power and clock counters."""
    cfg = power_config(wl, gpu, calib, PowerSettings())
    plan = Plan.of(wl)
    terms = OpTerms.of(wl, gpu, cfg.model)
    t0 = time.perf_counter()
    tl, clocks = throttled_timeline(wl, gpu, cfg, plan, terms)
    t1 = time.perf_counter()
    analytic_power(tl, wl, gpu, cfg, clocks, terms)
    t2 = time.perf_counter()
    return f"{t1 - t0:>12.2f} {t2 - t1:>10.2f}"


if __name__ == "__main__":
    sys.exit(main())
