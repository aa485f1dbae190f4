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
import io
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ovsim.framework_checks import GPU_NAMES
from ovsim.replay import COMPUTE_KINDS, replay
from ovsim.traces.table import TraceBundle, validate_table

DATA = Path(__file__).resolve().parents[1] / "calibration" / "data" / "h100-sxm5-80gb"
SETS = ("2026-11-27-d", "2026-11-27-e")
CHANNEL_PASS_BYTES = 2 * (256 << 20)  # one copy-loop pass reads and writes its 256 MiB buffer
GPU = "h100-sxm5-80gb"


def short(name: str) -> str:
    base = name.replace("void ", "").replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    base = base.split("<")[0].split("(")[0]
    return base.rsplit("::", 1)[-1][:26]


def slowdowns(table: pd.DataFrame, over_kind: str) -> pd.DataFrame:
    """Per experiment and compute kernel: median time alone and beside an ``over_kind`` activity."""
    rows = []
    for exp, g in table.groupby("experiment", sort=True):
        o = g[g["kind"] == over_kind]
        os_, oe = o["start_s"].to_numpy(), (o["start_s"] + o["duration_s"]).to_numpy()
        k = g[g["kind"].isin(COMPUTE_KINDS) & ~g["name"].str.startswith("ovsim_")]
        s, e = k["start_s"].to_numpy(), (k["start_s"] + k["duration_s"]).to_numpy()
        hit = ((os_[None, :] < e[:, None]) & (oe[None, :] > s[:, None])).any(axis=1)
        for name, idx in k.groupby("name").groups.items():
            m = k.index.get_indexer(idx)
            alone, over = k["duration_s"].to_numpy()[m][~hit[m]], k["duration_s"].to_numpy()[m][hit[m]]
            if len(alone) and len(over):
                rows.append({"experiment": exp, "kernel": short(str(name)), "alone_us": np.median(alone) * 1e6,
                             "slowdown": np.median(over) / np.median(alone)})
    return pd.DataFrame(rows)


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
        per_pass = CHANNEL_PASS_BYTES * (1.5 if e["op"] == "reduce" else 1.0)
        out.setdefault(f"{e['op']}_{e['channels']}", []).append(e["comm_iters"] * per_pass / c["duration_s"].iloc[0])
    cp = pd.read_parquet(folder / "tables" / "framework_copy.parquet")
    cp = cp[cp["kind"] == "copy"]
    for label, g in cp.groupby(cp["experiment"].str.split("__").str[1]):
        out.setdefault(str(label), []).extend((2 * g["bytes"] / g["duration_s"]).tolist())
    return {k: float(np.median(v)) / peak for k, v in out.items()}


def ncu_alone(folder: Path) -> pd.DataFrame:
    path = folder / "framework_ncu" / "metrics.csv"
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    d = pd.read_csv(io.StringIO("\n".join(lines[start:]))).iloc[1:]
    num = {c: pd.to_numeric(d[c].astype(str).str.replace(",", ""), errors="coerce") for c in (
        "launch__grid_size", "launch__block_size", "dram__throughput.avg.pct_of_peak_sustained_elapsed")}
    out = pd.DataFrame({"kernel": [short(n) for n in d["Kernel Name"]], "grid": num["launch__grid_size"],
                        "warps": num["launch__grid_size"] * np.ceil(num["launch__block_size"] / 32),
                        "dram_pct": num["dram__throughput.avg.pct_of_peak_sustained_elapsed"]})
    return out.groupby(["kernel", "grid"], as_index=False).median()


def predicted(folder: Path, part: str, over_kind: str) -> pd.DataFrame:
    """The replay's slowdown per experiment and kernel: predicted overlapped time over the clean median."""
    t = pd.read_parquet(folder / "tables" / f"{part}.parquet")
    rows = []
    for exp, g in t.groupby("experiment", sort=True):
        g = g.drop(columns="experiment").reset_index(drop=True)
        o = g[g["kind"] == over_kind]
        os_, oe = o["start_s"].to_numpy(), (o["start_s"] + o["duration_s"]).to_numpy()
        c = g[g["kind"].isin(COMPUTE_KINDS) & ~g["name"].str.startswith("ovsim_")]
        s, e = c["start_s"].to_numpy(), (c["start_s"] + c["duration_s"]).to_numpy()
        hit = ((os_[None, :] < e[:, None]) & (oe[None, :] > s[:, None])).any(axis=1)
        # Replay takes the isolated time of a kernel beside a copy from its own (overlapped)
        # measurement, and only a collective's neighbours from clean instances: give the
        # overlapped instances their kernel's median alone, so the replay starts from that.
        dur = g["duration_s"].to_numpy().copy()
        alone: dict[str, float] = {}
        for name, idx in c.groupby("name").groups.items():
            m = c.index.get_indexer(idx)
            alone[str(name)] = float(np.median(c["duration_s"].to_numpy()[m][~hit[m]]))
            dur[np.asarray(idx)[hit[m]]] = alone[str(name)]
        b = TraceBundle(kernels=validate_table(g.assign(duration_s=dur), str(exp)), gpu_names={0: GPU_NAMES[GPU]})
        pred = replay(b, gpu=GPU, counters=False).kernels["predicted_duration_s"].to_numpy()
        for name, idx in c.groupby("name").groups.items():
            m = c.index.get_indexer(idx)
            if hit[m].any():
                rows.append({"experiment": exp, "kernel": short(str(name)),
                             "predicted": float(np.median(pred[np.asarray(idx)[hit[m]]])) / alone[str(name)]})
    return pd.DataFrame(rows)


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
    meas = pd.concat([slowdowns(pd.read_parquet(f / "tables" / p), k).assign(set=f.name)
                      for f in folders for p, k in (("framework.parquet", "collective"),
                                                    ("framework_copy.parquet", "copy"))])
    meas["victim"] = meas["experiment"].str.split("__").str[0]
    meas["over"] = meas["experiment"].str.split("__").str[1]
    cols = [c for c in ("copy_1", "copy_2", "copy_4", "copy_8", "copy_16", "copy_24", "copy_32", "reduce_8", "poll_8",
                        "d2d", "d2d_64mib_x1", "d2d_512mib_x2") if c in set(meas["over"])]
    table = meas.pivot_table(index=["victim", "kernel"], columns="over", values="slowdown", aggfunc="median")[cols]
    table.insert(0, "alone_us", meas.groupby(["victim", "kernel"])["alone_us"].median())
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    print("\nmeasured slowdown (median overlapped / median alone):")
    print(table.round(2).to_string())
    print("\nNsight Compute, each kernel alone (2026-11-27-d):")
    print(ncu_alone(folders[0]).round(1).to_string(index=False))
    if args.predict:
        pred = pd.concat([predicted(f, p, k) for f in folders for p, k in (("framework", "collective"),
                                                                           ("framework_copy", "copy"))])
        both = meas.merge(pred, on=["experiment", "kernel"])
        both["over"] = both["experiment"].str.split("__").str[1]
        show = both[both["over"].isin(["copy_8", "copy_32", "d2d"])]
        show = show.assign(cell=show["slowdown"].round(2).astype(str) + " / " + show["predicted"].round(2).astype(str))
        print("\nmeasured / predicted (shipped calibration):")
        print(show.pivot_table(index=["victim", "kernel"], columns="over", values="cell", aggfunc="first").to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
