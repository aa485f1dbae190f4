"""Write the published efficiencies of named attention kernels into the GPUs' calibrations.

Run from the repository root: ``python calibration/attention/published_rates.py`` (``--dry-run``
prints without writing). It writes ``attention_impl_efficiency`` as the next version of each GPU's
calibration, when it differs from the newest. Nothing here is imported by ovsim. Nothing is fitted:
each value is the middle of a range the kernels' authors published, in their papers' abstracts,
as a fraction of the GPU's dense 16-bit tensor peak:

- FlashAttention on the A100: "reaching only 25-40% of the theoretical maximum FLOPs/s"
  (Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
  arXiv 2307.08691): 0.325.
- FlashAttention-2 on the A100: "reaching 50-73% of the theoretical maximum FLOPs/s on A100"
  (the same abstract): 0.615.
- FlashAttention-2 on the H100: "achieving only 35% utilization on the H100 GPU" (Shah et al.,
  "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision",
  arXiv 2407.08608): 0.35. The H200 takes it (the same GH100 SMs; its GEMM fit is the H100's too).

Assumed: the forward and the backward kernels run at the same fraction (the abstracts give one
range for each implementation). FlashAttention-3's figure ("up to 740 TFLOPs/s (75%
utilization)" in FP16) is a best case, not a range, so it is not written: a scenario on an H100
that names no implementation runs ``flash`` at the calibration's ``attention_efficiency``.
"""

from __future__ import annotations

import argparse
import sys

from ovsim.calibrate import FitReport, write_shipped

COMMAND = "python calibration/attention/published_rates.py"
FA2_PAPER = "Dao, FlashAttention-2, arXiv 2307.08691, abstract"
FA3_PAPER = "Shah et al., FlashAttention-3, arXiv 2407.08608, abstract"
A100 = {"flash1": (0.25, 0.40, f"FlashAttention on the A100: 25-40% of the peak ({FA2_PAPER})"),
        "flash2": (0.50, 0.73, f"FlashAttention-2 on the A100: 50-73% of the peak ({FA2_PAPER})")}
HOPPER = {"flash2": (0.35, 0.35, f"FlashAttention-2 on the H100: 35% utilization ({FA3_PAPER}); the H200 "
                     "takes it (the same GH100 SMs)")}
# The calibration files that take each family's figures.
FAMILIES = {"a100-sxm4-40gb": A100, "a100-sxm4-80gb": A100, "h100-sxm5-80gb": HOPPER, "h200-sxm": HOPPER}


def report(figures: dict[str, tuple[float, float, str]]) -> FitReport:
    """The figures' midpoints as a calibration report, each with its published range."""
    values = {impl: round((lo + hi) / 2, 4) for impl, (lo, hi, _) in figures.items()}
    ranges = {impl: {"published_low": lo, "published_high": hi, "source": src}
              for impl, (lo, hi, src) in figures.items()}
    source = ("published: the middle of each implementation's published range of the dense 16-bit peak, "
              "forward and backward alike (assumed); " + "; ".join(src for _, _, src in figures.values())
              + f"; {COMMAND}")
    return FitReport(parameters={"attention_impl_efficiency": values},
                     sources={"attention_impl_efficiency": source},
                     fits={"published_rates": {"method": "midpoint of a published range", "ranges": ranges}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the values, write nothing")
    args = ap.parse_args()
    for stem, figures in FAMILIES.items():
        rep = report(figures)
        _, done = write_shipped(rep, [], stem, COMMAND, dry_run=args.dry_run)
        print(f"{stem}: {rep.parameters['attention_impl_efficiency']}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
