"""Fit a fused attention kernel's efficiency, forward and backward, on the H200's measured layers,
score it on other runs, and write it into the Hopper calibrations.

The layers runs (calibration/data/h200-sxm/2026-12-04; ``layers.py``) profiled PyTorch 2.11's
fused attention (cuDNN 9.19's ``sdpa_sm90_flash_fprop`` and ``_bprop`` kernels, causal, BF16) inside
one rank's share of seven published runs' layers: sequences of 2,048 and 8,192, 8 to 56 heads, heads
of 96 and 128. For each shape the kernels' median time is brought to the GPU's compute clock (1,830
MHz, where its 989 TFLOPS are quoted) from the SM clock NVML read over the profiled iterations
(attention is compute-bound: its time follows the clock), the backward's with cuDNN's two small
kernels beside it (``compute_dot_do_o``, ``convert_dq_to_16bits``), which ovsim's one backward op
stands for.

What the times show, and the model ``ovsim.models.cost.attention`` takes from them:

- the backward runs at a lower fraction of the peak than the forward (``attention_backward_efficiency``);
- longer rows of keys run faster: a block of queries spends, beside its keys, what it spends once
  (loading its queries, writing its output), ``attention_block_overhead_tiles`` tiles of 128 keys
  (a block of n tiles runs at n / (n + that) of the efficiency);
- a head of 96 runs on the same kernel as a head of 128 (the kernels' names end in their head
  tile: ``x128`` for both, ``x64`` for heads of 64 in the steps run): the kernel rounds heads up to
  a multiple of 64 (``attention_head_dim_multiple``, read off the names, not fitted).

The fit: the three parameters by least squares on the logarithm of the times, forward and backward
together, over the first set's shapes. Held out: the same layers on another machine
(``2026-12-04-c``) and the MPT models' training steps and the MPT-7B layer of ``2026-12-04-b``
(heads of 64 and 128). The H100 takes the H200's values (the same GH100 SMs and clocks, as it takes
its GEMM and named-kernel figures). Other GPUs keep ``attention_efficiency`` 0.6 (``default``: an
assumption) and none of the rest.

    python calibration/attention/fit_measured.py [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from ovsim.calibrate import FitReport, write_shipped
from ovsim.hw.calib import Parameters, load_calibration
from ovsim.hw.spec import GpuSpec, load_gpu
from ovsim.models import cost
from ovsim.validate.datasets import fit_sets

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "calibration" / "data"
COMMAND = "python calibration/attention/fit_measured.py"
FORWARD, BACKWARD = "sdpa_sm90_flash_fprop", "sdpa_sm90_flash_bprop"
HELPERS = "compute_dot_do_o|convert_dq_to_16bits"
ENTRY = fit_sets("attention_efficiency")["h200-sxm"]
# The MPT models' steps (heads of 64 and 128) and the MPT-7B layer of a later lease: held out too.
STEPS_SET = "h200-sxm/2026-12-04-b"


def measured(data_set: str, gpu: GpuSpec) -> pd.DataFrame:
    """Per layer shape of ``data_set`` with fused attention: its attention's size and its forward and
    backward kernels' median times at the compute clock (seconds)."""
    folder = DATA / data_set
    df = pd.read_parquet(folder / "layers.parquet")
    manifest = json.loads((folder / "manifest.json").read_text())
    kernels, nvml = df[df["table"] == "kernels"], df[df["table"] == "nvml"]
    rows = []
    for (part, name), k in kernels.groupby(["part", "shape"]):
        shape = next((s for s in manifest.get(str(part), {}).get("shapes", ()) if s["name"] == name), None)
        if shape is None or shape.get("attention") != "flash" or not k["name"].str.contains(FORWARD).any():
            continue
        mhz = float(nvml[(nvml["label"] == f"{name}/profiled") & (nvml["part"] == part)]["sm_mhz"].median())
        to_compute_clock = mhz * 1e6 / gpu.clocks.compute_clock_hz
        fwd = float(k[k["name"].str.contains(FORWARD)]["dur_us"].median()) * 1e-6 * to_compute_clock
        bwd = float(k[k["name"].str.contains(BACKWARD)]["dur_us"].median()) * 1e-6 * to_compute_clock
        helpers = float(k[k["name"].str.contains(HELPERS)].groupby("name")["dur_us"].median().sum()) * 1e-6
        rows.append({"shape": f"{name} ({part})", "batch": shape["micro_batch"], "heads": shape["q_heads"],
                     "seq": shape["seq"], "head_dim": shape["head_dim"], "mhz": mhz, "forward_s": fwd,
                     "backward_s": bwd + helpers})
    return pd.DataFrame(rows)


HEAD_MULTIPLE = 64  # the kernels' head tiles: 64 for heads of 64, 128 for 96 and 128 (their names)


def modelled_s(row: pd.Series, gpu: GpuSpec, backward: bool, params: Parameters) -> float:
    """The shape's time as ``ovsim.models.cost.attention`` prices a fused kernel under ``params``."""
    return cost.attention(int(row["batch"]), int(row["heads"]), int(row["seq"]), int(row["head_dim"]), "bf16", gpu,
                          params, backward=backward).isolated_s


