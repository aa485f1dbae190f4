"""Calibration of power and clocks, and the fitted points: power weights recovered from a log aligned
to the trace, clock shares and the power loop's window from planted trajectories, fits' points on
their measured values, and the GEMM fits' reports (split from test_calibrate.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from calibrate_builders import (
    GPU,
    H100_NAME,
    PLANTED_HBM_J_PER_BYTE,
    PLANTED_IDLE_W,
    PLANTED_MEMORY_W,
    PLANTED_TENSOR_W,
    WALL_ORIGIN_S,
    contention_trace,
    kernel,
    overhead_trace,
    planted_gemms,
    planted_memory,
    power_trace,
    ramp,
    table,
    write_smi_log,
)

from ovsim.calibrate import (
    TraceInput,
    calibrate,
    fit_clock_share,
    fit_control_window,
    gemm_precision,
    memory_clock_time_s,
)
from ovsim.cli import main
from ovsim.errors import OvsimError
from ovsim.hw.calib import load_calibration
from ovsim.hw.spec import load_gpu
from ovsim.models import nccl
from ovsim.traces.load import write_table
from ovsim.traces.table import TraceBundle


def test_power_fit_recovers_planted_weights_from_a_wall_clock_aligned_log(tmp_path: Path) -> None:
    from ovsim.calibrate import PowerLog, fit_power_logs

    bundle = power_trace()
    log = tmp_path / "smi.csv"
    write_smi_log(log, bundle)
    # Instantaneous samples (window 0): each sample is the planted power at its instant.
    tr = TraceInput(bundle=bundle, label="power", gpu="a100-sxm4-80gb",
                    power_logs=(PowerLog(str(log), window_s=0.0),))
    params = load_calibration(load_gpu("a100-sxm4-80gb"), "a100-sxm4-80gb").params
    values, record = fit_power_logs([tr], "a100-sxm4-80gb", params)
    assert values["power_idle_w"] == pytest.approx(PLANTED_IDLE_W, rel=1e-3)
    assert values["power_tensor_w"]["default"] == pytest.approx(PLANTED_TENSOR_W, rel=1e-3)
    assert values["power_memory_w"] == pytest.approx(PLANTED_MEMORY_W, rel=1e-3)
    assert values["power_hbm_j_per_byte"] == pytest.approx(PLANTED_HBM_J_PER_BYTE, rel=1e-3)
    # No CUDA-core work and no link traffic in the run: those weights are not identifiable.
    assert "power_fp32_w" not in values and "power_link_j_per_byte" not in values
    assert record["not_identifiable"] == ["power_fp32_w", "power_link_j_per_byte"]
    assert record["fit_mape_pct"] < 0.1 < record["shipped_model_mape_pct"]
    # Only GPU 3's samples inside the trace are used (GPU 0 ran nothing traced).
    assert 0 < record["samples"] <= len(range(90))


def test_power_fit_through_the_cli_writes_provenance(tmp_path: Path) -> None:
    from ovsim.traces.load import write_table

    bundle = power_trace()
    trace = tmp_path / "run.parquet"
    write_table(bundle, trace)
    log = tmp_path / "smi.csv"
    write_smi_log(log, bundle)
    out = tmp_path / "calib"
    out.mkdir()
    assert main(["calibrate", str(trace), "--gpu", "a100-sxm4-80gb", "-o", str(out), "--fit", "power",
                 "--power-log", str(log), "--power-window-s", "0", "--quiet"]) == 0
    doc = yaml.safe_load(next(out.glob("*.yaml")).read_text())
    assert doc["parameters"]["power_idle_w"] == pytest.approx(PLANTED_IDLE_W, rel=1e-3)
    entry = doc["provenance"]["traces"][0]
    assert entry["power_logs"][0]["path"] == "smi.csv" and len(entry["power_logs"][0]["sha256"]) == 64


def test_a_power_log_that_misses_the_trace_is_refused(tmp_path: Path) -> None:
    from ovsim.calibrate import PowerLog, fit_power_logs

    bundle = power_trace()
    log = tmp_path / "smi.csv"
    write_smi_log(log, bundle, shift_s=3600.0)  # an hour off: local time read as UTC
    tr = TraceInput(bundle=bundle, label="power", gpu="a100-sxm4-80gb", power_logs=(PowerLog(str(log)),))
    params = load_calibration(load_gpu("a100-sxm4-80gb"), "a100-sxm4-80gb").params
    with pytest.raises(OvsimError, match=r"no sample falls inside the trace.*--power-offset-s"):
        fit_power_logs([tr], "a100-sxm4-80gb", params)
    with pytest.raises(OvsimError, match="no power log"):
        fit_power_logs([TraceInput(bundle=bundle, label="power", gpu="a100-sxm4-80gb")], "a100-sxm4-80gb", params)


def test_a_power_log_of_a_multi_host_trace_is_refused(tmp_path: Path) -> None:
    """Two ranks on device 3 ran on two hosts: one host's log cannot be attributed to a rank."""
    from ovsim.calibrate import PowerLog, fit_power_logs

    bundle = power_trace()
    log = tmp_path / "smi.csv"
    write_smi_log(log, bundle)
    other = bundle.kernels.assign(rank=1)
    two = TraceBundle(kernels=pd.concat([bundle.kernels, other], ignore_index=True),
                      gpu_names={0: "NVIDIA A100-SXM4-80GB", 1: "NVIDIA A100-SXM4-80GB"}, wall_origin_s=WALL_ORIGIN_S)
    tr = TraceInput(bundle=two, label="two hosts", gpu="a100-sxm4-80gb", power_logs=(PowerLog(str(log)),))
    params = load_calibration(load_gpu("a100-sxm4-80gb"), "a100-sxm4-80gb").params
    with pytest.raises(OvsimError, match="ranks 0 and 1 both ran on device 3"):
        fit_power_logs([tr], "a100-sxm4-80gb", params)


