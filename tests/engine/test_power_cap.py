"""Power in the engine: the cap and clock-lock loop, energy, and the published power figures.

Sources and what each figure checks:

- A100 GEMM throughput at 400 W (258 TFLOPS randn, thonking.ai; 271 TFLOPS MAMF, ml-engineering):
  the tensor power weight was fitted on the thonking.ai point and the GEMM efficiency on MAMF, so
  these are consistency checks of the fit and of the engine's clock loop, not validations.
- Lee et al., arXiv 2507.03114, read through a secondary reading note of the paper:
  overlap raises peak power by up to 25%; under a 100 W cap overlapped execution is 107% slower.
  Nothing was fitted on them, so they are the (weak, secondary-source) validations here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ovsim.api import Result, predict
from ovsim.engine.power import POWER_COUNTER
from ovsim.models.occupancy import blocks_per_sm
from ovsim.scenario import Scenario, load_scenario

EXAMPLES = Path(__file__).parent.parent.parent / "examples"


def gemm_scenario(system: str, m: int = 8192, n: int = 8192, k: int = 8192, **extra: object) -> Scenario:
    return Scenario.model_validate({
        "name": f"gemm-{m}x{n}x{k}", "system": system, "ranks": 1,
        "ops": [{"name": "g", "kind": "gemm", "m": m, "n": n, "k": k, "precision": "bf16", **extra}],
    })


def tflops(result: Result, m: int = 8192, n: int = 8192, k: int = 8192) -> float:
    d = float(result.ops.set_index("id").loc["g@r0", "duration_s"])
    return 2.0 * m * n * k / d / 1e12


def segments(result: Result, rank: int, counter: str) -> pd.DataFrame:
    """The counter's piecewise-constant pieces of positive length: value, start, end."""
    c = result.timeline.counters
    c = c[(c["rank"] == rank) & (c["counter"] == counter)]
    t = c["time_s"].to_numpy(float)
    v = c["value"].to_numpy(float)
    end = result.timeline.makespan_s
    nxt = np.append(t[1:], end)
    keep = nxt > t
    return pd.DataFrame({"value": v[keep], "start": t[keep], "end": nxt[keep]})


# -- throughput at the board limit ----------------------------------------------------------------


@pytest.mark.parametrize("system", ["dgx-a100-80gb", "a100x4"])
def test_large_bf16_gemm_on_a100_is_power_limited_at_400_w(system: str) -> None:
    """Consistency check (fitted on this figure, see the module docstring): an 8192^3 BF16 GEMM
    under the 400 W default limit runs below the top clock, draws the limit, and delivers within 5%
    of the published random-input range, 258 (thonking.ai) to 271 TFLOPS (MAMF). On the 80 GB part
    it is the fit itself; the 40 GB part differs only by its idle power (56 vs 88 W), so it throttles
    less."""
    r = predict(gemm_scenario(system), power_cap_w=400.0)
    s = r.summary()
    assert s["min_sm_clock_hz"] < r.gpu.clocks.max_sm_clock_hz
    power = segments(r, 0, POWER_COUNTER)["value"]
    assert power.max() <= 400.0 * (1 + 1e-9)
    assert power.max() >= 0.97 * 400.0
    assert 258.0 * 0.95 <= tflops(r) <= 271.0 * 1.05


def test_unmanaged_the_a100_gemm_runs_as_calibrated_and_the_limit_throttles_it() -> None:
    """No power-limit loop: nothing throttles, and the GEMM takes its calibrated time, at the clock
    MAMF's efficiency holds at (0.919 of 1410 MHz), where it draws more than 400 W. Under the 400 W
    limit it runs at the clock its power was fitted to draw 400 W at (thonking.ai's randn GEMM,
    258/295 of 1410 MHz; consistency check)."""
    r = predict(gemm_scenario("dgx-a100-80gb"), power_managed=False)
    ops = r.ops.set_index("id")
    assert ops.loc["g@r0", "duration_s"] == pytest.approx(ops.loc["g@r0", "isolated_s"], rel=1e-9)
    assert r.summary()["peak_power_w"] > 400.0
    assert r.summary()["power_cap_w"] is None and r.summary()["power_limit_w"] is None
    capped = predict(gemm_scenario("dgx-a100-80gb"), power_cap_w=400.0)
    assert capped.summary()["avg_sm_clock_hz"] == pytest.approx(258.0 / 295.0 * 1410e6, abs=15e6)


