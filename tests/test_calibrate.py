"""Calibration: fits recover parameters planted by closed forms, files are new versions with
provenance, and inputs that cannot be fitted are refused with the missing quantity named."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from calibrate_builders import (
    GPU,
    H100_NAME,
    PRESSURE_PER_BLOCK,
    SHIPPED,
    contention_trace,
    kernel,
    overhead_trace,
    planted_gemms,
    planted_memory,
    sm_trace,
    table,
    tiny_adds,
)

from ovsim.calibrate import (
    FitReport,
    TraceInput,
    calibrate,
    contention_slowdown,
    fit_collectives,
    fit_contention,
    gemm_points,
    gemm_shapes,
    output_path,
    write_calibration,
    write_shipped,
)
from ovsim.cli import main
from ovsim.errors import OvsimError
from ovsim.hw.calib import CALIB_DIR, Parameters, load_calibration, newest_file, read_calib_file
from ovsim.hw.spec import SystemSpec, load_gpu
from ovsim.models import cost, nccl
from ovsim.models.op_prices import collective_parts
from ovsim.models.workload import CollectiveOpSpec, Knobs
from ovsim.replay import replay
from ovsim.traces.load import write_table
from ovsim.traces.table import TraceBundle, make_table


def test_slowdown_is_the_hbm_channel_closed_form() -> None:
    # A memory-bound kernel asking 0.9 of the channel beside a collective's pressure.
    p = Parameters().merged({"memory_kernel_efficiency": 0.9, "hbm_mix_efficiency": 1.0})
    assert contention_slowdown("elementwise", [("ll", 1)], {"ll": 0.3}, {}, p) == pytest.approx(0.9 / 0.7)
    # The share is per block: three blocks at 0.1 press as one at 0.3.
    assert contention_slowdown("elementwise", [("ll", 3)], {"ll": 0.1}, {}, p) == pytest.approx(0.9 / 0.7)
    # Past half the channel both are held at the fair half (equal weights).
    assert contention_slowdown("norm", [("ll", 1)], {"ll": 0.7}, {}, p) == pytest.approx(0.9 / 0.5)
    # A collective's pressure stops at 0.9 of HBM however many blocks it holds; none with no block.
    assert contention_slowdown("norm", [("ll", 64)], {"ll": 0.1}, {}, p) == pytest.approx(0.9 / 0.5)
    assert contention_slowdown("norm", [("ll", 0)], {"ll": 0.7}, {}, p) == 1.0
    # A compute kernel with no HBM traffic, or a protocol with no pressure, is not slowed.
    assert contention_slowdown("gemm", [("ll", 1)], {"ll": 0.7}, {}, p) == 1.0
    assert contention_slowdown("elementwise", [("simple", 1)], {"ll": 0.7}, {}, p) == 1.0
    # Demands that fit together do not slow each other.
    assert contention_slowdown("gemm", [("ll", 1)], {"ll": 0.3}, {"gemm": 0.6}, p) == 1.0


def test_contention_fit_recovers_the_planted_pressure_and_replay_then_matches() -> None:
    bundle = contention_trace()
    tr = TraceInput(bundle=bundle, label="synthetic", gpu=GPU)
    report = calibrate([tr], GPU, quantities=["contention"])
    assert report.parameters["nccl_memory_pressure"]["ll"] == pytest.approx(PRESSURE_PER_BLOCK, abs=0.005)
    rec = report.fits["contention"]
    assert rec["points"] == 6 and rec["naive_mape_pct"]["synthetic"] > 15
    # The engine, replaying with the fitted values, confirmed them.
    assert rec["engine_mape_pct_fitted"]["synthetic"] < 2.0 and "kept" not in rec
    # The full engine, with the fitted value, reproduces the slowed kernels; without it, naive.
    fitted = replay(bundle, gpu=GPU, counters=False, overrides=report.parameters).summary
    assert fitted["mape_pct"] < 2.0
    assert fitted["naive_mape_pct"] > 15


def test_contention_values_the_engine_does_worse_with_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit's one-kernel channel is a surrogate; when the full engine replays a trace worse with
    the fitted values than without, no memory contention is written."""
    import ovsim.calibrate.contention as cal

    monkeypatch.setattr(cal, "_replay_mape", lambda tr, d, overrides: 1e3)
    tr = TraceInput(bundle=contention_trace(), label="synthetic", gpu=GPU)
    values, rec = fit_contention([tr], load_calibration(load_gpu(GPU), GPU).params)
    assert values["nccl_memory_pressure"]["ll"] == 0.0 and "worse" in rec["kept"]
    assert rec["engine_mape_pct_fitted"]["synthetic"] == 1e3


