"""Calibration: fits recover parameters planted by closed forms, files are new versions with
provenance, and inputs that cannot be fitted are refused with the missing quantity named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from ovsim.calibrate import (
    FitReport,
    TraceInput,
    calibrate,
    contention_slowdown,
    fit_clock_share,
    fit_collectives,
    fit_contention,
    fit_control_window,
    gemm_points,
    gemm_precision,
    gemm_shapes,
    memory_clock_time_s,
    output_path,
    write_calibration,
    write_shipped,
)
from ovsim.cli import main
from ovsim.errors import OvsimError
from ovsim.hw.calib import CALIB_DIR, Parameters, load_calibration, newest_file, read_calib_file
from ovsim.hw.spec import SystemSpec, load_gpu
from ovsim.models import cost, nccl
from ovsim.models.workload import CollectiveOpSpec, Knobs, _collective_ops
from ovsim.replay import replay
from ovsim.traces.load import write_table
from ovsim.traces.table import TraceBundle, make_table

GPU = "h100-sxm5-80gb"
H100_NAME = "NVIDIA H100 80GB HBM3"
# Planted: a resident LL collective keeps this share of HBM busy, with its 2 blocks (channels): the
# calibration's share is per block.
PRESSURE = 0.35
PRESSURE_PER_BLOCK = PRESSURE / 2
# memory_kernel_efficiency of the shipped H100 calibration: the share of HBM a memory-bound kernel asks.
MEM_EFF = load_calibration(load_gpu(GPU), GPU).params.memory_kernel_efficiency
# kernel_overhead_s of the shipped H100 calibration, in microseconds: the time a kernel moves no data.
OVERHEAD_US = load_calibration(load_gpu(GPU), GPU).params.kernel_overhead_s * 1e6
STREAMING_GRID = 1056
# The newest shipped version of the GPU's calibration file.
SHIPPED = max(int(p.name.split(".v")[-1].removesuffix(".yaml")) for p in CALIB_DIR.glob(f"{GPU}.v*.yaml"))


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    keys = sorted({k for r in rows for k in r})
    return make_table({k: [r.get(k) for r in rows] for k in keys})


def kernel(name: str, start_us: float, dur_us: float, *, stream: int = 7, kind: str = "elementwise",
           grid: int = 4, **extra: Any) -> dict[str, Any]:
    return {"rank": 0, "stream": stream, "name": name, "kind": kind, "start_s": start_us * 1e-6,
            "duration_s": dur_us * 1e-6, "grid_x": grid, "grid_y": 1, "grid_z": 1, "block_x": 128, "block_y": 1,
            "block_z": 1, "registers_per_thread": 32, "shared_mem_bytes": 0, **extra}


def planted_slowdown(need: float, pressure: float) -> float:
    """A streaming kernel needing ``need`` of the HBM channel beside a fixed ``pressure``, by the
    shipped H100 calibration's HBM latency law (docs/design.md), written out here on its own: with
    utilizations of the peak ``x = need * a`` and ``p = pressure * a`` (``a`` the achievable
    fraction), latency ``g(u) = (1 - u / K) ** -Q``, the kernel (all its time waiting on memory)
    slows by ``g(U) / g(x)`` where ``U = x / slowdown + p``; then it gets at most ``1 - pressure``
    of the channel (max-min, the pressure below the fair half)."""
    from scipy.optimize import brentq

    params = load_calibration(load_gpu(GPU), GPU).params
    k, q, a = params.hbm_latency_capacity, params.hbm_latency_exponent, params.hbm_achievable_fraction
    x, p = need * a, pressure * a

    def g(u: float) -> float:
        return float((1 - u / k) ** -q)

    u = brentq(lambda u: u - x * g(x) / g(u) - p, x, x + p)
    rate = min(need * g(x) / g(u), 1 - pressure)
    return need / rate


def contention_trace() -> TraceBundle:
    """A 10 us streaming kernel alone three times, then six times beside an LL all-reduce, each
    slowed as one HBM channel shared with the collective's pressure slows it
    (:func:`planted_slowdown`): the kernel moves data for all but the per-kernel overhead, so over
    its 10 us it needs MEM_EFF x (10 - OVERHEAD) / 10 of the channel, and stretches by the
    slowdown."""
    need = MEM_EFF * (10.0 - OVERHEAD_US) / 10.0
    assert need > 1 - PRESSURE  # so the planted pressure slows it
    slowed = 10.0 * planted_slowdown(need, PRESSURE)
    # 1056 blocks of 4 warps: 8 blocks an SM, one wave beside the collective's blocks, and enough
    # warps in flight to stream at HBM's rate (Little's law, memory_warp_bytes_per_s).
    rows = [kernel("ew", t, 10.0, grid=STREAMING_GRID) for t in (0.0, 20.0, 40.0)]
    rows.append(kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 100.0, 400.0, stream=9, kind="collective", grid=2,
                       collective="all_reduce", protocol="LL", algorithm="ring"))
    rows += [kernel("ew", 110.0 + 40.0 * i, slowed, grid=STREAMING_GRID) for i in range(6)]
    return TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME})


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


def sm_trace(overlapped_us: float) -> TraceInput:
    """A one-wave GEMM (132 blocks, one per H100 SM) alone three times at 100 us, then five times
    beside an all-reduce whose 16 NCCL blocks take whole SMs (640 threads x 96 registers), measured
    at ``overlapped_us``: 200 us is the second wave those 16 SMs force, 100 us is no SM lost."""
    def gemm(t: float, d: float) -> dict[str, Any]:
        return kernel("gemm", t, d, kind="gemm", grid=132, block_x=256, registers_per_thread=255)

    rows = [gemm(t, 100.0) for t in (0.0, 200.0, 400.0)]
    rows.append(kernel("ncclKernel_AllReduce_RING_SIMPLE_Sum_float", 1000.0, 1800.0, stream=9, kind="collective",
                       grid=16, block_x=640, registers_per_thread=96, collective="all_reduce", protocol="Simple",
                       algorithm="ring"))
    rows += [gemm(1100.0 + 300.0 * i, overlapped_us) for i in range(5)]
    return TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="sm", gpu=GPU)


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
    _, flow, _ = _collective_ops(spec, "g", list(range(8)), gpu, h100_node, params, Knobs())[0]
    assert flow.latency_s == 1e-3 and flow.rate_cap_bytes_per_s == 1e10
    # Another rank count is another collective: NCCL's model stays.
    _, flow4, _ = _collective_ops(spec, "g", list(range(4)), gpu, h100_node, params, Knobs())[0]
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
    assert main(["calibrate", str(lone), "--gpu", GPU, "-o", str(tmp_path), "--fit", "warp_speed"]) == 2
    assert "unknown quantity" in capsys.readouterr().err


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "run.parquet"
    write_table(contention_trace(), trace)
    assert main(["calibrate", str(trace), "--gpu", GPU, "-o", str(tmp_path / "c"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["file"].endswith(f"{GPU}.v{SHIPPED + 1}.yaml") and "contention" in out["fits"]
    assert out["skipped"]["collectives"]


def planted_gemms(shapes: tuple[tuple[int, int, int, int], ...], eff: float, tile_s: float) -> TraceInput:
    """BF16 GEMMs (M, N, K, grid) timed by the cost model's wave form: t = overhead + waves x
    (blocks_per_sm x flops_per_block / (peak / SMs x eff) + tile_s), at two blocks per SM (256
    threads x 128 registers fill half of the 65,536 registers)."""
    gpu = load_gpu(GPU)
    p = load_calibration(gpu, GPU).params
    per_sm = gpu.peak_flops_per_s("bf16") / gpu.sm.count * eff
    rows = []
    for i, (m, n, k, grid) in enumerate(shapes):
        waves = -(-grid // (gpu.sm.count * 2))
        t = p.kernel_overhead_s + waves * (2 * (2.0 * m * n * k / grid) / per_sm + tile_s)
        row = kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 1e4 * i, t * 1e6, kind="gemm", grid=grid,
                     host_op=f"aten::mm[[{m}, {k}], [{k}, {n}]]")
        rows.append({**row, "block_x": 256, "registers_per_thread": 128})
    return TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="g", gpu=GPU)


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


def planted_memory(fraction: float, softmax_fraction: float, ko: float | None = None) -> TraceInput:
    """Memory-bound kernels on an H100 timed by the cost model's streaming form, t = overhead +
    bytes / (peak HBM x fraction), bytes counted by hand: bf16 add (two inputs, one output) and
    softmax (one input, one output), all moving more than 2x the 50 MiB L2. Then kernels the fit
    must leave out, each timed 10x too fast to fit anything: one moving less than 2x the L2, two
    launched by one operator call, one beside an all-reduce. The overhead is the shipped one unless
    ``ko`` is given."""
    gpu = load_gpu(GPU)
    ko = load_calibration(gpu, GPU).params.kernel_overhead_s if ko is None else ko
    peak = gpu.memory.bandwidth_bytes_per_s
    rows: list[dict[str, Any]] = []

    def add(n: int, start_us: float, call: int, speed: float = 1.0, f: float = fraction) -> None:
        t_s = ko + 3 * 2 * n / (peak * f) / speed
        rows.append(kernel("add", start_us, t_s * 1e6, host_op=f"aten::add[[{n}], [{n}], []]",
                           host_types="['c10::BFloat16', 'c10::BFloat16', 'Scalar']", host_op_id=call))

    for i, n in enumerate((2**25, 2**26, 2**27)):
        add(n, 1e4 * i, i)
    for i, (r, c) in enumerate(((16384, 4096), (32768, 4096), (8192, 16384))):
        t_s = ko + 2 * 2 * r * c / (peak * softmax_fraction)
        rows.append(kernel("softmax", 1e5 + 1e4 * i, t_s * 1e6, host_op=f"aten::_softmax[[{r}, {c}], [], []]",
                           host_types="['c10::BFloat16', 'Scalar', 'Scalar']", host_op_id=10 + i))
    add(2**20, 2e5, 20, speed=10.0)
    add(2**26, 2.1e5, 21, speed=10.0)
    add(2**26, 2.2e5, 21, speed=10.0)
    add(2**26, 3e5, 30, speed=10.0)
    rows.append(kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 3e5, 1e4, stream=9, kind="collective", grid=2,
                       collective="all_reduce", protocol="LL", algorithm="ring"))
    return TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="m", gpu=GPU)


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


def tiny_adds(durations_us: list[float], first_call: int = 100, start_us: float = 5e5) -> list[dict[str, Any]]:
    """bf16 adds of 1024 elements (6 KiB: 2 ns at the H100's peak HBM bandwidth), one per
    operator call, timed as given."""
    return [kernel("add", start_us + 100.0 * i, d, host_op="aten::add[[1024], [1024], []]",
                   host_types="['c10::BFloat16', 'c10::BFloat16', 'Scalar']", host_op_id=first_call + i)
            for i, d in enumerate(durations_us)]


def overhead_trace(durations_us: list[float]) -> TraceInput:
    """Tiny adds timed as given, and what the overhead fit must not count: a tiny copy (recorded
    beside it), a tiny add beside an all-reduce, two tiny adds of one operator call, and an add
    moving 6 MiB (2 us at the peak bandwidth), each timed 100 us."""
    rows = tiny_adds(durations_us)
    rows.append(kernel("copy", 1e4, 100.0, host_op="aten::copy_[[1024], [1024], []]",
                       host_types="['c10::BFloat16', 'c10::BFloat16', 'Scalar']", host_op_id=1))
    rows += tiny_adds([100.0], first_call=2, start_us=2e4)
    rows += [{**r, "host_op_id": 3} for r in tiny_adds([100.0, 100.0], start_us=3e4)]
    rows.append(kernel("add", 4e4, 100.0, host_op="aten::add[[1048576], [1048576], []]",
                       host_types="['c10::BFloat16', 'c10::BFloat16', 'Scalar']", host_op_id=4))
    rows.append(kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1.99e4, 500.0, stream=9, kind="collective",
                       grid=2, collective="all_reduce", protocol="LL", algorithm="ring"))
    return TraceInput(bundle=TraceBundle(kernels=table(rows), gpu_names={0: H100_NAME}), label="o", gpu=GPU)


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

# Planted power parameters: none of them is a shipped value, so recovering them shows the fit read
# the log, not the calibration it started from.
PLANTED_IDLE_W = 61.0
PLANTED_TENSOR_W = 530.0
PLANTED_MEMORY_W = 140.0
PLANTED_HBM_J_PER_BYTE = 20e-12
WALL_ORIGIN_S = 1_790_000_000.0


def power_trace() -> TraceBundle:
    """One rank on device 3, starting 5 s into the trace's clock: 0.5 s idle, 1 s of back-to-back
    GEMMs, 0.5 s idle, 1 s of wide and 1 s of narrow streaming kernels (different ratios of SM
    slots to HBM traffic, so the memory and HBM weights are told apart), 0.5 s idle."""
    rows: list[dict[str, Any]] = []
    t_us = 5.5e6
    for i in range(10):
        rows.append(kernel(f"gemm{i}", t_us, 1e5, kind="gemm", grid=2160, device=3, block_x=256))
        t_us += 1e5
    t_us += 5e5
    for grid in (4320, 108):
        for i in range(10):
            rows.append(kernel(f"ew{grid}_{i}", t_us, 1e5, grid=grid, device=3))
            t_us += 1e5
    rows.append(kernel("tail", t_us + 5e5, 10.0, device=3))
    df = table(rows)
    df["rank"] = 0
    return TraceBundle(kernels=df, gpu_names={0: "NVIDIA A100-SXM4-80GB"}, wall_origin_s=WALL_ORIGIN_S)


def planted_power(counters: pd.DataFrame, t: Any, hbm_peak: float) -> Any:
    """The planted closed form at simulation times ``t``, at the compute clock (dynamic scale 1):
    idle + tensor x u_tensor + memory x u_memory + HBM energy x bytes/s."""
    import numpy as np

    def at(name: str) -> Any:
        c = counters[(counters["counter"] == name) & (counters["rank"] == 0)].sort_values("time_s", kind="stable")
        tt, v = c["time_s"].to_numpy(float), c["value"].to_numpy(float)
        keep = np.append(tt[1:] != tt[:-1], True)
        tt, v = tt[keep], v[keep]
        return v[np.clip(np.searchsorted(tt, t, side="right") - 1, 0, len(tt) - 1)]

    hbm = np.minimum(at("hbm_bytes_per_s"), hbm_peak)
    return (PLANTED_IDLE_W + PLANTED_TENSOR_W * at("sm_tensor_fraction") + PLANTED_MEMORY_W * at("sm_memory_fraction")
            + PLANTED_HBM_J_PER_BYTE * hbm)


def write_smi_log(path: Path, bundle: TraceBundle, shift_s: float = 0.0) -> None:
    """An nvidia-smi CSV of GPUs 3 (the traced one) and 0 (not traced), a sample every 50 ms from the
    trace's start, stamped in UTC wall time, power from the planted closed form."""
    import datetime as dt

    import numpy as np

    r = replay(bundle, counters=True, power=True)
    gpu = load_gpu("a100-sxm4-80gb")
    trace_t = np.arange(5.0, 9.5, 0.05)
    watts = planted_power(r.timeline.counters, trace_t - r.clock_offset_s, gpu.memory.bandwidth_bytes_per_s)
    lines = ["timestamp, index, power.draw [W], clocks.sm [MHz]"]
    for t, w in zip(trace_t, watts, strict=True):
        stamp = dt.datetime.fromtimestamp(WALL_ORIGIN_S + t + shift_s, dt.UTC).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        lines.append(f"{stamp}, 3, {w:.4f} W, {gpu.clocks.compute_clock_hz / 1e6:.0f} MHz")
        lines.append(f"{stamp}, 0, 400.00 W, 1410 MHz")
    path.write_text("\n".join(lines) + "\n")


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


def ramp(window_s: float, t: np.ndarray, top: float = 2.0e9, low: float = 1.5e9) -> np.ndarray:
    """A clock that holds until half the window has passed, then falls linearly to ``low`` at the
    full window: a stand-in trajectory whose shape is set by the window alone."""
    x = np.clip((t - 0.5 * window_s) / (0.5 * window_s), 0.0, 1.0)
    return top - (top - low) * x


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