def test_h100_full_load_power_is_in_the_published_range() -> None:
    """A dense GEMM is the full load of an H100 SXM: repeated under its 700 W default limit it
    draws close to the limit on average (the power-limit loop holds the average over its window;
    the GEMM's full waves draw a little more than its tail wave)."""
    s = predict(gemm_scenario("hgx-h100"), power_cap_w=700.0).summary()
    assert 0.9 * 700.0 <= s["avg_power_w"] <= 700.0 * (1 + 1e-9)
    assert s["peak_power_w"] <= 1.02 * 700.0


# -- the loop ------------------------------------------------------------------------------------


def test_cap_holds_on_average_over_a_repeated_iteration() -> None:
    """The example iteration (a few ms, far shorter than the loop's window) repeated: each GPU's
    average power over it is at most the cap, above the lowest clock."""
    r = predict(EXAMPLES / "gemm-allreduce-a100x4-priority.yaml", power_cap_w=250.0)
    f_min = r.gpu.clocks.min_sm_clock_hz
    for rank in range(4):
        p = segments(r, rank, POWER_COUNTER)
        clk = segments(r, rank, "sm_clock_hz")
        assert len(p) and len(clk)
        avg = float(np.sum(p["value"] * (p["end"] - p["start"])) / np.sum(p["end"] - p["start"]))
        assert avg <= 250.0 * (1 + 1e-9) or float(clk["value"].min()) <= f_min


def alternating(system: str, cycles: int, gemms: int = 4, adds: int = 9) -> Scenario:
    ops: list[dict[str, object]] = []
    for c in range(cycles):
        ops += [{"name": f"g{c}_{i}", "kind": "gemm", "m": 8192, "n": 8192, "k": 8192, "precision": "bf16"}
                for i in range(gemms)]
        ops += [{"name": f"a{c}_{i}", "kind": "elementwise", "bytes": 3 * 2**29} for i in range(adds)]
    return Scenario.model_validate({"name": "mix", "system": system, "ranks": 1, "ops": ops})


def clock_of(r: Result, prefix: str) -> np.ndarray:
    """The SM clock at the middle of each op whose name starts with ``prefix``."""
    clk = segments(r, 0, "sm_clock_hz")
    ops = r.ops[r.ops["name"].str.startswith(prefix)]
    mid = (ops["start_s"] + ops["duration_s"] / 2).to_numpy(float)
    idx = np.searchsorted(clk["start"].to_numpy(float), mid, side="right") - 1
    return clk["value"].to_numpy(float)[idx]


def test_phases_shorter_than_the_window_share_one_clock() -> None:
    """Measured on an H100 and an H200 (calibration/data, clock part): 4 GEMMs (6 ms) then 9
    streaming adds (5 ms), over and over at the 700 W limit, ran at one clock: the GEMMs' and the
    adds' median clocks agree to 1 MHz, and the clock the probes counted moved within 163 MHz
    (5-95%, H100) from period to period. The loop averages over its window, so the GEMMs and
    adds of a repeat get nearly the same clock, below the top clock and above the GEMM's alone (a
    clock following each moment would give the adds the top clock). With the measured flat
    voltage a few watts move the clock several grid steps, so the medians may differ by up to 2.5%
    of the clock (the model's: 2%)."""
    r = predict(alternating("hgx-h100", 3), power_cap_w=700.0)
    g, a = clock_of(r, "g"), clock_of(r, "a")
    assert np.ptp(np.concatenate([g, a])) <= 163e6
    assert abs(float(np.median(g)) - float(np.median(a))) <= 0.025 * float(np.median(g))
    alone = predict(gemm_scenario("hgx-h100"), power_cap_w=700.0).summary()["avg_sm_clock_hz"]
    assert alone < g[0] < r.gpu.clocks.max_sm_clock_hz


def test_a_long_run_holds_the_cap_over_each_window() -> None:
    """Over 300 ms of the alternation (longer than the 70 ms window), the run's average power is at
    most the cap, and the power averaged over any window at most 2% above it: the loop sets each
    period's clock from the window that ended before it, and a window placed anywhere holds up to
    half a cycle (6 ms of GEMMs in 70 ms, ~400 W above the adds) more than the one the loop saw."""
    r = predict(alternating("hgx-h100", 30), power_cap_w=700.0)
    window = r.calibration.params.power_control_window_s
    p = segments(r, 0, POWER_COUNTER)
    t = np.linspace(0.0, r.timeline.makespan_s, 4001)
    idx = np.clip(np.searchsorted(p["start"].to_numpy(float), t, side="right") - 1, 0, len(p) - 1)
    inst = p["value"].to_numpy(float)[idx]
    step = t[1] - t[0]
    n = round(window / step)
    avg = np.convolve(inst, np.ones(n) / n, mode="valid")
    assert r.timeline.makespan_s > 3 * window
    assert avg.max() <= 700.0 * 1.02
    assert float(np.mean(inst)) <= 700.0 * (1 + 1e-3)


