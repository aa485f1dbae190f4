"""Figures (ovsim.plot) and the --plot flag: what is drawn matches the numbers it draws, on
hand-made timelines whose geometry is known, and bad --plot input is one line before any work."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from ovsim.cli import main
from ovsim.engine.timeline import REASONS, Timeline, timeline_from_rows
from ovsim.errors import OvsimError
from ovsim.plot import REASON_COLORS, check_path, replay_figure, save, timeline_figure
from ovsim.plot_tables import calibration_figure, compare_figure, sweep_figure, validate_figure
from ovsim.replay import replay
from ovsim.traces.table import TraceBundle, make_table
from ovsim.validate import Check

EXAMPLES = Path(__file__).parent.parent / "examples"
EXAMPLE = EXAMPLES / "gemm-allreduce-h100x4-priority.yaml"


def op(name: str, rank: int, stream: str, start_s: float, end_s: float, isolated_s: float, *, kind: str = "gemm",
       **lost: float) -> dict[str, Any]:
    return {"id": f"{name}@r{rank}", "name": name, "kind": kind, "rank": rank, "stream": stream, "launch_s": 0.0,
            "start_s": start_s, "end_s": end_s, "isolated_s": isolated_s, "blocks": 1, "bytes": 0.0, **lost}


def counter(t: float, rank: int, name: str, value: float) -> dict[str, Any]:
    return {"time_s": t, "rank": rank, "counter": name, "value": value}


def bars(ax: Any, *, hatched: bool) -> list[tuple[float, float, float]]:
    """(x, width, lane centre) of every bar drawn, hatched (slowed time) or not."""
    out = []
    for c in ax.collections:
        if bool(c.get_hatch()) != hatched:
            continue
        for p in c.get_paths():
            x, y, w, h = p.get_extents().bounds
            out.append((round(x, 6), round(w, 6), round(y + h / 2, 6)))
    return sorted(out)


def two_rank_timeline() -> Timeline:
    # Rank 0's GEMM took 3 ms against 2 ms alone, all of it lost waiting for SMs; rank 1's was not
    # slowed. Their SM counters differ, their HBM counters agree.
    rows = [op("gemm", 0, "compute", 0.0, 3e-3, 2e-3, wait_sm_s=1e-3),
            op("ar", 0, "comm", 1e-3, 4e-3, 3e-3, kind="collective"),
            op("gemm", 1, "compute", 0.0, 2e-3, 2e-3),
            op("ar", 1, "comm", 1e-3, 4e-3, 3e-3, kind="collective"),
            op("ar", -1, "", 1e-3, 4e-3, 3e-3, kind="flow")]
    counters = [counter(0.0, 0, "sm_busy_fraction", 1.0), counter(3e-3, 0, "sm_busy_fraction", 0.25),
                counter(0.0, 1, "sm_busy_fraction", 1.0), counter(2e-3, 1, "sm_busy_fraction", 0.0),
                counter(2e-3, 1, "sm_busy_fraction", 0.25),  # same instant: the last one holds
                *(counter(t, r, "hbm_bytes_per_s", v) for r in (0, 1) for t, v in ((0.0, 1e12), (1e-3, 2e12)))]
    return timeline_from_rows(rows, counters)


def test_every_reason_has_a_colour() -> None:
    assert set(REASON_COLORS) == set(REASONS.values())


def test_timeline_lanes_and_slowed_time() -> None:
    fig = timeline_figure(two_rank_timeline(), title="t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["r0 compute", "r0 comm", "r1 compute", "r1 comm"]
    # Solid bars: each op's start and duration in microseconds (the span is 4 ms), in its lane;
    # the flow is not drawn.
    assert bars(ax, hatched=False) == [(0.0, 2000.0, 2.0), (0.0, 3000.0, 0.0), (1000.0, 3000.0, 1.0),
                                       (1000.0, 3000.0, 3.0)]
    # Hatched: the 1 ms rank 0's GEMM lost, at its end, in the colour of its reason.
    assert bars(ax, hatched=True) == [(2000.0, 1000.0, 0.0)]
    [slowed] = [c for c in ax.collections if c.get_hatch()]
    assert tuple(slowed.get_edgecolor()[0][:3]) == pytest.approx(
        tuple(int(REASON_COLORS["waiting for SMs"][i:i + 2], 16) / 255 for i in (1, 3, 5)))
    assert fig.axes[-1].get_xlabel() == "time (us)"


def test_counter_panels_step_with_the_counters_and_merge_identical_ranks() -> None:
    fig = timeline_figure(two_rank_timeline())
    sm, hbm = fig.axes[1], fig.axes[2]
    assert (sm.get_title(loc="left"), hbm.get_title(loc="left")) == ("SMs holding blocks", "HBM traffic")
    assert len(fig.axes) == 3  # no link, power or clock counters recorded: no panels for them
    lines = {ln.get_label(): ln for ln in sm.get_lines()}
    assert set(lines) == {"rank 0", "rank 1"}
    # Held to the end of the run (4 ms); of two samples at 2 ms the last holds.
    assert list(lines["rank 1"].get_xdata()) == [0.0, 2000.0, 4000.0]
    assert list(lines["rank 1"].get_ydata()) == [1.0, 0.25, 0.25]
    assert lines["rank 0"].get_drawstyle() == "steps-post"
    [both] = hbm.get_lines()
    assert both.get_label() == "ranks 0-1"
    assert list(both.get_ydata()) == pytest.approx([1000.0, 2000.0, 2000.0])  # GB/s


def test_max_ranks_limits_the_lanes_and_says_so() -> None:
    rows = [op("g", r, "compute", 0.0, 1e-3, 1e-3) for r in range(8)]
    fig = timeline_figure(timeline_from_rows(rows, []), title="eight", max_ranks=2)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["r0 compute", "r1 compute"]
    assert fig.axes[0].get_title(loc="left") == "eight (ranks 0-1 of 8)"
    assert len(fig.axes) == 1  # no counters
    with pytest.raises(OvsimError, match="at least 1"):
        timeline_figure(timeline_from_rows(rows, []), max_ranks=0)


def test_an_empty_timeline_still_draws() -> None:
    fig = timeline_figure(timeline_from_rows([], []))
    assert fig.axes[0].get_yticklabels() == [] or [t.get_text() for t in fig.axes[0].get_yticklabels()] == []


def _k(name: str, start_us: float, dur_us: float, *, stream: int = 7, kind: str = "") -> dict[str, Any]:
    return {"rank": 0, "stream": stream, "name": name, "kind": kind, "start_s": start_us * 1e-6,
            "duration_s": dur_us * 1e-6, "grid_x": 132, "block_x": 256, "registers_per_thread": 64}


def test_replay_scatter_has_one_point_per_scored_kernel_and_lanes_per_stream() -> None:
    rows = [_k("gemm", 0, 10), _k("gemm", 20, 13), _k("nccl", 18, 30, stream=9, kind="collective"),
            _k("gemm", 60, 10), _k("gemm", 80, 10)]
    cols = {key: [r.get(key) for r in rows] for key in rows[0]}
    result = replay(TraceBundle(kernels=make_table(cols)), gpu="h100-sxm5-80gb")
    fig = replay_figure(result)
    left, right = fig.axes[0], fig.axes[1]
    # One overlapped GEMM, scored against the median of its clean twins (10 us): a naive point and
    # an ovsim point at measured 13 us.
    naive, ours = left.collections[0].get_offsets(), left.collections[1].get_offsets()
    assert np.asarray(naive).ravel().tolist() == pytest.approx([13.0, 10.0])
    assert np.asarray(ours)[:, 0].tolist() == pytest.approx([13.0])
    assert [t.get_text() for t in right.get_yticklabels()] == [
        "r0 s7 measured", "r0 s7 predicted", "r0 s9 measured", "r0 s9 predicted"]
    # The measured lane of stream 7 holds the four GEMMs where the trace has them (us from the first).
    measured = [b for b in bars(right, hatched=False) if b[2] == 0.0]
    assert [(x, w) for x, w, _ in measured] == [(0.0, 10.0), (20.0, 13.0), (60.0, 10.0), (80.0, 10.0)]


def test_compare_bars_stack_to_the_makespan() -> None:
    df = pd.DataFrame({"scenario": ["a", "b"], "makespan_s": [5e-3, 4e-3], "compute_s": [1e-3, 1.5e-3],
                       "compute_isolated_s": [1e-3, 1e-3], "exposed_comm_s": [4e-3, 2e-3]})
    fig = compare_figure(df)
    assert len(fig.axes) == 1  # no power columns: no power panel
    parts = [[p.get_height() for p in c] for c in fig.axes[0].containers]
    # compute alone, slowdown, exposed communication, idle (b: 4 - 1.5 - 2 = 0.5 ms), in us.
    assert np.array(parts).ravel().tolist() == pytest.approx([1000, 1000, 0, 500, 4000, 2000, 0, 500])
    assert np.array(parts).sum(axis=0).tolist() == pytest.approx([5000, 4000])
    with pytest.raises(OvsimError, match="no scenarios"):
        compare_figure(df.iloc[:0])


def test_compare_shows_every_stack_and_labels_alike() -> None:
    """Compute on two streams at once stacks above the makespan (kernel time summed over streams):
    the axis holds the stack. Every makespan has the decimals of the longest's 4 significant
    digits, at least 2 on the shortest ("11" beside "7.869" before)."""
    df = pd.DataFrame({"scenario": ["a", "b", "c"], "makespan_s": [11e-3, 7.869e-3, 3e-3],
                       "compute_s": [1e-3, 1e-3, 14e-3], "compute_isolated_s": [1e-3, 1e-3, 14e-3],
                       "exposed_comm_s": [0.0, 0.0, 0.0]})
    ax = compare_figure(df).axes[0]
    assert ax.get_ylim()[1] >= max(p.get_y() + p.get_height() for p in ax.patches) == pytest.approx(14.0)  # ms
    assert [t.get_text() for t in ax.texts] == ["11.00", "7.87", "3.00"]
    small = df.assign(makespan_s=[11e-3, 7.869e-3, 0.041e-3], compute_s=[1e-3, 1e-3, 0.04e-3],
                      compute_isolated_s=[1e-3, 1e-3, 0.04e-3])
    assert [t.get_text() for t in compare_figure(small).axes[0].texts] == ["11.000", "7.869", "0.041"]


def test_compare_power_panel_draws_what_a_board_reports() -> None:
    """Average and the highest 100 ms average, never the instantaneous peak (892 W drawn for a 700 W
    board), with each scenario's energy above its bars."""
    df = pd.DataFrame({"scenario": ["a", "b"], "makespan_s": [5e-3, 4e-3], "compute_s": [1e-3, 1.5e-3],
                       "compute_isolated_s": [1e-3, 1e-3], "exposed_comm_s": [4e-3, 2e-3],
                       "avg_power_w": [610.0, 650.0], "peak_power_w": [891.9, 950.0],
                       "peak_100ms_power_w": [694.1, 699.0], "energy_j": [12.2, 10.4]})
    pax = compare_figure(df).axes[1]
    avg, peak = ([b.get_height() for b in c] for c in pax.containers)
    assert avg == pytest.approx([610.0, 650.0]) and peak == pytest.approx([694.1, 699.0])
    assert [t.get_text() for t in pax.get_legend().get_texts()] == ["average", "peak (100 ms)"]
    assert [t.get_text() for t in pax.texts] == ["12.2 J", "10.4 J"]