def test_contention_fit_keeps_nccl_blocks_only_when_the_kernels_beside_them_lost_sms() -> None:
    p = load_calibration(load_gpu(GPU), GPU).params
    slowed, _ = fit_contention([sm_trace(200.0)], p)
    assert slowed["replay_collective_sm_fraction"] == 1.0
    untouched, record = fit_contention([sm_trace(100.0)], p)
    assert untouched["replay_collective_sm_fraction"] == 0.0
    by_fraction = record["mean_fit_mape_pct_by_sm_fraction"]
    # Held, the 16 blocks make a second wave: 116 tiles on 116 SMs, then 16 on 16, each wave's
    # tiles faster on fewer busy SMs (gemm_load_share s): 2 - s, (1 - s) * 100% above the 100 us.
    assert by_fraction["1.0"] == pytest.approx(100.0 * (1 - p.gemm_load_share), abs=2.0)
    assert by_fraction["0.0"] < 2.0


def test_collective_fit_recovers_latency_and_bandwidth() -> None:
    lat, bw = 20e-6, 100e9
    rows = []
    for i, size in enumerate((1 << 20, 4 << 20, 16 << 20)):
        bus = size * nccl.bus_factor("all_reduce", 8)
        # Peers arriving late make some instances slower; the fit takes each size's fastest.
        for j, extra in enumerate((0.0, 30e-6)):
            rows.append(kernel("ncclKernel_AllReduce_RING_SIMPLE_Sum_float", 1000.0 * (2 * i + j),
                               (lat + bus / bw + extra) * 1e6, stream=9, kind="collective", grid=8,
                               collective="all_reduce", protocol="Simple", algorithm="ring", message_bytes=size,
                               group_size=8))
    tr = TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="ar", gpu=GPU)
    values, record = fit_collectives([tr])
    got = values["nccl_fitted"]["all_reduce/ring/simple/8"]
    assert got["latency_s"] == pytest.approx(lat, rel=1e-3)
    assert got["bus_bandwidth_bytes_per_s"] == pytest.approx(bw, rel=1e-3)
    assert record["collectives"]["all_reduce/ring/simple/8"]["points"] == 3


def test_a_fitted_collective_replaces_nccls_own_model(h100_node: SystemSpec) -> None:
    gpu = load_gpu(GPU)
    plan = nccl.plan_collective("all_reduce", 64 << 20, 8, gpu, h100_node)
    key = f"all_reduce/{plan.algorithm}/{plan.protocol}/8"
    params = load_calibration(gpu, GPU).params.merged(
        {"nccl_fitted": {key: {"latency_s": 1e-3, "bus_bandwidth_bytes_per_s": 1e10}}})
    spec = CollectiveOpSpec.model_validate({"name": "ar", "kind": "all_reduce", "size_bytes": 64 << 20})
    _, flow, _ = collective_parts(spec, "g", list(range(8)), gpu, h100_node, params, Knobs())[0]
    assert flow.latency_s == 1e-3 and flow.rate_cap_bytes_per_s == 1e10
    # Another rank count is another collective: NCCL's model stays.
    _, flow4, _ = collective_parts(spec, "g", list(range(4)), gpu, h100_node, params, Knobs())[0]
    assert flow4.rate_cap_bytes_per_s != 1e10