def with_attention(gpu: GpuSpec, fwd: float, bwd: float | None, tiles: float, multiple: int) -> Parameters:
    """The GPU's calibration with these attention parameters in place of its own."""
    return load_calibration(gpu, gpu.name).params.model_copy(update={
        "attention_efficiency": fwd, "attention_backward_efficiency": bwd, "attention_block_overhead_tiles": tiles,
        "attention_head_dim_multiple": multiple})


def fit(df: pd.DataFrame, gpu: GpuSpec) -> tuple[float, float, float]:
    """(forward efficiency, backward efficiency, block overhead in key tiles) by least squares on
    the logarithm of the times."""

    def residuals(x: np.ndarray) -> list[float]:
        params = with_attention(gpu, float(x[0]), float(x[1]), float(x[2]), HEAD_MULTIPLE)
        return [math.log(modelled_s(r, gpu, bool(b), params) / float(r[col]))
                for _, r in df.iterrows() for b, col in ((0, "forward_s"), (1, "backward_s"))]

    sol = least_squares(residuals, [0.6, 0.5, 3.0], bounds=([0.05, 0.05, 0.0], [1.0, 1.0, 100.0]))
    return round(float(sol.x[0]), 3), round(float(sol.x[1]), 3), round(float(sol.x[2]), 2)


def score(df: pd.DataFrame, gpu: GpuSpec, fwd: float, bwd: float, tiles: float, label: str) -> float:
    """Print each shape's kernels against the model (and against the flat 0.6 it replaces); the MAPE."""
    print(f"\n{label}\n{'shape':<36} {'MHz':>5} {'fwd ms':>7} {'ovsim':>7} {'err':>7} {'bwd ms':>7} {'ovsim':>7} "
          f"{'err':>7} {'at 0.6: fwd':>11} {'bwd':>7}")
    fitted, at_06 = with_attention(gpu, fwd, bwd, tiles, HEAD_MULTIPLE), with_attention(gpu, 0.6, None, 0.0, 1)
    errors, flat = [], []
    for _, r in df.iterrows():
        cells, before = [], []
        for backward, col in ((False, "forward_s"), (True, "backward_s")):
            meas = float(r[col])
            mine, old = modelled_s(r, gpu, backward, fitted), modelled_s(r, gpu, backward, at_06)
            errors.append(abs(mine / meas - 1))
            flat.append(abs(old / meas - 1))
            cells += [f"{meas * 1e3:7.3f}", f"{mine * 1e3:7.3f}", f"{mine / meas - 1:+7.1%}"]
            before.append(f"{old / meas - 1:+.1%}")
        print(f"{r['shape']:<36} {r['mhz']:5.0f} {' '.join(cells)} {before[0]:>11} {before[1]:>7}")
    mape = sum(errors) / len(errors)
    print(f"MAPE {mape:.1%} over {len(errors)} kernels' times (at 0.6 both ways: {sum(flat) / len(flat):.1%})")
    return mape


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the fit and its scores, write nothing")
    args = ap.parse_args()
    gpu = load_gpu("h200-sxm")
    fit_set, held_set = str(ENTRY["set"]), str(ENTRY["held_out"])
    fwd, bwd, tiles = fit(measured(fit_set, gpu), gpu)
    print(f"fitted on {fit_set}: forward {fwd}, backward {bwd} of the peak over long rows of keys; "
          f"{tiles} key tiles a block beside its keys; heads rounded up to {HEAD_MULTIPLE}")
    score(measured(fit_set, gpu), gpu, fwd, bwd, tiles, f"fitted: {fit_set}")
    for held in (held_set, STEPS_SET):
        score(measured(held, gpu), gpu, fwd, bwd, tiles, f"held out: {held}")
    values = {"attention_efficiency": fwd, "attention_backward_efficiency": bwd,
              "attention_block_overhead_tiles": tiles, "attention_head_dim_multiple": HEAD_MULTIPLE}
    source = (f"measured: cuDNN 9.19's fused attention in PyTorch 2.11 on an H200 (calibration/data/{fit_set}, "
              f"layers part: 7 published runs' layer shapes, sequences of 2,048 and 8,192), its kernels' times at the "
              f"compute clock fitted by least squares on their logarithm (forward {fwd}, backward {bwd} with cuDNN's "
              f"two small kernels beside it, {tiles} key tiles a block), heads rounded up to {HEAD_MULTIPLE} as the "
              f"kernels' names say; held out on calibration/data/{held_set} and {STEPS_SET}; the H100 takes the "
              f"H200's (the same GH100 SMs); {COMMAND}")
    for stem in ("h200-sxm", "h100-sxm5-80gb"):
        rep = FitReport(parameters=dict(values), sources={k: source for k in values},
                        fits={"attention_measured": {"method": "least squares on log times",
                                                     "data_set": f"calibration/data/{fit_set}",
                                                     "held_out": [f"calibration/data/{held_set}",
                                                                  f"calibration/data/{STEPS_SET}"]}})
        _, done = write_shipped(rep, [], stem, COMMAND, dry_run=args.dry_run)
        print(f"{stem}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