def test_from_idle_the_clock_holds_until_the_window_fills() -> None:
    """From an idle start (PowerSettings(start="idle")) the loop keeps the top clock until
    the window's average power reaches the cap: a fraction (cap - idle) / (P_top - idle) of the
    window, with P_top the GEMM's power at the top clock (closed form of a sliding average over a
    step), rounded up to the next control period. The measured H100 walk-down started 40-60 ms
    into a GEMM phase (calibration/data, clock part)."""
    from ovsim.engine.machine import build_machine
    from ovsim.engine.power import PowerConfig
    from ovsim.engine.sim import Engine, EngineOptions
    from ovsim.hw.power import PowerSettings, power_model

    sc = Scenario.model_validate({"name": "g", "system": "hgx-h100", "ranks": 1, "ops": [
        {"name": f"g{i}", "kind": "gemm", "m": 8192, "n": 8192, "k": 8192, "precision": "bf16"} for i in range(150)]})
    from ovsim.api import build
    wl, system, gpu, calib = build(sc, "g")
    model = power_model(gpu, calib.params)
    cfg = PowerConfig(model=model, settings=PowerSettings(cap_w=700.0, start="idle"))
    tl = Engine(wl, build_machine(system, gpu, calib.params, n_ranks=1),
                EngineOptions(power=cfg)).run()
    c = tl.counters
    clk = c[(c["counter"] == "sm_clock_hz") & (c["value"] < gpu.clocks.max_sm_clock_hz)]
    first_drop = float(clk["time_s"].min())
    pw = c[(c["counter"] == POWER_COUNTER) & (c["time_s"] > 0) & (c["time_s"] < first_drop)]
    p_top = float(pw["value"].max())  # the full waves at the top clock
    period, window = model.control_period_s, model.control_window_s
    expected = (700.0 - model.idle_w) / (p_top - model.idle_w) * window
    # The GEMMs' tail waves draw less than p_top, so the window fills a little later than the
    # closed form of a constant load says: at most one period more.
    assert expected <= first_drop <= expected + 2 * period


def test_lower_caps_are_slower_and_draw_less() -> None:
    prev_t, prev_p = 0.0, float("inf")
    for cap in (400.0, 300.0, 200.0, 100.0):
        s = predict(gemm_scenario("a100x4"), power_cap_w=cap).summary()
        assert s["makespan_s"] > prev_t and s["avg_power_w"] < prev_p
        prev_t, prev_p = s["makespan_s"], s["avg_power_w"]


def test_memory_bound_work_does_not_follow_the_clock() -> None:
    """HBM bandwidth has its own clock: a streaming kernel under a low cap keeps its time, where a
    GEMM slows."""
    sc = Scenario.model_validate({"system": "a100x4", "ranks": 1,
                                  "ops": [{"name": "e", "kind": "elementwise", "bytes": 4.0e9}]})
    free = predict(sc).ops.set_index("id").loc["e@r0", "duration_s"]
    capped = predict(sc, power_cap_w=120.0)
    assert capped.ops.set_index("id").loc["e@r0", "duration_s"] == pytest.approx(free, rel=1e-9)
    assert capped.summary()["min_sm_clock_hz"] < capped.gpu.clocks.max_sm_clock_hz


@pytest.mark.parametrize("mode", ["simulate", "analytic"])
def test_part_of_a_norm_kernels_time_follows_a_locked_clock(mode: str) -> None:
    """The H100 file's measured clock share of layer norms: locked at 1200 MHz a norm takes
    (1 - share) + share * 1830/1200 of its time at the 1830 MHz compute clock (closed form of the
    law); a streaming add, whose share is not listed, keeps its time."""
    ops = [{"name": "n", "kind": "norm", "bytes": 4.0e9}, {"name": "e", "kind": "elementwise", "bytes": 4.0e9}]
    sc = Scenario.model_validate({"system": "hgx-h100", "ranks": 1, "mode": mode, "ops": ops})
    r = predict(sc, sm_clock_hz=1.2e9)
    share = r.calibration.params.memory_kind_clock_share["norm"]
    assert 0 < share < 1 and "elementwise" not in r.calibration.params.memory_kind_clock_share
    got = r.ops.set_index("id")
    expected = (1 - share) + share * 1.83e9 / 1.2e9
    assert got.loc["n@r0", "duration_s"] == pytest.approx(got.loc["n@r0", "isolated_s"] * expected, rel=1e-9)
    assert got.loc["e@r0", "duration_s"] == pytest.approx(got.loc["e@r0", "isolated_s"], rel=1e-9)


