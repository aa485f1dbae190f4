"""The figures a replay reports: kernel-time errors of the overlapped kernels it scores, against
the naive prediction, and the communication left exposed, measured and predicted."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ovsim.metrics import RankOverlap, rank_overlap
from ovsim.replay_kernels import COMPUTE_KINDS, SIGNATURE_SPREAD
from ovsim.traces.table import TraceBundle


def mape_pct(pred: np.ndarray, meas: np.ndarray) -> float:
    ok = meas > 0
    return float(np.mean(np.abs(pred[ok] - meas[ok]) / meas[ok]) * 100) if ok.any() else math.nan


def weighted_error_pct(pred: np.ndarray, meas: np.ndarray) -> float:
    """100 x sum |pred - meas| / sum meas over the kernels mape_pct scores: long kernels weigh more."""
    ok = meas > 0
    total = float(meas[ok].sum())
    return float(np.abs(pred[ok] - meas[ok]).sum() / total * 100) if total > 0 else math.nan


def _comm_figures(ranks: list[RankOverlap], which: str) -> dict[str, float]:
    """Exposed communication summed over ranks, and HTA's hidden share over all ranks (overlapped
    time over communication time, both summed over ranks); NaN with no communication."""
    comm_s = sum(r.comm_busy_s for r in ranks)
    hidden_s = sum(r.overlapped_s for r in ranks)
    return {f"exposed_comm_{which}_s": comm_s - hidden_s,
            f"hidden_pct_{which}": hidden_s / comm_s * 100 if comm_s > 0 else math.nan}


def comm_summary(measured: pd.DataFrame, predicted: pd.DataFrame) -> dict[str, float]:
    """Communication not under compute, measured (the trace's kernel table) and predicted (the
    replay's timeline ops), by :func:`ovsim.metrics.rank_overlap` on each."""
    return {**_comm_figures(rank_overlap(measured), "measured"), **_comm_figures(rank_overlap(predicted), "predicted")}


def summarize(out: pd.DataFrame, bundle: TraceBundle, gpu_name: str) -> dict[str, Any]:
    sel = out["overlapped"] & out["isolated_source"].isin(["signature"])
    meas = out.loc[sel, "measured_duration_s"].to_numpy(float)
    pred = out.loc[sel, "predicted_duration_s"].to_numpy(float)
    naive = out.loc[sel, "isolated_s"].to_numpy(float)
    m_span = float((out["measured_start_s"] + out["measured_duration_s"]).max() - out["measured_start_s"].min())
    p_span = float((out["predicted_start_s"] + out["predicted_duration_s"]).max() - out["predicted_start_s"].min())
    return {
        "gpu": gpu_name,
        "ranks": int(out["rank"].nunique()),
        "kernels": len(out),
        "compute_kernels": int(out["kind"].isin(COMPUTE_KINDS).sum()),
        "collective_kernels": int((out["kind"] == "collective").sum()),
        # The rest by kind (copies, memsets, host gaps...), most first.
        "other_kernels": {str(k): int(v) for k, v in out.loc[~out["kind"].isin([*COMPUTE_KINDS, "collective"]),
                                                             "kind"].value_counts().items()},
        "overlapped_compute_kernels": int(out["overlapped"].sum()),
        "scored_kernels": int(sel.sum()),
        "unscored_no_isolated_source": int((out["overlapped"] & (out["isolated_source"] == "none")).sum()),
        "unscored_ambiguous_signature": int((out["overlapped"] & (out["isolated_source"] == "ambiguous")).sum()),
        # Scored kernels that ran faster than their clean instances by more than the spread the
        # signature is allowed: no contention does that, so they are most likely another problem
        # behind the same launch shape, and their error is the isolated time's, not the model's.
        "scored_faster_than_alone": int(np.sum(meas * SIGNATURE_SPREAD < naive)),
        "mape_pct": mape_pct(pred, meas),
        "naive_mape_pct": mape_pct(naive, meas),
        "weighted_error_pct": weighted_error_pct(pred, meas),
        "naive_weighted_error_pct": weighted_error_pct(naive, meas),
        "measured_span_s": m_span,
        "predicted_span_s": p_span,
        "span_error_pct": (p_span - m_span) / m_span * 100 if m_span > 0 else math.nan,
        "skipped": dict(bundle.skipped),
        "sources": {str(k): v for k, v in bundle.sources.items()},
    }
