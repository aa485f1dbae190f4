"""How low a replay's overlapped-kernel error can go on a trace: figures that need no model.

Each is computed from the trace alone, over the kernels a replay scores (overlapped, isolated
duration from clean instances of their signature, :mod:`ovsim.replay_kernels`):

- *naive*: the error of predicting every scored kernel by its isolated duration;
- *best constant*: the MAPE of the best single slowdown factor for all of them, chosen with
  hindsight (a model that slows every overlapped kernel alike cannot do better);
- *clean spread*: the MAPE of predicting each clean (not overlapped) instance of a scored signature
  by the median of the other clean instances: the run-to-run spread every prediction inherits;
- *repeat*: each scored kernel predicted by its isolated duration times the median slowdown
  (measured over isolated) of the *other* overlapped instances of its signature on its rank beside
  the same collectives. It sees measured slowdowns, so no model is owed it; it says how far a model
  that gets each kind of kernel beside each collective right could go, and how much of the error
  is instance-to-instance scatter that no per-kernel model removes. Scored only on kernels with
  such a repeat.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ovsim.replay_kernels import (
    COMPUTE_KINDS,
    SIGNATURE_SPREAD,
    KernelColumns,
    isolated_durations,
    overlap_flags,
    signatures,
)
from ovsim.replay_score import mape_pct, weighted_error_pct


@dataclass(frozen=True)
class Floor:
    """The figures of the module docstring for one trace; errors in percent."""

    scored: int
    naive_mape_pct: float
    naive_weighted_pct: float
    best_constant_mape_pct: float
    clean_spread_pct: float
    repeated: int  # scored kernels with another overlapped instance of their signature and company
    repeated_time_share: float  # their share of the scored kernels' measured time
    repeat_naive_weighted_pct: float
    repeat_weighted_pct: float
    repeat_naive_mape_pct: float
    repeat_mape_pct: float


def floor(kernels: pd.DataFrame) -> Floor:
    """:class:`Floor` of a trace's kernel table."""
    c = KernelColumns.of(kernels.reset_index(drop=True))
    overlapped = overlap_flags(c)
    iso, src = isolated_durations(c, overlapped)
    sel = np.flatnonzero(overlapped & (src == "signature") & (c.dur > 0))
    meas, base = c.dur[sel], iso[sel]
    sig = signatures(c)
    best = min(mape_pct(f * base, meas) for f in np.linspace(0.3, 3.0, 541)) if len(sel) else float("nan")
    rows, pred = _repeat(c, sig, sel, iso)
    m = c.dur[rows]
    total = float(meas.sum())
    return Floor(len(sel), mape_pct(base, meas), weighted_error_pct(base, meas), best,
                 _clean_spread(c, sig, overlapped, sel), len(rows),
                 float(m.sum()) / total if total > 0 else float("nan"),
                 weighted_error_pct(iso[rows], m), weighted_error_pct(pred, m),
                 mape_pct(iso[rows], m), mape_pct(pred, m))


def _clean_spread(c: KernelColumns, sig: list[str], overlapped: np.ndarray, sel: np.ndarray) -> float:
    """MAPE of each clean instance of a scored signature against the median of the others."""
    scored = {sig[i] for i in sel}
    is_compute = np.array([k in COMPUTE_KINDS for k in c.kind], dtype=bool)
    clean: dict[str, list[int]] = {}
    for i in np.flatnonzero(is_compute & ~overlapped & (c.dur > 0)):
        if sig[i] in scored:
            clean.setdefault(sig[i], []).append(int(i))
    errs: list[float] = []
    for rows in clean.values():
        d = c.dur[rows]
        lo, hi = np.percentile(d, [10, 90])
        if len(d) < 3 or hi > SIGNATURE_SPREAD * lo:
            continue
        errs.extend(abs(float(np.median(np.delete(d, j))) - d[j]) / d[j] for j in range(len(d)))
    return float(np.mean(errs) * 100) if errs else float("nan")


def _repeat(c: KernelColumns, sig: list[str], sel: np.ndarray, iso: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The scored rows with a repeat (module docstring) and each one's repeat prediction (s)."""
    is_comm = np.array([k == "collective" for k in c.kind], dtype=bool)
    groups: dict[tuple[str, int, str], list[int]] = {}
    # One pass per scored kernel over its rank's collectives: fine for traces of thousands of
    # kernels, the size the shared traces have.
    for i in sel:
        beside = np.flatnonzero(is_comm & (c.rank == c.rank[i]) & (c.start < c.end[i]) & (c.end > c.start[i]))
        company = "+".join(sorted({c.name[j] for j in beside}))
        groups.setdefault((sig[i], int(c.rank[i]), company), []).append(int(i))
    rows: list[int] = []
    pred: list[float] = []
    for members in groups.values():
        members = [i for i in members if iso[i] > 0]  # a slowdown needs an isolated time
        if len(members) < 2:
            continue
        slow = c.dur[members] / iso[members]
        for j, i in enumerate(members):
            rows.append(i)
            pred.append(float(iso[i] * np.median(np.delete(slow, j))))
    order = np.argsort(rows, kind="stable")
    return np.array(rows, dtype=np.int64)[order], np.array(pred, dtype=float)[order]