# -- fitted points (calibrate(points=True), calibrate --plot) ----------------------------------------


def test_points_of_planted_fits_lie_on_the_measured_values() -> None:
    """Kernels timed by each fit's closed form: what the written parameters predict for every point
    the fits used is the planted (measured) time, to the parameters' rounding; each point says which
    fit, group and trace it came from."""
    gemms = planted_gemms(((4096, 4096, 1024, 1024), (4096, 4096, 4096, 1024), (2048, 2048, 512, 256),
                           (8192, 8192, 8192, 4096), (1024, 1024, 16384, 64)), 0.7, 4e-6)
    memory = planted_memory(0.7, 0.25)
    report = calibrate([gemms, memory], GPU, quantities=["gemm", "memory"], points=True)
    pts = report.points
    assert pts is not None and list(pts.columns) == ["quantity", "group", "trace", "unit", "measured", "fitted",
                                                     "baseline"]
    assert pts.groupby(["quantity", "group", "trace"]).size().to_dict() == {
        ("gemm", "bf16", "g"): 5, ("memory", "elementwise", "m"): 3, ("memory", "softmax", "m"): 3}
    assert (pts["unit"] == "s").all() and pts["baseline"].isna().all()
    assert pts["fitted"].to_numpy() == pytest.approx(pts["measured"].to_numpy(), rel=5e-3)
    # The memory distractors (each 10x too fast) are not among the points.
    assert pts.loc[pts["quantity"] == "memory", "measured"].min() > 50e-6


def test_points_of_a_collective_fit_follow_latency_plus_bytes_over_bandwidth() -> None:
    lat, bw = 20e-6, 100e9
    rows = []
    for i, size in enumerate((1 << 20, 4 << 20, 16 << 20)):
        bus = size * nccl.bus_factor("all_reduce", 8)
        rows.append(kernel("ncclKernel_AllReduce_RING_SIMPLE_Sum_float", 1000.0 * i, (lat + bus / bw) * 1e6, stream=9,
                           kind="collective", grid=8, collective="all_reduce", protocol="Simple", algorithm="ring",
                           message_bytes=size, group_size=8))
    tr = TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="ar", gpu=GPU)
    pts = calibrate([tr], GPU, quantities=["collectives"], points=True).points
    assert pts is not None and pts["group"].tolist() == ["all_reduce/ring/simple/8"] * 3
    expected = [lat + s * nccl.bus_factor("all_reduce", 8) / bw for s in (1 << 20, 4 << 20, 16 << 20)]
    assert sorted(pts["fitted"]) == pytest.approx(expected, rel=1e-3)


