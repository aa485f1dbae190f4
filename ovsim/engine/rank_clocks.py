"""Many ranks' step functions integrated at once, for the analytic power-limit loop
(:mod:`ovsim.engine.power_analytic`): each rank's ops' terms summed as steps over one repeat of
a workload, their integrals, and those read at times every rank shares.

One rank at a time, the loop made some forty numpy calls a rank in each pass: at 8,192 ranks
their overhead was most of the loop. Here a batch of ranks is laid out as rows of arrays padded
at the end, each row sorted, summed and interpolated by itself with ``np.interp``'s own
arithmetic, so every value is bit for bit the one a rank's own arrays give.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankSteps:
    """A batch of ranks' terms as steps over one repeat: ``times``, each rank's step times
    ascending (a row each, padded with +inf after its ``length`` real ones), and ``cum``, each
    term's integral from 0 to each of them (rows, times, terms)."""

    times: np.ndarray
    cum: np.ndarray
    length: np.ndarray


def rank_steps(x: np.ndarray, start: np.ndarray, end: np.ndarray, counts: np.ndarray, span: float) -> RankSteps:
    """The steps of ops' terms ``x`` (a row per op, running from ``start`` to ``end``), the ops
    listed rank by rank, ``counts`` of them each, over one repeat of length ``span``: for each
    rank its ops' starts, then their ends, then 0 and ``span`` (in that order, which breaks the
    stable sort's ties as one rank's own arrays would)."""
    n_ranks, n_terms = len(counts), x.shape[1]
    length = 2 * counts + 2
    width = int(length.max()) if n_ranks else 0
    rank = np.repeat(np.arange(n_ranks), counts)
    first = np.cumsum(counts) - counts
    at = np.arange(len(rank)) - np.repeat(first, counts)
    ends_at = at + np.repeat(counts, counts)
    times = np.full((n_ranks, width), np.inf)
    times[rank, at], times[rank, ends_at] = start, end
    every = np.arange(n_ranks)
    times[every, 2 * counts], times[every, 2 * counts + 1] = 0.0, span
    steps = np.zeros((n_ranks, width, n_terms))
    steps[rank, at], steps[rank, ends_at] = x, -x
    order = np.argsort(times, axis=1, kind="stable")
    times = np.take_along_axis(times, order, axis=1)
    rate = np.cumsum(np.take_along_axis(steps, order[:, :, None], axis=1), axis=1)
    cum = np.zeros((n_ranks, width, n_terms))
    with np.errstate(invalid="ignore"):  # the padding's inf - inf: past every rank's real steps
        cum[:, 1:] = np.cumsum(rate[:, :-1] * np.diff(times, axis=1)[:, :, None], axis=1)
    return RankSteps(times=times, cum=cum, length=length)


def periodic_integrals(steps: RankSteps, t: np.ndarray, span: float, idle_before: bool = False) -> np.ndarray:
    """Each rank's integral from 0 to each of ``t`` (negative: back into earlier repeats, or into
    idleness with ``idle_before``) of its terms (ranks, times, terms)."""
    if idle_before:
        t = np.maximum(t, 0.0)
    q = np.floor(t / span)
    rest = t - q * span
    n_ranks = steps.times.shape[0]
    j = _row_search(steps.times, rest)
    jc = np.clip(j, 0, steps.length[:, None] - 2)
    x0, x1 = np.take_along_axis(steps.times, jc, axis=1), np.take_along_axis(steps.times, jc + 1, axis=1)
    f0 = np.take_along_axis(steps.cum, jc[:, :, None], axis=1)
    f1 = np.take_along_axis(steps.cum, jc[:, :, None] + 1, axis=1)
    final = steps.cum[np.arange(n_ranks), steps.length - 1]
    x = np.broadcast_to(rest, j.shape)
    inside = interpolated(x[:, :, None], x0[:, :, None], x1[:, :, None], f0, f1)
    inside = np.where((j >= steps.length[:, None] - 1)[:, :, None], final[:, None, :], inside)
    inside = np.where((j < 0)[:, :, None], steps.cum[:, :1, :], inside)
    out: np.ndarray = q[None, :, None] * final[:, None, :] + inside
    return out


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


def _row_search(times: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For each row of ``times`` (each ascending) and each of ``x``: the last index whose time is
    at most it, -1 where none is (``np.searchsorted(row, x, "right") - 1``, row by row). Times
    are compared by their order among all the values, so rows stack into one sorted key."""
    n_rows, width = times.shape
    values = np.unique(np.concatenate([times.ravel(), x]))
    stride = len(values) + 1
    base = np.arange(n_rows, dtype=np.int64)[:, None] * stride
    keys = (base + np.searchsorted(values, times)).ravel()
    found = np.searchsorted(keys, (base + np.searchsorted(values, x)[None, :]).ravel(), side="right")
    out: np.ndarray = found.reshape(n_rows, len(x)) - 1 - np.arange(n_rows)[:, None] * width
    return out


def average_clocks(c: np.ndarray, tick: float, edges: np.ndarray, rank: np.ndarray, start: np.ndarray,
                   end: np.ndarray) -> np.ndarray:
    """Each op's average clock over its span (``start`` to ``end``, on row ``rank`` of ``c``),
    where each rank's clock is ``c``'s row, a value for each control ``tick`` from ``edges``'
    first (an op of no duration: the clock of the tick it starts in)."""
    n_ticks = c.shape[1]
    c_cum = np.zeros((c.shape[0], n_ticks + 1))
    c_cum[:, 1:] = np.cumsum(c * tick, axis=1)
    at0, at1 = _on_edges(start, edges, c_cum, rank), _on_edges(end, edges, c_cum, rank)
    idx = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, n_ticks - 1)
    d = end - start
    lasting = d > 0
    out: np.ndarray = np.where(lasting, (at1 - at0) / np.where(lasting, d, 1.0), c[rank, idx])
    return out


def _on_edges(x: np.ndarray, edges: np.ndarray, fp: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """``np.interp(x, edges, fp[rank])`` for each of ``x`` with its own row ``rank`` of ``fp``."""
    n = len(edges)
    j = np.searchsorted(edges, x, side="right") - 1
    jc = np.clip(j, 0, n - 2)
    out = interpolated(x, edges[jc], edges[jc + 1], fp[rank, jc], fp[rank, jc + 1])
    out = np.where(j >= n - 1, fp[rank, n - 1], out)
    result: np.ndarray = np.where(j < 0, fp[rank, 0], out)
    return result
