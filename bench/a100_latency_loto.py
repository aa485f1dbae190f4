"""Can HBM's loaded-latency law follow the shared A100 traces? Leave one trace out.

The law (ovsim.engine.channel.latency_slowdowns, the H100's and H200's) slows a kernel that waits
on memory by how much the collective beside it raises HBM's latency over what the kernel saw alone.
The A100 ships without it (every A100 contention parameter is 0), so replay there is the naive
prediction. This script fits the law's two parameters, the collective's HBM share, how far a
kernel's warps limit its own bandwidth (Little's law: warps / (warps + half)), and the share of a
kernel's fixed overhead that waits on memory, on two of the three A100 traces, and scores the third:
the time-weighted error (sum |predicted - measured| / sum measured over the scored overlapped
kernels) held out, against the replay without contention and the naive prediction.

The closed form multiplies the engine's replay without memory contention (at the shipped SM
share of a collective, 0) by the law's slowdown over the share of each kernel's time a collective
was resident, as ``ovsim calibrate``'s contention fit does.

    python bench/a100_latency_loto.py [--traces TRACES]     # about 40 s
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import differential_evolution

from ovsim.calibrate import SM_FRACTIONS, ContentionData, contention_data, trace_input
from ovsim.engine.channel import latency_slowdowns

CASES = (("HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz", "a100-sxm4-80gb"),
         ("HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz", "a100-sxm4-40gb"),
         ("HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz", "a100-sxm4-80gb"))
MEMORY_KINDS = {"elementwise", "norm", "softmax"}
SHIPPED_SM_FRACTION = SM_FRACTIONS.index(0.0)
# capacity, exponent, collective's HBM share, warps at half bandwidth, overhead's waiting share
BOUNDS = [(1.0, 3.0), (0.5, 8.0), (0.0, 0.9), (1.0, 20000.0), (0.0, 1.0)]


def predicted(d: ContentionData, warps: np.ndarray, x: np.ndarray) -> np.ndarray:
    kappa, q, share, half, overhead_wait = x
    base = d.baseline_s[SHIPPED_SM_FRACTION]
    out = base.copy()
    for i, (kind, colls, moving) in enumerate(d.config):
        if kind not in MEMORY_KINDS or not colls:
            continue
        own = moving * warps[i] / (warps[i] + half)
        wait = moving + (1 - moving) * overhead_wait
        slow, _ = latency_slowdowns([max(own, 1e-6), share], [wait, 0.0], kappa, q)
        out[i] = base[i] * (1 - d.covered[i] + d.covered[i] * slow[0])
    return np.asarray(out, dtype=float)


def weighted_pct(d: ContentionData, pred: np.ndarray) -> float:
    return float(np.abs(pred - d.measured_s).sum() / d.measured_s.sum() * 100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces")
    args = ap.parse_args()
    data = []
    for rel, gpu in CASES:
        if not (args.traces / rel).exists():
            print(f"{args.traces / rel}: missing", file=sys.stderr)
            return 1
        tr = trace_input([args.traces / rel], gpu)
        d = contention_data(tr)
        k = tr.bundle.kernels.reset_index(drop=True).loc[d.rows]
        dims = [k[c].astype(float).fillna(1.0).to_numpy() for c in ("grid_x", "grid_y", "grid_z")]
        threads = np.prod([k[c].astype(float).fillna(1.0).to_numpy() for c in ("block_x", "block_y", "block_z")],
                          axis=0)
        data.append((Path(rel).name, d, np.prod(dims, axis=0) * np.ceil(threads / 32)))
    print(f"{'held out':<24} {'law, held out':>14} {'no contention':>14} {'naive':>8}   fitted on the other two")
    for j, (name, d, w) in enumerate(data):
        train = [x for i, x in enumerate(data) if i != j]

        def loss(x: np.ndarray, train: list[tuple[str, ContentionData, np.ndarray]] = train) -> float:
            return float(np.mean([weighted_pct(dd, predicted(dd, ww, x)) for _, dd, ww in train]))

        fit = differential_evolution(loss, BOUNDS, seed=0, maxiter=40, popsize=10, tol=1e-6, polish=True)
        print(f"{name:<24} {weighted_pct(d, predicted(d, w, fit.x)):>13.2f}% "
              f"{weighted_pct(d, d.baseline_s[SHIPPED_SM_FRACTION]):>13.2f}% {weighted_pct(d, d.isolated_s):>7.2f}%   "
              f"capacity {fit.x[0]:.3f}, exponent {fit.x[1]:.2f}, share {fit.x[2]:.3f}, half {fit.x[3]:.0f} warps, "
              f"overhead wait {fit.x[4]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
