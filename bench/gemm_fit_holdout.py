"""Held-out check of ``ovsim calibrate --fit gemm``: split a trace's GEMM kernels in two by launch
signature (kernel name and launching operator), fit on one half, score the other, both ways. Prints
the held-out mean absolute percentage error with the fitted main-loop efficiency, time per wave of
tiles and unaligned GEMMs' efficiency; with unaligned GEMMs priced at the aligned efficiency; and
with the efficiency alone (also fitted on the same half).

    python bench/gemm_fit_holdout.py [TRACE GPU]

Default: the HTA ``sampled_rank-0`` trace (A100, TF32 CUTLASS GEMMs) on a100-sxm4-80gb.
"""

from __future__ import annotations

import dataclasses
import sys
import zlib
from pathlib import Path

import numpy as np

from ovsim.calibrate import TraceInput, fit_gemm, gemm_points, trace_input
from ovsim.hw.calib import Parameters, load_calibration
from ovsim.hw.spec import load_gpu

# The shared traces sit in shared/traces of the folder that holds the repository.
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
DEFAULT = (str(TRACES / "HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz"),
           "a100-sxm4-80gb")


def scored(tr: TraceInput, params: Parameters, eff: dict[str, float], tile_s: dict[str, float],
           unaligned: dict[str, float] | None = None) -> list[float]:
    """Relative errors of the GEMMs fit_gemm would use, priced by the fitted form (GEMMs whose n or
    k is not on 16 bytes at their own efficiency where ``unaligned`` has one)."""
    odd = unaligned or {}
    return [abs(params.kernel_overhead_s + w / (eff[prec] if aligned else odd.get(prec, eff[prec]))
                + waves * tile_s.get(prec, 0.0) - t) / t
            for prec, pts in gemm_points([tr]).items() if prec in eff for t, w, waves, _, aligned in pts]


def main() -> None:
    path, gpu_name = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else DEFAULT
    tr = trace_input([Path(path)], gpu_name)
    params = load_calibration(load_gpu(gpu_name), gpu_name).params
    df = tr.bundle.kernels.reset_index(drop=True)
    half = np.array([zlib.crc32(f"{n}|{h}".encode()) % 2 for n, h in zip(df["name"], df["host_op"].astype(str),
                                                                       strict=True)])
    is_gemm = (df["kind"] == "gemm").to_numpy()
    for f in (0, 1):
        def part(sel: np.ndarray) -> TraceInput:
            # Other kernels stay, so that overlap with communication is judged as in the whole trace.
            return dataclasses.replace(tr, bundle=dataclasses.replace(tr.bundle, kernels=df[sel | ~is_gemm]))

        fit_on, test_on = part(half == f), part(half != f)
        values, rec = fit_gemm([fit_on], params)
        eff, tile = values["gemm_efficiency"], values["gemm_tile_overhead_s"]
        odd = values.get("gemm_unaligned_efficiency", {})
        alone = {p: r["efficiency_only"] for p, r in rec["precisions"].items() if "efficiency_only" in r}
        full = scored(test_on, params, eff, tile, odd)
        both = scored(test_on, params, eff, tile)
        one = scored(test_on, params, alone, {})
        per_wave = {k: f"{v * 1e6:.2f} us" for k, v in tile.items()}
        print(f"fit on half {f}: efficiency {eff}, time per wave {per_wave}, unaligned {odd}; held-out half: "
              f"{len(full)} GEMMs, MAPE {np.mean(full) * 100:.1f}% (unaligned at the aligned efficiency "
              f"{np.mean(both) * 100:.1f}%; efficiency alone {alone}: {np.mean(one) * 100:.1f}%)")


if __name__ == "__main__":
    main()