def test_locked_clock_scales_a_compute_bound_kernel_exactly() -> None:
    """H100's calibrated efficiency holds at its 1830 MHz compute clock, and its BF16 GEMMs stop
    speeding up above the measured saturation clock (below 1830); locked at 1200 MHz (well within
    the 700 W limit) a GEMM takes saturation/1200 of its time."""
    r = predict(gemm_scenario("hgx-h100", 4096, 4096, 4096), sm_clock_hz=1.2e9)
    sat_hz = r.calibration.params.power_tensor_saturation_clock_hz["bf16"]
    assert 1.2e9 < sat_hz < 1.83e9
    g = r.ops.set_index("id").loc["g@r0"]
    assert g["duration_s"] == pytest.approx(g["isolated_s"] * sat_hz / 1.2e9, rel=1e-9)
    assert g["slowed_by"] == "lowered clock"
    assert r.summary()["avg_sm_clock_hz"] == pytest.approx(1.2e9, rel=1e-9)


def saturating_gemm(tmp_path: Path, saturation_hz: float, m: int = 512, k: int = 8192,
                    tile: list[int] | None = None) -> Scenario:
    """The H100 GEMM scenario with its BF16 tensor rate saturating at ``saturation_hz`` and its
    efficiency holding at the 1830 MHz compute clock, on the library's kernel or the library's
    kernel of ``tile`` (a plain kernel of one's own is held to its L2 reads as well)."""
    (tmp_path / "sat.v1.yaml").write_text(yaml.safe_dump({
        "schema": "ovsim.calib/1", "gpu": "*", "version": 1, "provenance": {},
        "parameters": {"power_tensor_saturation_clock_hz": {"bf16": saturation_hz},
                       "power_tensor_reference_clock_fraction": 1.0},
        "sources": {"power_tensor_saturation_clock_hz": "test", "power_tensor_reference_clock_fraction": "test"}}))
    sc = gemm_scenario("hgx-h100", m, m, k, split_k=1, **({"tile": tile, "efficiency": "library"} if tile else {}))
    return sc.model_copy(update={"calibration": [str(tmp_path / "sat.v1.yaml")]})


@pytest.mark.parametrize("lock_hz,expected_ratio", [
    (1.2e9, 1.5e9 / 1.2e9),  # below saturation: the clock's ratio to it
    (1.6e9, 1.0),  # above saturation, below the reference clock: no slower
    (1.98e9, 1.0),  # above both: no faster
])
def test_a_saturating_tensor_kernel_follows_the_clock_only_below_its_saturation(
        tmp_path: Path, lock_hz: float, expected_ratio: float) -> None:
    """Closed form of the law: rate min(c, sat) / min(c_ref, sat) (saturation 1500 MHz, reference
    1830 MHz), in the engine's clock-lock loop. A 512 x 512 output on 128 x 128 tiles makes 16
    blocks for 132 SMs, so no clock of the test brings it to the 700 W limit."""
    r = predict(saturating_gemm(tmp_path, 1.5e9, tile=[128, 128, 64]), sm_clock_hz=lock_hz)
    g = r.ops.set_index("id").loc["g@r0"]
    assert r.summary()["avg_sm_clock_hz"] == pytest.approx(lock_hz, rel=1e-9)
    assert g["duration_s"] == pytest.approx(g["isolated_s"] * expected_ratio, rel=1e-9)