def test_points_of_the_contention_fit_carry_the_naive_prediction() -> None:
    report = calibrate([TraceInput(bundle=contention_trace(), label="synthetic", gpu=GPU)], GPU,
                       quantities=["contention"], points=True)
    pts = report.points
    assert pts is not None and len(pts) == report.fits["contention"]["points"]
    err = ((pts["fitted"] - pts["measured"]).abs() / pts["measured"]).mean() * 100
    naive = ((pts["baseline"] - pts["measured"]).abs() / pts["measured"]).mean() * 100
    assert err == pytest.approx(report.fits["contention"]["fit_mape_pct"]["synthetic"], abs=0.01)
    assert naive == pytest.approx(report.fits["contention"]["naive_mape_pct"]["synthetic"], abs=0.01)


def test_points_of_a_power_fit_against_the_model_before_it(tmp_path: Path) -> None:
    from ovsim.calibrate import PowerLog

    bundle = power_trace()
    log = tmp_path / "smi.csv"
    write_smi_log(log, bundle)
    tr = TraceInput(bundle=bundle, label="power", gpu="a100-sxm4-80gb", power_logs=(PowerLog(str(log), window_s=0.0),))
    report = calibrate([tr], "a100-sxm4-80gb", quantities=["power"], points=True)
    pts = report.points
    assert pts is not None and len(pts) == report.fits["power"]["samples"]
    assert (pts["unit"] == "W").all() and set(pts["group"]) == {"smi.csv"}
    assert pts["fitted"].to_numpy() == pytest.approx(pts["measured"].to_numpy(), rel=1e-3)
    before = ((pts["baseline"] - pts["measured"]).abs() / pts["measured"]).mean() * 100
    assert before == pytest.approx(report.fits["power"]["shipped_model_mape_pct"], abs=1e-3)


def test_no_points_unless_asked() -> None:
    assert calibrate([overhead_trace([1.25] * 10)], GPU, quantities=["overhead"]).points is None


def test_gemm_and_memory_fits_report_their_errors_on_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gemms = planted_gemms(((4096, 4096, 1024, 1024), (4096, 4096, 4096, 1024), (2048, 2048, 512, 256),
                           (8192, 8192, 8192, 4096), (1024, 1024, 16384, 64)), 0.7, 4e-6)
    memory = planted_memory(0.7, 0.25)
    for name, tr in (("g.parquet", gemms), ("m.parquet", memory)):
        write_table(tr.bundle, tmp_path / name)
    assert main(["calibrate", str(tmp_path / "g.parquet"), str(tmp_path / "m.parquet"), "--gpu", GPU, "-o",
                 str(tmp_path), "--fit", "gemm,memory"]) == 0
    out = capsys.readouterr().out
    assert ("gemm bf16 from 5 GEMMs (main-loop efficiency and a fixed time per wave of tiles): fit error 0.0% "
            "(fitted on; not a prediction error)") in out
    assert "memory softmax from 3 kernels: 0.25 of the HBM peak; fit error 0.0%" in out
    assert "memory elementwise from 3 kernels: 0.7 of the HBM peak; fit error 0.0%" in out


