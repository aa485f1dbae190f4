"""An event's GPUs solved alone beside the collectives that couple them to others.

A collective moving data couples every GPU it spans: its rate is shared with the kernels on each
of their HBMs and on its links. When an event changes some of those GPUs (the fresh ones), sharing
the channels of all of them again to learn whether the collective's rate moved costs, at 64 ranks
of one all-reduce, 64 HBMs at each of the ranks' events: a cost that grows with the square of the
rank count.

The weighted max-min allocation is unique, so a local argument can decide it instead. Hold every
flow through the fresh GPUs at its rate (each spans GPUs outside them), share each fresh HBM among
its kernels and collective pressure in what the flows leave of it, and keep the result where:

- each flow's cap is what it was: the same SM share of its slowest member (its members' issued
  blocks), and the same loaded-latency slowdown, the largest over its GPUs (each other GPU's as
  the last solve left it, the fresh ones' from their new state);
- no fresh HBM froze the flow at the last solve (``FlowState.bottleneck_hbm``): a link, its cap or
  an HBM the event did not change did, and still does, since no flow has started or stopped moving
  since that solve (``FlowState.moving_at``): a link's users are flows;
- on a fresh HBM that fills, no kernel or pressure frozen there stands below the flow's level (its
  rate over its weight), which max-min fairness would make the flow give way to.

Then every flow keeps its rate, every user of a fresh HBM meets max-min's conditions, and the
GPUs outside are left exactly as they were. Anything else (a flow within the fresh GPUs,
registered kernel resources, a condition that fails) is refused, and the caller solves as before.
The fresh GPUs' rates are those of a full solve to round-off: their filling is summed in another
order. (docs/design.md, "Events and streams".)
"""

from __future__ import annotations

from typing import Any

from ovsim.engine.channel import CAP, max_min_rates
from ovsim.engine.rates import ChannelLoads, RateSolver, channel_index, flow_weight, slowed, sm_factor
from ovsim.engine.state import FlowState, KernelState

# Relative slack of the fairness test: a kernel's level this close to a flow's is a tie, which
# the full solve would break by round-off either way.
_TIE = 1e-9

_User = tuple[float, float, KernelState | None]  # (cap, weight, kernel or None for pressure)


def sm_factor_kept(f: FlowState, fresh: dict[int, None]) -> bool:
    """Whether the flow's SM share (RateSolver.sm_factor) is what it was, its members on the fresh
    GPUs newly rated: none of them below it, and the member that set it elsewhere."""
    if f.demand.uses_copy_engine:
        return True
    for r in fresh:
        m = f.members.get(r)
        if m is not None and m.kernel is not None and m.kernel.full_issue_blocks / m.kernel.blocks < f.sm_factor:
            return False
    if f.sm_lowest not in fresh:
        return True
    factor, lowest = sm_factor(f)
    if factor != f.sm_factor:
        return False
    f.sm_lowest = lowest
    return True


def solve_local(solver: RateSolver, fresh: dict[int, None]) -> tuple[bool, ChannelLoads | None]:
    """Solve the GPUs in ``fresh`` beside the flows that couple them to others, held at their
    rates. Returns (True, the fresh GPUs' channel loads where the solver keeps them) where the
    argument above holds, else (False, None) with the flows and the other GPUs untouched (the
    fresh GPUs' SM rates set, which a full solve sets again)."""
    if solver.resources:
        return False, None
    gpus = solver.gpus
    ranks = sorted(fresh)
    flows = solver.moving_flows(ranks)
    for f in flows:
        if f.bottleneck_hbm in fresh or f.moving_at != solver.moving_at or all(q in fresh for q in f.ranks):
            return False, None
    demands = [(r, solver.own_demand(solver.share_sms(gpus[r]))) for r in ranks]
    for f in flows:
        if not sm_factor_kept(f, fresh):
            return False, None
    pressure = solver.resident_pressure(ranks) if solver.has_pressure else []
    asked_alone: dict[KernelState, float] = {}
    slow_at: dict[int, dict[int, float]] = {}
    if solver.latency_law:
        slowed = _latency(solver, fresh, demands, flows, pressure, asked_alone)
        if slowed is None:
            return False, None
        slow_at = slowed
    shared: list[_Shared] = []
    for r, demand in demands:
        one = _share(solver, r, demand, flows, pressure)
        if one is None:
            return False, None
        shared.append(one)
    # Accepted: the fresh GPUs' kernels take their shares, the flows keep their rates.
    for f in flows:
        new = slow_at.get(id(f), {})
        largest = f.latency_slow
        for r in ranks:
            s = new.get(r)
            if f.slow_at.get(r) == largest:
                f.slow_at_largest -= 1
            if s is None:
                f.slow_at.pop(r, None)
            else:
                f.slow_at[r] = s
                if s == largest:
                    f.slow_at_largest += 1
    for one in shared:
        for i in range(len(one.users)):
            cap, _, k = one.users[i]
            x = one.rates[i]
            if k is not None:
                full = asked_alone.get(k, cap)
                k.hbm_pace_share = (x / full if full > 0 else 1.0) * k.hbm_pace_share_alone
    if not solver.keep_loads and not solver.check_invariants:
        return True, None
    loads = _loads(solver, ranks, flows, shared)
    if solver.check_invariants:
        solver.check_loads(ranks, loads.capacity, loads.rates, loads.usage)
    return True, loads if solver.keep_loads else None


class _Shared:
    """One fresh HBM shared: its capacity, its users (cap, weight, kernel or None for a
    collective's pressure) and their rates."""

    __slots__ = ("capacity", "rank", "rates", "users")

    def __init__(self, rank: int, capacity: float, users: list[_User], rates: list[float]) -> None:
        self.rank = rank
        self.capacity = capacity
        self.users = users
        self.rates = rates


