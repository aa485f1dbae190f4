"""Fit how a GEMM kernel of one's own runs (``own_gemm_efficiency``, ``own_gemm_l2_bytes_per_s``)
on the harness's WMMA kernels, and score it held out.

The harness's WMMA GEMM (calibration/harness/kernels.cu: plain FP16 WMMA, 32-deep k-steps, two
shared-memory stages, FP32 output) at five tiles, 8192^3, alone (``own_tiles`` part of
h200-sxm/2026-11-29-c): 64x64 7.00 ms, 128x64 5.46, 64x128 5.09, 128x128 3.74 (4 warps) and 3.85
(8 warps). Each block reads K x (BM + BN) operand elements from L2, and every tile up to 128x64
moved them at 4.7-5.1 TB/s whatever its FLOP rate: L2 bandwidth bounds it, not the tensor issue.
ovsim prices such a kernel with two rooflines on its main loop (``ovsim.models.cost.gemm``): the
tensor issue at ``own_gemm_efficiency`` of the peak at the reference clock, which follows the SM
clock, and the tiles' L2 reads at ``own_gemm_l2_bytes_per_s``, which does not. Each kernel is
predicted at the clock it was measured at, the top clock. One number for every tile (the
efficiency alone, before) priced the 128x128 tile 2x slow.

The fit: the efficiency at which the cost model prices the 128x128 (4-warp) tile, the one kernel
whose L2 reads do not bound it, at its median; the L2 bandwidth at which it prices the 64x64 tile
at its median (two solves, alternated until neither moves). Held out: the 128x64, 64x128 and
8-warp 128x128 tiles, and the study's kernel (64x64) at its natural occupancy and shaped to 1-5
blocks per SM in the shaping parts of both H100 data sets and both earlier H200 ones. The H100,
which ran no tiles part, takes the H200's efficiency (the same GH100 SMs and clocks) and its own L2
bandwidth from the study kernel at its natural occupancy in its first shaping part (7.35 ms, where
the H200 ran it in 7.0).

    python calibration/harness/fit_own_gemm.py [--dry-run]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import brentq, least_squares

from ovsim.calibrate import FitReport, TraceInput, write_shipped
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import load_gpu
from ovsim.models import cost
from ovsim.traces.table import TraceBundle
from ovsim.validate.datasets import fit_sets, read_experiment, sets, table_input, table_paths
from ovsim.validate.shaping import GEMM, GEMM_NATURAL_SMEM_BYTES, GEMM_STAGES, GEMM_TILE

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibration" / "data"
COMMAND = "python calibration/harness/fit_own_gemm.py"


def _split(data_set: str) -> tuple[str, str]:
    """(GPU folder, run) of a data set as calibration/data/registry.yaml names it."""
    gpu, run = data_set.split("/", 1)
    return gpu, run


# The data sets (registry.yaml's fits and its shaping family).
TILES_SET = _split(fit_sets("own_gemm_efficiency")["h200-sxm"]["set"])
EFFICIENCY_TILE = "wmma_128x128_t128_8192"  # the one tile its L2 reads do not bound
L2_TILE = "wmma_64x64_t128_8192"
# The smloss part's runs of the WMMA kernels beside SMs held idle; the run that gives each SM's
# path its bandwidth (the 64x64 tile on half the SMs: its L2 reads bind it there too).
HELD_SET = _split(fit_sets("own_gemm_l2")["h200-sxm"]["set"])
L2_HELD = "wmma_64x64_t128_8192__hold_66"
SHAPING_SETS = tuple(_split(s) for (s,) in sets("shaping", "set"))
# Sets that no fit has seen: block_issue_share_per_warp was fitted on each GPU's 2026-11-26 set.
REPEAT_SETS = tuple(run for gpu, run in SHAPING_SETS
                    if f"{gpu}/{run}" not in {e["set"] for e in fit_sets("block_issue_share_per_warp").values()})
H100_L2_SET = _split(fit_sets("own_gemm_l2")["h100-sxm5-80gb"]["set"])
KERNEL = GEMM
SIZE = 8192
TILE = GEMM_TILE
STAGES = GEMM_STAGES
# The cost model's shared memory for the natural block; the harness kernel's padding is the rest
# of what it declared.
NATURAL_SMEM = GEMM_NATURAL_SMEM_BYTES


def measured(gpu: str, date: str) -> pd.DataFrame:
    """Per occupancy: the kernel's median duration, its declared shared memory and registers."""
    rows = []
    for path in table_paths(DATA / gpu / date, "shaping", f"gemm64_{SIZE}_occ?"):
        k = read_experiment(path).kernels
        k = k[k["name"] == KERNEL]
        rows.append({"occ": int(path.stem[-1]), "measured_s": float(k["duration_s"].median()),
                     "smem": int(k["shared_mem_bytes"].iloc[0]), "regs": int(k["registers_per_thread"].iloc[0]),
                     "threads": int(k["block_x"].iloc[0]), "file": path})
    if not rows:
        raise SystemExit(f"{DATA / gpu / date}: no shaping tables")
    return pd.DataFrame(rows).sort_values("occ", ascending=False).reset_index(drop=True)


