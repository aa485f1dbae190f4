"""The analytic fidelity's ordering (ovsim.engine.analytic): closed forms of stream order,
dependencies and collectives, each op taking its isolated time."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ovsim.engine.analytic import analytic_timeline
from ovsim.errors import OvsimError
from ovsim.models.ir import BlockShape, FlowDemand, KernelDemand, Op, StreamSpec, Workload


def _kernel(seconds: float) -> KernelDemand:
    return KernelDemand(blocks=1, block=BlockShape(threads=128, registers_per_thread=32, shared_mem_bytes=0),
                        block_time_s=seconds, issue_fraction=1.0, hbm_bytes=0.0, flops=1.0, isolated_s=seconds)


def _member(op_id: str, group: str, rank: int, stream: str, seconds: float, deps: tuple[str, ...] = ()) -> Op:
    flow = FlowDemand(group=group, ranks=(0, 1), bytes=1.0, latency_s=seconds, rate_cap_bytes_per_s=1e30,
                      link_coeff=1.0, hbm_coeff=0.0)
    return Op(op_id, group, "collective", rank, stream, deps=deps, flow=flow)


def _workload(ops: list[Op]) -> Workload:
    streams = sorted({(op.rank, op.stream) for op in ops})
    return Workload(ops=tuple(ops), streams=tuple(StreamSpec(r, s) for r, s in streams), n_ranks=2)


def test_a_collective_ends_its_time_after_its_last_member_is_ready() -> None:
    """Rank 0 computes 1 s, rank 1 3 s, then both all-reduce for 2 s: both members end at 3 + 2,
    rank 0's having waited 2 s for its peer; a kernel after it on rank 0 ends at 5 + 1."""
    ops = [Op("c0", "c0", "gemm", 0, "s", kernel=_kernel(1.0)),
           Op("c1", "c1", "gemm", 1, "s", kernel=_kernel(3.0)),
           _member("a0", "ar", 0, "s", 2.0), _member("a1", "ar", 1, "s", 2.0),
           Op("d0", "d0", "gemm", 0, "s", kernel=_kernel(1.0))]
    out = analytic_timeline(_workload(ops)).ops.set_index("id")
    assert out.loc["a0", "end_s"] == out.loc["a1", "end_s"] == pytest.approx(5.0)
    assert out.loc["a0", "wait_peers_s"] == pytest.approx(2.0)
    assert out.loc["d0", "end_s"] == pytest.approx(6.0)
    # Ops in program order, then the flow.
    assert list(out.index) == ["c0", "c1", "a0", "a1", "d0", "flow:ar"]


def test_a_member_on_another_stream_waits_for_its_peers_predecessors() -> None:
    """Rank 0's member is on its own stream with no predecessor, rank 1's after a 4 s kernel: the
    collective starts at 4 s on both."""
    ops = [Op("c1", "c1", "gemm", 1, "s", kernel=_kernel(4.0)),
           _member("a0", "ar", 0, "comm", 1.0), _member("a1", "ar", 1, "s", 1.0)]
    out = analytic_timeline(_workload(ops)).ops.set_index("id")
    assert out.loc["a0", "end_s"] == pytest.approx(5.0)


def test_collectives_joined_in_opposite_orders_are_refused() -> None:
    """Rank 0 joins A then B, rank 1 B then A on one stream each: neither can ever start."""
    ops = [_member("a0", "A", 0, "s", 1.0), _member("b0", "B", 0, "s", 1.0),
           _member("b1", "B", 1, "s", 1.0), _member("a1", "A", 1, "s", 1.0)]
    with pytest.raises(OvsimError, match="conflicting orders"):
        analytic_timeline(_workload(ops))


def test_host_gaps_delay_the_ops_behind_them() -> None:
    """A 0.5 s delay op between two 1 s kernels, and a 0.25 s launch delay on the second: the second
    is launched at 1.5 s, starts at 1.75 s and ends at 2.75 s."""
    ops = [Op("k0", "k0", "gemm", 0, "s", kernel=_kernel(1.0)),
           Op("gap", "gap", "delay", 0, "s", delay_s=0.5),
           Op("k1", "k1", "gemm", 0, "s", delay_s=0.25, kernel=_kernel(1.0))]
    out = analytic_timeline(_workload(ops)).ops.set_index("id")
    assert "gap" not in out.index
    assert (out.loc["k1", "launch_s"], out.loc["k1", "start_s"], out.loc["k1", "end_s"]) == \
        pytest.approx((1.5, 1.75, 2.75))