def _share(solver: RateSolver, r: int, demand: dict[KernelState, float], flows: list[FlowState],
           pressure: list[tuple[int, float, float]]) -> _Shared | None:
    """Share GPU ``r``'s HBM among its kernels and collective pressure in what the flows through it
    leave; None where that is not max-min fair beside them (a user frozen by the HBM below a flow's
    level) or the flows alone overfill it."""
    capacity = solver.gpus[r].model.hbm_bytes_per_s
    users: list[_User] = [(asked, 1.0, k) for k, asked in demand.items()]
    has_flow = False
    for pr, share, weight in pressure:
        if pr == r:
            has_flow = True
            users.append((share * capacity, weight, None))
    fixed = 0.0
    through: list[FlowState] = []
    for f in flows:
        c = f.hbm_at.get(r, 0.0)
        if c > 0:
            has_flow = True
            fixed += f.rate * c
            through.append(f)
    if demand and has_flow:
        capacity *= solver.machine.hbm_mix_efficiency
    left = capacity - fixed
    if left < 0.0:
        if left < -capacity * 1e-9:
            return None
        left = 0.0
    if not users:
        return _Shared(r, capacity, users, [])
    if sum(u[0] for u in users) + fixed <= capacity * (1 + 1e-9):
        # All at their caps, with max_min_rates' own slack on the whole HBM (not on what is left).
        return _Shared(r, capacity, users, [u[0] for u in users])
    alloc = max_min_rates([u[0] for u in users], [u[1] for u in users], [[(0, 1.0)]] * len(users), [left])
    lowest = min((x / u[1] for u, x, b in zip(users, alloc.rates, alloc.bottleneck, strict=True) if b != CAP),
                 default=None)
    if lowest is not None:
        for f in through:
            if lowest < f.rate / flow_weight(solver.machine, f) * (1.0 - _TIE):
                return None
    return _Shared(r, capacity, users, alloc.rates)


def _loads(solver: RateSolver, ranks: list[int], flows: list[FlowState], shared: list[_Shared]) -> ChannelLoads:
    """The fresh GPUs' channels (their HBMs and the links keyed by them) with every user's rate,
    for their counters and the invariant checks."""
    channel: dict[Any, int] = {}
    capacity: list[float] = []
    rates: list[float] = []
    usage: list[list[tuple[int, float]]] = []
    for one in shared:
        i = channel[("hbm", one.rank)] = len(capacity)
        capacity.append(one.capacity)
        for x in one.rates:
            rates.append(x)
            usage.append([(i, 1.0)])
    for f in flows:
        use: list[tuple[int, float]] = []
        for r in ranks:
            for key, c in f.usage_at.get(r, ()):
                use.append((channel_index(solver.machine, channel, capacity, key), c))
        rates.append(f.rate)
        usage.append(use)
    return ChannelLoads(channel, capacity, rates, usage)


def _latency(solver: RateSolver, fresh: dict[int, None], demands: list[tuple[int, dict[KernelState, float]]],
             flows: list[FlowState], pressure: list[tuple[int, float, float]],
             asked_alone: dict[KernelState, float]) -> dict[int, dict[int, float]] | None:
    """HBM's loaded-latency law on each fresh GPU (as RateSolver.latency, one GPU at a time):
    lowers the kernels' demands in place, keeping theirs before in ``asked_alone``. Returns each
    flow's slowdowns above 1 on the fresh GPUs (by id of the flow, then rank), or None where some
    flow's slowdown, the largest over its GPUs, would move."""
    m = solver.machine
    kappa, q = m.hbm_latency_capacity, m.hbm_latency_exponent
    yielding = m.copy_engine_hbm_weight < 1.0 and any(f.demand.uses_copy_engine for f in flows)
    slow_at: dict[int, dict[int, float]] = {}
    for r, demand in demands:
        model = solver.gpus[r].model
        peak = model.hbm_peak_bytes_per_s
        left = solver.left_to_copies(r, demand, flows, pressure) if yielding else 0.0
        us: list[tuple[KernelState | FlowState | None, float, float]] = [
            (k, d / peak, k.memory_wait_share) for k, d in demand.items() if d > 0]
        for f in flows:
            c = f.hbm_at.get(r, 0.0)
            if c > 0:
                # The flow's cap before the law (RateSolver._shared sets it so, then divides).
                moved = f.demand.rate_cap_bytes_per_s * f.sm_factor * c
                if yielding and f.demand.uses_copy_engine:
                    moved = min(moved, left)
                wait = 0.0 if f.demand.uses_copy_engine else m.collective_memory_wait
                us.append((f, moved / peak, wait))
        for pr, share, _ in pressure:
            if pr == r:
                us.append((None, share * model.hbm_bytes_per_s / peak, 0.0))
        for f, s in slowed(us, demand, kappa, q, asked_alone):
            slow_at.setdefault(id(f), {})[r] = s
    for f in flows:
        if _largest_slowdown(f, fresh, slow_at.get(id(f), {})) != f.latency_slow:
            return None
    return slow_at


def _largest_slowdown(f: FlowState, fresh: dict[int, None], new: dict[int, float]) -> float:
    """The flow's loaded-latency slowdown, the largest over its GPUs: the fresh GPUs' ``new``
    ones, the others' as the last solve left them (``FlowState.slow_at``)."""
    old = f.latency_slow
    if old > 1.0 and sum(1 for r in fresh if f.slow_at.get(r) == old) < f.slow_at_largest:
        # A GPU that set it is not fresh: it stands unless a fresh GPU's is larger.
        largest = old
    else:
        largest = 1.0
        for rank, s in f.slow_at.items():
            if rank not in fresh and s > largest:
                largest = s
    for s in new.values():
        if s > largest:
            largest = s
    return largest
