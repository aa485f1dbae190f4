"""The validation suite: its rows, rules and the command's output."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from shared_traces import TRACES, traces

from ovsim import validate
from ovsim.cli import main
from ovsim.errors import OvsimError
from ovsim.validate import Check
from ovsim.validate import traces as validate_traces


def test_rules() -> None:
    assert Check("x", "g", 100.0, 109.0, "u", 10.0, "s").passed
    assert not Check("x", "g", 100.0, 111.0, "u", 10.0, "s").passed
    assert Check("m", "g", 10.0, 9.0, "% MAPE", 0.0, "s", rule="at_most").passed
    assert not Check("m", "g", 10.0, 11.0, "% MAPE", 0.0, "s", rule="at_most").passed
    # The DLRM trace's fit row: its replay met no contention and matched the naive MAPE
    # (13.310434928957338%) to float round-off, 13.310434928978301%; that is a tie, not a loss.
    assert Check("m", "g", 13.310434928957338, 13.310434928978301, "% MAPE", 0.0, "s", rule="at_most").passed
    assert not Check("m", "g", 13.31, 13.32, "% MAPE", 0.0, "s", rule="at_most").passed
    assert Check("r", "g", 1.25, 1.1, "x", 0.0, "s", rule="range", low=1.0).passed
    assert not Check("r", "g", 1.25, 1.0, "x", 0.0, "s", rule="range", low=1.0).passed
    assert not Check("r", "g", 1.25, 1.3, "x", 0.0, "s", rule="range", low=1.0).passed


def test_nccl_and_h100_gemm_figures_are_predicted_within_tolerance() -> None:
    """Bus bandwidths from NCCL's tuning model against nccl-tests measurements, and the H100 BF16
    and FP8 MAMF figures (794.5 and 1,402.6 TFLOPS, stas00/ml-engineering) from the GEMM fit on
    the harness's measured cuBLAS GEMMs: none was fitted to its figure. FP8 needs Hopper's
    one-block-per-SM kernels with 128-byte K tiles; the multistage kernels alone lose a third wave."""
    rows = [c for c in validate.published_checks() if c.group == validate.PREDICTED]
    assert [c.name.split(",")[0] for c in rows] == ["NCCL all-reduce busbw"] * 3 + ["best BF16 GEMM", "best FP8 GEMM"]
    assert all(c.passed for c in rows), [(c.name, c.error_pct) for c in rows]


def test_best_gemm_figures_carry_the_calibration_through() -> None:
    """The A100 BF16 best-GEMM row (MAMF, stas00/ml-engineering) is the source of that efficiency,
    so it checks that tiles, waves and occupancy carry it through: within 5%."""
    rows = [c for c in validate.published_checks() if c.group == validate.CONSISTENCY]
    assert [c.name.split(",")[0] for c in rows] == ["best BF16 GEMM"]
    assert all(c.passed for c in rows), [(c.name, c.error_pct) for c in rows]


def test_power_figures_are_reported_against_their_sources() -> None:
    """The published power figures: the A100 GEMM at 400 W within 5% of thonking.ai's 258 TFLOPS and
    the H100 at full load within 10% of its TDP (consistency: the weights were fitted or derived on
    them), and Lee et al.'s overlap figures (secondary source) as predictions with their own rules."""
    rows = {c.name: c for c in validate.power_checks()}
    gemm = rows["A100 8192^3 BF16 GEMM under the 400 W limit"]
    assert gemm.group == validate.POWER_CONSISTENCY and gemm.reference == 258.0 and gemm.passed
    assert rows["H100 8192^3 BF16 GEMM average power under the 700 W limit"].passed
    lee = [c for c in rows.values() if c.group == validate.POWER_PREDICTED]
    assert {c.reference for c in lee} == {1.25, 2.07} and len(lee) == 3



def _cases(monkeypatch: pytest.MonkeyPatch, name: str, value: object) -> None:
    """Replace a table of trace cases where the trace checks and the command's folder check read it."""
    monkeypatch.setattr(validate_traces, name, value)
    monkeypatch.setattr(validate, name, value)

