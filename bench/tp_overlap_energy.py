"""Where the energy of the tensor-parallel overlap goes: one of NVIDIA's MLPerf Training v3.1 GPT-3
175B runs (bench/mlperf_rows.py; H100 FP8, TP4 x PP8, 12 virtual stages) with each ``tp_overlap``,
with and without the 700 W power-limit loop, in the analytic fidelity. A benchmark: it prints
figures and asserts nothing.

Per configuration: the iteration, each GPU's energy and average power and SM clock; then rank 0's
energy at the ops' isolated activity (what the analytic fidelity sums, docs/power.md) by kind of
op, split into SM work and HBM traffic, with the HBM bytes. Chunking a GEMM along its rows reads
its whole weight once per piece, so the chunked configurations move more HBM bytes for the same
FLOPs.

    python bench/tp_overlap_energy.py               # the 4,096-GPU row, about 10 s
    python bench/tp_overlap_energy.py --gpus 10752
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mlperf_rows import MLPERF_ROWS

from ovsim import api
from ovsim.engine.power_analytic import isolated_activity
from ovsim.scenario import Scenario

OVERLAPS = ("none", "chunked", "copy_engine")


def with_overlap(sc: Scenario, overlap: str) -> Scenario:
    assert sc.training is not None
    t = sc.training
    return sc.model_copy(update={"training": t.model_copy(
        update={"parallel": t.parallel.model_copy(update={"tp_overlap": overlap})})})


def rank0_energy(res: api.Result) -> dict[str, tuple[float, float, float]]:
    """By kind of op, rank 0's SM and HBM energy (J) at the ops' isolated activity, and HBM bytes."""
    assert res.power_config is not None
    m = res.power_config.model
    rank = res.workload.ops[0].rank
    sm: dict[str, float] = collections.defaultdict(float)
    hbm: dict[str, float] = collections.defaultdict(float)
    nbytes: dict[str, float] = collections.defaultdict(float)
    for op in res.workload.ops:
        if op.rank != rank or op.isolated_s <= 0:
            continue
        a = isolated_activity(op, res.gpu, m)
        sm[op.kind] += a.sm_w * op.isolated_s
        hbm[op.kind] += m.hbm_w * min(1.0, a.hbm_bytes_per_s / m.hbm_peak_bytes_per_s) * op.isolated_s
        nbytes[op.kind] += a.hbm_bytes_per_s * op.isolated_s
    return {k: (sm[k], hbm[k], nbytes[k]) for k in sorted(nbytes)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=4096, choices=sorted({r.gpus for r in MLPERF_ROWS}))
    args = ap.parse_args(argv)
    row = next(r for r in MLPERF_ROWS if r.gpus == args.gpus)
    print(f"MLPerf v3.1 GPT-3 175B on {row.gpus} H100, analytic; energy per GPU and iteration")
    print(f"{'tp_overlap':>12} {'power loop':>10} {'iter s':>7} {'J/GPU':>6} {'avg W':>6} {'MHz':>5}")
    breakdowns = {}
    for overlap in OVERLAPS:
        sc = with_overlap(row.scenario(), overlap)
        for managed in (True, False):
            res = api.predict(sc, mode="analytic", power_managed=managed)
            p = res.power()
            clock_mhz = p["avg_sm_clock_hz"].mean() / 1e6
            print(f"{overlap:>12} {'on' if managed else 'off':>10} {res.timeline.makespan_s:7.3f} "
                  f"{p['energy_j'].mean():6.0f} {p['avg_power_w'].mean():6.0f} {clock_mhz:5.0f}")
            if not managed:
                breakdowns[overlap] = rank0_energy(res)
    print("\nrank 0 at isolated activity (power loop off): SM J, HBM J, HBM GB by kind of op")
    for overlap, rows in breakdowns.items():
        cells = "; ".join(f"{k} {s:.0f} + {h:.0f} J, {b / 1e9:.0f} GB" for k, (s, h, b) in rows.items())
        print(f"{overlap:>12}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