def test_gemm_fit_gives_unaligned_gemms_their_own_efficiency() -> None:
    """Aligned GEMMs planted at 0.7 plus 4 us per wave, and GEMMs whose k or n is not on 16 bytes
    (258 and 1030 x 2 bytes, 2050 x 2 bytes) at 0.1 with the same time per wave: the fit must give
    both efficiencies back and keep the unaligned ones out of the aligned fit."""
    import dataclasses

    aligned = planted_gemms(((4096, 4096, 1024, 1024), (4096, 4096, 4096, 1024), (2048, 2048, 512, 256),
                             (8192, 8192, 8192, 4096), (1024, 1024, 16384, 64)), 0.7, 4e-6)
    odd = dataclasses.replace(planted_gemms(((4096, 4096, 258, 1024), (2048, 2050, 4096, 256),
                                             (1024, 1024, 1030, 64)), 0.1, 4e-6), label="odd")
    report = calibrate([aligned, odd], GPU, quantities=["gemm"], points=True)
    assert report.parameters["gemm_efficiency"]["bf16"] == pytest.approx(0.7, abs=2e-3)
    assert report.parameters["gemm_tile_overhead_s"]["bf16"] == pytest.approx(4e-6, rel=0.02)
    assert report.parameters["gemm_unaligned_efficiency"]["bf16"] == pytest.approx(0.1, abs=2e-3)
    rec = report.fits["gemm"]["precisions"]["bf16"]
    assert rec["points"] == 5 and rec["unaligned"]["points"] == 3 and rec["unaligned"]["fit_mape_pct"] < 1.0
    pts = report.points
    assert pts is not None
    assert pts.groupby(["group", "trace"]).size().to_dict() == {("bf16", "g"): 5, ("bf16 unaligned", "odd"): 3}
    assert pts["fitted"].to_numpy() == pytest.approx(pts["measured"].to_numpy(), rel=0.02)


def test_too_few_unaligned_gemms_are_recorded_not_fitted() -> None:
    aligned = planted_gemms(((4096, 4096, 256, 1024), (4096, 4096, 4096, 1024), (2048, 2048, 128, 256)), 0.6, 0.0)
    odd = planted_gemms(((4096, 4096, 258, 1024),), 0.1, 0.0)
    report = calibrate([aligned, odd], GPU, quantities=["gemm"])
    assert "gemm_unaligned_efficiency" not in report.parameters
    assert report.fits["gemm"]["precisions"]["bf16"]["unaligned"] == {
        "points": 1, "fitted": False, "why": "fewer than 3 unaligned GEMMs"}