@pytest.mark.parametrize("tile", [64, 128])
@pytest.mark.parametrize("lock_hz", [0.6e9, 1.5e9, 1.98e9])
def test_a_gemm_kernel_of_ones_own_saturates_where_its_rooflines_meet(tmp_path: Path, tile: int,
                                                                       lock_hz: float) -> None:
    """Closed form: a plain WMMA kernel of one's own (tile given, no efficiency) takes the longer of
    its tensor issue, which follows the clock, and its tiles' L2 reads, which do not; its rate is
    min(c, sat) / min(c_ref, sat) with sat = c_ref x issue / reads (cost.gemm), in the engine's
    clock-lock loop. The L2 bandwidths are set to 0.5 TB/s and 20 GB/s an SM here, so that a GEMM
    small enough to stay under the 700 W limit at any clock (512 x 512 outputs) is bound by its
    reads at 64x64 tiles and by its issue at 128x128 (as the measured kernels on a whole H200 are:
    calibration/data/h200-sxm/2026-11-29-c)."""
    from ovsim.hw.calib import load_calibration
    from ovsim.hw.spec import load_gpu

    (tmp_path / "l2.v1.yaml").write_text(yaml.safe_dump({
        "schema": "ovsim.calib/1", "gpu": "*", "version": 1, "provenance": {},
        "parameters": {"own_gemm_l2_bytes_per_s": 5e11, "own_gemm_l2_sm_bytes_per_s": 2e10},
        "sources": {"own_gemm_l2_bytes_per_s": "test", "own_gemm_l2_sm_bytes_per_s": "test"}}))
    gpu = load_gpu("h100-sxm5-80gb")
    params = load_calibration(gpu, "h100-sxm5-80gb").params
    m, k = 512, 4096
    sc = gemm_scenario("hgx-h100", m, m, k, precision="fp16", tile=[tile, tile, 32], threads=128, stages=2)
    r = predict(sc.model_copy(update={"calibration": [str(tmp_path / "l2.v1.yaml")]}), sm_clock_hz=lock_hz)
    kernel = r.workload.ops[0].kernel
    assert kernel is not None and kernel.saturation_clock_fraction is not None
    ref, c = params.power_tensor_reference_clock_fraction, lock_hz / gpu.clocks.compute_clock_hz
    # One wave: each SM runs its 4 resident tiles (128 threads of 128 registers: 65,536 registers
    # an SM) at the calibrated share of its tensor peak.
    flops_tile = 2 * tile * tile * k
    issue_s = 4 * flops_tile / (params.own_gemm_efficiency["fp16"] * gpu.peak_flops_per_s("fp16") / 132)
    # The L2's own bandwidth and each SM's path in series, on all 132 SMs.
    reads_s = (m // tile) ** 2 * k * 2 * tile * 2 * (1 / 5e11 + 1 / (132 * 2e10))
    sat = kernel.saturation_clock_fraction
    assert sat == pytest.approx(ref * issue_s / reads_s, rel=1e-9)
    assert (sat < ref) == (tile == 64)
    g = r.ops.set_index("id").loc["g@r0"]
    assert r.summary()["avg_sm_clock_hz"] == pytest.approx(lock_hz, rel=1e-9)
    assert g["duration_s"] == pytest.approx(g["isolated_s"] * min(ref, sat) / min(c, sat), rel=1e-9)


def test_a_saturating_kernel_under_a_cap_runs_at_the_clock_the_solver_gives_it(tmp_path: Path) -> None:
    """Under a cap low enough to hold the clock below saturation, time is the isolated time times
    saturation over the clock the engine settled on; its HBM traffic and power follow the same rate."""
    r = predict(saturating_gemm(tmp_path, 1.7e9, 8192, 8192), power_cap_w=450.0)
    g = r.ops.set_index("id").loc["g@r0"]
    clk = segments(r, 0, "sm_clock_hz")
    busy = clk[(clk["start"] >= g["start_s"]) & (clk["end"] <= g["end_s"])]
    c_hz = float(np.dot(busy["value"], busy["end"] - busy["start"]) / (busy["end"] - busy["start"]).sum())
    assert c_hz < 1.7e9
    assert g["duration_s"] == pytest.approx(g["isolated_s"] * 1.7e9 / c_hz, rel=0.02)
    pw = segments(r, 0, POWER_COUNTER)
    assert pw[(pw["start"] >= g["start_s"]) & (pw["end"] <= g["end_s"])]["value"].max() <= 450.0 + 1e-6


def test_predictions_under_a_cap_are_deterministic() -> None:
    a = predict(EXAMPLES / "gemm-allreduce-a100x4-priority.yaml", power_cap_w=180.0)
    b = predict(EXAMPLES / "gemm-allreduce-a100x4-priority.yaml", power_cap_w=180.0)
    pd.testing.assert_frame_equal(a.ops, b.ops)
    pd.testing.assert_frame_equal(a.timeline.counters, b.timeline.counters)
    assert a.summary() == b.summary()


# -- energy ----------------------------------------------------------------------------------------


def test_energy_of_a_one_wave_gemm_is_its_closed_form() -> None:
    """A GEMM of exactly one full wave (12 x 18 tiles of 128x128 = 216 = 108 SMs x 2 blocks) keeps
    every SM busy for its whole time, so its power is constant: idle(c_t) + s(c_t)·w_tensor + w_hbm·u_hbm
    with u_hbm its bytes over its time; energy = power x time. Computed here from the model's
    parameters, not from the engine's counters."""
    m, n, k = 128 * 12, 128 * 18, 16384
    # Unmanaged: the closed form is of the GEMM at the clocks its calibrated rates assume.
    r = predict(gemm_scenario("a100x4", m, n, k, tile=[128, 128, 32], threads=256, registers_per_thread=128),
                power_managed=False)
    pm = r.power_config.model if r.power_config else None
    assert pm is not None
    op = next(o for o in r.workload.ops if o.id == "g@r0")
    assert op.kernel is not None
    assert op.kernel.blocks == 2 * 108 and blocks_per_sm(op.kernel.block, r.gpu) == 2
    d = op.kernel.isolated_s
    c_t = pm.tensor_reference_clock_fraction
    p = (pm.idle_power_w(c_t) + pm.dynamic_scale(c_t) * pm.tensor_w["default"]
         + pm.hbm_w * op.kernel.hbm_bytes / d / pm.hbm_peak_bytes_per_s)
    s = r.summary()
    assert s["makespan_s"] == pytest.approx(d, rel=1e-12)
    assert s["energy_j"] == pytest.approx(p * d, rel=1e-9)
    assert s["avg_power_w"] == pytest.approx(p, rel=1e-9)
    assert s["energy_delay_j_s"] == pytest.approx(p * d * d, rel=1e-9)


def without_window(tmp_path: Path, sc: Scenario) -> Scenario:
    """``sc`` under a calibration whose power-limit loop has no window: the clock is re-solved at
    every event from the activity of that moment (the rule before the loop was measured)."""
    (tmp_path / "nowindow.v1.yaml").write_text(yaml.safe_dump({
        "schema": "ovsim.calib/1", "gpu": "*", "version": 1, "provenance": {},
        "parameters": {"power_control_window_s": 0.0}, "sources": {"power_control_window_s": "test"}}))
    return sc.model_copy(update={"calibration": [*sc.calibration, str(tmp_path / "nowindow.v1.yaml")]})


@pytest.mark.parametrize("window", [True, False])
def test_analytic_and_simulated_power_agree_without_overlap(tmp_path: Path, window: bool) -> None:
    """Sequential schedule: one op at a time, so the closed form and the engine see the same
    activity. Unmanaged they agree exactly up to the engine's tail waves; under a cap the engine
    also follows the clock through a tail wave that leaves SMs idle, which the closed form does not:
    3% at 250 W, with the windowed loop (both run it) and with the clock of each moment. 150 W puts
    the A100's GEMM below its voltage knee (1105 MHz, docs/power.md), where power follows the clock
    in proportion, so a difference in activity moves the clock by the same share (above the knee,
    by about a third of it): 3.7% apart there, so 4%."""
    sc = load_scenario(EXAMPLES / "gemm-allreduce-a100x4-sequential.yaml")
    if not window:
        sc = without_window(tmp_path, sc)
    for cap, rel in ((None, 1e-9), (150.0, 0.04), (250.0, 0.03)):
        # None: unmanaged, every op at its calibrated rate.
        sim = predict(sc, mode="simulate", power_cap_w=cap, power_managed=cap is not None).summary()
        ana = predict(sc, mode="analytic", power_cap_w=cap, power_managed=cap is not None).summary()
        assert ana["makespan_s"] == pytest.approx(sim["makespan_s"], rel=rel)
        assert ana["energy_j"] == pytest.approx(sim["energy_j"], rel=0.03)


def test_without_a_window_the_cap_holds_at_every_instant_the_clock_can_still_drop(tmp_path: Path) -> None:
    """A calibration with no window re-solves the clock at every event, so power is at most the cap
    wherever the clock is above its minimum, and the GEMM and the all-reduce run at different
    clocks."""
    r = predict(without_window(tmp_path, load_scenario(EXAMPLES / "gemm-allreduce-a100x4-priority.yaml")),
                power_cap_w=250.0)
    assert r.calibration.params.power_control_window_s == 0.0
    f_min = r.gpu.clocks.min_sm_clock_hz
    for rank in range(4):
        p = segments(r, rank, POWER_COUNTER)
        clk = segments(r, rank, "sm_clock_hz")
        assert len(clk["value"].unique()) > 1
        for rec in p.itertuples():
            at = clk[(clk["start"] <= rec.start) & (clk["end"] > rec.start)]["value"]
            if len(at) and float(at.iloc[0]) > f_min:
                assert rec.value <= 250.0 * (1 + 1e-9)


# -- Lee et al. (secondary source) ----------------------------------------------------------------


def test_overlap_draws_more_power_than_sequential_execution() -> None:
    """Lee et al. (secondary note): overlapped execution's peak power is up to 25% above
    non-overlapped. They sampled NVML every 100 ms, so a repeated iteration shorter than that shows
    its average power; that is what is compared. The plain overlapped example overlaps little
    (the GEMM fills every SM), so it must be above sequential by at most 25%; the priority schedule
    hides 84% of the all-reduce and compresses the same energy into far less time, which this
    4-GPU microbenchmark (communication longer than compute) pushes past Lee's 25%: only the
    direction is checked there. The instantaneous peak is not: in this model an NCCL kernel takes
    SMs from the GEMM, and the two roughly cancel (see docs/power.md)."""
    seq = predict(EXAMPLES / "gemm-allreduce-a100x4-sequential.yaml").summary()
    ovl = predict(EXAMPLES / "gemm-allreduce-a100x4-overlapped.yaml").summary()
    prio = predict(EXAMPLES / "gemm-allreduce-a100x4-priority.yaml").summary()
    assert 1.0 < ovl["avg_power_w"] / seq["avg_power_w"] <= 1.25
    assert prio["avg_power_w"] > seq["avg_power_w"]


FSDP = "training-gpt3-1.3b-fsdp-a100x4-{}.yaml"  # GPT-3 XL, FSDP, 4x A100 40 GB: Lee et al.'s own setting


@pytest.mark.parametrize("managed", [False, True])
def test_overlapped_fsdp_training_peaks_higher_as_nvml_sees_it(managed: bool) -> None:
    """Lee et al. (secondary note), on the setting closest to theirs (GPT-3 XL with FSDP on 4x A100):
    overlapped peak power is above non-overlapped, by up to 25%. NVML reported power every 100 ms,
    so the peak is taken over 100 ms windows of the iteration: without power management, and at the
    board's 400 W default limit the study's GPUs ran at (the loop holds 70 ms averages, so a 100 ms
    window can still run above it)."""
    peaks = {}
    for schedule in ("overlapped", "sequential"):
        r = predict(EXAMPLES / FSDP.format(schedule), power_managed=managed)
        assert r.timeline.makespan_s > 0.3  # several 100 ms windows per iteration
        peaks[schedule] = float(r.power(window_s=0.1)["peak_window_power_w"].max())
    assert 1.0 < peaks["overlapped"] / peaks["sequential"] <= 1.25


# Why the model cannot give Lee et al.'s 2.07x under 100 W (docs/power.md, "What the A100's 100 W rows
# say"): idle at low clocks is 56 W, so ~44 W are left for dynamic power, a GEMM's 323 W at the 400 W
# limit's clock; with the voltage floor measured on Perseus's A100 profiles (0.82 of nominal below 1105
# MHz) that leaves the GEMM under ~200 MHz, six times slower. Only a run mostly not clock-bound could
# slow by 2.07x.
LEE_100W = ("known discrepancy: 100 W leaves ~44 W above idle, and the A100's measured voltage floor puts a "
            "GEMM under ~200 MHz there (~6x slower); see docs/power.md")


@pytest.mark.xfail(strict=True, reason=LEE_100W)
def test_a_100_w_cap_slows_overlapped_fsdp_training_about_twice() -> None:
    """Lee et al. (secondary note): 107% slower under a 100 W cap, on their training runs, against
    the 400 W default limit ("unlimited"). Same tolerance as below (2.07x +-30%)."""
    path = EXAMPLES / FSDP.format("overlapped")
    ratio = (predict(path, power_cap_w=100.0).summary()["makespan_s"]
             / predict(path, power_cap_w=400.0).summary()["makespan_s"])
    assert 2.07 * 0.7 <= ratio <= 2.07 * 1.3


@pytest.mark.xfail(strict=True, reason=LEE_100W)
def test_a_100_w_cap_makes_overlapped_execution_about_twice_as_slow() -> None:
    """Lee et al. (secondary note): under a 100 W cap overlapped execution is 107% slower (2.07x).
    Tolerance 2.07x +-30% (1.45x-2.7x): a secondary, unverified reading of a figure measured on GPT
    training, not on this GEMM + all-reduce microbenchmark, with an unstated baseline, taken here
    as the same schedule at the 400 W default limit: an A100 cannot be set above it, so the study's
    "unlimited" is that. Half of this microbenchmark's time is the all-reduce, which the clock does
    not slow, and still the GEMM's slowdown takes it to 3.35x (2.43x under the voltage curve
    assumed before the A100's was measured)."""
    path = EXAMPLES / "gemm-allreduce-a100x4-overlapped.yaml"
    free = predict(path, power_cap_w=400.0).summary()["makespan_s"]
    capped = predict(path, power_cap_w=100.0)
    ratio = capped.summary()["makespan_s"] / free
    assert 2.07 * 0.7 <= ratio <= 2.07 * 1.3


def test_a_100_w_cap_slows_the_gemm_by_its_clock_and_the_all_reduce_not_at_all() -> None:
    """Under 100 W the overlapped GEMM + all-reduce's GEMM loses its time to the lowered clock,
    while the all-reduce (copy loops and links, which do not follow the SM clock) keeps its
    time within 10%: the whole run slows less than its GEMM."""
    path = EXAMPLES / "gemm-allreduce-a100x4-overlapped.yaml"
    free = predict(path, power_cap_w=400.0).ops.set_index("id")
    capped = predict(path, power_cap_w=100.0).ops.set_index("id")
    assert capped.loc["gemm@r0", "slowed_by"] == "lowered clock"
    gemm = capped.loc["gemm@r0", "duration_s"] / free.loc["gemm@r0", "duration_s"]
    comm = capped.loc["allreduce@r0", "duration_s"] / free.loc["allreduce@r0", "duration_s"]
    # x6.9 on the A100's measured voltage curve (x4 on the one assumed before it).
    assert gemm > 5.0 and comm == pytest.approx(1.0, rel=0.10)


def test_a_saturating_streaming_kernel_on_h200_draws_what_the_harness_measured() -> None:
    """Consistency check (the H200 power weights were fitted on this phase): a streaming add at
    the achievable HBM bandwidth drew 662 W on an H200 (calibration/data/h200-sxm/2026-11-26, power
    part, NVML instantaneous power); within 10%. The published 137-300 W of memory-bound LLM decode
    on H200 (Ma et al., arXiv 2605.11999) is not this case: decode does not keep
    HBM saturated the way a streaming kernel does, which an earlier version of this test assumed."""
    sc = Scenario.model_validate({"system": "hgx-h200", "ranks": 1,
                                  "ops": [{"name": "e", "kind": "elementwise", "bytes": 8.0e9}]})
    s = predict(sc).summary()
    assert s["peak_power_w"] == pytest.approx(662.2, rel=0.10)


def test_a_short_run_starts_where_a_long_run_of_it_settles() -> None:
    """The steady state of a loop of iterations: one 8192^3 GEMM (1.6 ms, far shorter than the
    window) is predicted at the clock the loop holds over 200 of them in a row (320 ms), within a
    grid step, and so at the same time per GEMM."""
    one = predict(gemm_scenario("hgx-h100"), power_cap_w=700.0)
    ops = [{"name": f"g{i}", "kind": "gemm", "m": 8192, "n": 8192, "k": 8192, "precision": "bf16"} for i in range(200)]
    many = predict(Scenario.model_validate({"name": "gemms", "system": "hgx-h100", "ranks": 1, "ops": ops}),
                   power_cap_w=700.0)
    step = one.calibration.params.power_clock_step_hz
    assert many.timeline.makespan_s > 4 * one.calibration.params.power_control_window_s
    assert abs(one.summary()["avg_sm_clock_hz"] - many.summary()["avg_sm_clock_hz"]) <= step
    per_gemm = many.timeline.makespan_s / 200
    assert float(one.ops.set_index("id").loc["g@r0", "duration_s"]) == pytest.approx(per_gemm, rel=0.01)


def test_analytic_power_between_ops_is_at_the_clock_the_loop_holds() -> None:
    """GEMMs with 1.5 ms host gaps between them on an H100 under a 300 W cap: between ops the
    windowed loop keeps the clock it set, so the gaps idle at that clock, not at the top one, and
    each GEMM's traffic follows its rate at the clock it runs at. The analytic fidelity's average
    power then holds the cap and comes within 3% of the engine's (298 W against 304 W; with the
    gaps idling at 1980 MHz it was 338 W, with the GEMMs' traffic at the calibrated rate 324 W)."""
    ops: list[dict[str, object]] = []
    for i in range(10):
        ops.append({"name": f"g{i}", "kind": "gemm", "m": 8192, "n": 8192, "k": 8192, "precision": "bf16"})
        ops.append({"name": f"d{i}", "kind": "delay", "duration_s": 1.5e-3})
    sc = Scenario.model_validate({"name": "gaps", "system": "hgx-h100", "ranks": 1, "ops": ops})
    r = predict(sc, power_cap_w=300.0, mode="analytic")
    clk = r.timeline.counters
    clk = clk[(clk["rank"] == 0) & (clk["counter"] == "sm_clock_hz")]["value"].to_numpy(float)
    assert clk.max() < r.gpu.clocks.max_sm_clock_hz and np.ptp(clk) <= r.calibration.params.power_clock_step_hz
    engine = predict(sc, power_cap_w=300.0).summary()
    assert r.summary()["avg_power_w"] <= 300.0 * 1.005
    assert r.summary()["avg_power_w"] == pytest.approx(engine["avg_power_w"], rel=0.03)
