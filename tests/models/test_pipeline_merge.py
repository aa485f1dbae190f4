"""The pipeline stages' items merged into one order (ovsim.models.pipeline.merge_stages): the list
schedule it computes, checked against a plain one written here, which looks at every stage after
every item (merge_stages looks only at the stages an item can make ready)."""

from __future__ import annotations

import itertools

import pytest

from ovsim.errors import OvsimError
from ovsim.models.pipeline import Item, merge_stages, stage_order


def _plain_list_schedule(orders: list[list[Item]], p: int, v: int, b_cost: float) -> list[tuple[int, Item]]:
    """Each stage runs its items in its order, a forward in 1 and a backward in ``b_cost``, each
    once what it waits for has run (the previous virtual stage's forward; the next one's
    backward, or the last virtual stage's own forward); of the stages ready, the earliest, then
    the lowest stage, goes first."""
    done: dict[tuple[str, int, int], float] = {}
    pos, free, out = [0] * p, [0.0] * p, []
    while True:
        ready = []
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            ph, mb, c = orders[s][pos[s]]
            vs = c * p + s
            need = ((("F", mb, vs - 1),) if vs > 0 else ()) if ph == "F" else (
                (("B", mb, vs + 1),) if vs < p * v - 1 else (("F", mb, vs),))
            if all(k in done for k in need):
                ready.append((max([free[s], *(done[k] for k in need)]), s))
        if not ready:
            break
        t, s = min(ready)
        ph, mb, c = orders[s][pos[s]]
        done[(ph, mb, c * p + s)] = free[s] = t + (1.0 if ph == "F" else b_cost)
        pos[s] += 1
        out.append((s, (ph, mb, c)))
    return out


CASES = [(pipe, p, v, m, b) for pipe in ("1f1b", "interleaved", "gpipe")
         for p, v, m, b in itertools.product([1, 2, 3, 4, 8], [1, 2, 4], [1, 2, 5, 8, 16], [2.0, 3.0])
         if (pipe == "interleaved" and p > 1) or v == 1]


@pytest.mark.parametrize(("pipe", "p", "v", "m", "b_cost"), CASES)
def test_the_merge_is_the_plain_list_schedule(pipe: str, p: int, v: int, m: int, b_cost: float) -> None:
    try:
        orders = [stage_order(pipe, p, s, m, v) for s in range(p)]
    except OvsimError:
        pytest.skip("not a schedule of this layout")
    expected = _plain_list_schedule(orders, p, v, b_cost)
    if len(expected) < sum(map(len, orders)):  # an order no schedule finishes (a layout refused earlier)
        with pytest.raises(OvsimError, match="deadlocks"):
            merge_stages(orders, p, v, b_cost)
        return
    assert merge_stages(orders, p, v, b_cost) == expected


def test_a_schedule_that_cannot_finish_is_refused() -> None:
    # Stage 0 runs micro-batch 0's backward first: it waits for stage 1's, which waits for its forward.
    orders: list[list[Item]] = [[("B", 0, 0), ("F", 0, 0)], [("F", 0, 0), ("B", 0, 0)]]
    with pytest.raises(OvsimError, match="deadlocks"):
        merge_stages(orders, 2, 1, 2.0)