def test_compare_bars_stack_to_the_makespan_when_compute_beat_alone() -> None:
    # A run above the calibration clock computes in less than "alone": the bars once stacked the
    # whole of alone plus exposed, above the makespan (715 against 656.7 ms in a user's compare).
    df = pd.DataFrame({"scenario": ["fast"], "makespan_s": [656.7e-3], "compute_s": [490e-3],
                       "compute_isolated_s": [552.6e-3], "exposed_comm_s": [162.4e-3]})
    parts = [c[0].get_height() for c in compare_figure(df).axes[0].containers]
    # compute as it ran, no slowdown, exposed, idle = 656.7 - 490 - 162.4; in ms, summing to the makespan.
    assert parts == pytest.approx([490.0, 0.0, 162.4, 4.3])


def test_sweep_panels_keep_zero_in_view_and_label_energy_for_all_gpus() -> None:
    df = pd.DataFrame({"a": [1, 2], "makespan_s": [1.000, 1.010], "compute_slowdown": [0.10, 0.101],
                       "exposed_comm_s": [0.5, 0.505], "energy_j": [4000.0, 4040.0]})
    fig = sweep_figure(df, ["a"])
    for ax in fig.axes:
        lo, hi = ax.get_ylim()
        assert lo <= 0.0 < hi  # a 1% change is drawn as 1% of the axis, not all of it
    assert fig.axes[3].get_ylabel() == "J, all GPUs"


