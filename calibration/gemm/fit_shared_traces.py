"""Fit the shipped H100 GEMM parameters (``gemm_efficiency`` of the main loop and
``gemm_tile_overhead_s``, the fixed time per wave of tiles) on the shared H100 traces, and write the
GPU's next calibration version.

Data: the five TraceLens H100 inference traces (``ovsim.validate.GEMM_CASES``), BF16 GEMMs that
did not overlap communication and whose operator records its input shapes; the fit is
``ovsim calibrate --fit gemm`` (docs/calibration.md). What is written, and why:

- BF16: the fit on the aligned GEMMs (n and k on 16 bytes).
- FP16: the same values. FP16 and BF16 run on the same tensor cores at the same peak, and the
  shipped files have always priced them alike; no shared H100 trace has an FP16 GEMM.
- ``gemm_unaligned_efficiency`` is fitted but not written: 384 of its 390 GEMMs are attention
  ``bmm``s on three token counts (5, 3,137 and 5,185; the others are five addmm's to 4 outputs and
  one 30,522-word vocabulary head), so it is an efficiency of that kernel family, and written it
  would price every unaligned GEMM (an unpadded 50,257-word vocabulary head, say) at a tenth of
  the aligned rate. A calibration from a trace of one's own kernels can carry it.
- FP8, TF32, FP32 keep the earlier values (MAMF's FP8 figure; assumptions).

Superseded where measured: ``h100-sxm5-80gb.v12`` holds the GEMM parameters fitted on the
calibration harness's cuBLAS GEMMs (``calibration/harness/fit_measured.py``), in the frame a
scenario prices a GEMM in; this script then prints its fit and writes nothing, so that it never
puts the traces' fit back over a measurement.

The held-out figures (each trace's GEMMs at the fit on the other four) come from
``ovsim validate --traces``; against the published square-GEMM sweep, ``python
bench/gemm_square_sweep.py``.

    python calibration/gemm/fit_shared_traces.py [--traces DIR] [--dry-run]

Writes nothing when the newest file already holds the same values.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ovsim.calibrate import calibrate, trace_input, write_shipped
from ovsim.hw.calib import CALIB_DIR, load_calibration, read_calib_file
from ovsim.hw.spec import gpu_file, load_gpu
from ovsim.validate import GEMM_CASES

ROOT = Path(__file__).resolve().parents[2]
MEASURED = "measured: calibration/data/"
FITTED = "bf16"
ALSO = {"fp16": "the BF16 fit (same tensor cores and peak; no shared H100 trace has an FP16 GEMM)"}
NOT_SHIPPED = ("gemm_unaligned_efficiency: fitted, not written; 384 of its 390 GEMMs are attention bmm's on three "
               "token counts, so it would price every other unaligned GEMM by that kernel family")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument("--dry-run", action="store_true", help="print the fits, write nothing")
    args = ap.parse_args()
    for gpu, rels in GEMM_CASES.items():
        inputs = [trace_input([args.traces / rel], gpu) for rel in rels if (args.traces / rel).exists()]
        if not inputs:
            print(f"{gpu}: no shared traces under {args.traces}", file=sys.stderr)
            return 1
        report = calibrate(inputs, gpu, quantities=["gemm"])
        params = {name: {FITTED: report.parameters[name][FITTED], **{p: report.parameters[name][FITTED]
                                                                     for p in ALSO}}
                  for name in ("gemm_efficiency", "gemm_tile_overhead_s")}
        sources = {name: f"the {FITTED} GEMMs' {report.sources[name]}; " + "; ".join(
            f"{p} takes {why}" for p, why in ALSO.items()) for name in params}
        fits = {**report.fits, "gemm": {**report.fits["gemm"], "shipped": {
            "written": f"{FITTED} and, as {FITTED}, " + ", ".join(ALSO), "not_written": NOT_SHIPPED}}}
        shipped = dataclasses.replace(report, parameters=params, sources=sources, fits=fits)
        print(json.dumps({"gpu": gpu, "parameters": params, "fits": fits}, indent=1))
        newest = load_calibration(load_gpu(gpu), gpu_file(gpu).stem).files[-1]
        if MEASURED in read_calib_file(CALIB_DIR / newest).sources.get("gemm_efficiency", ""):
            print(f"{gpu}: {newest} holds GEMM parameters fitted on measured data; nothing written")
            continue
        _, done = write_shipped(shipped, inputs, gpu, "python calibration/gemm/fit_shared_traces.py",
                                dry_run=args.dry_run)
        print(f"{gpu}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