def measured_tiles() -> pd.DataFrame:
    """Per tile of the own_tiles part: its median duration alone, tile, threads and registers."""
    gpu, date = TILES_SET
    rows = []
    for path in table_paths(DATA / gpu / date, "own_tiles", "wmma_*_8192"):
        k = read_experiment(path).kernels
        k = k[k["name"].str.startswith("ovsim_gemm_")]
        bm, bn = (int(x) for x in path.stem.split("_")[1].split("x"))
        rows.append({"label": path.stem, "tile": (bm, bn, 32), "measured_s": float(k["duration_s"].median()),
                     "regs": int(k["registers_per_thread"].iloc[0]), "threads": int(k["block_x"].iloc[0]),
                     "smem": 0, "sms": 0, "file": path})
    if not rows:
        raise SystemExit(f"{DATA / gpu / date}: no own_tiles tables")
    return pd.DataFrame(rows).set_index("label")


def measured_held() -> pd.DataFrame:
    """Per tile and SMs held of the smloss part's WMMA victims: the median of the six runs beside
    the held SMs (the six before ran alone), with the SMs left to the kernel."""
    gpu, date = HELD_SET
    sms = load_gpu(gpu).sm.count
    rows = []
    for path in table_paths(DATA / gpu / date, "smloss", "wmma_*__hold_*"):
        k = read_experiment(path).kernels
        k = k[k["name"].str.startswith("ovsim_gemm_")].sort_values("start_s")
        victim, held = path.stem.split("__hold_")
        bm, bn = (int(x) for x in victim.split("_")[1].split("x"))
        rows.append({"label": path.stem, "tile": (bm, bn, 32), "measured_s": float(k["duration_s"].iloc[6:].median()),
                     "regs": int(k["registers_per_thread"].iloc[0]), "threads": int(k["block_x"].iloc[0]),
                     "smem": 0, "sms": sms - int(held), "file": path})
    if not rows:
        raise SystemExit(f"{DATA / gpu / date}: no smloss tables of the WMMA kernels")
    return pd.DataFrame(rows).set_index("label")


# The L2 reads' two bandwidths: the L2's own and each SM's path (``own_gemm_l2_bytes_per_s``,
# ``own_gemm_l2_sm_bytes_per_s``).
L2 = tuple[float, float]


def predicted(gpu: str, row: pd.Series, efficiency: float, l2: L2) -> float:
    """The cost model's time for a measured kernel (a tiles row, a held-SMs row on the SMs left to
    it, or a shaping row with its padding) at the top clock, where it was measured: its time at
    the reference clock over its rate there, which follows the clock up to the kernel's saturation
    clock (where its two rooflines meet)."""
    spec = load_gpu(gpu)
    params = load_calibration(spec, gpu).params
    bm, bn, bk = row.get("tile", TILE)
    pad = int(row["smem"]) - NATURAL_SMEM if int(row["smem"]) else 0
    sms = int(row.get("sms", 0)) or None
    d = cost.gemm(SIZE, SIZE, SIZE, "fp16", spec, params, tile=(int(bm), int(bn), int(bk)),
                  threads=int(row["threads"]), registers_per_thread=int(row["regs"]), stages=STAGES,
                  extra_shared_mem_bytes=pad, efficiency=efficiency, l2_bytes_per_s=l2[0], l2_sm_bytes_per_s=l2[1],
                  sm_count=sms)
    top, ref = spec.clocks.max_sm_clock_hz / spec.clocks.compute_clock_hz, params.power_tensor_reference_clock_fraction
    sat = d.saturation_clock_fraction if d.saturation_clock_fraction is not None else math.inf
    return d.isolated_s * min(ref, sat) / min(top, sat)


def solve_efficiency(gpu: str, row: pd.Series, l2: L2) -> float:
    """The efficiency at which the cost model prices ``row`` at its measured time."""
    return float(brentq(lambda e: predicted(gpu, row, e, l2) - row["measured_s"], 0.01, 1.0, xtol=1e-7))