def test_calibration_file_is_a_new_version_with_provenance(tmp_path: Path) -> None:
    trace = tmp_path / "run.parquet"
    write_table(contention_trace(), trace)
    out = tmp_path / "calib"
    assert main(["calibrate", str(trace), "--gpu", GPU, "-o", str(out), "--quiet"]) == 0
    files = sorted(out.glob("*.yaml"))
    v = SHIPPED + 1  # after the shipped versions
    assert [f.name for f in files] == [f"{GPU}.v{v}.yaml"]
    doc = yaml.safe_load(files[0].read_text())
    assert doc["gpu"] == GPU and doc["version"] == v
    (src,) = doc["provenance"]["traces"]
    assert src["files"][0]["path"] == "run.parquet" and len(src["files"][0]["sha256"]) == 64
    assert set(doc["parameters"]) <= set(doc["sources"])
    # The file loads on top of the shipped calibration and a replay records it.
    calib = load_calibration(load_gpu(GPU), GPU, (str(files[0]),))
    assert calib.params.nccl_memory_pressure["ll"] == pytest.approx(PRESSURE_PER_BLOCK, abs=0.005)
    assert calib.files[-1] == files[0].name
    # Old versions are never edited: the same path again is refused; the folder gets the next.
    assert main(["calibrate", str(trace), "--gpu", GPU, "-o", str(files[0]), "--quiet"]) == 2
    assert main(["calibrate", str(trace), "--gpu", GPU, "-o", str(out), "--quiet"]) == 0
    assert {f.name for f in out.glob("*.yaml")} == {f"{GPU}.v{v}.yaml", f"{GPU}.v{v + 1}.yaml"}


def test_write_with_a_base_carries_the_older_version_over(tmp_path: Path) -> None:
    base = tmp_path / "h100-sxm5-80gb.v7.yaml"
    base.write_text(yaml.safe_dump({"schema": "ovsim.calib/1", "gpu": GPU, "version": 7,
                                    "provenance": {"kind": "x"}, "parameters": {"attention_efficiency": 0.5},
                                    "sources": {"attention_efficiency": "s"}}))
    tr = TraceInput(bundle=contention_trace(), label="synthetic", gpu=GPU)
    report = calibrate([tr], GPU, quantities=["contention"])
    path = write_calibration(report, [tr], GPU, tmp_path, base=base)
    doc = yaml.safe_load(path.read_text())
    # The next version after both the folder's and the shipped ones, so no two files share one.
    shipped = newest_file(GPU, CALIB_DIR)
    assert shipped is not None
    assert path.name == f"{GPU}.v{max(7, read_calib_file(shipped).version) + 1}.yaml"
    assert doc["parameters"]["attention_efficiency"] == 0.5 and "nccl_memory_pressure" in doc["parameters"]


def test_write_with_a_base_keeps_the_keys_a_fit_did_not_touch(tmp_path: Path) -> None:
    """A fit of one precision on top of a file with several: the others stay (as loading both files
    would give), and the source tells the fitted keys from the carried ones."""
    base = tmp_path / "h100-sxm5-80gb.v7.yaml"
    base.write_text(yaml.safe_dump({"schema": "ovsim.calib/1", "gpu": GPU, "version": 7,
                                    "provenance": {"kind": "x"},
                                    "parameters": {"gemm_efficiency": {"bf16": 0.5, "fp8": 0.7}},
                                    "sources": {"gemm_efficiency": "MAMF"}}))
    tr = TraceInput(bundle=contention_trace(), label="synthetic", gpu=GPU)
    report = FitReport(parameters={"gemm_efficiency": {"bf16": 0.9}}, sources={"gemm_efficiency": "fit: gemm"})
    doc = yaml.safe_load(write_calibration(report, [tr], GPU, tmp_path, base=base).read_text())
    assert doc["parameters"]["gemm_efficiency"] == {"bf16": 0.9, "fp8": 0.7}
    assert doc["sources"]["gemm_efficiency"] == "bf16: fit: gemm; fp8: carried from the base (MAMF)"
    stacked = load_calibration(load_gpu(GPU), GPU, (str(base),)).params.merged(report.parameters)
    assert stacked.gemm_efficiency["fp8"] == doc["parameters"]["gemm_efficiency"]["fp8"]