def test_durations_replace_the_isolated_times() -> None:
    ops = [Op("k0", "k0", "gemm", 0, "s", kernel=_kernel(1.0)), Op("k1", "k1", "gemm", 0, "s", kernel=_kernel(1.0))]
    out = analytic_timeline(_workload(ops), [2.0, 3.0]).ops.set_index("id")
    assert out.loc["k1", "end_s"] == pytest.approx(5.0)
    assert out.loc["k1", "isolated_s"] == pytest.approx(3.0)


def test_durations_must_cover_every_op() -> None:
    ops = [Op("k0", "k0", "gemm", 0, "s", kernel=_kernel(1.0)), Op("k1", "k1", "gemm", 0, "s", kernel=_kernel(1.0))]
    with pytest.raises(OvsimError, match="1 durations for 2 ops"):
        analytic_timeline(_workload(ops), [2.0])
    with pytest.raises(OvsimError, match="3 isolated times for 2 ops") as e:
        analytic_timeline(_workload(ops), [2.0, 2.0], isolated_s=[1.0, 1.0, 1.0])
    assert e.value.field == "isolated_s"


def test_the_plans_makespan_is_the_timelines_without_it() -> None:
    """Closed forms: rank 0 ends at 6 s (test above); with a trailing 3 s host gap on rank 1 the
    makespan stays 6 s, as the timeline has no row for a gap; with both first kernels at 1 s,
    1 + 2 + 1 = 4 s."""
    from ovsim.engine.analytic import Plan

    ops = [Op("c0", "c0", "gemm", 0, "s", kernel=_kernel(1.0)),
           Op("c1", "c1", "gemm", 1, "s", kernel=_kernel(3.0)),
           _member("a0", "ar", 0, "s", 2.0), _member("a1", "ar", 1, "s", 2.0),
           Op("d0", "d0", "gemm", 0, "s", kernel=_kernel(1.0)),
           Op("gap", "gap", "delay", 1, "s", delay_s=3.0)]
    wl = _workload(ops)
    plan = Plan.of(wl)
    iso = [op.isolated_s for op in ops]
    assert plan.makespan_s(iso) == analytic_timeline(wl).makespan_s == pytest.approx(6.0)
    faster = [1.0, 1.0, 2.0, 2.0, 1.0, 0.0]
    assert plan.makespan_s(faster) == analytic_timeline(wl, faster).makespan_s == pytest.approx(4.0)


def test_a_collective_takes_its_longest_members_duration_in_any_listing() -> None:
    """Members given different durations (a caller's ``durations_s``; a built workload's members
    share one flow, so theirs are equal): the span is the longest, 1 s after both are ready at 0,
    whichever member is listed, and so reached, first."""
    for members in (["a0", "a1"], ["a1", "a0"]):
        ops = [_member(m, "ar", int(m[1]), "s", 1.0) for m in members]
        durations = [1.0 if m == "a0" else 3.0 for m in members]
        out = analytic_timeline(_workload(ops), durations_s=durations).ops.set_index("id")
        assert out.loc["a0", "end_s"] == out.loc["a1", "end_s"] == pytest.approx(3.0)


def test_ops_listed_before_what_they_wait_for_are_ordered_as_listed_after() -> None:
    """A dependency on an op listed later (a scenario may name one) leaves the ops' own order not
    topological, so the plan sorts them: the times are those of the same ops listed in order."""
    c = Op("c", "c", "gemm", 0, "s", kernel=_kernel(2.0))
    d = Op("d", "d", "gemm", 0, "t", deps=("c",), kernel=_kernel(1.0))
    forward = analytic_timeline(_workload([c, d])).ops.set_index("id")
    backward = analytic_timeline(_workload([d, c])).ops.set_index("id")
    assert backward.loc["d", "end_s"] == forward.loc["d", "end_s"] == pytest.approx(3.0)
    assert backward.loc["c", "end_s"] == forward.loc["c", "end_s"] == pytest.approx(2.0)


def test_clocked_durations_report_the_cost_models_time_and_the_clocks_share() -> None:
    """A power loop's clocks stretch a 1 s kernel to 1.25 s and shrink a 2 s one to 1.5 s: each
    reports its cost model's time as isolated and the difference as the clock's (0.25 s lost,
    0.5 s gained); the all-reduce after them keeps its own time and reports nothing lost to the
    clock, though rank 0's member waited 0.25 s for its peer."""
    ops = [Op("c0", "c0", "gemm", 0, "s", kernel=_kernel(1.0)),
           Op("c1", "c1", "gemm", 1, "s", kernel=_kernel(2.0)),
           _member("a0", "ar", 0, "s", 2.0), _member("a1", "ar", 1, "s", 2.0)]
    out = analytic_timeline(_workload(ops), [1.25, 1.5, 2.0, 2.0], isolated_s=[1.0, 2.0, 2.0, 2.0]).ops.set_index("id")
    assert out.loc["c0", "isolated_s"] == 1.0 and out.loc["c0", "duration_s"] == 1.25
    assert out.loc["c0", "clock_s"] == pytest.approx(0.25)
    assert out.loc["c1", "isolated_s"] == 2.0 and out.loc["c1", "clock_s"] == pytest.approx(-0.5)
    assert out.loc["a0", "isolated_s"] == 2.0 and out.loc["a0", "clock_s"] == 0.0
    assert out.loc["a0", "wait_peers_s"] == pytest.approx(0.25)
    assert out.loc["a0", "end_s"] == out.loc["a1", "end_s"] == pytest.approx(3.5)


