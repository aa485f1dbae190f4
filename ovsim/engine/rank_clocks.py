"""Many ranks' ops' average clocks at once, for the analytic power-limit loop
(:mod:`ovsim.engine.power_analytic`): each op's average over its span of its rank's clock, set at
every control tick.

One rank at a time, each pass made a few numpy calls a rank (two ``np.interp`` among them): at
8,192 ranks of 24 ops their overhead was a fifth of the loop. Here ranks of few ops are read
together, by ``np.interp``'s own arithmetic, so every value is bit for bit the one a rank's own
arrays give (where numpy rounds np.interp's multiply and add apart, as on x86-64; its C code may
fuse them elsewhere: a last bit).
"""

from __future__ import annotations

import numpy as np


def interpolated(x: np.ndarray, x0: np.ndarray, x1: np.ndarray, f0: np.ndarray, f1: np.ndarray) -> np.ndarray:
    """``np.interp``'s value at ``x`` between its neighbours (``x0`` <= ``x`` < ``x1``, values
    ``f0`` and ``f1``), by its arithmetic: at a knot its value, else along the slope from the
    left, from the right where that is not a number. The caller sets the values outside the
    knots' range."""
    with np.errstate(divide="ignore", invalid="ignore"):  # rows the caller sets otherwise
        slope = (f1 - f0) / (x1 - x0)
        out = slope * (x - x0) + f0
        bad = np.isnan(out)
        if bad.any():
            out = np.where(bad, slope * (x - x1) + f1, out)
            out = np.where(np.isnan(out) & (f0 == f1), f0, out)
    result: np.ndarray = np.where(x0 == x, f0, out)
    return result


def average_clocks(c: np.ndarray, tick: float, edges: np.ndarray, rank: np.ndarray, start: np.ndarray,
                   end: np.ndarray) -> np.ndarray:
    """Each op's average clock over its span (``start`` to ``end``, on row ``rank`` of ``c``),
    where each rank's clock is ``c``'s row, a value for each control ``tick`` from ``edges``'
    first (an op of no duration: the clock of the tick it starts in)."""
    n_ticks = c.shape[1]
    c_cum = np.zeros((c.shape[0], n_ticks + 1))
    c_cum[:, 1:] = np.cumsum(c * tick, axis=1)
    # The tick each op starts in: its edge for the integral, and its clock if it lasts no time.
    first = np.searchsorted(edges, start, side="right") - 1
    at0 = _on_edges(start, first, edges, c_cum, rank)
    at1 = _on_edges(end, np.searchsorted(edges, end, side="right") - 1, edges, c_cum, rank)
    return _over_spans(at0, at1, start, end, c[rank, np.clip(first, 0, n_ticks - 1)])


def one_rank_clocks(c: np.ndarray, tick: float, edges: np.ndarray, start: np.ndarray, end: np.ndarray
                    ) -> np.ndarray:
    """:func:`average_clocks` of one rank's ops, its clock ``c`` (a value a tick), by
    ``np.interp``: the faster per op, for a rank of many."""
    c_cum = np.concatenate([[0.0], np.cumsum(c * tick)])
    at0, at1 = np.interp(start, edges, c_cum), np.interp(end, edges, c_cum)
    idx = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, len(c) - 1)
    return _over_spans(at0, at1, start, end, c[idx])


def _over_spans(at0: np.ndarray, at1: np.ndarray, start: np.ndarray, end: np.ndarray, at_start: np.ndarray
                ) -> np.ndarray:
    """Each op's average clock from the clock's integral at its start and end (``at0``, ``at1``);
    ``at_start``, the clock of the tick it starts in, for an op of no duration."""
    d = end - start
    lasting = d > 0
    out: np.ndarray = np.where(lasting, (at1 - at0) / np.where(lasting, d, 1.0), at_start)
    return out


def _on_edges(x: np.ndarray, j: np.ndarray, edges: np.ndarray, fp: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """``np.interp(x, edges, fp[rank])`` for each of ``x`` with its own row ``rank`` of ``fp``; ``j``,
    the edge at or left of each (``np.searchsorted(edges, x, side="right") - 1``)."""
    n = len(edges)
    jc = np.clip(j, 0, n - 2)
    out = interpolated(x, edges[jc], edges[jc + 1], fp[rank, jc], fp[rank, jc + 1])
    out = np.where(j >= n - 1, fp[rank, n - 1], out)
    result: np.ndarray = np.where(j < 0, fp[rank, 0], out)
    return result