def test_sweep_splits_the_compute_slowdown_into_contention_and_clock() -> None:
    """A sweep over power caps: the lower clock's part and contention's part are drawn apart, as
    compare's table gives them (the total mixed a cap's slowdown into "vs alone")."""
    df = pd.DataFrame({"cap": [400, 200], "makespan_s": [1.0, 1.5], "compute_slowdown": [0.05, 0.55],
                       "compute_clock_slowdown": [0.0, 0.5], "exposed_comm_s": [0.1, 0.1]})
    fig = sweep_figure(df, ["cap"])
    titles = [ax.get_title(loc="left").replace("\n", " ") for ax in fig.axes]  # long ones wrapped
    assert titles == ["makespan", "compute slowdown by contention (same clock)", "compute slowdown by the clock",
                      "exposed communication"]
    assert list(fig.axes[1].get_lines()[0].get_ydata()) == pytest.approx([5.0, 5.0])
    assert list(fig.axes[2].get_lines()[0].get_ydata()) == pytest.approx([0.0, 50.0])


def test_validate_bars_are_the_errors_coloured_by_outcome() -> None:
    checks = [Check("close", "published", 100.0, 104.0, "x", 5.0, "s"),
              Check("far", "published", 100.0, 80.0, "x", 5.0, "s"),
              Check("bound", "trace", 10.0, 12.0, "%", 0.0, "s", rule="at_most")]
    fig = validate_figure(checks)
    ax = fig.axes[0]
    errors = [p for p in ax.patches if p.get_height() == 0.5]
    assert [round(p.get_width(), 6) for p in errors] == [4.0, -20.0, 20.0]
    green, red = (0.172549, 0.627451, 0.172549), (0.839216, 0.152941, 0.156863)
    assert [tuple(round(v, 6) for v in p.get_facecolor()[:3]) for p in errors] == [green, red, red]
    assert ax.get_title(loc="left") == "validation: 1 of 3 checks pass"
    lo, hi = ax.get_xlim()
    assert lo < -20 and hi > 20 and lo > -100  # the unbounded band does not set the axis


