"""GEMM efficiency on the shared traces, by the alignment of the library kernel that ran.

CUTLASS-style kernel names carry ``alignN``: the elements each load of A and B moves. A problem
whose leading dimensions are not a multiple of 16 bytes cannot use the widest loads, and the
library picks a narrower (``align1``, ``align2``) kernel. The cost model tells such GEMMs apart by
their shapes (``ovsim.models.cost.gemm_aligned``) and prices them at ``gemm_unaligned_efficiency``;
this shows what the library's own choice says: for each precision and alignment tag, the GEMMs
``ovsim calibrate --fit gemm`` would use (``ovsim.calibrate.gemm_points``), how many of them the
shape rule calls aligned, the median of their achieved FLOP rate over the dense peak, and the
main-loop efficiency that fits them alone (no time per wave) with its error (fit error, on the
kernels fitted).

    python bench/gemm_alignment.py [--traces DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import numpy as np

from ovsim.calibrate import TraceInput, gemm_efficiency_at, gemm_points, trace_input
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import load_gpu

ROOT = Path(__file__).resolve().parents[1]
H100 = "TraceLens/tests/traces/h100/"
TRACES = {
    "h100-sxm5-80gb": [H100 + n for n in ("Falconsai_nsfw_image_detection__1016002.json.gz",
                                          "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                                          "facebook_timesformer-base-finetuned-k400__1016002.json.gz",
                                          "gaunernst_bert-small-uncased__1016001.json.gz",
                                          "google_owlv2-large-patch14-ensemble__1016001.json.gz")],
    "a100-sxm4-80gb": ["HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz"],
}
_ALIGN = re.compile(r"align(\d+)", re.IGNORECASE)


def tag(name: str) -> str:
    m = _ALIGN.search(name)
    return f"align{m.group(1)}" if m else "no tag"


def only(tr: TraceInput, group: str) -> TraceInput:
    """The trace with the GEMMs of other alignment groups dropped (everything else kept, so that
    which GEMMs overlapped communication does not change)."""
    k = tr.bundle.kernels
    keep = (k["kind"] != "gemm") | (k["name"].map(tag) == group)
    return dataclasses.replace(tr, bundle=dataclasses.replace(tr.bundle, kernels=k[keep].reset_index(drop=True)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    args = ap.parse_args(argv)
    print(f"{'gpu':<16} {'precision':<9} {'kernel':<8} {'GEMMs':>6} {'aligned':>7} {'median of peak':>14} "
          f"{'fitted eff':>10} {'fit error':>9}")
    for gpu_name, rels in TRACES.items():
        paths = [args.traces / r for r in rels if (args.traces / r).exists()]
        if not paths:
            print(f"{gpu_name}: no shared traces under {args.traces}", file=sys.stderr)
            continue
        # The A100 trace does not record its device: it is named, as the calibration scripts do.
        inputs = [trace_input([p], gpu_name) for p in paths]
        gpu = load_gpu(gpu_name)
        overhead_s = load_calibration(gpu, gpu_name).params.kernel_overhead_s
        groups = sorted({tag(n) for tr in inputs for n in tr.bundle.kernels.loc[tr.bundle.kernels["kind"] == "gemm",
                                                                                 "name"]})
        for group in groups:
            for prec, pts in sorted(gemm_points([only(tr, group) for tr in inputs]).items()):
                t, w, waves, flops, aligned = (np.array(c, dtype=float) for c in zip(*pts, strict=True))

                eff, err = gemm_efficiency_at(t, w, waves, 0.0, overhead_s)
                of_peak = float(np.median(flops / t / gpu.peak_flops_per_s(prec)))
                print(f"{gpu_name:<16} {prec:<9} {group:<8} {len(t):>6} {int(aligned.sum()):>7} {of_peak:>14.3f} "
                      f"{eff:>10.3f} {err * 100:>8.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