def test_the_plain_pass_gives_the_general_passs_times() -> None:
    """Plan.times without release times or slowed flows runs a pass of its own: its times, flows
    included, are the general pass's with every release at 0, to the bit, on ops with host gaps,
    launch delays, members on other streams and ops listed out of order, and on built workloads
    (three examples: training iterations' collectives, one with each simulated once, and a GEMM
    beside an all-reduce); a negative
    launch delay starts nothing before 0 in either."""
    from ovsim.api import build
    from ovsim.engine.analytic import Plan
    from ovsim.scenario import load_scenario

    hand = [Op("c0", "c0", "gemm", 0, "s", kernel=_kernel(1.0), delay_s=0.5),
            Op("gap", "gap", "delay", 1, "s", delay_s=3.0),
            Op("c1", "c1", "gemm", 1, "s", kernel=_kernel(3.0)),
            _member("a0", "ar", 0, "t", 2.0, deps=("c0",)), _member("a1", "ar", 1, "s", 2.0),
            Op("d1", "d1", "gemm", 1, "u", deps=("e0",), kernel=_kernel(0.25)),
            Op("e0", "e0", "gemm", 0, "s", kernel=_kernel(1.0)),
            Op("n2", "n2", "gemm", 2, "s", kernel=_kernel(1.0), delay_s=-0.5),  # starts at 0 all the same
            *(Op(f"b{r}", "br", "collective", r, "t", delay_s=-0.25 * r, flow=FlowDemand(
                group="br", ranks=(1, 2), bytes=1.0, latency_s=1.0, rate_cap_bytes_per_s=1e30, link_coeff=1.0,
                hbm_coeff=0.0)) for r in (2, 1)),
            # The lone simulated member of its group (rank symmetry), after a launch delay.
            Op("s0", "solo", "collective", 0, "t", deps=("e0",), delay_s=0.125, flow=FlowDemand(
                group="solo", ranks=(0,), bytes=1.0, latency_s=0.75, rate_cap_bytes_per_s=1e30, link_coeff=1.0,
                hbm_coeff=0.0, group_size=8))]
    workloads = [Workload(ops=tuple(hand), streams=tuple(StreamSpec(r, s) for r, s in sorted(
        {(op.rank, op.stream) for op in hand})), n_ranks=3)]
    for name in ("training-gpt3-1.3b-fsdp-a100x4-overlapped.yaml", "gemm-allreduce-h100x4-overlapped.yaml",
                 "training-llama2-70b-tp8-chunked-hgx-h100.yaml"):  # its tensor-parallel groups simulated once
        path = Path(__file__).resolve().parents[2] / "examples" / name
        workloads.append(build(load_scenario(path), str(path))[0])
    for wl in workloads:
        plan = Plan.of(wl)
        dur = [op.isolated_s * (1.0 + 0.1 * (i % 3)) for i, op in enumerate(wl.ops)]
        assert plan.times(dur) == plan.times(dur, [0.0] * len(dur))
        assert min(plan.times(dur)[1]) >= 0.0
    # An op that waits for one op starts at 0 where that op ends below 0, at -0.0 or at NaN, as one
    # that waits for several does (durations a caller gives: negative, -0.0, NaN).
    chain = [Op(f"k{i}", f"k{i}", "gemm", 0, "s", kernel=_kernel(1.0)) for i in range(4)]
    chain.append(Op("j", "j", "gemm", 0, "s", deps=("k1",), kernel=_kernel(1.0)))
    plan = Plan.of(Workload(ops=tuple(chain), streams=(StreamSpec(0, "s"),), n_ranks=1))
    for odd in (-2.0, -0.0, math.nan):
        dur = [odd, odd, 1.0, odd, 0.5]
        assert repr(plan.times(dur)) == repr(plan.times(dur, [0.0] * len(dur)))
        assert plan.times(dur)[1][1] == 0.0 and repr(plan.times(dur)[1][1]) == "0.0"
