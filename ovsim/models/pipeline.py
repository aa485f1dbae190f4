"""Pipeline schedules: the order in which a stage runs its micro-batches' forward and backward
passes (GPipe, 1F1B, Megatron-LM's interleaved 1F1B), and the order of their exchanges."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Literal

from ovsim.errors import OvsimError

Item = tuple[Literal["F", "B"], int, int]  # (phase, micro-batch, model chunk)


def stage_order(pipeline: str, p: int, s: int, m: int, v: int) -> list[Item]:
    """The order in which stage ``s`` of ``p`` runs forward and backward passes of ``m``
    micro-batches (GPipe; 1F1B / PipeDream-Flush; Megatron-LM's interleaved 1F1B with ``v``
    chunks per stage, ``megatron/core/pipeline_parallel/schedules.py``)."""
    if pipeline == "gpipe" or p == 1:
        fwd: list[Item] = [("F", mb, 0) for mb in range(m)]
        bwd: list[Item] = [("B", mb, 0) for mb in range(m)]
        if pipeline == "gpipe":
            return fwd + bwd
        return [it for mb in range(m) for it in (fwd[mb], bwd[mb])]
    if pipeline == "1f1b":
        warm = min(p - s - 1, m)
        order: list[Item] = [("F", mb, 0) for mb in range(warm)]
        f, b = warm, 0
        while f < m:
            order.append(("F", f, 0))
            order.append(("B", b, 0))
            f += 1
            b += 1
        order += [("B", mb, 0) for mb in range(b, m)]
        return order
    total = m * v

    def chunk(k: int, forward: bool) -> int:
        c = (k // p) % v
        return c if forward else v - 1 - c

    def micro(k: int) -> int:
        return (k // (p * v)) * p + k % p

    warm = interleaved_warmup(p, s, m, v)
    order = [("F", micro(k), chunk(k, True)) for k in range(warm)]
    f, b = warm, 0
    while f < total:
        order.append(("F", micro(f), chunk(f, True)))
        order.append(("B", micro(b), chunk(b, False)))
        f += 1
        b += 1
    order += [("B", micro(k), chunk(k, False)) for k in range(b, total)]
    return order


def interleaved_warmup(p: int, s: int, m: int, v: int) -> int:
    """Forwards stage ``s`` runs before its first backward in Megatron-LM's interleaved 1F1B."""
    return min((p - s - 1) * 2 + (v - 1) * p, m * v)


def exchange_steps(pipeline: str, p: int, s: int, m: int, v: int) -> list[int]:
    """The step of each item of :func:`stage_order`, a step being the items Megatron-LM runs
    between two synchronized send/recv exchanges: one item each, but the interleaved schedule's
    steady state, which runs a forward and a backward and then exchanges with both neighbours at
    once (``send_forward_backward_recv_forward_backward``)."""
    n = len(stage_order(pipeline, p, s, m, v))
    if pipeline != "interleaved" or p == 1:
        return list(range(n))
    warm = interleaved_warmup(p, s, m, v)
    pairs = m * v - warm
    steps = list(range(warm))
    for i in range(pairs):
        steps += [warm + i, warm + i]
    return steps + list(range(warm + pairs, warm + pairs + (n - warm - 2 * pairs)))


def merge_stages(orders: list[list[Item]], p: int, v: int, b_cost: float) -> list[tuple[int, Item]]:
    """All stages' items in one order that respects every dependency: a list schedule with unit
    forward time, so that one stream per rank (the sequential schedule) and the per-pair send/recv
    streams never wait on something listed later."""
    n_virtual = p * v
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * p
    free = [0.0] * p
    out: list[tuple[int, Item]] = []
    heap: list[tuple[float, int]] = []

    def ready(s: int) -> float | None:
        if pos[s] >= len(orders[s]):
            return None
        ph, mb, c = orders[s][pos[s]]
        vs = c * p + s
        if ph == "F":
            need = [("F", mb, vs - 1)] if vs > 0 else []
        else:
            need = [("B", mb, vs + 1)] if vs < n_virtual - 1 else [("F", mb, vs)]
        t = free[s]
        for key in need:
            if key not in done:
                return None
            t = max(t, done[key])
        return t

    queued: set[int] = set()

    def enqueue(stages: Iterable[int]) -> None:
        for s in stages:
            if s not in queued:
                t = ready(s)
                if t is not None:
                    heapq.heappush(heap, (t, s))
                    queued.add(s)

    enqueue(range(p))
    while heap:
        t, s = heapq.heappop(heap)
        queued.discard(s)
        ph, mb, c = orders[s][pos[s]]
        end = t + (1.0 if ph == "F" else b_cost)
        vs = c * p + s
        done[(ph, mb, vs)] = end
        free[s] = end
        pos[s] += 1
        out.append((s, (ph, mb, c)))
        # Only this stage (its next item) and the stages of the items that wait for this one (the
        # next virtual stage's forward, the previous one's backward) can have become ready: a
        # stage's readiness reads its own place and clock and the items done. (Heap entries are
        # ordered by their values, so which are pushed first changes nothing.)
        enqueue((s, (vs + 1) % p, (vs - 1) % p))
    if any(pos[s] < len(orders[s]) for s in range(p)):
        raise OvsimError("the pipeline schedule deadlocks", field="parallel.pipeline")
    return out
