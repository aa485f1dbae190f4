"""The published overlap studies' headline figures (ovsim.studies), each against its target band."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:

    pass


from ovsim.validate.check import Check

STUDY = "overlap studies (published; not fitted)"


def study_checks(workers: int = 1, on_stage: Callable[[str], None] | None = None) -> list[Check]:
    """The overlap studies' headline figures (:mod:`ovsim.studies`), each against the target band
    set for it around the published value. Lee et al.'s matrix is run at full depth as its
    configurations would fit in GPU memory (the "fits" reading, at the boards' default power limits;
    about two minutes on one core, ``workers`` processes); configurations that fit in no way are
    left out and counted."""
    from ovsim import studies

    src_lee = "Lee et al., arXiv 2507.03114, abstract; configurations per a secondary reading note of the paper"
    src_cui = "Cui & Pericas, arXiv 2606.09200, abstract (up to 25.5%); setup per a secondary reading note"
    if on_stage is not None:
        on_stage("the overlap study's matrix (80 configurations, full depth, as they would fit in memory)")
    df = studies.lee_matrix(0, workers=workers, reading="fits")
    ran = df.dropna(subset=["compute_slowdown_pct"])
    n = (f"over the {len(ran)} of {len(df)} configurations ({', '.join(studies.LEE_PARALLEL)}; 4x A100, 4x H100; "
         f"FP16; batch 8-64) that fit in GPU memory, run as a user would fit them (ovsim.studies 'fits' reading: "
         f"gradient accumulation, recomputation where needed), at the boards' default power limits")
    by_layout = ", ".join(f"{p} {g.mean():.1f}%" for p, g in ran.groupby("parallel")["compute_slowdown_pct"])
    checks = [
        Check("compute slowdown from overlap, mean", STUDY, 18.9, float(ran["compute_slowdown_pct"].mean()), "%",
              0.0, src_lee, note=f"{n}; by layout: {by_layout}; target 15-23%", rule="band", low=15.0, high=23.0),
        Check("compute slowdown from overlap, max", STUDY, 40.0, float(ran["compute_slowdown_pct"].max()), "%",
              0.0, src_lee, note=f"{n}; target 32-48%", rule="band", low=32.0, high=48.0),
        Check("sequential slower than overlapped, mean", STUDY, 10.2, float(ran["accounted_slower_pct"].mean()), "%",
              0.0, src_lee, rule="band", low=6.0, high=14.0,
              note=f"accounted as the study does (overlapped less its slowdown, plus the communication hidden), {n}; "
                   f"simulated sequential schedule: {ran['sequential_slower_pct'].mean():.1f}%; target 6-14%"),
    ]
    if on_stage is not None:
        on_stage("GEMM + all-reduce under priority and occupancy shaping")
    cui = studies.cui_pericas()
    for system, g in cui.groupby("system", sort=False):
        less = g.set_index("schedule")["vs_naive_pct"].mul(-1)
        checks.append(Check(
            f"priority + occupancy shaping, less time than naive, {system}", STUDY, 25.5,
            float(less["priority + shaping"]), "%", 0.0, src_cui, rule="band", low=15.0, high=30.0,
            note=f"GEMM 8192^3 FP16 (64x64x32 tiles) + 896 MB all-reduce, one GEMM block per SM, at the board's "
                 f"default power limit; priority alone: {less['priority']:.1f}%; target 15-30%"))
    return checks