def test_gemm_precision_from_kernel_names() -> None:
    assert gemm_precision("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "bf16"
    assert gemm_precision("volta_sgemm_32x128_tn") is None
    # CUTLASS names carry the instruction, not always the input type.
    assert gemm_precision("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nt_align4>(") == "tf32"
    assert gemm_precision("cutlass_80_tensorop_h16816gemm_256x128_32x3_nn_align8") == "fp16"
    assert gemm_precision("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn") == "fp16"
    assert gemm_precision("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn") == "bf16"
    assert gemm_precision("cutlass_80_tensorop_d884gemm_64x64_16x4_nn_align1") == "fp64"
    assert gemm_precision("cutlass_80_tensorop_s16816gemm_64x64_32x6_nn") is None  # input type unsaid
    assert gemm_precision("ampere_sgemm_128x64_nn") is None


def test_gemm_precision_from_the_operators_input_types_where_the_name_says_none() -> None:
    """cuBLAS's generated kernels (the harness's H100 GEMMs: nvjet_sm90_tst_..., _hsh_...,
    _qqtst_...) name no input type; the profiler's record of the operator's inputs does. FP32
    inputs do not say whether tensor cores ran them, and a CUDA-core kernel keeps its None."""
    bf16 = "['c10::BFloat16', 'c10::BFloat16']"
    assert gemm_precision("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", bf16) == "bf16"
    assert gemm_precision("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT", "['c10::Half', 'c10::Half']") == "fp16"
    assert gemm_precision("nvjet_sm90_qqtst_128x64_128x8_1x2_h_bz_algo2_TNT",
                          "['c10::Float8_e4m3fn', 'c10::Float8_e4m3fn', 'float', 'float']") == "fp8"
    assert gemm_precision("nvjet_sm90_sss_128x64", "['float', 'float']") is None
    assert gemm_precision("nvjet_sm90_x", "['c10::BFloat16', 'c10::Half']") is None  # mixed: unsaid
    assert gemm_precision("nvjet_sm90_x", "not a list") is None
    assert gemm_precision("volta_sgemm_32x128_tn", "['c10::Half', 'c10::Half']") is None
    # The name wins where it says one.
    assert gemm_precision("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x256x32", bf16) == "tf32"


@pytest.mark.slow
def test_the_library_gemm_fit_recovers_planted_parameters() -> None:
    """Times made by the scenario's own GEMM (the cost model's library choice) at an efficiency
    of 0.75 and 3 us per wave, on four square shapes: the fit finds both back, with no error."""
    from ovsim.calibrate import fit_library_gemm
    from ovsim.hw.calib import load_calibration
    from ovsim.hw.spec import load_gpu
    from ovsim.models.gemm_library import best_gemm

    gpu = load_gpu("h100-sxm5-80gb")
    base = load_calibration(gpu, "h100-sxm5-80gb").params
    planted = base.merged({"gemm_efficiency": {"fp16": 0.75}, "gemm_tile_overhead_s": {"fp16": 3e-6}})
    problems = [(s, s, s, 1, best_gemm(s, s, s, "fp16", gpu, planted).isolated_s) for s in (1024, 2048, 4096, 8192)]
    eff, tile_s, err = fit_library_gemm(problems, "fp16", gpu, base)
    assert eff == pytest.approx(0.75, abs=0.002)
    assert tile_s == pytest.approx(3e-6, rel=0.02)
    assert err < 1e-3
    with pytest.raises(OvsimError, match="no fp16 GEMM"):
        fit_library_gemm([], "fp16", gpu, base)


@pytest.mark.parametrize("share", [0.0, 0.15, 0.7, 1.0])
def test_clock_share_fit_recovers_a_planted_share(share: float) -> None:
    clocks = np.linspace(1.2e9, 2.0e9, 40)
    t = memory_clock_time_s(clocks, 300e-6, share, 1.83e9)
    fit = fit_clock_share(clocks, t, 1.83e9)
    assert fit["share"] == pytest.approx(share, abs=1e-9)
    assert fit["time_at_reference_s"] == pytest.approx(300e-6, rel=1e-9)
    assert fit["rms_relative_residual"] < 1e-9


def test_clock_share_of_a_time_rising_with_the_clock_is_zero() -> None:
    # No share in [0, 1] makes a kernel slower at higher clocks: the bound holds the fit at 0.
    clocks = np.array([1.2e9, 1.5e9, 1.8e9])
    fit = fit_clock_share(clocks, np.array([1.0, 1.1, 1.2]) * 1e-4, 1.83e9)
    assert fit["share"] == 0.0


@pytest.mark.parametrize("clocks,times,field", [
    ([1.5e9, 1.5e9], [1e-4, 1.1e-4], "clock_hz"),
    ([1.5e9], [1e-4], "clock_hz"),
    ([1.5e9, 1.6e9], [1e-4, -1e-4], "duration_s"),
])
def test_clock_share_fit_refuses_data_that_cannot_tell(clocks: list[float], times: list[float], field: str) -> None:
    with pytest.raises(OvsimError) as e:
        fit_clock_share(clocks, times, 1.83e9)
    assert e.value.field == field


def test_fit_control_window_recovers_the_window_of_the_trajectories() -> None:
    """Closed form: phases measured as the ramp of a 70 ms window (one with a steady clock 100 MHz
    off, which the fit must ignore) are fitted to 70 ms on a 10 ms grid, with no error there."""
    t = np.linspace(0.0, 0.4, 200)
    measured = {"a": (t, ramp(0.07, t)), "b": (t, ramp(0.07, t, low=1.4e9) - 1e8)}

    def simulate(window_s: float, phase: str) -> tuple[np.ndarray, np.ndarray]:
        at = np.linspace(0.0, 0.5, 5001)
        return at, ramp(window_s, at, low=1.5e9 if phase == "a" else 1.4e9)

    fit = fit_control_window(measured, simulate, [x / 100 for x in range(2, 16)], 0.3, baseline_s=0.01)
    assert fit["window_s"] == pytest.approx(0.07)
    assert fit["rms_mhz"] < 1.0
    assert fit["rms_mhz_at_baseline_window"]["rms_mhz"] > 50.0


def test_fit_control_window_rejects_phases_without_a_steady_stretch() -> None:
    t = np.linspace(0.0, 0.2, 50)
    with pytest.raises(OvsimError, match="before and after"):
        fit_control_window({"a": (t, ramp(0.07, t))}, lambda w, p: (t, ramp(w, t)), [0.05], 0.3)