def solve_l2(gpu: str, rows: list[pd.Series], eff: float, sm_bytes_per_s: float | None = None) -> L2:
    """The L2 bandwidths at which the cost model prices ``rows`` at their measured times: both from
    two rows on different SM counts, or the L2's own from one with ``sm_bytes_per_s`` held."""
    if sm_bytes_per_s is not None:
        g = brentq(lambda b: predicted(gpu, rows[0], eff, (b, sm_bytes_per_s)) - rows[0]["measured_s"], 1e11, 1e15,
                   xtol=1e6)
        return float(g), sm_bytes_per_s
    fit = least_squares(lambda x: [np.log(predicted(gpu, r, eff, (float(np.exp(x[0])), float(np.exp(x[1]))))
                                          / r["measured_s"]) for r in rows], x0=[np.log(1e13), np.log(6e10)])
    return float(np.exp(fit.x[0])), float(np.exp(fit.x[1]))


def _row(table: pd.DataFrame, label: str) -> pd.Series:
    """The measured row of one experiment."""
    row = table.loc[label]
    assert isinstance(row, pd.Series), f"{label}: more than one experiment of that label"
    return row


def fit(tiles: pd.DataFrame, held: pd.DataFrame) -> tuple[float, L2]:
    """The efficiency that prices EFFICIENCY_TILE alone, and the two L2 bandwidths that price
    L2_TILE alone and on the SMs L2_HELD leaves it, each solved with the other held, until none
    moves."""
    gpu = TILES_SET[0]
    eff, l2 = 0.3, (1e15, 1e13)  # reads that bind nothing: the first efficiency is the alone
    rows = [_row(tiles, L2_TILE), _row(held, L2_HELD)]
    for _ in range(20):
        before = (eff, *l2)
        eff = solve_efficiency(gpu, _row(tiles, EFFICIENCY_TILE), l2)
        l2 = solve_l2(gpu, rows, eff)
        if all(abs(x / y - 1) < 1e-6 for x, y in zip((eff, *l2), before, strict=True)):
            break
    return float(f"{eff:.3g}"), (float(f"{l2[0]:.3g}"), float(f"{l2[1]:.3g}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = ap.parse_args()
    tiles, held = measured_tiles(), measured_held()
    eff, l2 = fit(tiles, held)
    gpu, date = TILES_SET
    print(f"own_gemm_efficiency fp16 = {eff} (fitted on {EFFICIENCY_TILE}); own_gemm_l2_bytes_per_s = {l2[0]:.4g}, "
          f"own_gemm_l2_sm_bytes_per_s = {l2[1]:.4g} (fitted on {L2_TILE} alone and {L2_HELD}); {gpu}")
    # The H100 has no tiles or held-SM runs: the L2's bandwidth from its own shaping part's study
    # kernel at its natural occupancy (L2-bound there on the H200), the rest the H200's.
    h100_row = measured(*H100_L2_SET).iloc[0]
    h100_l2 = solve_l2("h100-sxm5-80gb", [h100_row], eff, sm_bytes_per_s=l2[1])
    l2_of = {gpu: l2, "h100-sxm5-80gb": (float(f"{h100_l2[0]:.3g}"), l2[1])}
    print(f"h100-sxm5-80gb: own_gemm_l2_bytes_per_s = {l2_of['h100-sxm5-80gb'][0]:.4g} (fitted on "
          f"{'/'.join(H100_L2_SET)}, {h100_row['occ']} blocks per SM, {h100_row['measured_s'] * 1e3:.3f} ms)")
    print(f"{'data set':<34} {'kernel':>34} {'measured ms':>11} {'predicted':>9} {'error':>7}  role")
    errors: list[float] = []
    held_errors: list[float] = []
    shaping: list[float] = []
    repeat: list[float] = []
    for table, where, out in ((tiles, TILES_SET, errors), (held, HELD_SET, held_errors)):
        for label, row in table.iterrows():
            pred = predicted(gpu, row, eff, l2)
            err = (pred / row["measured_s"] - 1) * 100
            fitted = label in (EFFICIENCY_TILE, L2_TILE, L2_HELD)
            if not fitted:
                out.append(abs(err))
            print(f"{'/'.join(where):<34} {label:>34} {row['measured_s'] * 1e3:>11.3f} {pred * 1e3:>9.3f} "
                  f"{err:>+6.1f}%  {'fitted' if fitted else 'held out'}")
    for g, dset in SHAPING_SETS:
        for _, row in measured(g, dset).iterrows():
            pred = predicted(g, row, eff, l2_of[g])
            err = (pred / row["measured_s"] - 1) * 100
            fitted = (g, dset) == H100_L2_SET and row["occ"] == h100_row["occ"]
            if not fitted:
                shaping.append(abs(err))
                if dset in REPEAT_SETS:
                    repeat.append(abs(err))
            print(f"{g + '/' + dset:<34} {'study kernel, ' + str(row['occ']) + ' blocks/SM':>34} "
                  f"{row['measured_s'] * 1e3:>11.3f} {pred * 1e3:>9.3f} {err:>+6.1f}%  "
                  f"{'fitted (L2)' if fitted else 'held out'}")
    mape, held_mape, shaping_mape = (sum(x) / len(x) for x in (errors, held_errors, shaping))
    print(f"held out: tiles MAPE {mape:.1f}% over {len(errors)}, worst {max(errors):.1f}%; beside held SMs "
          f"{held_mape:.1f}% over {len(held_errors)}, worst {max(held_errors):.1f}%; the study kernel's occupancies "
          f"{shaping_mape:.1f}% over {len(shaping)}, worst {max(shaping):.1f}% (on {', '.join(REPEAT_SETS)}, which "
          f"no occupancy fit has seen: {sum(repeat) / len(repeat):.1f}%)")
    source = (f"measured: calibration/data/{gpu}/{date} (own_tiles part: the harness's FP16 WMMA GEMM at five "
              f"tiles, {SIZE}^3, alone, medians of 10) and calibration/data/{'/'.join(HELD_SET)} (smloss part: "
              f"the 64x64 and 128x128 tiles beside 8-66 SMs held idle): the efficiency on {EFFICIENCY_TILE}, the "
              f"L2's and each SM's bandwidth on {L2_TILE} alone and on the SMs {L2_HELD} leaves it, through "
              f"ovsim.models.cost.gemm at the top clock they ran at; held out on the other three tiles (MAPE "
              f"{mape:.1f}%), on the other seven held-SM runs ({held_mape:.1f}%) and on the study kernel at 1-6 "
              f"blocks per SM in {', '.join(g + '/' + d for g, d in SHAPING_SETS)} ({shaping_mape:.1f}%); {COMMAND}")
    record = {"data_sets": [f"calibration/data/{gpu}/{date}", f"calibration/data/{'/'.join(HELD_SET)}"],
              "efficiency_tile": EFFICIENCY_TILE, "l2_tile": L2_TILE, "l2_held": L2_HELD,
              "measured_s": {str(k): float(v) for k, v in pd.concat([tiles, held])["measured_s"].items()},
              "held_out_tiles_mape_pct": round(mape, 2), "held_out_tiles_worst_pct": round(max(errors), 2),
              "held_out_held_sms_mape_pct": round(held_mape, 2),
              "held_out_occupancies_mape_pct": round(shaping_mape, 2)}
    inputs = []
    for table, label, where, part in ((tiles, EFFICIENCY_TILE, TILES_SET, "own_tiles"), (tiles, L2_TILE, TILES_SET,
                                      "own_tiles"), (held, L2_HELD, HELD_SET, "smloss")):
        t = table_input(Path(str(_row(table, label)["file"])), gpu)
        inputs.append(TraceInput(bundle=TraceBundle(kernels=t.bundle.kernels, gpu_names={0: "NVIDIA H200"}),
                                 label=f"calibration/data/{'/'.join(where)} ({part}, {label})", gpu=gpu,
                                 files=t.files))
    h100_l2_src = (f"measured: calibration/data/{'/'.join(H100_L2_SET)} (shaping part: the study's FP16 WMMA "
                   f"kernel, 64x64x32 tiles, {SIZE}^3, at its natural {h100_row['occ']} blocks per SM, median of "
                   f"3, {h100_row['measured_s'] * 1e3:.3f} ms), through ovsim.models.cost.gemm with the H200's "
                   f"efficiency and per-SM bandwidth; {COMMAND}")
    h100_table = table_input(Path(str(h100_row["file"])), "h100-sxm5-80gb")
    h100_input = TraceInput(bundle=TraceBundle(kernels=h100_table.bundle.kernels,
                                               gpu_names={0: "NVIDIA H100 80GB HBM3"}),
                            label=f"calibration/data/{'/'.join(H100_L2_SET)} (shaping, {h100_row['occ']} blocks "
                                  "per SM)", gpu="h100-sxm5-80gb", files=h100_table.files)
    for target in ("h200-sxm", "h100-sxm5-80gb"):
        own = target == gpu
        carried = source if own else f"the H200's fit (the same GH100 SMs and clocks; {source})"
        report = FitReport(parameters={"own_gemm_efficiency": {"fp16": eff},
                                       "own_gemm_l2_bytes_per_s": l2_of[target][0],
                                       "own_gemm_l2_sm_bytes_per_s": l2_of[target][1]},
                           sources={"own_gemm_efficiency": carried,
                                    "own_gemm_l2_bytes_per_s": source if own else h100_l2_src,
                                    "own_gemm_l2_sm_bytes_per_s": carried},
                           fits={"own_gemm": record})
        _, done = write_shipped(report, inputs if own else [*inputs, h100_input], target, COMMAND,
                                dry_run=args.dry_run)
        print(f"{target}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
