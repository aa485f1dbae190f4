"""Fit how copy-engine traffic shares HBM with kernels, from the harness's framework data sets.

Two parameters (``ovsim.hw.calib.Parameters``), each from data the other does not use:

- ``memory_warp_bytes_per_s`` (Little's law): the most bytes per second one resident warp of a
  memory-bound kernel moves when the kernel is far from saturating HBM, a bound on any kernel's
  own traffic. From Nsight Compute alone (``framework_ncu/metrics.csv`` of the fit data set): the
  kernels moving over 1 MB at under 50% of HBM's peak, 30% of the SMs' and 60% of L2's (a
  latency-bound kernel, not a compute-, bandwidth- or L2-bound one), their DRAM bytes over their
  duration over their resident warps, the largest. A typical value (their geometric mean, half
  as much) would also cap wide kernels that keep more bytes in flight per warp: the H200's softmax
  of 1024-thread blocks, which streams at HBM's rate, then read as latency-bound.
- ``copy_engine_hbm_weight``: the weight of copy-engine traffic in HBM's max-min share. A grid of
  values, each a replay of every experiment of the fit data set's ``framework_copy`` part (the GPT-2
  layer's kernels beside 512 MiB device-to-device copies, each kernel's overlapped instances
  started from its median alone), scored by the mean relative error of the kernels' slowdowns;
  the least error is kept.

The H100's values are written as its next calibration version. The H200's file takes the H100's
copy weight (``ovsim validate --measured`` holds it out on the H200's copy parts) and a warps' rate
of its own, from Nsight Compute on the H200 (``h200-sxm/2026-11-27-f``, framework_ncu) by the same
rule. The other data sets (``FRAMEWORK_SETS`` beyond the fit one, the copy parts of
2026-11-26) are held out by ``ovsim validate --measured``.

    python calibration/harness/fit_copy_engine.py [--dry-run]     # about 3 minutes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ovsim.calibrate import FitReport, TraceInput, write_shipped
from ovsim.replay_score import mape_pct
from ovsim.traces.ncu import load_ncu_csv
from ovsim.traces.table import TraceBundle, validate_table
from ovsim.validate.datasets import fit_sets
from ovsim.validate.framework import COPY_FIT_SET, beside_slowdowns

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibration" / "data"
COMMAND = "python calibration/harness/fit_copy_engine.py"
GPU = "h100-sxm5-80gb"
# The H200's own Nsight Compute figures of the same kernels alone, for its warps' rate.
H200_NCU_SET = fit_sets("copy_engine_warp_rate")["h200-sxm"]["set"]
WEIGHTS = (1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01)
# A kernel is latency-bound alone below these shares of HBM's and the SMs' peaks.
LATENCY_BOUND_DRAM_PCT = 50.0
LATENCY_BOUND_SM_PCT = 30.0
# ... and under this share of L2's: a kernel whose inputs sit in L2 is not waiting on HBM.
LATENCY_BOUND_L2_PCT = 60.0
MIN_BYTES = 1e6


def warp_rate(ncu_csv: Path) -> tuple[float, list[dict[str, Any]]]:
    """The most bytes per second per resident warp among the latency-bound kernels, and them."""
    d = load_ncu_csv(ncu_csv)
    moved = d["dram_bytes_read"] + d["dram_bytes_write"]
    warps = d["blocks"] * np.ceil(d["threads_per_block"] / 32)
    keep = ((d["dram_throughput_pct"] < LATENCY_BOUND_DRAM_PCT) & (d["sm_throughput_pct"] < LATENCY_BOUND_SM_PCT)
            & (d["l2_throughput_pct"] < LATENCY_BOUND_L2_PCT) & (moved > MIN_BYTES))
    rows: list[dict[str, Any]] = [
        {"kernel": str(n)[:80], "warps": float(w), "bytes": float(b), "duration_s": float(t),
         "bytes_per_s_per_warp": float(b / t / w)}
        for n, w, b, t in zip(d.loc[keep, "name"], warps[keep], moved[keep], d.loc[keep, "ncu_duration_s"],
                              strict=True)]
    if not rows:
        raise SystemExit(f"{ncu_csv}: no latency-bound kernel to fit the warps' rate on")
    return max(float(r["bytes_per_s_per_warp"]) for r in rows), rows


def copy_error_pct(table: pd.DataFrame, overrides: dict[str, float]) -> float:
    s = beside_slowdowns(table, GPU, overrides)
    return mape_pct(s["predicted"].to_numpy(), s["measured"].to_numpy())


def provenance_input(folder: Path, table: pd.DataFrame) -> TraceInput:
    """The data set as the calibration file's provenance: one experiment's table stands for the
    bundle (its device), and the files the fit read are checksummed."""
    first = table[table["experiment"] == sorted(table["experiment"].unique())[0]]
    bundle = TraceBundle(kernels=validate_table(first.drop(columns="experiment").reset_index(drop=True)),
                         gpu_names={0: "NVIDIA H100 80GB HBM3"})
    files = (str(folder / "tables" / "framework_copy.parquet"), str(folder / "framework_ncu" / "metrics.csv"))
    return TraceInput(bundle=bundle, label=f"calibration/data/{COPY_FIT_SET} (framework_copy, framework_ncu)",
                      gpu=GPU, files=files)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = ap.parse_args()
    folder = DATA / COPY_FIT_SET
    rate, kernels = warp_rate(folder / "framework_ncu" / "metrics.csv")
    rate = float(f"{rate:.3g}")
    print(f"memory_warp_bytes_per_s: {rate:.3g} (the most of {len(kernels)} latency-bound kernels)")
    for k in kernels:
        print(f"  {k['bytes_per_s_per_warp']:.3g} B/s per warp: {k['warps']:.0f} warps, {k['kernel'][:70]}")
    table = pd.read_parquet(folder / "tables" / "framework_copy.parquet")
    errors = {w: copy_error_pct(table, {"memory_warp_bytes_per_s": rate, "copy_engine_hbm_weight": w})
              for w in WEIGHTS}
    for w, e in errors.items():
        print(f"copy_engine_hbm_weight {w:<5} slowdown error {e:5.1f}%")
    best = min(errors, key=lambda w: errors[w])
    measured = beside_slowdowns(table, GPU, predict=False)["measured"].to_numpy()
    naive = mape_pct(np.ones(len(measured)), measured)
    src_rate = (f"measured: calibration/data/{COPY_FIT_SET} (framework_ncu part: Nsight Compute, each kernel of a "
                f"GPT-2 layer alone), the DRAM bytes over the duration over the resident warps of the "
                f"{len(kernels)} kernels moving over 1 MB at under {LATENCY_BOUND_DRAM_PCT:g}% of HBM's peak, "
                f"{LATENCY_BOUND_SM_PCT:g}% of the SMs' and {LATENCY_BOUND_L2_PCT:g}% of L2's, the largest; "
                f"{COMMAND}")
    src_weight = (f"measured: calibration/data/{COPY_FIT_SET} (framework_copy part: the kernels of a GPT-2 layer "
                  f"beside 512 MiB device-to-device copies), the grid {list(WEIGHTS)} scored by the mean relative "
                  f"error of the kernels' slowdowns replayed from their time alone; {COMMAND}")
    fit = {"data_set": f"calibration/data/{COPY_FIT_SET}", "warp_rate_kernels": kernels,
           "copy_weight_error_pct": {str(w): round(e, 2) for w, e in errors.items()},
           "error_pct": round(errors[best], 2), "error_pct_at_weight_1": round(errors[1.0], 2),
           "naive_error_pct": round(naive, 2)}
    inputs = [provenance_input(folder, table)]
    h100 = FitReport(parameters={"memory_warp_bytes_per_s": rate, "copy_engine_hbm_weight": best},
                     sources={"memory_warp_bytes_per_s": src_rate, "copy_engine_hbm_weight": src_weight},
                     fits={"copy_engine": fit})
    _, done = write_shipped(h100, inputs, GPU, COMMAND, dry_run=args.dry_run)
    print(f"{GPU}: {done}")
    h200_ncu = DATA / H200_NCU_SET / "framework_ncu" / "metrics.csv"
    h200_rate, h200_kernels = warp_rate(h200_ncu)
    h200_rate = float(f"{h200_rate:.3g}")
    print(f"h200-sxm memory_warp_bytes_per_s: {h200_rate:.3g} (the most of {len(h200_kernels)} kernels)")
    h200 = FitReport(parameters={"copy_engine_hbm_weight": best, "memory_warp_bytes_per_s": h200_rate},
                     sources={"copy_engine_hbm_weight": "the H100's fit (" + src_weight + "), held out on "
                              f"calibration/data/h200-sxm/2026-11-26 (copy part) and {H200_NCU_SET} (framework_copy "
                              "part) by ovsim validate --measured",
                              "memory_warp_bytes_per_s": src_rate.replace(COPY_FIT_SET, H200_NCU_SET)},
                     fits={"copy_engine": {"from": GPU, **{k: v for k, v in fit.items() if k != "warp_rate_kernels"},
                                           "warp_rate_kernels": h200_kernels,
                                           "warp_rate_data_set": f"calibration/data/{H200_NCU_SET}"}})
    h200_input = TraceInput(bundle=inputs[0].bundle, label=f"calibration/data/{H200_NCU_SET} (framework_ncu)",
                            gpu="h200-sxm", files=(str(h200_ncu),))
    _, done = write_shipped(h200, [*inputs, h200_input], "h200-sxm", COMMAND, dry_run=args.dry_run)
    print(f"h200-sxm: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
