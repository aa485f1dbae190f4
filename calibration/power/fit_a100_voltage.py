"""Fit the A100's voltage curve (the knee of ovsim's power model) to measured energy at locked clocks.

Run from the repository root: ``python calibration/power/fit_a100_voltage.py`` (``--dry-run``
prints without writing). It writes ``power_knee_clock_fraction`` and ``power_knee_voltage_fraction``
as the next version of both A100 calibrations, when they differ from the newest; run
``python calibration/power/fit_published_anchors.py`` after it, since the tensor and CUDA-core
weights are solved on the curve. Nothing here is imported by ovsim.

Data (``calibration/power/perseus/``, its README): one pipeline stage's forward and backward pass of
GPT-3 175B and of BLOOM 176B in BF16 on an A100 SXM at every SM clock from 1410 to 855 MHz,
measured by Perseus (Chung et al., SOSP 2024). Fitted on GPT-3 175B's two passes; BLOOM 176B's are
held out.

The model approximates ovsim's (docs/power.md): dynamic power ``s(c) = c·V(c)²``, V flat at
``v_knee`` up to the clock fraction ``c_knee`` and rising linearly to 1 at the compute clock. A
pass's time is fitted as ``T(c) = a + b/c`` (the part that follows the clock and the part that does
not). Over a pass, the clock-bound work does a fixed number of cycles, so its dynamic energy goes
as V(c)², and the rest of the board draws about a constant power over the pass's time:
``E(c) = p·T(c) + d·V(c)²``: the energy that follows the clock without doing a fixed number of
cycles (idle power's clock part and memory-bound kernels' SM power over the part of the time that
does not follow the clock, ``a·c·V²``) is left out; with it the fit is no longer well posed (its
coefficient comes out negative). ``p`` and ``d`` depend on the workload and on how many GPUs a row
covers (the source does not say), so they are solved per pass, by linear least squares on relative
error, for every curve tried; only ``c_knee`` and ``v_knee`` are shared, and only they are written.
The clocks above 1365 MHz are left out: from 1365 to 1410 MHz the time falls 0.2-0.6% where the
law fitted below gives 2.8-3.1%, as if the board did not hold them (a 500 W part at its limit, or
a clock lock above what it sustains).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from fit_published_anchors import write_a100
from scipy.optimize import least_squares, minimize_scalar

from ovsim.calibrate import FitReport
from ovsim.hw.power import voltage_fractions

DATA = Path(__file__).resolve().parent / "perseus" / "a100_sxm_stage_profiles.csv"
COMPUTE_CLOCK_MHZ = 1410.0
TOP_CLOCK_LEFT_OUT = 0.975  # clock fractions above this are left out (the time stops falling)
FIT_MODEL = "gpt3-175b"
ASSUMED = (0.6, 0.65)  # default.v7's knee clock and voltage fractions (an assumption)
FLAT = (0.6, 1.0)  # voltage that does not move with the clock
FLOORS = (0.65, 0.72, 0.78, 0.85)  # floors held to show how well the data fix it
COMMAND = "python calibration/power/fit_a100_voltage.py"
SOURCE = ("Perseus's A100 SXM stage profiles (Chung et al., SOSP 2024; github.com/ml-energy/zeus "
          "38cb3f90, sosp24_data/emulation/stage_profile; calibration/power/perseus)")


def passes(df: pd.DataFrame) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(clock fraction, time s, energy J) of each (model, pass), the top clocks left out."""
    out = {}
    for (model, ins), g in df.groupby(["model", "instruction"], sort=True):
        g = g.sort_values("sm_clock_mhz")
        c = g["sm_clock_mhz"].to_numpy(float) / COMPUTE_CLOCK_MHZ
        keep = c <= TOP_CLOCK_LEFT_OUT
        out[(str(model), str(ins))] = (c[keep], g["time_s"].to_numpy(float)[keep], g["energy_j"].to_numpy(float)[keep])
    return out


