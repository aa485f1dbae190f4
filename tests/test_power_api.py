"""Power settings and outputs through the public API and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ovsim
import ovsim.hw.spec
from ovsim.api import predict
from ovsim.cli import main
from ovsim.errors import OvsimError

EXAMPLE = Path(__file__).parent.parent / "examples" / "gemm-allreduce-a100x4-priority.yaml"
POWER_KEYS = {"power_managed", "power_cap_w", "power_limit_w", "sm_clock_lock_hz", "avg_power_w", "peak_power_w",
              "peak_100ms_power_w", "energy_j", "energy_delay_j_s",
              "avg_sm_clock_hz", "min_sm_clock_hz"}


def scenario_with(tmp_path: Path, power: str) -> Path:
    text = EXAMPLE.read_text() + f"power: {power}\n"
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_summary_and_json_carry_power(capsys: pytest.CaptureFixture[str]) -> None:
    s = predict(EXAMPLE).summary()
    assert set(s) >= POWER_KEYS
    assert s["energy_j"] > 0 and s["peak_power_w"] >= s["avg_power_w"] > 0
    assert main(["predict", str(EXAMPLE), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["summary"]) >= POWER_KEYS
    assert [row["rank"] for row in data["power"]] == [0, 1, 2, 3]
    assert sum(row["energy_j"] for row in data["power"]) == pytest.approx(data["summary"]["energy_j"])


def test_the_sensor_peak_lies_between_the_average_and_the_instantaneous_peak() -> None:
    """Over 100 ms (as NVML's readings move): a run shorter than that, repeated, shows its average;
    a longer one with phases of different power shows more than its average and less than its
    instantaneous peak."""
    short = predict(EXAMPLE).summary()
    assert short["makespan_s"] < 0.1
    assert short["peak_100ms_power_w"] == pytest.approx(short["avg_power_w"], rel=1e-9)
    long = predict(EXAMPLE.parent / "training-gpt3-13b-pp4-1f1b-h100x4.yaml", counters=False).summary()
    assert long["makespan_s"] > 0.5
    assert long["avg_power_w"] < long["peak_100ms_power_w"] < long["peak_power_w"]


def test_table_shows_power_and_energy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(EXAMPLE), "--power-cap-w", "250", "--rows", "0"]) == 0
    out = capsys.readouterr().out
    assert "power " in out and "cap 250 W" in out and "J per iteration" in out


def test_table_says_when_the_peak_is_above_the_default_limit(capsys: pytest.CaptureFixture[str]) -> None:
    # Unmanaged, the H100 GEMM runs at its calibrated rate and its reported power is above the
    # 700 W limit (a real board would throttle); by default the loop holds the limit and the note
    # goes away.
    h100 = EXAMPLE.parent / "gemm-allreduce-h100x4-sequential.yaml"
    assert predict(h100, power_managed=False).summary()["peak_power_w"] > 700.0
    assert main(["predict", str(h100), "--rows", "0", "--no-power-management"]) == 0
    out = capsys.readouterr().out
    assert "above the GPU's 700 W default power limit" in out and "(no power management)" in out
    assert main(["predict", str(h100), "--rows", "0"]) == 0
    out = capsys.readouterr().out
    assert "default power limit" not in out and "(default limit 700 W)" in out
    # The note on the window's averages comes exactly when the instantaneous peak is above the limit.
    r = predict(h100)
    window_ms = r.calibration.params.power_control_window_s * 1e3
    noted = f"holds the average over the last {window_ms:g} ms at it" in out
    assert noted == (r.summary()["peak_power_w"] > 700.0 * (1 + 1e-6))


def test_the_default_is_the_boards_default_limit(tmp_path: Path) -> None:
    """No power settings: the loop at the TDP, the same prediction as a cap at the TDP. A GEMM
    repeated (the steady state) loses time to the lowered clock: measured on an H100 at 700 W,
    1.60 ms and 1499 MHz against 1.37 ms in short bursts at the top clock (calibration/data,
    power and clock parts)."""
    path = gemm_file(tmp_path, "{}")
    default, capped = predict(path), predict(path, power_cap_w=700.0)
    s = default.summary()
    assert s["power_managed"] and s["power_cap_w"] is None and s["power_limit_w"] == 700.0
    assert default.ops["duration_s"].tolist() == capped.ops["duration_s"].tolist()
    unmanaged = predict(path, power_managed=False).summary()
    assert unmanaged["power_limit_w"] is None and unmanaged["compute_clock_slowdown"] == 0.0
    assert s["makespan_s"] == pytest.approx(1.60e-3, rel=0.10)
    assert s["makespan_s"] > 1.1 * unmanaged["makespan_s"]
    assert s["compute_clock_slowdown"] == pytest.approx(s["compute_slowdown"])


def test_the_table_explains_compute_faster_than_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """The A100's calibrated GEMM rate holds at 0.875 of its top clock (a GEMM repeated alone at
    400 W, thonking.ai); in the sequential GEMM + all-reduce iteration the loop runs the GEMM at the
    top clock, so compute comes out faster than alone, and the table says why."""
    seq = EXAMPLE.parent / "gemm-allreduce-a100x4-sequential.yaml"
    assert predict(seq).summary()["compute_slowdown"] < -0.05
    assert main(["predict", str(seq), "--rows", "0"]) == 0
    assert "faster than alone" in capsys.readouterr().out
    assert main(["predict", str(seq), "--rows", "0", "--no-power-management"]) == 0
    assert "faster than alone" not in capsys.readouterr().out


def test_unmanaged_refuses_what_sets_the_loop(tmp_path: Path) -> None:
    for block, field in (("{managed: false, cap_w: 300}", "power.cap_w"),
                         ("{managed: false, sm_clock_hz: 1.2e9}", "power.sm_clock_hz"),
                         ("{managed: false, start: idle}", "power.start")):
        with pytest.raises(OvsimError, match="turned off") as e:
            predict(scenario_with(tmp_path, block))
        assert e.value.field == field
    with pytest.raises(OvsimError, match="turned off"):
        predict(scenario_with(tmp_path, "{managed: false}"), power_cap_w=300.0)


def test_scenario_power_block_and_keyword_override(tmp_path: Path) -> None:
    p = scenario_with(tmp_path, "{cap_w: 200, sm_clock_hz: 1.2e9}")
    s = predict(p).summary()
    assert s["power_cap_w"] == 200 and s["sm_clock_lock_hz"] == 1.2e9
    assert s["avg_power_w"] <= 200 * (1 + 1e-9) or s["min_sm_clock_hz"] == 2.1e8
    assert s["avg_sm_clock_hz"] <= 1.2e9
    s2 = predict(p, power_cap_w=300.0).summary()
    assert s2["power_cap_w"] == 300 and s2["sm_clock_lock_hz"] == 1.2e9


def test_compare_lines_up_power_columns() -> None:
    ex = EXAMPLE.parent
    df = ovsim.api.compare([ex / "gemm-allreduce-a100x4-sequential.yaml", ex / "gemm-allreduce-a100x4-priority.yaml"])
    assert {"avg_power_w", "energy_j", "energy_delay_j_s"} <= set(df.columns)
    assert (df["energy_j"] > 0).all()


def test_compute_against_the_first_scenario_cancels_a_locked_clock(tmp_path: Path) -> None:
    """Closed form: under a clock locked at half the compute clock, the sequential run's GEMM (the
    only compute, clock-bound, FP16, a kernel of one's own) takes min(compute clock, its saturation
    clock) / min(half, its saturation clock) of its
    isolated time, so its compute slowdown against isolated kernels is that less one (+100%
    without saturation). Measured against that sequential run instead, as the overlap
    studies measure, the overlapped run's compute slowdown is its compute time over the
    sequential one's."""
    # H100: its GEMM efficiency holds at the compute clock (A100's was measured while throttled).
    half = ovsim.hw.spec.load_gpu("h100-sxm5-80gb").clocks.compute_clock_hz / 2
    paths = []
    for name in ("sequential", "overlapped"):
        src = EXAMPLE.parent / f"gemm-allreduce-h100x4-{name}.yaml"
        p = tmp_path / f"{name}.yaml"
        p.write_text(src.read_text() + f"power: {{sm_clock_hz: {half}}}\n")
        paths.append(p)
    df = ovsim.api.compare(paths)
    seq, over = df.iloc[0], df.iloc[1]
    full = 2 * half
    # The example's GEMM is a kernel of one's own (it has a tile): it saturates where its L2 reads bind.
    kernel = next(op.kernel for op in ovsim.api.predict(paths[0]).workload.ops if op.kind == "gemm")
    assert kernel is not None and kernel.saturation_clock_fraction is not None
    sat = kernel.saturation_clock_fraction * full
    assert seq["compute_slowdown"] == pytest.approx(min(full, sat) / min(half, sat) - 1, rel=1e-9)
    assert seq["compute_vs_first"] == 0.0
    assert over["compute_vs_first"] == pytest.approx(over["compute_s"] / seq["compute_s"] - 1, rel=1e-12)
    assert over["compute_vs_first"] < over["compute_slowdown"]