def test_a_band_check_draws_its_interval_around_the_reference() -> None:
    """A target band of 15-23 around a published 18.9 is the allowed interval, in % of 18.9."""
    fig = validate_figure([Check("band", "study", 18.9, 1.7, "%", 0.0, "s", rule="band", low=15.0, high=23.0)])
    (band,) = [p for p in fig.axes[0].patches if p.get_height() == 0.8]
    assert band.get_x() == pytest.approx((15.0 - 18.9) / 18.9 * 100)
    assert band.get_x() + band.get_width() == pytest.approx((23.0 - 18.9) / 18.9 * 100)


@pytest.mark.parametrize("suffix", [".png", ".pdf", ".svg"])
def test_save_writes_the_format_its_name_asks_for(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    save(timeline_figure(two_rank_timeline()), path)
    magic = {".png": b"\x89PNG", ".pdf": b"%PDF", ".svg": b"<?xml"}[suffix]
    assert path.read_bytes().startswith(magic)


def test_predict_and_compare_plot_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "p.png"
    assert main(["predict", str(EXAMPLE), "--plot", str(out), "--quiet"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    cmp = tmp_path / "c.svg"
    assert main(["compare", str(EXAMPLES / "gemm-allreduce-h100x4-sequential.yaml"), str(EXAMPLE),
                 "--plot", str(cmp), "--quiet"]) == 0
    assert b"<svg" in cmp.read_bytes()


@pytest.mark.parametrize(("command", "name", "words"), [
    (["predict", "{d}/never-read.yaml"], "{d}/p.xyz", "cannot tell the image format from the name"),
    (["replay", "{d}/never-read.json"], "{d}/p", "cannot tell the image format from the name"),
    (["compare", "{d}/never-read.yaml"], "{d}/nowhere/p.png", "folder '{d}/nowhere' does not exist"),
    (["validate"], "{d}", "is a folder; give a file name"),
    (["calibrate", "{d}/never-read.json", "--gpu", "h100-sxm5-80gb", "-o", "{d}"], "{d}/p.bmpx",
     "cannot tell the image format from the name"),
])
def test_a_plot_that_cannot_be_written_is_refused_before_the_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], name: str, words: str) -> None:
    argv = [a.format(d=tmp_path) for a in command] + ["--plot", name.format(d=tmp_path), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--plot: {words.format(d=tmp_path)}" in err and "never-read" not in err


def test_without_matplotlib_the_plot_flag_says_what_to_install(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backend_bases", None)
    with pytest.raises(OvsimError, match=r"pip install 'ovsim\[plot\]'"):
        check_path(tmp_path / "p.png")
    assert main(["predict", str(EXAMPLE), "--plot", str(tmp_path / "p.png"), "--quiet"]) == 2
    assert "--plot: drawing needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


def test_sweep_lines_follow_the_first_axis_one_per_other_combination() -> None:
    df = pd.DataFrame({"a": [1, 1, 2, 2, 4, 4], "b": ["x", "y"] * 3,
                       "makespan_s": [1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3],
                       "compute_slowdown": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], "exposed_comm_s": [0.0] * 6})
    fig = sweep_figure(df, ["a", "b"])
    assert len(fig.axes) == 3  # no energy column: no energy panel
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert set(lines) == {"b=x", "b=y"}
    # A number line for a numeric axis (1, 2, 4 where they fall), makespan in ms.
    assert list(lines["b=y"].get_xdata()) == [1, 2, 4]
    assert list(lines["b=y"].get_ydata()) == pytest.approx([2.0, 4.0, 6.0])
    assert list(fig.axes[1].get_lines()[0].get_ydata()) == pytest.approx([0.0, 20.0, 40.0])  # %
    # A None among the values (no power cap) makes the axis categorical, in the order swept.
    cap = pd.DataFrame({"cap": pd.Series([None, 300, 150], dtype=object), "makespan_s": [1.0, 1.1, 1.5]})
    fig = sweep_figure(cap, ["cap"])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["None", "300", "150"]
    assert list(fig.axes[0].get_lines()[0].get_xdata()) == [0, 1, 2]
    with pytest.raises(OvsimError, match="not a column"):
        sweep_figure(df, ["c"])


def test_sweep_plots_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "s.png"
    assert main(["sweep", str(EXAMPLE), "--axis", "ops.gemm.m=1024,2048", "--mode", "analytic", "--plot", str(out),
                 "--quiet"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_calibration_points_are_drawn_where_they_are_measured_and_fitted() -> None:
    """Times in µs on log axes, one panel per fit, coloured by group; watts on linear axes; the
    prediction before a fit as rings where the fit has one; the fit errors in the titles."""
    nan = float("nan")
    points = pd.DataFrame([
        ("gemm", "bf16", "t", "s", 10e-6, 11e-6, nan), ("gemm", "bf16", "t", "s", 100e-6, 90e-6, nan),
        ("gemm", "fp16", "t", "s", 1e-3, 1e-3, nan),
        ("contention", "gemm", "t", "s", 20e-6, 20e-6, 10e-6),
        ("power", "smi.csv", "t", "W", 300.0, 330.0, 200.0), ("power", "smi.csv", "t", "W", 400.0, 400.0, 300.0),
    ], columns=["quantity", "group", "trace", "unit", "measured", "fitted", "baseline"])
    fig = calibration_figure(points)
    gemm, contention, power = (ax for ax in fig.axes if ax.get_visible())
    assert gemm.get_xscale() == "log" and power.get_xscale() == "linear"
    offsets = [np.ravel(c.get_offsets()).tolist() for c in gemm.collections if len(c.get_offsets())]
    assert offsets[0] == pytest.approx([10.0, 11.0, 100.0, 90.0]) and offsets[1] == pytest.approx([1000.0, 1000.0])
    assert [t.get_text() for t in gemm.get_legend().get_texts()][:2] == ["bf16 (2)", "fp16 (1)"]
    # (10% + 10% + 0%) / 3
    assert gemm.get_title(loc="left") == "gemm: 3 points, fit error 6.7%"
    assert np.ravel(contention.collections[0].get_offsets()).tolist() == pytest.approx([20.0, 10.0])
    assert contention.get_title(loc="left").endswith("naive (isolated time): 50.0%")
    assert np.ravel(power.collections[1].get_offsets()).tolist() == pytest.approx([300.0, 330.0, 400.0, 400.0])
    assert power.get_title(loc="left") == "power: 2 points, fit error 5.0%\nbefore the fit: 29.2%"
    with pytest.raises(OvsimError, match="no fitted points"):
        calibration_figure(points.iloc[:0])


def test_calibrate_plots_from_the_command_line(tmp_path: Path) -> None:
    from ovsim.traces.load import write_table

    rows = [{"rank": 0, "stream": 7, "name": "add", "kind": "elementwise", "start_s": i * 1e-3,
             "duration_s": (1.5 + 0.1 * (i % 3)) * 1e-6, "grid_x": 4, "grid_y": 1, "grid_z": 1, "block_x": 128,
             "block_y": 1, "block_z": 1, "registers_per_thread": 32, "shared_mem_bytes": 0,
             "host_op": "aten::add[[1024], [1024], []]", "host_types": "['c10::BFloat16', 'c10::BFloat16', 'Scalar']",
             "host_op_id": i} for i in range(12)]
    keys = sorted(rows[0])
    trace = tmp_path / "run.parquet"
    write_table(TraceBundle(kernels=make_table({k: [r[k] for r in rows] for k in keys}),
                            gpu_names={0: "NVIDIA H100 80GB HBM3"}), trace)
    out = tmp_path / "fit.png"
    assert main(["calibrate", str(trace), "--gpu", "h100-sxm5-80gb", "-o", str(tmp_path), "--fit", "overhead",
                 "--plot", str(out), "--quiet"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG") and len(list(tmp_path.glob("*.yaml"))) == 1


def test_replay_figure_shows_exposed_and_hidden_communication_and_weighted_error() -> None:
    """Rank 3: a GEMM [0, 15) us beside an all-reduce [5, 25), its clean twin [50, 60), a copy [45, 65).
    Measured 10 us exposed, 50% hidden; with no contention the GEMM is predicted at its twin's 10 us:
    15 us exposed, 25% hidden, an error of 5 of 15 us (33.3%, weighted as the one kernel it is), as
    the naive prediction's."""
    rows = [{**_k("gemm", 0, 15), "rank": 3}, {**_k("gemm", 50, 10), "rank": 3},
            {**_k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5, 20, stream=9), "rank": 3},
            {**_k("Memcpy DtoD (Device -> Device)", 45, 20, stream=11), "rank": 3}]
    cols = {key: [r.get(key) for r in rows] for key in rows[0]}
    none = {"replay_collective_sm_fraction": 0.0, "nccl_memory_pressure": {"default": 0.0},
            "replay_hbm_fraction": {"gemm": 0.0}}
    fig = replay_figure(replay(TraceBundle(kernels=make_table(cols)), gpu="h100-sxm5-80gb", overrides=none))
    left, right = fig.axes[0], fig.axes[1]
    assert right.get_title(loc="left").splitlines()[1] == (
        "exposed comm, all ranks: measured 0.010 ms, predicted 0.015 ms; "
        "hidden under compute: measured 50.0%, predicted 25.0%")
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert labels == ["naive (alone): MAPE 33.3%, weighted 33.3%", "ovsim: MAPE 33.3%, weighted 33.3%"]
