"""Fit engine parameters from the calibration harness's measured data sets (calibration/data/) and
write each GPU's next calibration version, with the data set's files and checksums as provenance.

- ``memory_sm_headroom``: from the ``smloss`` part, a streaming add measured alone and beside a
  kernel that holds 8 to 66 SMs and moves no data. With ``h`` of ``S`` SMs held the engine's
  bandwidth-bound kernel runs ``1 / min(1, headroom * (S - h) / S)`` slower; the fit is the
  headroom with the least squared relative error over the held counts.

    python calibration/harness/fit_measured.py [--dry-run]

A GPU whose newest calibration file already holds the fitted values gets no new file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar

from ovsim.calibrate import FitReport, trace_input, write_shipped

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibration" / "data"
COMMAND = "python calibration/harness/fit_measured.py"
# The data sets each GPU's fits read (folders under calibration/data/).
SMLOSS = {"h100-sxm5-80gb": "h100-sxm5-80gb/2026-11-26-b"}
HEADROOM_BOUNDS = (1.0, 16.0)


def smloss_points(folder: Path, victim: str) -> list[tuple[int, float]]:
    """(SMs held, measured slowdown) of ``victim`` in a data set's smloss part."""
    summary = json.loads((folder / "summary.json").read_text())
    held = {e["label"]: e["held_sms"] for e in map(json.loads, (folder / "experiments.jsonl").read_text().splitlines())
            if e.get("part") == "smloss"}
    return sorted((held[r["experiment"]], float(r["slowdown"])) for r in summary.get("slowdowns", [])
                  if r["part"] == "smloss" and r["experiment"].startswith(victim + "__"))


def headroom_slowdown(headroom: float, held: np.ndarray, sms: int) -> np.ndarray:
    return np.asarray(1.0 / np.minimum(1.0, headroom * (sms - held) / sms))


def fit_headroom(points: list[tuple[int, float]], sms: int) -> dict[str, Any]:
    held = np.array([h for h, _ in points], dtype=float)
    measured = np.array([s for _, s in points])

    def loss(h: float) -> float:
        return float(np.sum(((headroom_slowdown(h, held, sms) - measured) / measured) ** 2))

    # The loss is flat wherever no held count binds: a grid finds the basin, Brent's method refines it.
    grid = np.linspace(*HEADROOM_BOUNDS, 1501)
    i = int(np.argmin([loss(h) for h in grid]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best = float(minimize_scalar(loss, bounds=(lo, hi), method="bounded").x)
    fitted = headroom_slowdown(best, held, sms)
    return {"value": round(best, 3), "points": len(points), "held_sms": held.astype(int).tolist(),
            "measured_slowdown": measured.round(4).tolist(), "fitted_slowdown": fitted.round(4).tolist(),
            "fit_mape_pct": round(float(np.mean(np.abs(fitted - measured) / measured) * 100), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fits, write nothing")
    args = ap.parse_args()
    for gpu, rel in SMLOSS.items():
        folder = DATA / rel
        manifest = json.loads((folder / "manifest.json").read_text())
        points = smloss_points(folder, "add_bf16_256M")
        if len(points) < 2:
            print(f"{gpu}: {folder}: fewer than two smloss points for the add", file=sys.stderr)
            return 1
        fit = fit_headroom(points, int(manifest["sm_count"]))
        tables = sorted((folder / "tables" / "smloss").glob("add_bf16_256M__hold_*.parquet"))
        inputs = [trace_input([t], gpu) for t in tables]
        report = FitReport(
            parameters={"memory_sm_headroom": fit["value"]},
            sources={"memory_sm_headroom": f"measured: calibration/data/{rel} (smloss part: a BF16 add of 2^28 "
                                           f"elements alone and beside {', '.join(map(str, fit['held_sms']))} SMs held "
                                           f"without traffic), least squares on the slowdowns; {COMMAND}"},
            fits={"memory_sm_headroom": {
                "method": "bounded scalar least squares on relative error of 1/min(1, headroom*(S-held)/S)",
                "data_set": f"calibration/data/{rel}", **fit}})
        print(json.dumps({"gpu": gpu, **report.fits}, indent=1))
        _, done = write_shipped(report, inputs, gpu, COMMAND, dry_run=args.dry_run)
        print(f"{gpu}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