@pytest.mark.parametrize(("args", "words"), [
    # Out of the GPU's range: the scenario (its GPU) and the flag the value came from.
    (["--power-cap-w", "50"], [str(EXAMPLE), ": --power-cap-w: 50 W", "100-400 W"]),
    (["--power-cap-w", "401"], [str(EXAMPLE), ": --power-cap-w: 401 W", "100-400 W"]),
    (["--sm-clock-hz", "3e9"], [str(EXAMPLE), ": --sm-clock-hz: 3000 MHz", "210-1410 MHz"]),
    # Not a power limit on any GPU: the flag alone.
    (["--power-cap-w", "-5"], ["argument --power-cap-w: must be more than 0, got '-5'"]),
    (["--power-cap-w", "nan"], ["argument --power-cap-w: must be a finite number, got 'nan'"]),
    (["--sm-clock-hz", "inf"], ["argument --sm-clock-hz: must be a finite number, got 'inf'"]),
    (["--sm-clock-hz", "fast"], ["argument --sm-clock-hz: not a number: 'fast'"]),
])
def test_cli_rejects_settings_outside_the_range(args: list[str], words: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(EXAMPLE), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and err.startswith("ovsim: error: ")
    for w in words:
        assert w in err


@pytest.mark.parametrize(("power", "field"), [("{cap_w: 50}", "power.cap_w"),
                                               ("{cap: 100}", "power: unknown field 'cap'; did you mean 'cap_w'?")])
def test_bad_scenario_power_block_names_file_and_field(tmp_path: Path, power: str, field: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    p = scenario_with(tmp_path, power)
    assert main(["predict", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(p) in err and field in err


def test_api_rejects_a_clock_above_the_maximum() -> None:
    with pytest.raises(OvsimError) as e:
        predict(EXAMPLE, sm_clock_hz=1.5e9)
    assert e.value.field == "power.sm_clock_hz"


def gemm_file(tmp_path: Path, power: str) -> Path:
    p = tmp_path / "gemm.yaml"
    p.write_text("name: gemm\nsystem: hgx-h100\nranks: 1\n"
                 "ops: [{name: g, kind: gemm, m: 8192, n: 8192, k: 8192, precision: bf16}]\n" + f"power: {power}\n")
    return p


@pytest.mark.parametrize("mode", ["simulate", "analytic"])
def test_power_start_idle_holds_the_top_clock_until_the_window_fills(tmp_path: Path, mode: str) -> None:
    """One 8192^3 GEMM (1.6 ms) at the 700 W limit: in the steady state of a loop of them the loop
    holds ~1500 MHz (measured: 1499, calibration/data); from idle, the 70 ms window is nearly all
    idleness, so the GEMM keeps the 1980 MHz top clock, as the measured phases did for their first
    25-60 ms, and its calibrated time (its rate saturates below the top clock)."""
    steady = predict(gemm_file(tmp_path, "{cap_w: 700}"), mode=mode)
    idle = predict(gemm_file(tmp_path, "{cap_w: 700, start: idle}"), mode=mode)
    assert steady.summary()["power_start"] == "steady" and idle.summary()["power_start"] == "idle"
    assert idle.summary()["avg_sm_clock_hz"] == pytest.approx(1.98e9)
    assert steady.summary()["avg_sm_clock_hz"] < 1.6e9
    g_idle, g_steady = (float(r.ops.set_index("id").loc["g@r0", "duration_s"]) for r in (idle, steady))
    assert g_idle == pytest.approx(float(idle.ops.set_index("id").loc["g@r0", "isolated_s"]), rel=1e-6)
    assert g_steady > 1.1 * g_idle
    # The keyword overrides the file, as the other power keywords do.
    assert predict(gemm_file(tmp_path, "{cap_w: 700, start: idle}"), mode=mode,
                   power_start="steady").summary()["avg_sm_clock_hz"] < 1.6e9


def test_power_start_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = gemm_file(tmp_path, "{cap_w: 700}")
    assert main(["predict", str(path), "--rows", "0", "--power-start", "idle"]) == 0
    assert "cap 700 W, from idle" in capsys.readouterr().out
    bad = gemm_file(tmp_path, "{cap_w: 700, start: warm}")
    assert main(["predict", str(bad)]) != 0
    err = capsys.readouterr().err
    assert "power.start" in err and "Traceback" not in err
    # Without a cap the loop holds the default limit; with the loop turned off there is none to
    # start: refused, not ignored.
    assert main(["predict", str(gemm_file(tmp_path, "{start: idle}")), "--rows", "0"]) == 0
    assert "default limit 700 W, from idle" in capsys.readouterr().out
    free = gemm_file(tmp_path, "{managed: false, start: idle}")
    assert main(["predict", str(free)]) != 0
    err = capsys.readouterr().err
    assert "power.start" in err and "turned off" in err and len(err.strip().splitlines()) == 1
    assert main(["predict", str(gemm_file(tmp_path, "{}")), "--power-start", "idle", "--no-power-management"]) != 0
    assert "--power-start" in capsys.readouterr().err


def test_a_clock_above_the_calibration_counts_as_the_clock_part_not_contention() -> None:
    """The A100's GEMM rate is calibrated at the clock a GEMM repeated alone keeps at 400 W (0.875
    of the top); sequential, nothing overlaps and the loop runs it faster than alone: all of the
    (negative) slowdown is the clock's, none of it contention."""
    s = predict(Path(__file__).resolve().parents[1] / "examples" / "gemm-allreduce-a100x4-sequential.yaml",
                counters=False).summary()
    assert s["compute_slowdown"] < -0.05
    assert s["compute_clock_slowdown"] == pytest.approx(s["compute_slowdown"], abs=1e-9)


def test_the_contention_part_beside_a_faster_clock_is_what_contention_alone_costs() -> None:
    """Overlapped, the shaped A100 GEMM both gains from the loop's clock and loses to NCCL's blocks;
    the contention part is what the run without the loop (every kernel at its calibrated clock,
    nothing to split) loses."""
    path = Path(__file__).resolve().parents[1] / "examples" / "gemm-allreduce-a100x4-shaped.yaml"
    managed = predict(path, counters=False).summary()
    unmanaged = predict(path, counters=False, power_managed=False).summary()
    assert managed["compute_clock_slowdown"] < -0.05 and unmanaged["compute_clock_slowdown"] == 0.0
    contention = managed["compute_slowdown"] - managed["compute_clock_slowdown"]
    assert contention == pytest.approx(unmanaged["compute_slowdown"], abs=0.01)
