"""The window a long workload starts the engine from (power_analytic.steady_window) against the one
the engine's own warm-up run leaves (Engine._steady_history): two independent ways to the same
steady state of the power-limit loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ovsim import api
from ovsim.api import build, power_config, predict
from ovsim.engine.machine import build_machine
from ovsim.engine.power import Period, PowerConfig, power_rows
from ovsim.engine.power_analytic import STEADY_WINDOWS, steady_window
from ovsim.engine.power_loop import same_start, start_clock
from ovsim.engine.sim import Engine, EngineOptions
from ovsim.hw.power import PowerSettings
from ovsim.scenario import load_scenario


def loop_file(tmp_path: Path, gemms: int, adds: int) -> Path:
    """``gemms`` GEMMs of 8192^3 (1.4-1.6 ms each at the H100's 700 W limit), then ``adds``
    streaming adds of 1 GiB (0.35 ms): a phase the loop throttles, then one it does not, so the
    window an iteration leaves to the next is partly each."""
    p = tmp_path / "loop.yaml"
    p.write_text("name: loop\nsystem: hgx-h100\nranks: 1\nops:\n"
                 f"  - {{name: g, kind: gemm, m: 8192, n: 8192, k: 8192, precision: bf16, repeat: {gemms}}}\n"
                 f"  - {{name: a, kind: elementwise, bytes: 1.07e9, repeat: {adds}}}\n")
    return p


def analytic_window(path: Path) -> tuple[PowerConfig, dict[int, tuple[Period, ...]] | None]:
    """The scenario's power configuration (its default limit, steady start) and its analytic
    steady window."""
    wl, _, gpu, calib = build(load_scenario(path), str(path))
    power = power_config(wl, gpu, calib, PowerSettings())
    return power, steady_window(wl, gpu, power)


def engine_run(path: Path, history: object) -> tuple[Engine, float, float]:
    """The engine left to find the steady window itself (``history`` None) or started from
    ``history``: the engine, the iteration's time and its energy."""
    sc = load_scenario(path)
    wl, system, gpu, calib = build(sc, str(path))
    power = power_config(wl, gpu, calib, sc.power or PowerSettings())
    machine = build_machine(system, gpu, calib.params, n_ranks=wl.n_ranks)
    engine = Engine(wl, machine, EngineOptions(counters=True, power=power), power_history=history)  # type: ignore[arg-type]
    tl = engine.run()
    energy_j = sum(r["energy_j"] for r in power_rows(tl, range(wl.n_ranks), gpu.power.idle_w, 1.0))
    return engine, tl.makespan_s, energy_j


def test_the_analytic_window_starts_the_engine_where_its_warm_up_does(tmp_path: Path) -> None:
    """Over 10 control windows of GEMMs, then adds, the analytic window gives the starting clock the
    engine's warm-up run gives, to the clock grid's 15 MHz, and the iteration's time and energy
    agree within 0.05%: what the start changes is the run's first two windows (docs/power.md)."""
    path = loop_file(tmp_path, 420, 40)
    power, window = analytic_window(path)
    m = power.model
    assert window is not None and set(window) == {0}
    periods = window[0]
    assert sum(p[0] for p in periods) == pytest.approx(m.control_window_s)
    # The engine's own warm-up (no history given): its run then starts from what it found.
    warm, t_warm, e_warm = engine_run(path, None)
    from_analytic, t_analytic, e_analytic = engine_run(path, window)
    assert t_warm > STEADY_WINDOWS * m.control_window_s

    engine_window = warm.left_window()[0]
    grid = 15e6 / m.compute_clock_hz
    # The window holds GEMMs the loop throttles: a clock below the top.
    assert start_clock(power, periods) < power.max_clock_fraction - grid
    assert start_clock(power, periods) == pytest.approx(start_clock(power, engine_window), abs=1.01 * grid)
    assert t_analytic == pytest.approx(t_warm, rel=5e-4)
    assert e_analytic == pytest.approx(e_warm, rel=5e-4)
    # Through predict, which takes the analytic window for a workload this long (and keeps the
    # run: it starts the GPU where the run's own end leaves it).
    assert same_start(power, window, from_analytic.left_window())
    started: list[object] = []
    s = predict_spying(path, started).summary()
    assert len(started) == 1 and started[0] is not None
    assert s["makespan_s"] == pytest.approx(t_analytic, rel=1e-12)
    # From idle the first GEMMs run at the top clock: a faster, costlier iteration.
    idle = predict(path, power_start="idle").summary()
    assert idle["makespan_s"] < s["makespan_s"] and idle["energy_j"] > s["energy_j"]


def predict_spying(path: Path, started: list[object]) -> api.Result:
    """``predict(path)``, noting the window each engine it makes starts from."""
    made = api.Engine

    def engine(*args: Any, power_history: object = None, **kw: Any) -> Engine:
        started.append(power_history)
        return made(*args, power_history=power_history, **kw)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "Engine", engine)
        return predict(path)


