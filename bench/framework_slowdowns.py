"""What a real framework's kernels lose beside communication-like traffic, measured and predicted.

Reads the harness's framework data sets (calibration/data/h100-sxm5-80gb/2026-11-27-d and -e: the
kernels of one GPT-2 layer as PyTorch launches them, alone and beside copy channels, a reduce loop,
polling channels and device-to-device copies) and prints, per kernel:

- its time alone, and its warps and DRAM throughput alone as Nsight Compute measured them;
- its measured slowdown (median overlapped / median alone) beside each overlapper;
- with ``--predict``, ovsim's replay of the same experiments with the shipped calibration (nothing
  fitted on them) beside the measurement, for the copy channels and the copies.

The HBM traffic of each overlapper alone is printed first (channels: the bytes their copy loops
moved over their duration; copies: bytes read and written over the copy's duration).

    python bench/framework_slowdowns.py [--predict]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ovsim.traces.ncu import load_ncu_csv
from ovsim.validate import HARNESS_CHANNEL_HBM_PER_BYTE, HARNESS_CHANNEL_PASS_BYTES
from ovsim.validate.datasets import sets
from ovsim.validate.framework import beside_slowdowns

DATA = Path(__file__).resolve().parents[1] / "calibration" / "data" / "h100-sxm5-80gb"
GPU = "h100-sxm5-80gb"
# The framework part's H100 data sets (calibration/data/registry.yaml).
SETS = tuple(s.split("/", 1)[1] for s, g in sets("framework", "set", "gpu") if g == GPU)


def short(name: str) -> str:
    base = name.replace("void ", "").replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    base = base.split("<")[0].split("(")[0]
    return base.rsplit("::", 1)[-1][:26]


def overlapper_traffic(folder: Path) -> dict[str, float]:
    """HBM traffic of each overlapper alone, as a fraction of the H100's 3.35 TB/s."""
    peak = 3.35e12
    ex = [json.loads(line) for line in (folder / "experiments.jsonl").read_text().splitlines() if line.strip()]
    t = pd.read_parquet(folder / "tables" / "framework.parquet")
    out: dict[str, list[float]] = {}
    for e in ex:
        if e["part"] != "framework" or e.get("op") not in ("copy", "reduce"):
            continue
        c = t[(t["experiment"] == e["label"]) & t["name"].str.startswith("ovsim_channel")]
        per_pass = HARNESS_CHANNEL_PASS_BYTES * HARNESS_CHANNEL_HBM_PER_BYTE[e["op"]]
        out.setdefault(f"{e['op']}_{e['channels']}", []).append(e["comm_iters"] * per_pass / c["duration_s"].iloc[0])
    cp = pd.read_parquet(folder / "tables" / "framework_copy.parquet")
    cp = cp[cp["kind"] == "copy"]
    for label, g in cp.groupby(cp["experiment"].str.split("__").str[1]):
        out.setdefault(str(label), []).extend((2 * g["bytes"] / g["duration_s"]).tolist())
    return {k: float(np.median(v)) / peak for k, v in out.items()}


def ncu_alone(folder: Path) -> pd.DataFrame:
    d = load_ncu_csv(folder / "framework_ncu" / "metrics.csv")
    out = pd.DataFrame({"kernel": [short(str(n)) for n in d["name"]], "grid": d["blocks"],
                        "warps": d["blocks"] * np.ceil(d["threads_per_block"] / 32),
                        "dram_pct": d["dram_throughput_pct"]})
    return out.groupby(["kernel", "grid"], as_index=False).median()


def slowdowns(folder: Path, predict: bool) -> pd.DataFrame:
    """Measured (and predicted) slowdowns of every kernel of both parts (ovsim.validate.framework)."""
    parts = (("framework", "collective"), ("framework_copy", "copy"))
    out = pd.concat([beside_slowdowns(pd.read_parquet(folder / "tables" / f"{p}.parquet"), GPU, beside=k,
                                      predict=predict) for p, k in parts])
    return out.assign(kernel=[short(str(n)) for n in out["name"]], alone_us=out["alone_s"] * 1e6, set=folder.name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predict", action="store_true", help="also replay every experiment (about 2 minutes)")
    args = ap.parse_args()
    folders = [DATA / s for s in SETS if (DATA / s / "tables" / "framework.parquet").is_file()]
    if not folders:
        print(f"no framework data sets under {DATA}", file=sys.stderr)
        return 1
    traffic: dict[str, float] = {}
    for f in folders:
        traffic.update(overlapper_traffic(f))
    print("HBM traffic of each overlapper alone (fraction of 3.35 TB/s):")
    print("  " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(traffic.items())))
    meas = pd.concat([slowdowns(f, args.predict) for f in folders])
    meas["victim"] = meas["experiment"].str.split("__").str[0]
    meas["over"] = meas["experiment"].str.split("__").str[1]
    cols = [c for c in ("copy_1", "copy_2", "copy_4", "copy_8", "copy_16", "copy_24", "copy_32", "reduce_8", "poll_8",
                        "d2d", "d2d_64mib_x1", "d2d_512mib_x2") if c in set(meas["over"])]
    table = meas.pivot_table(index=["victim", "kernel"], columns="over", values="measured", aggfunc="median")[cols]
    table.insert(0, "alone_us", meas.groupby(["victim", "kernel"])["alone_us"].median())
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    print("\nmeasured slowdown (median overlapped / median alone):")
    print(table.round(2).to_string())
    print("\nNsight Compute, each kernel alone (2026-11-27-d):")
    print(ncu_alone(folders[0]).round(1).to_string(index=False))
    if args.predict:
        show = meas[meas["over"].isin(["copy_8", "copy_32", "d2d"])]
        show = show.assign(cell=show["measured"].round(2).astype(str) + " / " + show["predicted"].round(2).astype(str))
        print("\nmeasured / predicted (shipped calibration):")
        print(show.pivot_table(index=["victim", "kernel"], columns="over", values="cell", aggfunc="first").to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