@pytest.mark.slow
def test_validate_command_holds_each_trace_out(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    traces()
    _cases(monkeypatch, "TRACE_CASES", (
        ("param/et_replay/tests/inputs/dlrm_kineto.tar.gz", None),
        ("HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz", "a100-sxm4-80gb")))
    h100 = "TraceLens/tests/traces/h100/"
    _cases(monkeypatch, "MEMORY_CASES", {"h100-sxm5-80gb": (
        h100 + "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        h100 + "google_owlv2-large-patch14-ensemble__1016001.json.gz")})
    _cases(monkeypatch, "GEMM_CASES", validate_traces.MEMORY_CASES)
    rc = main(["validate", "--traces", str(TRACES), "--json"])
    doc = json.loads(capsys.readouterr().out)
    checks = doc["checks"]
    # The status says whether every check passed, as the counts do.
    assert doc["total"] == len(checks) and doc["passed"] == sum(c["passed"] for c in checks)
    assert rc == (0 if doc["passed"] == doc["total"] else 1)
    span = next(c for c in checks if c["name"] == "dlrm_kineto.tar.gz: span")
    assert span["passed"] and span["group"] == validate.HELD_OUT
    # Held out: contention refitted on the other trace only; the fit row is labelled a fit.
    held = [c for c in checks if c["group"] == validate.HELD_OUT and "overlapped-kernel MAPE" in c["name"]]
    assert len(held) == 2 and all("fitted on 1 other traces" in c["note"] for c in held)
    fit = [c for c in checks if c["group"] == validate.FIT]
    assert len(fit) == 2 and all("fit error" in c["note"] for c in fit)
    # Memory-bound kernels held out: each H100 trace's elementwise kernels priced with the HBM
    # fraction fitted on the other alone meet the 10% bar (measured kernels against the model).
    mem = [c for c in checks if ": elementwise kernel time" in c["name"]]
    assert len(mem) == 2 and all(c["passed"] and c["group"] == validate.HELD_OUT for c in mem)
    assert all("fitted on 1 other h100-sxm5-80gb traces" in c["note"] for c in mem)
    # The per-kernel overhead held out: Qwen's tiny elementwise kernels (1.6 us, tightly) at the
    # overhead fitted on OWLv2 alone meet the 10% bar; OWLv2's spread (1.4-3.6 us) keeps even its
    # own best constant above it, and the row says so.
    tiny = {c["name"].split("_")[0]: c for c in checks if "tiny elementwise kernel time" in c["name"]}
    assert set(tiny) == {"Qwen", "google"}
    assert tiny["Qwen"]["passed"]
    assert "the best constant for this trace alone" in tiny["google"]["note"]
    # GEMMs held out: each trace's aligned GEMMs at the main-loop efficiency and time per wave
    # fitted on the other alone; measured kernels against the model, next to the published
    # best-shape efficiency the shipped file held before (which the trace fit beats on both).
    gemm = [c for c in checks if "GEMM time MAPE" in c["name"] and c["group"] == validate.HELD_OUT]
    assert len(gemm) == 2
    for c in gemm:
        assert "fitted on the other 1 h100-sxm5-80gb traces" in c["note"]
        mamf_pct = float(c["note"].split("efficiency 0.803 alone: ")[1].split("%")[0])
        assert c["predicted"] < mamf_pct
    # The same GEMMs priced as a scenario prices them (the library kernel the cost model picks,
    # the shipped parameters, fitted on the harness's GEMMs, not on these traces): Qwen's three
    # large shapes within the bar (8.6% when this was written); OWLv2's GEMMs under 10 us are
    # reported apart, the cost model's weak end.
    scen = {c["name"].split("_")[0]: c for c in checks if c["group"] == validate.SCENARIO_GEMM}
    assert set(scen) == {"Qwen", "google"}
    assert scen["Qwen"]["passed"]
    assert "below 10 us (360)" in scen["google"]["note"]


def _checks(*passing: bool) -> list[validate.Check]:
    return [validate.Check(f"check {i} " + "x" * 70 * (i == 0), "published", 1.0, 1.0 if ok else 2.0, "s", 10.0,
                           "a source") for i, ok in enumerate(passing)]


@pytest.mark.parametrize("quiet", [False, True])
def test_validate_exits_1_when_a_check_fails(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                             quiet: bool) -> None:
    monkeypatch.setattr(validate, "run", lambda *a, **k: _checks(True, False, True))
    assert main(["validate", *(["--quiet"] if quiet else [])]) == 1
    out = capsys.readouterr().out
    if quiet:
        assert out == ""
    else:
        assert "2 of 3 checks pass" in out
        # The long name is printed whole (on a line of its own), not cut at the column's width.
        assert ("check 0 " + "x" * 70) in out.splitlines()


def test_validate_exits_0_when_every_check_passes(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(validate, "run", lambda *a, **k: _checks(True, True))
    assert main(["validate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["passed"], doc["total"]) == (2, 2)


def test_validate_rejects_a_missing_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--traces", "no/such/folder"]) == 2
    assert "no/such/folder" in capsys.readouterr().err


def test_validate_rejects_a_folder_without_the_shared_traces(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A wrong folder would otherwise pass the suite with every trace check left out."""
    assert main(["validate", "--traces", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"ovsim: error: {tmp_path}: traces: none of the 11 shared traces is in this folder")


@pytest.mark.slow
def test_held_out_folds_in_processes_give_the_same_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    traces()
    _cases(monkeypatch, "TRACE_CASES", (
        ("HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz", None),
        ("HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz", "a100-sxm4-80gb")))
    one = validate.trace_checks(TRACES, workers=1)
    two = validate.trace_checks(TRACES, workers=2)
    assert [c.to_json() for c in two] == [c.to_json() for c in one]
    # Per trace: span, kernel MAPE, time-weighted error, exposed communication and hidden share
    # held out, one fit row.
    names = [c.name.split(": ", 1)[1] for c in one]
    assert len(one) == 12 and names.count("exposed communication") == 2
    assert sum(n.startswith("overlapped-kernel time-weighted error") for n in names) == 2
    assert names.count("hidden share of communication") == 2
    assert all("fitted on 1 other traces" in c.note for c in one if c.group == validate.HELD_OUT)
    with pytest.raises(OvsimError, match="workers"):
        validate.run(None, workers=-1)


@pytest.mark.slow
def test_measured_kernels_are_predicted_with_contention_fitted_on_other_kernels_and_another_gpu(
        tmp_path: Path) -> None:
    """Two victims of the harness's overlap part (the add and the FP8 GEMM, each beside 16 and 32
    copy and reduce channels): each H100 victim is replayed with contention fitted on the other one
    alone, and the same kernels beside 8 and 24 channels (another H100), 8 to 32 (a third), 1 to 8
    (a fourth) and two H200s' (16 and 32 channels; 8 to 32) with a fit on both H100 victims. The
    replay must beat the naive prediction (the kernels' isolated durations), which misses their
    measured slowdowns of up to 42%."""
    from ovsim.traces.load import write_tables
    from ovsim.validate import MEASURED, MEASURED_DATA, MEASURED_OVERLAP, measured_checks
    from ovsim.validate.datasets import experiments

    for rel, _ in MEASURED_OVERLAP:
        (tmp_path / rel / "tables").mkdir(parents=True)
        keep = {label: b for victim in ("add_bf16_256M", "gemm_fp8_8192x8192x8192")
                for label, b in experiments(MEASURED_DATA / rel, "overlap", f"{victim}__*__normal__*_first").items()}
        write_tables(keep, tmp_path / rel / "tables" / "overlap.parquet")
    checks = measured_checks(tmp_path)
    assert [c.name.split(" (")[0] for c in checks] == [
        "h100-sxm5-80gb 2026-11-26: add_bf16_256M", "h100-sxm5-80gb 2026-11-26: gemm_fp8_8192x8192x8192",
        "h100-sxm5-80gb 2026-11-26-c: add_bf16_256M", "h100-sxm5-80gb 2026-11-26-c: gemm_fp8_8192x8192x8192",
        "h100-sxm5-80gb 2026-11-26-g: add_bf16_256M", "h100-sxm5-80gb 2026-11-26-g: gemm_fp8_8192x8192x8192",
        "h100-sxm5-80gb 2026-11-27-c: add_bf16_256M", "h100-sxm5-80gb 2026-11-27-c: gemm_fp8_8192x8192x8192",
        "h200-sxm 2026-11-26: add_bf16_256M", "h200-sxm 2026-11-26: gemm_fp8_8192x8192x8192",
        "h200-sxm 2026-11-26-e: add_bf16_256M", "h200-sxm 2026-11-26-e: gemm_fp8_8192x8192x8192"]
    assert {c.group for c in checks} == {MEASURED}
    assert "1 other victim kernels' experiments, not this one's" in checks[0].note
    assert "every experiment of calibration/data/h100-sxm5-80gb/2026-11-26" in checks[8].note
    for c in checks:
        naive = float(c.note.split("naive ")[1].split("%")[0])
        assert 0 <= c.predicted < naive, c


def test_measured_clocks_are_predicted_for_the_clock_parts_gemms() -> None:
    """The clock part's BF16 GEMM at the 700 W limit: the counted clock and the time per kernel
    within 10% (fitted on, so a consistency check of the solver with the saturation law)."""
    from ovsim.validate import MEASURED_CLOCK_FIT, measured_clock_checks

    checks = {c.name: c for c in measured_clock_checks()}
    for gpu in ("h100-sxm5-80gb", "h200-sxm"):
        what = f"{gpu}: gemm bf16 8192 at the 700 W limit"
        assert checks[f"{what}: counted SM clock"].group == MEASURED_CLOCK_FIT
        assert checks[f"{what}: counted SM clock"].passed and checks[f"{what}: time per kernel"].passed


def test_gemms_alternating_with_memory_bound_kernels_share_the_measured_clock() -> None:
    """The clock part's phases that alternate 8192^3 GEMMs with an add, a layer norm or a softmax
    every few milliseconds at the 700 W limit (held out: the loop's window was fitted on the GEMM
    phases alone). Measured, the GEMMs and the victims ran at one clock (within 1 MHz); ovsim's
    windowed loop gives them nearly one clock (within 2.5%), and at least 16 of the 18 rows pass
    (17 with the measured flat voltage, 15 with the assumed curve; a clock that followed each
    moment's power passed 2: it put the GEMMs ~12-20% low and the victims at the top clock)."""
    from ovsim.validate import (
        MEASURED_CLOCK_MIX,
        MEASURED_CLOCK_SHARE_MIX,
        MEASURED_CLOCK_SHARE_MIX_HELD_OUT,
        MEASURED_CLOCK_SHARES,
        measured_clock_mix_checks,
    )

    checks = measured_clock_mix_checks()
    share_sets = tuple(rel for rel, _, _ in MEASURED_CLOCK_SHARES)
    first = [c for c in checks if not c.source.startswith(tuple(f"calibration/data/{r}" for r in share_sets))]
    assert len(first) == 18 and {c.group for c in first} == {MEASURED_CLOCK_MIX}
    assert {c.group for c in checks} == {MEASURED_CLOCK_MIX, MEASURED_CLOCK_SHARE_MIX,
                                         MEASURED_CLOCK_SHARE_MIX_HELD_OUT}
    by = {c.name: c for c in checks}
    assert len(by) == len(checks)
    for c in first:
        if c.name.endswith("GEMM's counted SM clock"):
            victim = by[c.name.replace("GEMM's", "victim's")]
            assert abs(c.reference - victim.reference) < 2.0  # the measurement: one clock
            # The model's loop drops a few steps after a window heavy in GEMMs, during the victims
            # that follow (a flat voltage moves the clock far for a few watts); the measured clock
            # did not (1 MHz).
            assert abs(c.predicted - victim.predicted) <= 0.025 * c.predicted
    assert sum(c.passed for c in first) >= 16, [(c.name, round(c.error_pct, 1)) for c in first if not c.passed]


def test_gemm_share_alternations_on_a_board_no_fit_has_seen() -> None:
    """A later H200 board (calibration/data/h200-sxm/2026-11-29-b, measured after every power and
    clock parameter was fitted) ran the clock part again: its 21 alternation and GEMM-share rows
    are held out, and every one is within 10% (the largest misses: the layer norm's alternation
    clock +9.4%, the 25% share's GEMM time +8.0%)."""
    from ovsim.validate import MEASURED_CLOCK_MIX, MEASURED_CLOCK_SHARE_MIX_HELD_OUT, measured_clock_mix_checks

    rows = [c for c in measured_clock_mix_checks() if c.source.startswith("calibration/data/h200-sxm/2026-11-29-b ")]
    assert len(rows) == 21
    assert {c.group for c in rows} == {MEASURED_CLOCK_MIX, MEASURED_CLOCK_SHARE_MIX_HELD_OUT}
    assert all(c.passed for c in rows), [(c.name, round(c.error_pct, 1)) for c in rows if not c.passed]


def test_gemm_share_alternations_on_other_boards() -> None:
    """Two more boards (calibration/data, 2026-11-26-e and the H200's -d) ran the three
    alternations and the GEMM with the add at GEMM time shares of 10, 25, 75 and 90%: 42 rows. The
    voltage floor was fitted on the shares' power (24 rows, their own group); the alternations are
    held out. Measured, the shares put the clock from the top (10%) down to the GEMM's own (90%),
    every kernel of a phase at one clock. ovsim follows that on the H100 (every row within 10%); on
    the H200 the layer norm's alternation's clock comes out 11-12% high (its norm draws more than
    the model gives it), the 25% share's 9% low and the 10% share's GEMM time 9% short (the model
    draws more for the add than this board did). With the assumed voltage curve 36 passed, the
    H200's 10% and 25% shares 15% low."""
    from ovsim.validate import MEASURED_CLOCK_SHARE_MIX, measured_clock_mix_checks
    from ovsim.validate.datasets import fitted

    voltage_sets = tuple(f"calibration/data/{r} " for r in fitted("clock_shares").values())
    assert len(voltage_sets) == 2
    rows = [c for c in measured_clock_mix_checks() if c.source.startswith(voltage_sets)]
    assert len(rows) == 42
    assert sum(c.group == MEASURED_CLOCK_SHARE_MIX for c in rows) == 24
    clocks = {c.name: c.reference for c in rows if "counted SM clock" in c.name}
    for gpu in ("h100-sxm5-80gb", "h200-sxm"):
        by_share = sorted((int(n.split("(")[1].split("%")[0]), v) for n, v in clocks.items()
                          if n.startswith(gpu) and "GEMM's" in n and "% GEMM time" in n)
        assert [s for s, _ in by_share] == [10, 25, 75, 90]
        # More GEMM time, a lower clock (the two low shares both ran at the top clock on the H100,
        # 1977 and 1979 MHz: the probes' count differs by a few MHz).
        assert all(a[1] > b[1] - 5.0 for a, b in itertools.pairwise(by_share))
        assert by_share[0][1] - by_share[-1][1] > 300.0
    h100 = [c for c in rows if c.name.startswith("h100")]
    assert len(h100) == 21
    assert all(c.passed for c in h100), [(c.name, round(c.error_pct, 1)) for c in h100 if not c.passed]
    assert sum(c.passed for c in rows) >= 39, [(c.name, round(c.error_pct, 1)) for c in rows if not c.passed]


def test_clock_shares_reproduce_the_clock_parts_memory_bound_kernels() -> None:
    """The layer norm and softmax of the clock part, slower at their lowest clocks than at their
    highest: each GPU's own shipped share within 30% of the measured slowdown (fitted on these
    kernels: consistency of the fit with the law validate applies), and a held-out row with the
    other GPU's share for each."""
    from ovsim.validate import (
        MEASURED_CLOCK_SHARE_FIT,
        MEASURED_CLOCK_SHARE_HELD_OUT,
        measured_clock_share_checks,
    )

    checks = measured_clock_share_checks()
    fit = [c for c in checks if c.group == MEASURED_CLOCK_SHARE_FIT]
    held = [c for c in checks if c.group == MEASURED_CLOCK_SHARE_HELD_OUT]
    assert len(fit) == len(held) == 4
    assert all(c.passed and c.reference > 1.0 for c in fit), [(c.name, c.error_pct) for c in fit]


def test_dispatch_probes_are_replayed_with_the_schedulers_rule() -> None:
    """The dispatch part's probes: a second kernel at higher priority is let in long before one at
    equal priority, in the measurement and in the engine; one that cannot fit beside a persistent
    kernel starts when it ends (the engine to round-off)."""
    from ovsim.validate import MEASURED_DISPATCH_GROUP, measured_dispatch_checks

    checks = {c.name: c for c in measured_dispatch_checks()}
    assert len(checks) == 12 and all(c.group == MEASURED_DISPATCH_GROUP for c in checks.values())
    for gpu in ("h100-sxm5-80gb", "h200-sxm"):
        for probe in ("probe_empty_sm", "probe_one_slot"):
            high, equal = checks[f"{gpu}: {probe}_high: second kernel's start"], checks[
                f"{gpu}: {probe}_equal: second kernel's start"]
            assert high.reference < 0.6 * equal.reference and high.predicted < 0.6 * equal.predicted
        for prio in ("equal", "high"):
            c = checks[f"{gpu}: persistent_then_channel_{prio}: second kernel's start"]
            assert c.predicted == pytest.approx(c.reference, rel=1e-3)


@pytest.mark.slow
def test_measured_gemms_are_predicted_held_out_within_the_bar() -> None:
    """The gemm part's cuBLAS GEMMs at the top clock (1024^3 to 8192^3), each priced as a scenario
    prices it with the parameters fitted on the other shapes: every GPU and precision within 10%
    MAPE (they were 0.9 to 13.9% per shape when this was written)."""
    from ovsim.validate import MEASURED_GEMM_GROUP, measured_gemm_checks

    checks = measured_gemm_checks()
    assert {c.name.split(":")[0] for c in checks} == {"h100-sxm5-80gb", "h200-sxm"}
    assert len(checks) == 8 and all(c.group == MEASURED_GEMM_GROUP for c in checks)
    assert all(c.passed for c in checks), [(c.name, c.predicted) for c in checks]


@pytest.mark.slow
def test_measured_gemm_shapes_are_predicted_with_parameters_fitted_on_other_shapes() -> None:
    """The shapes part's linear-layer GEMMs (1 to 8192 rows against hidden sizes 768 to 8192),
    priced as a scenario prices them with each GPU's GEMM parameters fitted on the gemm part's
    squares on other boards: BF16, FP16 and FP8 within 10% MAPE on every data set, two H100 leases
    and an H200 (BF16 8.0-8.6%, FP16 5.9-6.4%, FP8 7.2-7.8% when this was written; pricing every
    GEMM's operands as read twice and only wide tiles, as before, gave 23-34%). The TF32 and
    batched rows are reported, not required: a few tiny batched products and TF32 GEMMs under
    10 us miss."""
    from ovsim.validate import MEASURED_DATA, MEASURED_SHAPES_GROUP, measured_shape_checks, measured_shape_points

    checks = measured_shape_checks()
    assert all(c.group == MEASURED_SHAPES_GROUP for c in checks)
    kinds = ("bf16_linear", "fp16_linear", "fp8_linear")
    required = [c for c in checks if c.name.split(": ")[1].split(" ")[0] in kinds]
    assert len(required) == 8 and {c.name.split(":")[0] for c in required} == {
        "h100-sxm5-80gb/2026-11-26-f", "h100-sxm5-80gb/2026-11-26-g", "h100-sxm5-80gb/2026-11-27",
        "h200-sxm/2026-11-27"}
    assert all(c.passed for c in required), [(c.name, c.predicted) for c in required]
    # Only aligned shapes that NVML saw at the top clock: the largest ran below it.
    pts = measured_shape_points(MEASURED_DATA / "h100-sxm5-80gb/2026-11-26-f", "bf16_linear", "bf16")
    shapes = {p[:4] for p in pts}
    assert (1, 32768, 8192, 1) in shapes and (32768, 8192, 8192, 1) not in shapes
    assert 150 < len(pts) < 208


def test_measured_copies_are_predicted_with_the_other_gpus_fit() -> None:
    """The copy part's 1 GiB copies alone on the H100 and H200, each predicted with the copy
    efficiencies fitted on the other GPU: within 10% (2.7% at most when this was written; the 0.8
    assumed before was 20-24% slow on the device-local copies)."""
    from ovsim.validate import MEASURED_COPY_GROUP, measured_copy_checks

    checks = measured_copy_checks()
    assert sorted(c.name for c in checks) == sorted(f"{g}: {d} copy of 1 GiB alone" for g in ("h100-sxm5-80gb",
                                                    "h200-sxm") for d in ("d2d", "h2d"))
    assert all(c.group == MEASURED_COPY_GROUP and c.passed for c in checks), [(c.name, c.error_pct) for c in checks]


def test_measured_power_phases_are_predicted_at_the_power_limit() -> None:
    """The harness's power phases against predict() of the same kernel repeated under the board's
    700 W limit. The add's power was fitted and must come back within 10%; the BF16 GEMM's power,
    clock and time were not (the power fit took its GEMM term from another machine's clock part) and
    must too (they did: 687 W, 1509 MHz, +3.1%)."""
    from ovsim.validate import MEASURED_POWER_FIT, MEASURED_POWER_HELD_OUT, measured_power_checks

    checks = {c.name: c for c in measured_power_checks()}
    h100 = "h100-sxm5-80gb: gemm bf16 8192 at the 700 W limit"
    assert checks[f"{h100}: power"].group == MEASURED_POWER_HELD_OUT and checks[f"{h100}: power"].passed
    assert checks["h100-sxm5-80gb: add bf16 256M at the 700 W limit: power"].group == MEASURED_POWER_FIT
    clock = checks[f"{h100}: SM clock"]
    assert clock.group == MEASURED_POWER_HELD_OUT and clock.passed and 1200 < clock.reference < 1500
    assert checks[f"{h100}: time per kernel"].passed
    assert checks["h100-sxm5-80gb: gemm fp8 8192 at the 700 W limit: power"].group == MEASURED_POWER_HELD_OUT
    assert {c.name.split(":")[0] for c in checks.values()} == {"h100-sxm5-80gb", "h200-sxm"}


@pytest.mark.slow
def test_measured_hbm_sharing_is_predicted_by_the_latency_law() -> None:
    """Memory-bound kernels beside the harness's copy loops, predicted from both kernels' times
    alone; each GPU's law fitted on its first data set (calibration/harness/fit_measured.py), the
    other boards held out (two H100s beside 8 and 24 and beside 8 to 32 loops, an H200 beside 8 to
    32). The loops' measured time is the reference: on every data set each victim's loops come
    within 10% MAPE (0.9-8.1% when this was written; as fast as alone 6.2-34.9%). The victims' time
    passes at a third of naive on the H100 it was fitted on and on the third H100 (1.5-4.0%);
    elsewhere 9 of the 12 rows pass and the rest
    stay within 1.2 times their bar (the other H100's layer norm, 4.1% against 4.0%; the H200s'
    softmax, 6.8% and 6.0% against 6.4% and 5.3%). Without the law (max-min sharing alone) 16 of
    the first 18 rows failed; with the H100's law carried to the H200s, 4 of their 12 rows did."""
    from ovsim.validate import MEASURED_HBM_FIT, MEASURED_HBM_HELD_OUT, measured_hbm_checks

    checks = measured_hbm_checks()
    assert len(checks) == 30
    loops = [c for c in checks if c.name.split(": ")[1].startswith("copy loops")]
    assert len(loops) == 15 and all(c.passed for c in loops), [(c.name, c.predicted) for c in loops]
    victims = [c for c in checks if c not in loops]
    fitted = [c for c in victims if c.group == MEASURED_HBM_FIT]
    assert {c.name.split(" ")[0] for c in fitted} == {"h100-sxm5-80gb", "h200-sxm"} and len(fitted) == 6
    assert all(c.passed for c in fitted if c.name.startswith("h100")), [(c.name, c.predicted) for c in fitted]
    assert {c.group for c in checks} == {MEASURED_HBM_FIT, MEASURED_HBM_HELD_OUT}
    assert all(c.predicted <= 1.2 * c.reference for c in victims), [(c.name, c.predicted, c.reference) for c in victims]
    assert sum(c.passed for c in victims) >= 12
    # A third H100 board, its own loops alone, the law from the first: every row passes.
    assert all(c.passed for c in checks if "2026-11-26-g" in c.name)


@pytest.mark.slow
def test_measured_gemms_beside_held_sms_are_predicted_with_only_the_load_share_fitted() -> None:
    """The smloss part's cuBLAS GEMMs beside a kernel that holds 1 to 66 SMs and moves no data
    (three H100 and four H200 data sets), each row at most 10% MAPE and a third of naive. Only
    gemm_load_share is fitted on them, on one data set a GPU (SMLOSS_LOAD_FIT), whose rows are a
    group of their own; the others are held out. Every held-out GEMM of 128 tiles or of 384 and
    more held for the whole run passes (1.0-3.8% when this was written; the 8192^3 GEMM on one H100
    board failed at 9.4% against a bar of 7.6% before the load share, its rounds of tiles overstating
    what it loses with many SMs gone: x2.08 with 66 held, x1.79 measured). The 256-tile GEMM
    (2048x5120x5120) is reported, not required: it lost nothing with one SM held."""
    from ovsim.validate import MEASURED_SMLOSS_FIT_GROUP, MEASURED_SMLOSS_GROUP, SMLOSS_LOAD_FIT, measured_smloss_checks

    checks = measured_smloss_checks()
    fitted = {f"{gpu} {rel.rsplit('/', 1)[-1]}" for gpu, rel in SMLOSS_LOAD_FIT.items()}
    assert checks and all(c.group == (MEASURED_SMLOSS_FIT_GROUP if c.name.split(":")[0] in fitted
                                      else MEASURED_SMLOSS_GROUP) for c in checks)
    held_out = [c for c in checks if c.group == MEASURED_SMLOSS_GROUP]
    small = ("1024x4096x4096", "2048x2048x2048", "2048x2048x8192")
    whole = [c for c in held_out if "whole run" in c.name and "2048x5120x5120" not in c.name]
    tiles_128 = [c for c in whole if any(s in c.name for s in small)]
    assert len(tiles_128) == 4 and all(c.passed for c in tiles_128), [(c.name, c.predicted) for c in tiles_128]
    required = [c for c in whole if c not in tiles_128]
    assert len(required) == 16
    assert {c.name.split(":")[0] for c in required} == {
        "h100-sxm5-80gb 2026-11-26-b", "h100-sxm5-80gb 2026-11-27-c",
        "h200-sxm 2026-11-26-b", "h200-sxm 2026-11-27-c", "h200-sxm 2026-11-27-e"}
    assert all(c.passed for c in required), [(c.name, c.predicted, c.reference) for c in required]


def test_gemm_kernels_of_ones_own_alone_and_under_the_power_limit() -> None:
    """The harness's WMMA GEMM (calibration/data/h200-sxm/2026-11-29 and -29-c): at 64x64 tiles it
    runs at about a quarter of cuBLAS's FLOP rate yet draws the same board power under the 700 W
    limit (power follows the SMs a kernel keeps busy, not the work it does, as the model has it),
    and its time barely moves with the clock: its tiles' L2 reads bind it. At 128x128 the tensor
    issue binds and the time follows the clock. The model's two rooflines (efficiency fitted on the
    128x128 tile alone, L2 bandwidths on the 64x64 alone and beside 66 SMs held idle) give the other
    three tiles alone within 3.7%, the other seven held-SM runs within 3%, and
    every sustained phase within 10% but the 2-blocks-per-SM one: there the model throttles to
    1725 MHz where the board held 1957 (its power for half-occupied SMs is too high) and its time
    is 10% short (the occupancy shape, as in the shaping part). Before, one efficiency for every
    tile priced the 128x128 ones at the 64x64's 7 ms, where they took 3.7-3.9."""
    from ovsim.validate import (
        MEASURED_OWN_HELD_FIT,
        MEASURED_OWN_HELD_GROUP,
        MEASURED_OWN_POWER_HELD_OUT,
        MEASURED_OWN_TILES_ALONE,
        MEASURED_OWN_TILES_FIT,
        measured_own_power_checks,
    )

    checks = measured_own_power_checks()
    rows = {c.name.split(": ", 1)[1]: c for c in checks}
    assert len(rows) == len(checks) == 46
    fits = (MEASURED_OWN_TILES_FIT, MEASURED_OWN_HELD_FIT)
    fitted = sorted(n for n, c in rows.items() if c.group in fits)
    assert fitted == ["wmma 128x128 t128 8192 alone: time per kernel", "wmma 64x64 t128 8192 alone: time per kernel",
                      "wmma 64x64 t128 8192 beside 66 SMs held: time per kernel"]
    assert {c.group for c in checks} == {*fits, MEASURED_OWN_POWER_HELD_OUT, MEASURED_OWN_TILES_ALONE,
                                         MEASURED_OWN_HELD_GROUP}
    # Beside SMs held idle the L2-bound 64x64 kernel slows less than in proportion to the SMs it
    # loses (x1.62 with half held), the issue-bound 128x128 one nearly in proportion (x1.95):
    # the L2 reads' per-SM path and the L2's own bandwidth in series give both within 3%.
    held = [c for n, c in rows.items() if "SMs held" in n]
    assert len(held) == 8 and all(abs(c.error_pct) < 3.5 for c in held)
    own, lib = rows["gemm64 8192 occ6 at the 700 W limit: power"], rows[
        "gemm fp16 8192x8192x8192 at the 700 W limit: power"]
    own_t, lib_t = (rows[f"{k} at the 700 W limit: time per kernel"].reference
                    for k in ("gemm64 8192 occ6", "gemm fp16 8192x8192x8192"))
    assert own_t / lib_t > 3.5 and abs(own.reference / lib.reference - 1) < 0.02  # the measurement
    alone = [c for n, c in rows.items() if n.endswith("alone: time per kernel")]
    assert len(alone) == 5 and all(abs(c.error_pct) < 4 for c in alone)
    failed = sorted(n for n, c in rows.items() if not c.passed)
    assert failed == ["gemm64 8192 occ2 at the 700 W limit: counted SM clock",
                      "gemm64 8192 occ2 at the 700 W limit: time per kernel"], failed
