"""Shared channels: weighted max-min fair rates with per-activity demand caps.

Every bandwidth resource (HBM, each link direction, PCIe) is a channel with a capacity. An activity
(a kernel's HBM traffic, a collective, a copy) has a rate variable, a cap (what it would take alone),
a weight, and a coefficient per channel it uses (bytes of that channel per unit of its rate). The
solution is SimGrid's progressive filling: all unfrozen activities grow in proportion to their
weights until one hits its cap or a channel it uses is full, which freezes it; repeat. The result
is the weighted max-min fair allocation, and no channel is ever over-subscribed.

HBM is also a memory with a latency that grows with its load: :func:`latency_slowdowns` gives what
that costs each user, and the engine lowers their caps by it before sharing bandwidth
(docs/design.md, "HBM's loaded latency").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

# Relative slack when testing caps and saturation; rates are compared in their own scale.
_EPS = 1e-12

_INF = float("inf")

CAP = -1  # bottleneck marker: limited by its own cap, not by a channel


@dataclass(frozen=True)
class Allocation:
    rates: list[float]
    # Per activity: index of the channel that froze it, or CAP.
    bottleneck: list[int]


def max_min_rates(
    caps: Sequence[float],
    weights: Sequence[float],
    usage: Sequence[Sequence[tuple[int, float]]],
    capacity: Sequence[float],
) -> Allocation:
    """Weighted max-min fair rates. ``usage[a]`` lists (channel, bytes per unit of a's rate)."""
    n = len(caps)
    if len(weights) != n or len(usage) != n:
        raise ValueError(f"{n} caps, {len(weights)} weights and {len(usage)} usages: one each per activity")
    for w in weights:
        if not (0 < w < _INF):
            raise ValueError("activity weights must be positive and finite")
    # Fast path: when every channel can carry every activity at its cap, nobody is constrained.
    # (The engine solves every event with counters on, mostly here: plain loops, no generators.)
    load = [0.0] * len(capacity)
    for a in range(n):
        cap = caps[a]
        for r, c in usage[a]:
            load[r] += c * cap
    for r in range(len(load)):
        if not load[r] <= capacity[r] * (1 + 1e-9):
            break
    else:
        return Allocation(rates=list(caps), bottleneck=[CAP] * n)

    rates = [0.0] * n
    bottleneck = [CAP] * n
    remaining = list(capacity)
    active = [a for a in range(n) if caps[a] > 0 and weights[a] > 0]
    users: list[list[int]] = [[] for _ in capacity]
    for a in active:
        for r, c in usage[a]:
            if c > 0:
                users[r].append(a)
    frozen = [caps[a] <= 0 for a in range(n)]
    while active:
        growth = [0.0] * len(capacity)
        for a in active:
            for r, c in usage[a]:
                growth[r] += c * weights[a]
        step = float("inf")
        for r, g in enumerate(growth):
            if g > 0:
                step = min(step, max(0.0, remaining[r]) / g)
        for a in active:
            step = min(step, (caps[a] - rates[a]) / weights[a])
        for a in active:
            rates[a] += weights[a] * step
        for r, g in enumerate(growth):
            if g > 0:
                remaining[r] -= g * step
        newly: list[int] = []
        for a in active:
            if rates[a] >= caps[a] * (1 - _EPS):
                rates[a] = caps[a]
                newly.append(a)
        for r, g in enumerate(growth):
            if g > 0 and remaining[r] <= capacity[r] * 1e-12:
                for a in users[r]:
                    if not frozen[a] and a not in newly:
                        newly.append(a)
                        bottleneck[a] = r
        if not newly:
            # Numerical guard: a headroom below the float resolution (a subnormal cap over its
            # weight) made the step zero; that activity is at its cap.
            a_min = min(active, key=lambda a: (caps[a] - rates[a]) / weights[a])
            rates[a_min] = caps[a_min]
            newly.append(a_min)
        for a in newly:
            frozen[a] = True
        active = [a for a in active if not frozen[a]]
    return Allocation(rates=rates, bottleneck=bottleneck)


def one_channel_rate(caps: Sequence[float], weights: Sequence[float], capacity: float) -> float:
    """The rate of activity 0 in :func:`max_min_rates` when every activity uses one channel of
    ``capacity`` at one byte per unit of rate: weighted water-filling in closed form (activities in
    order of cap over weight each take their cap while it is below their weight times the level
    the rest would get). The fit of the contention parameters calls this millions of times."""
    if any(not (0 < w < float("inf")) for w in weights):
        raise ValueError("activity weights must be positive and finite")
    if caps[0] <= 0:
        return 0.0
    if sum(caps) <= capacity * (1 + 1e-9):
        return float(caps[0])
    left = capacity
    weight_left = sum(w for c, w in zip(caps, weights, strict=True) if c > 0)
    for a in sorted((a for a in range(len(caps)) if caps[a] > 0), key=lambda a: caps[a] / weights[a]):
        if caps[a] > weights[a] * left / weight_left * (1 + _EPS):
            break
        if a == 0:
            return float(caps[0])
        left -= caps[a]
        weight_left -= weights[a]
    return weights[0] * max(0.0, left) / weight_left


def water_fill(demands: Sequence[float], counts: Sequence[int], capacity: float) -> list[float]:
    """Share of one SM's issue throughput per block: each block of entry e asks demands[e], there are
    counts[e] of them; max-min fair with the demands as caps."""
    if len(counts) != len(demands):
        raise ValueError(f"{len(demands)} demands and {len(counts)} counts: one each per entry")
    total = 0.0
    for e in range(len(demands)):
        total += demands[e] * counts[e]
    if total <= capacity:
        return list(demands)
    order = sorted(range(len(demands)), key=lambda e: demands[e])
    left = capacity
    blocks_left = sum(counts)
    share = [0.0] * len(demands)
    level = 0.0
    for e in order:
        level = left / blocks_left if blocks_left else 0.0
        if demands[e] <= level:
            share[e] = demands[e]
            left -= demands[e] * counts[e]
            blocks_left -= counts[e]
        else:
            break
    level = left / blocks_left if blocks_left else 0.0
    for e in order:
        if share[e] == 0.0:
            share[e] = min(demands[e], level)
    return share


def latency_slowdowns(utilization: Sequence[float], waiting: Sequence[float], capacity: float,
                      exponent: float) -> tuple[list[float], float]:
    """Slowdowns of HBM users that share one memory system, by its loaded latency.

    A user moves ``utilization[i]`` of the HBM peak alone and spends ``waiting[i]`` of its time
    alone waiting on memory (the rest is issue, math or work that hides latency). HBM's latency
    grows with the total utilization ``U`` as ``(1 - U / capacity) ** -exponent``; a user's time
    waiting grows with it from what it saw alone, so its slowdown is
    ``(1 - waiting) + waiting * g(U) / g(own utilization)``, and ``U`` is what every user then moves
    (a fixed point: Little's law for a closed queue). Returns (slowdown per user, ``U``).

    Why: measured on H100 and H200 (calibration/data, overlap part), a layer norm moving 57% of the
    peak slows 1.1-1.4x beside copy loops moving 10-42% of it, with the two together far below the
    peak, and a streaming add that alone moves 92% of the peak keeps most of the bandwidth while
    the copy loops beside it slow 3-5x; a fair share of bandwidth gives neither."""
    slow, u = _latency_solved(tuple(utilization), tuple(waiting), capacity, exponent)
    return list(slow), u


def clear_solutions() -> None:
    """Forget the latencies solved so far (a benchmark starts each search from none)."""
    _latency_solved.cache_clear()


@functools.lru_cache(maxsize=8192)
def _latency_solved(utilization: tuple[float, ...], waiting: tuple[float, ...], capacity: float,
                    exponent: float) -> tuple[tuple[float, ...], float]:
    # Cached: an iteration's kernels meet the same neighbours again and again (repeated layers).
    n = len(utilization)
    if n < 2 or all(w <= 0 for w in waiting):
        return (1.0,) * n, float(sum(utilization))
    top = capacity * (1 - 1e-9)
    x = [u if u < top else top for u in utilization]
    inv_k = 1.0 / capacity

    def log_g(u: float) -> float:
        return -exponent * math.log1p(-(u if u < top else top) * inv_k)

    alone = [log_g(u) for u in x]

    def slow(u: float) -> list[float]:
        lg = log_g(u)
        return [(1.0 - w) + w * math.exp(lg - a) for w, a in zip(waiting, alone, strict=True)]

    def excess(u: float) -> float:
        return u - sum(xi / s for xi, s in zip(x, slow(u), strict=True))

    # excess rises with u (each user's share falls as latency grows) from <= 0 at the largest
    # user: its root by the Illinois method (regula falsi that halves a stale end), on a bracket.
    lo, hi = max(x), min(top, float(sum(x)))
    if hi <= lo:
        return tuple(slow(lo)), lo
    f_lo, f_hi = excess(lo), excess(hi)
    if f_lo >= 0:
        return tuple(slow(lo)), lo
    if f_hi <= 0:
        return tuple(slow(hi)), hi
    mid, side = lo, 0
    for _ in range(200):
        mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        f = excess(mid)
        if f > 0:
            hi, f_hi = mid, f
            if side == 1:
                f_lo *= 0.5
            side = 1
        else:
            lo, f_lo = mid, f
            if side == -1:
                f_hi *= 0.5
            side = -1
        if hi - lo < 1e-13 or abs(f) < 1e-15:
            break
    u = mid
    return tuple(slow(u)), u