def test_shipping_a_fit_the_newest_file_already_holds_writes_nothing() -> None:
    """The shared-trace scripts rerun without writing when nothing changed; a dry run never writes."""
    shipped = load_calibration(load_gpu(GPU), GPU).params.memory_kernel_efficiency
    tr = TraceInput(bundle=contention_trace(), label="t", gpu=GPU)
    before = sorted(p.name for p in CALIB_DIR.iterdir())
    same = FitReport(parameters={"memory_kernel_efficiency": shipped})
    assert write_shipped(same, [tr], GPU, "test") == (None, f"{GPU}.v{SHIPPED}.yaml already holds these values; "
                                                            "nothing written")
    other = FitReport(parameters={"memory_kernel_efficiency": shipped / 2})
    assert write_shipped(other, [tr], GPU, "test", dry_run=True) == (None, "dry run; nothing written")
    # A fit of some keys of a mapping (one precision's efficiency) is held when those keys are: the
    # file's other keys were not the fit's to give, so they do not make a new version.
    effs = load_calibration(load_gpu(GPU), GPU).params.gemm_efficiency
    some = FitReport(parameters={"gemm_efficiency": {"bf16": effs["bf16"]}})
    assert write_shipped(some, [tr], GPU, "test")[0] is None
    changed = FitReport(parameters={"gemm_efficiency": {"bf16": effs["bf16"] / 2}})
    assert write_shipped(changed, [tr], GPU, "test", dry_run=True) == (None, "dry run; nothing written")
    assert sorted(p.name for p in CALIB_DIR.iterdir()) == before


def test_output_names_must_carry_a_version(tmp_path: Path) -> None:
    with pytest.raises(OvsimError, match="output"):
        output_path(tmp_path / "mine.yaml", GPU)
    assert output_path(tmp_path / "mine.v2.yaml", GPU)[1] == 2