def test_a_contended_end_is_run_again_from_the_window_it_leaves(tmp_path: Path) -> None:
    """An all-reduce beside streaming adds after 380 GEMMs on 4 H100: the analytic fidelity, which
    shares nothing, ends it in a third of the engine's time and so puts the last window's power
    too high (a start 11 clock steps low). predict sees the run's own end start the GPUs elsewhere
    and runs it again from there: the engine's warm-up's iteration time."""
    path = tmp_path / "tail.yaml"
    path.write_text("name: tail\nsystem: h100x4\nops:\n"
                    "  - {name: g, kind: gemm, m: 8192, n: 8192, k: 8192, precision: bf16, repeat: 380}\n"
                    "  - {name: a, kind: elementwise, bytes: 1.07e9, repeat: 60, after: [g]}\n"
                    "  - {name: ar, kind: all_reduce, size_bytes: 2.0e9, after: [g], stream: comm}\n")
    power, window = analytic_window(path)
    assert window is not None
    from_analytic, _, _ = engine_run(path, window)
    assert not same_start(power, window, from_analytic.left_window())
    _, t_warm, _ = engine_run(path, None)
    started: list[object] = []
    assert predict_spying(path, started).summary()["makespan_s"] == pytest.approx(t_warm, rel=1e-4)
    assert len(started) == 2 and all(h is not None for h in started)


def test_a_host_gap_at_the_end_is_in_the_window(tmp_path: Path) -> None:
    """400 GEMMs, then a 50 ms host gap: the window the iteration leaves is mostly idle, so the next
    starts at the top clock, as the engine's warm-up finds (a window of the GEMMs alone would start
    it 33 steps lower)."""
    path = tmp_path / "gap.yaml"
    path.write_text("name: gap\nsystem: hgx-h100\nranks: 1\nops:\n"
                    "  - {name: g, kind: gemm, m: 8192, n: 8192, k: 8192, precision: bf16, repeat: 400}\n"
                    "  - {name: d, kind: delay, duration_s: 0.05, after: [g]}\n")
    power, window = analytic_window(path)
    assert window is not None
    warm, t_warm, _ = engine_run(path, None)
    assert start_clock(power, window[0]) == power.max_clock_fraction
    assert same_start(power, window, warm.left_window())
    assert predict(path).summary()["makespan_s"] == pytest.approx(t_warm, rel=1e-4)


def test_short_workloads_keep_the_engines_warm_up(tmp_path: Path) -> None:
    """Under 10 windows the start weighs on much of the run: no analytic window, and predict runs
    the engine's warm-up (the same timeline as the engine left to itself)."""
    path = loop_file(tmp_path, 20, 20)
    sc = load_scenario(path)
    wl, _, gpu, calib = build(sc, str(path))
    power = power_config(wl, gpu, calib, PowerSettings())
    assert steady_window(wl, gpu, power) is None
    assert steady_window(wl, gpu, power, min_windows=0.5) is not None
    # Without a loop (managed off) or from idle there is nothing to find.
    assert steady_window(wl, gpu, power_config(wl, gpu, calib, PowerSettings(managed=False))) is None
    _, t_engine, _ = engine_run(path, None)
    started: list[object] = []
    assert predict_spying(path, started).summary()["makespan_s"] == t_engine
    assert started == [None]


def test_a_gemm_of_years_predicts_in_both_fidelities(tmp_path: Path) -> None:
    """An 8192 x 4.096e15 x 8192 GEMM, about 21 years alone (the scenario fuzz found one of twice
    its size, which is now refused as longer than an op may take, limits.MAX_OP_S): the analytic
    loop took a tick per 5 ms control period of its years and asked for terabytes; it now takes at
    most a million over a repeat, and both fidelities hold the GEMM at one steady clock, so they
    agree."""
    path = tmp_path / "years.yaml"
    path.write_text("name: years\nsystem: hgx-h100\nranks: 1\n"
                    "ops: [{name: g, kind: gemm, m: 8192, n: 4.096e15, k: 8192, precision: bf16}]\n")
    analytic, simulated = (predict(path, mode=mode).summary() for mode in ("analytic", "simulate"))
    assert analytic["makespan_s"] > 3e7  # about a year
    assert simulated["makespan_s"] == pytest.approx(analytic["makespan_s"], rel=1e-3)
    assert simulated["avg_sm_clock_hz"] == pytest.approx(analytic["avg_sm_clock_hz"], rel=1e-3)


@pytest.mark.parametrize("cap_w", [None, 300.0, 120.0])
def test_the_cheap_length_check_never_calls_a_long_workload_short(tmp_path: Path, cap_w: float | None) -> None:
    """steady_window skips its loop where one pass of the plan shows the workload short; the check
    must never say so of a workload the loop runs for longer (it would then be judged on the
    engine's warm-up instead, which is slower, though still right). Checked against the loop's
    own length at the 700 W default, at 300 W, and at 120 W, where the H100's lowest clock draws
    more than the cap and the hardware slowdown takes the clock below it."""
    from ovsim.engine.analytic import Plan
    from ovsim.engine.power_analytic import OpTerms, _shorter_than, _top_times, throttled_durations

    path = loop_file(tmp_path, 20, 20)
    wl, _, gpu, calib = build(load_scenario(path), str(path))
    power = power_config(wl, gpu, calib, PowerSettings(cap_w=cap_w))
    plan, terms = Plan.of(wl), OpTerms.of(wl, gpu, power.model)
    durations, _ = throttled_durations(wl, gpu, power, plan, terms)
    span_s = max(plan.times(durations)[2])
    top = _top_times(power, plan, terms)
    for times in (0.5, 0.999, 1.001, 2.0):
        assert not _shorter_than(span_s * times, wl, power, top, terms) or times > 1
    # And it does say so where the workload is far shorter, or the check would save nothing.
    assert _shorter_than(span_s * 100, wl, power, top, terms)
