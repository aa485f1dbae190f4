"""Many ranks' ops' average clocks read together (engine.rank_clocks) against each rank's own
with np.interp, as the analytic power loop reads a rank of many ops: random ranks of 1 to 200
ops in one call, with tied and zero-length ops, -0.0, ops ending before the repeat, and a tick
or a hundred."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from ovsim.engine.rank_clocks import average_clocks

# np.interp's arithmetic is matched bit for bit where numpy rounds a multiply and an add apart
# (x86-64); elsewhere its C code may fuse them: a last bit.
EXACT = platform.machine().lower() in {"x86_64", "amd64"}


def _rank(rng: np.random.Generator, span: float, style: str) -> tuple[np.ndarray, np.ndarray]:
    n = int(rng.choice([1, 2, 3, 20, 200]))
    if style == "tied":  # on the ticks' grid: ties with the edges, and -0.0
        grid = rng.integers(0, 6, size=(n, 2)) * (span / 5)
        start, end = grid.min(1), grid.max(1)
        start = np.where(start == 0, rng.choice([0.0, -0.0], n), start)
    elif style == "instant":
        start = rng.uniform(0, span, n)
        end = start.copy()
    else:
        start = rng.uniform(0, span, n)
        end = np.minimum(start + rng.exponential(span / 10, n), span * rng.choice([1.0, 0.5], n))
        start = np.minimum(start, end)
    return start, end


@pytest.mark.parametrize("seed", range(4))
def test_ranks_read_together_get_each_ranks_own_average_clocks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(60):
        span = float(rng.choice([1.0, 3e-3, 1e4]))
        ranks = [_rank(rng, span, str(rng.choice(["tied", "instant", "random"])))
                 for _ in range(int(rng.choice([2, 7, 50])))]
        tick = float(rng.choice([span / 5, span / 100, span * 2]))
        ticks = np.arange(0.0, span + tick, tick)
        edges = np.append(ticks, ticks[-1] + tick)
        c = rng.uniform(0.5, 1.0, size=(len(ranks), len(ticks)))
        rank = np.repeat(np.arange(len(ranks)), [len(s) for s, _ in ranks])
        got = average_clocks(c, tick, edges, rank, np.concatenate([s for s, _ in ranks]),
                             np.concatenate([e for _, e in ranks]))
        expected = []
        for k, (s, e) in enumerate(ranks):
            c_cum = np.concatenate([[0.0], np.cumsum(c[k] * tick)])
            d = e - s
            expected.append(np.where(d > 0, (np.interp(e, edges, c_cum) - np.interp(s, edges, c_cum))
                                     / np.where(d > 0, d, 1.0),
                                     c[k][np.clip(np.searchsorted(edges, s, side="right") - 1, 0, len(ticks) - 1)]))
        if EXACT:
            assert np.array_equal(got.view(np.int64), np.concatenate(expected).view(np.int64))
        else:
            np.testing.assert_allclose(got, np.concatenate(expected), rtol=1e-12)