def relative_residuals(c: np.ndarray, t: np.ndarray, e: np.ndarray, knee: tuple[float, float]) -> np.ndarray:
    """E(c) = p·T(c) + d·V(c)² against the measured energy, p and d solved on relative error."""
    a, b = np.linalg.lstsq(np.vstack([np.ones_like(c), 1.0 / c]).T, t, rcond=None)[0]
    basis = np.vstack([(a + b / c) / e, voltage_fractions(c, *knee) ** 2 / e]).T
    coef = np.linalg.lstsq(basis, np.ones_like(e), rcond=None)[0]
    residuals: np.ndarray = basis @ coef - 1.0
    return residuals


def rms_pct(series: list[tuple[np.ndarray, np.ndarray, np.ndarray]], knee: tuple[float, float]) -> float:
    r = np.concatenate([relative_residuals(*s, knee) for s in series])
    return float(100.0 * np.sqrt(np.mean(r * r)))


def fit_knee(series: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[float, float]:
    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate([relative_residuals(*s, (float(x[0]), float(x[1]))) for s in series])
    # The knee clock moves the residuals in steps between grid points: start from a coarse grid.
    grid = [(ck, vk) for ck in np.arange(0.62, 0.96, 0.02) for vk in np.arange(0.5, 1.0, 0.02)]
    start = min(grid, key=lambda k: rms_pct(series, k))
    x = least_squares(residuals, start, bounds=([0.5, 0.4], [0.97, 1.0]), diff_step=1e-3).x
    return round(float(x[0]), 3), round(float(x[1]), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = ap.parse_args()
    by_pass = passes(pd.read_csv(DATA))
    fit_set = [s for (model, _), s in by_pass.items() if model == FIT_MODEL]
    knee = fit_knee(fit_set)
    print(f"fitted on {FIT_MODEL}'s forward and backward: knee at {knee[0]:.3f} of {COMPUTE_CLOCK_MHZ:.0f} MHz "
          f"({knee[0] * COMPUTE_CLOCK_MHZ:.0f} MHz), voltage there {knee[1]:.3f} of the compute clock's")
    print(f"{'pass':28s} {'role':9s} {'fitted':>8s} {'assumed':>8s} {'flat':>8s}   (RMS of energy, %)")
    for (model, ins), s in by_pass.items():
        role = "fitted" if model == FIT_MODEL else "held out"
        print(f"{model + ' ' + ins:28s} {role:9s} {rms_pct([s], knee):8.2f} {rms_pct([s], ASSUMED):8.2f} "
              f"{rms_pct([s], FLAT):8.2f}")
    held = [s for (model, _), s in by_pass.items() if model != FIT_MODEL]
    print("how well the data fix the floor: the knee clock refitted for each floor held")
    for floor in FLOORS:
        ck = round(float(minimize_scalar(lambda x, v=floor: rms_pct(fit_set, (x, v)), bounds=(0.5, 0.95),
                                         method="bounded").x), 3)
        print(f"  floor {floor:.2f}: knee {ck:.3f}, RMS fitted {rms_pct(fit_set, (ck, floor)):.2f}%, "
              f"held out {rms_pct(held, (ck, floor)):.2f}%")
    source = (f"fit: {SOURCE}, GPT-3 175B's forward and backward passes at 855-1365 MHz, E = p T(c) + d V(c)^2 per "
              f"pass; BLOOM 176B's held out: energy RMS {rms_pct(held, knee):.2f}% against "
              f"{rms_pct(held, ASSUMED):.2f}% with the assumed curve (0.6, 0.65); {COMMAND}")
    report = FitReport(
        parameters={"power_knee_clock_fraction": knee[0], "power_knee_voltage_fraction": knee[1]},
        sources={"power_knee_clock_fraction": source, "power_knee_voltage_fraction": source},
        fits={"a100_voltage": {"method": "least squares on relative energy error, per-pass scales solved linearly",
                               "fit_rms_pct": round(rms_pct(fit_set, knee), 2),
                               "held_out_rms_pct": round(rms_pct(held, knee), 2),
                               "held_out_rms_pct_assumed_curve": round(rms_pct(held, ASSUMED), 2)}})
    write_a100(report, COMMAND, args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