def test_bad_inputs_name_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Only isolated kernels: no contention data, no collectives.
    lone = tmp_path / "lone.parquet"
    write_table(TraceBundle(kernels=table([kernel("ew", t, 10.0) for t in (0.0, 20.0)]),
                            gpu_names={0: H100_NAME}), lone)
    assert main(["calibrate", str(lone), "--gpu", GPU, "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "nothing could be fitted" in err and "contention" in err and "collectives" in err
    assert main(["calibrate", str(lone), "--gpu", GPU, "-o", str(tmp_path), "--fit", "contention"]) == 2
    assert "contention: no compute kernel" in capsys.readouterr().err
    # A trace of another GPU than the file is for.
    assert main(["calibrate", str(lone), "--gpu", "a100-sxm4-80gb", "-o", str(tmp_path)]) == 2
    assert "lone.parquet" in (err := capsys.readouterr().err) and "not a100-sxm4-80gb" in err
    # Named as given: a folder's path, not its base name alone.
    assert f"{lone}: gpu:" in err
    assert main(["calibrate", str(lone), "--gpu", GPU, "-o", str(tmp_path), "--fit", "warp_speed"]) == 2
    assert "unknown quantity" in capsys.readouterr().err


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "run.parquet"
    write_table(contention_trace(), trace)
    assert main(["calibrate", str(trace), "--gpu", GPU, "-o", str(tmp_path / "c"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["file"].endswith(f"{GPU}.v{SHIPPED + 1}.yaml") and "contention" in out["fits"]
    assert out["skipped"]["collectives"]


def test_gemm_fit_recovers_the_planted_efficiency() -> None:
    """GEMMs timed at efficiency 0.6 with no time per wave: the fit must give 0.6 and 0 back."""
    tr = planted_gemms(((4096, 4096, 4096, 1024), (1024, 2048, 512, 128), (8192, 1024, 1024, 512)), 0.6, 0.0)
    report = calibrate([tr], GPU, quantities=["gemm"])
    assert report.parameters["gemm_efficiency"]["bf16"] == pytest.approx(0.6, abs=1e-3)
    assert report.parameters["gemm_tile_overhead_s"]["bf16"] == pytest.approx(0.0, abs=1e-8)
    assert report.fits["gemm"]["precisions"]["bf16"]["points"] == 3


def test_gemm_fit_recovers_a_planted_time_per_wave_and_the_cost_model_uses_it() -> None:
    """GEMMs timed at efficiency 0.7 plus 4 us per wave, over shapes whose main-loop work per wave
    spans 64x (short K to long K): the fit must give 0.7 and 4 us back, where the efficiency alone
    cannot fit them. Then the cost model, with those values, prices a GEMM by the same closed form."""
    eff, tile_s = 0.7, 4e-6
    tr = planted_gemms(((4096, 4096, 256, 1024), (4096, 4096, 4096, 1024), (2048, 2048, 128, 256),
                        (8192, 8192, 8192, 4096), (1024, 1024, 16384, 64)), eff, tile_s)
    report = calibrate([tr], GPU, quantities=["gemm"])
    assert report.parameters["gemm_efficiency"]["bf16"] == pytest.approx(eff, abs=2e-3)
    assert report.parameters["gemm_tile_overhead_s"]["bf16"] == pytest.approx(tile_s, rel=0.02)
    rec = report.fits["gemm"]["precisions"]["bf16"]
    assert rec["fit_mape_pct"] < 0.5 < rec["fit_mape_pct_efficiency_only"]
    gpu = load_gpu(GPU)
    p = load_calibration(gpu, GPU).params
    fitted = p.merged({"gemm_efficiency": {"bf16": eff}, "gemm_tile_overhead_s": {"bf16": tile_s}})
    # 128x256 tiles, one per H100 SM: 64 x 16 = 1024 tiles in ceil(1024 / 132) = 8 waves.
    g = cost.gemm(8192, 4096, 512, "bf16", gpu, fitted, tile=(128, 256, 64))
    per_sm = gpu.peak_flops_per_s("bf16") / gpu.sm.count * eff
    expected = p.kernel_overhead_s + 8 * (2.0 * 128 * 256 * 512 / per_sm + tile_s)
    assert g.isolated_s == pytest.approx(expected, rel=1e-12)


def test_a_memory_bound_gemm_says_nothing_of_the_main_loops_efficiency() -> None:
    """An aligned GEMM whose operands and output, each moved once at the peak HBM bandwidth, take
    longer than its main loop at efficiency 1 is left out of the grid-frame fit: 1 x 8192 x 8192
    moves 134 MB (40 us on an H100) for 0.13 GFLOP (0.14 us at the BF16 peak). 4096^3 (101 MB,
    30 us, against 139 us of main loop) stays."""
    from ovsim.calibrate import gemm_points

    tr = planted_gemms(((1, 8192, 8192, 128), (4096, 4096, 4096, 1024)), 0.7, 0.0)
    pts = gemm_points([tr])["bf16"]
    assert [p[3] for p in pts] == [2.0 * 4096**3]


def test_gemm_shapes_are_the_fits_gemms_by_their_problem() -> None:
    """The kernels gemm_points counts, by (m, n, k, batch, measured s, aligned) from their
    operator's shapes, in launch order; the same count."""
    tr = planted_gemms(((4096, 4096, 4096, 1024), (1024, 2048, 516, 128)), 0.6, 0.0)
    shapes = gemm_shapes([tr])
    assert [r[:4] for r in shapes["bf16"]] == [(4096, 4096, 4096, 1), (1024, 2048, 516, 1)]
    assert [r[5] for r in shapes["bf16"]] == [True, False]  # k = 516 is 1,032 bytes: not on 16
    assert [r[4] for r in shapes["bf16"]] == [p[0] for p in gemm_points([tr])["bf16"]]


@pytest.mark.slow
def test_the_scenario_frame_gemm_fit_recovers_what_scenarios_were_priced_at() -> None:
    """GEMMs timed as scenario GEMMs of their problems (the cost model's library choice) at an
    efficiency of 0.65 and 2 us per wave: --gemm-frame scenario finds both back, its points lie
    on the fitted prices, and the CLI offers exactly the frames the fit knows."""
    from ovsim.calibrate import GEMM_FRAMES
    from ovsim.cli import parser
    from ovsim.models.gemm_library import best_gemm

    gpu = load_gpu(GPU)
    planted = load_calibration(gpu, GPU).params.merged(
        {"gemm_efficiency": {"bf16": 0.65}, "gemm_tile_overhead_s": {"bf16": 2e-6}})
    rows = []
    for i, (m, n, k) in enumerate(((1024, 1024, 1024), (2048, 4096, 1024), (4096, 4096, 4096), (8192, 2048, 8192))):
        t = best_gemm(m, n, k, "bf16", gpu, planted).isolated_s
        row = kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 1e4 * i, t * 1e6, kind="gemm", grid=132,
                     host_op=f"aten::mm[[{m}, {k}], [{k}, {n}]]")
        rows.append({**row, "block_x": 384, "registers_per_thread": 168})
    tr = TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="g", gpu=GPU)
    report = calibrate([tr], GPU, quantities=["gemm"], points=True, gemm_frame="scenario")
    assert report.parameters["gemm_efficiency"]["bf16"] == pytest.approx(0.65, abs=2e-3)
    assert report.parameters["gemm_tile_overhead_s"]["bf16"] == pytest.approx(2e-6, rel=0.02)
    assert report.fits["gemm"]["frame"] == "scenario"
    assert report.points is not None and len(report.points) == 4
    assert report.points["fitted"].to_numpy() == pytest.approx(report.points["measured"].to_numpy(), rel=5e-3)
    with pytest.raises(OvsimError, match="unknown GEMM frame"):
        calibrate([tr], GPU, quantities=["gemm"], gemm_frame="tiles")
    argv = ["calibrate", "t.json", "--gpu", GPU, "-o", "c.v1.yaml", "--gemm-frame"]
    assert [parser().parse_args([*argv, f]).gemm_frame for f in GEMM_FRAMES] == list(GEMM_FRAMES)
    assert main([*argv, "tiles"]) == 2


def test_memory_fit_recovers_planted_fractions_and_leaves_out_what_it_cannot_trust() -> None:
    """At 0.7 of the peak, below the published achievable fraction (0.88 in the default file,
    from bandwidth tests), the achievable fraction is the published one and the efficiency
    0.7 / 0.88; softmax at 0.25 of the peak gets its own; the four distractors are left out, by
    reason."""
    report = calibrate([planted_memory(0.7, 0.25)], GPU, quantities=["memory"])
    ach = report.parameters["hbm_achievable_fraction"]
    default = read_calib_file(newest_file("default", CALIB_DIR)).parameters["hbm_achievable_fraction"]
    assert ach == default == 0.88
    assert report.parameters["memory_kernel_efficiency"] == pytest.approx(0.7 / ach, abs=2e-3)
    assert report.parameters["memory_kind_efficiency"] == {"softmax": pytest.approx(0.25 / ach, abs=2e-3)}
    rec = report.fits["memory"]
    assert rec["left_out"] == {"moves less than 2x the L2": 1, "operator call launched several kernels": 2,
                               "overlapped communication": 1}
    assert rec["classes"]["elementwise"]["points"] == 3 and rec["classes"]["elementwise"]["fit_mape_pct"] < 0.1


def test_memory_fit_raises_the_achievable_fraction_to_what_kernels_reached() -> None:
    """Streaming kernels measured at 0.95 of the peak: HBM must carry that much, so the achievable
    fraction becomes 0.95 and the efficiency 1; the cost model then prices a streaming kernel of
    the same size by the planted closed form."""
    report = calibrate([planted_memory(0.95, 0.25)], GPU, quantities=["memory"])
    assert report.parameters["hbm_achievable_fraction"] == pytest.approx(0.95, abs=1e-3)
    assert report.parameters["memory_kernel_efficiency"] == 1.0
    assert report.parameters["memory_kind_efficiency"]["softmax"] == pytest.approx(0.25 / 0.95, abs=2e-3)
    gpu = load_gpu(GPU)
    p = load_calibration(gpu, GPU).params
    fitted = p.merged(report.parameters)
    n_bytes = 3 * 2 * 2**26
    d = cost.memory_bound(n_bytes, gpu, fitted)
    expected = p.kernel_overhead_s + n_bytes / (gpu.memory.bandwidth_bytes_per_s * report.parameters[
        "hbm_achievable_fraction"])
    assert d.isolated_s == pytest.approx(expected, rel=1e-12)
    soft = cost.memory_bound(n_bytes, gpu, fitted, kind="softmax")
    assert soft.isolated_s > 3 * d.isolated_s


def test_overhead_fit_is_the_constant_of_least_relative_error() -> None:
    """Six tiny adds of 1.25 us and four of 3.1 us. A constant c between them has a mean absolute
    relative error of (6 (c - 1.25) / 1.25 + 4 (3.1 - c) / 3.1) / 10, rising with c (slope
    6 / 1.25 > 4 / 3.1), so the least is at c = 1.25 us (error 4 x 1.85 / 3.1 / 10 = 23.9%)."""
    report = calibrate([overhead_trace([1.25] * 6 + [3.1] * 4)], GPU, quantities=["overhead"])
    assert report.parameters == {"kernel_overhead_s": pytest.approx(1.25e-6, rel=1e-9)}
    rec = report.fits["overhead"]
    assert rec["points"] == 10 and rec["fit_mape_pct"] == pytest.approx(4 * 1.85 / 3.1 / 10 * 100, abs=0.01)
    assert rec["left_out"] == {"operator call launched several kernels": 2, "overlapped communication": 1,
                               "takes more than 0.1 us at the peak HBM bandwidth": 1}
    assert rec["median_us_other_classes"] == {"copy": {"kernels": 1, "median_us": 100.0}}


def test_overhead_fit_of_whole_microsecond_durations_is_a_trimmed_mean() -> None:
    """Durations in whole microseconds: five at 3, five at 4 and one stray 20. Cutting 10% of 11
    (one) from each end leaves four 3s and five 4s: (12 + 20) / 9 = 3.556 us, where a median
    would say 4."""
    report = calibrate([overhead_trace([3.0] * 5 + [4.0] * 5 + [20.0])], GPU, quantities=["overhead"])
    assert report.parameters["kernel_overhead_s"] == pytest.approx(32 / 9 * 1e-6, abs=1e-9)
    assert report.fits["overhead"]["method"].startswith("mean trimmed by 0.1")


def test_overhead_fit_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "tiny.parquet"
    write_table(overhead_trace([1.25] * 6 + [3.1] * 4).bundle, trace)
    assert main(["calibrate", str(trace), "--gpu", GPU, "-o", str(tmp_path), "--fit", "overhead"]) == 0
    out = capsys.readouterr().out
    assert "kernel_overhead_s: 1.25e-06" in out
    assert "overhead from 10 tiny elementwise kernels (p10-p90 1.25-3.1 us); fit error 23.9%" in out


def test_overhead_fit_without_enough_tiny_kernels_says_why() -> None:
    with pytest.raises(OvsimError, match="9 elementwise kernels small enough") as e:
        calibrate([overhead_trace([2.0] * 9)], GPU, quantities=["overhead"])
    assert e.value.field == "overhead"


def test_memory_fit_builds_on_the_overhead_fitted_with_it() -> None:
    """Streaming kernels planted with a 0.8 us overhead, and ten tiny adds of 0.8 us: fitted
    together, the memory fit prices kernels at the fitted overhead and recovers the planted
    fraction with no error; at the shipped overhead it would not."""
    planted = planted_memory(0.7, 0.25, ko=0.8e-6)
    rows = pd.concat([planted.bundle.kernels, table(tiny_adds([0.8] * 10))], ignore_index=True)
    tr = TraceInput(bundle=TraceBundle(kernels=make_table({c: rows[c].tolist() for c in rows.columns}),
                                       gpu_names={0: H100_NAME}), label="m", gpu=GPU)
    both = calibrate([tr], GPU, quantities=["overhead", "memory"])
    assert both.parameters["kernel_overhead_s"] == pytest.approx(0.8e-6, rel=1e-9)
    assert both.fits["memory"]["classes"]["elementwise"]["fit_mape_pct"] < 0.01
    alone = calibrate([tr], GPU, quantities=["memory"])
    assert alone.fits["memory"]["classes"]["elementwise"]["fit_mape_pct"] > 0.05


def test_memory_fit_without_operator_types_says_why() -> None:
    rows = [kernel("add", 0.0, 100.0, host_op="aten::add[[4096], [4096]]")]
    tr = TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="m", gpu=GPU)
    with pytest.raises(OvsimError, match="no memory-bound kernel could be fitted") as e:
        calibrate([tr], GPU, quantities=["memory"])
    assert e.value.field == "memory"
