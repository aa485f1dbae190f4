"""The overhead fit: the fixed time every kernel takes, from tiny kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ovsim.calibrate.inputs import TraceInput
from ovsim.calibrate.memory import _memory_kernels
from ovsim.errors import OvsimError
from ovsim.hw.spec import load_gpu

# A memory-bound kernel times the fixed per-kernel cost when its bytes would stream in at most this
# long at the peak HBM bandwidth: a few percent of the 1.5-4 us such kernels take on the shared
# traces, and below the 1 us resolution some of them record.
OVERHEAD_MAX_BODY_S = 0.1e-6
OVERHEAD_MIN_POINTS = 10


def overhead_points(traces: Sequence[TraceInput]) -> tuple[dict[str, list[tuple[float, str]]], dict[str, int]]:
    """Per trace label, the kernels :func:`fit_overhead` looks at as (measured s, class):
    memory-bound kernels that timed one operator call alone and whose bytes take at most
    ``OVERHEAD_MAX_BODY_S`` at the peak HBM bandwidth; and how many were left out, by reason."""
    points: dict[str, list[tuple[float, str]]] = {}
    left: dict[str, int] = {}
    for tr in traces:
        max_bytes = OVERHEAD_MAX_BODY_S * load_gpu(tr.gpu).memory.bandwidth_bytes_per_s
        kept, why = _memory_kernels(tr)
        for k, n in why.items():
            left[k] = left.get(k, 0) + n
        for dur_s, t in kept:
            if t.bytes > max_bytes:
                k = f"takes more than {OVERHEAD_MAX_BODY_S * 1e6:g} us at the peak HBM bandwidth"
                left[k] = left.get(k, 0) + 1
            else:
                points.setdefault(tr.label, []).append((dur_s, t.op_class))
    return points, left


# Share of the durations cut from each end of the trimmed mean used for whole-microsecond data.
OVERHEAD_TRIM = 0.1


def whole_microseconds(t_s: np.ndarray) -> bool:
    """Whether durations were recorded in whole microseconds (Kineto traces of older PyTorch)."""
    return bool(np.allclose(t_s * 1e6, np.round(t_s * 1e6), rtol=0.0, atol=1e-6))


def least_mape_constant(t_s: np.ndarray) -> float:
    """The constant with the least mean absolute relative error to ``t_s``: their median weighted
    by 1 / t."""
    order = np.argsort(t_s)
    t, w = t_s[order], 1.0 / t_s[order]
    cum = np.cumsum(w)
    return float(t[np.searchsorted(cum, 0.5 * cum[-1])])


def overhead_estimate(t_s: np.ndarray) -> float:
    """The constant time that best stands for ``t_s``. Sub-microsecond durations: the one of least
    mean absolute relative error (:func:`least_mape_constant`). Whole-microsecond durations: a
    median would sit on a whole microsecond (kernels of about 3.5 us record as 3 or 4 about equally
    often), while end minus start, each cut to the microsecond, is unbiased on average; so their
    mean, trimmed by ``OVERHEAD_TRIM`` at each end against stray slow kernels."""
    from scipy.stats import trim_mean

    if whole_microseconds(t_s):
        return float(trim_mean(t_s, OVERHEAD_TRIM))
    return least_mape_constant(t_s)


def fit_overhead(traces: Sequence[TraceInput]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``kernel_overhead_s``, the fixed time the cost model adds to every kernel (launch of the
    grid, prologue, epilogue, the tail of the last wave), from the kernels that do nothing else:
    elementwise kernels whose bytes would stream in at most ``OVERHEAD_MAX_BODY_S`` at the peak
    HBM bandwidth (:func:`overhead_points`). The cost model prices such a kernel at the overhead
    alone; the fit is :func:`overhead_estimate` of their durations, every kernel of every trace
    weighted alike. Tiny copies, norms and softmaxes take longer (strided indexing, reductions) and
    are recorded beside it, not fitted."""
    points, left = overhead_points(traces)
    t_s = np.array([t for pts in points.values() for t, _ in pts])
    classes = np.array([c for pts in points.values() for _, c in pts])
    use = t_s[classes == "elementwise"]
    if len(use) < OVERHEAD_MIN_POINTS:
        raise OvsimError(f"{len(use)} elementwise kernels small enough to time the per-kernel overhead (at most "
                         f"{OVERHEAD_MAX_BODY_S * 1e6:g} us of traffic at the peak HBM bandwidth, alone, one per "
                         f"operator call with recorded input shapes and types); {OVERHEAD_MIN_POINTS} are needed",
                         field="overhead")
    overhead = round(overhead_estimate(use), 9)
    whole_us = whole_microseconds(use)
    record: dict[str, Any] = {
        "method": (f"mean trimmed by {OVERHEAD_TRIM:g} at each end (durations in whole microseconds)" if whole_us else
                   "median weighted by 1 / duration (the constant of least mean absolute relative error)")
                  + " of the durations of elementwise kernels whose traffic takes at most "
                  f"{OVERHEAD_MAX_BODY_S * 1e6:g} us at the peak HBM bandwidth, alone, one per operator call",
        "points": len(use),
        "points_per_trace": {k: sum(c == "elementwise" for _, c in v) for k, v in sorted(points.items())},
        "left_out": dict(sorted(left.items())),
        "p10_p90_us": [round(float(np.percentile(use, q)) * 1e6, 3) for q in (10, 90)],
        "fit_mape_pct": round(float(np.mean(np.abs(overhead - use) / use)) * 100, 2),
        "median_us_other_classes": {str(c): {"kernels": int(np.sum(classes == c)),
                                             "median_us": round(float(np.median(t_s[classes == c])) * 1e6, 3)}
                                    for c in sorted(set(classes.tolist()) - {"elementwise"})},
        "note": "fit error (on the traces fitted), not prediction error; held-out figures come from `ovsim validate`",
    }
    return {"kernel_overhead_s": overhead}, record
