"""Shared channels: weighted max-min fair rates with per-activity demand caps.

Every bandwidth resource (HBM, each link direction, PCIe) is a channel with a capacity. An activity
(a kernel's HBM traffic, a collective, a copy) has a rate variable, a cap (what it would take alone),
a weight, and a coefficient per channel it uses (bytes of that channel per unit of its rate). The
solution is SimGrid's progressive filling: all unfrozen activities grow in proportion to their
weights until one hits its cap or a channel it uses is full, which freezes it; repeat. The result
is the weighted max-min fair allocation, and no channel is ever over-subscribed.
"""

from __future__ import annotations

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
    for w in weights:
        if not (0 < w < _INF):
            raise ValueError("activity weights must be positive and finite")
    # Fast path: when every channel can carry every activity at its cap, nobody is constrained.
    # (The engine solves every event with counters on, mostly here: plain loops, no generators.)
    load = [0.0] * len(capacity)
    for use, cap in zip(usage, caps, strict=True):
        for r, c in use:
            load[r] += c * cap
    for used, cap in zip(load, capacity, strict=True):
        if not used <= cap * (1 + 1e-9):
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
    total = sum(d * c for d, c in zip(demands, counts, strict=True))
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
