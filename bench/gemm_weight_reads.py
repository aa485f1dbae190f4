"""How often a GEMM reads its weight from HBM, bounded by measurement: the calibration harness's
shapes part (cuBLAS GEMMs alone at the top clock, calibration/data; docs/calibration.md) against
the time reading the weight (the k x n operand) twice would take at the HBM bandwidth the cost
model allows (the peak times ``hbm_achievable_fraction``, what streaming kernels were measured to
reach). The cost model (``ovsim.models.cost.gemm_isolated_s``) reads the weight twice whenever
the GEMM has two or more row tiles, as every GEMM of more than 256 rows has with the tiles its
library holds; a measured GEMM faster than two reads cannot have done that at that bandwidth.
A benchmark: it prints figures and asserts nothing.

For each data set and precision, over the GEMMs of more than 256 rows: how many were measured,
how many ran faster than two reads of their weight, and the cost model's mean signed error on
those (its price against the measurement); then those GEMMs.

With ``--once-up-to N``, it scores instead the rule that reads the weight once where a GEMM has
at most N row tiles (``ovsim.models.cost.WEIGHT_ONCE_ROW_TILES``), against the shipped one, on
every measured shape of each data set (the MAPE ``ovsim validate --measured`` gives), and over
the sets after the first H100's (not held out: 4 was picked looking at every set); then on NVIDIA's MLPerf v3.1
GPT-3 rows (bench/mlperf_rows.py, analytic), whose chunked tensor-parallel pieces have 512 rows.

    python bench/gemm_weight_reads.py                 # a few seconds
    python bench/gemm_weight_reads.py --once-up-to 4  # about 15 s
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ovsim.calibrate.gemm import library_gemm_times
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import gpu_file, load_gpu
from ovsim.models import cost, gemm_library
from ovsim.models.cost import element_bytes
from ovsim.validate.measured import MEASURED_DATA
from ovsim.validate.measured_gemm import MEASURED_SHAPES, SHAPE_EXPERIMENTS, measured_shape_points

sys.path.insert(0, str(Path(__file__).resolve().parent))

LINEAR = {experiment: prec for experiment, prec in SHAPE_EXPERIMENTS.items() if experiment.endswith("_linear")}


@contextlib.contextmanager
def weight_once_up_to(row_tiles: int) -> Iterator[None]:
    """Price GEMMs reading the weight once up to ``row_tiles`` row tiles, then as shipped again;
    the library's kernel choices, made under the rule before, forgotten each way."""
    cost.WEIGHT_ONCE_ROW_TILES = row_tiles
    gemm_library.clear_choices()
    try:
        yield
    finally:
        cost.WEIGHT_ONCE_ROW_TILES = 0
        gemm_library.clear_choices()


def score_rule(once_up_to: int) -> None:
    """MAPE of every measured shape set under the shipped rule and under reading the weight once
    up to ``once_up_to`` row tiles; then both over the sets after the first (shape-weighted)."""
    print(f"MAPE of the measured shapes: shipped rule, weight read once up to {once_up_to} row tiles")
    later = {0: [0.0, 0.0], once_up_to: [0.0, 0.0]}  # rule: [summed errors, shapes]
    for n_set, (rel, gpu_name) in enumerate(MEASURED_SHAPES):
        gpu = load_gpu(gpu_name)
        params = load_calibration(gpu, gpu_file(gpu_name).stem).params
        for experiment, prec in SHAPE_EXPERIMENTS.items():
            pts = measured_shape_points(MEASURED_DATA / rel, experiment, prec)
            if not pts:
                continue
            measured = np.array([p[4] for p in pts])
            mape = {}
            for rule in (0, once_up_to):
                with weight_once_up_to(rule):
                    err = np.abs(library_gemm_times(pts, prec, gpu, params) - measured) / measured
                mape[rule] = float(err.mean())
                if n_set > 0:
                    later[rule][0] += float(err.sum())
                    later[rule][1] += len(err)
            print(f"{rel:30s} {experiment:13s} {len(pts):4d}  {mape[0]:6.2%}  {mape[once_up_to]:6.2%}")
    print(f"sets after the first, {int(later[0][1])} shapes: {later[0][0] / later[0][1]:.2%} against "
          f"{later[once_up_to][0] / later[once_up_to][1]:.2%}")


def mlperf_under_rule(once_up_to: int, gpus: tuple[int, ...] = (4096, 10752)) -> None:
    """The MLPerf rows' error against their published throughput under both rules."""
    from mlperf_rows import MLPERF_ROWS

    from ovsim import api

    print(f"\nMLPerf v3.1 GPT-3 rows, analytic: shipped rule, weight read once up to {once_up_to} row tiles")
    for row in (r for r in MLPERF_ROWS if r.gpus in gpus):
        errors = []
        for rule in (0, once_up_to):
            with weight_once_up_to(rule):
                step_s = api.predict(row.scenario(), mode="analytic", counters=False).timeline.makespan_s
            errors.append(f"{row.throughput(step_s) / row.published - 1:+.1%}")
        print(f"{row.gpus:6d} GPUs: {errors[0]}  {errors[1]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--once-up-to", type=int, metavar="N",
                    help="score reading the weight once up to N row tiles against the shipped rule")
    args = ap.parse_args()
    if args.once_up_to is not None:
        score_rule(args.once_up_to)
        mlperf_under_rule(args.once_up_to)
        return 0
    print("GEMMs of more than 256 rows; data set, precision: measured, faster than two reads of the weight, "
          "the cost model's mean signed error on those")
    listed: list[str] = []
    for rel, gpu_name in MEASURED_SHAPES:
        gpu = load_gpu(gpu_name)
        params = load_calibration(gpu, gpu_file(gpu_name).stem).params
        bandwidth = gpu.memory.bandwidth_bytes_per_s * params.hbm_achievable_fraction
        for experiment, prec in LINEAR.items():
            pts = [p for p in measured_shape_points(MEASURED_DATA / rel, experiment, prec) if p[0] > 256]
            if not pts:
                continue
            eb = element_bytes(prec)
            measured = np.array([p[4] for p in pts])
            two_reads_s = np.array([2.0 * k * n * b * eb / bandwidth for _, n, k, b, _ in pts])
            under = measured < two_reads_s
            priced = library_gemm_times(pts, prec, gpu, params)
            err = (priced - measured) / measured
            mean = f"{err[under].mean():+.1%}" if under.any() else "-"
            print(f"{rel:30s} {prec:5s} {len(pts):4d} {int(under.sum()):4d}  {mean}")
            for i in np.flatnonzero(under):
                m, n, k, _, t = pts[i]
                listed.append(f"{rel:30s} {prec:5s} m {m:5d} n {n:6d} k {k:6d}: weight {k * n * eb / 1e6:6.0f} MB, "
                              f"measured {t * 1e6:7.1f} us, two reads {two_reads_s[i] * 1e6:7.1f} us, "
                              f"priced {priced[i] * 1e6:7.1f} us ({err[i]:+.1%})")
    print("\nGEMMs faster than two reads of their weight:")
    print("\n".join(listed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
