"""What the boards' NVML power readings resolve: how often each run's reading changed, and its highest.

Run from the repository root: ``python calibration/power/nvml_readings.py``. It reads every
``power.csv.gz`` under calibration/data (``nvidia-smi --query-gpu=power.draw.instant`` sampled
every ~5 ms by the harness) and prints, per run, the samples, the median and 10th-90th percentile
time between changes of the reading, and the highest reading. Nothing here is imported by ovsim.

What it shows (docs/power.md, "Outputs"): on every H100 and H200 board measured the "instant"
reading changed about every 100 ms (10th-90th percentile 0.1-0.2 s) and repeated in between, so
the highest readings (951 W on the H100, 945 W on the H200) are not the power of an instant. What
a reading averages is not in these data: Yang et al. (SC24, arXiv 2312.02741) found about 25 ms of
each 100 ms on the A100 and H100. A prediction's comparable figure is its highest 25 ms average
(``Result.power(window_s=0.025)``), not the power the model draws between two events
(``peak_power_w``), which no reading resolves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(__file__).resolve().parents[1] / "data"
POWER_COLUMN = "power.draw.instant [W]"


def readings(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(seconds since the first sample, watts) of one run's NVML power samples."""
    df = pd.read_csv(path, skipinitialspace=True)
    df.columns = [c.strip() for c in df.columns]
    t = pd.to_datetime(df["timestamp"], format="%Y/%m/%d %H:%M:%S.%f")
    seconds = (t - t.iloc[0]).dt.total_seconds().to_numpy()
    return seconds, df[POWER_COLUMN].to_numpy(float)


def change_intervals_s(seconds: np.ndarray, watts: np.ndarray) -> np.ndarray:
    """Seconds between consecutive changes of the reading (gaps between phases, over 1 s, left out)."""
    changed = np.flatnonzero(np.diff(watts) != 0) + 1
    gaps = np.diff(seconds[changed])
    return gaps[gaps < 1.0]


def runs(data: Path = DATA) -> Iterator[tuple[str, str, np.ndarray, np.ndarray]]:
    """(GPU folder, run folder, seconds, watts) of every run with NVML power samples."""
    for path in sorted(data.glob("*/*/power.csv.gz")):
        seconds, watts = readings(path)
        yield path.parent.parent.name, path.parent.name, seconds, watts


def highest_reading_w(gpu: str, data: Path = DATA) -> float:
    """The highest NVML power reading of any run of one GPU folder (``h100-sxm5-80gb``)."""
    return max(float(w.max()) for g, _, _, w in runs(data) if g == gpu)


def main() -> None:
    print(f"{'run':40s} {'samples':>8s} {'median s':>9s} {'p10-p90 s':>11s} {'highest W':>10s}")
    for gpu, run, seconds, watts in runs():
        gaps = change_intervals_s(seconds, watts)
        spread = f"{np.percentile(gaps, 10):.2f}-{np.percentile(gaps, 90):.2f}" if len(gaps) else "-"
        median = f"{np.median(gaps):.3f}" if len(gaps) else "-"
        print(f"{gpu + '/' + run:40s} {len(watts):8d} {median:>9s} {spread:>11s} {watts.max():10.1f}")


if __name__ == "__main__":
    main()
