"""The overlap study's configuration matrix (Lee et al., arXiv 2507.03114, its abstract and a
secondary reading note of the paper) and the GEMM + all-reduce priority/shaping study (Cui & Pericas,
arXiv 2606.09200), predicted by ovsim (``ovsim.studies``) and set against the published figures.

    python bench/overlap_study.py            # the matrix with 4 layers per model (about a minute)
    python bench/overlap_study.py --layers 0 --workers 2  # full depth (about 2-4 minutes)
    python bench/overlap_study.py --layers 0 --reading fits --workers 2   # as it would fit in memory, about
                                                                          # 4 minutes (what ovsim validate
                                                                          # --studies checks)

Every configuration runs at its GPUs' default power limit, as the studies' boards did
(``ovsim.studies.default_limit_w``); the compute slowdown is overlapped compute against the
sequential run's compute at that limit.

Compute slowdown = overlapped compute time / the sequential run's compute time - 1; "sequential slower" =
sequential iteration / overlapped iteration - 1, with the sequential iteration both simulated and
accounted for as the study does (``ovsim.api.accounted_sequential_s``: the overlapped iteration
less its compute slowdown, plus the communication that overlapped compute). The reduced-depth matrix keeps every layer's
shapes and only cuts the count. It understates whole-iteration slowdowns, because the embedding,
head, optimizer and the edge layers (little compute to hide under) weigh more in a short model;
notebooks/overlap_study.ipynb extrapolates to full depth instead; docs/training.md has the full-depth figures.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ovsim import studies


def show(r: dict[str, Any]) -> None:
    if r["micro_batches"] == 0:
        print(f"{r['model']:<11} {r['system']:<7} {r['parallel']:<5} b{r['batch']:<3} fits in no way; not run")
        return
    print(f"{r['model']:<11} {r['system']:<7} {r['parallel']:<5} b{r['batch']:<3} "
          f"{r['micro_batches']:>2} x {r['micro_batch_size']:<2}{' R' if r['recompute'] else '  '} "
          f"{r['memory_per_gpu_gb']:5.1f} GB{'' if r['fits_memory'] else '!'} iter {r['iteration_ms']:9.1f} ms  "
          f"slowdown {r['compute_slowdown_pct']:5.1f}%  sequential {r['sequential_slower_pct']:+5.1f}% "
          f"(accounted {r['accounted_slower_pct']:+5.1f}%)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4, help="layers per model (0: the model's own)")
    ap.add_argument("--batches", type=int, nargs="+", default=list(studies.LEE_BATCHES))
    ap.add_argument("--workers", type=int, default=1, help="processes (0: one per CPU core)")
    ap.add_argument("--reading", choices=studies.READINGS, default="literal",
                    help="how the study's batch becomes a configuration (ovsim.studies.READINGS)")
    args = ap.parse_args()
    depth = "full depth" if args.layers == 0 else (
        f"{args.layers} layers per model: the whole-iteration slowdowns come out low (the embedding, head, "
        "optimizer and edge layers weigh more); --layers 0 for full depth")
    reading = ("literal reading: the study's batch as one micro-batch per GPU (FSDP) or 8 micro-batches "
               "(pipeline), whether it fits or not" if args.reading == "literal" else
               "fits reading: each configuration run as it would fit in GPU memory (what ovsim validate "
               "--studies checks)")
    print(f"{depth}\n{reading}\ncolumns: micro-batches x size (R: recomputation), estimated memory per GPU "
          "('!': does not fit), iteration, compute slowdown, sequential iteration against overlapped\n")
    t0 = time.perf_counter()
    df = studies.lee_matrix(args.layers, args.batches, workers=args.workers, on_row=show, reading=args.reading)
    print()
    print(f"matrix: {len(df)} configurations x 2 schedules in {time.perf_counter() - t0:.0f} s "
          f"({args.reading} reading); {int((~df['fits_memory'].astype(bool)).sum())} do not fit in GPU memory")
    df = df.dropna(subset=["compute_slowdown_pct"])
    print(f"compute slowdown: mean {df['compute_slowdown_pct'].mean():.1f}% (published 18.9%, target 15-23%), "
          f"max {df['compute_slowdown_pct'].max():.1f}% (published 40%, target 32-48%)")
    print(f"sequential slower than overlapped: mean {df['sequential_slower_pct'].mean():.1f}% "
          f"(published 10.2%, target 6-14%), max {df['sequential_slower_pct'].max():.1f}% (published 26.6%)")
    print(f"  by the study's accounting (ideal + hidden communication): mean {df['accounted_slower_pct'].mean():.1f}%, "
          f"max {df['accounted_slower_pct'].max():.1f}%")
    print(df.groupby(["parallel", "system"])[["compute_slowdown_pct", "sequential_slower_pct",
                                              "accounted_slower_pct"]].mean().round(1).to_string())
    print()
    pr = studies.cui_pericas().pivot(index="system", columns="schedule", values="iteration_ms")
    pr = pr[list(studies.CUI_SCHEDULES)]
    for s in ("priority", "priority + shaping"):
        pr[f"{s} vs naive %"] = (pr[s] / pr["naive overlap"] - 1) * 100
    print(pr.round(2).to_string())
    print("published: priority + occupancy shaping up to 25.5% less time than naive overlap (target 15-30%)")


if __name__ == "__main__":
    main()
