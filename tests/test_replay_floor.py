"""The model-free figures of a trace (ovsim.replay_floor) on a table worked by hand, and the
time-weighted bar a held-out replay is held to."""

from __future__ import annotations

import pytest

from ovsim.replay_floor import Floor, floor
from ovsim.traces.table import make_table
from ovsim.validate.traces import _weighted_bar

US = 1e-6
AR = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _table() -> object:
    """Kernel A: clean 9, 10, 11 us (isolated 10), then 12, 14, 16 us beside an all-reduce.
    Kernel B: clean 20, 20, 20 us, then 20 us beside one: no other overlapped instance."""
    rows: list[tuple[int, str, float, float]] = []  # stream, name, start (us), duration (us)
    t = 0.0
    for name, d in (("A", 9), ("A", 10), ("A", 11), ("B", 20), ("B", 20), ("B", 20)):
        rows.append((7, name, t, d))
        t += 100
    for name, d in (("A", 12), ("A", 14), ("A", 16), ("B", 20)):
        rows.append((20, AR, t - 1, d + 2))  # covers the kernel
        rows.append((7, name, t, d))
        t += 100
    kernel = {"A": "vectorized_elementwise_kernel", "B": "reduce_kernel"}
    return make_table({
        "rank": [0] * len(rows), "stream": [s for s, *_ in rows],
        "name": [kernel.get(n, n) for _, n, _, _ in rows], "start_s": [t0 * US for *_, t0, _ in rows],
        "duration_s": [d * US for *_, d in rows], "grid_x": [4] * len(rows), "block_x": [128] * len(rows),
        "host_op": ["aten::op"] * len(rows),
        "collective": ["all_reduce" if n == AR else "" for _, n, _, _ in rows]}, "hand")


def test_floor_figures_match_the_hand_worked_table() -> None:
    f = floor(_table())  # type: ignore[arg-type]
    assert f.scored == 4
    # Naive: A at 10 against 12, 14, 16; B at 20 against 20.
    assert f.naive_mape_pct == pytest.approx((2 / 12 + 4 / 14 + 6 / 16 + 0) / 4 * 100)
    assert f.naive_weighted_pct == pytest.approx(12 / 62 * 100)
    assert f.best_constant_mape_pct <= f.naive_mape_pct
    # Clean spread: 9 against median(10, 11), 10 against median(9, 11), 11 against median(9, 10);
    # B's three clean instances agree.
    assert f.clean_spread_pct == pytest.approx((1.5 / 9 + 0 + 1.5 / 11 + 0 + 0 + 0) / 6 * 100)
    # Repeat: A's slowdowns 1.2, 1.4, 1.6, each predicted by the median of the other two
    # (1.5, 1.4, 1.3): 15, 14 and 13 us against 12, 14, 16. B has no repeat.
    assert f.repeated == 3
    assert f.repeated_time_share == pytest.approx(42 / 62)
    assert f.repeat_weighted_pct == pytest.approx(6 / 42 * 100)
    assert f.repeat_naive_weighted_pct == pytest.approx(12 / 42 * 100)
    assert f.repeat_mape_pct == pytest.approx((3 / 12 + 0 + 3 / 16) / 3 * 100)
    assert f.repeat_naive_mape_pct == pytest.approx((2 / 12 + 4 / 14 + 6 / 16) / 3 * 100)


def _floor(naive_weighted: float, clean_spread: float) -> Floor:
    nan = float("nan")
    return Floor(1, nan, naive_weighted, nan, clean_spread, 0, nan, nan, nan, nan, nan)


def test_weighted_bar_halves_naive_only_on_a100_traces_above_the_clean_spread() -> None:
    bar, why = _weighted_bar(_floor(24.0, 4.0), "a100-sxm4-80gb")
    assert bar == 12.0 and why.startswith("half of naive")
    bar, why = _weighted_bar(_floor(6.0, 10.0), "a100-sxm4-80gb")
    assert bar == 6.0 and why.startswith("naive (naive within")
    bar, why = _weighted_bar(_floor(24.0, 4.0), "v100-sxm2")
    assert bar == 24.0 and why == "naive (not an A100 trace)"


def test_weighted_bar_without_a_clean_spread_is_naive() -> None:
    bar, why = _weighted_bar(_floor(24.0, float("nan")), "a100-sxm4-40gb")
    assert bar == 24.0 and "no clean spread" in why
